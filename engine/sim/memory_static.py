"""Static memory per device (split from :mod:`engine.sim.memory`, which re-exports its public names):
what a strategy keeps for the whole iteration (weights, gradients, the optimizer's state, ZeRO's
shards and gathered units, communication buffers, the fp32 logits, CUDA context and NCCL) and
on the host (ZeRO-Offload), with the constants they are sized by and their sources."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..graph import OpGraph
from ..ops import DTYPE_BYTES
from ..strategy import Strategy, partition_grid, zero_shares
from ..taskgraph.regions import param_keys, param_regions, param_split, pieces, within
from ..taskgraph.sync import sync_unit

__all__ = ["StaticMemory", "static_memory", "state_memory", "logits_bytes", "host_capacity", "graph_cache",
           "param_partitions", "optimizer_bytes_per_param", "state_bytes_per_param", "FRAGMENTATION_FRACTION",
           "CUDA_CONTEXT_BYTES", "CUBLAS_WORKSPACE_BYTES", "NCCL_BYTES_PER_COMMUNICATOR", "HOST_MEMORY_BYTES_PER_GPU",
           "OFFLOAD_STATE_BYTES_PER_PARAM"]

#: The caching allocator's fragmentation, as a fraction of the allocated peak added to reach
#: the reserved peak. A stated allowance, not fitted: GMLake (Guo et al. ASPLOS'24) measured
#: PyTorch's splitting allocator wasting 15% on average (up to 33%) of reserved memory over
#: eight LLM fine-tuning setups with recomputation, offload and LoRA on A100-80GB, the
#: patterns that fragment most; ``expandable_segments:True`` (torchtitan's launcher sets it)
#: brings it near 0. 10% sits between.
FRAGMENTATION_FRACTION = 0.10
#: The CUDA context a process holds on each GPU, outside PyTorch's allocator: 300-600 MiB on
#: A100/H100 with CUDA 12's lazy module loading (the figure PyTorch's forums and NVIDIA's
#: CUDA_MODULE_LOADING notes quote; a bare ``torch.cuda.init()`` shows ~500 MiB in nvidia-smi).
CUDA_CONTEXT_BYTES = 512 * 2**20
#: cuBLAS workspace per stream: PyTorch's default ``:4096:8`` on Hopper (8 x 4 MiB).
CUBLAS_WORKSPACE_BYTES = 32 * 2**20
#: NCCL's buffers per communicator: NCCL_BUFFSIZE (4 MiB, NCCL's documented default) per
#: channel per ring peer (send and receive: 2), over 16 channels (NCCL's usual count on
#: NVLink/NVSwitch nodes; up to 32 on H100). Each distinct collective group a device joins is
#: one communicator; pipeline send/receive adds one.
NCCL_BYTES_PER_COMMUNICATOR = 16 * 2 * 4 * 2**20
#: Host memory per GPU when the cluster states none: 1 TiB per 8-GPU node (a DGX A100's
#: standard 1 TB of DDR4; a DGX H100 has 2 TB), i.e. 128 GiB per GPU.
HOST_MEMORY_BYTES_PER_GPU = 2**40 // 8
#: What ZeRO-Offload keeps on the host per offloaded parameter: fp32 master weight, fp32
#: gradient, Adam's momentum and variance (Ren et al. ATC'21 §4, Fig. 2's data flow).
OFFLOAD_STATE_BYTES_PER_PARAM = 16


def optimizer_bytes_per_param(precision: str) -> int:
    """Adam state per parameter: moments (2 x fp32), plus an fp32 master copy in mixed
    precision."""
    return 8 if precision in ("fp32", "tf32") else 12


def state_bytes_per_param(precision: str, zero_stage: int = 0, offload_optimizer: str = "none",
                          grad_reduce_in_fp32: bool = True, optimizer_state: str = "fp32") -> tuple[int, int, int, int]:
    """(weights, gradients, sharded fp32 main gradients, optimizer) bytes per parameter
    before ZeRO's sharding.

    Megatron-Core's distributed optimizer guide (bytes per parameter, ``d`` data-parallel
    ranks): fp16 params and grads 4 + 16/d, bf16 params with fp32 grads 6 + 12/d, fp32 8 + 8/d.
    Under ZeRO-3 in bf16 (FSDP2 with ``param_dtype=bf16, reduce_dtype=fp32``) the sharded
    parameters and gradients are fp32 and the parameter is Adam's master copy: 4 + 4 + 8.
    With the optimizer offloaded the GPU keeps the parameters and gradients in the model's
    dtype; the rest lives on the host (:data:`OFFLOAD_STATE_BYTES_PER_PARAM`). A bf16 model
    without ``grad_reduce_in_fp32`` (Megatron-Core's bf16 gradient buffer) counts as fp16
    does, 4 + 16/d: the distributed optimizer casts its gradient shard to fp32.

    ``optimizer_state`` (:data:`engine.strategy.OPTIMIZER_STATES`): ``bf16-moments`` keeps
    Adam's two moments in bf16 (2 + 2 bytes instead of 4 + 4; Megatron-Core's precision-aware
    optimizer); ``bf16`` keeps no fp32 master copy: the bf16 parameter is the optimizer's, its
    gradient bf16, the moments bf16, 2 + 2 + 4 bytes at any ZeRO stage (KempnerForge casts the
    model to bf16 before FSDP2 and AdamW see it: ``build_parallel_model``).

    >>> state_bytes_per_param("bf16"), state_bytes_per_param("fp16", 1), state_bytes_per_param("bf16", 3)
    ((2, 4, 0, 12), (2, 2, 4, 12), (4, 4, 0, 8))
    >>> state_bytes_per_param("bf16", 1, grad_reduce_in_fp32=False)
    (2, 2, 4, 12)
    >>> state_bytes_per_param("bf16", 1, optimizer_state="bf16-moments"), state_bytes_per_param("bf16", 3, optimizer_state="bf16")
    ((2, 4, 0, 8), (2, 2, 0, 4))
    """
    p = DTYPE_BYTES[precision]
    if offload_optimizer != "none":
        return p, p, 0, 0
    if precision in ("fp32", "tf32"):  # (tf32: fp32 tensors, TF32 tensor-core math)
        return 4, 4, 0, 8
    if optimizer_state == "bf16":
        return p, p, 0, 2 * p
    moments = 4 if optimizer_state == "bf16-moments" else 0  # bytes saved on the two moments
    if zero_stage >= 3:
        w, g, m, o = (4, 4, 0, 8) if precision == "bf16" else (2, 2, 0, 12)
    else:
        w, g, m, o = (2, 4, 0, 12) if precision == "bf16" and grad_reduce_in_fp32 else (2, 2, 4, 12)
    return w, g, m, o - moments


@dataclass
class StaticMemory:
    """Per device [device] bytes of the parts that do not follow the timeline."""

    weights: np.ndarray
    grads: np.ndarray
    optim: np.ndarray
    comm: np.ndarray
    gathered: np.ndarray
    logits: np.ndarray
    context: np.ndarray
    host: np.ndarray
    nvme: np.ndarray

    @property
    def allocated(self) -> np.ndarray:
        """Allocated bytes before activations (the same additions as :meth:`MemoryReport.breakdown`)."""
        return self.weights + self.grads + self.optim + self.comm


def static_memory(graph: OpGraph, strategy: Strategy, cluster: Cluster, tg) -> StaticMemory:
    """Every part of a device's memory but the activations, in bytes per device."""
    D = cluster.num_devices
    weights, grads, optim, gathered, host, nvme = state_memory(graph, strategy, D)
    comm, communicators = _communication(graph, strategy, D, tg)
    configs = strategy.configs
    image = tg.info.get("device_image")
    logits = logits_bytes(graph, strategy, D)
    if image is not None:
        has = image >= 0
        logits[has] = logits[image[has]]
    used = np.zeros(D, bool)
    in_use = set().union(*[c.devices for c in configs.values()])
    used[np.fromiter(in_use, np.int64, len(in_use))] = True
    context = np.where(used, CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES + communicators * NCCL_BYTES_PER_COMMUNICATOR,
                       0.0)
    return StaticMemory(weights, grads, optim, comm, gathered, logits, context, host, nvme)


