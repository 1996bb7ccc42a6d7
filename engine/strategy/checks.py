"""Whether a strategy can run a model on a cluster: every problem, each with its path in the
strategy file (``ops.conv1.degrees.sample: 3 does not divide sample (64)``), found in one pass
so that a user fixes a file at once.

:func:`validate_strategy` runs the checks in the order a reader meets a strategy file: what it
was made for, the pipeline, the settings (recomputation, ZeRO, experts, sharding, the overlap
and offload switches, precision), then every op's config and stage.
"""

from __future__ import annotations

import math

from ..cluster import Cluster
from ..errors import Problem, ValidationError
from ..graph import OpGraph, layer_blocks
from .config import check_config
from .core import FP8_LIBRARIES, GATHER_UNITS, KERNELS, MAX_MICROBATCHES, MAX_VIRTUAL_STAGES, OFFLOAD_DEVICES, OPTIMIZER_STATES, RECOMPUTE, \
    RECOMPUTE_MODULES, SCHEDULES, Strategy

__all__ = ["validate_strategy", "check_strategy", "settings_problems"]


def validate_strategy(strategy: Strategy, graph: OpGraph, cluster: Cluster) -> list[Problem]:
    """Every reason ``strategy`` cannot run ``graph`` on ``cluster``; empty when valid."""
    problems = _made_for(strategy, graph, cluster) + _pipeline(strategy)
    problems += _settings(strategy, graph) + _expert_loads(strategy, graph) + _shard_group(strategy, graph)
    problems += _switches(strategy) + _precision(strategy, graph, cluster)
    found, microbatches = _limits(strategy, graph)
    problems += found + _ops(strategy, graph, cluster, microbatches)
    if strategy.pipeline.stages > 1:
        problems += _check_stages(strategy, graph)
    return problems


def settings_problems(strategy: Strategy, graph: OpGraph, cluster: Cluster) -> list[Problem]:
    """The reasons :func:`validate_strategy` gives for ``strategy``'s settings (recomputation,
    ZeRO, the switches, precision, hybrid sharding, the routing what-if), without its ops'
    configs, its stages' layers or its pipeline's sizes: what a composed prediction
    (:mod:`engine.sim.hier`), which builds only a shortened reference of the layout, checks of
    the layout itself."""
    return (_settings(strategy, graph) + _expert_loads(strategy, graph) + _shard_group(strategy, graph)
            + _switches(strategy) + _precision(strategy, graph, cluster))


def check_strategy(strategy: Strategy, graph: OpGraph, cluster: Cluster, source: str | None = None) -> Strategy:
    """Return ``strategy`` when valid; raise :class:`ValidationError` listing every problem."""
    problems = validate_strategy(strategy, graph, cluster)
    if problems:
        raise ValidationError(problems, source)
    return strategy


def _made_for(strategy: Strategy, graph: OpGraph, cluster: Cluster) -> list[Problem]:
    """The model (fingerprint, op names) and the cluster size the strategy was made for."""
    problems: list[Problem] = []
    add = problems.append
    if strategy.model_fingerprint and strategy.model_fingerprint != graph.fingerprint:
        add(Problem("model.fingerprint",
                    f"the strategy was made for model {strategy.model_name!r} with fingerprint "
                    f"{strategy.model_fingerprint}, but {graph.name!r} has {graph.fingerprint}"))
    if strategy.cluster_devices and strategy.cluster_devices != cluster.num_devices:
        add(Problem("cluster.devices",
                    f"the strategy was made for {strategy.cluster_devices} devices "
                    f"({strategy.cluster_name}), but {cluster.name} has {cluster.num_devices}"))
    for name in strategy.configs:
        if name not in graph:
            add(Problem(f"ops.{name}", f"no op named {name!r} in model {graph.name!r}"))
    return problems


def _pipeline(strategy: Strategy) -> list[Problem]:
    """Stages, microbatches, virtual stages and the schedule."""
    problems: list[Problem] = []
    add = problems.append
    pipe = strategy.pipeline
    for fld, v in (("stages", pipe.stages), ("microbatches", pipe.microbatches),
                   ("virtual_stages", pipe.virtual_stages)):
        if not isinstance(v, int) or v < 1:
            add(Problem(f"pipeline.{fld}", f"must be a positive integer, got {v!r}"))
    if pipe.schedule not in SCHEDULES:
        add(Problem("pipeline.schedule", f"unknown schedule {pipe.schedule!r}; valid: {', '.join(SCHEDULES)}"))
    elif pipe.schedule == "interleaved":
        if pipe.virtual_stages < 2:
            add(Problem("pipeline.virtual_stages", "the interleaved schedule needs virtual_stages >= 2"))
        if isinstance(pipe.stages, int) and pipe.stages > 1 and pipe.microbatches % pipe.stages:
            add(Problem("pipeline.microbatches",
                        f"the interleaved schedule needs microbatches ({pipe.microbatches}) to be a multiple "
                        f"of stages ({pipe.stages}) (Narayanan et al. SC'21 §2.2.2)"))
    elif pipe.virtual_stages != 1:
        add(Problem("pipeline.virtual_stages", f"virtual_stages > 1 needs schedule 'interleaved', got {pipe.schedule!r}"))
    return problems


