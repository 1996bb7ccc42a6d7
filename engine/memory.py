"""Per-device memory over a simulated iteration.

Static memory per device (Rajbhandari et al. SC'20 §3 for the mixed-precision Adam counts):

* weights: the partitions' parameters in the model's dtype; ZeRO-3 keeps a 1/n shard;
* gradients: the same size; ZeRO-2 and -3 keep a 1/n shard;
* optimizer state: Adam's two moments, plus an fp32 master copy when the model trains in
  fp16/bf16 (12 bytes per parameter; 8 in fp32); ZeRO-1 and above keep a 1/n shard;
* communication buffers: the largest collective the device takes part in.

Activations are tracked over the timeline: what an op partition saves for its backward pass is
allocated when its forward task ends and freed when its backward task ends, per microbatch,
so the peak follows the pipeline schedule (1F1B holds fewer microbatches than GPipe). With
full recomputation only layer inputs are kept; selective recomputation drops the attention
core's activations (Korthikanti et al. 2022 §5).

A strategy whose peak exceeds a device's capacity is infeasible; the report says which
device and by how much.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cluster import Cluster
from .errors import check_cancel
from .graph import OpGraph
from .ops import DTYPE_BYTES, FLOAT_DTYPES, op_kind
from .simulate import Timeline
from .strategy import Strategy, partition_grid, selective_recompute_reruns
from .taskgraph import BWD, FWD

__all__ = ["MemoryReport", "memory_report", "fits_in_memory", "optimizer_bytes_per_param", "saved_activation_bytes"]


def optimizer_bytes_per_param(precision: str) -> int:
    """Adam state per parameter: moments (2 x fp32), plus an fp32 master copy in mixed
    precision."""
    return 8 if precision == "fp32" else 12


@dataclass
class MemoryReport:
    """Memory per device, in bytes (all arrays are ``[device]``)."""

    weights_bytes: np.ndarray
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    comm_buffer_bytes: np.ndarray
    activations_peak_bytes: np.ndarray
    peak_bytes: np.ndarray
    capacity_bytes: np.ndarray
    #: per device: (times_s, bytes) of the memory curve, for traces and plots
    curves: Sequence[tuple[np.ndarray, np.ndarray]]

    @property
    def static_bytes(self) -> np.ndarray:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.comm_buffer_bytes

    @property
    def feasible(self) -> bool:
        return bool(np.all(self.peak_bytes <= self.capacity_bytes))

    def over_capacity(self) -> list[tuple[int, float]]:
        """(device, bytes over capacity) for every device that does not fit, worst first."""
        over = self.peak_bytes - self.capacity_bytes
        idx = np.nonzero(over > 0)[0]
        return sorted(((int(d), float(over[d])) for d in idx), key=lambda x: -x[1])


def _static(graph: OpGraph, strategy: Strategy, cluster: Cluster, tg) -> tuple[np.ndarray, ...]:
    """(weights, grads, optimizer, communication buffers) per device, in bytes."""
    D = cluster.num_devices
    zero = strategy.zero_stage
    pbytes = DTYPE_BYTES[graph.precision]
    # -- parameters per device, shared groups counted once per (group, region, device)
    # (Vectorised: every parameter partition gets an integer code for its (tensor, region,
    # device); the first of equal codes counts, as a set of seen keys would.)
    codes, devs_p, elems_p, copies_p, gemm_p = [], [], [], [], []
    groups: dict[str, int] = {}
    cache = _graph_cache(graph)
    param_ops = cache.get("param_ops")
    if param_ops is None:
        param_ops = cache["param_ops"] = [op for op in graph.ops if op.param_count and op.kind != "input"]
    for op in param_ops:
        regions, devices, elems, copies = _param_partitions(cache, op, strategy.configs[op.name])
        gid = groups.setdefault(op.param_group or op.name, len(groups))
        codes.append((gid * (1 << 24) + regions) * D + devices)
        devs_p.append(devices)
        elems_p.append(np.full(devices.size, elems))
        copies_p.append(np.full(devices.size, copies))
        if strategy.fp8:  # (only fp8's weight caches read it)
            gemm_p.append(np.full(devices.size, op.kind == "linear"))
    params = np.zeros(D)
    gemm_params = np.zeros(D)  # of them, linear layers' weights (fp8's cached copies)
    shard = np.ones(D)  # largest data-parallel shard divisor a device's parameters see
    if codes:
        _, first = np.unique(np.concatenate(codes), return_index=True)
        devs_p = np.concatenate(devs_p)[first]
        elems_p = np.concatenate(elems_p)[first]
        np.add.at(params, devs_p, elems_p)
        if strategy.fp8:
            np.add.at(gemm_params, devs_p, np.where(np.concatenate(gemm_p)[first], elems_p, 0.0))
        np.maximum.at(shard, devs_p, np.concatenate(copies_p)[first])
    weights = params * pbytes
    grads = params * pbytes
    optim = params * optimizer_bytes_per_param(graph.precision)
    if zero >= 2 and strategy.shard_group:  # hybrid sharding: shards within groups of k ranks
        shard = np.minimum(shard, strategy.shard_group)
    if zero >= 1:
        optim = optim / shard
    if zero >= 2:
        grads = grads / shard
    if zero >= 3:
        weights = weights / shard
    elif strategy.fp8:
        # Transformer Engine keeps each linear weight's fp8 copy and its transpose between
        # microbatches (1 + 1 bytes per element); under ZeRO-3 weights are gathered per use
        weights = weights + 2.0 * gemm_params
    # -- communication buffers: the largest collective each device joins
    comm = np.zeros(D)
    coll_devs = tg.info.get("coll_devices")
    if coll_devs is not None:
        ptr, idx, tasks = coll_devs
        np.maximum.at(comm, idx, np.repeat(tg.size_bytes[tasks], np.diff(ptr)))
    image = tg.info.get("device_image")
    if image is not None:  # a collective's buffer is built only where a representative joins it
        has = image >= 0
        comm[has] = comm[image[has]]
    return weights, grads, optim, comm


def fits_in_memory(graph: OpGraph, strategy: Strategy, cluster: Cluster, timeline: Timeline) -> bool:
    """Whether every device fits (:attr:`MemoryReport.feasible`), answered first from an
    upper bound: static memory plus every activation a device saves in the iteration, as if
    none were freed. Only when the bound exceeds some device's capacity is the timeline's
    allocation order examined (:func:`memory_report`). A search asks this once per proposal;
    with one microbatch the bound is nearly the peak (every forward ends before the first
    backward), and it skips the sort of every allocation by time."""
    tg = timeline.tasks
    static = sum(_static(graph, strategy, cluster, tg))
    m = max(1, strategy.pipeline.microbatches)
    saved = _saved_bytes(graph, strategy, m, _graph_cache(graph))
    f_idx = np.nonzero(tg.kind == FWD)[0]
    bound = np.bincount(tg.device[f_idx], weights=saved[tg.op[f_idx]], minlength=cluster.num_devices)
    image = tg.info.get("device_image")
    if image is not None:
        mirrored = (image >= 0) & (image != np.arange(cluster.num_devices))
        bound[mirrored] = bound[image[mirrored]]
    capacity = np.array([cluster.device_type(d).memory_bytes for d in range(cluster.num_devices)], np.float64)
    if np.all(static + bound <= capacity):
        return True
    return memory_report(graph, strategy, cluster, timeline).feasible


def memory_report(graph: OpGraph, strategy: Strategy, cluster: Cluster, timeline: Timeline,
                  cancel: Any = None) -> MemoryReport:
    """Memory of every device over ``timeline`` (which must come from the same strategy).
    ``cancel`` (:func:`engine.errors.check_cancel`) is asked between its steps
    (:class:`~engine.errors.Cancelled` when set)."""
    check_cancel(cancel)
    D = cluster.num_devices
    tg = timeline.tasks
    m = max(1, strategy.pipeline.microbatches)
    weights, grads, optim, comm = _static(graph, strategy, cluster, tg)
    cache = _graph_cache(graph)
    image = tg.info.get("device_image")
    # -- activations over time
    saved = _saved_bytes(graph, strategy, m, cache)  # op index -> bytes per partition per microbatch
    is_f = tg.kind == FWD
    is_b = tg.kind == BWD
    f_idx = np.nonzero(is_f)[0]
    b_idx = np.nonzero(is_b)[0]
    # match backward to forward by (op, part, mb)
    key_f = (tg.op[f_idx].astype(np.int64) * (1 << 20) + tg.part[f_idx]) * (m + 1) + tg.mb[f_idx]
    key_b = (tg.op[b_idx].astype(np.int64) * (1 << 20) + tg.part[b_idx]) * (m + 1) + tg.mb[b_idx]
    amount = saved[tg.op[f_idx]]
    check_cancel(cancel)
    order_b = np.argsort(key_b)
    pos = np.minimum(np.searchsorted(key_b[order_b], key_f), max(order_b.size - 1, 0))
    if order_b.size:
        has_b = key_b[order_b[pos]] == key_f
        free_t = np.where(has_b, timeline.end_s[b_idx[order_b[pos]]], np.inf)
    else:
        free_t = np.full(key_f.size, np.inf)
    alloc_t = timeline.end_s[f_idx]
    dev = tg.device[f_idx]
    times = np.concatenate([alloc_t, free_t])
    delta = np.concatenate([amount, -amount])
    devs = np.concatenate([dev, dev])
    keep = np.isfinite(times) & (delta != 0)
    times, delta, devs = times[keep], delta[keep], devs[keep]
    check_cancel(cancel)
    order = np.lexsort((delta, times, devs))  # frees before allocations at equal times
    times, delta, devs = times[order], delta[order], devs[order]
    act_peak = np.zeros(D)
    curves: list[tuple[np.ndarray, np.ndarray]] = []
    static = weights + grads + optim + comm
    bounds = np.searchsorted(devs, np.arange(D + 1))
    check_cancel(cancel)
    for d in range(D):
        lo, hi = bounds[d], bounds[d + 1]
        level = np.cumsum(delta[lo:hi])
        if level.size:
            act_peak[d] = max(0.0, float(level.max()))
        curves.append((times[lo:hi], static[d] + level))
    if image is not None:  # symmetric simulation: mirror representatives' activations
        mirrored = (image >= 0) & (image != np.arange(D))
        act_peak[mirrored] = act_peak[image[mirrored]]
    capacity = np.array([cluster.device_type(d).memory_bytes for d in range(D)], dtype=np.float64)
    return MemoryReport(weights, grads, optim, comm, act_peak, static + act_peak, capacity,
                        _Curves(curves, image, static))


class _Curves(Sequence):
    """Per device, (times_s, bytes) of its memory curve; a device that mirrors a
    representative (symmetric simulation) gets the representative's activations over its
    own static memory, made when asked for (a 1,024-GPU report does not build 1,000 copies
    that only a trace reads)."""

    def __init__(self, curves: list[tuple[np.ndarray, np.ndarray]], image: np.ndarray | None,
                 static: np.ndarray) -> None:
        self._curves, self._image, self._static = curves, image, static

    def __len__(self) -> int:
        return len(self._curves)

    def __getitem__(self, d):
        if isinstance(d, slice):
            return [self[k] for k in range(*d.indices(len(self)))]
        d = range(len(self))[d]  # (negative indices, IndexError)
        i = int(self._image[d]) if self._image is not None else d
        if i < 0 or i == d:
            return self._curves[d]
        times, level = self._curves[i]
        return times, self._static[d] + (level - self._static[i])


#: graph -> per-(op, config) results (a search asks for the same ones often); an entry goes
#: with its graph
_CACHES: "weakref.WeakKeyDictionary[OpGraph, dict]" = weakref.WeakKeyDictionary()


def _graph_cache(graph: OpGraph) -> dict:
    """The per-(op, config) results of ``graph``, bounded (a long search sees many configs)."""
    cache = _CACHES.get(graph)
    if cache is None or len(cache) > 200_000:
        cache = _CACHES[graph] = {"region_ids": {}}  # (ids only grow within a cache)
    return cache


def _param_partitions(cache: dict, op, cfg) -> tuple[np.ndarray, np.ndarray, float, float]:
    """An op's parameter partitions under ``cfg``: the parameter region each holds (an id,
    equal for equal regions of ops sharing parameters), its device, elements per partition
    and the number of copies of each region (its replication). ``cache``: _graph_cache's."""
    sigs = cache.setdefault("param_sig", {})
    sig = sigs.get(op.name)
    if sig is None:  # (identical layers' ops share their entries)
        sig = sigs[op.name] = (op.kind, tuple(p.shape for p in op.params),
                               tuple((d.name, d.kind, d.size, d.param_axes) for d in op.dims))
    ck = ("params", sig, tuple(cfg.degrees.items()), cfg.devices)
    hit = cache.get(ck)
    if hit is None:
        elems = op.partition_param_elements(cfg.degrees)
        names = [d.name for d in op.dims if cfg.degree(d.name) > 1]
        split = [n for n in names if any(ax is not None for ax in op.dim(n).param_axes)]
        repl = [n for n in names if n not in split and not op.dim(n).is_replica]
        copies = float(math.prod(cfg.degree(n) for n in repl))
        ids = cache.setdefault("region_ids", {})
        grid_names, grid = partition_grid(op, cfg)
        cols = [grid_names.index(n) for n in split]
        codes = np.ravel_multi_index(grid[:, cols].T, [cfg.degree(n) for n in split]) if cols else \
            np.zeros(grid.shape[0], np.int64)
        distinct, inverse = np.unique(codes, return_inverse=True)  # (a few: the split's degrees)
        key = tuple(split)
        regions = np.array([ids.setdefault((key, int(c)), len(ids)) for c in distinct], np.int64)[inverse.ravel()]
        hit = cache[ck] = (regions, np.asarray(cfg.devices, np.int64), elems, copies)
    return hit


