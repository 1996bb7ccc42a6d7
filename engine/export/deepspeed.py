"""A DeepSpeed config (JSON) for a layout (``soapbox export --format deepspeed``), and the
layout such a config gives back (for round trips).

Target: DeepSpeed 0.19.8 (the installed wheel, pinned as a test extra; its
``git_version_info_installed.py`` records no commit). Every key and rule below was read from
that release's source; paths are relative to the ``deepspeed`` package:

* ``runtime/config.py``: ``DeepSpeedConfig`` reads the keys it knows with ``dict.get`` and
  ignores any other top-level key, so the export states its target in a top-level ``"soapbox"``
  block (``target``, ``notes``), which DeepSpeed neither reads nor warns about. It rejects the
  removed features by name (``_REMOVED_ZERO_CONFIG_KEYS``: ``mics_shard_size`` and
  ``mics_hierarchical_params_gather``, "MiCS ZeRO-3 sharding has been removed"), and checks
  ``train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps *
  world_size`` (``_batch_assertion``), where ``world_size`` is the mpu's
  ``get_data_parallel_world_size()`` when ``deepspeed.initialize`` gets an mpu, else every rank
  (``dist.get_world_size()``).
* ``runtime/zero/config.py``: ``stage``, ``overlap_comm``, ``offload_optimizer``,
  ``offload_param``, ``stage3_prefetch_bucket_size`` (5e7 by default); ``zero_hpz_partition_size``
  (ZeRO++ hpZ) is a *secondary* copy of the ZeRO-3 parameters, not a shard group.
* ``runtime/activation_checkpointing/config.py``: the ``activation_checkpointing`` block only
  configures ``deepspeed.checkpointing`` (``checkpointing.py``), which recomputes what the model
  code wraps in ``deepspeed.checkpointing.checkpoint(...)``; ``number_checkpoints`` sizes the
  contiguous buffers (``contiguous_memory_optimization``), ``partition_activations`` splits the
  saved inputs over the model-parallel ranks.
* ``runtime/precision_config.py``: ``bf16``/``fp16`` ``enabled``; ``runtime/constants.py``:
  ``data_types.grad_accum_dtype``. ``runtime/engine.py`` (``get_data_types``,
  ``_do_optimizer_sanity_check``): a bf16 model with ``grad_accum_dtype`` fp32 runs under ZeRO
  only (without ZeRO it raises ``NotImplementedError``); at ZeRO-1 it is the ``BF16_Optimizer``
  (``runtime/bf16_optimizer.py``), which has no ``reduce_gradients`` and so is reduced after the
  backward (``allreduce_gradients``: ``buffered_allreduce_fallback``), as ZeRO-0's gradients
  always are. ``communication_data_type`` left unset is the model's dtype
  (``communication_data_type`` property), as the simulation prices the gradient collectives.
* ``runtime/tensor_parallel/config.py`` (``TPTrainingConfig``): ``tensor_parallel.autotp_size``,
  ``preset_model``, ``vocab_parallel_lm_head``; ``module_inject/auto_tp.py``: without a
  ``partition_config`` or preset, training AutoTP splits the output layer (``lm_head``) over the
  vocabulary (``training_column_lm_head``); with a preset only the preset's layer patterns are
  split and every other module stays whole (``_replace_with_config``);
  ``module_inject/autotp_config.py`` (``AutoTPPresets``): the presets' column/row splits of the
  attention and MLP projections are Megatron's.
* Nothing in ``runtime/`` turns fp8 training on: "fp8" occurs only in the quantizer ops
  (``ops/fp_quantizer``) and ``linear/config.py`` (LoRA weight quantization).
"""

from __future__ import annotations

from typing import Any
import json
import re

from ..cluster import Cluster
from .moe import deepspeed_expert_parallel
from .refusals import refuse
from ..graph import OpGraph
from ..layout import Layout
from ..graph.blocks import layer_blocks

#: the release every key and rule here was read from
TARGET = "DeepSpeed 0.19.8"

#: DeepSpeed's ZeRO-3 ``stage3_prefetch_bucket_size`` default (runtime/zero/config.py), the one
#: the simulation's per-op gathers use (:data:`engine.taskgraph.sync.DEEPSPEED_PREFETCH_ELEMENTS`)
PREFETCH_BUCKET = 50_000_000