def _settings(strategy: Strategy, graph: OpGraph) -> list[Problem]:
    """Recomputation (and Megatron-Core's modules), the ZeRO stage and what ZeRO-3 gathers."""
    problems: list[Problem] = []
    add = problems.append
    if strategy.recompute not in RECOMPUTE:
        add(Problem("recompute", f"unknown recompute {strategy.recompute!r}; valid: {', '.join(RECOMPUTE)}"))
    mods = strategy.recompute_modules
    bad = [m for m in mods if m not in RECOMPUTE_MODULES]
    if bad:
        add(Problem("recompute_modules", f"unknown module {str(bad[0])[:40]!r}; valid: {', '.join(RECOMPUTE_MODULES)}"))
    elif mods and strategy.recompute != "selective":
        add(Problem("recompute_modules", f"recompute modules need recompute 'selective' (Megatron's "
                                         f"--recompute-granularity selective), got {strategy.recompute!r}"))
    if strategy.zero_stage not in (0, 1, 2, 3):
        add(Problem("zero_stage", f"must be 0, 1, 2 or 3, got {strategy.zero_stage!r}"))
    if strategy.gather_unit not in GATHER_UNITS:
        add(Problem("gather_unit", f"must be one of {', '.join(GATHER_UNITS)}, got {strategy.gather_unit!r}"))
    return problems


def _expert_loads(strategy: Strategy, graph: OpGraph) -> list[Problem]:
    """The routing-imbalance what-if's shares."""
    problems: list[Problem] = []
    add = problems.append
    loads = strategy.expert_loads
    if loads is not None:
        sizes = {op.attrs["num_experts"] for op in graph.ops if op.kind == "experts"}
        if not sizes:
            add(Problem("expert_loads", f"a routing-imbalance what-if needs a mixture-of-experts model; "
                                        f"{graph.name!r} has no experts op"))
        elif len(loads) not in sizes:
            add(Problem("expert_loads", f"{len(loads)} expert shares for a model with "
                                        f"{' or '.join(str(n) for n in sorted(sizes))} experts per layer"))
        elif sum(loads) <= 0 or any(not math.isfinite(x) or x < 0 for x in loads):
            add(Problem("expert_loads", "expert shares must be finite, non-negative and not all zero"))
    return problems


def _shard_group(strategy: Strategy, graph: OpGraph) -> list[Problem]:
    """Hybrid sharding's group."""
    problems: list[Problem] = []
    add = problems.append
    k = strategy.shard_group
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        add(Problem("shard_group", f"must be a non-negative integer, got {k!r}"))
    elif k and strategy.zero_stage < 2:
        add(Problem("shard_group", f"hybrid sharding (shard_group {k}) needs ZeRO stage 2 or 3, "
                                   f"got {strategy.zero_stage}"))
    elif k:
        for name, cfg in strategy.configs.items():
            if name in graph and graph[name].param_count:
                group = cfg.degree("sample") * cfg.degree("length")
                if group % k:
                    add(Problem("shard_group", f"{k} does not divide the {group} data-parallel ranks that hold "
                                               f"{name!r}'s parameters"))
                    break
    return problems


