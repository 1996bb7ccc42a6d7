"""One framework layout: the typed record every layout goes through, from the command line's
flags and the explorer's layout panel to the builder that makes it a strategy.

A :class:`Layout` says what Megatron-LM's, DeepSpeed's and torchtitan's settings say (tensor,
pipeline, context, data and expert parallel degrees, virtual stages, micro-batch, schedule,
recomputation, sequence parallelism, ZeRO, hybrid sharding, fp8, the overlap and offload
switches, the layer split), as torchtitan's ``ParallelismConfig`` does
(``torchtitan/config/job_config.py``). Its fields are written out here and nowhere else: each
carries an :class:`Option` (what it means to a user, which builders take it, where the
explorer's panel shows it), from which the command line makes its flags
(:func:`engine.cli.common.add_strategy_options`), the baselines their option lists
(:data:`engine.search.baselines.BASELINES`) and the explorer its panel (:mod:`app.tabs.editor`).
The builder takes the record whole (:func:`engine.layout.build.build_layout`); export inference
(:func:`engine.export.infer.infer_layout`), the what-if mapping
(:func:`engine.studies.whatif.map_strategy`) and the sweep read and write it.

The rules every layout must satisfy are :func:`engine.layout.rules.layout_problem`'s (and
:func:`engine.layout.rules.resolved` fills in what depends on the model and cluster); the
enumerator of valid layouts is :mod:`engine.layout.enumeration`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from ..cluster.devices import MAX_DEVICES
from ..ops import MAX_DIM
from ..strategy import FP8_LIBRARIES, GATHER_UNITS, KERNELS, OFFLOAD_DEVICES, OPTIMIZER_STATES, RECOMPUTE, RECOMPUTE_MODULES, SCHEDULES
from ..strategy.config import microbatch_count

__all__ = ["Layout", "Option", "option_of", "options_for", "value_kind", "parse_option", "BUILDERS", "OPTION_NAMES",
           "SWITCHES", "ON_BY_DEFAULT", "PANEL_GROUPS"]

#: the builders a layout goes to (:mod:`engine.layout.build`): Megatron-LM's 3-D/4-D parallelism,
#: and FSDP / ZeRO sharded data parallelism with tp, cp and pp around it
BUILDERS = ("megatron", "fsdp")
#: where the explorer's layout panel shows a field: a number box (``degree``), a drop-down
#: (``choice``, ``offload``), a box of the recompute modules (``modules``), the check boxes of
#: parallelism flags (``flag``) and of the communication overlaps (``overlap``)
PANEL_GROUPS = ("degree", "choice", "modules", "flag", "overlap", "offload")


@dataclass(frozen=True)
class Option:
    """How one :class:`Layout` field is offered to a user.

    Attributes
    ----------
    help : str
        What it is, in a user's words (the command line's help, the panel's tooltip).
    kinds : tuple of str
        The builders (:data:`BUILDERS`) that take it; empty: none (set by the model or a search).
    label : str
        Its short name on the explorer's panel ("" where the panel does not show it).
    panel : str or None
        Which of :data:`PANEL_GROUPS` shows it on the panel; None: the panel does not.
    flag : bool
        Whether the command line has a flag for it (``--`` and the name with dashes; ``fp8``
        is ``--precision fp8``).
    most : int
        The largest whole number the command line takes for it (integer fields).
    fewest : int
        The smallest (the command line leaves ZeRO stage 0 out: no flag means none).
    metavar : str
        The placeholder of its value in the command line's help.
    negatable : bool
        Whether the command line has a ``--no-`` form (switches that are on by default, and
        those whose off is worth saying).
    megatron : str
        The Megatron-LM flag it is (shown beside a switch on the panel).
    choices : tuple of str
        The values a text field (or each name of a list of names) may take.
    short : str
        A few words for a switch in a summary line ("grad-reduce overlap"; an offload's says
        where: "optimizer offloaded to").
    experts : bool
        A mixture-of-experts degree (the panel turns it off for a dense model).
    """

    help: str
    kinds: tuple[str, ...] = BUILDERS
    label: str = ""
    panel: str | None = None
    flag: bool = True
    most: int = MAX_DEVICES
    fewest: int = 1
    metavar: str | None = None
    negatable: bool = False
    megatron: str = ""
    choices: tuple[str, ...] = ()
    short: str = ""
    experts: bool = False


def _opt(default: Any, help: str, **kw: Any) -> Any:
    """A field of :class:`Layout` with its :class:`Option`."""
    return field(default=default, metadata={"option": Option(help, **kw)})


_MEGATRON = ("megatron",)
_FSDP = ("fsdp",)


@dataclass(frozen=True)
class Layout:
    """A Megatron-shaped layout: what the three frameworks' settings can say.

    Degrees multiply to GPUs: a layout uses ``tp * cp * pp * dp`` devices, ranked as
    Megatron-Core ranks them (tp fastest, then cp, then dp, then pp; Narayanan et al. SC'21
    §3). Flag names are Megatron-LM's (``megatron/training/arguments.py``).
    """

    #: tensor-parallel degree (--tensor-model-parallel-size): GPUs splitting each layer's GEMMs
    tp: int = _opt(1, "tensor-parallel degree", label="tp", panel="degree")
    #: pipeline stages (--pipeline-model-parallel-size)
    pp: int = _opt(1, "pipeline stages", label="pp", panel="degree")
    #: context-parallel degree (--context-parallel-size): GPUs splitting the sequence
    cp: int = _opt(1, "context-parallel degree: the sequence split over ranks", label="cp", panel="degree")
    #: data-parallel replicas; None: the cluster's devices left over, n / (tp * cp * pp)
    dp: int | None = _opt(None, "data-parallel replicas (default: the rest)", kinds=_MEGATRON)
    #: expert-parallel degree (--expert-model-parallel-size): ranks splitting each MoE layer's
    #: experts, folded onto the attention's dp x cp x tp ranks (:func:`engine.moe.expert_split`)
    ep: int = _opt(1, "expert-parallel degree, a mixture-of-experts model's experts split over N ranks "
                      "(Megatron-LM's --expert-model-parallel-size; default 1). MoE parallel folding: the ep "
                      "ranks are taken from the attention's tp x cp x dp ranks of a stage, so N must divide the "
                      "experts and either divide the cp x tp / etp sequence shards or be a multiple of them that "
                      "divides dp", label="ep (experts)", panel="degree", metavar="N", experts=True)
    #: expert tensor-parallel degree (--expert-tensor-parallel-size): ranks splitting each
    #: expert's FFN width; the expert data-parallel degree is tp x cp x dp / (ep x etp)
    etp: int = _opt(1, "expert tensor-parallel degree, each expert's FFN width split over N ranks (Megatron-LM's "
                       "--expert-tensor-parallel-size; default 1); must divide tp. The expert data-parallel "
                       "degree is tp x cp x dp / (ep x etp)", label="etp (experts)", panel="degree", metavar="N",
                    experts=True)
    #: model chunks per pipeline stage (--num-virtual-stages-per-pipeline-rank; interleaved 1F1B)
    vpp: int = _opt(1, "model chunks per stage: interleaved 1F1B", kinds=_MEGATRON, label="vpp", panel="degree",
                    most=1024)
    #: samples per microbatch per data-parallel rank (--micro-batch-size); None: the whole
    #: per-replica batch without pipelining, 1 with it (Megatron-LM's default)
    micro_batch: int | None = _opt(None, "micro-batch size in samples", label="micro-batch", panel="degree",
                                   most=MAX_DIM)
    #: samples per iteration over all replicas (--global-batch-size); None: the model's batch
    global_batch: int | None = _opt(None, "samples per iteration (the model's batch: --batch sets it)", kinds=(),
                                    flag=False)
    #: pipeline schedule (one of ``SCHEDULES``); None: interleaved with vpp > 1, else 1f1b
    schedule: str | None = _opt(None, "pipeline schedule (default 1f1b)", kinds=_MEGATRON,
                                label="schedule (pipeline)", panel="choice", choices=SCHEDULES)
    #: activation recomputation: none, selective (attention's core), full (--recompute-granularity)
    #: or selective-op (torchtitan's per-op policy: :func:`engine.strategy.recompute.op_checkpoint_saved`)
    recompute: str = _opt("none", "activation recomputation: selective (Megatron's: the attention core), full "
                                  "(each layer from its input), selective-op (torchtitan's per-op policy: every "
                                  "second matmul's and the fused attention's outputs saved, the rest recomputed)",
                          label="recomputation", panel="choice", choices=RECOMPUTE)
    #: with selective: Megatron-Core's --recompute-modules (e.g. mla_up_proj,mlp); empty: core_attn
    recompute_modules: tuple[str, ...] = _opt((), "with --recompute selective: Megatron-Core's --recompute-modules, "
                                                  f"comma-separated: {', '.join(RECOMPUTE_MODULES)} (default "
                                                  "core_attn: the attention core)", kinds=_MEGATRON,
                                              label="recompute modules", panel="modules",
                                              choices=RECOMPUTE_MODULES)
    #: Megatron sequence parallelism (--sequence-parallel; Korthikanti et al. 2022 §4.2.2)
    sequence_parallel: bool = _opt(False, "Megatron sequence parallelism", label="sequence parallel", panel="flag",
                                   megatron="--sequence-parallel")
    #: tensor-parallel communication overlapped with the GEMMs (--tp-comm-overlap; needs sp)
    tp_comm_overlap: bool = _opt(False, "tensor-parallel communication overlapped with the GEMMs (Transformer "
                                        "Engine userbuffers; needs --sequence-parallel)",
                                 label="tensor-parallel comm with the GEMMs", panel="overlap",
                                 megatron="--tp-comm-overlap", short="tp comm overlap")
    #: ZeRO stage over each data-parallel group: 0 none, 1 optimizer state
    #: (--use-distributed-optimizer), 2 + gradients, 3 + parameters (FSDP)
    zero_stage: int = _opt(0, "ZeRO sharding over data parallelism: 1 optimizer state (Megatron's distributed "
                              "optimizer), 2 + gradients, 3 + parameters (fsdp: default 3; megatron: default none)",
                           label="ZeRO stage", panel="choice", fewest=1, most=3, metavar="{1,2,3}")
    #: hybrid sharding: shard within groups of this many data-parallel ranks (HSDP, ZeRO++
    #: hpZ); 0: over the whole data-parallel group
    shard_group: int = _opt(0, "hybrid sharding (ZeRO 2/3): shard within groups of K data-parallel ranks, "
                               "replicate across them (PyTorch HYBRID_SHARD with K = GPUs per node, MiCS)",
                            kinds=_FSDP, label="shard group", panel="degree", most=MAX_DIM, metavar="K")
    #: what ZeRO-3 gathers at once: ``block`` (PyTorch FSDP) or ``op`` (DeepSpeed ZeRO-3)
    gather_unit: str = _opt("block", "what ZeRO-3 gathers at once: block (PyTorch FSDP, default) or op (DeepSpeed "
                                     "ZeRO-3: each module's parameters on their own)", kinds=_FSDP,
                           choices=GATHER_UNITS)
    #: the loss on vocabulary shards (Megatron's vocab-parallel cross-entropy; torchtitan's
    #: loss_parallel); off: the logits gathered to every tensor-parallel rank, the loss whole on each
    loss_parallel: bool = _opt(True, "with tp > 1, the loss computed on each rank's vocabulary shard (Megatron-LM's "
                                     "vocab-parallel cross-entropy, torchtitan's loss parallel; default on); off: "
                                     "the logits gathered to every tensor-parallel rank and the loss computed whole "
                                     "on each (torchtitan's --parallelism.disable_loss_parallel, KempnerForge)",
                               negatable=True)
    #: the linear layers' GEMMs in fp8 (Transformer Engine; --fp8-format hybrid)
    fp8: bool = _opt(False, "fp8: the linear layers' GEMMs in fp8 (Transformer Engine; H100/H200), attention, "
                            "norms, communication and the optimizer in the model's precision", label="fp8 GEMMs",
                     panel="flag", megatron="--fp8-format hybrid")
    #: the linear weights kept in fp8 (--fp8-param-gather; NeMo's fp8_params): needs fp8
    fp8_params: bool = _opt(False, "with --precision fp8: the linear weights kept in fp8 (Megatron's "
                                   "--fp8-param-gather, NeMo's fp8_params)", kinds=_MEGATRON)
    #: a bf16 model's gradients accumulated and reduced in fp32 (Megatron-LM's default for
    #: bf16; off: bf16 gradient buffer): :attr:`engine.strategy.Strategy.grad_reduce_in_fp32`
    grad_reduce_in_fp32: bool = _opt(True, "a bf16 model's gradients accumulated and reduced in fp32 (default "
                                           "on, Megatron-LM's bf16 rule; --no-grad-reduce-in-fp32: the bf16 "
                                           "gradient buffer of NeMo's and Megatron-Bridge's performance scripts)",
                                     kinds=_MEGATRON, negatable=True)
    #: ZeRO-2/3 gradient accumulation without a reduce-scatter per microbatch (FSDP's no_sync):
    #: :attr:`engine.strategy.Strategy.accumulate_unsharded`
    accumulate_unsharded: bool = _opt(False, "ZeRO-2/3 with gradient accumulation: the microbatches before the last "
                                             "keep unsharded gradients instead of reduce-scattering them (FSDP2's "
                                             "set_requires_gradient_sync(False), FSDP's no_sync()): one "
                                             "reduce-scatter an iteration, a whole gradient buffer meanwhile",
                                      kinds=_FSDP)
    #: what the optimizer keeps per parameter: :attr:`engine.strategy.Strategy.optimizer_state`
    optimizer_state: str = _opt("fp32", "what the optimizer keeps per parameter: fp32 (an fp32 master copy and fp32 "
                                        "Adam moments, mixed precision's default), bf16-moments (Adam's moments in "
                                        "bf16: Megatron-Core's --use-precision-aware-optimizer --exp-avg-dtype bf16 "
                                        "--exp-avg-sq-dtype bf16) or bf16 (no master copy: parameters, gradients and "
                                        "moments in bf16, a model cast to bf16 before its optimizer)",
                                label="optimizer state", panel="choice", choices=OPTIMIZER_STATES,
                                short="optimizer state")
    #: how the pointwise work runs: :attr:`engine.strategy.Strategy.kernels`
    kernels: str = _opt("fused", "how the framework runs the pointwise work between the GEMMs: fused (Megatron-Core's "
                                 "and Transformer Engine's fused kernels, torch.compile; default) or eager (PyTorch op "
                                 "by op). A fused gated MLP (SwiGLU, GeGLU) keeps only its activation's input for the "
                                 "backward; eager keeps the activation's output too", label="kernels",
                        panel="choice", choices=KERNELS, short="kernels")
    #: what runs the fp8 GEMMs: :attr:`engine.strategy.Strategy.fp8_library`
    fp8_library: str = _opt("te", "with fp8: the library that runs the fp8 GEMMs, te (Transformer Engine: Megatron-LM, "
                                  "NeMo; keeps a linear layer's input in fp8 for the backward and its weights' fp8 "
                                  "copies between microbatches; default) or torchao (torchtitan's float8: keeps the "
                                  "bf16 input and weight, casts again in the backward)", label="fp8 library",
                            panel="choice", choices=FP8_LIBRARIES, short="fp8 library")
    #: activation offloading: :attr:`engine.strategy.Strategy.offload_activations`
    offload_activations: int = _opt(0, "the saved activations of the first N transformer layers kept in host memory "
                                       "between their forward and backward passes (Megatron-Core's "
                                       "--cpu-offloading-num-layers N): no pipeline parallelism, no recomputation, "
                                       "fewer layers than the model has", label="layers' activations offloaded",
                                    panel="degree", fewest=0, most=MAX_DIM, metavar="N",
                                    short="layers' activations offloaded")
    #: data-parallel gradient collectives overlapped with the backward (--overlap-grad-reduce;
    #: PyTorch DDP/FSDP always): :attr:`engine.strategy.Strategy.overlap_grad_reduce`
    overlap_grad_reduce: bool = _opt(True, "data-parallel gradient collectives issued during the backward pass "
                                           "(default on: PyTorch DDP/FSDP, NeMo; Megatron-LM's bare default and "
                                           "DeepSpeed ZeRO-1/2's overlap_comm are off)",
                                     label="gradient reduce during backward", panel="overlap", negatable=True,
                                     megatron="--overlap-grad-reduce", short="grad-reduce overlap")
    #: ZeRO-1/2's parameter all-gather overlapped with the next forward (--overlap-param-gather)
    overlap_param_gather: bool = _opt(False, "ZeRO-1/2: the updated parameters' all-gather overlapped with the "
                                             "next forward (Megatron-Core's --overlap-param-gather; default off)",
                                      kinds=_MEGATRON, label="parameter gather with the next forward",
                                      panel="overlap", negatable=True, megatron="--overlap-param-gather",
                                      short="param-gather overlap")
    #: MoE all-to-alls under another microbatch's compute (--overlap-moe-expert-parallel-comm)
    moe_comm_overlap: bool = _opt(False, "mixture-of-experts all-to-alls under another microbatch's compute "
                                         "(Megatron-Core's --overlap-moe-expert-parallel-comm with "
                                         "--delay-wgrad-compute)", kinds=_MEGATRON,
                                  label="MoE all-to-all overlap (under another microbatch)", panel="overlap",
                                  megatron="--overlap-moe-expert-parallel-comm", short="MoE all-to-all overlap")
    #: ZeRO-Offload: optimizer state and step on the host (``cpu``) or NVMe (``nvme``)
    offload_optimizer: str = _opt("none", "ZeRO-Offload: optimizer state and step on the host CPU (cpu) or NVMe "
                                          "(nvme); needs --zero-stage >= 1", label="optimizer (ZeRO >= 1)",
                                  panel="offload", choices=OFFLOAD_DEVICES, short="optimizer offloaded to")
    #: ZeRO-Infinity: half-precision parameters in host memory (``cpu``) or on NVMe (ZeRO-3)
    offload_params: str = _opt("none", "ZeRO-Infinity: parameters in host memory (cpu) or on NVMe, fetched for "
                                       "each use; needs ZeRO-3", kinds=_FSDP, label="parameters (ZeRO-3)",
                               panel="offload", choices=OFFLOAD_DEVICES, short="parameters offloaded to")
    #: layers on each pipeline stage (no interleaving); None: even, or balanced counting the
    #: embedding and the output layer (:func:`engine.layout.placement.balanced_layers`)
    layers_per_stage: tuple[int, ...] | None = _opt(None, "layers on each pipeline stage, e.g. 7,8,8,7 (default: "
                                                          "even, or balanced counting the embedding and output "
                                                          "layer when the layers do not divide)", kinds=_MEGATRON,
                                                    metavar="N,N,...")
    #: stage s on the (stage_mesh[s])-th block of dp * cp * tp devices (the pipeline planner's
    #: choice on heterogeneous clusters); None: stage s on block s
    stage_mesh: tuple[int, ...] | None = _opt(None, "stage s on the (stage_mesh[s])-th block of devices (the "
                                                    "pipeline planner's choice)", kinds=_MEGATRON, flag=False)


    def __post_init__(self) -> None:
        for f in fields(self):
            v, kind = getattr(self, f.name), value_kind(f.name)
            if kind == "int" and f.default == 1 and (not _is_int(v) or v < 1):
                raise ValueError(f"{f.name} must be a positive integer, got {v!r}")
            if kind == "int" and f.default is None and v is not None and (not _is_int(v) or v < 1):
                raise ValueError(f"{f.name} must be a positive integer, got {v!r}")
            if kind == "text" and v is not None and v not in option_of(f.name).choices:
                raise ValueError(f"{f.name} must be one of {', '.join(option_of(f.name).choices)}, got {v!r}")
            if kind == "bool":
                object.__setattr__(self, f.name, bool(v))
        object.__setattr__(self, "recompute_modules", mods := parse_option("recompute_modules", self.recompute_modules))
        if mods and self.recompute != "selective":
            raise ValueError(f"recompute_modules {','.join(mods)}: needs recompute selective (Megatron's "
                             f"--recompute-granularity selective), got {self.recompute!r}")
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise ValueError(f"zero_stage must be 0 (none), 1, 2 or 3, got {self.zero_stage!r}")
        if not _is_int(self.shard_group) or self.shard_group < 0:
            raise ValueError(f"shard_group must be a non-negative integer, got {self.shard_group!r}")
        for name, need in (("offload_optimizer", 1), ("offload_params", 3)):
            where = getattr(self, name)
            if where != "none" and self.zero_stage < need:
                raise ValueError(f"{name} {where}: offloading {'the optimizer' if need == 1 else 'parameters'} needs "
                                 f"ZeRO stage {need}{' or above' if need < 3 else ''} (DeepSpeed's rule), got "
                                 f"{self.zero_stage}")
        if self.accumulate_unsharded and self.zero_stage not in (2, 3):
            raise ValueError(f"accumulate_unsharded: accumulating unsharded gradients (FSDP's no_sync) applies to "
                             f"ZeRO-2 and ZeRO-3, got zero_stage {self.zero_stage}")
        if not _is_int(self.offload_activations) or self.offload_activations < 0:
            raise ValueError(f"offload_activations must be a whole number of layers (0: none), got "
                             f"{self.offload_activations!r}")
        if self.offload_activations and self.pp > 1:
            raise ValueError(f"offload_activations {self.offload_activations}: Megatron-Core offloads activations "
                             f"without pipeline parallelism only, got pp {self.pp}")
        if self.offload_activations and self.recompute != "none":
            raise ValueError(f"offload_activations {self.offload_activations}: Megatron-Core offloads activations "
                             f"only without recomputation, got recompute {self.recompute}")
        if _is_int(self.vpp) and _is_int(self.pp) and self.vpp > 1 and self.pp == 1:
            # (Megatron-LM refuses it: its interleaved schedule runs several chunks on each of pp > 1 stages)
            raise ValueError(f"vpp {self.vpp}: model chunks per stage need pipeline parallelism (pp > 1: the "
                             f"interleaved schedule runs them on each stage), got pp 1")
        if self.moe_comm_overlap:  # Megatron-Core's TransformerConfig.__post_init__ (core_v0.19.0)
            if self.pp > 1 and self.vpp == 1:
                raise ValueError(f"moe_comm_overlap: Megatron-Core overlaps the MoE all-to-alls with pipeline "
                                 f"parallelism only under the interleaved schedule (it requires "
                                 f"virtual_pipeline_model_parallel_size when pp > 1); got pp {self.pp} with vpp 1")
            if self.recompute == "full":
                raise ValueError("moe_comm_overlap: Megatron-Core requires full recomputation off with the MoE "
                                 "all-to-all overlap, got recompute full")
        if self.optimizer_state != "fp32" and self.offload_optimizer != "none":
            raise ValueError(f"optimizer_state {self.optimizer_state}: the offloaded optimizer keeps fp32 state on the "
                             f"host (DeepSpeed's CPU Adam); turn offload_optimizer or optimizer_state off")
        for f in fields(self):
            v = getattr(self, f.name)
            if value_kind(f.name) == "ints" and v is not None:
                if isinstance(v, (str, bytes)) or not all(_is_int(x) for x in v):
                    raise ValueError(f"{f.name} must be a list of whole numbers, got {v!r}")
                object.__setattr__(self, f.name, tuple(int(x) for x in v))

    # ------------------------------------------------------------------ derived

    @property
    def microbatches(self) -> int:
        """Microbatches per iteration: global batch / (micro-batch x dp)."""
        if self.global_batch is None or self.micro_batch is None or self.dp is None:
            raise ValueError("microbatches needs global_batch, micro_batch and dp set")
        return microbatch_count(self.global_batch, self.dp, self.micro_batch)

    def describe(self) -> str:
        """``tp 2 x pp 4 x cp 1 x dp 8, micro-batch 1`` (what is set)."""
        dp = "the rest" if self.dp is None else self.dp
        mb = f", micro-batch {self.micro_batch}" if self.micro_batch is not None else ""
        moe = f", ep {self.ep}" + (f" x etp {self.etp}" if self.etp > 1 else "") if self.ep * self.etp > 1 else ""
        return f"tp {self.tp} x pp {self.pp} x cp {self.cp} x dp {dp}{moe}{mb}"

    # ------------------------------------------------------------------ options

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "Layout":
        """A layout from option names (:data:`OPTION_NAMES`, its fields); values may be text
        (``"4"``, ``"true"``, ``"7,8,8,7"``). None leaves a field at its default.

        Raises
        ------
        ValueError
            Naming the option and what it takes, for an unknown option or a value it cannot
            take (never Python's own ``invalid literal for int()``).

        >>> Layout.from_options({"tp": "2", "pp": 4, "sequence_parallel": "true"}).describe()
        'tp 2 x pp 4 x cp 1 x dp the rest'
        """
        unknown = sorted(str(k) for k in options if k not in OPTION_NAMES)
        if unknown:
            raise ValueError(f"unknown layout option {unknown[0][:40]!r}; options: {', '.join(OPTION_NAMES)}")
        kw = {k: parse_option(k, v) for k, v in options.items() if v is not None}
        return cls(**kw)

    def to_options(self) -> dict[str, Any]:
        """The options that differ from the defaults (lists for the tuples); JSON-ready and
        ``Layout.from_options(lay.to_options()) == lay``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v != f.default:
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out


def option_of(name: str) -> Option:
    """The :class:`Option` of the field ``name``.

    >>> option_of("micro_batch").label
    'micro-batch'
    """
    return _OPTIONS[name]


def options_for(kind: str) -> tuple[str, ...]:
    """The fields builder ``kind`` (one of :data:`BUILDERS`) takes, in the record's order.

    >>> "vpp" in options_for("megatron"), "vpp" in options_for("fsdp")
    (True, False)
    """
    return tuple(name for name, o in _OPTIONS.items() if kind in o.kinds)


def value_kind(name: str) -> str:
    """What the field ``name`` holds, by its annotation: ``int``, ``bool``, ``text``, ``ints``
    (a list of whole numbers) or ``names`` (a list of names from its :attr:`Option.choices`).

    >>> value_kind("tp"), value_kind("recompute_modules"), value_kind("layers_per_stage")
    ('int', 'names', 'ints')
    """
    t = str(_FIELDS[name].type)
    return ("ints" if t.startswith("tuple[int") else "names" if t.startswith("tuple[str") else
            "bool" if t == "bool" else "text" if t.startswith("str") else "int")


#: the option names a layout takes (its fields)
OPTION_NAMES = tuple(f.name for f in fields(Layout))
_OPTIONS: dict[str, Option] = {f.name: f.metadata["option"] for f in fields(Layout)}
#: the overlap, offload and buffer switches a layout carries onto its strategy (fields of the
#: same name on :class:`engine.strategy.Strategy`; ``tp_comm_overlap`` travels with sequence
#: parallelism and is not among them)
SWITCHES = ("overlap_grad_reduce", "overlap_param_gather", "offload_optimizer", "offload_params", "fp8_params",
            "grad_reduce_in_fp32", "moe_comm_overlap", "optimizer_state", "accumulate_unsharded", "kernels",
            "offload_activations", "fp8_library")
#: the switches that are on unless turned off (False is a choice for them, not "not given")
ON_BY_DEFAULT = tuple(f.name for f in fields(Layout) if f.name in SWITCHES and f.default is True)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _whole(name: str, v: Any) -> int:
    if _is_int(v):
        return v
    text = str(v).strip()
    if len(text) > 12 or not text.isascii() or not text.isdigit():
        raise ValueError(f"{name}: {text[:20]!r} is not a whole number ({name} takes "
                         f"{'0, 1, 2 or 3' if name == 'zero_stage' else 'a positive whole number: 1, 2, 4, ...'})")
    return int(text)


def parse_option(name: str, v: Any) -> Any:
    """The value of option ``name`` from text (``"4"``, ``"true"``, ``"7,8,8,7"``,
    ``"mla_up_proj,mlp"``) or its own type.

    Raises
    ------
    ValueError
        Naming the option and what it takes.

    >>> parse_option("layers_per_stage", "7,8,8,7"), parse_option("fp8", "yes")
    ((7, 8, 8, 7), True)
    """
    kind = value_kind(name)
    if kind == "bool":
        if isinstance(v, bool):
            return v
        text = str(v).strip().lower()
        if text not in ("0", "1", "false", "true", "no", "yes"):
            raise ValueError(f"{name}: {str(v)[:20]!r} is not on or off ({name} takes true/false or 1/0)")
        return text in ("1", "true", "yes")
    if kind == "text":
        choices = option_of(name).choices
        if v not in choices:
            raise ValueError(f"{name}: {str(v)[:20]!r} is not one of {', '.join(choices)}")
        return v
    if kind == "names":
        parts = [p.strip() for p in v.split(",") if p.strip()] if isinstance(v, str) else v
        choices = option_of(name).choices
        if isinstance(parts, (bytes, Mapping)) or not hasattr(parts, "__iter__") or \
                not all(p in choices for p in parts):
            raise ValueError(f"{name}: {str(v)[:40]!r} is not a list of {', '.join(choices)} (e.g. "
                             "mla_up_proj,mlp)")
        return tuple(parts)
    if kind == "ints":
        parts = v.split(",") if isinstance(v, str) else v
        if isinstance(parts, (bytes, Mapping)) or not hasattr(parts, "__iter__"):
            raise ValueError(f"{name}: {str(v)[:20]!r} is not a list of whole numbers (e.g. 7,8,8,7)")
        return tuple(_whole(name, p) for p in parts)
    return _whole(name, v)


_FIELDS = {f.name: f for f in fields(Layout)}