#: DeepSpeed's AutoTP presets (module_inject/autotp_config.py, ``AutoTPPresets.get_preset``)
#: for dense models, by the model name's prefix
AUTOTP_PRESETS = {"llama": "llama", "qwen2": "qwen2", "phi3": "phi3", "phi-3": "phi3"}


#: the Hugging Face families whose modules those presets name (the model_type an import records
#: in its source, :func:`engine.models.hf.from_hf_config`)
AUTOTP_FAMILIES = {"llama": "llama", "qwen2": "qwen2", "phi3": "phi3"}


def _preset(graph: OpGraph | None) -> str | None:
    """The AutoTP preset of ``graph``: by the Hugging Face family it was imported from (a Hub
    name such as ``meta-llama/Llama-3.1-8B`` included), else by its name's prefix (the samples:
    ``llama2-7b``)."""
    if graph is None:
        return None
    m = re.match(r"imported from a Hugging Face config \(([a-z0-9_]+)\)", graph.source or "")
    if m:
        return AUTOTP_FAMILIES.get(m.group(1))
    name = graph.name.lower().rsplit("/", 1)[-1]
    return next((p for prefix, p in AUTOTP_PRESETS.items() if name.startswith(prefix)), None)


def _check(lay: Layout, precision: str, graph: OpGraph | None) -> None:
    """Refuse what DeepSpeed 0.19.8 cannot run as simulated."""
    if lay.pp > 1 or lay.cp > 1:
        raise refuse("deepspeed", f"pipeline / context parallelism (pp {lay.pp}, cp {lay.cp}) needs a PipelineModule "
                                   "or Ulysses in the model code, which a DeepSpeed config does not set",
                      "export --format megatron (Megatron-DeepSpeed takes its flags) or torchtitan")
    if lay.tp > 1:
        if any(op.kind == "experts" for op in (graph.ops if graph is not None else ())):
            raise refuse("deepspeed", f"tp {lay.tp} on a mixture-of-experts model: AutoTP's MoE presets split the "
                                       "experts over the tp ranks, where AutoEP's expert_tensor_parallel_size must "
                                       "be 1", "export --format megatron (--expert-tensor-parallel-size)")
        if lay.sequence_parallel:
            raise refuse("deepspeed", f"tp {lay.tp} with sequence parallelism: DeepSpeed's AutoTP is Megatron-style "
                                       "tensor parallelism without it", "export --format megatron or torchtitan")
        if _preset(graph) is None:
            raise refuse("deepspeed", f"tp {lay.tp} on {getattr(graph, 'name', '?')!r}: without an AutoTP preset "
                                       "DeepSpeed's training AutoTP splits the output layer over the vocabulary "
                                       "(module_inject/auto_tp.py), where the simulation keeps it whole on each tp "
                                       "rank", "export --format megatron or torchtitan")
    if lay.fp8:
        raise refuse("deepspeed", f"fp8 GEMMs: {TARGET}'s config has no fp8 training switch",
                      "export --format megatron (--fp8-format hybrid) or torchtitan")
    if lay.moe_comm_overlap:
        raise refuse("deepspeed", "Megatron-Core's merged-1F1B all-to-all overlap has no DeepSpeed setting",
                      "export --format megatron")
    if lay.recompute == "selective":
        raise refuse("deepspeed", "selective recomputation (Megatron's: attention's core only) has no DeepSpeed "
                                   "setting; DeepSpeed checkpoints whole layers", "export --format megatron")
    if lay.recompute == "selective-op":
        raise refuse("deepspeed", "torchtitan's per-op selective checkpointing has no DeepSpeed setting",
                      "export --format torchtitan")
    if lay.accumulate_unsharded:
        raise refuse("deepspeed", "unsharded gradient accumulation (FSDP's no_sync): DeepSpeed's ZeRO-3 reduces each "
                                   "micro-batch's gradients", "turn accumulate_unsharded off")
    if lay.offload_activations:
        raise refuse("deepspeed", "activation offloading without recomputation (Megatron-Core's "
                                   "--cpu-offloading-num-layers): DeepSpeed offloads activation checkpoints "
                                   "(cpu_checkpointing) only under recomputation", "export --format megatron")
    if lay.optimizer_state != "fp32":
        raise refuse("deepspeed", f"optimizer state {lay.optimizer_state}: DeepSpeed's mixed-precision optimizers keep "
                                   "fp32 master weights and fp32 Adam moments", "set optimizer_state to fp32, or export "
                                   "--format megatron (bf16-moments: --use-precision-aware-optimizer)")
    for key, where in (("offload_optimizer", lay.offload_optimizer), ("offload_param", lay.offload_params)):
        if where == "nvme":
            raise refuse("deepspeed", f"{key} to NVMe needs the nodes' NVMe mount (nvme_path), which soapbox does not "
                                       "know", f"export with cpu, then set {key}.device to nvme and its nvme_path")
    dp = lay.dp or 1
    if 0 < lay.shard_group < dp:
        raise refuse("deepspeed", f"hybrid sharding (shard_group {lay.shard_group} of {dp} dp ranks): {TARGET} "
                                   "removed MiCS (mics_shard_size is rejected) and ZeRO++'s zero_hpz_partition_size "
                                   "is a secondary copy of the ZeRO-3 parameters, not a shard group",
                      "export --format torchtitan (data_parallel_shard_degree), or shard over all dp ranks")
    if lay.zero_stage == 3 and lay.gather_unit != "op":
        raise refuse("deepspeed", f"ZeRO-3 gathering a whole {lay.gather_unit} at once (FSDP's unit): DeepSpeed's "
                                   "ZeRO-3 gathers module by module, prefetching stage3_prefetch_bucket_size elements",
                      "set gather_unit to op, or export --format torchtitan (FSDP)")
    if lay.overlap_param_gather and lay.zero_stage in (1, 2):
        raise refuse("deepspeed", "overlap_param_gather: DeepSpeed's ZeRO-1/2 all-gather the updated parameters in "
                                   "the optimizer step, not under the next forward",
                      "turn overlap_param_gather off, or export --format megatron (--overlap-param-gather)")
    fp32_accum = precision == "bf16" and lay.grad_reduce_in_fp32 and lay.zero_stage < 3
    if fp32_accum and lay.zero_stage == 0:
        raise refuse("deepspeed", "a bf16 model's gradients accumulated in fp32 (grad_reduce_in_fp32) without ZeRO: "
                                   f"{TARGET} raises NotImplementedError for data_types.grad_accum_dtype fp32 there",
                      "use ZeRO stage 1 or 2, or turn grad_reduce_in_fp32 off (bf16 gradients)")
    if lay.overlap_grad_reduce and (lay.zero_stage == 0 or (lay.zero_stage == 1 and fp32_accum)):
        what = "without ZeRO" if lay.zero_stage == 0 else "with ZeRO-1's BF16_Optimizer (bf16, fp32 gradients)"
        raise refuse("deepspeed", f"gradient reduction overlapped with the backward (overlap_grad_reduce) {what}: "
                                   "DeepSpeed reduces those gradients after the backward",
                      "turn overlap_grad_reduce off, or use ZeRO stage 2")


