"""Megatron-LM (Megatron-Core) command-line flags for a layout (``soapbox export --format
megatron``), and the layout such flags give back (for round trips).

Target: **Megatron-LM core_v0.19.0** (commit 5be9626709af2722333bf54797c954c09edeada3, the newest
``core_v0.*`` release tag), ``pretrain_gpt.py``'s parser. Every name and rule below was read there
(``megatron/training/arguments.py`` unless another file is named; line numbers at that tag), and
checked by running that release's own ``parse_args`` and ``validate_args`` on CPU:

* flags made from ``ModelParallelConfig`` / ``TransformerConfig`` / ``TrainingConfig`` fields as
  ``"--" + name.replace("_", "-")`` (``megatron/training/argument_utils.py``
  ``ArgumentGroupFactory``): ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--context-parallel-size``, ``--sequence-parallel``, ``--tp-comm-overlap``, ``--bf16``,
  ``--fp16``, ``--recompute-granularity {full,selective}``, ``--recompute-method {uniform,block}``,
  ``--recompute-num-layers``, ``--recompute-modules``, ``--fp8-format {e4m3,hybrid}`` (dest
  ``fp8``), ``--fp8-recipe {tensorwise,delayed,mxfp8,blockwise,custom}`` (default delayed),
  ``--micro-batch-size``, ``--global-batch-size``, ``--ckpt-format {torch,torch_dist,torch_dcp,
  fsdp_dtensor}``, ``--overlap-moe-expert-parallel-comm``, ``--delay-wgrad-compute``;
* ``_add_distributed_args`` (l. 2936-3065): ``--decoder-first-pipeline-num-layers``,
  ``--decoder-last-pipeline-num-layers``, ``--pipeline-model-parallel-layout``,
  ``--num-virtual-stages-per-pipeline-rank``, ``--overlap-grad-reduce``, ``--overlap-param-gather``,
  ``--use-distributed-optimizer``, ``--cpu-offloading-num-layers`` (``ModelParallelConfig``),
  ``--no-bias-swiglu-fusion`` and ``--no-bias-gelu-fusion`` (l. 2755-2758),
  ``--data-parallel-sharding-strategy {no_shard,optim,optim_grads,
  optim_grads_params}``, ``--num-distributed-optimizer-instances``; ``_add_mixed_precision_args``
  (l. 2902): ``--grad-reduce-in-bf16``; ``_add_experimental_args`` (l. 3520):
  ``--megatron-fsdp-main-grads-dtype {fp32,bf16,fp16,auto}``; ``--use-megatron-fsdp``
  (``DistributedInitConfig``).

The rules of ``validate_args`` that the emitted flags meet (each also recorded as code in
``tests/megatron_args.py``):

* dp = world / (tp x pp x cp) (l. 424-446); microbatches = global / (micro x dp), which must divide
  (``megatron/core/num_microbatches_calculator.py``);
* at most one of the three virtual-pipeline flags; a layout's stages a multiple of pp, vpp = stages
  / pp (l. 878-901); interleaving needs pp > 1 (the p2p overlap is on by default, l. 940-950), and
  microbatches a multiple of pp (``megatron/core/pipeline_parallel/schedules.py``, l. 1133-1153);
  without a layout string or first/last counts the layers divide by pp (l. 927-938);
* ``--overlap-param-gather`` needs the distributed optimizer or Megatron-FSDP, and
  ``--overlap-grad-reduce`` (l. 990-995); ``--fp8-param-gather`` the same optimizers (l. 1060);
* Megatron-FSDP (l. 1100-1165) turns the distributed optimizer on, needs ``--ckpt-format
  fsdp_dtensor``, the Adam or SGD optimizer and ``CUDA_DEVICE_MAX_CONNECTIONS`` not 1; it always
  overlaps the gradient reduce-scatter when gradients are sharded and prefetches parameters under
  ``optim_grads_params`` (``megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py``
  l. 328-337), whose units are the transformer layers (``mcore_fsdp_adapter.py`` l. 158-164);
  hybrid sharding (``--num-distributed-optimizer-instances`` N > 1) shards within dp x cp / N
  consecutive data-parallel ranks and replicates across the N groups (``mcore_fsdp_adapter.py``
  l. 343-430, ``megatron/core/parallel_state.py`` l. 923-1000);
* ``--bf16`` and ``--fp16`` exclusive; under bf16 gradients are accumulated and reduced in fp32
  unless ``--grad-reduce-in-bf16`` (l. 1170-1195);
* tensor or context parallelism before Blackwell (compute capability < 10) needs
  ``CUDA_DEVICE_MAX_CONNECTIONS=1``, except with Megatron-FSDP or torch FSDP2 (a warning: FSDP asserts
  the opposite) or ``--overlap-moe-expert-parallel-comm`` (a warning) (l. 1411-1438);
* with tp 1 ``--sequence-parallel`` is turned off, and ``--tp-comm-overlap`` needs it (l. 1391-1402);
* the sequence is a multiple of 2 x cp (l. 1284-1287); selective recomputation takes no method
  (l. 1384), full needs a method and a layer count (``transformer_config.py`` l. 1724-1755);
  fp8's delayed recipe refuses ``moe_act`` / ``layernorm`` recomputation (``transformer_config.py``
  l. 1821-1826);
* the grouped GEMM needs compute capability >= 8 (l. 1338-1340).

Decisions where Megatron-LM leaves a choice are stated next to the flag they set.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from ..cluster import Cluster
from .megatron_model import megatron_model_flags
from .moe import megatron_moe_flags, megatron_pipeline_layout, moe_shape
from .refusals import refuse
from ..graph import OpGraph
from ..layout import Layout
from ..graph.blocks import layer_blocks
from ..layout.placement import balanced_layers

#: the release the flags are written for
MEGATRON_RELEASE = "Megatron-LM core_v0.19.0 (commit 5be9626709af)"

#: compute capability major version of each :data:`engine.cluster.devices.ARCHS` entry
#: (``get_device_arch_version`` in ``megatron/core/utils.py`` returns it)
ARCH_MAJOR = {"kepler": 3, "pascal": 6, "volta": 7, "turing": 7, "ampere": 8, "ada": 8, "hopper": 9,
              "blackwell": 10}

_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}


def _archs(cluster: Cluster | None) -> list[int]:
    """The compute capability majors of the cluster's devices (0: not stated)."""
    if cluster is None:
        return []
    return sorted({ARCH_MAJOR.get(cluster.device_types[d.type].arch, 0) for d in cluster.devices})


