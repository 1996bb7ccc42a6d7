"""Segments: the tasks and edges built for one part of the graph, addressed by handles so that
one segment can be rebuilt without renumbering the others, and the CSR assembly of edges."""

from __future__ import annotations

from itertools import chain
from typing import Any

import numba as nb
import numpy as np

from ..errors import check_cancel

__all__ = ["Segment", "SEGMENT_SHIFT", "LOCAL_MASK", "ALL_ARRAYS", "csr_from_handles"]

#: a task handle is (segment slot << SEGMENT_SHIFT) | the task's index inside its segment
SEGMENT_SHIFT = 32
#: the bits of a handle that hold the task's index inside its segment
LOCAL_MASK = (1 << SEGMENT_SHIFT) - 1


class Segment:
    """Tasks and edges made for one part of the graph (an op's compute, a tensor's transfers,
    a parameter unit's synchronisation, or a fixed block), as arrays.

    A task is addressed by a *handle*, ``slot << 32 | local index``, so that a segment can be
    rebuilt (delta simulation) without renumbering the others; :meth:`TaskGraphBuilder.assemble`
    turns handles into task ids, concatenating segments in slot order.
    """

    _DTYPES = {"kind": np.int8, "op": np.int32, "part": np.int32, "mb": np.int32, "device": np.int32,
               "dur": np.float64, "size": np.float64, "flops": np.float64, "coll": np.int8, "link": np.int32,
               "res": np.int64}

    #: Per-segment arrays other than the task columns: edges (handles), cut-through chains
    #: (``chain_next[chain_from] = chain_to`` with lag), and each collective's resources and
    #: devices (``coll_h`` repeated per collective row; lengths in ``coll_nres``/``coll_ndev``).
    _FLAT = {"src": np.int64, "dst": np.int64, "chain_from": np.int64, "chain_to": np.int64,
             "chain_lag": np.float64, "coll_h": np.int64, "coll_nres": np.int64, "coll_res": np.int64,
             "coll_ndev": np.int64, "coll_dev": np.int64}

    _serials = iter(range(1, 1 << 62))

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.serial = next(Segment._serials)  # identity across assemblies (delta simulation)
        self.n = 0
        # one row per add() call: (its task count, then its value of each column, in _DTYPES order)
        self.rows: list[tuple] = []
        # edges, cut-through chains and collectives' resources/devices, as lists of arrays (only
        # the names used; most segments hold edges alone)
        self.flat: dict[str, list[np.ndarray]] = {}
        self.comm_bytes = 0.0
        self.comm_mb: np.ndarray | None = None  # [microbatch] of comm_bytes (kept by a build of some microbatches)
        self.cross_replica = 0
        self.device_params: np.ndarray | None = None  # parameters each device's optimizer updates
        self._frozen: dict[str, Any] | None = None
        self._shared: tuple | None = None  # (arrays, index, start, end) after freeze_all

    def add(self, n: int, kind: int, *, op=-1, part=-1, mb=-1, device=-1, dur=0.0, size=0.0, flops=0.0,
            coll=-1, link=-1, res=-1) -> np.ndarray:
        """Append ``n`` tasks and return their handles; each column is a scalar (kept as is
        until :meth:`freeze`) or an array of length ``n``."""
        ids = (self.slot << SEGMENT_SHIFT) + np.arange(self.n, self.n + n, dtype=np.int64)
        self.n += n
        self.rows.append((n, kind, op, part, mb, device, dur, size, flops, coll, link, res))
        return ids

    def edges(self, src, dst) -> None:
        src = np.asarray(src, np.int64).ravel()
        dst = np.asarray(dst, np.int64).ravel()
        if src.size:
            self.put("src", src)
            self.put("dst", dst)

    def put(self, name: str, array: np.ndarray) -> None:
        """Append ``array`` to the flat array ``name`` (one of :attr:`_FLAT`)."""
        got = self.flat.get(name)
        if got is None:
            self.flat[name] = [array]
        else:
            got.append(array)

    @classmethod
    def freeze_all(cls, segs: list["Segment"], cancel: Any = None) -> dict[str, Any] | None:
        """Freeze many segments at once: one array per column for all of them, each segment
        keeping views of its slice (far fewer small allocations than one by one). Returns
        the combined arrays (``arrays``: column or flat name -> array) and each segment's
        bounds in them (``bounds``) when every segment was new (a first assembly), else None.
        ``cancel`` (:func:`engine.errors.check_cancel`) is asked before each column."""
        todo = [sg for sg in segs if sg._frozen is None and sg._shared is None]
        if not todo:
            return None
        cols = cls._columns(list(chain.from_iterable(sg.rows for sg in todo)), cancel)  # every add() call's row
        starts_at = np.cumsum([0] + [sg.n for sg in todo])
        starts = starts_at.tolist()
        # each flat name's arrays in segment order, with the segment each came from
        arrays: dict[str, list[np.ndarray]] = {name: [] for name in cls._FLAT}
        owners: dict[str, list[int]] = {name: [] for name in cls._FLAT}
        for j, sg in enumerate(todo):
            for name, got in sg.flat.items():
                arrays[name] += got
                owners[name] += [j] * len(got)
        check_cancel(cancel)
        flat = {}
        for name, dt in cls._FLAT.items():
            got = arrays[name]
            sizes = np.fromiter((a.size for a in got), np.int64, len(got))
            bounds = np.zeros(len(todo) + 1, np.int64)
            np.cumsum(np.bincount(np.asarray(owners[name], np.int64), weights=sizes,
                                  minlength=len(todo)).astype(np.int64), out=bounds[1:])
            flat[name] = (np.concatenate(got) if got else np.zeros(0, dt), bounds)
        shared = (cols, flat)
        for j, sg in enumerate(todo):
            sg._shared = (shared, j, starts[j], starts[j + 1])  # views made on demand by freeze()
            sg.rows = []
            sg.flat = {}
        if len(todo) != len(segs):
            return None
        arrays = {**cols, **{name: arr for name, (arr, _) in flat.items()}}
        bounds = {name: starts_at for name in cols} | {name: b for name, (_, b) in flat.items()}
        return {"arrays": arrays, "bounds": bounds}

    @classmethod
    def _columns(cls, rows: list[tuple], cancel: Any = None) -> dict[str, np.ndarray]:
        """Each column of :attr:`_DTYPES` from add() rows (transposed in one ``zip``, in C);
        ``cancel`` is asked before each column."""
        by_col = list(zip(*rows)) if rows else [()] * (1 + len(cls._DTYPES))
        ns = np.fromiter(by_col[0], np.int64, len(rows))
        ends = np.cumsum(ns).tolist()
        cols = {}
        for i, (key, dt) in enumerate(cls._DTYPES.items(), 1):
            check_cancel(cancel)
            cols[key] = _fill(by_col[i], ns, ends, dt)
        return cols

    def freeze(self) -> dict[str, Any]:
        """The segment's arrays (computed once; a built segment never changes)."""
        if self._shared is not None:
            (cols, flat), j, a, b = self._shared
            self._frozen = {"cols": {k: v[a:b] for k, v in cols.items()}}
            for name, (arr, bounds) in flat.items():
                self._frozen[name] = arr[bounds[j]:bounds[j + 1]]
            self._shared = None
        if self._frozen is None:
            self._frozen = {"cols": self._columns(self.rows)}
            for name, dt in self._FLAT.items():
                xs = self.flat.get(name)
                self._frozen[name] = np.concatenate(xs) if xs else np.zeros(0, dt)
            self.rows = []
            self.flat = {}
        return self._frozen