def to_deepspeed(lay: Layout, precision: str, graph: OpGraph | None = None) -> dict[str, Any]:
    """A DeepSpeed config: ZeRO data parallelism, AutoTP tensor parallelism (with a preset),
    AutoEP expert parallelism, recomputation and precision, with a ``soapbox`` block naming
    the target release and what the model code must do.

    Raises
    ------
    ValidationError
        What DeepSpeed 0.19.8 cannot run as simulated, with what would do instead.
    """
    ep = deepspeed_expert_parallel(lay, graph)  # (first: what AutoEP cannot run)
    _check(lay, precision, graph)
    notes: list[str] = []
    cfg: dict[str, Any] = {"soapbox": {"target": TARGET, "notes": notes}}
    if lay.tp == 1:
        cfg["train_batch_size"] = lay.global_batch
    else:
        notes.append(f"train_batch_size is left to DeepSpeed: with AutoTP and no mpu it counts every rank "
                     f"(micro x accumulation x world size), where {lay.global_batch} samples are distinct "
                     f"(the {lay.tp} tp ranks of a group read the same samples)")
    cfg["train_micro_batch_size_per_gpu"] = lay.micro_batch
    cfg["gradient_accumulation_steps"] = lay.microbatches
    z: dict[str, Any] = {"stage": lay.zero_stage, "overlap_comm": lay.overlap_grad_reduce}
    cfg["zero_optimization"] = z
    if lay.zero_stage == 3:
        z["stage3_prefetch_bucket_size"] = PREFETCH_BUCKET
        notes.append("ZeRO-3 gathers each module's parameters before its use, prefetching up to "
                     f"{PREFETCH_BUCKET:.0e} elements ahead (as simulated: gather_unit op)")
    for key, where in (("offload_optimizer", lay.offload_optimizer), ("offload_param", lay.offload_params)):
        if where == "cpu":
            z[key] = {"device": "cpu", "pin_memory": True}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
        if lay.zero_stage < 3:
            cfg["data_types"] = {"grad_accum_dtype": "fp32" if lay.grad_reduce_in_fp32 else "bf16"}
    elif precision == "fp16":
        cfg["fp16"] = {"enabled": True}
    if lay.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": lay.tp, "preset_model": _preset(graph),
                                  "vocab_parallel_lm_head": False}
        notes.append("AutoTP splits the preset's attention and MLP projections (column, then row); the embedding "
                     "and the output layer stay whole on every tp rank, as simulated")
    if lay.recompute == "full":
        layers = len(layer_blocks(graph)) if graph is not None else None
        cfg["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False,
                                           "contiguous_memory_optimization": False, "number_checkpoints": layers,
                                           "synchronize_checkpoint_boundary": False, "profile": False}
        notes.append("full recomputation: the model code must checkpoint each transformer layer, "
                     "deepspeed.checkpointing.checkpoint(layer, ...) after deepspeed.checkpointing.configure(mpu, "
                     "deepspeed_config=...) (or Hugging Face's model.gradient_checkpointing_enable()); "
                     "this block configures that call and turns nothing on by itself")
    if ep is not None:
        cfg["expert_parallel"] = ep
    return cfg


