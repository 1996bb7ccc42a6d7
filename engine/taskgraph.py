"""Task graphs: (OpGraph, Strategy, Cluster) -> arrays of compute, transfer and collective tasks.

Following FlexFlow's execution simulator (Jia et al. SysML'19 §5), every partition of every op
gets a forward and a backward *compute task* on its device, per microbatch, and data moves in
*transfer tasks* wherever a consumer partition needs a region of a tensor that another device
holds (size = overlap volume x bytes per element). Beyond FlexFlow:

* **Reductions.** A producer split along a reduction dim (row-parallel linear, vocabulary-
  parallel embedding) holds partial sums: an all-reduce (a reduce-scatter when the consumers
  are split the same way under sequence parallelism) runs before consumers read. In the
  backward pass, consumer partitions that each read a whole input they do not split (a
  column-parallel linear's input) hold partial input gradients, reduced the same way.
* **Gradient synchronisation** of replicated parameters: one collective per group of
  partitions holding the same parameter region, over that group's real links, starting when
  the group's last backward task ends, so it overlaps the rest of the backward pass. ZeRO
  stages 1-2 reduce-scatter gradients and all-gather parameters after the update; stage 3
  (FSDP) also all-gathers parameters before each forward and backward and reduce-scatters
  gradients per microbatch (Rajbhandari et al. SC'20).
* **Pipelines.** Microbatches run in GPipe, 1F1B or interleaved 1F1B order (Narayanan et al.
  SC'21 §2.2), enforced by zero-duration barrier tasks between consecutive schedule units on
  each device; with one stage and several microbatches this is gradient accumulation.
* **Recomputation**: full recomputation reruns every op's forward before its backward;
  selective reruns the attention core (Korthikanti et al. 2022).
* **Transfers over several links** are one task per link, pipelined (cut-through): hop k+1
  may start ``latency_k`` after hop k starts, and every hop streams for the bottleneck time, so
  an uncontended transfer takes sum(latency) + bytes / min(bandwidth), as on real networks.

Tasks are numbered and stored as NumPy arrays (``[task]``); dependencies as CSR successor
lists. No Python object is made per task.

Preconditions not checked here: the strategy passed :func:`engine.strategy.validate_strategy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cluster import Cluster
from .costs import CostModel, collective_time_s
from .graph import Op, OpGraph
from .ops import DTYPE_BYTES, FLOAT_DTYPES, REDUCTION, REPLICA
from .strategy import Config, Strategy

__all__ = [
    "TaskGraph",
    "build_task_graph",
    "FWD",
    "BWD",
    "XFER",
    "COLL",
    "UPDATE",
    "BARRIER",
    "KIND_NAMES",
    "COLL_NAMES",
]

FWD, BWD, XFER, COLL, UPDATE, BARRIER = 0, 1, 2, 3, 4, 5
KIND_NAMES = ("forward", "backward", "transfer", "collective", "update", "barrier")
COLL_NAMES = ("all_reduce", "reduce_scatter", "all_gather")
_COLL_INDEX = {n: i for i, n in enumerate(COLL_NAMES)}
#: Ops whose forward selective recomputation reruns (Korthikanti et al. 2022 §5: the
#: attention core between the QK^T matmul and the context matmul).
_SELECTIVE_KINDS = {"batch_matmul", "softmax"}


@dataclass
class TaskGraph:
    """Tasks as arrays. Resources are numbered devices first (0..D-1), then links
    (D..D+L-1).

    Attributes (all ``[task]`` unless noted)
    ----------
    kind : int8
        FWD, BWD, XFER, COLL, UPDATE or BARRIER.
    op : int32
        Op index (FWD/BWD/XFER/COLL of an op), -1 for per-device tasks.
    part : int32
        Partition of the op (FWD/BWD), -1 otherwise.
    mb : int32
        Microbatch, -1 for per-iteration tasks (gradient sync, update).
    device : int32
        Device of FWD/BWD/UPDATE tasks, -1 otherwise.
    dur_s : float64
        Duration in seconds.
    size_bytes : float64
        Bytes a transfer hop carries, or a collective's buffer size.
    flops : float64
        FLOPs of compute tasks.
    coll : int8
        Index into COLL_NAMES for collectives, -1 otherwise.
    link : int32
        Link of a transfer hop, -1 otherwise.
    res_ptr, res_idx : int64
        CSR resources ([task + 1], [nnz]).
    succ_ptr, succ_idx : int64
        CSR successors ([task + 1], [edges]).
    npred : int64
        Number of predecessors.
    chain_next : int64
        Next hop of a transfer (released ``chain_lag_s`` after this hop starts), -1 if none.
    chain_lag_s : float64
    """

    kind: np.ndarray
    op: np.ndarray
    part: np.ndarray
    mb: np.ndarray
    device: np.ndarray
    dur_s: np.ndarray
    size_bytes: np.ndarray
    flops: np.ndarray
    coll: np.ndarray
    link: np.ndarray
    res_ptr: np.ndarray
    res_idx: np.ndarray
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    npred: np.ndarray
    chain_next: np.ndarray
    chain_lag_s: np.ndarray
    n_devices: int
    n_links: int
    comm_bytes: float = 0.0  # bytes sent over all links in one iteration (collectives counted per rank)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tasks(self) -> int:
        return int(self.kind.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.succ_idx.shape[0])

    def pred_lists(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR predecessors (``pred_ptr`` [task + 1], ``pred_idx`` [edges])."""
        src = np.repeat(np.arange(self.num_tasks), np.diff(self.succ_ptr))
        order = np.argsort(self.succ_idx, kind="stable")
        ptr = np.zeros(self.num_tasks + 1, np.int64)
        np.cumsum(np.bincount(self.succ_idx, minlength=self.num_tasks), out=ptr[1:])
        return ptr, src[order]


