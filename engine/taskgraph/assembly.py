"""The segment store (which segment reads which op's tables, in which slot) and the assembly of
its segments into one :class:`TaskGraph`, splicing unchanged runs from the previous assembly."""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np

from ..errors import check_cancel
from .context import BuildContext, OpTables
from .emit import Emitter
from .regions import within
from .segments import ALL_ARRAYS, LOCAL_MASK, SEGMENT_SHIFT, Segment, csr_from_handles
from .tasks import BARRIER, TaskGraph

__all__ = ["SegmentStore", "Live", "assemble"]

#: tasks a step of the assembly handles between two cancel checks (~0.1-0.3 s on a loaded
#: 2-core machine, where touching fresh memory dominates)
_CANCEL_BLOCK = 1 << 21


class SegmentStore:
    """Segments by key (``("op", oi)``, ``("tensor", p, o)``, ``("sync", unit)``,
    ``("updates",)``, ``("barriers", device)``), each in a fixed slot (the canonical task
    order, kept through rebuilds), and which ops' tables each reads."""

    def __init__(self, n_devices: int) -> None:
        self.n_devices = n_devices
        self.segments: dict[tuple, Segment] = {}
        # ("barriers", d) has slot d: made only for devices with tasks, in an order that
        # does not depend on when
        self.slot_of: dict[tuple, int] = {("barriers", d): d for d in range(n_devices)}
        self.refs: dict[tuple, set[int]] = {}  # segment key -> ops whose tables it reads
        self.readers: dict[int, set[tuple]] = {}  # op -> keys of the segments that read it
        self._keys: list[tuple] = []  # keys in slot order (refreshed when keys are added)
        self.previous: dict[str, Any] | None = None  # the last assembly's arrays, spliced by the next
        self._barriers: dict[int, np.ndarray] = {}  # device -> its barrier handles
        self._dirty: set[tuple] = set()  # keys whose segment was replaced since the last live()
        # the last live(): (devices in use, position of each live key, the Live record)
        self._live: tuple | None = None

    def begin(self, key: tuple, refs) -> Segment:
        """A new, empty segment for ``key`` (replacing any old one) reading ``refs``."""
        slot = self.slot_of.setdefault(key, len(self.slot_of))
        seg = self.segments[key] = Segment(slot)
        self.set_refs(key, set(refs))
        return seg

    def put(self, key: tuple, seg: Segment, refs: set[int]) -> None:
        """Put back a segment made before for ``key`` (it keeps its slot), reading ``refs``."""
        self.segments[key] = seg
        self.set_refs(key, refs)

    def set_refs(self, key: tuple, refs: set[int]) -> None:
        for o in self.refs.get(key, ()):
            self.readers[o].discard(key)
        self.refs[key] = refs
        for o in refs:
            self.readers.setdefault(o, set()).add(key)
        self._dirty.add(key)  # (a new segment, or an old one put back, comes with its refs)

    def reading(self, oi: int) -> list[tuple]:
        """Keys of the segments that read op ``oi``, in slot (build) order."""
        return sorted(self.readers.get(oi, ()), key=self.slot_of.__getitem__)

    def barriers(self, device: int, count: int) -> np.ndarray:
        """Handles of ``device``'s chain of ``count`` barriers, made on first use."""
        ids = self._barriers.get(device)
        if ids is None:
            key = ("barriers", device)
            seg = self.segments[key] = Segment(self.slot_of[key])
            self.set_refs(key, set())
            ids = self._barriers[device] = seg.add(count, BARRIER)
            if count > 1:
                seg.edges(ids[:-1], ids[1:])
        return ids

    def live(self, bar_devices: set[int]) -> "Live":
        """The segments of the graph in slot order (barriers only of ``bar_devices``: where an op
        that meets them runs now; a chain an earlier config made stays out), their
        serials, slots and per-segment totals (:class:`Live`). Kept from the last call: after
        a rebuild only the replaced segments are looked up again (the returned record and its
        arrays are new, never modified)."""
        if len(self._keys) != len(self.segments):
            self._keys = sorted(self.segments, key=self.slot_of.__getitem__)
            self._live = None
        used = frozenset(bar_devices)
        if self._live is None or self._live[0] != used:
            keys = [k for k in self._keys if k[0] != "barriers" or k[1] in used]
            segs = [self.segments[k] for k in keys]
            live = Live(segs, np.fromiter((sg.serial for sg in segs), np.int64, len(segs)),
                        np.fromiter((sg.slot for sg in segs), np.int64, len(segs)),
                        np.fromiter((sg.comm_bytes for sg in segs), np.float64, len(segs)),
                        np.fromiter((sg.cross_replica for sg in segs), np.int64, len(segs)), self.n_devices)
            self._live = (used, {k: i for i, k in enumerate(keys)}, live)
        elif self._dirty:
            _, where, old = self._live
            live = Live(list(old.segs), old.serials.copy(), old.slots, old.comm_bytes.copy(), old.cross_replica.copy(),
                        self.n_devices, old.param_pos, old.param_rows)  # (rows copied when one changes)
            for k in self._dirty:
                i = where.get(k)
                if i is not None:
                    sg = live.segs[i] = self.segments[k]
                    live.serials[i], live.comm_bytes[i], live.cross_replica[i] = sg.serial, sg.comm_bytes, \
                        sg.cross_replica
                    live.set_params(i, sg.device_params)
            self._live = (used, where, live)
        self._dirty.clear()
        return self._live[2]

    def splice(self, segs: list[Segment], serials: np.ndarray, cancel: Any = None) -> dict[str, Any]:
        """Every column and flat array of ``segs`` concatenated, with each segment's bounds.

        The first assembly concatenates everything; later ones (after a rebuild) copy runs of
        segments unchanged since the previous assembly as slices of its arrays and insert
        only the new segments, so the Python work is per changed segment (never per segment
        of the graph)."""
        prev = self.previous
        if prev is None:  # every segment is new (a first assembly)
            whole = Segment.freeze_all(segs, cancel)
            assert whole is not None, "segments frozen outside an assembly"
            whole["arrays"]["dur"] = whole["arrays"]["dur"].copy()  # optimizer steps are written in
            return whole
        # each segment's index in the previous assembly (by serial; -1 when new), then runs
        # of consecutive previous segments and the new segments between them
        p_ser, p_order = prev["serials"], prev["serial_order"]
        k = np.minimum(np.searchsorted(p_ser[p_order], serials), p_ser.size - 1)
        j = np.where(p_ser[p_order[k]] == serials, p_order[k], -1)
        kept = j >= 0
        run_start = kept & np.concatenate([[True], (j[1:] != j[:-1] + 1) | ~kept[:-1]])
        begin = np.flatnonzero(run_start | ~kept)
        is_run = kept[begin].tolist()
        fresh = np.flatnonzero(~kept)  # positions of the new segments
        news = [segs[i] for i in fresh.tolist()]
        Segment.freeze_all(news)  # (those not frozen yet, in one go; restored ones are)
        frozen = [sg.freeze() for sg in news]
        runs = begin[kept[begin]]
        r_first = j[runs]  # each run's first and end segment in the previous assembly
        r_end = r_first + np.diff(np.append(begin, len(segs)))[kept[begin]]
        jj = np.maximum(j, 0)
        arrays, bounds = {}, {}
        for name in ALL_ARRAYS:
            w, off = prev["arrays"][name], prev["bounds"][name]
            task_col = name in Segment._DTYPES
            xs = [f["cols"][name] for f in frozen] if task_col else [f[name] for f in frozen]
            spans = zip(off[r_first].tolist(), off[r_end].tolist())
            it = iter(xs)
            arrays[name] = np.concatenate([w[slice(*next(spans))] if r else next(it) for r in is_run])
            if task_col and name != "kind":  # (the task columns share their bounds)
                bounds[name] = bounds["kind"]
                continue
            sizes = (off[1:] - off[:-1])[jj]  # [segment] elements (kept ones as before)
            sizes[fresh] = [x.size for x in xs]
            b = bounds[name] = np.zeros(len(segs) + 1, np.int64)
            np.cumsum(sizes, out=b[1:])
        return {"arrays": arrays, "bounds": bounds}


