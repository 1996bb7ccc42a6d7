"""A pipeline's schedule units read off a simulated reference run, as max-plus blocks.

A unit is what one stage runs for one (model chunk, microbatch, phase): the forward or the
backward compute tasks of the chunk's ops on the stage's (representative) device and the
collectives and redistributions between them. Everything else is *explicit*: the barrier
tasks that hold a device to its schedule (:class:`engine.taskgraph.schedule.SchedulePlan`),
the point-to-point transfers between stages, and the per-iteration tasks (gradient
synchronisation, the optimizer step).

Inside a unit, every task starts at the latest of its data predecessors' ends, its chained
hop's release and its resources' previous holder's end (FlexFlow's list scheduling,
:mod:`engine.sim.full`). When the order in which the unit's tasks take each resource is the
same whatever time its inputs arrive, each task's start is the longest path to it from the
unit's inputs in the graph of data edges, chain edges and resource-order edges: a max-plus
linear function of the input times (Baccelli et al., "Synchronization and Linearity", 1992,
ch. 2). :func:`read_units` finds, for one unit, the coefficient from every input (*entry*:
an explicit task it waits for) to every output (*exit*: an explicit task waiting for it):
the unit's outputs are then ``max_e(end_e + c[e, x])`` for any input times, which is what
:mod:`engine.sim.unroll` composes.

Entries are the explicit tasks a unit's tasks wait for (by data, or for a resource they held
first: a gradient collective overlapping the backward pass on the tensor-parallel links), the
iteration's start, and the entries of an earlier unit on the same stage whose task it waits
for when that task does not lead to its own unit's barrier exit (the loss's all-reduce, which
the backward unit reads): the wait passes through. A wait on an earlier unit's task that does
lead to its barrier exit is implied by the schedule and dropped (checked on the reference's
times: :func:`_check_implied`), as is an explicit task's wait for a resource such a task freed
when it also waits, by data, for a later unit (:func:`_implied_frees`). Exits are the explicit
tasks that wait for a unit's task (by data, chain or resource).

What the reading assumes (that the order in which a unit's tasks take each resource does not
depend on when its inputs arrive) is checked twice: by composing the reference from its own
blocks and comparing with its simulation (:mod:`engine.sim.hier`), and, for a resource a unit's
task shares with an explicit one (a pipeline transfer's hop on a NIC link that a stage's
context-parallel collectives use too), on the whole composed run: each such queue order is
recorded with the unit's task's ready time as a function of the unit's entries
(:attr:`Unit.ready`) and :func:`engine.sim.composed.order_problem` checks it holds there (in a
long pipeline the gap between the two can drift a microbatch at a time until their order flips,
where a short reference never sees it). What it does not read at all (activation offload's
copies, a collective of a microbatch that waits for no task of its chunk: ZeRO-3's gathers)
raises :class:`UnitProblem`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba as nb
import numpy as np

from ..taskgraph import BARRIER, BWD, COLL, FWD, OFFLOAD, XFER, TaskGraph

__all__ = ["UnitProblem", "Unit", "read_units", "classify", "ENTRY_TABLES", "TIE_SHARE"]

NEG = -np.inf


class UnitProblem(Exception):
    """The reference run breaks an assumption of the unit reading (the message says which)."""


@dataclass
class Unit:
    """One unit's max-plus block: ``coef[e, x]`` seconds from entry ``e``'s end to exit ``x``'s
    readiness (``-inf``: no path). Entries and exits are explicit task ids of the reference
    run; entry -1 is the iteration's start (what waits for nothing)."""

    entries: np.ndarray  # [e] explicit task ids (-1: the iteration's start)
    exits: np.ndarray  # [x] explicit task ids
    coef: np.ndarray  # [e, x] seconds
    #: the queue orders the block assumes on a resource its tasks share with explicit ones (a
    #: pipeline transfer's hop on a NIC link the unit's context-parallel collectives use too):
    #: for order ``c``, ``ready[c, e]`` seconds from entry ``e``'s end to the unit's task being
    #: ready (its data and chain predecessors done); ``other[c]`` the explicit task, an index
    #: into ``entries`` where it took the resource first (``first[c]``), into ``exits`` where
    #: the unit's task did. :func:`engine.sim.composed.order_problem` checks them on a composed run.
    ready: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    other: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    first: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    #: [order] the two were ready at the same time in the reference: ordered by task number
    tied: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    #: ``coef`` by data and chain paths alone, where some exit waits by resource (what an exit's
    #: readiness is in the event loop's queues: a resource it waits for is not in it); empty
    #: where it is ``coef``
    data: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))