class _Buffer:
    """Accumulates tasks and edges as arrays, one block per call."""

    def __init__(self) -> None:
        self.n = 0
        self.cols: dict[str, list[np.ndarray]] = {k: [] for k in
                                                  ("kind", "op", "part", "mb", "device", "dur", "size", "flops",
                                                   "coll", "link", "res")}
        self.multi_res: list[tuple[int, np.ndarray]] = []
        self.src: list[np.ndarray] = []
        self.dst: list[np.ndarray] = []
        self.chain_from: list[np.ndarray] = []
        self.chain_to: list[np.ndarray] = []
        self.chain_lag: list[np.ndarray] = []
        self.comm_bytes = 0.0

    def add(self, n: int, kind: int, *, op=-1, part=-1, mb=-1, device=-1, dur=0.0, size=0.0, flops=0.0,
            coll=-1, link=-1, res=-1) -> np.ndarray:
        ids = np.arange(self.n, self.n + n, dtype=np.int64)
        self.n += n
        c = self.cols
        c["kind"].append(np.full(n, kind, np.int8))
        for key, val, dt in (("op", op, np.int32), ("part", part, np.int32), ("mb", mb, np.int32),
                             ("device", device, np.int32), ("dur", dur, np.float64), ("size", size, np.float64),
                             ("flops", flops, np.float64), ("coll", coll, np.int8), ("link", link, np.int32),
                             ("res", res, np.int64)):
            c[key].append(np.broadcast_to(np.asarray(val, dtype=dt), (n,)))
        return ids

    def edges(self, src, dst) -> None:
        src = np.asarray(src, np.int64).ravel()
        dst = np.asarray(dst, np.int64).ravel()
        if src.size:
            self.src.append(src)
            self.dst.append(dst)

    def finish(self, n_devices: int, n_links: int) -> TaskGraph:
        cat = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in self.cols.items()}
        n = self.n
        # resources: single-resource tasks from "res", collectives from multi_res
        single = cat["res"].astype(np.int64)
        counts = (single >= 0).astype(np.int64)
        multi = {t: r for t, r in self.multi_res}
        for t, r in multi.items():
            counts[t] = r.size
        res_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=res_ptr[1:])
        res_idx = np.empty(res_ptr[-1], np.int64)
        has = np.nonzero(single >= 0)[0]
        res_idx[res_ptr[has]] = single[has]
        for t, r in multi.items():
            res_idx[res_ptr[t]:res_ptr[t + 1]] = r
        # successors
        src = np.concatenate(self.src) if self.src else np.zeros(0, np.int64)
        dst = np.concatenate(self.dst) if self.dst else np.zeros(0, np.int64)
        if src.size:
            key = np.unique(src * n + dst)  # drop duplicate edges
            src, dst = key // n, key % n
        succ_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=succ_ptr[1:])
        npred = np.bincount(dst, minlength=n).astype(np.int64)
        chain_next = np.full(n, -1, np.int64)
        chain_lag = np.zeros(n)
        if self.chain_from:
            cf = np.concatenate(self.chain_from)
            chain_next[cf] = np.concatenate(self.chain_to)
            chain_lag[cf] = np.concatenate(self.chain_lag)
        return TaskGraph(
            kind=cat["kind"].astype(np.int8), op=cat["op"].astype(np.int32), part=cat["part"].astype(np.int32),
            mb=cat["mb"].astype(np.int32), device=cat["device"].astype(np.int32), dur_s=cat["dur"].astype(np.float64),
            size_bytes=cat["size"].astype(np.float64), flops=cat["flops"].astype(np.float64),
            coll=cat["coll"].astype(np.int8), link=cat["link"].astype(np.int32), res_ptr=res_ptr, res_idx=res_idx,
            succ_ptr=succ_ptr, succ_idx=dst.astype(np.int64), npred=npred, chain_next=chain_next,
            chain_lag_s=chain_lag, n_devices=n_devices, n_links=n_links, comm_bytes=self.comm_bytes)


