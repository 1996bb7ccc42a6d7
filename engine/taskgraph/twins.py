"""Twin segments: a stage's identical layers built once (issue 28).

A segment whose inputs are, op for op at a fixed offset, those of a segment already made in
this build is made by copying that segment's tasks and renaming what names an op: the handles
of the tasks it points at and its tasks' op column. On GPT-3 175B under Megatron's tp 8 x pp 16
(six layers a stage), 4,581 of the 5,590 op, tensor and parameter-unit segments are copies: a
stage's later layers twin its second (the first differs: its inputs come from another stage).

Why the copy equals a build: a segment reads only the ops its store entry names
(:attr:`SegmentStore.refs <engine.taskgraph.assembly.SegmentStore>`, which delta simulation
relies on and its equality tests check) and settings of the whole build. Two segments of one
kind whose refs are ``r`` and ``r + delta``, ref for ref, with equal *op classes*
(:meth:`Twins.op_classes`: everything a builder reads about an op -- signature, config and
devices, schedule position, recomputation, symmetric dims, ZeRO share, its neighbours at
relative offsets) go through the same steps on the same values; only the ops they name differ,
by ``delta``. A handle into any segment outside the renaming (neither the twin's own, nor one
of its refs' compute segments, the optimizer steps or a device's barriers) makes the copy give
up, and the segment is built. ``TaskGraphBuilder(twins=False)`` builds every segment; the
tests compare the two array for array.
"""

from __future__ import annotations

from typing import Callable

import numba as nb
import numpy as np

from ..strategy.recompute import recompute_reruns
from .assembly import SegmentStore
from .compute import op_signature, spread
from .context import BuildContext, OpTables
from .schedule import SchedulePlan
from .segments import LOCAL_MASK, SEGMENT_SHIFT, Segment
from .sync import FsdpPlan
from .tasks import BWD, FWD

__all__ = ["Twins"]

#: the per-op tables that hold task handles (renamed for a twin) and those that do not (shared)
_HANDLE_TABLES = ("fwd", "bwd", "fwd_ready", "fwd_in", "bwd_in", "bwd_out")
_PLAIN_TABLES = ("devs", "grid", "rep", "image", "fwd_s")
#: flat arrays of a segment that hold handles
_HANDLE_FLAT = ("src", "dst", "chain_from", "chain_to", "coll_h")


class _Foreign(Exception):
    """A handle or op outside the renaming: the segment is built instead."""