class Live:
    """The live segments of a :class:`SegmentStore` in slot order and, per segment, its serial,
    slot, bytes sent and transfers crossing replicas; ``param_rows`` [segment with parameters,
    device]: the parameters each device's optimizer step updates, of the segments at
    positions ``param_pos`` (in slot order; sync segments only, a few per parameter unit)."""

    __slots__ = ("segs", "serials", "slots", "comm_bytes", "cross_replica", "param_pos", "param_rows", "_own_rows")

    def __init__(self, segs: list[Segment], serials: np.ndarray, slots: np.ndarray, comm_bytes: np.ndarray,
                 cross_replica: np.ndarray, n_devices: int, param_pos: np.ndarray | None = None,
                 param_rows: np.ndarray | None = None) -> None:
        self.segs, self.serials, self.slots = segs, serials, slots
        self.comm_bytes, self.cross_replica = comm_bytes, cross_replica
        if param_pos is None:
            self._rows_from_segs(n_devices)
        else:  # (another record's rows: copied before this one changes them)
            self.param_pos, self.param_rows, self._own_rows = param_pos, param_rows, False

    def _rows_from_segs(self, n_devices: int) -> None:
        pos = [i for i, sg in enumerate(self.segs) if sg.device_params is not None]
        self.param_pos = np.array(pos, np.int64)
        self.param_rows = np.zeros((len(pos), n_devices))
        self._own_rows = True
        for r, i in enumerate(pos):
            self.param_rows[r] = self.segs[i].device_params

    def set_params(self, i: int, device_params: np.ndarray | None) -> None:
        """Segment ``i`` was replaced: take its parameters."""
        r = int(np.searchsorted(self.param_pos, i))
        had = r < self.param_pos.size and self.param_pos[r] == i
        if had and device_params is not None:
            if not self._own_rows:
                self.param_rows, self._own_rows = self.param_rows.copy(), True
            self.param_rows[r] = device_params
        elif had or device_params is not None:  # a segment gained or lost parameters: rows again
            self._rows_from_segs(self.param_rows.shape[1])

    def params(self) -> np.ndarray:
        """[device] the parameters each device's optimizer step updates, the segments' added
        one after another in slot order (not a pairwise sum: the same additions as a loop)."""
        return _add_rows(self.param_rows)