def _switches(strategy: Strategy) -> list[Problem]:
    """The overlap, offload and buffer switches."""
    problems: list[Problem] = []
    add = problems.append
    if not isinstance(strategy.tp_comm_overlap, bool):
        add(Problem("tp_comm_overlap", f"must be true or false, got {strategy.tp_comm_overlap!r}"))
    elif strategy.tp_comm_overlap and not strategy.sequence_parallel:
        add(Problem("tp_comm_overlap", "overlapping tensor-parallel communication with GEMMs (Transformer "
                                       "Engine's userbuffers) needs sequence parallelism"))
    for name in ("overlap_grad_reduce", "overlap_param_gather"):
        if not isinstance(getattr(strategy, name), bool):
            add(Problem(name, f"must be true or false, got {getattr(strategy, name)!r}"))
    for name, need in (("offload_optimizer", 1), ("offload_params", 3)):
        where = getattr(strategy, name)
        if where not in OFFLOAD_DEVICES:
            add(Problem(name, f"must be one of {', '.join(OFFLOAD_DEVICES)}, got {where!r}"))
        elif where != "none" and strategy.zero_stage not in range(need, 4):
            add(Problem(name, f"offloading {'the optimizer' if need == 1 else 'parameters'} to {where} needs ZeRO "
                              f"stage {need}{' or above' if need < 3 else ''} (DeepSpeed's rule), got "
                              f"{strategy.zero_stage}"))
    for name in ("grad_reduce_in_fp32", "fp8_params"):
        if not isinstance(getattr(strategy, name), bool):
            add(Problem(name, f"must be true or false, got {getattr(strategy, name)!r}"))
    acc = getattr(strategy, "accumulate_unsharded", False)
    if not isinstance(acc, bool):
        add(Problem("accumulate_unsharded", f"must be true or false, got {acc!r}"))
    elif acc and strategy.zero_stage not in (2, 3):
        add(Problem("accumulate_unsharded", "accumulating unsharded gradients (FSDP's no_sync) applies to ZeRO-2 and "
                                            f"ZeRO-3, got ZeRO stage {strategy.zero_stage}"))
    if strategy.fp8_params is True and strategy.fp8 is not True:
        add(Problem("fp8_params", "fp8 parameters need fp8 GEMMs: set fp8 too, or turn fp8_params off"))
    return problems


def _precision(strategy: Strategy, graph: OpGraph, cluster: Cluster) -> list[Problem]:
    """fp8 (its tensor cores) and the model's precision on every device type."""
    problems: list[Problem] = []
    add = problems.append
    if not isinstance(strategy.fp8, bool):
        add(Problem("fp8", f"must be true or false, got {strategy.fp8!r}"))
    elif strategy.fp8:
        used = {cluster.devices[d].type for d in strategy.devices_used() if 0 <= d < cluster.num_devices}
        lacking = sorted(n for n in used if "fp8" not in cluster.device_types[n].peak_flops_per_s)
        if lacking:
            add(Problem("fp8", f"fp8 GEMMs need fp8 tensor cores; the {', '.join(lacking)} of {cluster.name} "
                               f"{'have' if len(lacking) > 1 else 'has'} none (H100 and H200 do)"))
    state = getattr(strategy, "optimizer_state", "fp32")
    if state not in OPTIMIZER_STATES:
        add(Problem("optimizer_state", f"must be one of {', '.join(OPTIMIZER_STATES)}, got {state!r}"))
    elif state != "fp32" and graph.precision not in ("bf16", "fp16"):
        add(Problem("optimizer_state", f"{state} optimizer state is for a half-precision model; the model "
                                       f"{graph.name!r} trains in {graph.precision} (its optimizer state is fp32)"))
    elif state == "bf16" and graph.precision != "bf16":
        add(Problem("optimizer_state", f"bf16 optimizer state (no fp32 master copy) needs a bf16 model; the model "
                                       f"{graph.name!r} is {graph.precision} (use bf16-moments)"))
    elif state != "fp32" and strategy.offload_optimizer != "none":
        add(Problem("optimizer_state", f"the offloaded optimizer keeps fp32 state on the host (DeepSpeed's CPU "
                                       f"Adam): {state} optimizer state does not apply; turn one of them off"))
    kernels = getattr(strategy, "kernels", "fused")
    if kernels not in KERNELS:
        add(Problem("kernels", f"must be one of {', '.join(KERNELS)}, got {kernels!r}"))
    lib = getattr(strategy, "fp8_library", "te")
    if lib not in FP8_LIBRARIES:
        add(Problem("fp8_library", f"must be one of {', '.join(FP8_LIBRARIES)}, got {lib!r}"))
    elif lib != "te" and strategy.fp8 is not True:
        add(Problem("fp8_library", f"{lib} runs fp8 GEMMs: set fp8 too, or leave fp8_library at te"))
    problems += _offload_problems(strategy, graph)
    for precision in {graph.precision}:
        for t in {d.type for d in cluster.devices}:
            if precision not in cluster.device_types[t].peak_flops_per_s:
                add(Problem("cluster", f"{t} has no {precision} peak; the model {graph.name!r} runs in {precision}"))
    return problems