ALL_ARRAYS = (*Segment._DTYPES, *Segment._FLAT)


def _fill(values, ns: np.ndarray, ends: list[int], dtype) -> np.ndarray:
    """One column from each add() call's value (a scalar for its ``ns[i]`` tasks, or an array
    of them; ``ends``: the running sum of ``ns``): the scalars in one ``np.repeat``, the arrays
    copied in."""
    if not values:
        return np.empty(0, dtype)
    arrays = [i for i, v in enumerate(values) if type(v) is np.ndarray]
    if not arrays:
        return np.repeat(np.asarray(values, dtype), ns)
    scalars = list(values)
    for i in arrays:
        scalars[i] = 0
    out = np.repeat(np.asarray(scalars, dtype), ns)
    for i in arrays:
        out[ends[i - 1] if i else 0:ends[i]] = values[i]
    return out


@nb.njit(cache=True)
def csr_from_handles(src_h: np.ndarray, dst_h: np.ndarray, offset: np.ndarray, n: int):  # pragma: no cover - compiled
    """Successor lists from edges given as handles (``offset[slot]`` is the slot's first task
    id): CSR by source, each source's edges in their original order (a stable counting
    sort), and predecessor counts."""
    m = src_h.shape[0]
    src = np.empty(m, np.int64)
    succ_ptr = np.zeros(n + 1, np.int64)
    npred = np.zeros(n, np.int64)
    succ_idx = np.empty(m, np.int64)
    for e in range(m):
        u = offset[src_h[e] >> 32] + (src_h[e] & 0xFFFFFFFF)
        v = offset[dst_h[e] >> 32] + (dst_h[e] & 0xFFFFFFFF)
        src[e] = u
        succ_idx[e] = v
        succ_ptr[u + 1] += 1
        npred[v] += 1
    for t in range(n):
        succ_ptr[t + 1] += succ_ptr[t]
    fill = succ_ptr[:-1].copy()
    out = np.empty(m, np.int64)
    for e in range(m):
        out[fill[src[e]]] = succ_idx[e]
        fill[src[e]] += 1
    return succ_ptr, out, npred


