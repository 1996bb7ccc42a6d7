"""Per-device memory over a simulated iteration, as PyTorch would report it.

Static memory per device, bytes per parameter by precision and ZeRO stage
(:func:`state_bytes_per_param`):

* weights: the partitions' parameters in the model's dtype; ZeRO-3 keeps a shard, in fp32
  under bf16 (FSDP2 keeps the sharded parameters in fp32 and casts them to bf16 for the
  all-gather: ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, as torchtitan
  and KempnerForge configure it);
* gradients: fp32 under bf16 (Megatron-Core accumulates and reduces bf16 models' gradients in
  an fp32 grad buffer; FSDP2 reduces in fp32 and keeps fp32 sharded gradients), fp16 under
  fp16 plus the fp32 main gradients the optimizer shards; ZeRO-2 and -3 keep a shard;
* optimizer state: Adam's two moments, plus an fp32 master copy when the model trains in
  fp16/bf16 (12 bytes per parameter; 8 in fp32 and under FSDP2, whose fp32 sharded parameter
  is the master copy); ZeRO-1 and above keep a shard. Megatron-Core's distributed-optimizer
  guide gives the totals this reproduces: 4 + 16/d bytes (fp16), 6 + 12/d (bf16 with fp32
  grads), 8 + 8/d (fp32) (Rajbhandari et al. SC'20 §3 for the mixed-precision Adam counts);
* communication buffers: the largest collective the device takes part in.

ZeRO shards each parameter over its own data-parallel group: the partitions that hold the same
region of it, those equal on every dim but the sample's and the sequence's (the grouping of
:class:`engine.taskgraph.sync.SyncBuilder`, whose ``device_params`` the optimizer step updates),
at most ``shard_group`` of them under hybrid sharding.

Activations are tracked over the timeline: what an op partition saves for its backward pass is
allocated when its forward task ends and freed when its backward task ends, per microbatch,
so the peak follows the pipeline schedule (1F1B holds fewer microbatches than GPipe). With
full recomputation only layer inputs are kept; selective recomputation drops the attention
core's activations (Korthikanti et al. 2022 §5); ``selective-op`` (torchtitan's per-op policy,
:func:`engine.strategy.recompute.op_checkpoint_saved`) keeps each layer's input and the outputs its save
list names (every other matmul, the fused attention's output and log-sum-exp, the
reduce-scattered outputs).

On top of them (:meth:`MemoryReport.breakdown` names every part; they sum to ``peak_bytes``):

* transient buffers live at the peak: ZeRO-3's gathered (unsharded) parameters of the unit in
  use and the one prefetched (FSDP's forward/backward prefetch of one unit), and the loss's
  fp32 logits (PyTorch autocast runs ``cross_entropy``/``log_softmax`` in fp32; in fp32 the
  logits' gradient, as large, is made while the logits are kept): batch x seq x vocab x 4
  bytes per microbatch on the devices computing the loss;
* the caching allocator's fragmentation, a stated allowance (:data:`FRAGMENTATION_FRACTION`):
  ``reserved = allocated x (1 + f)``;
* the CUDA context, cuBLAS workspace and NCCL's buffers, outside the allocator
  (:data:`CUDA_CONTEXT_BYTES`, :data:`NCCL_BYTES_PER_COMMUNICATOR`).

``peak_bytes`` = reserved + context, what the device holds at its peak (nvidia-smi's view).
``allocated_peak_bytes`` is what ``torch.cuda.max_memory_allocated`` would report,
``reserved_peak_bytes`` what ``torch.cuda.max_memory_reserved`` would.

Out of memory is decided on ``required_bytes`` = allocated + context, not on the reserved
peak: when ``cudaMalloc`` fails, PyTorch's caching allocator first frees cached blocks that
would satisfy the request, then every cached block that is not split, and retries
(``c10/cuda/CUDACachingAllocator.cpp`` ``malloc``: ``release_available_cached_blocks`` then
``release_cached_blocks`` before it raises OutOfMemoryError), so memory cached but unused
cannot by itself make a run that fits in allocated memory fail. What it cannot give back is
the free tail of split segments whose other blocks are in use; that part of the
fragmentation allowance is not counted (no measurement separates it), so a run within a few
percent of capacity may still fail from fragmentation that the rule calls feasible.

ZeRO-Offload / ZeRO-Infinity (Ren et al. ATC'21; Rajbhandari et al. SC'21): an offloaded
optimizer keeps its state (fp32 master weights, fp32 gradients, Adam's moments: 16 bytes per
parameter, sharded) in host memory (``cpu``) or on NVMe (``nvme``) instead of the GPU, whose
gradients stay in the model's dtype; offloaded parameters (ZeRO-3) keep only the gathered
working set on the GPU. ``host_bytes`` is checked against the host memory each GPU has.

A strategy whose required memory (allocated + context) exceeds a device's capacity, or whose
host state exceeds its host memory, is infeasible; the report says which device and by how much.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cluster import Cluster
from ..errors import check_cancel
from ..graph import OpGraph
from .full import Timeline
from ..strategy.activations import offloaded_layers, saved_bytes as _saved_bytes
from .memory_static import (FRAGMENTATION_FRACTION,
    StaticMemory, graph_cache,
    host_capacity, static_memory)
from ..strategy import Strategy
from ..taskgraph import BWD, FWD, OFFLOAD

__all__ = ["MemoryReport", "memory_report", "fits_in_memory", "saved_activation_bytes"]

@dataclass
class MemoryReport:
    """Memory per device, in bytes (all arrays are ``[device]``).

    ``peak_bytes`` = ``reserved_peak_bytes`` + ``context_bytes``, and
    ``reserved_peak_bytes`` = ``allocated_peak_bytes`` + ``fragmentation_bytes``, and
    ``allocated_peak_bytes`` = :attr:`static_bytes` + ``activations_peak_bytes`` +
    ``gathered_bytes`` + ``logits_bytes``: :meth:`breakdown` lists the parts in that order and
    they sum to ``peak_bytes`` exactly. Feasibility compares :attr:`required_bytes`
    (allocated + context: the caching allocator releases its unused cached blocks before it
    reports out of memory, see the module docstring) with ``capacity_bytes``, and
    ``host_bytes`` with ``host_capacity_bytes``."""

    weights_bytes: np.ndarray
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    comm_buffer_bytes: np.ndarray
    activations_peak_bytes: np.ndarray
    peak_bytes: np.ndarray
    capacity_bytes: np.ndarray
    #: per device: (times_s, bytes) of the memory curve (the ``peak_bytes`` view: reserved +
    #: context), for traces and plots
    curves: Sequence[tuple[np.ndarray, np.ndarray]]
    #: ZeRO-3's gathered parameters (unit in use + the one prefetched)
    gathered_bytes: np.ndarray | None = None
    #: the loss's fp32 logits at the end of the forward pass
    logits_bytes: np.ndarray | None = None
    #: the caching allocator's fragmentation allowance (FRAGMENTATION_FRACTION x allocated)
    fragmentation_bytes: np.ndarray | None = None
    #: CUDA context, cuBLAS workspace and NCCL buffers (outside the allocator)
    context_bytes: np.ndarray | None = None
    #: what torch.cuda.max_memory_allocated would report
    allocated_peak_bytes: np.ndarray | None = None
    #: what torch.cuda.max_memory_reserved would report
    reserved_peak_bytes: np.ndarray | None = None
    #: offloaded state in host memory (ZeRO-Offload ``cpu``; the offloaded activations of one
    #: microbatch: Strategy.offload_activations), and the host memory per GPU
    host_bytes: np.ndarray | None = None
    host_capacity_bytes: np.ndarray | None = None
    #: offloaded state on NVMe (ZeRO-Infinity ``nvme``; not checked against a capacity)
    nvme_bytes: np.ndarray | None = None

    def __post_init__(self) -> None:
        zeros = np.zeros_like(np.asarray(self.peak_bytes, np.float64))
        for name in ("gathered_bytes", "logits_bytes", "fragmentation_bytes", "context_bytes", "host_bytes",
                     "nvme_bytes"):
            if getattr(self, name) is None:
                setattr(self, name, zeros.copy())
        if self.allocated_peak_bytes is None:
            self.allocated_peak_bytes = self.static_bytes + self.activations_peak_bytes + self.gathered_bytes \
                + self.logits_bytes
        if self.reserved_peak_bytes is None:
            self.reserved_peak_bytes = self.allocated_peak_bytes + self.fragmentation_bytes
        if self.host_capacity_bytes is None:
            self.host_capacity_bytes = np.full(zeros.shape, np.inf)

    @property
    def static_bytes(self) -> np.ndarray:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.comm_buffer_bytes

    def breakdown_arrays(self) -> dict[str, np.ndarray]:
        """Every part of the peak, ``[device]`` bytes each, in the order they add up to
        ``peak_bytes`` (:meth:`breakdown` for one device)."""
        return {"weights": self.weights_bytes, "gradients": self.grads_bytes, "optimizer state": self.optimizer_bytes,
                "communication buffers": self.comm_buffer_bytes, "activations": self.activations_peak_bytes,
                "gathered parameters": self.gathered_bytes, "logits (fp32)": self.logits_bytes,
                "allocator fragmentation": self.fragmentation_bytes, "CUDA context and NCCL": self.context_bytes}

    def breakdown(self, device: int) -> dict[str, float]:
        """The parts of ``device``'s peak, in bytes, in order; they sum to ``peak_bytes[device]``
        exactly (the same additions in the same order)."""
        d = int(device)
        return {k: float(v[d]) for k, v in self.breakdown_arrays().items()}

    @property
    def required_bytes(self) -> np.ndarray:
        """[device] what must fit for the run not to fail with out of memory: the allocated
        peak plus the CUDA context and NCCL buffers (the reserved peak less the cached blocks
        PyTorch's allocator frees and retries with before it gives up)."""
        return self.allocated_peak_bytes + self.context_bytes

    @property
    def host_feasible(self) -> bool:
        return bool(np.all(self.host_bytes <= self.host_capacity_bytes))

    @property
    def feasible(self) -> bool:
        return bool(np.all(self.required_bytes <= self.capacity_bytes)) and self.host_feasible

    def over_capacity(self) -> list[tuple[int, float]]:
        """(device, bytes over GPU capacity) for every device that does not fit (its
        :attr:`required_bytes` over capacity), worst first."""
        over = self.required_bytes - self.capacity_bytes
        idx = np.nonzero(over > 0)[0]
        return sorted(((int(d), float(over[d])) for d in idx), key=lambda x: -x[1])

    def over_host_capacity(self) -> list[tuple[int, float]]:
        """(device, bytes over its host memory) for every device whose offloaded state does not
        fit in the host memory it has, worst first."""
        over = self.host_bytes - self.host_capacity_bytes
        idx = np.nonzero(over > 0)[0]
        return sorted(((int(d), float(over[d])) for d in idx), key=lambda x: -x[1])

    def host_message(self) -> str:
        """Why the host state does not fit, in words ('' when it does)."""
        over = self.over_host_capacity()
        if not over:
            return ""
        d, b = over[0]
        return (f"offloaded state does not fit in host memory: device {d} needs {self.host_bytes[d] / 2**30:.1f} GiB "
                f"of host memory, {b / 2**30:.1f} GiB more than the {self.host_capacity_bytes[d] / 2**30:.1f} GiB "
                f"it has ({len(over)} device(s) over)")


def _peak_parts(st: StaticMemory, act: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(allocated, fragmentation, reserved, peak) from the static parts and ``act`` [device]
    activation peaks, added in :meth:`MemoryReport.breakdown`'s order."""
    allocated = st.allocated + act + st.gathered + st.logits
    frag = FRAGMENTATION_FRACTION * allocated
    reserved = allocated + frag
    return allocated, frag, reserved, reserved + st.context


def fits_in_memory(graph: OpGraph, strategy: Strategy, cluster: Cluster, timeline: Timeline) -> bool:
    """Whether every device fits (:attr:`MemoryReport.feasible`), answered first from an
    upper bound: static memory plus every activation a device saves in the iteration, as if
    none were freed. Only when the bound exceeds some device's capacity is the timeline's
    allocation order examined (:func:`memory_report`). A search asks this once per proposal;
    with one microbatch the bound is nearly the peak (every forward ends before the first
    backward), and it skips the sort of every allocation by time."""
    tg = timeline.tasks
    st = static_memory(graph, strategy, cluster, tg)
    if np.any(st.host > host_capacity(cluster)):
        return False
    m = max(1, strategy.pipeline.microbatches)
    saved = _saved_bytes(graph, strategy, m, graph_cache(graph))
    f_idx = np.nonzero(tg.kind == FWD)[0]
    bound = np.bincount(tg.device[f_idx], weights=saved[tg.op[f_idx]], minlength=cluster.num_devices)
    image = tg.info.get("device_image")
    if image is not None:
        mirrored = (image >= 0) & (image != np.arange(cluster.num_devices))
        bound[mirrored] = bound[image[mirrored]]
    capacity = np.array([cluster.device_type(d).memory_bytes for d in range(cluster.num_devices)], np.float64)
    allocated = _peak_parts(st, bound)[0]
    if np.all(allocated + st.context <= capacity):  # (MemoryReport.required_bytes)
        return True
    return memory_report(graph, strategy, cluster, timeline).feasible


def memory_report(graph: OpGraph, strategy: Strategy, cluster: Cluster, timeline: Timeline,
                  cancel: Any = None) -> MemoryReport:
    """Memory of every device over ``timeline`` (which must come from the same strategy).
    ``cancel`` (:func:`engine.errors.check_cancel`) is asked between its steps
    (:class:`~engine.errors.Cancelled` when set).

    A timeline unfolded from a steady short run (:mod:`engine.sim.unfold`) is reported from
    that run: its peaks are the iteration's (:mod:`engine.sim.steady`: after the warm-up a
    stage holds the same microbatches' activations in every period), and its curves, which
    only a trace reads, are made over the unfolded timeline when first read."""
    from_short = timeline.tasks.info.get("unfolded_from")
    if from_short is None:
        return _report(graph, strategy, cluster, timeline, cancel)
    out = _report(graph, strategy, cluster, from_short[0], cancel)
    out.curves = _CurvesLater(lambda: _report(graph, strategy, cluster, timeline).curves)
    return out


def _report(graph: OpGraph, strategy: Strategy, cluster: Cluster, timeline: Timeline,
            cancel: Any = None) -> MemoryReport:
    check_cancel(cancel)
    D = cluster.num_devices
    tg = timeline.tasks
    m = max(1, strategy.pipeline.microbatches)
    st = static_memory(graph, strategy, cluster, tg)
    cache = graph_cache(graph)
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
    away = _offloaded_window(graph, strategy, tg, timeline, f_idx)
    if away is not None:  # on the host from its copy's end to its copy back's start
        sent, back = away
        on = np.isfinite(sent)
        times = np.concatenate([alloc_t, np.where(on, sent, free_t), back[on], free_t[on]])
        delta = np.concatenate([amount, -amount, amount[on], -amount[on]])
        devs = np.concatenate([dev, dev, dev[on], dev[on]])
    else:
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
    # the curve is the peak_bytes view: reserved (allocated x (1 + f)) + context, over time
    base = (st.allocated + st.gathered + st.logits) * (1.0 + FRAGMENTATION_FRACTION) + st.context
    bounds = np.searchsorted(devs, np.arange(D + 1))
    check_cancel(cancel)
    for d in range(D):
        lo, hi = bounds[d], bounds[d + 1]
        level = np.cumsum(delta[lo:hi])
        if level.size:
            act_peak[d] = max(0.0, float(level.max()))
        curves.append((times[lo:hi], base[d] + (1.0 + FRAGMENTATION_FRACTION) * level))
    if image is not None:  # symmetric simulation: mirror representatives' activations
        mirrored = (image >= 0) & (image != np.arange(D))
        act_peak[mirrored] = act_peak[image[mirrored]]
    capacity = np.array([cluster.device_type(d).memory_bytes for d in range(D)], dtype=np.float64)
    allocated, frag, reserved, peak = _peak_parts(st, act_peak)
    host = st.host + _offloaded_host_bytes(tg, image, D)
    return MemoryReport(st.weights, st.grads, st.optim, st.comm, act_peak, peak, capacity,
                        _Curves(curves, image, base), gathered_bytes=st.gathered, logits_bytes=st.logits,
                        fragmentation_bytes=frag, context_bytes=st.context, allocated_peak_bytes=allocated,
                        reserved_peak_bytes=reserved, host_bytes=host, host_capacity_bytes=host_capacity(cluster),
                        nvme_bytes=st.nvme)


class _Curves(Sequence):
    """Per device, (times_s, bytes) of its memory curve; a device that mirrors a
    representative (symmetric simulation) gets the representative's activations over its
    own static memory, made when asked for (a 1,024-GPU report does not build 1,000 copies
    that only a trace reads)."""

    def __init__(self, curves: list[tuple[np.ndarray, np.ndarray]], image: np.ndarray | None,
                 static: np.ndarray) -> None:
        self._curves, self._image, self.static_memory = curves, image, static

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
        return times, self.static_memory[d] + (level - self.static_memory[i])


class _CurvesLater(Sequence):
    """Curves made when first read (``make``: what makes them)."""

    def __init__(self, make) -> None:
        self._make, self._curves = make, None

    def _all(self) -> Sequence:
        if self._curves is None:
            self._curves = self._make()
        return self._curves

    def __len__(self) -> int:
        return len(self._all())

    def __getitem__(self, d):
        return self._all()[d]


def saved_activation_bytes(graph: OpGraph, strategy: Strategy) -> np.ndarray:
    """[op] bytes one partition of each op keeps for its backward pass, per microbatch."""
    return _saved_bytes(graph, strategy, max(1, strategy.pipeline.microbatches), graph_cache(graph))


def _offloaded_window(graph: OpGraph, strategy: Strategy, tg, timeline: Timeline,
                      f_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """For the forward tasks ``f_idx``: when their saved activations reach the host (the end
    of their layer's copy to the host) and when they start coming back (the start of the copy
    back), NaN for tasks of layers that stay on the device; None without offloading
    (:mod:`engine.taskgraph.offload`)."""
    layers = offloaded_layers(graph, strategy)
    if not layers:
        return None
    layer_of = np.full(len(graph.ops), -1, np.int64)
    for k, ops in enumerate(layers):
        layer_of[ops] = k
    o_idx = np.nonzero(tg.kind == OFFLOAD)[0]
    if o_idx.size == 0:
        return None
    D = tg.n_devices
    m = int(max(tg.mb[o_idx].max(), tg.mb[f_idx].max() if f_idx.size else 0)) + 1

    def key(layer, mb, dev):
        return (layer.astype(np.int64) * m + mb) * D + dev

    o_key = key(layer_of[tg.op[o_idx]], tg.mb[o_idx], tg.device[o_idx])
    lay = layer_of[tg.op[f_idx]]
    f_key = key(np.maximum(lay, 0), tg.mb[f_idx], tg.device[f_idx])
    sent = np.full(f_idx.size, np.nan)
    back = np.full(f_idx.size, np.nan)
    for direction, out, when in ((0, sent, timeline.end_s), (1, back, timeline.start_s)):
        sel = o_idx[tg.part[o_idx] == direction]
        keys = o_key[tg.part[o_idx] == direction]
        order = np.argsort(keys)
        keys, sel = keys[order], sel[order]
        pos = np.minimum(np.searchsorted(keys, f_key), max(keys.size - 1, 0))
        hit = (lay >= 0) & (keys[pos] == f_key) if keys.size else np.zeros(f_idx.size, bool)
        out[hit] = when[sel[pos[hit]]]
    both = np.isfinite(sent) & np.isfinite(back)
    sent[~both] = np.nan
    back[~both] = np.nan
    return sent, back


def _offloaded_host_bytes(tg, image, D: int) -> np.ndarray:
    """[device] host bytes the offloaded activations of one microbatch hold (each layer's copy
    to the host of microbatch 0; with no pipeline parallelism one microbatch is in flight)."""
    out = np.zeros(D)
    sel = np.nonzero((tg.kind == OFFLOAD) & (tg.part == 0) & (tg.mb == 0))[0]
    if sel.size:
        np.add.at(out, tg.device[sel], tg.size_bytes[sel])
        if image is not None:
            mirrored = (image >= 0) & (image != np.arange(D))
            out[mirrored] = out[image[mirrored]]
    return out