def needs_max_connections(lay: Layout, cluster: Cluster | None) -> bool:
    """Whether ``validate_args`` asserts ``CUDA_DEVICE_MAX_CONNECTIONS=1`` on some rank: tp or cp
    > 1 on a GPU before Blackwell (an unstated architecture counts as one), neither FSDP nor the
    MoE all-to-all overlap on (l. 1411-1438)."""
    if lay.tp * lay.cp == 1 or lay.zero_stage >= 2 or lay.moe_comm_overlap:
        return False
    return cluster is None or any(a < 10 for a in _archs(cluster))


def _stage_split(lay: Layout, graph: OpGraph | None) -> list[str]:
    """The layer split's flags: an even split says nothing, vpp even chunks
    ``--num-virtual-stages-per-pipeline-rank``; first and last stages that differ from even middle
    ones ``--decoder-first/last-pipeline-num-layers``; any other split a layout string."""
    n_layers = len(layer_blocks(graph)) if graph is not None else 0
    if lay.vpp > 1:
        chunks = balanced_layers(n_layers, lay.pp * lay.vpp) if graph is not None else []
        if len(set(chunks)) > 1:  # (the balanced split build_layout makes: only a layout string says it)
            return ["--pipeline-model-parallel-layout", megatron_pipeline_layout(chunks, lay.pp)]
        return ["--num-virtual-stages-per-pipeline-rank", str(lay.vpp)]
    counts = list(lay.layers_per_stage or ())
    if lay.pp == 1 or not counts or len(set(counts)) == 1:
        return []
    first, *mid, last = counts
    if first > 0 and last > 0 and len(set(mid)) <= 1 and all(mid):
        return ["--decoder-first-pipeline-num-layers", str(first), "--decoder-last-pipeline-num-layers", str(last)]
    return ["--pipeline-model-parallel-layout", megatron_pipeline_layout(counts, lay.pp)]


