"""Baseline strategies: data parallel, model parallel, FlexFlow's expert, Megatron and FSDP.

Every baseline is a function ``(graph, cluster, **options) -> Strategy`` registered in
:data:`BASELINES`, so the CLI and the app list them without a hard-coded menu. Options a
baseline does not take are refused with the list of those it does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from ..cluster import Cluster
from ..graph import Op, OpGraph
from ..layout import ON_BY_DEFAULT, SWITCHES, Layout, microbatch_count
from ..strategy import GATHER_UNITS, Config, PipelineSettings, Strategy, check_strategy
from ..layout.placement import balanced_layers, expert_config, layer_chunks, mesh_config, tp_plan
from ..graph.blocks import layer_blocks

__all__ = ["BASELINES", "Baseline", "make_baseline", "data_parallel", "model_parallel", "expert", "megatron",
           "build_layout", "fsdp"]


def _largest_divisor(size: int, at_most: int) -> int:
    """Largest d <= at_most dividing size (1 when size is 0, the replica dim)."""
    for d in range(min(size, at_most), 0, -1):
        if size % d == 0:
            return d
    return 1


def _range_config(op: Op, dim: str, n: int, first_device: int = 0) -> Config:
    """Split ``op`` along ``dim`` over up to ``n`` consecutive devices."""
    if dim not in op.dim_names:
        return Config.single(first_device)
    d = _largest_divisor(op.dim(dim).size, n)
    return Config({dim: d} if d > 1 else {}, tuple(range(first_device, first_device + d)))


def _finish(graph: OpGraph, cluster: Cluster, configs: dict[str, Config], algorithm: str,
            options: Mapping[str, Any], notes: list[str] | None = None, **settings: Any) -> Strategy:
    found_by: dict[str, Any] = {"algorithm": f"baseline:{algorithm}", "options": dict(options)}
    if notes:
        found_by["notes"] = list(notes)
    s = Strategy(configs, model_name=graph.name, model_fingerprint=graph.fingerprint,
                 cluster_name=cluster.name, cluster_devices=cluster.num_devices, found_by=found_by, **settings)
    return check_strategy(s, graph, cluster, f"baseline {algorithm}")


def _microbatches(graph: OpGraph, dp: int, micro_batch: int | None) -> int:
    """Gradient-accumulation steps (1 without a micro-batch; :func:`engine.layout.microbatch_count`)."""
    return 1 if micro_batch is None else microbatch_count(graph.batch_size, dp, micro_batch)

# --------------------------------------------------------------------------- simple ones


def data_parallel(graph: OpGraph, cluster: Cluster, micro_batch: int | None = None) -> Strategy:
    """Every op split along its sample dim over all devices (fewer when the batch is not
    divisible by the device count: the largest divisor of the batch is used).

    ``micro_batch`` adds gradient accumulation: batch / (micro_batch x devices) steps.
    """
    n = _largest_divisor(graph.batch_size, cluster.num_devices)
    configs = {op.name: _range_config(op, "sample", n) for op in graph.ops}
    m = _microbatches(graph, n, micro_batch)
    return _finish(graph, cluster, configs, "data-parallel", {"micro_batch": micro_batch},
                   pipeline=PipelineSettings(1, m))


def model_parallel(graph: OpGraph, cluster: Cluster) -> Strategy:
    """Each op whole on one device; the op sequence (topological order) is cut into one
    contiguous run per device with about equal forward + backward FLOPs."""
    n = cluster.num_devices
    work = [op.fwd_flops + op.bwd_flops for op in graph.ops]
    total = sum(work) or 1.0
    configs, done = {}, 0.0
    for op, w in zip(graph.ops, work):
        centre = done + w / 2
        configs[op.name] = Config.single(min(n - 1, int(centre / total * n)))
        done += w
    return _finish(graph, cluster, configs, "model-parallel", {})


#: Op kinds FlexFlow's expert strategy treats as fully-connected layers (model parallel). An
#: embedding is a fully-connected layer applied to one-hot inputs, and model-parallel
#: embeddings are what keep the expert strategy's traffic for NMT well below data
#: parallelism's (FlexFlow §8.2: 24.2 GB against 65.8 GB per iteration).
_FC_KINDS = ("linear", "embedding")


def expert(graph: OpGraph, cluster: Cluster) -> Strategy:
    """FlexFlow's expert-designed baseline (Jia et al. SysML'19 §8.1, after Krizhevsky's
    "one weird trick", 2014): data parallelism for convolutional, recurrent and all other
    layers, model parallelism (split output features over the devices) for fully-connected
    layers and embeddings."""
    n = cluster.num_devices
    dp = _largest_divisor(graph.batch_size, n)
    configs = {}
    for op in graph.ops:
        if op.kind in _FC_KINDS:
            configs[op.name] = _range_config(op, "feature", n)
        else:
            configs[op.name] = _range_config(op, "sample", dp)
    return _finish(graph, cluster, configs, "expert", {})


# --------------------------------------------------------------------------- Megatron


def megatron(graph: OpGraph, cluster: Cluster, tp: int = 1, pp: int = 1, dp: int | None = None,
             micro_batch: int | None = None, vpp: int = 1, recompute: str = "none",
             sequence_parallel: bool = False, schedule: str | None = None,
             layers_per_stage: Sequence[int] | None = None, stage_mesh: Sequence[int] | None = None,
             zero_stage: int = 0, cp: int = 1, fp8: bool = False, tp_comm_overlap: bool = False,
             overlap_grad_reduce: bool = True, overlap_param_gather: bool = False,
             offload_optimizer: str = "none", grad_reduce_in_fp32: bool = True, fp8_params: bool = False,
             ep: int = 1, etp: int = 1, recompute_modules: Sequence[str] = (), moe_comm_overlap: bool = False
             ) -> Strategy:
    """Megatron-LM's 3-D parallelism (Narayanan et al. SC'21): the strategy of the
    :class:`engine.layout.Layout` these options make (:func:`build_layout`, where the layout
    is described); the keyword form the CLI and the app call."""
    lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, vpp=vpp, micro_batch=micro_batch, schedule=schedule,
                 recompute=recompute, sequence_parallel=sequence_parallel, tp_comm_overlap=tp_comm_overlap,
                 zero_stage=zero_stage, fp8=fp8, layers_per_stage=layers_per_stage, stage_mesh=stage_mesh,
                 overlap_grad_reduce=overlap_grad_reduce, overlap_param_gather=overlap_param_gather,
                 grad_reduce_in_fp32=grad_reduce_in_fp32, fp8_params=fp8_params,
                 offload_optimizer=offload_optimizer, ep=ep, etp=etp, recompute_modules=tuple(recompute_modules),
                 moe_comm_overlap=moe_comm_overlap)
    return build_layout(graph, cluster, lay)


def build_layout(graph: OpGraph, cluster: Cluster, layout: Layout) -> Strategy:
    """The strategy a :class:`engine.layout.Layout` makes: Megatron-LM's 3-D parallelism
    (Narayanan et al. SC'21), tensor parallel of degree ``tp`` inside each layer, ``pp``
    pipeline stages of equal layer counts (``vpp`` model chunks per stage for the interleaved
    schedule), ``dp`` data-parallel replicas (default: the devices left over).

    Ranks are laid out as Megatron-Core does (tp, cp, dp, pp from the fastest): tensor-parallel
    ranks adjacent (inside a node), then context-parallel, then data-parallel, then pipeline:
    device = stage*(dp*cp*tp) + dp_rank*(cp*tp) + cp_rank*tp + tp_rank.

    ``cp`` > 1 is context parallelism (Megatron-Core's ``--context-parallel-size``; Liu et al.
    2023, ring attention): every op's sequence (``length``) is split over the cp ranks, each
    rank's attention reads every rank's keys and values (moved to it, as the ring's
    point-to-point exchange moves them, and their gradients back), causal work is balanced
    (Megatron-Core gives each rank two mirrored chunks), and weights are replicated over
    dp x cp: their gradients are synchronised (and ZeRO shards) over that group.

    ``fp8``: the linear layers' GEMMs in fp8 (Transformer Engine, :attr:`Strategy.fp8`).
    ``tp_comm_overlap``: Megatron-Core's --tp-comm-overlap (needs ``sequence_parallel``).

    Layers split evenly over the pp*vpp chunks when they divide, else by
    :func:`balanced_layers`; ``layers_per_stage`` (one count per stage, no interleaving) sets
    the split, and ``stage_mesh`` puts stage s on the s'-th block of dp*tp devices,
    s' = stage_mesh[s] (the pipeline planner's choices, :mod:`engine.search.pipeline`).

    ``zero_stage`` shards over each data-parallel group: 1 the optimizer state (Megatron-LM's
    distributed optimizer), 2 also the gradients, 3 also the parameters (FSDP with tensor and
    pipeline parallelism, Llama 3's layout without context parallelism). ``gather_unit`` and
    ``shard_group`` (hybrid sharding) are carried onto the strategy.

    Raises
    ------
    ValueError
        Why the layout cannot be built here (:func:`engine.layout.layout_problem`: tp*pp*dp
        exceeds the devices, the batch does not split into micro-batches, the layers do not
        split into pp*vpp chunks, ...).
    """
    lay = layout.resolved(graph, cluster)
    tp, pp, cp, dp, vpp = lay.tp, lay.pp, lay.cp, lay.dp, lay.vpp
    micro_batch, recompute, sequence_parallel = lay.micro_batch, lay.recompute, lay.sequence_parallel
    m = microbatch_count(graph.batch_size, dp, micro_batch)
    layers_per_stage = list(lay.layers_per_stage) if lay.layers_per_stage is not None else None
    chunk = layer_chunks(graph, pp * vpp, layers_per_stage if vpp == 1 else None)
    mesh = list(lay.stage_mesh) if lay.stage_mesh is not None else list(range(pp))
    if sorted(mesh) != list(range(pp)):
        raise ValueError(f"stage_mesh must be a permutation of 0..{pp - 1}, got {mesh}")
    plan, notes = tp_plan(graph, tp, sequence_parallel)
    configs = {}
    made: dict[tuple, Config] = {}  # the layers' ops repeat a few configs (GPT-3: 2,410 ops, 64 configs)
    for op in graph.ops:
        base = mesh[chunk[op.name] % pp] * dp * cp * tp
        if op.kind == "experts":
            key = ("experts", base)
            if key not in made:
                made[key] = expert_config(op, dp, cp, tp, lay.ep, lay.etp, range(base, base + dp * cp * tp))
            configs[op.name] = made[key]
            continue
        dim, deg = plan[op.name]
        key = (tuple(d.name for d in op.dims if d.name in ("sample", "length", dim)), dim, deg, base)
        if key not in made:
            made[key] = mesh_config(op, dim, deg, dp, cp, tp, range(base, base + dp * cp * tp))
        configs[op.name] = made[key]
    options = {"tp": tp, "pp": pp, "dp": dp, "micro_batch": micro_batch, "vpp": vpp, "recompute": recompute,
               "sequence_parallel": sequence_parallel}
    if lay.recompute_modules:
        options["recompute_modules"] = list(lay.recompute_modules)
    if lay.zero_stage:
        options["zero_stage"] = lay.zero_stage
    if cp > 1:
        options["cp"] = cp
    if lay.ep > 1 or lay.etp > 1:
        options.update(ep=lay.ep, etp=lay.etp)
    if lay.fp8:
        options["fp8"] = True
    if lay.tp_comm_overlap:
        options["tp_comm_overlap"] = True
    switches = {k: getattr(lay, k) for k in SWITCHES if getattr(lay, k) != getattr(Layout, k)}
    options.update(switches)
    if pp * vpp > 1 and layers_per_stage is None:
        counts = balanced_layers(len(layer_blocks(graph)), pp * vpp)
        if len(set(counts)) > 1:
            notes = [*notes, f"layers per chunk {counts} (uneven: the first and last chunks also hold the "
                             "embedding and the output layer)"]
    s = _finish(graph, cluster, configs, "megatron", options, notes,
                pipeline=PipelineSettings(pp, m, lay.schedule, vpp),
                stage_of=chunk if pp > 1 else {}, recompute=recompute, sequence_parallel=sequence_parallel,
                recompute_modules=lay.recompute_modules,
                zero_stage=lay.zero_stage, fp8=lay.fp8, tp_comm_overlap=lay.tp_comm_overlap,
                **{k: getattr(lay, k) for k in SWITCHES})
    if lay.gather_unit != "block" or lay.shard_group:
        s = replace(s, gather_unit=lay.gather_unit, shard_group=lay.shard_group)
    return s



def fsdp(graph: OpGraph, cluster: Cluster, zero_stage: int = 3, micro_batch: int | None = None, tp: int = 1,
         recompute: str = "none", pp: int = 1, gather_unit: str = "block", cp: int = 1,
         fp8: bool = False, shard_group: int = 0, overlap_grad_reduce: bool = True,
         offload_optimizer: str = "none", offload_params: str = "none", sequence_parallel: bool = False,
         tp_comm_overlap: bool = False, ep: int = 1, etp: int = 1) -> Strategy:
    """PyTorch FSDP / ZeRO (Rajbhandari et al. SC'20; Zhao et al. VLDB'23): data parallel
    over every device (or over ``devices / (tp x pp)`` groups with Megatron tensor and
    pipeline parallelism around it, the 3-D / 4-D layouts of torchtitan and Llama 3),
    parameters, gradients and optimizer state sharded by ``zero_stage``; ``micro_batch`` sets
    gradient accumulation (the micro-batches of the pipeline when ``pp`` > 1); ``cp`` splits
    the sequence over context-parallel ranks (torchtitan's 4-D layout: FSDP shards over
    dp x cp). ``gather_unit`` "op" gathers each op's parameters on its own (DeepSpeed ZeRO-3) instead
    of each transformer block's (PyTorch FSDP). ``shard_group`` k > 0 is hybrid sharding
    (HYBRID_SHARD / HSDP, MiCS): shards within groups of k consecutive data-parallel ranks,
    replicas across them. ``offload_optimizer`` / ``offload_params``: ZeRO-Offload and
    ZeRO-Infinity (:attr:`engine.strategy.Strategy.offload_optimizer`). ``sequence_parallel``
    and ``tp_comm_overlap`` with ``tp`` > 1: torchtitan's 2-D layout (its tensor parallelism
    shards the norms' sequence, and "async TP" overlaps its collectives with the GEMMs).
    ``ep`` / ``etp``: a mixture-of-experts model's expert parallelism folded onto the ranks as
    in :func:`build_layout`, the experts sharded over their expert data-parallel ranks
    (torchtitan's FSDP + EP)."""
    if zero_stage not in (1, 2, 3):
        raise ValueError(f"zero_stage must be 1, 2 or 3, got {zero_stage!r}")
    if gather_unit not in GATHER_UNITS:
        raise ValueError(f"gather_unit must be one of {', '.join(GATHER_UNITS)}, got {gather_unit!r}")
    if not isinstance(shard_group, int) or shard_group < 0:
        raise ValueError(f"shard_group must be a non-negative integer, got {shard_group!r}")
    if shard_group and zero_stage < 2:
        raise ValueError(f"hybrid sharding (shard_group {shard_group}) needs ZeRO stage 2 or 3, got {zero_stage}")
    s = build_layout(graph, cluster, Layout(tp=tp, pp=pp, cp=cp, micro_batch=micro_batch, recompute=recompute,
                                            zero_stage=zero_stage, fp8=fp8, gather_unit=gather_unit,
                                            shard_group=shard_group, overlap_grad_reduce=overlap_grad_reduce,
                                            offload_optimizer=offload_optimizer,
                                            offload_params=offload_params, sequence_parallel=sequence_parallel,
                                            tp_comm_overlap=tp_comm_overlap, ep=ep, etp=etp))
    opts = dict(s.found_by["options"])
    opts.update(zero_stage=zero_stage)
    if gather_unit != "block":
        opts.update(gather_unit=gather_unit)
    if shard_group:
        opts.update(shard_group=shard_group)
    for k in ("vpp",) + (("sequence_parallel",) if not sequence_parallel else ()) + (("pp",) if pp == 1 else ()):
        opts.pop(k, None)
    found_by = {"algorithm": "baseline:fsdp", "options": opts}
    if "notes" in s.found_by:
        found_by["notes"] = s.found_by["notes"]
    s = replace(s, found_by=found_by)
    return check_strategy(s, graph, cluster, "baseline fsdp") if shard_group else s


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Baseline:
    name: str
    build: Callable[..., Strategy]
    summary: str
    options: tuple[str, ...]


BASELINES: dict[str, Baseline] = {
    b.name: b
    for b in [
        Baseline("data-parallel", data_parallel, "sample dim split over all devices", ("micro_batch",)),
        Baseline("model-parallel", model_parallel, "ops placed on devices in order, balanced by FLOPs", ()),
        Baseline("expert", expert, "FlexFlow's expert: data-parallel conv/recurrent, model-parallel FC", ()),
        Baseline("megatron", megatron, "Megatron-LM tensor x pipeline x data parallelism",
                 ("tp", "pp", "dp", "micro_batch", "vpp", "recompute", "sequence_parallel", "schedule",
                  "layers_per_stage", "stage_mesh", "zero_stage", "cp", "fp8", "tp_comm_overlap",
                  "overlap_grad_reduce", "overlap_param_gather", "offload_optimizer", "grad_reduce_in_fp32",
                  "fp8_params", "ep", "etp", "recompute_modules", "moe_comm_overlap")),
        Baseline("fsdp", fsdp, "FSDP / ZeRO sharded data parallelism (optionally with tp and pp)",
                 ("zero_stage", "micro_batch", "tp", "pp", "cp", "recompute", "gather_unit", "fp8",
                  "shard_group", "overlap_grad_reduce", "offload_optimizer", "offload_params", "sequence_parallel",
                  "tp_comm_overlap", "ep", "etp")),
    ]
}



def make_baseline(kind: str, graph: OpGraph, cluster: Cluster, **options: Any) -> Strategy:
    """Build baseline ``kind``; options left as ``None`` are ignored.

    Raises
    ------
    ValueError
        For an unknown kind, an option the kind does not take, or options it cannot honour.
    """
    if kind not in BASELINES:
        raise ValueError(f"unknown strategy kind {kind!r}; kinds: {', '.join(BASELINES)}")
    b = BASELINES[kind]
    # (a False flag is "not given" unless it turns off a switch that is on by default)
    given = {k: v for k, v in options.items() if v is not None and (v is not False or k in ON_BY_DEFAULT)}
    extra = sorted(set(given) - set(b.options))
    if extra:
        flags = ", ".join("--" + e.replace("_", "-") for e in extra)
        takes = ", ".join("--" + o.replace("_", "-") for o in b.options) or "no options"
        raise ValueError(f"{kind} does not take {flags}; it takes {takes}")
    return b.build(graph, cluster, **given)