def classify(tg: TaskGraph, chunk_of_op: np.ndarray, microbatches: int) -> np.ndarray:
    """[task] unit number ``(chunk * m + mb) * 2 + phase`` of every unit-internal task, -1 for an
    explicit one (barrier, point-to-point transfer, per-iteration task)."""
    n = tg.num_tasks
    kind, mb, op = tg.kind, tg.mb, tg.op
    chunk = np.where(op >= 0, chunk_of_op[np.maximum(op, 0)], -1)
    unit = np.full(n, -1, np.int64)
    comp = ((kind == FWD) | (kind == BWD)) & (mb >= 0)
    unit[comp] = (chunk[comp] * microbatches + mb[comp]) * 2 + kind[comp]
    if np.any(kind == OFFLOAD):
        raise UnitProblem("activation offload copies cross the units")
    src, dst = tg.edge_src, tg.succ_idx
    mid = ((kind == COLL) | (kind == XFER)) & (mb >= 0)
    # a transfer's first hop waits for its producer: another chunk's task makes it a
    # point-to-point transfer (explicit), and its later hops (chained) with it
    internal = np.zeros(n, bool)
    e = mid[dst] & (kind[dst] == XFER) & (unit[src] >= 0)
    same = e & (chunk[src] == chunk[dst])
    internal[dst[same]] = True
    cross = np.zeros(n, bool)
    cross[dst[e & (chunk[src] != chunk[dst])]] = True
    if (internal & cross).any():
        raise UnitProblem("a transfer waits for tasks of two chunks")
    for flag in (internal, cross):
        hop = flag.copy()
        for _ in range(64):
            nxt = tg.chain_next[hop & (tg.chain_next >= 0)]
            nxt = nxt[~flag[nxt]]
            if not nxt.size:
                break
            flag[nxt] = True
            hop = np.zeros(n, bool)
            hop[nxt] = True
    take = (kind == COLL) & mid | internal
    for _ in range(256):  # a collective or an internal hop takes the unit of its producer
        todo = take & (unit < 0)
        if not todo.any():
            break
        e = todo[dst] & (unit[src] >= 0) & (chunk[src] == chunk[dst])
        if not e.any():
            break
        unit[dst[e]] = unit[src[e]]
    # a chained hop takes its first hop's unit
    hop = internal & (unit >= 0)
    for _ in range(64):
        t = np.nonzero(hop & (tg.chain_next >= 0))[0]
        nxt = tg.chain_next[t]
        keep = unit[nxt] < 0
        if not keep.any():
            break
        unit[nxt[keep]] = unit[t[keep]]
        hop = np.zeros(n, bool)
        hop[nxt[keep]] = True
    left = take & (unit < 0)
    if left.any():
        raise UnitProblem(f"{int(left.sum())} collectives or transfers of a microbatch wait for no task of their chunk")
    return unit


#: entry table sizes tried in turn (a unit's inputs: its barrier, the iteration's start,
#: point-to-point transfers, gradient collectives that held its links first; one slot is the start)
ENTRY_TABLES = (8, 24, 96)