def state_memory(graph: OpGraph, strategy: Strategy, D: int) -> tuple[np.ndarray, ...]:
    """[device] bytes of weights, gradients, optimizer state and ZeRO-3's gathered units, and
    what ZeRO-Offload / ZeRO-Infinity keep on the host and on NVMe, for ``D`` devices: what a
    strategy's configs alone decide (no task graph)."""
    params, sharded, gemm_params, unit_max = _held_params(graph, strategy, D)
    return _state(graph, strategy, D, params, sharded, gemm_params, unit_max)


def _held_params(graph: OpGraph, strategy: Strategy, D: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[device] parameters held (shared groups counted once per (group, region, device)), the
    ZeRO-sharded ones, the linear layers' (fp8 weight copies) and the largest ZeRO-3 unit;
    each op's arrays and the sums are kept in the graph's cache for the next call."""
    zero = strategy.zero_stage
    cache = graph_cache(graph)
    meta = cache.get(("param_meta", zero))
    if meta is None:  # (op, name, group id, ZeRO-3 unit id) of every op with parameters, in a fixed order
        groups: dict[str, int] = {}
        units: dict[str, int] = {}
        meta = cache[("param_meta", zero)] = (
            [(op, op.name, groups.setdefault(op.param_group or op.name, len(groups)),
              units.setdefault(sync_unit(op, zero), len(units)) if zero >= 3 else -1)
             for op in graph.ops if op.param_count and op.kind != "input"], len(units))
    meta, n_units = meta
    # (a sequence-parallel op's length split is partly tensor-parallel: not sharded over)
    shares = zero_shares(graph, strategy) if zero >= 1 else {}
    # each op's arrays, kept for its config (a search changes one op a proposal: the others are
    # looked up, not made again; a sweep's next layout has equal configs on many ops; group and
    # unit ids follow the ops' fixed order)
    per_op = cache.setdefault("static_per_op", {})
    configs = strategy.configs
    hits = []
    for op, name, gid, uid in meta:
        cfg = configs[name]
        share = shares.get(name, 1) if shares else 1
        hit = per_op.get(name)
        if hit is None or (hit[0] is not cfg and hit[0] != cfg) or hit[1] != (D, gid, uid, share):
            regions, devices, elems, _ = param_partitions(cache, op, cfg)
            n = devices.size
            # ZeRO's group for this parameter: the partitions equal on every dim but the data
            # dims (sample and sequence), as SyncBuilder.build groups them
            hit = per_op[name] = (cfg, (D, gid, uid, share), (gid * (1 << 24) + regions) * D + devices, devices,
                                  np.full(n, elems), np.full(n, float(cfg.degree("sample") * cfg.degree("length")
                                                                      // share)),
                                  np.full(n, uid), np.full(n, op.kind == "linear"), param_split(op, cfg))
        hits.append(hit)
    # the per-device sums, made again only when some op's arrays changed: a proposal that
    # changes an op without parameters reuses the last call's (``hits`` is kept with them, so
    # the ids compared name the same objects)
    key = (tuple(map(id, hits)), D, zero, strategy.shard_group if zero >= 2 else 0, bool(strategy.fp8))
    last = cache.get("static_last")
    if last is not None and last[0] == key:
        params, sharded, gemm_params, unit_max = last[2]
    else:
        # a shared tensor its ops cut differently (an RNN's timesteps under different configs):
        # a GPU holding the whole and a half holds the whole once, the union of its regions
        mixed: dict[int, list] = {}
        if not zero:
            by_group: dict[int, list] = {}  # group -> [(op, config, its cuts)]
            for (op, _, gid, _), hit in zip(meta, hits):
                by_group.setdefault(gid, []).append((op, hit[0], hit[8]))
            mixed = {gid: [(op, cfg) for op, cfg, _ in m] for gid, m in by_group.items()
                     if len({cut for *_, cut in m}) > 1}
        params, sharded, gemm_params, unit_max = sums = _param_sums(
            [h for m, h in zip(meta, hits) if m[2] not in mixed] if mixed else hits, D, zero, n_units, strategy)
        for members in mixed.values():
            params += _union_held(cache, members, D)
            if strategy.fp8:
                gemm_params += _union_held(cache, [(op, cfg) for op, cfg in members if op.kind == "linear"], D)
        cache["static_last"] = (key, hits, sums)
    return params, sharded, gemm_params, unit_max


def _state(graph: OpGraph, strategy: Strategy, D: int, params: np.ndarray, sharded: np.ndarray,
           gemm_params: np.ndarray, unit_max: np.ndarray) -> tuple[np.ndarray, ...]:
    """[device] bytes of weights, gradients, optimizer state and ZeRO-3's gathered units, and
    what ZeRO-Offload / ZeRO-Infinity keep on the host and on NVMe."""
    zero = strategy.zero_stage
    off_opt = getattr(strategy, "offload_optimizer", "none")
    off_par = getattr(strategy, "offload_params", "none")
    pbytes = DTYPE_BYTES[graph.precision]
    w_b, g_b, main_b, o_b = state_bytes_per_param(graph.precision, zero, off_opt,
                                                  getattr(strategy, "grad_reduce_in_fp32", True),
                                                  getattr(strategy, "optimizer_state", "fp32"))
    weights = (sharded if zero >= 3 else params) * w_b
    grads = (sharded if zero >= 2 else params) * g_b + (sharded if zero >= 1 else params) * main_b
    if zero >= 2 and getattr(strategy, "accumulate_unsharded", False) and strategy.pipeline.microbatches > 1:
        # FSDP's no_sync: the microbatches before the last keep their unsharded gradients until
        # the last one's reduce-scatter, upcast to FSDP2's reduce dtype (torch 2.13
        # _fsdp_param.py to_accumulated_grad_if_needed: fp32 with grad_reduce_in_fp32)
        acc = DTYPE_BYTES["fp32"] if getattr(strategy, "grad_reduce_in_fp32", True) else pbytes
        grads = grads + params * acc
    optim = (sharded if zero >= 1 else params) * o_b
    host, nvme = np.zeros(D), np.zeros(D)
    if off_opt != "none":
        state = (sharded if zero >= 1 else params) * OFFLOAD_STATE_BYTES_PER_PARAM
        if off_opt == "nvme":
            nvme += state
        else:
            host += state
    if zero >= 3 and off_par != "none":
        # ZeRO-Infinity: the parameter shard lives off the GPU, fetched for each use
        if off_par == "nvme":
            nvme += weights
        else:
            host += weights
        weights = np.zeros(D)
    if zero < 3 and strategy.fp8 and getattr(strategy, "fp8_library", "te") == "te":
        # Transformer Engine keeps each linear weight's fp8 copy and its transpose between
        # microbatches (1 + 1 bytes per element); under ZeRO-3 weights are gathered per use;
        # torchao casts the weight anew in every forward and backward and caches none.
        # With fp8 parameters the fp8 weight and its transpose replace the model-dtype copy.
        fp8_params = getattr(strategy, "fp8_params", False)
        weights = weights + (2.0 - (pbytes if fp8_params else 0.0)) * gemm_params
    # ZeRO-3: the unit in use and the one prefetched, gathered in the model's dtype (FSDP's
    # default forward and backward prefetch of one unit; the gathered copy is freed after use)
    gathered = 2.0 * unit_max * pbytes if zero >= 3 else np.zeros(D)
    return weights, grads, optim, gathered, host, nvme


def _communication(graph: OpGraph, strategy: Strategy, D: int, tg) -> tuple[np.ndarray, np.ndarray]:
    """[device] bytes of the largest collective each device joins (its communication buffer)
    and the number of distinct communicators (groups) it joins."""
    cache = graph_cache(graph)
    comm = np.zeros(D)
    communicators = np.zeros(D)
    coll_devs = tg.info.get("coll_devices")
    if coll_devs is not None:
        ptr, idx, tasks = coll_devs
        counts = np.diff(ptr)
        np.maximum.at(comm, idx, np.repeat(tg.size_bytes[tasks], counts))
        if idx.size:
            tag = cache.get(("group_tags", D))  # a group's key: its members' sum
            if tag is None:
                tag = cache[("group_tags", D)] = np.random.default_rng(0).integers(1, 2**62, D, dtype=np.int64)
            nz = counts > 0
            key = np.zeros(counts.size, np.int64)
            key[nz] = np.add.reduceat(tag[idx], ptr[:-1][nz])
            # one collective per distinct group (GPT-3 on 1,024 GPUs: 220,000 collectives, a
            # handful of groups), then its members: each (group, device) pair once
            _, first = np.unique(key[nz], return_index=True)
            one = np.flatnonzero(nz)[first]
            members = idx[np.repeat(ptr[one], counts[one]) + within(counts[one])]
            pairs = np.unique(np.repeat(np.arange(one.size, dtype=np.int64), counts[one]) * D + members)
            communicators = np.bincount(pairs % D, minlength=D).astype(np.float64)
    if strategy.pipeline.stages > 1:
        communicators += 1.0  # pipeline send/receive
    image = tg.info.get("device_image")
    if image is not None:  # a collective's buffer is built only where a representative joins it
        has = image >= 0
        comm[has] = comm[image[has]]
        communicators[has] = communicators[image[has]]
    return comm, communicators


def _param_sums(hits: list[tuple], D: int, zero: int, n_units: int, strategy: Strategy
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[device] parameters held (before sharding), in ZeRO's shard (each over its own group),
    of them linear layers' weights (fp8's cached copies) and, under ZeRO-3, the largest unit's
    parameters a device gathers, from :func:`static_memory`'s per-op arrays (``hits``).
    Shared groups are counted once per (group, region, device): every parameter partition has
    an integer code for its (tensor, region, device), and the first of equal codes counts, as
    a set of seen keys would."""
    params = np.zeros(D)
    sharded = np.zeros(D)
    gemm_params = np.zeros(D)
    unit_max = np.zeros(D)
    if not hits:
        return params, sharded, gemm_params, unit_max
    _, first, which = np.unique(np.concatenate([h[2] for h in hits]), return_index=True, return_inverse=True)
    devs_p = np.concatenate([h[3] for h in hits])[first]
    elems_p = np.concatenate([h[4] for h in hits])[first]
    div = np.concatenate([h[5] for h in hits])[first]
    if zero >= 2 and strategy.shard_group:  # hybrid sharding: shards within groups of k ranks
        div = np.minimum(div, strategy.shard_group)
    params += np.bincount(devs_p, elems_p, minlength=D)
    sharded += np.bincount(devs_p, elems_p / div, minlength=D)
    if strategy.fp8:  # (a region a linear layer holds, shared with an embedding: cached in fp8 too)
        linear = np.zeros(first.size, bool)
        np.logical_or.at(linear, which.ravel(), np.concatenate([h[7] for h in hits]))
        np.add.at(gemm_params, devs_p, np.where(linear, elems_p, 0.0))
    if zero >= 3:
        per_unit = np.zeros((n_units, D))
        np.add.at(per_unit, (np.concatenate([h[6] for h in hits])[first], devs_p), elems_p)
        unit_max = per_unit.max(axis=0)
    return params, sharded, gemm_params, unit_max


def _union_held(cache: dict, members: list[tuple], D: int) -> np.ndarray:
    """[device] elements of one shared tensor its ops (``members``: (op, config)) hold: the
    union of each GPU's regions (the tensor cut at every boundary of every region; each piece
    counted once a GPU holding it). Kept for the same config objects."""
    if not members:
        return np.zeros(D)
    memo = cache.setdefault("union_held", {})
    key = (members[0][0].name, D)
    hit = memo.get(key)
    if hit is not None and len(hit[0]) == len(members) and all(a is b for a, (_, b) in zip(hit[0], members)):
        return hit[1]
    grids = [partition_grid(op, cfg) for op, cfg in members]
    devs = np.concatenate([np.asarray(cfg.devices, np.int64) for _, cfg in members])
    total = np.zeros(D)
    for i in range(len(members[0][0].params)):
        lo, hi = (np.concatenate(x) for x in zip(*(param_regions(op, cfg, names, grid, i)
                                                    for (op, cfg), (names, grid) in zip(members, grids))))
        volume, _, _, on = pieces(lo, hi, devs, D)
        total += volume @ on
    if len(memo) > 4096:
        memo.clear()
    memo[key] = ([cfg for _, cfg in members], total)
    return total


def logits_bytes(graph: OpGraph, strategy: Strategy, D: int) -> np.ndarray:
    """[device] the loss's buffer beyond the logits the loss op keeps, per microbatch, on the
    devices computing the loss: 4 bytes an element of the logits it reads (its partition: the
    vocabulary shard under loss parallelism, the whole logits when they are gathered). That is
    Megatron-Core's vocab-parallel cross-entropy's fp32 softmax, whose gradient is made in
    place (fused kernels); and PyTorch's eager cross-entropy on a bf16 model (no autocast) holds
    its log-softmax output's gradient and its input's, 2 + 2 bytes, at the backward's peak. With
    eager kernels a mixed-precision model's loss upcasts its logits (torchtitan's
    ``F.cross_entropy(pred.flatten(0, 1).float(), ...)``): the fp32 log-softmax output it keeps
    and, at the backward's peak, that output's gradient and its input's, 3 x 4 bytes, less the
    logits' own bytes the loss op keeps (:attr:`engine.strategy.Strategy.kernels`)."""
    out = np.zeros(D)
    per = 4.0
    half = DTYPE_BYTES.get(graph.precision, 4) < 4
    if getattr(strategy, "kernels", "fused") == "eager" and not (half and strategy.optimizer_state == "bf16"):
        per = 3 * 4.0 - DTYPE_BYTES.get(graph.precision, 4)
    m = max(1, strategy.pipeline.microbatches)
    cache = graph_cache(graph)
    losses = cache.get("loss_ops")
    if losses is None:
        losses = cache["loss_ops"] = [op for op in graph.ops if op.kind == "softmax_cross_entropy"]
    for op in losses:
        cfg = strategy.configs[op.name]
        degrees = dict(cfg.degrees)
        if m > 1 and "sample" in op.dim_names:
            degrees["sample"] = degrees.get("sample", 1) * m
        ins, _, _ = op.partition_shapes(degrees)
        np.maximum.at(out, np.asarray(cfg.devices, np.int64), per * math.prod(ins[0]))
    return out


def host_capacity(cluster: Cluster) -> np.ndarray:
    """[device] host memory each GPU has for offloaded state: the cluster's
    ``host_memory_bytes(device)`` where it states one, else :data:`HOST_MEMORY_BYTES_PER_GPU`
    (1 TiB per 8-GPU node)."""
    get = getattr(cluster, "host_memory_bytes", None)
    out = np.full(cluster.num_devices, float(HOST_MEMORY_BYTES_PER_GPU))
    if get is not None:
        for d in range(cluster.num_devices):
            v = get(d)
            if v:
                out[d] = float(v)
    return out


#: graph -> per-(op, config) results (a search asks for the same ones often); an entry goes
#: with its graph
_CACHES: "weakref.WeakKeyDictionary[OpGraph, dict]" = weakref.WeakKeyDictionary()


def graph_cache(graph: OpGraph) -> dict:
    """The per-(op, config) results of ``graph``, bounded (a long search sees many configs)."""
    cache = _CACHES.get(graph)
    if cache is None or len(cache) > 200_000:
        cache = _CACHES[graph] = {"region_ids": {}}  # (ids only grow within a cache)
    return cache


def param_partitions(cache: dict, op, cfg) -> tuple[np.ndarray, np.ndarray, float, float]:
    """An op's parameter partitions under ``cfg``: the parameter region each holds (an id,
    equal for equal regions of ops sharing parameters), its device, elements per partition
    and the number of copies of each region (its replication). ``cache``: graph_cache's."""
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
        _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)  # (a few distinct)
        # labelled by the region of the tensor (equal across ops sharing it: a tied embedding's
        # vocab slice and its output layer's are one region), not by the dims that cut it
        labels = param_keys(op, cfg, grid_names, grid[first])
        regions = np.array([ids.setdefault(lab, len(ids)) for lab in labels], np.int64)[inverse.ravel()]
        hit = cache[ck] = (regions, np.asarray(cfg.devices, np.int64), elems, copies)
    return hit
