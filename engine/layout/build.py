"""A layout made a strategy: every op's config from a :class:`engine.layout.record.Layout`
(Megatron-LM's rank order, tensor-parallel dims, pipeline chunks, expert folding), the
pipeline settings and the switches carried onto the :class:`engine.strategy.Strategy`.

:func:`build_layout` is the one builder (the ``megatron`` baseline, export inference, the
what-if mapping, the searches' layout moves and seeds); :func:`fsdp` is the same layout with
ZeRO sharding recorded as PyTorch FSDP's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..cluster import Cluster
from ..errors import ValidationError
from ..graph import OpGraph
from ..graph.blocks import layer_blocks
from ..strategy import Config, PipelineSettings, Strategy, check_strategy
from ..strategy.checks import settings_problems
from .placement import balanced_layers, expert_config, layer_chunks, mesh_config, tp_plan
from .record import SWITCHES, Layout, options_for
from ..strategy.config import microbatch_count
from .rules import resolved

__all__ = ["build_layout", "build_unchecked", "fsdp", "baseline_strategy"]


def baseline_strategy(graph: OpGraph, cluster: Cluster, configs: dict[str, Config], algorithm: str,
                      options: Mapping[str, Any], notes: list[str] | None = None, *, check: bool = True,
                      **settings: Any) -> Strategy:
    """The checked strategy of a baseline: ``configs`` with ``settings``, stamped with the model,
    the cluster and how it was made (``found_by``: ``baseline:<algorithm>``, its options and notes).
    ``check`` False: neither checked nor stamped with the model's fingerprint (an internal
    strategy, :func:`build_unchecked`).

    Raises
    ------
    ValidationError
        Listing every problem, when the configs cannot run there.
    """
    found_by: dict[str, Any] = {"algorithm": f"baseline:{algorithm}", "options": dict(options)}
    if notes:
        found_by["notes"] = list(notes)
    # (unchecked, unstamped: hashing the model's ops took ~11 ms of a 150 ms composed prediction,
    # whose reference graph is new each time and whose strategy is never saved or shown)
    s = Strategy(configs, model_name=graph.name, model_fingerprint=graph.fingerprint if check else "",
                 cluster_name=cluster.name, cluster_devices=cluster.num_devices, found_by=found_by, **settings)
    return check_strategy(s, graph, cluster, f"baseline {algorithm}") if check else s


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
    return _build(graph, cluster, layout, True)


def build_unchecked(graph: OpGraph, cluster: Cluster, layout: Layout, check_settings: bool = False) -> Strategy:
    """:func:`build_layout` without :func:`engine.strategy.check_strategy`: for a caller that
    builds a layout it has already resolved and built on the whole model again on a part of
    it (:mod:`engine.sim.hier`'s reference run), or reads only its memory floor before deciding
    to simulate it (a sweep), where the whole check would only cost time; not stamped with the
    model's fingerprint either (``model_fingerprint`` empty), so not one to save.
    ``check_settings``: the layout's settings checked as :func:`build_layout` checks them
    (:func:`engine.strategy.checks.settings_problems`; :class:`~engine.errors.ValidationError`),
    not its ops' configs."""
    s = _build(graph, cluster, layout, False)
    if check_settings:
        problems = settings_problems(s, graph, cluster)
        if problems:
            raise ValidationError(problems, "the layout")
    return s


def _build(graph: OpGraph, cluster: Cluster, layout: Layout, check: bool) -> Strategy:
    lay = resolved(layout, graph, cluster)
    tp, pp, cp, dp, vpp = lay.tp, lay.pp, lay.cp, lay.dp, lay.vpp
    micro_batch, recompute, sequence_parallel = lay.micro_batch, lay.recompute, lay.sequence_parallel
    m = microbatch_count(graph.batch_size, dp, micro_batch)
    layers_per_stage = list(lay.layers_per_stage) if lay.layers_per_stage is not None else None
    chunk = layer_chunks(graph, pp * vpp, layers_per_stage if vpp == 1 else None)
    mesh = list(lay.stage_mesh) if lay.stage_mesh is not None else list(range(pp))
    if sorted(mesh) != list(range(pp)):
        raise ValueError(f"stage_mesh must be a permutation of 0..{pp - 1}, got {mesh}")
    plan, notes = tp_plan(graph, tp, sequence_parallel, lay.loss_parallel)
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
    s = baseline_strategy(graph, cluster, configs, "megatron", options, notes, check=check,
                pipeline=PipelineSettings(pp, m, lay.schedule, vpp),
                stage_of=chunk if pp > 1 else {}, recompute=recompute, sequence_parallel=sequence_parallel,
                recompute_modules=lay.recompute_modules,
                zero_stage=lay.zero_stage, fp8=lay.fp8, tp_comm_overlap=lay.tp_comm_overlap,
                **{k: getattr(lay, k) for k in SWITCHES})
    if lay.gather_unit != "block" or lay.shard_group:
        s = replace(s, gather_unit=lay.gather_unit, shard_group=lay.shard_group)
    return s


def fsdp(graph: OpGraph, cluster: Cluster, layout: Layout | None = None) -> Strategy:
    """PyTorch FSDP / ZeRO (Rajbhandari et al. SC'20; Zhao et al. VLDB'23): data parallel
    over every device (or over ``devices / (tp x pp)`` groups with Megatron tensor and
    pipeline parallelism around it, the 3-D / 4-D layouts of torchtitan and Llama 3),
    parameters, gradients and optimizer state sharded by the layout's ``zero_stage`` (1, 2 or 3;
    default layout: ZeRO-3). The layout's micro-batch sets gradient accumulation (the
    micro-batches of the pipeline when pp > 1); ``cp`` splits the sequence over
    context-parallel ranks (torchtitan's 4-D layout: FSDP shards over dp x cp). ``gather_unit``
    "op" gathers each op's parameters on their own (DeepSpeed ZeRO-3) instead of each
    transformer block's (PyTorch FSDP). ``shard_group`` k > 0 is hybrid sharding (HYBRID_SHARD /
    HSDP, MiCS): shards within groups of k consecutive data-parallel ranks, replicas across
    them. ``offload_optimizer`` / ``offload_params``: ZeRO-Offload and ZeRO-Infinity
    (:attr:`engine.strategy.Strategy.offload_optimizer`). ``sequence_parallel`` and
    ``tp_comm_overlap`` with tp > 1: torchtitan's 2-D layout (its tensor parallelism shards the
    norms' sequence, and "async TP" overlaps its collectives with the GEMMs). ``ep`` / ``etp``:
    a mixture-of-experts model's expert parallelism folded onto the ranks as in
    :func:`build_layout`, the experts sharded over their expert data-parallel ranks
    (torchtitan's FSDP + EP).

    Raises
    ------
    ValueError
        For a layout that sets what FSDP does not take (:func:`engine.layout.record.options_for`),
        a ZeRO stage other than 1-3, hybrid sharding below ZeRO-2, or a layout that cannot be
        built here.
    """
    lay = layout if layout is not None else Layout(zero_stage=3)
    taken = options_for("fsdp")
    other = [k for k in lay.to_options() if k not in taken]
    if other:
        raise ValueError(f"fsdp does not take {', '.join(other)}; it takes {', '.join(taken)}")
    if lay.zero_stage not in (1, 2, 3):
        raise ValueError(f"zero_stage must be 1, 2 or 3, got {lay.zero_stage!r}")
    if lay.shard_group and lay.zero_stage < 2:
        raise ValueError(f"hybrid sharding (shard_group {lay.shard_group}) needs ZeRO stage 2 or 3, got "
                         f"{lay.zero_stage}")
    s = build_layout(graph, cluster, lay)
    opts = dict(s.found_by["options"])
    opts.update(zero_stage=lay.zero_stage)
    if lay.gather_unit != "block":
        opts.update(gather_unit=lay.gather_unit)
    if lay.shard_group:
        opts.update(shard_group=lay.shard_group)
    dropped = ("vpp",) + (() if lay.sequence_parallel else ("sequence_parallel",)) + (("pp",) if lay.pp == 1 else ())
    for k in dropped:
        opts.pop(k, None)
    found_by = {"algorithm": "baseline:fsdp", "options": opts}
    if "notes" in s.found_by:
        found_by["notes"] = s.found_by["notes"]
    s = replace(s, found_by=found_by)
    return check_strategy(s, graph, cluster, "baseline fsdp") if lay.shard_group else s