def saved_activation_bytes(graph: OpGraph, strategy: Strategy) -> np.ndarray:
    """[op] bytes one partition of each op keeps for its backward pass, per microbatch."""
    return _saved_bytes(graph, strategy, max(1, strategy.pipeline.microbatches), _graph_cache(graph))


def _saved_bytes(graph: OpGraph, strategy: Strategy, m: int, cache: dict) -> np.ndarray:
    """[op] bytes one partition saves for its backward pass, per microbatch (Korthikanti et
    al. 2022 §4, activations per layer with and without sequence parallelism and
    selective or full recomputation; ``tests/test_memory.py`` checks their Table 2).

    A tensor read by several ops under the same partitioning on the same devices (the
    LayerNorm output that the Q, K and V projections read) is kept once, by its first reader:
    that reader's backward runs last, so the tensor's lifetime is the first reader's forward
    to its backward (§4.1 counts the QKV input once). Dropout keeps a one-byte mask per
    element (``bwd_saved_bytes_per_element``). Under sequence parallelism a tensor-parallel
    op that reads a sequence-split tensor keeps the shard, not the gathered tensor, and
    gathers it again in its backward (§4.2.2). With fp8 GEMMs a linear layer keeps its
    input in fp8 (1 byte per element), as Transformer Engine does."""
    out = np.zeros(len(graph.ops))
    recompute = strategy.recompute
    saving = cache.get(("saving", recompute))
    if saving is None:
        saving = cache[("saving", recompute)] = [(i, op, kept) for i, op in enumerate(graph.ops)
                                                 if (kept := _kept_inputs(graph, op, recompute))]
    configs = strategy.configs
    kept_tensors: set[tuple] = set()  # (tensor, partition shape, devices) kept by an earlier reader
    for i, op, inputs in saving:
        cfg = configs[op.name]
        ck = ("saved", op.name, tuple(cfg.degrees.items()), m, strategy.fp8)
        hit = cache.get(ck)
        if hit is None:
            degrees = dict(cfg.degrees)
            if m > 1 and "sample" in op.dim_names:
                degrees["sample"] = degrees.get("sample", 1) * m
            ins, _, _ = op.partition_shapes(degrees)
            per = op_kind(op.kind).bwd_saved_bytes_per_element
            if strategy.fp8 and op.kind == "linear":
                per = 1  # the fp8 (transposed) input Transformer Engine keeps for the weight gradient
            hit = cache[ck] = [(op.inputs[k], ins[k], math.prod(ins[k]) * (
                DTYPE_BYTES[op.in_tensors[k].dtype] if per is None else per)) for k in inputs
                if op.in_tensors[k].dtype in FLOAT_DTYPES]
        for ref, shape, nbytes in hit:
            key = ((ref.op, ref.index), shape, cfg.devices)
            if key in kept_tensors:
                continue
            kept_tensors.add(key)
            if strategy.sequence_parallel and cfg.degree("length") == 1:
                pcfg = configs[ref.op]
                if pcfg.degree("length") > 1 and set(pcfg.devices) == set(cfg.devices):
                    nbytes /= pcfg.degree("length")
            out[i] += nbytes
    return out


def _kept_inputs(graph: OpGraph, op, recompute: str) -> tuple[int, ...]:
    """Indices of the inputs ``op`` keeps for its backward pass under ``recompute``: none
    for ops whose backward reads no input; with full recomputation only the layer's inputs
    (tensors made by another block), the rest being recomputed from them; an op that
    selective recomputation reruns keeps the inputs its rerun needs from outside the rerun
    region (the attention core's Q, K and V, Korthikanti et al. 2022 §5)."""
    if op.kind == "input" or op.is_view or not op_kind(op.kind).bwd_reads_inputs:
        return ()
    every = range(len(op.inputs))
    if recompute == "full":
        return tuple(k for k in every if graph[op.inputs[k].op].block != op.block)
    if recompute == "selective" and selective_recompute_reruns(graph, op):
        return tuple(k for k in every if not selective_recompute_reruns(graph, graph[op.inputs[k].op]))
    return tuple(every)
