"""The pieces a composed iteration is made of (issue 43): where a stage's devices and links
lie (:class:`Geometry`), each stage's schedule order, which reference stage and microbatch
stand for a real one (:class:`StagePlan`), the reference run as the unrolling reads it
(:class:`Reference`), and :class:`GraphBuilder`, which collects the composed graph's tasks
and numbers them as the full build would (ties in ready time go by task number)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..taskgraph import TaskGraph, unit_order
from .units import TIE_SHARE, Unit

__all__ = ["Geometry", "GraphBuilder", "LAST", "Reference", "StagePlan", "even_plan", "uneven_plan", "stage_order",
           "order_problem", "ranks", "stage_type", "mb_type"]

#: the tie-break group of tasks that hold nothing (after every task that holds something)
LAST = 1 << 40


@dataclass(frozen=True)
class Geometry:
    """Where a stage's devices and links lie: stage s holds GPUs ``[s * stage_gpus, (s + 1) *
    stage_gpus)`` of nodes of ``gpus_per_node`` GPUs, each node's ``links_per_node`` links
    numbered together; ``link_stage`` [reference link]: the stage whose GPUs alone use it (-1:
    several stages' or none). A stage holds whole nodes, or a node holds ``period`` whole
    stages (a middle stage then stands for those in the same place in their node)."""

    gpus_per_node: int
    links_per_node: int
    stage_gpus: int
    link_stage: np.ndarray

    @property
    def period(self) -> int:
        """Stages per node (1 when a stage holds whole nodes)."""
        return max(1, self.gpus_per_node // self.stage_gpus)

    def moves(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(devices, links) to add to move resources of stage ``a`` to stage ``b``."""
        d = (np.asarray(b) - np.asarray(a)) * self.stage_gpus
        return d, d // self.gpus_per_node * self.links_per_node


@dataclass
class Reference:
    """A simulated reference run and its units: ``stages`` (p'), ``chunks`` (v per stage),
    ``microbatches`` (m' simulated), ``schedule``; ``unit`` the classification of its tasks,
    ``units`` their blocks (:func:`engine.sim.units.read_units`)."""

    tg: TaskGraph
    unit: np.ndarray
    units: dict[int, Unit]
    stages: int
    chunks: int
    microbatches: int
    schedule: str
    geometry: Geometry
    #: numbering of the reference's ops in the whole model: [op] the reference chunk, [op]
    #: 0 before the layers, 1 in a layer, 2 after; ops a layer; [chunk] the first layer of each
    #: reference and each real chunk; the layer counts of the reference and of the whole model
    op_chunk: np.ndarray | None = None
    op_place: np.ndarray | None = None
    ops_per_layer: int = 0
    first_layer_ref: np.ndarray | None = None
    first_layer: np.ndarray | None = None
    ref_layers: int = 0
    layers: int = 0
    #: [real stage] the reference stage standing for it; [reference stage] the one standing for
    #: the same real stages (:class:`StagePlan`)
    stage_rep: np.ndarray | None = None
    ref_class: np.ndarray | None = None
    #: whether the fine position classes (:mod:`engine.sim.positions`) may be tried: not where
    #: stages hold different numbers of layers (a reference stage's neighbours then differ from
    #: those of the real stages it stands for, and so does when a transfer meets its links:
    #: GPT-3 on 64 stages with 2 microbatches came out 4% off)
    fine_classes: bool = True


def stage_order(schedule: str, p: int, v: int, m: int, s: int) -> np.ndarray:
    """[unit, 3] (local chunk, microbatch, phase) of stage ``s``'s units in schedule order
    (:func:`engine.taskgraph.unit_order`; one stage: forward and backward alternating)."""
    return ranks(schedule, p, v, m)[1][s]


@lru_cache(maxsize=64)
def ranks(schedule: str, p: int, v: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """([stage, local chunk, mb, phase] position of each unit in its stage's schedule,
    [stage, unit, 3] the units in that order); made once per schedule (read-only)."""
    rank = np.full((p, v, m, 2), -1, np.int64)
    orders = np.zeros((p, 2 * v * m, 3), np.int64)
    for s in range(p):
        order = unit_order(schedule, p, v, m, s)
        arr = np.asarray(order, np.int64).reshape(-1, 3)
        orders[s] = arr
        rank[s, arr[:, 0], arr[:, 1], arr[:, 2]] = np.arange(arr.shape[0])
    rank.setflags(write=False)
    orders.setflags(write=False)
    return rank, orders


def stage_type(s: np.ndarray | int, p: int, p_ref: int, period: int = 1) -> np.ndarray:
    """The reference stage standing for real stage ``s``: the first and the last are
    themselves, a middle one the reference's middle stage in the same place in its node
    (stages 1 to ``period``: ``period`` stages a node)."""
    s = np.asarray(s)
    if p == p_ref:
        return s
    return np.where(s == 0, 0, np.where(s == p - 1, p_ref - 1, 1 + (s - 1) % period))


@dataclass(frozen=True)
class StagePlan:
    """Which real stages a reference keeps and what each stands for: ``stages`` [reference
    stage] the real stage it is (the first, middle ones, the last); ``rep`` [real stage] the
    reference stage standing for it (one with as many layers, in the same place in its node);
    ``counts`` [real model chunk] layers."""

    stages: tuple[int, ...]
    rep: np.ndarray
    counts: tuple[int, ...]

    @property
    def ref_counts(self) -> tuple[int, ...]:
        """[reference model chunk] layers (chunk ``lc * stages + stage``, as the real ones)."""
        p = len(self.rep)
        v = len(self.counts) // p
        return tuple(self.counts[lc * p + s] for lc in range(v) for s in self.stages)

    @property
    def ref_class(self) -> np.ndarray:
        """[reference stage] the reference stage that stands for the same real stages (its own
        number for a representative; a middle stage kept only to place the last in its node
        is another's class)."""
        return self.rep[np.asarray(self.stages, np.int64)]


def even_plan(p: int, pr: int, period: int, counts: tuple[int, ...]) -> StagePlan:
    """The plan of a pipeline whose middle stages all hold as many layers: the first stage,
    ``pr - 2`` middle ones (real stages 1 to pr - 2), the last; a middle stage stands for those
    in the same place in their node (:func:`stage_type`)."""
    stages = tuple(range(p)) if pr >= p else (*range(pr - 1), p - 1)
    return StagePlan(stages, np.asarray(stage_type(np.arange(p), p, min(pr, p), period), np.int64), counts)


def uneven_plan(counts: tuple[int, ...], period: int) -> StagePlan | None:
    """The plan of a pipeline (one model chunk a stage) whose stages hold different numbers of
    layers (:func:`engine.layout.placement.balanced_layers`, or the layout's own split): the
    middle stages fall into runs of equal counts; the reference keeps the first stage, from
    each run one stage for each place in a node its stages take (a run shorter than a node's
    stages whole), and the last, each in the same place in its node as the real stage it is
    (:mod:`engine.sim.unroll` moves a stage by whole nodes; one or more further stages of the
    last run put the last stage in its place). None when a run is too short for that."""
    p, q = len(counts), period
    runs, s = [], 1
    while s < p - 1:
        e = s
        while e + 1 < p - 1 and counts[e + 1] == counts[s]:
            e += 1
        runs.append((s, e))
        s = e + 1
    stages = [0]
    rep = np.zeros(p, np.int64)
    for r, (a, b) in enumerate(runs):
        base = len(stages)
        s0 = a + (base - a) % q  # (the first stage of the run in the reference's next place)
        end = min(b, s0 + q - 1)
        if end - s0 + 1 < q and not (s0 == a and end == b):
            return None  # (the run's stages take places its kept stages do not)
        if r == len(runs) - 1:
            end += (p - 1 - (base + end - s0 + 1)) % q
            if end > b:
                return None
        stages.extend(range(s0, end + 1))
        rep[a:b + 1] = base + (np.arange(a, b + 1) - s0) % q
    stages.append(p - 1)
    rep[p - 1] = len(stages) - 1
    return StagePlan(tuple(stages), rep, tuple(counts))


def mb_type(j: np.ndarray | int, m: int, m_ref: int) -> np.ndarray:
    """The reference microbatch standing for real microbatch ``j``: first, last or a middle one
    (the reference's own middle ones too: :meth:`engine.sim.unroll._Unroll._check_classes` found them alike)."""
    j = np.asarray(j)
    if m_ref < 3:
        return j
    return np.where(j == 0, 0, np.where(j == m - 1, m_ref - 1, 1))



class GraphBuilder:
    """Arrays of the composed graph as they are made: tasks (duration, resources, chain) and edges."""

    def __init__(self) -> None:
        self.n = 0
        self.keys: list[np.ndarray] = []  # [task, 5] the order ties are broken in (see _Unroll._keys)
        self.mbs: list[np.ndarray] = []  # [task] microbatch (-1: per iteration)
        self.dur: list[np.ndarray] = []
        self.kind: list[np.ndarray] = []
        self.res: list[tuple[np.ndarray, np.ndarray]] = []  # (task ids, resource) pairs
        self.chain: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (task, next, lag)
        self.src: list[np.ndarray] = []
        self.dst: list[np.ndarray] = []
        self.new: np.ndarray | None = None  # [task as made] its number in the last graph made
        self.n_held = 0  # tasks of the last graph made that are not a block's delays or joins

    def add(self, dur: np.ndarray, kind: int | np.ndarray, key: np.ndarray | None = None,
            mb: int | np.ndarray = -1) -> np.ndarray:
        dur = np.asarray(dur, float)
        ids = np.arange(self.n, self.n + dur.size)
        self.mbs.append(np.broadcast_to(np.asarray(mb, np.int32), dur.shape))
        if key is None:  # (a delay or a join: it holds nothing, so its place in ties does not matter)
            key = np.zeros((dur.size, 5), np.int64)
            key[:, 0] = LAST
            key[:, 4] = ids
        self.keys.append(np.broadcast_to(np.asarray(key, np.int64), (dur.size, 5)))
        self.n += dur.size
        self.dur.append(dur)
        self.kind.append(np.broadcast_to(np.asarray(kind, np.int8), dur.shape).copy())
        return ids

    def edges(self, a: np.ndarray, b: np.ndarray) -> None:
        a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
        ok = (a >= 0) & (b >= 0)
        self.src.append(a[ok].ravel())
        self.dst.append(b[ok].ravel())

    def graph(self, n_devices: int, n_links: int) -> TaskGraph:
        """The task graph, tasks numbered in key order: the event loop breaks ties in ready
        time by task number, so tasks are numbered as the full build numbers theirs."""
        n = self.n
        keys = np.concatenate(self.keys) if self.keys else np.zeros((0, 5), np.int64)
        held = np.nonzero(keys[:, 0] != LAST)[0]  # (only what holds something is ordered: the rest keeps its order)
        self.n_held = held.size  # (the tasks numbered from here on are delays and joins)
        perm = np.concatenate([held[np.lexsort(keys[held].T[::-1])], np.nonzero(keys[:, 0] == LAST)[0]])
        new = self.new = np.empty(n, np.int64)  # [task as made] its number in the graph
        new[perm] = np.arange(n)
        dur = (np.concatenate(self.dur) if self.dur else np.zeros(0))[perm]
        kind = (np.concatenate(self.kind) if self.kind else np.zeros(0, np.int8))[perm]
        rt = new[np.concatenate([r[0] for r in self.res])] if self.res else np.zeros(0, np.int64)
        rr = np.concatenate([r[1] for r in self.res]) if self.res else np.zeros(0, np.int64)
        o = np.argsort(rt, kind="stable")
        res_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(rt, minlength=n), out=res_ptr[1:])
        src = new[np.concatenate(self.src)] if self.src else np.zeros(0, np.int64)
        dst = new[np.concatenate(self.dst)] if self.dst else np.zeros(0, np.int64)
        order = np.lexsort((dst, src))
        src, dst = src[order], dst[order]
        succ_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=succ_ptr[1:])
        chain_next = np.full(n, -1, np.int64)
        lag = np.zeros(n)
        for t, nx, lg in self.chain:
            chain_next[new[t]], lag[new[t]] = new[nx], lg
        z = np.zeros(n)
        neg = np.full(n, -1, np.int32)
        mb = (np.concatenate(self.mbs) if self.mbs else np.zeros(0, np.int32))[perm]
        return TaskGraph(kind=kind, op=neg, part=neg.copy(), mb=mb, device=neg.copy(), dur_s=dur,
                         size_bytes=z, flops=z.copy(), coll=np.full(n, -1, np.int8), link=neg.copy(),
                         res_ptr=res_ptr, res_idx=rr[o].astype(np.int64), succ_ptr=succ_ptr, succ_idx=dst,
                         npred=np.bincount(dst, minlength=n).astype(np.int64), chain_next=chain_next,
                         chain_lag_s=lag, n_devices=n_devices, n_links=n_links)