@nb.njit(cache=True)
def _add_rows(rows):  # pragma: no cover - compiled
    """[column] the rows of ``rows`` added one after another, from zeros (no temporary)."""
    out = np.zeros(rows.shape[1])
    for r in range(rows.shape[0]):
        for d in range(rows.shape[1]):
            out[d] += rows[r, d]
    return out


@nb.njit(cache=True)
def _add_all(x):  # pragma: no cover - compiled
    """The elements of ``x`` added one after another, from 0.0 (as a Python loop would)."""
    total = 0.0
    for v in x:
        total += v
    return total


def _link_in_blocks(offset: np.ndarray, n: int, single: np.ndarray, coll: np.ndarray, A: dict[str, np.ndarray],
                    cancel: Any) -> tuple[np.ndarray, ...]:
    """:func:`_link` in NumPy steps and blocks of :data:`_CANCEL_BLOCK` tasks, ``cancel``
    (:func:`engine.errors.check_cancel`) asked between them; the same arrays."""
    def gid(h: np.ndarray) -> np.ndarray:
        return offset[h >> SEGMENT_SHIFT] + (h & LOCAL_MASK)

    # resources: one per task (its device or link), several for a collective
    counts = (single >= 0).astype(np.int64)
    check_cancel(cancel)
    counts[coll] = A["coll_nres"]
    res_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=res_ptr[1:])
    check_cancel(cancel)
    res_idx = np.empty(res_ptr[-1], np.int64)
    has = np.nonzero(single >= 0)[0]
    for a in range(0, has.size, _CANCEL_BLOCK):  # (in blocks: a cancel is asked between them)
        check_cancel(cancel)
        h = has[a:a + _CANCEL_BLOCK]
        res_idx[res_ptr[h]] = single[h]
    check_cancel(cancel)
    if coll.size:
        m_len = A["coll_nres"]
        res_idx[np.repeat(res_ptr[coll], m_len) + within(m_len)] = A["coll_res"]
    check_cancel(cancel)
    # successors, CSR by source (a duplicate edge is harmless: npred counts it as often)
    succ_ptr, succ_idx, npred = csr_from_handles(A["src"], A["dst"], offset, n)
    check_cancel(cancel)
    chain_next = np.full(n, -1, np.int64)
    chain_lag = np.zeros(n)
    cf, ct, cl = A["chain_from"], A["chain_to"], A["chain_lag"]
    for a in range(0, cf.size, _CANCEL_BLOCK):
        check_cancel(cancel)
        at = gid(cf[a:a + _CANCEL_BLOCK])
        chain_next[at] = gid(ct[a:a + _CANCEL_BLOCK])
        chain_lag[at] = cl[a:a + _CANCEL_BLOCK]
    check_cancel(cancel)
    return res_ptr, res_idx, succ_ptr, succ_idx, npred, chain_next, chain_lag


@nb.njit(cache=True)
def _link(offset, n, single, coll, coll_nres, coll_res, src_h, dst_h, chain_from, chain_to,
          chain_lag_in):  # pragma: no cover - compiled
    """The index arrays of a :class:`TaskGraph` from the spliced columns, in one compiled
    pass each (:func:`_link_in_blocks` makes the same in NumPy steps): resources (CSR
    ``res_ptr``/``res_idx``: a task's device or link, a collective's group), successors
    (:func:`~engine.taskgraph.segments.csr_from_handles`) and cut-through chains.
    ``offset[slot]``: the slot's first task id; handles are ``slot << 32 | local index``."""
    counts = np.zeros(n, np.int64)
    for t in range(n):
        if single[t] >= 0:
            counts[t] = 1
    for i in range(coll.shape[0]):
        counts[coll[i]] = coll_nres[i]
    res_ptr = np.zeros(n + 1, np.int64)
    for t in range(n):
        res_ptr[t + 1] = res_ptr[t] + counts[t]
    res_idx = np.empty(res_ptr[n], np.int64)
    for t in range(n):
        if single[t] >= 0:
            res_idx[res_ptr[t]] = single[t]
    k = 0
    for i in range(coll.shape[0]):
        at = res_ptr[coll[i]]
        for j in range(coll_nres[i]):
            res_idx[at + j] = coll_res[k]
            k += 1
    succ_ptr, succ_idx, npred = csr_from_handles(src_h, dst_h, offset, n)
    chain_next = np.full(n, -1, np.int64)
    chain_lag = np.zeros(n)
    for i in range(chain_from.shape[0]):
        a = offset[chain_from[i] >> SEGMENT_SHIFT] + (chain_from[i] & LOCAL_MASK)
        chain_next[a] = offset[chain_to[i] >> SEGMENT_SHIFT] + (chain_to[i] & LOCAL_MASK)
        chain_lag[a] = chain_lag_in[i]
    return res_ptr, res_idx, succ_ptr, succ_idx, npred, chain_next, chain_lag


