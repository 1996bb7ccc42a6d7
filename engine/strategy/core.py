"""Configs and strategies: how every operator is partitioned and placed.

A :class:`Config` is FlexFlow's parallelization configuration of one op (Jia et al.
SysML'19, §4): a degree for each parallel dim and the device of each partition. Partitions
are numbered row-major over the op's dims in the order :attr:`engine.graph.Op.dims` lists
them (sample first, the replica dim last); ``devices[k]`` runs partition ``k``.

A :class:`Strategy` maps every op to a config and adds what spans ops: pipeline settings
(stages, microbatches, schedule), activation recomputation, ZeRO/FSDP parameter sharding
(Rajbhandari et al. SC'20: stage 1 shards optimizer state, 2 also gradients, 3 also
parameters) and Megatron's sequence parallelism (Korthikanti et al. 2022).

:func:`validate_strategy` lists every problem with its path in the strategy file
(``ops.conv1.degrees.sample: 3 does not divide sample (64)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping


from .device_runs import (check_runs, devices_of_entry)

from ..cluster import Cluster
from ..errors import Problem, ValidationError
from .config import Config, PipelineSettings
from .config import check_config
from ..graph import Op, OpGraph

__all__ = ["selective_recompute_reruns", "RECOMPUTE_MODULES", "Strategy", "SCHEDULES", "RECOMPUTE", "OFFLOAD_DEVICES",
           "validate_strategy", "check_strategy", "strategy_from_dict", "MAX_MICROBATCHES", "MAX_VIRTUAL_STAGES",
           "GATHER_UNITS"]

SCHEDULES = ("gpipe", "1f1b", "interleaved")
#: Activation recomputation policies: ``selective`` is Korthikanti et al.'s (the attention
#: core), ``selective-op`` torchtitan's per-op selective checkpointing
#: (:func:`engine.strategy.recompute.op_checkpoint_saved`), ``full`` every layer from its input.
RECOMPUTE = ("none", "selective", "full", "selective-op")
#: Megatron-Core's ``--recompute-modules`` (with ``--recompute-granularity selective``; its
#: default is ``core_attn``): which parts of each layer rerun their forward before their
#: backward instead of keeping their activations (:func:`engine.strategy.recompute.recomputed_ops`).
RECOMPUTE_MODULES = ("core_attn", "mlp", "moe", "moe_act", "shared_experts", "layernorm", "mla_up_proj")


def selective_recompute_reruns(graph: OpGraph, op: Op) -> bool:
    """Whether selective recomputation reruns ``op``'s forward before its backward (and so
    does not keep its activations): the attention core between the QK^T matmul and the
    context matmul, with the dropout on the attention probabilities (Korthikanti et al. 2022
    §5). One rule for the task-graph builder and the memory model."""
    return op.kind in ("batch_matmul", "softmax") or (
        op.kind == "dropout" and any(graph[r.op].kind == "softmax" for r in op.inputs))

#: Most microbatches an iteration may be cut into (each one multiplies the tasks to
#: simulate; Megatron's GPT-3 175B runs 96).
MAX_MICROBATCHES = 65536
#: Most model chunks per pipeline stage (interleaved 1F1B; Megatron uses 2 to 12).
MAX_VIRTUAL_STAGES = 1024
#: What ZeRO-3 gathers at once (:attr:`Strategy.gather_unit`).
GATHER_UNITS = ("block", "op")
#: Where ZeRO-Offload / ZeRO-Infinity keep what they offload (:attr:`Strategy.offload_optimizer`,
#: :attr:`Strategy.offload_params`): DeepSpeed's ``offload_optimizer.device`` and
#: ``offload_param.device`` values (Ren et al. ATC'21; Rajbhandari et al. SC'21).
OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def _json_safe(value: Any) -> Any:
    """``value`` with non-finite floats as None (JSON has no Infinity: a search that found
    nothing that fits records its cost as null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


@dataclass(frozen=True)
class Strategy:
    """A config for every op, plus the settings that span ops.

    Attributes
    ----------
    configs : mapping of op name -> Config
    stage_of : mapping of op name -> pipeline stage (empty when ``pipeline.stages`` == 1)
        With ``virtual_stages`` v > 1 this is the model chunk, 0..stages*v-1; chunk c runs
        on the devices of stage ``c % stages`` (Megatron's interleaved assignment).
    pipeline : PipelineSettings
    recompute : str
        ``none``, ``selective`` (attention internals, Korthikanti et al. 2022), ``full`` or
        ``selective-op`` (torchtitan's per-op policy, :func:`engine.strategy.recompute.op_checkpoint_saved`).
    zero_stage : int
        0: no sharding; 1, 2, 3: ZeRO stages (3 = FSDP full sharding).
    sequence_parallel : bool
    gather_unit : str
        What ZeRO-3 all-gathers at once: ``block`` (PyTorch FSDP wrapping each transformer
        block, torchtitan and llm-foundry's default) or ``op`` (DeepSpeed ZeRO-3, which
        fetches each module's parameters on their own, coalesced per module).
    shard_group : int
        With ZeRO-2/3, shard within groups of this many consecutive data-parallel ranks and
        replicate across the groups (PyTorch FSDP's HYBRID_SHARD, MiCS, ZeRO++'s hpZ):
        gradients reduce-scatter within a group, then each shard is all-reduced across the
        groups; parameters are gathered within a group. 0: one group (full sharding).
    tp_comm_overlap : bool
        Megatron-Core's ``--tp-comm-overlap``: tensor-parallel collectives pipelined with the
        GEMMs next to them (Transformer Engine's userbuffers); needs sequence parallelism.
    overlap_grad_reduce : bool
        Data-parallel gradient all-reduce / reduce-scatter issued per bucket while the
        backward pass goes on (Megatron-Core's ``--overlap-grad-reduce``, PyTorch DDP's and
        FSDP's behaviour, DeepSpeed's ``overlap_comm``). Off: every gradient collective waits
        for the whole backward pass of its device. Default on (PyTorch DDP/FSDP, NeMo and
        Megatron-Bridge recipes; Megatron-LM's bare flag and DeepSpeed ZeRO-1/2 default off).
    overlap_param_gather : bool
        With ZeRO-1/2 (the distributed optimizer), the all-gather of updated parameters
        overlapped with the next iteration's forward pass, bucket by bucket
        (``--overlap-param-gather``): each block's first forward waits for its bucket's gather
        instead of the step ending with all of them. Default off (Megatron-LM's and DeepSpeed's
        default); ZeRO-3 always gathers ahead of use (FSDP's prefetch).
    offload_optimizer : str
        ZeRO-Offload (Ren et al. ATC'21): ``cpu`` keeps the fp32 master weights and Adam's
        moments in host memory and runs the step on the CPU (gradients go down, updated
        half-precision parameters come back over the host link); ``nvme`` keeps them on the
        node's NVMe (ZeRO-Infinity, Rajbhandari et al. SC'21). Needs ZeRO stage >= 1.
    offload_params : str
        ZeRO-Infinity: the half-precision parameters kept in host memory (``cpu``) or on NVMe
        and fetched over the host link for each use. Needs ZeRO-3.
    fp8 : bool
        Linear layers' GEMMs in fp8 (NVIDIA Transformer Engine's recipe, Micikevicius et al.
        2022): forward and backward GEMMs at the device's fp8 rate, their inputs cast (and
        transposed) to fp8 by extra memory-bound kernels, the fp8 input kept for the backward;
        attention's core, norms, the rest, communication, master weights and the optimizer
        stay in the model's precision. Needs fp8 tensor cores (H100, H200).
    grad_reduce_in_fp32 : bool
        Megatron-Core's ``DistributedDataParallelConfig.grad_reduce_in_fp32``: a bf16 model's
        gradient buffer (``main_grad``), accumulated and reduced, in fp32 (4 bytes per
        parameter) rather than bf16 (2; the distributed optimizer then casts its shard to fp32,
        4/d). Default on: Megatron-LM's ``arguments.py`` turns
        ``accumulate_allreduce_grads_in_fp32`` on for bf16, as NeMo's and Megatron-Bridge's
        ``bf16_mixed()`` do; their performance scripts turn it off. Only bf16 models under
        ZeRO 0-2 read it (FSDP2 keeps its sharded gradients in the fp32 parameters' dtype).
    fp8_params : bool
        With ``fp8``: the linear layers' weights kept in fp8 (Transformer Engine's
        ``fp8_model_init``; Megatron's ``--fp8-param-gather``, NeMo's ``fp8_params``): one byte
        per weight plus the transpose Hopper's fp8 GEMMs read, instead of the bf16 weight and
        its cached fp8 copy and transpose; the fp32 master copy stays in the optimizer.
    expert_loads : tuple of float or None
        The routing-imbalance what-if: each expert's share of a mixture-of-experts layer's
        routed tokens (:func:`engine.moe.expert_loads`; sums to 1). Every expert-parallel rank
        is priced at the busiest rank's load (:func:`engine.moe.gate_factor`). None: balanced,
        as published MoE runs are measured.
    recompute_modules : tuple of str
        With ``recompute`` ``selective``: Megatron-Core's ``--recompute-modules``
        (:data:`RECOMPUTE_MODULES`); empty is its default, the attention core.
    moe_comm_overlap : bool
        Megatron-Core's ``--overlap-moe-expert-parallel-comm`` (with ``--delay-wgrad-compute``;
        Megatron-Core 0.14): the 1F1B steady state merges one microbatch's forward with another's
        backward, layer by layer, so that each one's dispatch and combine all-to-alls run under
        the other's compute. Modelled on the all-to-alls: a forward one is hidden behind up to half
        of the experts' backward time, a backward one behind up to half of their forward time
        (the partner microbatch's compute of the same layer), only what is left shows.
    model_name, model_fingerprint, cluster_name : str
        What the strategy was made for.
    found_by : mapping
        ``algorithm`` and its ``options``, ``seed``, ``budget``.
    cost : mapping
        Simulated results (e.g. ``iteration_time_s``), when known.
    """

    configs: Mapping[str, Config]
    pipeline: PipelineSettings = PipelineSettings()
    stage_of: Mapping[str, int] = field(default_factory=dict)
    recompute: str = "none"
    zero_stage: int = 0
    sequence_parallel: bool = False
    model_name: str = ""
    model_fingerprint: str = ""
    cluster_name: str = ""
    cluster_devices: int = 0
    found_by: Mapping[str, Any] = field(default_factory=dict)
    cost: Mapping[str, Any] = field(default_factory=dict)
    gather_unit: str = "block"
    fp8: bool = False
    shard_group: int = 0
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    offload_optimizer: str = "none"
    offload_params: str = "none"
    grad_reduce_in_fp32: bool = True
    fp8_params: bool = False
    expert_loads: tuple[float, ...] | None = None
    moe_comm_overlap: bool = False
    recompute_modules: tuple[str, ...] = ()

    def __getitem__(self, op: str) -> Config:
        return self.configs[op]

    def with_config(self, op: str, config: Config) -> "Strategy":
        """A copy with ``op``'s config replaced (the strategy is immutable)."""
        configs = dict(self.configs)
        configs[op] = config
        return replace(self, configs=configs, cost={})

    def devices_used(self) -> set[int]:
        """Every device some op runs on (each distinct device tuple read once: the ops of a
        16,384-GPU layout share a few)."""
        seen: dict[int, tuple[int, ...]] = {}
        for c in self.configs.values():
            seen.setdefault(id(c.devices), c.devices)
        return {d for devs in seen.values() for d in devs}

    def to_dict(self) -> dict[str, Any]:
        ops = {}
        for name, c in self.configs.items():
            entry = c.to_dict()
            if self.stage_of:
                entry["stage"] = self.stage_of.get(name, 0)
            ops[name] = entry
        return {
            "format": "soapbox.strategy/1",
            "model": {"name": self.model_name, "fingerprint": self.model_fingerprint},
            "cluster": {"name": self.cluster_name, "devices": self.cluster_devices},
            "found_by": _json_safe(dict(self.found_by)),
            "cost": _json_safe(dict(self.cost)),
            "pipeline": self.pipeline.to_dict(),
            "recompute": self.recompute,
            "zero_stage": self.zero_stage,
            "sequence_parallel": self.sequence_parallel,
            **({"gather_unit": self.gather_unit} if self.gather_unit != "block" else {}),
            **({"fp8": True} if self.fp8 else {}),
            **({"shard_group": self.shard_group} if self.shard_group else {}),
            **({"tp_comm_overlap": True} if self.tp_comm_overlap else {}),
            **({"overlap_grad_reduce": False} if not self.overlap_grad_reduce else {}),
            **({"overlap_param_gather": True} if self.overlap_param_gather else {}),
            **({"offload_optimizer": self.offload_optimizer} if self.offload_optimizer != "none" else {}),
            **({"offload_params": self.offload_params} if self.offload_params != "none" else {}),
            **({"grad_reduce_in_fp32": False} if not self.grad_reduce_in_fp32 else {}),
            **({"fp8_params": True} if self.fp8_params else {}),
            **({"expert_loads": list(self.expert_loads)} if self.expert_loads is not None else {}),
            **({"moe_comm_overlap": True} if self.moe_comm_overlap else {}),
            **({"recompute_modules": list(self.recompute_modules)} if self.recompute_modules else {}),
            "ops": ops,
        }


def strategy_from_dict(data: Mapping[str, Any]) -> Strategy:
    """Build a :class:`Strategy` from a schema-valid ``soapbox.strategy/1`` mapping."""
    configs = {}
    stage_of = {}
    bad = [Problem(path, msg) for path, msg in check_runs(data["ops"])]  # (before any run is listed)
    if bad:
        raise ValidationError(bad[:20], "strategy")
    # equal device tuples made one object: the ops of repeated layers then share it, as in a
    # strategy built in code, and the checks and the task-graph builder keyed by a tuple's
    # identity do their work once per tuple (a Megatron layout of GPT-3 on 1,024 GPUs: 16 tuples
    # for 2,410 ops)
    shared: dict[tuple, tuple] = {}
    for name, entry in data["ops"].items():
        try:
            devices = devices_of_entry(entry)
        except ValueError as e:  # runs counting down, or standing for too many devices
            bad.append(Problem(f"ops.{name}.devices", str(e)))
            continue
        devices = shared.setdefault(devices, devices)  # (schema-valid: integers)
        configs[name] = Config(entry.get("degrees", {}), devices)
        if "stage" in entry:
            stage_of[name] = entry["stage"]
    if bad:
        raise ValidationError(bad[:20], "strategy")
    pipe = data.get("pipeline", {})
    settings = PipelineSettings(pipe.get("stages", 1), pipe.get("microbatches", 1), pipe.get("schedule", "1f1b"),
                                pipe.get("virtual_stages", 1))
    model = data.get("model", {})
    cluster = data.get("cluster", {})
    if settings.stages == 1:
        stage_of = {}
    return Strategy(configs, settings, stage_of, data.get("recompute", "none"), data.get("zero_stage", 0),
                    data.get("sequence_parallel", False), model.get("name", ""), model.get("fingerprint", ""),
                    cluster.get("name", ""), cluster.get("devices", 0), data.get("found_by", {}),
                    data.get("cost", {}), data.get("gather_unit", "block"), data.get("fp8", False),
                    data.get("shard_group", 0), data.get("tp_comm_overlap", False),
                    data.get("overlap_grad_reduce", True), data.get("overlap_param_gather", False),
                    data.get("offload_optimizer", "none"),
                    data.get("offload_params", "none"), data.get("grad_reduce_in_fp32", True),
                    data.get("fp8_params", False),
                    tuple(data["expert_loads"]) if data.get("expert_loads") is not None else None,
                    data.get("moe_comm_overlap", False), tuple(data.get("recompute_modules", ())))


def validate_strategy(strategy: Strategy, graph: OpGraph, cluster: Cluster) -> list[Problem]:
    """Every reason ``strategy`` cannot run ``graph`` on ``cluster``; empty when valid."""
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
    if strategy.fp8_params is True and strategy.fp8 is not True:
        add(Problem("fp8_params", "fp8 parameters need fp8 GEMMs: set fp8 too, or turn fp8_params off"))
    if not isinstance(strategy.fp8, bool):
        add(Problem("fp8", f"must be true or false, got {strategy.fp8!r}"))
    elif strategy.fp8:
        used = {cluster.devices[d].type for d in strategy.devices_used() if 0 <= d < cluster.num_devices}
        lacking = sorted(n for n in used if "fp8" not in cluster.device_types[n].peak_flops_per_s)
        if lacking:
            add(Problem("fp8", f"fp8 GEMMs need fp8 tensor cores; the {', '.join(lacking)} of {cluster.name} "
                               f"{'have' if len(lacking) > 1 else 'has'} none (H100 and H200 do)"))
    for precision in {graph.precision}:
        for t in {d.type for d in cluster.devices}:
            if precision not in cluster.device_types[t].peak_flops_per_s:
                add(Problem("cluster", f"{t} has no {precision} peak; the model {graph.name!r} runs in {precision}"))

    microbatches = pipe.microbatches if isinstance(pipe.microbatches, int) and pipe.microbatches > 0 else 1
    if microbatches > min(MAX_MICROBATCHES, graph.batch_size):
        add(Problem("pipeline.microbatches",
                    f"{microbatches:,} microbatches: at most {min(MAX_MICROBATCHES, graph.batch_size):,} (each holds at "
                    f"least one sample of the batch of {graph.batch_size:,}; the limit is {MAX_MICROBATCHES:,})"))
        microbatches = 1
    if isinstance(pipe.virtual_stages, int) and pipe.virtual_stages > MAX_VIRTUAL_STAGES:
        add(Problem("pipeline.virtual_stages", f"at most {MAX_VIRTUAL_STAGES:,}, got {pipe.virtual_stages:,}"))
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
    if pipe.stages > 1:
        problems += _check_stages(strategy, graph)
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


def check_strategy(strategy: Strategy, graph: OpGraph, cluster: Cluster, source: str | None = None) -> Strategy:
    """Return ``strategy`` when valid; raise :class:`ValidationError` listing every problem."""
    problems = validate_strategy(strategy, graph, cluster)
    if problems:
        raise ValidationError(problems, source)
    return strategy