def order_problem(tg: TaskGraph, start_s: np.ndarray, end_s: np.ndarray) -> str | None:
    """Where the composed run ``tg`` (simulated: ``start_s``, ``end_s``) would not be the full
    simulation's: a resource a unit's task shares with an explicit task (a pipeline transfer's
    hop on a NIC link the unit's context-parallel collectives use) whose queue order is not the
    reference's, which the unit's block froze (:attr:`engine.sim.units.Unit.ready`); None when
    every order holds.

    The event loop queues a resource's holders by ready time (:mod:`engine.sim.full`): the end
    of their data predecessors, a chained hop's release. Each unit task's ready time follows
    from its unit's entries' ends in the composed run (the block's own paths, given that every
    order holds); each explicit task's from its explicit predecessors and the units' exits into
    it by data alone (:attr:`engine.sim.units.Unit.data`: a block's delay also carries the waits
    for a resource, which a queue does not read). When every order the blocks assume holds with
    room to spare, the composed run is the full simulation (by induction over the dispatch
    order). A reversal, which a whole pipeline meets where the reference does not (the gap
    between a transfer and a collective on a NIC drifting a little each microbatch), is refused;
    so is a tie, unless the two were ready at once in the reference too
    (:attr:`engine.sim.units.Unit.tied`: both became ready at the end of one task, and the event
    loop orders them by the same task numbers)."""
    got = tg.info.get("orders")
    if not got:
        return None
    orders, feeds, new, n_held = got
    n = tg.num_tasks
    ready = np.zeros(n)
    src = np.repeat(np.arange(n), np.diff(tg.succ_ptr))
    plain = src < n_held
    np.maximum.at(ready, tg.succ_idx[plain], end_s[src[plain]])
    has = tg.chain_next >= 0
    np.maximum.at(ready, tg.chain_next[has], start_s[has] + tg.chain_lag_s[has])
    def entry_ends(ents: np.ndarray) -> np.ndarray:  # [entry, unit] (the iteration's start: 0)
        return np.where(ents >= 0, end_s[new[np.maximum(ents, 0)]], 0.0)

    for ents, outs, data in feeds:
        e_end = entry_ends(ents)
        to = outs >= 0
        np.maximum.at(ready, new[outs[to]], np.max(e_end[:, None, :] + data[:, :, None], axis=0)[to])
    tol = TIE_SHARE * max(1.0, float(end_s.max()) if end_s.size else 1.0)
    worst = np.inf
    for ents, coef, other, first, tied in orders:
        mine = np.max(entry_ends(ents)[None, :, :] + coef[:, :, None], axis=1)  # [order, unit] the unit's task ready
        theirs = ready[new[other]]
        margin = np.where(first[:, None], mine - theirs, theirs - mine)  # (> 0: the reference's order)
        # (ready at once where they were in the reference too: the same task numbers order them)
        margin = np.where(tied[:, None] & (np.abs(margin) <= tol), np.inf, margin)
        worst = min(worst, float(margin.min()))
    if worst > tol:
        return None
    return (f"a unit's task and a transfer or collective it shares a link with queue in another order than in the "
            f"reference ({worst * 1e3:+.6f} ms): the whole pipeline's timing drifts where the reference's does not")