def assemble(store: SegmentStore, ctx: BuildContext, tables: OpTables, emit: Emitter,
             device_image: np.ndarray, cancel: Any = None) -> TaskGraph:
    """Concatenate the store's segments in slot order, turn handles into task ids, price each
    device's optimizer step, and build the CSR arrays of successors and resources
    (``cancel``, :func:`engine.errors.check_cancel`, asked between these steps)."""
    check_cancel(cancel)
    D = ctx.n_devices
    live = store.live(tables.bar_devices)
    segs, serials, slots = live.segs, live.serials, live.slots
    asm = store.splice(segs, serials, cancel)
    check_cancel(cancel)
    A = asm["arrays"]
    starts = asm["bounds"]["kind"]
    n = int(starts[-1])
    offset = np.zeros(int(slots.max()) + 1, np.int64)  # [slot] first task id
    offset[slots] = starts[:-1]

    def gid(h: np.ndarray) -> np.ndarray:
        return offset[h >> SEGMENT_SHIFT] + (h & LOCAL_MASK)

    cols = {k: A[k] for k in Segment._DTYPES}
    # optimizer steps: one per device that runs a representative partition (the segments'
    # parameters and bytes added in slot order, one after another, as a loop would)
    params = live.params()
    comm_bytes = float(_add_all(live.comm_bytes))
    cross = int(live.cross_replica.sum())
    cols["dur"][gid(tables.updates)] = emit.optimizer_times_s(params, tables.rep_devices)
    check_cancel(cancel)
    coll = gid(A["coll_h"])
    if cancel is None:  # (a rebuild: one compiled pass for the resources, successors and chains)
        res_ptr, res_idx, succ_ptr, succ_idx, npred, chain_next, chain_lag = _link(
            offset, n, cols["res"], coll, A["coll_nres"], A["coll_res"], A["src"], A["dst"], A["chain_from"],
            A["chain_to"], A["chain_lag"])
    else:  # (a first build: the same arrays in blocks, a cancel asked between them)
        res_ptr, res_idx, succ_ptr, succ_idx, npred, chain_next, chain_lag = _link_in_blocks(
            offset, n, cols["res"], coll, A, cancel)
    # collectives' devices
    ptr = np.zeros(coll.size + 1, np.int64)
    np.cumsum(A["coll_ndev"], out=ptr[1:])
    tg = TaskGraph(
        kind=cols["kind"], op=cols["op"], part=cols["part"], mb=cols["mb"], device=cols["device"],
        dur_s=cols["dur"], size_bytes=cols["size"], flops=cols["flops"], coll=cols["coll"], link=cols["link"],
        res_ptr=res_ptr, res_idx=res_idx, succ_ptr=succ_ptr, succ_idx=succ_idx, npred=npred,
        chain_next=chain_next, chain_lag_s=chain_lag, n_devices=D, n_links=len(ctx.cluster.links),
        comm_bytes=comm_bytes)
    tg.info = {"microbatches": ctx.microbatches, "ops": len(ctx.graph.ops), "coll_devices": (ptr, A["coll_dev"], coll),
               "symmetry": ctx.sym, "cross_replica_transfers": cross, "device_image": device_image,
               # per segment, in task order: slot, first task id, tasks, serial (identity of
               # its contents): which tasks a delta simulation can reuse
               "segments": (slots, starts[:-1].copy(), np.diff(starts), serials)}
    if ctx.simulated is not None:  # [microbatch] bytes sent (engine.sim.steady)
        tg.info["comm_by_microbatch"] = sum((sg.comm_mb for sg in segs if sg.comm_mb is not None),
                                            np.zeros(ctx.microbatches))
    # the arrays are spliced from on the next assembly: TaskGraph arrays are never modified
    store.previous = {**asm, "serials": serials, "serial_order": np.argsort(serials)}
    return tg