def _sharding(lay: Layout, graph: OpGraph | None) -> list[str]:
    """ZeRO: 1 the distributed optimizer, 2 and 3 Megatron-FSDP (``optim_grads`` shards optimizer
    state and gradients, ``optim_grads_params`` the parameters too), hybrid sharding as its
    distributed-optimizer instances."""
    if lay.zero_stage == 1:
        return ["--use-distributed-optimizer"]
    if lay.zero_stage == 0:
        return []
    if not lay.overlap_grad_reduce:
        raise refuse("megatron", f"ZeRO-{lay.zero_stage} without overlapped gradient reduction: Megatron-FSDP always "
                                  "overlaps the gradient reduce-scatter when it shards gradients",
                      "turn overlap_grad_reduce on")
    if lay.accumulate_unsharded:
        raise refuse("megatron", "unsharded gradient accumulation (FSDP's no_sync): Megatron-FSDP reduce-scatters "
                                  "into its sharded gradient buffer", "turn accumulate_unsharded off")
    if lay.zero_stage == 3 and lay.gather_unit != "block":
        raise refuse("megatron", f"ZeRO-3 gathering parameters per {lay.gather_unit}: Megatron-FSDP gathers a "
                                  "transformer layer at once (its FSDP units)", "set gather_unit to block")
    # Decision: Megatron-FSDP rather than --use-torch-fsdp2, which needs pp 1, ep 1, no fp16 and
    # --untie-embeddings-and-output-weights (l. 997-1013): a different model for tied embeddings.
    # --use-distributed-optimizer is written although validate_args turns it on (no warning then).
    f = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", _SHARDING[lay.zero_stage],
         "--use-distributed-optimizer", "--ckpt-format", "fsdp_dtensor"]
    if lay.zero_stage == 2 and graph is not None and graph.precision == "bf16" and lay.grad_reduce_in_fp32:
        # (the simulation keeps a bf16 model's sharded ZeRO-2 gradients in fp32; Megatron-FSDP's
        # "auto" would keep them in the model's dtype)
        f += ["--megatron-fsdp-main-grads-dtype", "fp32"]
    k, group = lay.shard_group, (lay.dp or 1) * lay.cp
    if k and k < group:
        n = group // k
        if graph is not None and lay.ep * lay.etp > 1:
            edp = lay.tp * group // (lay.ep * lay.etp)
            if edp % n or edp // n != min(edp, k):
                raise refuse("megatron", f"hybrid sharding in groups of {k} with experts: Megatron-FSDP shards the "
                                          f"experts within {edp} / {n} of their {edp} data-parallel ranks, the "
                                          f"simulation within {min(edp, k)}", "set shard_group to 0")
        f += ["--num-distributed-optimizer-instances", str(n)]
    return f


