"""Configs and strategies: how every operator is partitioned and placed.

A :class:`Config` is FlexFlow's parallelization configuration of one op (Jia et al.
SysML'19, §4): a degree for each parallel dim and the device of each partition. Partitions
are numbered row-major over the op's dims in the order :attr:`engine.graph.Op.dims` lists
them (sample first, the replica dim last); ``devices[k]`` runs partition ``k``.

A :class:`Strategy` maps every op to a config and adds what spans ops: pipeline settings
(stages, microbatches, schedule), activation recomputation, ZeRO/FSDP parameter sharding
(Rajbhandari et al. SC'20: stage 1 shards optimizer state, 2 also gradients, 3 also
parameters) and Megatron's sequence parallelism (Korthikanti et al. 2022).

:func:`engine.strategy.checks.validate_strategy` lists every problem with its path in the
strategy file (``ops.conv1.degrees.sample: 3 does not divide sample (64)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping


from .runs import check_runs, devices_of_entry

from ..errors import Problem, ValidationError
from .config import Config, PipelineSettings

__all__ = ["RECOMPUTE_MODULES", "Strategy", "SCHEDULES", "RECOMPUTE", "OFFLOAD_DEVICES", "strategy_from_dict",
           "MAX_MICROBATCHES", "MAX_VIRTUAL_STAGES", "GATHER_UNITS", "OPTIMIZER_STATES", "KERNELS",
           "FP8_LIBRARIES"]

SCHEDULES = ("gpipe", "1f1b", "interleaved")
#: Activation recomputation policies: ``selective`` is Korthikanti et al.'s (the attention
#: core), ``selective-op`` torchtitan's per-op selective checkpointing
#: (:func:`engine.strategy.recompute.op_checkpoint_saved`), ``full`` every layer from its input.
RECOMPUTE = ("none", "selective", "full", "selective-op")
#: Megatron-Core's ``--recompute-modules`` (with ``--recompute-granularity selective``; its
#: default is ``core_attn``): which parts of each layer rerun their forward before their
#: backward instead of keeping their activations (:func:`engine.strategy.recompute.recomputed_ops`).
RECOMPUTE_MODULES = ("core_attn", "mlp", "moe", "moe_act", "shared_experts", "layernorm", "mla_up_proj")


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
#: What the optimizer keeps per parameter (:attr:`Strategy.optimizer_state`): ``fp32`` an fp32
#: master copy and fp32 Adam moments (mixed precision, Micikevicius et al. ICLR'18; every
#: framework's default); ``bf16-moments`` the fp32 master copy with Adam's moments in bf16
#: (Megatron-Core's ``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype
#: bf16``); ``bf16`` no master copy: parameters, gradients and moments in bf16 (a model cast to
#: bf16 before its optimizer is made, as KempnerForge's ``build_parallel_model`` does).
OPTIMIZER_STATES = ("fp32", "bf16-moments", "bf16")
#: How the framework runs the pointwise work between the GEMMs (:attr:`Strategy.kernels`):
#: ``fused`` in fused kernels that recompute what is cheap in their backward (Megatron-Core's
#: ``bias_swiglu_impl`` / ``bias_gelu_impl``, on unless ``--no-bias-swiglu-fusion``;
#: Transformer Engine; torch.compile, whose partitioner recomputes pointwise ops rather than
#: save them); ``eager`` PyTorch op by op, each op's autograd saving what its own backward reads.
KERNELS = ("fused", "eager")
#: Which library runs the fp8 GEMMs (:attr:`Strategy.fp8_library`): ``te`` NVIDIA Transformer
#: Engine (Megatron-LM, NeMo, Megatron-Bridge), ``torchao`` PyTorch's torchao Float8Linear
#: (torchtitan's float8 converter).
FP8_LIBRARIES = ("te", "torchao")


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
    accumulate_unsharded : bool
        ZeRO-2 or 3 with gradient accumulation: the microbatches before the last skip the
        gradient reduce-scatter and accumulate unsharded gradients (PyTorch FSDP2's
        ``set_requires_gradient_sync(False)``, FSDP's ``no_sync()``; KempnerForge's
        ``maybe_no_sync``; torch's pipelining under FSDP2, whose ``backward_maybe_with_nosync``
        neither reshards nor reduces between microbatches: torchtitan with pp is ZeRO-2 with
        this): one reduce-scatter an iteration instead of one a microbatch, and a whole
        gradient buffer per device while the iteration lasts, in FSDP2's reduce dtype (fp32 with
        ``grad_reduce_in_fp32``: ``FSDPParam.to_accumulated_grad_if_needed`` upcasts the
        accumulated gradient; torch 2.13), else the model's. Default off (torchtitan without
        pp reduce-scatters every microbatch).
    optimizer_state : str
        One of :data:`OPTIMIZER_STATES`: what the optimizer keeps per parameter, and so the
        bytes of weights, gradients and optimizer state (:func:`engine.sim.memory_static.state_bytes_per_param`)
        and of the optimizer step. Default ``fp32``.
    kernels : str
        One of :data:`KERNELS`. ``fused`` (default): a gated MLP's activation (SwiGLU, GeGLU)
        runs fused with its product and keeps only its input for the backward, recomputing
        the activation there (Megatron-Core's ``SwiGLUFunction`` saves its input alone);
        ``eager``: the activation's output is kept too, for the product's backward.
    offload_activations : int
        The first N transformer layers' saved activations go to host memory after their
        forward pass and come back for their backward (Megatron-Core's ``--cpu-offloading-num-layers
        N``, Transformer Engine's ``get_cpu_offload_context``): no pipeline parallelism, no
        recomputation, fewer than the model's layers (Megatron-Core's own rules). Device
        memory keeps one offloaded layer's activations in flight; the copies run over the
        GPU's host link beside the compute, and what they take beyond the layer they hide
        behind shows in the iteration (:mod:`engine.taskgraph.offload`). Default 0.
    fp8_library : str
        One of :data:`FP8_LIBRARIES`, what runs the fp8 GEMMs (with ``fp8``). ``te`` (default):
        Transformer Engine keeps a linear layer's input in fp8 for its backward (1 byte an
        element) and its weights' fp8 copies and transposes between microbatches; ``torchao``
        (0.18, what torchtitan 0.3.0 runs): ``matmul_with_hp_or_float8_args`` saves the
        high-precision input and weight (``ctx.save_for_backward(input_hp, weight_hp_t)``,
        torchao/float8/float8_linear.py) and casts again in the backward, caching no fp8
        weight. torchao 0.7 (December 2024) saved the fp8 input instead
        (``manual_float8_matmul_with_args_in_float8``): ``te``'s activations. Memory only: the
        casts' time is priced as Transformer Engine's either way.
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
    optimizer_state: str = "fp32"
    accumulate_unsharded: bool = False
    kernels: str = "fused"
    offload_activations: int = 0
    fp8_library: str = "te"

    def __getitem__(self, op: str) -> Config:
        return self.configs[op]

    def with_config(self, op: str, config: Config) -> "Strategy":
        """A copy with ``op``'s config replaced (the strategy is immutable)."""
        configs = dict(self.configs)
        configs[op] = config
        return replace(self, configs=configs, cost={})

    def with_configs(self, ops: Iterable[str], config: Config) -> "Strategy":
        """A copy with each of ``ops`` given ``config`` (one copy however many ops)."""
        configs = dict(self.configs)
        configs.update(dict.fromkeys(ops, config))
        return replace(self, configs=configs, cost={})

    def devices_used(self) -> set[int]:
        """Every device some op runs on (each distinct device tuple read once: the ops of a
        16,384-GPU layout share a few)."""
        seen: dict[int, tuple[int, ...]] = {}
        for c in self.configs.values():
            seen.setdefault(id(c.devices), c.devices)
        return {d for devs in seen.values() for d in devs}

    def to_dict(self, devices: Callable[[tuple[int, ...]], Any] = list) -> dict[str, Any]:
        """The strategy as ``soapbox.strategy/1`` writes it; ``devices`` writes each config's
        device tuple (:meth:`Config.to_dict`)."""
        ops = {}
        for name, c in self.configs.items():
            entry = c.to_dict(devices)
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
            **({"optimizer_state": self.optimizer_state} if self.optimizer_state != "fp32" else {}),
            **({"accumulate_unsharded": True} if self.accumulate_unsharded else {}),
            **({"kernels": self.kernels} if self.kernels != "fused" else {}),
            **({"offload_activations": self.offload_activations} if self.offload_activations else {}),
            **({"fp8_library": self.fp8_library} if self.fp8_library != "te" else {}),
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
                    data.get("moe_comm_overlap", False), tuple(data.get("recompute_modules", ())),
                    data.get("optimizer_state", "fp32"), data.get("accumulate_unsharded", False),
                    data.get("kernels", "fused"), data.get("offload_activations", 0), data.get("fp8_library", "te"))