@nb.njit(cache=True)
def _reach(order, unit, is_barrier, succ_ptr, succ_idx, chain_next, res_next_ptr, res_next):  # pragma: no cover
    """[task] whether an internal task has a path, inside its unit, to a barrier task (its
    unit's barrier exit): by data, chain or resource-order edges, in reverse dispatch order."""
    n = unit.shape[0]
    reach = np.zeros(n, np.bool_)
    for i in range(order.shape[0] - 1, -1, -1):
        t = order[i]
        u = unit[t]
        if u < 0:
            continue
        r = False
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            v = succ_idx[k]
            if (unit[v] < 0 and is_barrier[v]) or (unit[v] == u and reach[v]):
                r = True
        c = chain_next[t]
        if c >= 0 and unit[c] == u and reach[c]:
            r = True
        for k in range(res_next_ptr[t], res_next_ptr[t + 1]):
            v = res_next[k]
            if v >= 0 and unit[v] == u and reach[v]:
                r = True
        reach[t] = r
    return reach


@nb.njit(cache=True, inline="always")
def _relax(L, t, x, w):  # pragma: no cover
    """Task ``t`` starts no earlier than ``w`` after task ``x`` starts, from every entry."""
    for j in range(L.shape[1]):
        v = L[x, j] + w
        if v > L[t, j]:
            L[t, j] = v


@nb.njit(cache=True)
def _slot(ent, u, node):  # pragma: no cover
    """Entry slot of ``node`` in unit ``u``'s table (allocated; -1 when the table is full)."""
    K = ent.shape[1]
    for j in range(K - 1):
        if ent[u, j] == node:
            return j
        if ent[u, j] == -2:
            ent[u, j] = node
            return j
    return -1


@nb.njit(cache=True)
def _longest(order, unit, dur, lag, pred_ptr, pred_idx, chain_prev, res_ptr, res_prev, reach, n_units,
             K, watch, ready):  # pragma: no cover
    """Longest paths (s) from each unit's entries to the start of each of its tasks, over data,
    chain and resource-order edges, tasks in dispatch ``order``. Returns (L [task, K], ent
    [unit, K]: the entry node of each slot, -2 unused; slot K - 1 is the iteration's start,
    overflow: whether a table filled up). For a task with ``watch[t]`` >= 0, row ``watch[t]``
    of ``ready`` gets the same paths to when it is ready: before its resources' earlier
    holders are waited for.

    An entry is an explicit task, or an entry of an earlier unit whose task ``a`` this unit
    waits for (data or resource) when ``a`` does not lead to its unit's barrier exit: the
    wait then passes through (``L[a] + dur[a]``); when it does, the barrier that orders the
    two units on the device implies it (``read_units`` checks the units are ordered so)."""
    n = dur.shape[0]
    L = np.full((n, K), -np.inf)
    ent = np.full((n_units, K), -2, np.int64)
    overflow = False
    for i in range(order.shape[0]):
        t = order[i]
        u = unit[t]
        if u < 0:
            continue
        any_pred = False
        for k in range(pred_ptr[t], pred_ptr[t + 1]):
            p = pred_idx[k]
            any_pred = True
            if unit[p] == u:
                _relax(L, t, p, dur[p])
            elif unit[p] < 0:
                j = _slot(ent, u, p)
                if j < 0:
                    overflow = True
                elif L[t, j] < 0.0:
                    L[t, j] = 0.0
            elif not reach[p]:
                overflow |= _through(L, ent, t, u, p, unit[p], dur[p])
        c = chain_prev[t]
        if c >= 0:
            any_pred = True
            if unit[c] == u:
                _relax(L, t, c, lag[c])
        if not any_pred:
            if L[t, K - 1] < 0.0:  # (the iteration's start: the last entry)
                L[t, K - 1] = 0.0
        if watch[t] >= 0:
            for j in range(K):
                ready[watch[t], j] = L[t, j]
        for k in range(res_ptr[t], res_ptr[t + 1]):
            r = res_prev[k]
            if r < 0:
                continue
            if unit[r] == u:
                _relax(L, t, r, dur[r])
            elif unit[r] < 0:  # (a transfer or a gradient collective held it first)
                j = _slot(ent, u, r)
                if j < 0:
                    overflow = True
                elif L[t, j] < 0.0:
                    L[t, j] = 0.0
            elif not reach[r]:
                overflow |= _through(L, ent, t, u, r, unit[r], dur[r])
    return L, ent, overflow