def _precision(lay: Layout, graph: OpGraph | None, archs: list[int]) -> list[str]:
    """``--bf16`` / ``--fp16`` for the model's precision (fp32: none), fp8's format and recipe."""
    if graph is None:
        return []
    p = graph.precision
    if p == "tf32":
        raise refuse("megatron", "tf32: Megatron-LM core_v0.19.0 has no switch for TF32 matmuls (nothing in megatron/ "
                                  "sets allow_tf32), so its fp32 GEMMs would not run at the simulated TF32 rate",
                      "simulate the model in fp32 or bf16")
    f = {"bf16": ["--bf16"], "fp16": ["--fp16"]}.get(p, [])
    if p == "bf16" and not lay.grad_reduce_in_fp32 and lay.zero_stage < 2:
        f.append("--grad-reduce-in-bf16")  # (validate_args reduces a bf16 model's gradients in fp32 otherwise)
    if lay.fp8:
        if p not in ("bf16", "fp16"):
            raise refuse("megatron", f"fp8 GEMMs on a {p} model: the simulation runs fp8 on top of bf16 or fp16 "
                                      "(Transformer Engine's mixed precision)", "build the model in bf16")
        if archs and min(archs) < 9:
            raise refuse("megatron", "fp8 GEMMs need fp8 tensor cores (Hopper or later) on every GPU",
                          "turn fp8 off or use H100/H200/B200 GPUs")
        if lay.fp8_library != "te":
            raise refuse("megatron", f"fp8 GEMMs by {lay.fp8_library}: Megatron-LM runs them through Transformer "
                                      "Engine, which keeps the fp8 input for the backward", "fp8_library te")
        if {"moe_act", "layernorm"} & set(lay.recompute_modules):
            raise refuse("megatron", "recomputing moe_act or layernorm under fp8's delayed scaling: Megatron-Core "
                                      "refuses it (transformer_config.py)", "drop those recompute modules")
        # Decision: hybrid (E4M3 forward, E5M2 gradients) with the delayed recipe, written out
        # although it is the default: one fused cast-transpose per GEMM input from the last
        # amax history, the kernel the simulation prices (engine.costs FP8_CAST_BYTES_PER_ELEMENT)
        f += ["--fp8-format", "hybrid", "--fp8-recipe", "delayed"]
        if lay.fp8_params:
            if lay.zero_stage == 0:
                raise refuse("megatron", "fp8 weights (--fp8-param-gather) need the distributed optimizer or FSDP "
                                          "(validate_args)", "set zero_stage to 1 or more")
            f.append("--fp8-param-gather")
    f += _optimizer_state(lay, p)
    return f


def _optimizer_state(lay: Layout, precision: str) -> list[str]:
    """The precision-aware optimizer's flags for ``bf16-moments`` (Adam's moments in bf16;
    core_v0.19.0 ``arguments.py`` l. 3500-3517, and ``OptimizerConfig`` asserts the distributed
    optimizer for it); ``bf16`` (no master copy) is refused: ``--main-params-dtype`` takes fp32
    or fp16 only."""
    if lay.optimizer_state == "fp32":
        return []
    if lay.optimizer_state == "bf16":
        raise refuse("megatron", "optimizer state bf16 (no fp32 master copy): Megatron-LM keeps a master copy "
                                  "of the parameters (--main-params-dtype takes fp32 or fp16)",
                      "set optimizer_state to bf16-moments or fp32")
    if lay.zero_stage < 1:
        raise refuse("megatron", "Adam's moments in bf16 (--use-precision-aware-optimizer) need the distributed "
                                  "optimizer (OptimizerConfig)", "set zero_stage to 1 or more")
    if precision not in ("bf16", "fp16"):
        raise refuse("megatron", f"Adam's moments in bf16 on a {precision} model: the precision-aware optimizer is "
                                  "for mixed precision", "build the model in bf16")
    return ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]