def layout_from_deepspeed(cfg: dict[str, Any], base: Layout) -> Layout:
    """The layout a config written by :func:`to_deepspeed` says (``base`` gives the global
    batch under AutoTP, where the config leaves ``train_batch_size`` out)."""
    mb, acc = int(cfg["train_micro_batch_size_per_gpu"]), int(cfg["gradient_accumulation_steps"])
    tp = int(cfg.get("tensor_parallel", {}).get("autotp_size", 0) or 1)
    gb = int(cfg.get("train_batch_size", base.global_batch))
    z = cfg["zero_optimization"]
    dtypes = cfg.get("data_types", {})
    return Layout(tp=tp, pp=1, dp=gb // (mb * acc), cp=1, vpp=1, micro_batch=mb, global_batch=gb, schedule="1f1b",
                  recompute="full" if "activation_checkpointing" in cfg else "none",
                  zero_stage=int(z["stage"]), sequence_parallel=False, fp8=False, tp_comm_overlap=False,
                  layers_per_stage=None, gather_unit="op" if int(z["stage"]) == 3 else base.gather_unit,
                  shard_group=base.shard_group if base.shard_group >= (base.dp or 1) else 0,
                  overlap_grad_reduce=bool(z.get("overlap_comm", base.overlap_grad_reduce)),
                  grad_reduce_in_fp32=(dtypes["grad_accum_dtype"] == "fp32" if "grad_accum_dtype" in dtypes
                                       else base.grad_reduce_in_fp32),
                  offload_optimizer=z.get("offload_optimizer", {}).get("device", "none"),
                  offload_params=z.get("offload_param", {}).get("device", "none"),
                  ep=int(cfg.get("expert_parallel", {}).get("autoep_size", 1)))


def render(lay: Layout, graph: OpGraph, cluster: Cluster) -> str:
    """The export's text: the JSON config (its ``soapbox`` block names the target release)."""
    return json.dumps(to_deepspeed(lay, graph.precision, graph), indent=2) + "\n"