@nb.njit(cache=True)
def _through(L, ent, t, u, a, ua, w):  # pragma: no cover
    """Task ``t`` of unit ``u`` waits for task ``a`` of unit ``ua``: ``a``'s entries pass through."""
    K = L.shape[1]
    for j in range(K):
        if L[a, j] == -np.inf:
            continue
        node = ent[ua, j] if j < K - 1 else -1
        jj = K - 1 if node == -1 else _slot(ent, u, node)
        if jj < 0:
            return True
        v = L[a, j] + w
        if v > L[t, jj]:
            L[t, jj] = v
    return False


def _res_prev(tg: TaskGraph, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR over tasks (``res_ptr``'s layout): each resource's previous holder in dispatch
    ``order`` (-1: none)."""
    return _res_prev_kernel(order, tg.res_ptr, tg.res_idx, tg.n_devices + tg.n_links)


@nb.njit(cache=True)
def _res_prev_kernel(order, res_ptr, res_idx, n_res):  # pragma: no cover
    out = np.full(res_idx.shape[0], -1, np.int64)
    last = np.full(n_res, -1, np.int64)
    for i in range(order.shape[0]):
        t = order[i]
        for k in range(res_ptr[t], res_ptr[t + 1]):
            q = res_idx[k]
            out[k] = last[q]
            last[q] = t
    return out


def read_units(tg: TaskGraph, order: np.ndarray, unit: np.ndarray, end_s: np.ndarray,
               ready_s: np.ndarray) -> dict[int, Unit]:
    """Every unit's max-plus block from a reference run (its dispatch ``order``, task ends
    ``end_s`` and ready times ``ready_s``, the event loop's own:
    ``Timeline.extra["ready_s"]``) and the classification :func:`classify` gave (``unit``)."""
    n = tg.num_tasks
    pred_ptr, pred_idx = tg.pred_lists()
    res_prev = _res_prev(tg, order)
    holder = np.repeat(np.arange(n), np.diff(tg.res_ptr))  # [holding] its task
    res_next_ptr, res_next = _res_next(tg, res_prev, holder)
    chain_prev = np.full(n, -1, np.int64)
    has = tg.chain_next >= 0
    chain_prev[tg.chain_next[has]] = np.nonzero(has)[0]
    is_barrier = (tg.kind == BARRIER) & (unit < 0)
    reach = _reach(order, unit, is_barrier, tg.succ_ptr, tg.succ_idx, tg.chain_next, res_next_ptr, res_next)
    _check_implied(tg, unit, reach, pred_ptr, pred_idx, res_prev, holder, end_s)
    n_units = int(unit.max()) + 1 if unit.size else 0
    # queue orders between a unit's task and an explicit one on a resource both hold: the explicit
    # one first (it is then an entry), or the unit's task first (an exit, unless implied: below)
    k = np.nonzero(res_prev >= 0)[0]
    k = k[(unit[holder[k]] >= 0) & (unit[res_prev[k]] < 0)]
    first_t, first_y = holder[k], res_prev[k]
    r = (res_prev >= 0)
    r[r] = (unit[res_prev[r]] >= 0) & (unit[holder[r]] < 0)
    r &= ~_implied_frees(tg, unit, reach, res_prev, holder, r, end_s, pred_ptr, pred_idx)
    watched = np.unique(np.concatenate([first_t, res_prev[r]]))
    watch = np.full(n, -1, np.int64)
    watch[watched] = np.arange(watched.size)
    for K in ENTRY_TABLES:
        ready = np.full((watched.size, K), NEG)
        L, ent, overflow = _longest(order, unit, tg.dur_s, tg.chain_lag_s, pred_ptr, pred_idx, chain_prev, tg.res_ptr,
                                    res_prev, reach, n_units, K, watch, ready)
        if not overflow:
            break
    else:
        raise UnitProblem(f"a unit waits for more than {K - 1} outside tasks")
    # exits: (internal task, explicit task, weight) for every constraint from a unit onto an explicit task
    src, dst = tg.edge_src, tg.succ_idx
    e = (unit[src] >= 0) & (unit[dst] < 0)
    ex_t, ex_y, ex_w = [src[e]], [dst[e]], [tg.dur_s[src[e]]]
    c = np.nonzero(has & (unit >= 0))[0]
    c = c[unit[tg.chain_next[c]] != unit[c]]
    if (unit[tg.chain_next[c]] >= 0).any():
        raise UnitProblem("a transfer chain runs from one unit into another")
    ex_t.append(c); ex_y.append(tg.chain_next[c]); ex_w.append(tg.chain_lag_s[c])
    ex_t.append(res_prev[r]); ex_y.append(holder[r]); ex_w.append(tg.dur_s[res_prev[r]])
    t_all, y_all, w_all = (np.concatenate(a) for a in (ex_t, ex_y, ex_w))
    by_res = np.zeros(t_all.size, bool)  # (an exit by resource alone: not what the explicit task's readiness reads)
    by_res[t_all.size - int(r.sum()):] = True
    units: dict[int, Unit] = {}
    ex_u = unit[t_all]
    ex_order = np.lexsort((y_all, ex_u))
    ex_b = np.searchsorted(ex_u[ex_order], np.arange(n_units + 1))
    for u in np.unique(unit[unit >= 0]):
        sel = ex_order[ex_b[u]:ex_b[u + 1]]
        ys = np.unique(y_all[sel])
        coef = np.full((K, ys.size), NEG)
        col = np.searchsorted(ys, y_all[sel])
        np.maximum.at(coef.T, col, L[t_all[sel]] + w_all[sel][:, None])
        slots = np.r_[np.nonzero(ent[u, :K - 1] != -2)[0], K - 1]
        entries = np.r_[ent[u, slots[:-1]], -1]
        orders = _orders(u, unit, watch, ready[:, slots], entries, ys, (first_t, first_y), (res_prev[r], holder[r]),
                         ready_s, TIE_SHARE * max(1.0, float(end_s.max()) if n else 1.0))
        data = np.zeros((0, 0))
        if by_res[sel].any():  # (the exits' readiness by data and chain alone, where it differs)
            data = np.full((K, ys.size), NEG)
            d = ~by_res[sel]
            np.maximum.at(data.T, col[d], L[t_all[sel][d]] + w_all[sel][d][:, None])
            data = data[slots]
        units[int(u)] = Unit(entries, ys, coef[slots], *orders, data)
    return units


#: ready times this share of the iteration (or of a second, the larger) apart are equal
#: (float rounding of the same sums): the event loop orders them by task number
TIE_SHARE = 1e-12


def _orders(u: int, unit: np.ndarray, watch: np.ndarray, ready: np.ndarray, entries: np.ndarray, exits: np.ndarray,
            first: tuple[np.ndarray, np.ndarray], after: tuple[np.ndarray, np.ndarray], ready_s: np.ndarray,
            tol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unit ``u``'s queue orders (:class:`Unit`'s ``ready``, ``other``, ``first``, ``tied``):
    ``first`` (its task, the explicit task that held the resource before it), ``after`` (its
    task, the explicit task that took the resource after it), each pair once; a pair is tied
    where the reference run's ready times (``ready_s``) are within ``tol`` of each other."""
    rows, other, is_first, ties = [], [], [], []
    for (t, y), went_first, names in ((first, True, entries), (after, False, exits)):
        mine = unit[t] == u
        if not mine.any():
            continue
        for a, b in np.unique(np.stack([t[mine], y[mine]], axis=1), axis=0).tolist():
            k = np.nonzero(names == b)[0]
            if not k.size:
                raise UnitProblem("a queue order names a task that is neither an entry nor an exit of its unit")
            rows.append(ready[watch[a]])
            other.append(int(k[0]))
            is_first.append(went_first)
            ties.append(abs(ready_s[a] - ready_s[b]) <= tol)
    if not rows:
        return np.zeros((0, ready.shape[1])), np.zeros(0, np.int64), np.zeros(0, bool), np.zeros(0, bool)
    return np.array(rows), np.array(other, np.int64), np.array(is_first, bool), np.array(ties, bool)


def _bar_in(tg: TaskGraph, unit: np.ndarray, pred_ptr: np.ndarray, pred_idx: np.ndarray,
            end_s: np.ndarray) -> np.ndarray:
    """[unit] the end of the barrier each unit waits for (0 for a stage's first)."""
    n = tg.num_tasks
    tgt = np.repeat(np.arange(n), np.diff(pred_ptr))
    bar = np.zeros(int(unit.max()) + 1 if unit.size else 0)
    e = (tg.kind[pred_idx] == BARRIER) & (unit[pred_idx] < 0) & (unit[tgt] >= 0)
    np.maximum.at(bar, unit[tgt[e]], end_s[pred_idx[e]])
    return bar


def _implied_frees(tg: TaskGraph, unit: np.ndarray, reach: np.ndarray, res_prev: np.ndarray, holder: np.ndarray,
                   r: np.ndarray, end_s: np.ndarray, pred_ptr: np.ndarray, pred_idx: np.ndarray) -> np.ndarray:
    """[holding] (of ``r``'s) an explicit task taking a resource from a unit's task that leads
    to its unit's barrier exit, while the explicit task waits (by data) for a task of a unit
    that starts after that barrier: implied by the schedule (the gradient collectives the last
    backward unit starts, on links an earlier unit used last), so it is no exit of the
    earlier unit."""
    out = np.zeros(r.size, bool)
    k = np.nonzero(r)[0]
    if not k.size:
        return out
    y, x = res_prev[k], holder[k]
    bar = _bar_in(tg, unit, pred_ptr, pred_idx, end_s)
    # the latest barrier among the units x waits for by data
    latest = np.full(tg.num_tasks, -np.inf)
    tgt = np.repeat(np.arange(tg.num_tasks), np.diff(pred_ptr))
    e = (unit[pred_idx] >= 0) & (unit[tgt] < 0)
    np.maximum.at(latest, tgt[e], bar[unit[pred_idx[e]]])
    out[k] = reach[y] & (latest[x] >= end_s[y]) & (latest[x] > 0)
    return out


def _res_next(tg: TaskGraph, res_prev: np.ndarray, holder: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR over tasks: the next holder of each resource a task holds (the inverse of ``res_prev``)."""
    n = tg.num_tasks
    k = np.nonzero(res_prev >= 0)[0]
    prev, nxt = res_prev[k], holder[k]
    order = np.argsort(prev, kind="stable")
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(prev, minlength=n), out=ptr[1:])
    return ptr, nxt[order]


def _check_implied(tg: TaskGraph, unit: np.ndarray, reach: np.ndarray, pred_ptr: np.ndarray, pred_idx: np.ndarray,
                   res_prev: np.ndarray, holder: np.ndarray, end_s: np.ndarray) -> None:
    """A wait between units that :func:`_longest` drops (its source leads to its unit's barrier
    exit) must be implied: the waiting unit's task comes after a barrier that ends no earlier."""
    n = tg.num_tasks
    tgt = np.repeat(np.arange(n), np.diff(pred_ptr))
    a = np.concatenate([pred_idx, res_prev])
    b = np.concatenate([tgt, holder])
    ok = (a >= 0)
    ok[ok] = (unit[a[ok]] >= 0) & (unit[b[ok]] >= 0) & (unit[a[ok]] != unit[b[ok]])
    ok[ok] = reach[a[ok]]
    a, b = a[ok], b[ok]
    if not a.size:
        return
    # the waiting unit's latest barrier entry (its units' explicit barrier predecessors)
    bar = np.zeros(int(unit.max()) + 1)
    e = (tg.kind[pred_idx] == BARRIER) & (unit[pred_idx] < 0) & (unit[tgt] >= 0)
    np.maximum.at(bar, unit[tgt[e]], end_s[pred_idx[e]])
    late = end_s[a] > bar[unit[b]] + 1e-12 * max(1.0, float(end_s.max()))
    if late.any():
        raise UnitProblem(f"{int(late.sum())} waits between units are not implied by the schedule's barriers")