def to_megatron(lay: Layout, graph: OpGraph | None = None, cluster: Cluster | None = None) -> list[str]:
    """Megatron-LM (core_v0.19.0) command-line flags; with ``graph``, also the precision, the MoE
    and MLA settings (:func:`engine.export.moe.megatron_moe_flags`) and the checks that need the
    model; with ``cluster``, the checks that need the GPUs.

    Raises
    ------
    ValidationError
        What Megatron-LM cannot run as laid out (:func:`engine.export.moe.refuse`).
    """
    if not lay.loss_parallel and lay.tp > 1:
        raise refuse("megatron", "the loss on gathered logits: Megatron-Core's cross-entropy is vocabulary-parallel "
                                  "over the tensor-parallel group (tensor_parallel.vocab_parallel_cross_entropy)",
                      "keep loss_parallel on")
    if lay.recompute == "selective-op":
        raise refuse("megatron", "torchtitan's per-op selective checkpointing has no Megatron-LM flag (its "
                                  "'selective' recomputes the attention core only)", "export --format torchtitan")
    if lay.offload_optimizer != "none" or lay.offload_params != "none":
        raise refuse("megatron", "ZeRO-Offload (optimizer state and step on the host) is DeepSpeed's; Megatron-Core's "
                                  "--optimizer-cpu-offload is a different hybrid optimizer",
                      "export --format deepspeed")
    if lay.pp > 1 and lay.schedule == "gpipe":
        raise refuse("megatron", "the GPipe schedule has no Megatron-LM flag (it runs 1F1B, or interleaved with "
                                  "virtual stages)", "use 1f1b")
    if lay.vpp > 1 and lay.dp is not None and lay.global_batch and lay.micro_batch and lay.microbatches % lay.pp:
        raise refuse("megatron", f"{lay.microbatches} microbatches on {lay.pp} stages: Megatron-Core's interleaved "
                                  "schedule runs microbatches in groups of pp (schedules.py)",
                      "make the microbatches a multiple of pp")
    if graph is not None and lay.cp > 1:
        seqs = sorted({op.dim("length").size for op in graph.ops if "length" in op.dim_names})
        if any(s % (2 * lay.cp) for s in seqs):
            raise refuse("megatron", f"cp {lay.cp}: Megatron-LM needs the sequence ({seqs[0]}) to be a multiple of "
                                      f"2 x cp (load-balanced halves, validate_args)", "choose a smaller cp")
    archs = _archs(cluster)
    f = ["--tensor-model-parallel-size", str(lay.tp), "--pipeline-model-parallel-size", str(lay.pp)]
    if lay.cp > 1:
        f += ["--context-parallel-size", str(lay.cp)]
    f += _stage_split(lay, graph)
    if lay.sequence_parallel and lay.tp > 1:  # (validate_args turns it off at tp 1)
        f.append("--sequence-parallel")
        if lay.tp_comm_overlap:
            f.append("--tp-comm-overlap")
    if lay.recompute == "selective":
        f += ["--recompute-granularity", "selective"]
        if lay.recompute_modules:
            f += ["--recompute-modules", *lay.recompute_modules]
    elif lay.recompute == "full":
        # every layer's input kept, the whole layer recomputed: uniform over chunks of one layer
        f += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if lay.offload_activations:
        # (ModelParallelConfig.cpu_offloading_num_layers; arguments.py l. 1869 turns cpu_offloading on)
        f += ["--cpu-offloading-num-layers", str(lay.offload_activations)]
    if lay.kernels == "eager":
        # (TransformerConfig.bias_activation_fusion's switches: the gated MLP's activation unfused)
        f += ["--no-bias-swiglu-fusion", "--no-bias-gelu-fusion"]
    f += _sharding(lay, graph)
    if lay.moe_comm_overlap:  # (Megatron-Core 0.14's merged 1F1B; it needs the delayed weight gradient)
        f += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if lay.overlap_grad_reduce:  # (on in the simulation unless turned off; Megatron-LM's default is off)
        f.append("--overlap-grad-reduce")
    if lay.overlap_param_gather and lay.zero_stage in (1, 2):  # (ZeRO-3: Megatron-FSDP prefetches anyway)
        if not lay.overlap_grad_reduce:
            raise refuse("megatron", "--overlap-param-gather needs --overlap-grad-reduce (validate_args)",
                          "turn overlap_grad_reduce on or overlap_param_gather off")
        f.append("--overlap-param-gather")
    f += _precision(lay, graph, archs)
    f += ["--micro-batch-size", str(lay.micro_batch), "--global-batch-size", str(lay.global_batch)]
    if graph is not None:
        if moe_shape(graph) is not None and archs and min(archs) < 8 and min(archs) > 0:
            raise refuse("megatron", "the experts' grouped GEMM (--moe-grouped-gemm) needs compute capability 8 or "
                                      "more (validate_args)", "use Ampere or later GPUs")
        f += megatron_moe_flags(graph, lay)
    elif lay.ep * lay.etp > 1:
        raise ValueError("to_megatron: an expert-parallel layout's flags need the model (graph=...)")
    return f