# --------------------------------------------------------------------------- regions


def _coords(op: Op, config: Config) -> tuple[list[str], np.ndarray]:
    """Names of the split dims and the [part, dim] coordinate matrix (row-major over op.dims)."""
    names = [d.name for d in op.dims if config.degree(d.name) > 1]
    shape = [config.degree(n) for n in names]
    if not names:
        return [], np.zeros((1, 0), np.int64)
    grid = np.indices(shape).reshape(len(shape), -1).T
    return names, grid


def _ranges(coord: np.ndarray, degree: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    lo = (coord * size) // degree
    hi = -((-(coord + 1) * size) // degree)  # ceil
    return lo, hi


def _out_regions(op: Op, config: Config, names: list[str], grid: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[part, axis] lo/hi of the region of output ``k`` each partition writes."""
    shape = op.out_tensors[k].shape
    n = grid.shape[0]
    lo = np.zeros((n, len(shape)), np.int64)
    hi = np.tile(np.asarray(shape, np.int64), (n, 1))
    for j, name in enumerate(names):
        d = op.dim(name)
        if d.out_axis is None:
            continue
        lo[:, d.out_axis], hi[:, d.out_axis] = _ranges(grid[:, j], config.degree(name), shape[d.out_axis])
    return lo, hi


def _in_regions(op: Op, config: Config, names: list[str], grid: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray]:
    """[part, axis] lo/hi of the region of input ``i`` each partition reads, with the halo a
    convolution or pooling window needs beyond a split of height or width."""
    shape = op.in_tensors[i].shape
    n = grid.shape[0]
    lo = np.zeros((n, len(shape)), np.int64)
    hi = np.tile(np.asarray(shape, np.int64), (n, 1))
    windowed = op.kind in ("conv2d", "pool2d") and not op.attrs.get("global", False)
    for j, name in enumerate(names):
        d = op.dim(name)
        ax = d.in_axes[i] if i < len(d.in_axes) else None
        if ax is None:
            continue
        deg = config.degree(name)
        if windowed and name in ("height", "width"):
            which = 0 if name == "height" else 1
            kern = _pair(op.attrs.get("kernel", 1))[which]
            stride = _pair(op.attrs.get("stride", op.attrs.get("kernel", 1) if op.kind == "pool2d" else 1))[which]
            pad = _pair(op.attrs.get("padding", 0))[which]
            olo, ohi = _ranges(grid[:, j], deg, op.out_tensors[0].shape[d.out_axis])
            lo[:, ax] = np.clip(olo * stride - pad, 0, shape[ax])
            hi[:, ax] = np.clip((ohi - 1) * stride - pad + kern, 0, shape[ax])
        else:
            lo[:, ax], hi[:, ax] = _ranges(grid[:, j], deg, shape[ax])
    return lo, hi


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _classes(grid: np.ndarray, names: list[str], keep: set[str]) -> np.ndarray:
    """Class id per partition: partitions equal on the dims in ``keep`` share a class."""
    cols = [j for j, n in enumerate(names) if n in keep]
    if not cols:
        return np.zeros(grid.shape[0], np.int64)
    _, inv = np.unique(grid[:, cols], axis=0, return_inverse=True)
    return inv.ravel().astype(np.int64)


def _plan(h_lo, h_hi, h_dev, h_cls, r_lo, r_hi, r_dev) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which holder sends how many elements to which receiver.

    Holders in one class hold identical data; for every (class, receiver) whose regions
    overlap, one holder sends: the one on the receiver's device if any (nothing moves), else
    holder ``receiver mod class size`` (spreading load). Returns (holder, receiver, elements)
    arrays, elements 0 for same-device pairs (a dependency without a transfer).
    """
    n_cls = int(h_cls.max()) + 1
    first = np.zeros(n_cls, np.int64)
    order = np.argsort(h_cls, kind="stable")
    counts = np.bincount(h_cls, minlength=n_cls)
    np.cumsum(counts[:-1], out=first[1:])
    rep = order[first]  # a representative holder per class (same region in the class)
    lo = np.maximum(h_lo[rep][:, None, :], r_lo[None, :, :])
    hi = np.minimum(h_hi[rep][:, None, :], r_hi[None, :, :])
    vol = np.prod(np.clip(hi - lo, 0, None), axis=2)  # [class, receiver]
    g, r = np.nonzero(vol)
    if g.size == 0:
        return (np.zeros(0, np.int64),) * 3
    # The holder on the receiver's device when the class has one (a sorted (class, device)
    # key lookup), else member ``receiver mod class size``.
    n_dev = int(max(h_dev.max(), r_dev.max())) + 1
    hkey = h_cls.astype(np.int64) * n_dev + h_dev
    by_key = np.argsort(hkey, kind="stable")
    want = g * n_dev + r_dev[r]
    pos = np.searchsorted(hkey[by_key], want)
    pos = np.minimum(pos, by_key.size - 1)
    found = hkey[by_key[pos]] == want
    fallback = order[first[g] + r % counts[g]]
    holder = np.where(found, by_key[pos], fallback)
    elems = vol[g, r]
    elems = np.where(h_dev[holder] == r_dev[r], 0, elems)
    return holder.astype(np.int64), r.astype(np.int64), elems.astype(np.int64)


# --------------------------------------------------------------------------- builder


class _Builder:
    def __init__(self, graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel) -> None:
        self.g, self.s, self.c, self.cost = graph, strategy, cluster, cost
        self.buf = _Buffer()
        self.D = cluster.num_devices
        self.m = max(1, strategy.pipeline.microbatches)
        self.precision = graph.precision
        self.fwd: dict[int, np.ndarray] = {}  # op -> [mb, part] task ids
        self.bwd: dict[int, np.ndarray] = {}
        self.fwd_ready: dict[int, np.ndarray] = {}  # op -> [mb, part] task after which the output is readable
        self.grid: dict[int, tuple[list[str], np.ndarray]] = {}
        self.devs: dict[int, np.ndarray] = {}
        self._coll_cache: dict[tuple[int, ...], tuple[float, float, tuple[int, ...]]] = {}
        self.coll_devices: list[tuple[int, list[int]]] = []  # collective task -> its devices
        self.link_bw = cluster.arrays["link_bw_bytes_per_s"]
        self.link_lat = cluster.arrays["link_latency_s"]

    # -- helpers --------------------------------------------------------------------
    def group(self, devices) -> tuple[float, float, tuple[int, ...]]:
        key = tuple(sorted(set(int(d) for d in devices)))
        hit = self._coll_cache.get(key)
        if hit is None:
            hit = self._coll_cache[key] = self.c.collective_group(key)
        return hit

    def collective(self, kind: str, size_bytes: float, devices, preds, op: int = -1, mb: int = -1) -> int:
        """Add one collective task over ``devices`` after ``preds``; returns its id (or -1
        when the group is one device: the data is already in place)."""
        devs = sorted(set(int(d) for d in devices))
        if len(devs) <= 1 or size_bytes <= 0:
            return -1
        bw, lat, links = self.group(devs)
        n = len(devs)
        dur = collective_time_s(kind, size_bytes, n, bw, lat, self.cost.link_efficiency)
        t = int(self.buf.add(1, COLL, op=op, mb=mb, dur=dur, size=size_bytes, coll=_COLL_INDEX[kind])[0])
        self.buf.multi_res.append((t, np.asarray([self.D + lk for lk in links], np.int64)))
        self.coll_devices.append((t, devs))
        self.buf.edges(np.asarray(preds, np.int64), np.full(len(preds), t))
        factor = 2 * (n - 1) if kind == "all_reduce" else (n - 1)
        self.buf.comm_bytes += factor * size_bytes
        return t

    def transfers(self, src_tasks: np.ndarray, dst_tasks: np.ndarray, src_dev: np.ndarray, dst_dev: np.ndarray,
                  size_bytes: np.ndarray, op: int, mb: np.ndarray) -> None:
        """Edges from ``src_tasks`` to ``dst_tasks`` through transfer hops where the devices
        differ (vectorised over pairs)."""
        same = (src_dev == dst_dev) | (size_bytes <= 0)
        self.buf.edges(src_tasks[same], dst_tasks[same])
        idx = np.nonzero(~same)[0]
        if idx.size == 0:
            return
        # One path lookup per distinct device pair, then one block of hop tasks per path
        # length, vectorised over every transfer with that many hops.
        pair = src_dev[idx].astype(np.int64) * self.D + dst_dev[idx]
        upairs, inverse = np.unique(pair, return_inverse=True)
        paths = [self.c.path(int(k // self.D), int(k % self.D)) for k in upairs]
        hops = np.array([len(pth) for pth in paths])
        link_bw = self.link_bw
        link_lat = self.link_lat
        for nh in np.unique(hops):
            which = np.nonzero(hops == nh)[0]  # distinct pairs with nh hops
            table = np.array([paths[w] for w in which], np.int64)  # [pair, hop] link ids
            row = np.full(upairs.size, -1, np.int64)
            row[which] = np.arange(which.size)
            sel = idx[hops[inverse] == nh]
            links = table[row[inverse[hops[inverse] == nh]]]  # [transfer, hop]
            bottleneck = link_bw[links].min(axis=1) * self.cost.link_efficiency
            size = size_bytes[sel]
            stream = size / bottleneck
            prev = None
            for h in range(nh):
                lk = links[:, h]
                dur = stream + (link_lat[lk] if h == nh - 1 else 0.0)
                ids = self.buf.add(sel.size, XFER, op=op, mb=mb[sel], dur=dur, size=size, link=lk,
                                   res=self.D + lk)
                if prev is None:
                    self.buf.edges(src_tasks[sel], ids)
                else:
                    self.buf.chain_from.append(prev)
                    self.buf.chain_to.append(ids)
                    self.buf.chain_lag.append(link_lat[links[:, h - 1]])
                prev = ids
            self.buf.edges(prev, dst_tasks[sel])
        self.buf.comm_bytes += float(size_bytes[idx].sum())

    # -- compute tasks --------------------------------------------------------------
    def compute_tasks(self) -> None:
        s, g = self.s, self.g
        recompute = s.recompute
        for oi, op in enumerate(g.ops):
            config = s.configs[op.name]
            names, grid = _coords(op, config)
            self.grid[oi] = (names, grid)
            devs = np.asarray(config.devices, np.int64)
            self.devs[oi] = devs
            P = devs.size
            degrees = dict(config.degrees)
            if self.m > 1 and "sample" in op.dim_names:
                degrees["sample"] = degrees.get("sample", 1) * self.m
            fwd_t = np.empty(P)
            bwd_t = np.empty(P)
            times: dict[str, tuple[float, float]] = {}
            for k, d in enumerate(devs):
                dt = self.c.device_type(int(d))
                if dt.name not in times:
                    times[dt.name] = self.cost.partition_times_s(op, degrees, self.precision, dt)
                fwd_t[k], bwd_t[k] = times[dt.name]
            if recompute == "full" and op.kind != "input" or \
                    recompute == "selective" and (op.kind in _SELECTIVE_KINDS or self._attention_dropout(op)):
                bwd_t = bwd_t + fwd_t
            fwd_f, bwd_f = op.partition_flops(degrees) if op.kind != "input" else (0.0, 0.0)
            mbs = np.repeat(np.arange(self.m), P)
            parts = np.tile(np.arange(P), self.m)
            dev = np.tile(devs, self.m)
            f = self.buf.add(self.m * P, FWD, op=oi, part=parts, mb=mbs, device=dev, dur=np.tile(fwd_t, self.m),
                             flops=fwd_f, res=dev)
            self.fwd[oi] = f.reshape(self.m, P)
            self.fwd_ready[oi] = self.fwd[oi]
            if op.kind != "input":
                b = self.buf.add(self.m * P, BWD, op=oi, part=parts, mb=mbs, device=dev,
                                 dur=np.tile(bwd_t, self.m), flops=bwd_f, res=dev)
                self.bwd[oi] = b.reshape(self.m, P)
                # a partition's backward follows its own forward
                self.buf.edges(self.fwd[oi], self.bwd[oi])

    def _attention_dropout(self, op: Op) -> bool:
        return op.kind == "dropout" and any(self.g[r.op].kind == "softmax" for r in op.inputs)

    # -- forward reductions -----------------------------------------------------------
    def reductions(self) -> None:
        """All-reduce (or reduce-scatter) partial sums of ops split along a reduction dim."""
        for oi, op in enumerate(self.g.ops):
            names, grid = self.grid[oi]
            red = [n for n in names if op.dim(n).kind == REDUCTION]
            if not red:
                continue
            keep = {n for n in names if n not in red}
            cls = _classes(grid, names, keep)
            lo, hi = _out_regions(op, self.s.configs[op.name], names, grid, 0)
            elems = np.prod(hi - lo, axis=1)
            kind = "reduce_scatter" if self._scatter_after(op) else "all_reduce"
            ready = self.fwd[oi].copy()
            for c in range(int(cls.max()) + 1):
                members = np.nonzero(cls == c)[0]
                nbytes = float(elems[members[0]]) * DTYPE_BYTES[op.out_tensors[0].dtype]
                for mb in range(self.m):
                    t = self.collective(kind, nbytes, self.devs[oi][members], self.fwd[oi][mb, members], oi, mb)
                    if t >= 0:
                        ready[mb, members] = t
            self.fwd_ready[oi] = ready

    def _scatter_after(self, op: Op) -> bool:
        """Sequence parallelism: a row-parallel output whose consumers split 'length' over the
        same devices is reduce-scattered (Korthikanti et al. 2022 §4.2.2)."""
        if not self.s.sequence_parallel:
            return False
        cfg = self.s.configs[op.name]
        for user in self.g.consumers(op.name):
            ucfg = self.s.configs[user]
            if ucfg.degree("length") <= 1 or set(ucfg.devices) != set(cfg.devices):
                return False
        return True

    # -- data edges ------------------------------------------------------------------
    def data_edges(self) -> None:
        g = self.g
        for (p, o, c, i) in g.edges:
            prod, cons = g.ops[p], g.ops[c]
            pcfg, ccfg = self.s.configs[prod.name], self.s.configs[cons.name]
            pnames, pgrid = self.grid[p]
            cnames, cgrid = self.grid[c]
            tensor = prod.out_tensors[o]
            nbytes = DTYPE_BYTES[tensor.dtype]
            # forward: holders = producer partitions; identical data across reduction (after
            # the all-reduce) and replica dims
            hkeep = {n for n in pnames if prod.dim(n).out_axis is not None}
            h_lo, h_hi = _out_regions(prod, pcfg, pnames, pgrid, o)
            r_lo, r_hi = _in_regions(cons, ccfg, cnames, cgrid, i)
            holder, recv, elems = _plan(h_lo, h_hi, self.devs[p], _classes(pgrid, pnames, hkeep),
                                        r_lo, r_hi, self.devs[c])
            self._per_mb(self.fwd_ready[p], self.fwd[c], holder, recv, elems * nbytes, self.devs[p],
                         self.devs[c], c)
            # backward: gradients flow back for float tensors into ops that have a backward
            if tensor.dtype not in FLOAT_DTYPES or p not in self.bwd:
                continue
            partial = {n for n in cnames if cons.dim(n).kind != REPLICA
                       and (i >= len(cons.dim(n).in_axes) or cons.dim(n).in_axes[i] is None)}
            ckeep = {n for n in cnames if n not in partial and cons.dim(n).kind != REPLICA}
            ready = self.bwd[c]
            if partial:
                ready = self._grad_reduce(c, cons, cnames, cgrid, r_lo, r_hi, partial, nbytes)
            h2, r2, e2 = _plan(r_lo, r_hi, self.devs[c], _classes(cgrid, cnames, ckeep), h_lo, h_hi, self.devs[p])
            self._per_mb(ready, self.bwd[p], h2, r2, e2 * nbytes, self.devs[c], self.devs[p], p)

    def _grad_reduce(self, c, cons, cnames, cgrid, r_lo, r_hi, partial, nbytes) -> np.ndarray:
        """All-reduce partial input gradients over partitions that differ only in dims that
        do not split the input; returns [mb, part] tasks after which each holds the sum."""
        keep = {n for n in cnames if n not in partial}
        cls = _classes(cgrid, cnames, keep)
        ready = self.bwd[c].copy()
        elems = np.prod(r_hi - r_lo, axis=1)
        for k in range(int(cls.max()) + 1):
            members = np.nonzero(cls == k)[0]
            devs = self.devs[c][members]
            if np.unique(devs).size <= 1:
                continue
            for mb in range(self.m):
                t = self.collective("all_reduce", float(elems[members[0]]) * nbytes, devs,
                                    self.bwd[c][mb, members], c, mb)
                ready[mb, members] = t
        return ready

    def _per_mb(self, src_tasks, dst_tasks, holder, recv, size_bytes, src_dev, dst_dev, op) -> None:
        if holder.size == 0:
            return
        m = self.m
        s = src_tasks[:, holder].ravel()
        d = dst_tasks[:, recv].ravel()
        self.transfers(s, d, np.tile(src_dev[holder], m), np.tile(dst_dev[recv], m),
                       np.tile(size_bytes.astype(np.float64), m), op, np.repeat(np.arange(m), holder.size))

    # -- gradient synchronisation and update --------------------------------------------
    def grad_sync(self) -> None:
        """One collective per group of partitions holding the same parameter region (ops of
        one ``param_group`` together), then one optimizer step per device."""
        zero = self.s.zero_stage
        groups: dict[str, list[int]] = {}
        for oi, op in enumerate(self.g.ops):
            if op.param_count and op.kind != "input":
                groups.setdefault(op.param_group or op.name, []).append(oi)
        device_params = np.zeros(self.D)  # parameters each device's optimizer updates
        deps: list[np.ndarray] = []  # (device, task) pairs the updates wait for
        pbytes = DTYPE_BYTES[self.precision]
        gathers: list[tuple[list[int], float, int]] = []
        for members in groups.values():
            # param region -> (devices, [part tasks per op], elements)
            regions: dict[tuple, tuple[list[int], list[tuple[int, int]], float]] = {}
            for oi in members:
                op = self.g.ops[oi]
                names, grid = self.grid[oi]
                cfg = self.s.configs[op.name]
                split = [j for j, n in enumerate(names) if any(ax is not None for ax in op.dim(n).param_axes)]
                _, _, pshapes = op.partition_shapes(cfg.degrees)
                elems = float(sum(math.prod(sh) for sh in pshapes))
                for k in range(grid.shape[0]):
                    key = tuple((names[j], int(grid[k, j])) for j in split)
                    devs, parts, _ = regions.setdefault(key, ([], [], elems))
                    devs.append(int(self.devs[oi][k]))
                    parts.append((oi, k))
            for devs, parts, elems in regions.values():
                udevs = sorted(set(devs))
                share = elems / len(udevs) if zero >= 1 else elems
                device_params[udevs] += share
                kind = "reduce_scatter" if zero >= 2 else "all_reduce"
                # ZeRO-3 (FSDP) reduce-scatters every microbatch's gradients as they are made;
                # otherwise gradients accumulate locally and are synchronised once.
                mbs = range(self.m) if zero >= 3 else [self.m - 1]
                for mb in mbs:
                    tasks = [int(self.bwd[oi][mb, k]) for oi, k in parts]
                    t = self.collective(kind, elems * pbytes, udevs, tasks, members[0], mb if zero >= 3 else -1)
                    if t >= 0:
                        deps.append(np.array([[d, t] for d in udevs], np.int64))
                if zero in (1, 2):
                    gathers.append((udevs, elems * pbytes, members[0]))
        # every device's last-microbatch backward tasks also precede its update
        last = [np.stack([self.devs[oi], self.bwd[oi][self.m - 1]], axis=1) for oi in self.bwd]
        pairs = np.concatenate(deps + last) if deps or last else np.zeros((0, 2), np.int64)
        update: dict[int, int] = {}
        for d in np.unique(pairs[:, 0]):
            d = int(d)
            dur = self.cost.optimizer_time_s(device_params[d], self.c.device_type(d))
            update[d] = int(self.buf.add(1, UPDATE, device=d, dur=dur, res=d)[0])
        if pairs.size:
            upd = np.array([update[int(d)] for d in pairs[:, 0]], np.int64)
            self.buf.edges(pairs[:, 1], upd)
        # ZeRO-1/2: parameters are all-gathered after the sharded update
        for udevs, nbytes, oi in gathers:
            self.collective("all_gather", nbytes, udevs, [update[d] for d in udevs if d in update], oi, -1)

    def fsdp_gathers(self) -> None:
        """ZeRO-3: all-gather each op's parameters before its forward and backward, per
        microbatch, prefetched one parameterised op ahead."""
        if self.s.zero_stage < 3:
            return
        pbytes = DTYPE_BYTES[self.precision]
        prev_f = None
        order = [oi for oi, op in enumerate(self.g.ops) if op.param_count and op.kind != "input"]
        for mb in range(self.m):
            prev_f = None
            for oi in order:
                t = self._gather_op(oi, mb, self.fwd[oi], prev_f, pbytes)
                prev_f = self.fwd[oi][mb] if t is not None else prev_f
            prev_b = None
            for oi in reversed(order):
                self._gather_op(oi, mb, self.bwd[oi], prev_b, pbytes)
                prev_b = self.bwd[oi][mb]

    def _gather_op(self, oi, mb, tasks, prev, pbytes):
        op = self.g.ops[oi]
        cfg = self.s.configs[op.name]
        _, _, pshapes = op.partition_shapes(cfg.degrees)
        nbytes = float(sum(math.prod(sh) for sh in pshapes)) * pbytes
        preds = [] if prev is None else list(np.asarray(prev).ravel()[:1])
        t = self.collective("all_gather", nbytes, self.devs[oi], preds, oi, mb)
        if t >= 0:
            self.buf.edges(np.full(tasks.shape[1], t), tasks[mb])
        return t if t >= 0 else None

    # -- schedules ---------------------------------------------------------------------
    def schedule(self) -> None:
        """Barrier tasks between consecutive schedule units on each device."""
        pipe = self.s.pipeline
        p, v, m = max(1, pipe.stages), max(1, pipe.virtual_stages), self.m
        if m == 1 and p == 1:
            return
        chunk_of = {oi: self.s.stage_of.get(op.name, 0) for oi, op in enumerate(self.g.ops)}
        # tasks per (device, chunk, mb, phase)
        units: dict[tuple[int, int, int, int], list[np.ndarray]] = {}
        for oi in self.fwd:
            ch = chunk_of[oi]
            for phase, table in ((FWD, self.fwd), (BWD, self.bwd)):
                if oi not in table:
                    continue
                tasks = table[oi]
                for mb in range(m):
                    for k, d in enumerate(self.devs[oi]):
                        units.setdefault((int(d), ch, mb, phase), []).append(tasks[mb, k:k + 1])
        devices = sorted({key[0] for key in units})
        for d in devices:
            chunks = sorted({key[1] for key in units if key[0] == d})
            stage = chunks[0] % p
            order = _schedule_order(pipe.schedule, p, v, m, stage) if p > 1 else \
                [(0, mb, ph) for mb in range(m) for ph in (FWD, BWD)]
            seq = []
            for local_chunk, mb, phase in order:
                ch = stage + local_chunk * p if p > 1 else chunks[0]
                if (d, ch, mb, phase) in units:
                    seq.append(np.concatenate(units[(d, ch, mb, phase)]))
            for a, b in zip(seq, seq[1:]):
                bar = self.buf.add(1, BARRIER)
                self.buf.edges(a, np.full(a.size, bar[0]))
                self.buf.edges(np.full(b.size, bar[0]), b)

    def build(self) -> TaskGraph:
        self.compute_tasks()
        self.reductions()
        self.data_edges()
        self.fsdp_gathers()
        self.grad_sync()
        self.schedule()
        tg = self.buf.finish(self.D, len(self.c.links))
        ptr = np.zeros(len(self.coll_devices) + 1, np.int64)
        np.cumsum([len(d) for _, d in self.coll_devices], out=ptr[1:])
        idx = np.asarray([x for _, d in self.coll_devices for x in d], np.int64)
        tasks = np.asarray([t for t, _ in self.coll_devices], np.int64)
        tg.info = {"microbatches": self.m, "ops": len(self.g.ops), "coll_devices": (ptr, idx, tasks)}
        return tg


def _schedule_order(schedule: str, p: int, v: int, m: int, stage: int) -> list[tuple[int, int, int]]:
    """Order of (model chunk on this stage, microbatch, phase) units on pipeline ``stage``.

    GPipe: all forwards, then all backwards (Huang et al. 2019). 1F1B: ``p - stage - 1``
    warm-up forwards, then one forward and one backward alternately, then the remaining
    backwards (PipeDream-Flush; Narayanan et al. SC'21 §2.2.1). Interleaved: Megatron-LM's
    schedule over ``v`` chunks per stage (SC'21 §2.2.2), warm-up of
    ``(p - stage - 1) * 2 + (v - 1) * p`` forward units.

    >>> _schedule_order("1f1b", 2, 1, 3, 0)
    [(0, 0, 0), (0, 1, 0), (0, 0, 1), (0, 2, 0), (0, 1, 1), (0, 2, 1)]
    """
    if schedule == "gpipe":
        return [(0, mb, FWD) for mb in range(m)] + [(0, mb, BWD) for mb in range(m)]
    if schedule == "1f1b" or v == 1:
        warm = min(p - stage - 1, m)
        out = [(0, mb, FWD) for mb in range(warm)]
        for i in range(m - warm):
            out += [(0, warm + i, FWD), (0, i, BWD)]
        out += [(0, mb, BWD) for mb in range(m - warm, m)]
        return out
    total = m * v

    def unit(k: int, forward: bool) -> tuple[int, int, int]:
        group = k // (p * v)
        chunk = (k % (p * v)) // p
        if not forward:
            chunk = v - 1 - chunk
        return (chunk, group * p + k % p, FWD if forward else BWD)

    warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
    out = [unit(k, True) for k in range(warm)]
    for i in range(total - warm):
        out += [unit(warm + i, True), unit(i, False)]
    out += [unit(k, False) for k in range(total - warm, total)]
    return out


def build_task_graph(graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel | None = None) -> TaskGraph:
    """Build the task graph of one training iteration of ``graph`` under ``strategy``.

    Parameters
    ----------
    graph, strategy, cluster
        ``strategy`` must be valid for them (:func:`engine.strategy.validate_strategy`).
    cost : CostModel, optional
        Defaults to the calibrated roofline.

    Returns
    -------
    TaskGraph
    """
    return _Builder(graph, strategy, cluster, cost or CostModel()).build()