class Twins:
    """Finds each segment's twin made earlier in the same build and copies it.

    ``scatter_after(op)``: the compute builder's sequence-parallel reduce-scatter rule (it reads
    the op's consumers' configs, which are not the op's own)."""

    def __init__(self, ctx: BuildContext, store: SegmentStore, tables: OpTables, schedule: SchedulePlan,
                 fsdp: FsdpPlan, scatter_after: Callable) -> None:
        self.ctx, self.store, self.tables, self.schedule, self.fsdp = ctx, store, tables, schedule, fsdp
        self._scatter_after = scatter_after
        self._cls: list[int] | None = None
        self._first: dict[tuple, tuple] = {}  # segment class -> (its first segment's key, base op)
        self.copied = 0  # segments made as copies (what a build reports)
        self._held: dict[int, tuple] = {}  # id(source) -> (it, [(flat name, handles)], its handles joined)
        # the renaming's tables, made once; each copy sets its entries and puts them back
        self._lut: np.ndarray | None = None
        self._op_map: np.ndarray | None = None
        self._set: tuple[list[int], list[int]] = ([], [])  # (slots, ops) the current renaming set
        # the op tables a copy writes (their dicts, fetched once) and what :meth:`_tables_renamed` gathered
        self._handle_tables = [(name, getattr(tables, name)) for name in _HANDLE_TABLES]
        self._plain_tables = [getattr(tables, name) for name in _PLAIN_TABLES]
        self._tables_held: dict[int, tuple] = {}

    # -- classes -------------------------------------------------------------------------
    def op_classes(self) -> list[int]:
        """[op] class id: equal for ops whose compute segments (and the parts of other segments
        that read them) a build makes alike, apart from the ops they name."""
        if self._cls is not None:
            return self._cls
        ctx, sch, fsdp = self.ctx, self.schedule, self.fsdp
        g, s = ctx.graph, ctx.strategy
        index, users = g.index, ctx.users
        sym = ctx.sym.dims if ctx.sym is not None else None
        dev_ids: dict[int, tuple[tuple, int]] = {}  # id of a device tuple -> (it, its number)
        dev_vals: dict[tuple, int] = {}
        classes: dict[tuple, int] = {}
        out = []
        for oi, op in enumerate(g.ops):
            cfg = s.configs[op.name]
            hit = dev_ids.get(id(cfg.devices))
            if hit is None or hit[0] is not cfg.devices:
                hit = dev_ids[id(cfg.devices)] = (cfg.devices, dev_vals.setdefault(cfg.devices, len(dev_vals)))
            where = (int(sch.chunk_of[oi]), bool(sch.has_prod[oi]), bool(sch.has_cons[oi]),
                     bool(sch.has_bwd_prod[oi])) if sch.units else None
            key = (op_signature(op), op.is_view, op.param_count, op.param_dtype, op.fwd_flops, op.bwd_flops,
                   bool(op.param_group), op.kind == "input",
                   tuple(cfg.degrees.items()), hit[1], recompute_reruns(g, op, s.recompute, s.fp8, s.recompute_modules),
                   tuple(sym.get(op.name) or ()) if sym is not None else None, where,
                   fsdp.zero_shares.get(op.name, 1), self._scatter_after(op),
                   tuple((index[r.op] - oi, r.index) for r in op.inputs),
                   tuple(tuple((c - oi, i) for c, i in users.get((oi, o), ())) for o in range(len(op.out_tensors))))
            out.append(classes.setdefault(key, len(classes)))
        self._cls = out
        return out

    def _source(self, key: tuple, cls: tuple, base: int) -> tuple[tuple, int] | None:
        """The first segment of class ``cls`` and the offset to it; None (``key`` recorded as
        the class's first) when there is none."""
        first = self._first.get(cls)
        if first is None:
            self._first[cls] = (key, base)
            return None
        return first[0], base - first[1]

    # -- copies --------------------------------------------------------------------------
    def compute(self, seg: Segment, oi: int, mirror: Callable) -> bool:
        """Make op ``oi``'s compute segment (and its tables) as a copy of a twin's; False when
        it has none (or the copy gives up): then it is built."""
        src = self._source(("op", oi), ("op", self.op_classes()[oi]), oi)
        if src is None:
            return False
        so = src[0][1]
        t = self.tables
        try:
            lut, op_map = self._renaming(self.store.segments[src[0]], seg, src[1], [so], [])
            renamed = self._tables_renamed(so, lut)
            self._copy(self.store.segments[src[0]], seg, lut, op_map)
        except _Foreign:
            return False
        finally:
            self._put_back()
        for name, table in self._handle_tables:
            new = renamed.get(name)
            if new is not None:
                table[oi] = new
            else:
                table.pop(oi, None)
        for table in self._plain_tables:
            table[oi] = table[so]
        mirror(t.devs[oi], t.devs[oi][t.image[oi]])
        return True

    def _tables_renamed(self, so: int, lut: np.ndarray) -> dict[str, np.ndarray]:
        """Op ``so``'s handle tables (:data:`_HANDLE_TABLES`) renamed by ``lut`` in one pass: a
        table two names share is renamed once, and a view of one column
        (:func:`.compute.spread`) stays one (its column renamed and spread again). What is
        gathered from ``so``'s tables is kept for the copies after (a source's tables are final
        once made)."""
        tabs = tuple(table.get(so) for _, table in self._handle_tables)
        held = self._tables_held.get(so)
        if held is None or any(a is not b for a, b in zip(held[0], tabs)):
            distinct: list[tuple[np.ndarray, bool]] = []
            at: dict[int, int] = {}
            where = []
            for tab in tabs:
                if tab is None:
                    where.append(-1)
                    continue
                k = at.get(id(tab))
                if k is None:
                    k = at[id(tab)] = len(distinct)
                    distinct.append((tab, tab.ndim == 2 and tab.shape[1] > 1 and tab.strides[1] == 0))
                where.append(k)
            parts = [np.ascontiguousarray(tab[:, :1] if view else tab).reshape(-1) for tab, view in distinct]
            joined = (np.concatenate(parts) if len(parts) > 1 else parts[0]) if parts else None
            held = self._tables_held[so] = (tabs, distinct, where, joined, [p.size for p in parts])
        _, distinct, where, joined, sizes = held
        if joined is None:
            return {}
        out = _rename(joined, lut)
        made, start = [], 0
        for (tab, view), n in zip(distinct, sizes):
            piece = out[start:start + n]
            start += n
            made.append(spread(piece.reshape(tab.shape[0], 1), np.empty(tab.shape[1])) if view
                        else piece.reshape(tab.shape))
        return {name: made[k] for (name, _), k in zip(self._handle_tables, where) if k >= 0}

    def tensor(self, seg: Segment, p: int, o: int) -> bool:
        """Make tensor ``(p, o)``'s transfer segment as a copy of a twin's (False: build it)."""
        cls = self.op_classes()
        users = self.ctx.users[(p, o)]
        src = self._source(("tensor", p, o), ("tensor", o, cls[p], tuple((c - p, i, cls[c]) for c, i in users)), p)
        if src is None:
            return False
        delta = src[1]
        refs = [p - delta] + [c - delta for c, _ in users]
        return self._copied(src[0], seg, delta, refs, [])

    def sync(self, seg: Segment, unit: str) -> bool:
        """Make parameter unit ``unit``'s synchronisation segment as a copy of a twin's (False:
        build it). The ops whose backwards end a stage's pass (:meth:`FsdpPlan.stage_tail`) are
        the same ops for every unit of the stage: they are matched as themselves."""
        plan, cls = self.fsdp, self.op_classes()
        members = plan.units[unit]
        base = members[0]
        ahead = [plan.prefetch.get((unit, ph)) for ph in (FWD, BWD)]
        tail = plan.stage_tail(unit)
        rel = set(members) | {a for a in ahead if a is not None}
        if rel & set(tail):
            return False
        key = ("sync", tuple((r - base, cls[r]) for r in members),
               tuple(None if a is None else (a - base, cls[a]) for a in ahead), tuple(tail))
        src = self._source(("sync", unit), key, base)
        if src is None:
            return False
        delta = src[1]
        return self._copied(src[0], seg, delta, [r - delta for r in rel], list(tail))

    def _copied(self, src_key: tuple, seg: Segment, delta: int, rel: list[int], fixed: list[int]) -> bool:
        src = self.store.segments[src_key]
        try:
            lut, op_map = self._renaming(src, seg, delta, rel, fixed)
            self._copy(src, seg, lut, op_map)
        except _Foreign:
            return False
        finally:
            self._put_back()
        return True

    def _renaming(self, src: Segment, seg: Segment, delta: int, rel: list[int],
                  fixed: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """[slot] new slot of every slot a copy of ``src`` may point into (-1: none) and [op]
        new op index (-1: none): ``src`` to ``seg``, each op of ``rel`` (the source's refs)
        ``delta`` further on, the ops of ``fixed``, the optimizer steps and the barriers to
        themselves."""
        if src._frozen is not None or src._shared is not None:
            raise _Foreign  # (made in an earlier build: its entries are gone)
        slot_of = self.store.slot_of
        n_ops = len(self.ctx.graph.ops)
        lut, op_map = self._lut, self._op_map
        if lut is None or lut.size < len(slot_of):  # -1 but for the barriers and the optimizer steps
            lut = self._lut = np.full(max(1024, 2 * len(slot_of)), -1, np.int64)
            D = self.ctx.n_devices
            lut[:D] = np.arange(D)  # ("barriers", d) has slot d
            up = slot_of[("updates",)]
            lut[up] = up
        if op_map is None:  # (index -1, the "no op" of a task, maps to itself)
            op_map = self._op_map = np.full(n_ops + 1, -1, np.int64)
        slots, ops = self._set
        lut[src.slot] = seg.slot
        slots.append(src.slot)
        for r in fixed:
            s_ = slot_of[("op", r)]
            lut[s_] = s_
            op_map[r] = r
            slots.append(s_)
            ops.append(r)
        for r in rel:
            if not 0 <= r + delta < n_ops:
                raise _Foreign
            s_ = slot_of[("op", r)]
            lut[s_] = slot_of[("op", r + delta)]
            op_map[r] = r + delta
            slots.append(s_)
            ops.append(r)
        return lut, op_map

    def _put_back(self) -> None:
        """Undo what the last :meth:`_renaming` set in its tables."""
        slots, ops = self._set
        lut, op_map = self._lut, self._op_map
        for s_ in slots:  # (a few entries: scalar stores beat a fancy index's set-up)
            lut[s_] = -1
        slots.clear()
        for o in ops:
            op_map[o] = -1
        ops.clear()

    def _copy(self, src: Segment, seg: Segment, lut: np.ndarray, op_map: np.ndarray) -> None:
        """``seg`` made from ``src``'s entries, handles and ops renamed (nothing is written to
        ``seg`` when a handle or an op falls outside the renaming: :class:`_Foreign`)."""
        # every handle array renamed in one pass (few, large calls: numpy's cost per call is
        # what a copy saves over a build); a source's handles are gathered once for all its copies
        flat = dict(src.flat)
        held = self._held.get(id(src))
        if held is None or held[0] is not src:
            names = [(name, sum(a.size for a in arrays)) for name, arrays in src.flat.items()
                     if name in _HANDLE_FLAT and arrays]
            parts = [a for name, _ in names for a in src.flat[name]]
            cat = (np.concatenate(parts) if len(parts) > 1 else parts[0]) if parts else None
            held = self._held[id(src)] = (src, names, cat)
        if held[2] is not None:
            renamed = _rename(held[2], lut)
            at = 0
            for name, n in held[1]:
                flat[name] = [renamed[at:at + n]]
                at += n
        rows = []
        for row in src.rows:  # (each add() call's op, row[2]: a scalar, or an array of its tasks')
            v = row[2]
            if type(v) is np.ndarray:
                w = op_map[v]
                if np.any(w[v >= 0] < 0):
                    raise _Foreign
            else:
                w = int(op_map[v])
                if v >= 0 > w:
                    raise _Foreign
            rows.append((*row[:2], w, *row[3:]))
        # (the source is complete: its arrays are shared, never written to)
        seg.rows = rows
        seg.flat = flat
        seg.n = src.n
        seg.comm_bytes, seg.comm_mb = src.comm_bytes, src.comm_mb
        seg.cross_replica = src.cross_replica
        seg.device_params = None if src.device_params is None else src.device_params.copy()
        self.copied += 1


def _rename(h: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """Handles ``h`` with their slots renamed by ``lut`` (:class:`_Foreign` when one is not)."""
    out, ok = _renamed(np.ascontiguousarray(h).reshape(-1), lut)
    if not ok:
        raise _Foreign
    return out.reshape(h.shape)


@nb.njit(cache=True)
def _renamed(h: np.ndarray, lut: np.ndarray) -> tuple[np.ndarray, bool]:  # pragma: no cover - compiled
    """(``h`` renamed, True), or False at the first handle whose slot ``lut`` does not rename
    (one pass: a copy renames many small arrays, where NumPy's per-call cost dominated)."""
    out = np.empty_like(h)
    for i in range(h.size):
        s = lut[h[i] >> SEGMENT_SHIFT]
        if s < 0:
            return out, False
        out[i] = (s << SEGMENT_SHIFT) | (h[i] & LOCAL_MASK)
    return out, True