def megatron_flags(text: str) -> list[str]:
    """The flag tokens of an export's text (:func:`render`): its comment lines and ``export``
    lines left out."""
    lines = [x for x in text.splitlines() if x.strip() and not x.lstrip().startswith(("#", "export "))]
    return shlex.split("\n".join(lines))


def _flag_values(flags: list[str]) -> dict[str, Any]:
    v: dict[str, Any] = {}
    k = 0
    while k < len(flags):
        name, values = flags[k], []
        k += 1
        while k < len(flags) and not flags[k].startswith("--"):  # (--recompute-modules takes several)
            values.append(flags[k])
            k += 1
        v[name] = (values if name == "--recompute-modules" else values[0]) if values else True
    return v


def _unroll(layout: str) -> list[str]:
    """PipelineParallelLayerLayout.parse_str_to_list's chunks (commas cosmetic, ``(..)*n`` and
    ``x*n`` repeat; megatron/core/transformer/pipeline_parallel_layer_layout.py)."""
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    return text.split("|")


def layout_from_megatron(flags: list[str] | str, base: Layout) -> Layout:
    """The layout Megatron-LM flags give (a list of tokens, or an export's whole text); ``base``
    supplies what they do not say: dp (the world size is not a flag), the layer split when even,
    the gather unit, the fp32 gradient switch of a model that is not bf16. For round trips."""
    v = _flag_values(megatron_flags(flags) if isinstance(flags, str) else list(flags))
    tp, pp, cp = int(v["--tensor-model-parallel-size"]), int(v["--pipeline-model-parallel-size"]), \
        int(v.get("--context-parallel-size", 1))
    mb, gb = int(v["--micro-batch-size"]), int(v["--global-batch-size"])
    counts = base.layers_per_stage
    if "--decoder-first-pipeline-num-layers" in v:
        first, last = int(v["--decoder-first-pipeline-num-layers"]), int(v["--decoder-last-pipeline-num-layers"])
        total = sum(base.layers_per_stage or ())
        mid = (total - first - last) // max(1, pp - 2)
        counts = (first, *([mid] * (pp - 2)), last)
    vpp = int(v.get("--num-virtual-stages-per-pipeline-rank", 1))
    if "--pipeline-model-parallel-layout" in v:
        chunks = _unroll(v["--pipeline-model-parallel-layout"])
        vpp = len(chunks) // pp
        if vpp == 1:
            counts = tuple(c.count("t") for c in chunks)
    zero = 1 if v.get("--use-distributed-optimizer") else 0
    shard_group = 0
    if v.get("--use-megatron-fsdp"):
        zero = {"optim_grads": 2, "optim_grads_params": 3}[v["--data-parallel-sharding-strategy"]]
        n = int(v.get("--num-distributed-optimizer-instances", 1))
        shard_group = (base.dp or 1) * cp // n if n > 1 else 0
    if "--bf16" in v:
        grads_fp32 = "--grad-reduce-in-bf16" not in v if zero < 2 else \
            (v.get("--megatron-fsdp-main-grads-dtype") == "fp32" if zero == 2 else base.grad_reduce_in_fp32)
    else:
        grads_fp32 = base.grad_reduce_in_fp32
    ep, etp = int(v.get("--expert-model-parallel-size", 1)), int(v.get("--expert-tensor-parallel-size", 1))
    return Layout(tp=tp, pp=pp, dp=base.dp, cp=cp, ep=ep, etp=etp, vpp=vpp, micro_batch=mb, global_batch=gb,
                  schedule="interleaved" if vpp > 1 else "1f1b", recompute=v.get("--recompute-granularity", "none"),
                  zero_stage=zero, sequence_parallel=bool(v.get("--sequence-parallel")) or
                  (tp == 1 and base.sequence_parallel), fp8="--fp8-format" in v,
                  tp_comm_overlap=bool(v.get("--tp-comm-overlap")) or (tp == 1 and base.tp_comm_overlap),
                  layers_per_stage=counts, gather_unit=base.gather_unit, shard_group=shard_group,
                  overlap_grad_reduce="--overlap-grad-reduce" in v,
                  overlap_param_gather="--overlap-param-gather" in v or (zero == 3 and base.overlap_param_gather),
                  fp8_params="--fp8-param-gather" in v, grad_reduce_in_fp32=grads_fp32,
                  recompute_modules=tuple(v.get("--recompute-modules", ())),
                  moe_comm_overlap="--overlap-moe-expert-parallel-comm" in v,
                  optimizer_state="bf16-moments" if v.get("--use-precision-aware-optimizer")
                  and v.get("--exp-avg-dtype") == v.get("--exp-avg-sq-dtype") == "bf16" else "fp32",
                  kernels="eager" if "--no-bias-swiglu-fusion" in v else base.kernels,
                  offload_activations=int(v.get("--cpu-offloading-num-layers", 0)))


