"""One framework layout: the typed record every layout goes through, and the one enumerator of
the valid layouts of a model on a cluster.

A :class:`Layout` says what Megatron-LM's, DeepSpeed's and torchtitan's settings say (tensor,
pipeline, context, data and expert parallel degrees, virtual stages, micro-batch, schedule,
recomputation, sequence parallelism, ZeRO, hybrid sharding, fp8, the layer split), as
torchtitan's ``ParallelismConfig`` does (``torchtitan/config/job_config.py``). The CLI's flags,
the sweep's grid keys, export inference (:func:`engine.export.infer_layout`), the what-if
mapping (:func:`engine.studies.whatif.map_strategy`) and the Megatron baseline
(:func:`engine.search.baselines.build_layout`) all read and write this one record; option
names are the keyword names of :func:`engine.search.baselines.megatron`.

:func:`valid_layouts` lists the layouts a search may jump between (MCMC's layout moves,
:mod:`engine.search.moves`; Alpa-style planning, :mod:`engine.search.pipeline`; the sweep's
``layout_points``); :func:`layout_problem` says why one layout cannot be built on a cluster
(the smallest-cluster scan, :func:`engine.studies.sweep.smallest_fit`). Their rules are stated once,
in :func:`valid_layouts`' docstring.

This module sits just above :mod:`engine.strategy`: it builds no strategy itself (that is
:func:`engine.search.baselines.build_layout`), so every layer above may use it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Iterator, Mapping, Sequence

from ..cluster import Cluster
from ..graph import OpGraph
from ..graph.blocks import layer_blocks
from ..moe import expert_counts, moe_layout_problem
from .experts import expert_shapes
from ..strategy import GATHER_UNITS, MAX_MICROBATCHES, OFFLOAD_DEVICES, RECOMPUTE, RECOMPUTE_MODULES, SCHEDULES

__all__ = ["Layout", "microbatch_count", "micro_batch_sizes", "tp_problem", "layout_problem", "valid_layouts",
           "mesh_shapes", "OPTION_NAMES", "SWITCHES", "ON_BY_DEFAULT", "MAX_CP", "MIN_CP_TOKENS",
           "MAX_MICROBATCHES_PER_STAGE"]

#: the largest context-parallel degree the enumerator proposes by default: Megatron-Core's
#: long-context runs use 2-16 (Llama 3 405B: cp 16 at 128 K tokens only, Dubey et al. 2024
#: Table 4); each cp rank is simulated (not mirrored), so a cp of 64 on GPT-3 makes ~10 M tasks
MAX_CP = 8

#: the fewest tokens a context-parallel rank keeps (below it attention is not worth splitting)
MIN_CP_TOKENS = 512

#: the most microbatches per pipeline stage the enumerator proposes by default (8 with one
#: stage). The bubble is (pp - 1) / m of the time (Narayanan et al. SC'21 §2.2.1): 8 per stage
#: leaves it under 1/8, and every microbatch more adds tasks (GPT-3 on 1,024 GPUs, pp 32 and
#: 768 microbatches: 23 M tasks even under symmetry)
MAX_MICROBATCHES_PER_STAGE = 8

@dataclass(frozen=True)
class Layout:
    """A Megatron-shaped layout: what the three frameworks' settings can say.

    Degrees multiply to GPUs: a layout uses ``tp * cp * pp * dp`` devices, ranked as
    Megatron-Core ranks them (tp fastest, then cp, then dp, then pp; Narayanan et al. SC'21
    §3). Flag names are Megatron-LM's (``megatron/training/arguments.py``).
    """

    #: tensor-parallel degree (--tensor-model-parallel-size): GPUs splitting each layer's GEMMs
    tp: int = 1
    #: pipeline stages (--pipeline-model-parallel-size)
    pp: int = 1
    #: context-parallel degree (--context-parallel-size): GPUs splitting the sequence
    cp: int = 1
    #: data-parallel replicas; None: the cluster's devices left over, n / (tp * cp * pp)
    dp: int | None = None
    #: expert-parallel degree (--expert-model-parallel-size): ranks splitting each MoE layer's
    #: experts, folded onto the attention's dp x cp x tp ranks (:func:`engine.moe.expert_split`)
    ep: int = 1
    #: expert tensor-parallel degree (--expert-tensor-parallel-size): ranks splitting each
    #: expert's FFN width; the expert data-parallel degree is tp x cp x dp / (ep x etp)
    etp: int = 1
    #: model chunks per pipeline stage (--num-virtual-stages-per-pipeline-rank; interleaved 1F1B)
    vpp: int = 1
    #: samples per microbatch per data-parallel rank (--micro-batch-size); None: the whole
    #: per-replica batch without pipelining, 1 with it (Megatron-LM's default)
    micro_batch: int | None = None
    #: samples per iteration over all replicas (--global-batch-size); None: the model's batch
    global_batch: int | None = None
    #: pipeline schedule (one of ``SCHEDULES``); None: interleaved with vpp > 1, else 1f1b
    schedule: str | None = None
    #: activation recomputation: none, selective (attention's core), full (--recompute-granularity)
    #: or selective-op (torchtitan's per-op policy: :func:`engine.strategy.recompute.op_checkpoint_saved`)
    recompute: str = "none"
    #: with selective: Megatron-Core's --recompute-modules (e.g. mla_up_proj,mlp); empty: core_attn
    recompute_modules: tuple[str, ...] = ()
    #: Megatron sequence parallelism (--sequence-parallel; Korthikanti et al. 2022 §4.2.2)
    sequence_parallel: bool = False
    #: tensor-parallel communication overlapped with the GEMMs (--tp-comm-overlap; needs sp)
    tp_comm_overlap: bool = False
    #: ZeRO stage over each data-parallel group: 0 none, 1 optimizer state
    #: (--use-distributed-optimizer), 2 + gradients, 3 + parameters (FSDP)
    zero_stage: int = 0
    #: hybrid sharding: shard within groups of this many data-parallel ranks (HSDP, ZeRO++
    #: hpZ); 0: over the whole data-parallel group
    shard_group: int = 0
    #: what ZeRO-3 gathers at once: ``block`` (PyTorch FSDP) or ``op`` (DeepSpeed ZeRO-3)
    gather_unit: str = "block"
    #: the linear layers' GEMMs in fp8 (Transformer Engine; --fp8-format hybrid)
    fp8: bool = False
    #: the linear weights kept in fp8 (--fp8-param-gather; NeMo's fp8_params): needs fp8
    fp8_params: bool = False
    #: a bf16 model's gradients accumulated and reduced in fp32 (Megatron-LM's default for
    #: bf16; off: bf16 gradient buffer): :attr:`engine.strategy.Strategy.grad_reduce_in_fp32`
    grad_reduce_in_fp32: bool = True
    #: data-parallel gradient collectives overlapped with the backward (--overlap-grad-reduce;
    #: PyTorch DDP/FSDP always): :attr:`engine.strategy.Strategy.overlap_grad_reduce`
    overlap_grad_reduce: bool = True
    #: ZeRO-1/2's parameter all-gather overlapped with the next forward (--overlap-param-gather)
    overlap_param_gather: bool = False
    #: MoE all-to-alls under another microbatch's compute (--overlap-moe-expert-parallel-comm)
    moe_comm_overlap: bool = False
    #: ZeRO-Offload: optimizer state and step on the host (``cpu``) or NVMe (``nvme``)
    offload_optimizer: str = "none"
    #: ZeRO-Infinity: half-precision parameters in host memory (``cpu``) or on NVMe (ZeRO-3)
    offload_params: str = "none"
    #: layers on each pipeline stage (no interleaving); None: even, or balanced counting the
    #: embedding and the output layer (:func:`engine.layout.placement.balanced_layers`)
    layers_per_stage: tuple[int, ...] | None = None
    #: stage s on the (stage_mesh[s])-th block of dp * cp * tp devices (the pipeline planner's
    #: choice on heterogeneous clusters); None: stage s on block s
    stage_mesh: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "cp", "vpp", "ep", "etp"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("dp", "micro_batch", "global_batch"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or v < 1):
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        object.__setattr__(self, "recompute_modules", mods := _parse("recompute_modules", self.recompute_modules))
        if mods and self.recompute != "selective":
            raise ValueError(f"recompute_modules {','.join(mods)}: needs recompute selective (Megatron's "
                             f"--recompute-granularity selective), got {self.recompute!r}")
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise ValueError(f"zero_stage must be 0 (none), 1, 2 or 3, got {self.zero_stage!r}")
        if self.gather_unit not in GATHER_UNITS:
            raise ValueError(f"gather_unit must be one of {', '.join(GATHER_UNITS)}, got {self.gather_unit!r}")
        if not _is_int(self.shard_group) or self.shard_group < 0:
            raise ValueError(f"shard_group must be a non-negative integer, got {self.shard_group!r}")
        for name in _BOOL:
            object.__setattr__(self, name, bool(getattr(self, name)))
        for name, need in (("offload_optimizer", 1), ("offload_params", 3)):
            where = getattr(self, name)
            if where not in OFFLOAD_DEVICES:
                raise ValueError(f"{name} must be one of {', '.join(OFFLOAD_DEVICES)}, got {where!r}")
            if where != "none" and self.zero_stage < need:
                raise ValueError(f"{name} {where}: offloading {'the optimizer' if need == 1 else 'parameters'} needs "
                                 f"ZeRO stage {need}{' or above' if need < 3 else ''} (DeepSpeed's rule), got "
                                 f"{self.zero_stage}")
        for name in ("layers_per_stage", "stage_mesh"):
            v = getattr(self, name)
            if v is not None:
                if isinstance(v, (str, bytes)) or not all(_is_int(x) for x in v):
                    raise ValueError(f"{name} must be a list of whole numbers, got {v!r}")
                object.__setattr__(self, name, tuple(int(x) for x in v))

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
        """A layout from option names (:data:`OPTION_NAMES`, the keywords of
        :func:`engine.search.baselines.megatron`); values may be text (``"4"``, ``"true"``,
        ``"7,8,8,7"``). None leaves a field at its default.

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
        kw = {k: _parse(k, v) for k, v in options.items() if v is not None}
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

    def resolved(self, graph: OpGraph, cluster: Cluster) -> "Layout":
        """This layout with the defaults that depend on the model and cluster filled in (dp,
        micro-batch, global batch, schedule), or ValueError when it cannot be built there
        (:func:`layout_problem`)."""
        why = layout_problem(graph, cluster, self)
        if why:
            raise ValueError(why)
        n, batch = cluster.num_devices, graph.batch_size
        dp = self.dp if self.dp is not None else n // (self.tp * self.cp * self.pp)
        mb = self.micro_batch if self.micro_batch is not None else (batch // dp if self.pp == 1 else 1)
        return replace(self, dp=dp, micro_batch=mb, global_batch=batch,
                       schedule=self.schedule or ("interleaved" if self.vpp > 1 else "1f1b"))


#: the option names a layout takes (its fields)
OPTION_NAMES = tuple(f.name for f in fields(Layout))
#: the overlap, offload and buffer switches a layout carries onto its strategy (fields of the
#: same name on :class:`engine.strategy.Strategy`; ``tp_comm_overlap`` travels with sequence
#: parallelism and is not among them)
SWITCHES = ("overlap_grad_reduce", "overlap_param_gather", "offload_optimizer", "offload_params", "fp8_params",
            "grad_reduce_in_fp32", "moe_comm_overlap")
#: the switches that are on unless turned off (False is a choice for them, not "not given")
ON_BY_DEFAULT = tuple(f.name for f in fields(Layout) if f.name in SWITCHES and f.default is True)

_BOOL = ("sequence_parallel", "tp_comm_overlap", "fp8", "overlap_grad_reduce", "overlap_param_gather", "fp8_params",
         "grad_reduce_in_fp32", "moe_comm_overlap")
_LISTS = ("layers_per_stage", "stage_mesh")
_TEXT = {"recompute": RECOMPUTE, "schedule": SCHEDULES, "gather_unit": GATHER_UNITS,
         "offload_optimizer": OFFLOAD_DEVICES, "offload_params": OFFLOAD_DEVICES}


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


def _parse(name: str, v: Any) -> Any:
    """One option's value from text or its own type."""
    if name in _BOOL:
        if isinstance(v, bool):
            return v
        text = str(v).strip().lower()
        if text not in ("0", "1", "false", "true", "no", "yes"):
            raise ValueError(f"{name}: {str(v)[:20]!r} is not on or off ({name} takes true/false or 1/0)")
        return text in ("1", "true", "yes")
    if name in _TEXT:
        if v not in _TEXT[name]:
            raise ValueError(f"{name}: {str(v)[:20]!r} is not one of {', '.join(_TEXT[name])}")
        return v
    if name == "recompute_modules":
        parts = [p.strip() for p in v.split(",") if p.strip()] if isinstance(v, str) else v
        if isinstance(parts, (bytes, Mapping)) or not hasattr(parts, "__iter__") or \
                not all(p in RECOMPUTE_MODULES for p in parts):
            raise ValueError(f"{name}: {str(v)[:40]!r} is not a list of {', '.join(RECOMPUTE_MODULES)} (e.g. "
                             "mla_up_proj,mlp)")
        return tuple(parts)
    if name in _LISTS:
        parts = v.split(",") if isinstance(v, str) else v
        if isinstance(parts, (bytes, Mapping)) or not hasattr(parts, "__iter__"):
            raise ValueError(f"{name}: {str(v)[:20]!r} is not a list of whole numbers (e.g. 7,8,8,7)")
        return tuple(_whole(name, p) for p in parts)
    return _whole(name, v)


# --------------------------------------------------------------------------- the rules


def microbatch_count(batch: int, dp: int, micro_batch: int) -> int:
    """Microbatches an iteration of ``batch`` samples is cut into on ``dp`` data-parallel
    ranks with ``micro_batch`` samples each: batch / (micro_batch x dp). The one micro-batch
    rule (Megatron-LM ``arguments.py``: the global batch must be a multiple of micro-batch
    size x data-parallel size).

    >>> microbatch_count(32, 4, 2)
    4

    Raises
    ------
    ValueError
        When the batch does not split so.
    """
    if not _is_int(micro_batch) or micro_batch < 1:
        raise ValueError(f"micro_batch must be a positive integer, got {micro_batch!r}")
    if batch % (micro_batch * dp):
        raise ValueError(f"global batch {batch} is not a multiple of micro_batch ({micro_batch}) x dp ({dp})")
    return batch // (micro_batch * dp)


def micro_batch_sizes(batch: int, dp: int, pp: int = 1,
                      max_per_stage: int | None = MAX_MICROBATCHES_PER_STAGE) -> list[int]:
    """The micro-batch sizes (samples) allowed for ``dp`` replicas of a ``batch``: the
    divisors of the per-replica batch (:func:`microbatch_count`), at most
    ``MAX_MICROBATCHES`` microbatches, and at most ``max_per_stage`` x ``pp`` of them
    (None: no such limit); ascending.

    >>> micro_batch_sizes(32, 2), micro_batch_sizes(32, 2, max_per_stage=None)
    ([2, 4, 8, 16], [1, 2, 4, 8, 16])
    """
    if dp < 1 or batch % dp:
        return []
    per = batch // dp
    cap = MAX_MICROBATCHES if max_per_stage is None else min(MAX_MICROBATCHES, max_per_stage * pp)
    return [mb for mb in range(1, per + 1) if per % mb == 0 and per // mb <= cap]


def tp_problem(graph: OpGraph, cluster: Cluster | None, tp: int) -> str | None:
    """Why a tensor-parallel degree does not fit, or None: ``tp`` must divide every op's
    attention heads (Megatron-LM asserts that query and key/value heads are multiples of tp),
    and, given a cluster, divide :attr:`engine.cluster.Cluster.gpus_per_node`, so that the
    tensor-parallel groups (consecutive ranks) sit inside nodes (Narayanan et al. SC'21 §3.2,
    "tensor model parallelism within a server")."""
    if cluster is not None and cluster.gpus_per_node % tp:
        return (f"tp {tp} does not divide the {cluster.gpus_per_node} GPUs per node of {cluster.name}: a "
                "tensor-parallel group would span nodes")
    if tp > 1:
        for op in graph.ops:
            if "head" in op.dim_names and op.dim("head").size % tp:
                return (f"tp {tp} does not divide the {op.dim('head').size} heads of {op.name!r} (Megatron-LM needs "
                        "query and key/value heads to be multiples of tp)")
    return None


def layout_problem(graph: OpGraph, cluster: Cluster, lay: Layout) -> str | None:
    """Why ``lay`` cannot be built for ``graph`` on ``cluster`` (the first reason), or None.
    The hard rules of :func:`valid_layouts` (tiling, heads, layers, sequence, batch and
    micro-batch); not its search limits (tp within a node, the cp and microbatch caps)."""
    n, batch = cluster.num_devices, graph.batch_size
    tp, pp, cp = lay.tp, lay.pp, lay.cp
    model = tp * cp * pp
    if lay.dp is None:
        if n % model:
            return (f"tp ({tp}) x cp ({cp}) x pp ({pp}) does not divide the {n} devices of {cluster.name}" if cp > 1
                    else f"tp ({tp}) x pp ({pp}) does not divide the {n} devices of {cluster.name}")
        dp = n // model
    else:
        dp = lay.dp
        if model * dp > n:
            return (f"tp x cp x pp x dp = {tp} x {cp} x {pp} x {dp} = {model * dp} devices, but {cluster.name} has {n}"
                    if cp > 1 else f"tp x pp x dp = {tp} x {pp} x {dp} = {tp * pp * dp} devices, but {cluster.name} "
                                   f"has {n}")
    why = tp_problem(graph, None, tp)
    if why:
        return why
    n_layers = len(layer_blocks(graph))
    if pp * lay.vpp > 1 and n_layers == 0:
        return f"model {graph.name!r} has no numbered layer blocks to split into pipeline stages"
    if pp * lay.vpp > n_layers > 0:
        return f"{n_layers} layers cannot fill {pp * lay.vpp} pipeline chunks (pp x vpp)"
    if cp > 1:
        seqs = {op.dim("length").size for op in graph.ops if "length" in op.dim_names}
        if not seqs:
            return f"cp {cp}: the model has no sequence (length) dimension to split"
        need = cp * (tp if lay.sequence_parallel else 1)
        bad = sorted(s for s in seqs if s % need)
        if bad:
            return (f"cp {cp}{f' x tp {tp} (sequence parallel)' if lay.sequence_parallel else ''} does not divide "
                    f"the sequence length {bad[0]}")
    why = moe_layout_problem(graph, tp, cp, dp, lay.ep, lay.etp, lay.sequence_parallel)
    if why:
        return why
    if lay.global_batch is not None and lay.global_batch != batch:
        return (f"global batch {lay.global_batch}: the model was built with a batch of {batch} (rebuild it with "
                f"--batch {lay.global_batch})")
    if batch % dp:
        return f"global batch {batch} is not divisible by dp ({dp})"
    if lay.micro_batch is not None and batch % (lay.micro_batch * dp):
        return f"global batch {batch} is not a multiple of micro_batch ({lay.micro_batch}) x dp ({dp})"
    return None


def _cp_choices(n: int, cap: int, seqs: Sequence[int], tp: int, sp: bool) -> list[int]:
    """Context-parallel degrees of ``n`` devices: divisors up to ``cap`` that divide every
    sequence length (times tp under sequence parallelism); [1] without a sequence."""
    if not seqs:
        return [1]
    return [d for d in _divisors(n) if d <= cap and (d == 1 or not any(s % (d * (tp if sp else 1)) for s in seqs))]


def _cp_cap(seqs: Sequence[int], max_cp: int | None) -> int:
    return max(1, min(MAX_CP, min(seqs, default=0) // MIN_CP_TOKENS)) if max_cp is None else max_cp


def mesh_shapes(graph: OpGraph, cluster: Cluster, n_devices: int, *, max_cp: int | None = None,
                sequence_parallel: bool = False) -> list[tuple[int, int, int]]:
    """The (tp, cp, dp) meshes of ``n_devices`` consecutive devices (one pipeline stage, or one
    block of ops that MCMC re-lays), tp then cp ascending, by :func:`valid_layouts`' rules for
    tp (inside a node, dividing the heads) and cp (up to ``max_cp``, dividing the sequence);
    dp the devices left over.

    >>> from engine.cluster import preset
    >>> from engine.formats import resolve_model
    >>> mesh_shapes(resolve_model("gpt2", batch=8), preset("dgx-a100-80gb:1"), 8)
    [(1, 1, 8), (1, 2, 4), (2, 1, 4), (2, 2, 2), (4, 1, 2), (4, 2, 1)]
    """
    seqs = [op.dim("length").size for op in graph.ops if "length" in op.dim_names]
    cap = _cp_cap(seqs, max_cp)
    return [(tp, cp, n_devices // (tp * cp)) for tp in _divisors(n_devices) if tp_problem(graph, cluster, tp) is None
            for cp in _cp_choices(n_devices // tp, cap, seqs, tp, sequence_parallel and tp > 1)]


def valid_layouts(graph: OpGraph, cluster: Cluster, *, tps: Sequence[int] | None = None,
                  pps: Sequence[int] | None = None, micro_batches: Sequence[int] | None = None,
                  max_cp: int | None = None, max_microbatches_per_stage: int | None = MAX_MICROBATCHES_PER_STAGE,
                  **settings: Any) -> Iterator[Layout]:
    """Every valid Megatron-shaped layout of ``graph`` on ``cluster``, in the order tp, pp,
    cp, ep, etp, micro-batch (each ascending; ``dp`` the devices left over). The one enumerator: MCMC's
    layout moves, the pipeline planner and the sweep's ``layout_points`` draw from it.

    The rules (Megatron-LM ``arguments.py``; Narayanan et al. SC'21 §3):

    * **tiling**: tp x pp x cp x dp = the cluster's devices; ranks tp fastest, then cp, dp, pp.
    * **a node** is :attr:`engine.cluster.Cluster.gpus_per_node` consecutive devices; **tp
      divides it**, so every tensor-parallel group sits inside a node (its all-reduces run
      every layer, over NVLink; §3.2).
    * **heads**: tp divides every op's attention heads (query and key/value).
    * **layers**: pp is at most the number of layer blocks (1 for a model without them).
    * **sequence**: cp > 1 only for a model with a sequence (``length``) dim; cp divides
      every sequence length, and is at most ``max_cp`` (default: :data:`MAX_CP`, and each
      rank keeps at least :data:`MIN_CP_TOKENS` tokens of the shortest sequence).
    * **batch**: dp divides the global batch.
    * **experts** (MoE): (ep, etp) by :func:`expert_shapes` (dense: 1, 1); sequence parallelism
      wherever tp > 1, whatever is asked (Megatron-LM ``arguments.py`` requires it with MoE).
    * **micro-batches** (:func:`micro_batch_sizes`): the micro-batch divides the per-replica
      batch (batch / dp), and the microbatches (batch / (dp x micro-batch)) are at most
      ``max_microbatches_per_stage`` x pp (default :data:`MAX_MICROBATCHES_PER_STAGE`; None:
      no such cap).

    ``tps``, ``pps``, ``micro_batches`` restrict the candidates (default: every divisor) and
    set their order (default ascending);
    ``settings`` (recompute, zero_stage, fp8, sequence_parallel, ...) are copied into every
    layout (sequence parallelism only where tp > 1). vpp is 1 (no interleaving).

    >>> from engine.cluster import preset
    >>> from engine.formats import resolve_model
    >>> lays = list(valid_layouts(resolve_model("gpt2", batch=8), preset("p100-4x4")))
    >>> sorted({(x.tp, x.pp, x.dp) for x in lays})[:3], all(x.tp * x.pp * x.cp * x.dp == 16 for x in lays)
    ([(1, 1, 8), (1, 2, 4), (1, 2, 8)], True)
    """
    n, batch = cluster.num_devices, graph.batch_size
    n_layers = len(layer_blocks(graph))
    seqs = [op.dim("length").size for op in graph.ops if "length" in op.dim_names]
    cp_cap = _cp_cap(seqs, max_cp)
    sp = bool(settings.pop("sequence_parallel", False)) or bool(expert_counts(graph))
    for tp in (tps if tps is not None else _divisors(n)):
        if n % tp or tp_problem(graph, cluster, tp):
            continue
        tsp = sp and tp > 1
        for pp in (pps if pps is not None else _divisors(n // tp)):
            if (n // tp) % pp or pp > max(1, n_layers):
                continue
            for cp in _cp_choices(n // (tp * pp), cp_cap, seqs, tp, tsp):
                dp = n // (tp * pp * cp)
                allowed = micro_batch_sizes(batch, dp, pp, max_microbatches_per_stage)
                for ep, etp in expert_shapes(graph, tp, cp, dp):
                    for mb in (allowed if micro_batches is None else [m for m in micro_batches if m in allowed]):
                        yield Layout(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp, micro_batch=mb,
                                     sequence_parallel=tsp, **settings)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