def _offload_problems(strategy: Strategy, graph: OpGraph) -> list[Problem]:
    """Megatron-Core's rules for activation offloading (``TransformerConfig.__post_init__``,
    core_v0.19.0 l. 1707-1722): fewer layers than the model has, no pipeline parallelism, no
    recomputation."""
    n = getattr(strategy, "offload_activations", 0)
    if n == 0:
        return []
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return [Problem("offload_activations", f"must be a whole number of layers (0: none), got {n!r}")]
    layers = len(layer_blocks(graph))
    if n >= max(layers, 1):
        return [Problem("offload_activations", f"{n} layers: offloading is for fewer layers than the model's "
                                               f"{layers} (Megatron-Core's rule)")]
    if strategy.pipeline.stages > 1:
        return [Problem("offload_activations", f"activation offloading with {strategy.pipeline.stages} pipeline "
                                               "stages: Megatron-Core offloads without pipeline parallelism only")]
    if strategy.recompute != "none":
        return [Problem("offload_activations", f"activation offloading with {strategy.recompute} recomputation: "
                                               "Megatron-Core offloads only without recomputation")]
    return []


def _limits(strategy: Strategy, graph: OpGraph) -> tuple[list[Problem], int]:
    """The most microbatches and virtual stages a strategy may have, and the microbatches
    the op checks use (1 when the strategy's number is out of range)."""
    problems: list[Problem] = []
    add = problems.append
    pipe = strategy.pipeline
    microbatches = pipe.microbatches if isinstance(pipe.microbatches, int) and pipe.microbatches > 0 else 1
    if microbatches > min(MAX_MICROBATCHES, graph.batch_size):
        add(Problem("pipeline.microbatches",
                    f"{microbatches:,} microbatches: at most {min(MAX_MICROBATCHES, graph.batch_size):,} (each holds at "
                    f"least one sample of the batch of {graph.batch_size:,}; the limit is {MAX_MICROBATCHES:,})"))
        microbatches = 1
    if isinstance(pipe.virtual_stages, int) and pipe.virtual_stages > MAX_VIRTUAL_STAGES:
        add(Problem("pipeline.virtual_stages", f"at most {MAX_VIRTUAL_STAGES:,}, got {pipe.virtual_stages:,}"))
    return problems, microbatches


def _ops(strategy: Strategy, graph: OpGraph, cluster: Cluster, microbatches: int) -> list[Problem]:
    """Every op's config (degrees, devices) and pipeline stage."""
    problems: list[Problem] = []
    add = problems.append
    pipe = strategy.pipeline
    checked: set[int] = set()  # device tuples found valid (ops of repeated layers share them)
    clean: set[tuple] = set()  # (op signature, dims, degrees) found without a problem
    for op in graph.ops:
        at = f"ops.{op.name}"
        config = strategy.configs.get(op.name)
        if config is None:
            add(Problem(at, "no config for this op"))
            continue
        try:  # (an op of a repeated layer with the config of one checked before: its devices are all to check)
            key = (op.signature, op.dims, tuple(config.degrees.items()))
        except TypeError:  # (an unhashable degree: checked in full, which says what is wrong)
            key = None
        if key not in clean or id(config.devices) not in checked or len(config.devices) != config.num_partitions:
            found = check_config(op, config, cluster, at, microbatches, checked)
            if not found and key is not None:
                clean.add(key)
            problems += found
        if strategy.stage_of or pipe.stages > 1:
            stage = strategy.stage_of.get(op.name)
            if stage is None:
                add(Problem(f"{at}.stage", f"no pipeline stage given (the strategy has {pipe.stages} stages)"))
            elif not isinstance(stage, int) or not 0 <= stage < pipe.stages * pipe.virtual_stages:
                add(Problem(f"{at}.stage", f"stage {stage!r} is out of range "
                                           f"0..{pipe.stages * pipe.virtual_stages - 1}"))
    return problems


def _check_stages(strategy: Strategy, graph: OpGraph) -> list[Problem]:
    problems = []
    stage_devices: dict[int, set[int]] = {}
    for op in graph.ops:
        s = strategy.stage_of.get(op.name)
        c = strategy.configs.get(op.name)
        if s is None or c is None:
            continue
        stage_devices.setdefault(s, set()).update(c.devices)
        for ref in op.inputs:
            ps = strategy.stage_of.get(ref.op)
            if ps is not None and isinstance(s, int) and isinstance(ps, int) and ps > s:
                problems.append(Problem(f"ops.{op.name}.stage",
                                        f"stage {s} reads {ref.op!r} from a later stage {ps}"))
    # Stages own disjoint devices; with the interleaved schedule, chunk c runs on the
    # devices of stage c mod stages, so only chunks of different stages must be disjoint.
    n = strategy.pipeline.stages
    chunks = sorted(stage_devices)
    for i, a in enumerate(chunks):
        for b in chunks[i + 1:]:
            shared = stage_devices[a] & stage_devices[b]
            if shared and a % n != b % n:
                problems.append(Problem("ops", f"stages {a} and {b} share device(s) {sorted(shared)[:8]}"))
    return problems