def render(lay: Layout, graph: OpGraph, cluster: Cluster) -> str:
    """The export's text: comment lines naming the release and what the user must add or know,
    ``export CUDA_DEVICE_MAX_CONNECTIONS=1`` where Megatron-LM needs it, then the flags on one
    line (shell-quoted: a layout string or --moe-layer-freq list has | ( ) *)."""
    flags = to_megatron(lay, graph, cluster)
    model, model_notes, why = megatron_model_flags(graph, lay.tp)
    notes = [f"# {MEGATRON_RELEASE}, megatron/training/arguments.py: pretrain_gpt.py flags for {graph.name} on "
             f"{cluster.name} ({lay.tp * lay.cp * lay.pp * (lay.dp or 1)} GPUs, dp {lay.dp}, "
             f"{lay.microbatches} microbatch{'es' if lay.microbatches != 1 else ''})"]
    if why is None:
        notes += ["# add the data, the tokenizer and the optimizer (Adam, as simulated)", *model_notes]
    else:
        notes.append(f"# add the flags of the model (--num-layers, --hidden-size, --num-attention-heads, --seq-length, "
                     f"...; soapbox does not write them for {why}), the data, the tokenizer and the optimizer (Adam, "
                     "as simulated)")
    if lay.zero_stage >= 2:
        notes.append("# Megatron-FSDP: leave CUDA_DEVICE_MAX_CONNECTIONS unset (validate_args asserts it is not 1); "
                     "checkpoints are written as fsdp_dtensor")
        if lay.zero_stage == 2 and graph.precision != "fp32" and not (graph.precision == "bf16"
                                                                        and lay.grad_reduce_in_fp32):
            notes.append("# memory: Megatron-FSDP keeps no fp32 copy of the gradient shard, which the simulation "
                         "counts (4 bytes per sharded parameter less than simulated)")
    elif lay.moe_comm_overlap and lay.tp * lay.cp > 1:
        notes.append("# CUDA_DEVICE_MAX_CONNECTIONS left unset: with --overlap-moe-expert-parallel-comm Megatron-LM "
                     "only warns, and the overlap wants more than one connection")
    env = ["export CUDA_DEVICE_MAX_CONNECTIONS=1"] if needs_max_connections(lay, cluster) else []
    return "\n".join(notes + env + [shlex.join(flags + model)]) + "\n"
