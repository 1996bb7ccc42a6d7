"""The generic row reader: a published run's columns -> model (``GPTConfig``), cluster preset
and the ``fsdp`` or ``megatron`` baseline with the row's layout (:func:`setup_for`).

Columns read: ``layers``, ``hidden``, ``heads``, ``kv_heads``, ``ffn_hidden``, ``seq_len``,
``vocab``, ``global_batch``, ``micro_batch``, ``gpus``, ``gpu_type``, ``tp``, ``pp``, ``dp``,
``cp``, ``vpp``, ``sharding`` (ZeRO stage, gather unit, framework), ``recompute`` and
``precision``, after the family's reader (``published_rows.READERS``) has filled what its
source leaves implicit. FSDP-style rows (FSDP, FSDP2, ZeRO-3, "Megatron FSDP") use the
``fsdp`` baseline: FSDP2 is ZeRO-3 with one gather unit per transformer block (torchtitan
wraps each ``TransformerBlock`` in ``fully_shard``), "FSDP2 over N ranks" with tp gives dp = N.
Megatron-style rows use ``megatron``: the distributed optimizer is ZeRO-1.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from published_rows import (FUSED_ATTENTION, READERS, UNFUSED_ATTENTION, Setup, Skip, _cluster_name, _gpus_per_node,
                            cell_int, expert_parallel_of, is_moe, memory_counter, software_of, source_of)

from engine.layout import Layout
from engine.models import build_sample
from engine.models.transformer import GPTConfig
from engine.layout.build import build_layout, fsdp

__all__ = ["setup_for"]

_LLAMA_WORDS = ("llama", "mistral", "mixtral", "qwen", "swiglu", "gemma", "nemotron")


def _zero_of(row: dict[str, str]) -> tuple[int, str, str, bool]:
    """(ZeRO stage, gather unit, framework, hybrid) from the row's ``sharding`` column.

    PyTorch FSDP's sharding strategies (torch.distributed.fsdp.ShardingStrategy): FULL_SHARD
    shards parameters, gradients and optimizer state (ZeRO-3); SHARD_GRAD_OP shards gradients
    and optimizer state and keeps parameters after the forward (ZeRO-2). DeepSpeed names its
    stages ZeRO-1/2/3 and gathers each module's parameters on their own (gather unit "op");
    Megatron's distributed optimizer is ZeRO-1. HYBRID_SHARD (HSDP) shards within a node
    and replicates across nodes; _HYBRID_SHARD_ZERO2 does so with ZeRO-2."""
    text = " ".join((row.get("sharding") or "", row.get("source") or "")).lower()
    sharding = (row.get("sharding") or "").lower()
    deepspeed = "deepspeed" in text or "zero" in sharding and "fsdp" not in sharding
    hybrid = "hybrid_shard" in sharding or "hsdp" in sharding or "mics" in sharding
    if hybrid:
        stage = 2 if "zero2" in sharding else 3
    elif "full_shard" in sharding or any(k in sharding for k in ("zero-3", "zero3", "zero stage 3", "stage 3")):
        stage = 3
    elif "shard_grad_op" in sharding or any(k in sharding for k in ("zero-2", "zero2", "zero stage 2", "stage 2")):
        stage = 2
    elif any(k in sharding for k in ("zero-1", "zero1", "zero stage 1", "stage 1", "distributed optimizer",
                                     "distributed-optimizer", "distributed_optimizer")):
        stage = 1
    elif "fsdp" in sharding:
        stage = 3  # FSDP's default sharding strategy; FSDP2's fully_shard; Megatron FSDP
    else:
        stage = 0
    framework = "deepspeed" if deepspeed else "fsdp" if "fsdp" in text else "megatron"
    return stage, ("op" if deepspeed and stage == 3 else "block"), framework, hybrid


def _model_config(row: dict[str, str], src: str, shape: dict[str, Any], precision: str,
                  notes: list[str]) -> GPTConfig:
    """The row's model: the source's conventions where soapbox knows them, else the family
    its name says (LLaMA-like: SwiGLU, RMSNorm, rotary, no biases, untied; otherwise GPT-3's
    conventions as Megatron-LM sets them)."""
    name = f"row-{row['row_id']}"
    text = " ".join((row.get("model") or "", row.get("notes") or "")).lower()
    gpu = (row.get("gpu_type") or "").upper()
    if src in ("Megatron SC'21", "Megatron 2019"):
        return GPTConfig(**shape, positions="learned", bias=True, tie_embeddings=True, dropout=0.1,
                         precision=precision, name=name)
    if src == "MosaicML":
        # MPT (llm-foundry): ALiBi (no position parameters -> 'rotary', which adds none), no
        # biases, LayerNorm, tied embeddings; the benchmark yamls set every dropout to 0.
        # attn_impl: flash in the benchmark yamls -> fused causal attention.
        return GPTConfig(**shape, positions="rotary", bias=False, tie_embeddings=True, dropout=0.0,
                         precision=precision, flash_attention=True, name=name)
    # FlashAttention (or cuDNN's fused attention through Transformer Engine) is every framework's
    # default on Hopper; elsewhere where the row or its framework's default says so
    flash = "flash" in text or "fused attention" in text or src in FUSED_ATTENTION or gpu.startswith(
        ("H100", "H200", "GH200"))
    if flash and src in UNFUSED_ATTENTION:
        flash = False
        notes.append(f"attention unfused (scores materialised): {UNFUSED_ATTENTION[src]}")
    if flash and "flash" not in text:
        notes.append(f"fused (flash) attention: {FUSED_ATTENTION.get(src, 'the default of every framework on Hopper')}")
    if any(k in text for k in _LLAMA_WORDS):
        notes.append("LLaMA-family model: SwiGLU MLP, RMSNorm, rotary positions, no biases, untied embeddings")
        return GPTConfig(**shape, swiglu=True, norm="rmsnorm", positions="rotary", bias=False, tie_embeddings=False,
                         dropout=0.0, precision=precision, flash_attention=flash, name=name)
    dropout = 0.1
    if src == "Sailor" and (row.get("model") or "").upper().startswith("OPT"):
        # the fork's OPT layer (megatron/model/opt_model.py at cf2c8e3) has its residual dropouts
        # commented out and none on the attention probabilities
        dropout = 0.0
        notes.append("no dropout: Sailor's OPT layer applies none (megatron/model/opt_model.py at cf2c8e3)")
    notes.append("GPT-style model (Megatron-LM's GPT conventions: learned positions, biases, tied embeddings, "
                 f"dropout {dropout:g})")
    return GPTConfig(**shape, positions="learned", bias=True, tie_embeddings=True, dropout=dropout,
                     precision=precision, flash_attention=flash, name=name)


def _shape(row: dict[str, str], src: str, notes: list[str]) -> tuple[dict[str, Any], int]:
    """(GPTConfig shape fields, GPUs) from the row; a Skip naming what is missing."""
    need = {k: cell_int(row, k) for k in ("layers", "hidden", "heads", "vocab", "global_batch", "gpus")}
    missing = [k for k, v in need.items() if v is None]
    if missing:
        raise Skip(f"missing {', '.join(missing)} in the row")
    seq = cell_int(row, "seq_len")
    if seq is None:
        if src != "Megatron 2019":
            raise Skip("seq_len missing and the source states none")
        # Not a guess: Shoeybi et al. 2019 (arXiv 1909.08053 §5) train every GPT-2 model
        # with 1024-token sequences, as the row's notes say.
        seq = 1024
        notes.append("seq_len missing: 1024, the sequence length of all GPT-2 runs in Shoeybi et al. 2019")
    ffn = cell_int(row, "ffn_hidden")
    if ffn is None and not any(k in (row.get("model") or "").lower() for k in ("llama", "mistral", "qwen")):
        ffn = 4 * need["hidden"]
        notes.append(f"ffn_hidden missing: 4h = {ffn} (GPT-2 / Megatron default)")
    shape = dict(layers=need["layers"], hidden=need["hidden"], heads=need["heads"], seq_len=seq,
                 vocab=need["vocab"], batch=need["global_batch"], kv_heads=cell_int(row, "kv_heads"), ffn_hidden=ffn)
    return shape, need["gpus"]


#: Families whose "selective" is torchtitan's per-op selective activation checkpointing
#: (``selective_ac_option = "op"``, its Llama 3 configs' default), not Megatron's
OP_SAC_FAMILIES = ("torchtitan", "torchtitan-community", "KempnerForge")


def _precision(row: dict[str, str], notes: list[str]) -> tuple[str, bool, str]:
    """(model precision, fp8 GEMMs, recompute) from the ``precision`` and ``recompute`` columns.
    A torchtitan-family row's "selective" is torchtitan's per-op policy (``selective-op``:
    :func:`engine.strategy.op_checkpoint_saved`)."""
    rec_col = (row.get("recompute") or "").strip().lower()
    recompute = "full" if rec_col.startswith("full") else "selective" if rec_col.startswith("selective") else "none"
    if recompute == "selective" and source_of(row) in OP_SAC_FAMILIES:
        if "layer" in rec_col:  # selective_ac_option = "N": every N-th block fully checkpointed
            raise Skip(f"recompute {row.get('recompute')!r}: torchtitan's layer-wise selective checkpointing "
                       "(every N-th block) is not modelled")
        recompute = "selective-op"
        notes.append("selective recompute: torchtitan's per-op policy (selective_ac_option 'op': every second "
                     "mm's and the fused attention's outputs saved, the rest of each block recomputed)")
    if not rec_col or rec_col.startswith("not stated"):
        notes.append("recompute not stated: none (Megatron-LM default); FLOPs counted without recompute")
    prec_col = (row.get("precision") or "").lower()
    fp8 = "fp8" in prec_col
    precision = next((p for p in ("bf16", "fp16", "tf32", "fp32") if p in prec_col), None)
    if fp8 and precision is None:
        precision = "bf16"
        notes.append("fp8: the linear layers' GEMMs in fp8 (Transformer Engine / torchao float8), the rest in bf16")
    if precision is None:
        raise Skip(f"precision {row.get('precision')!r} not recognised")
    return precision, fp8, recompute


#: Families whose framework runs tensor parallelism with sequence parallelism whenever tp > 1:
#: NeMo's and Megatron-Bridge's performance recipes (sequence_parallel with tp > 1, and
#: tp_comm_overlap, overlap_grad_reduce and overlap_param_gather on: the recipes the rows'
#: notes point to, not their pages), torchtitan's 2-D parallelism (SequenceParallel on the
#: norms; its "async TP" overlaps the collectives with the GEMMs).
RECIPE_OVERLAPS = ("NeMo long-seq", "Megatron-Bridge")
SP_WITH_TP = ("NeMo long-seq", "Megatron-Bridge", "torchtitan", "torchtitan-community")


def _overlaps(row: dict[str, str], tp: int, notes: list[str]) -> tuple[bool, bool]:
    """(sequence parallel, tp-comm-overlap) from the notes and sharding columns, and the
    family's framework defaults (:data:`SP_WITH_TP`, :data:`RECIPE_OVERLAPS`)."""
    text = " ".join((row.get("notes") or "", row.get("sharding") or "")).lower()
    src = source_of(row)
    sp = "sequence parallel" in text or "sequence-parallel" in text or "sequence_parallel" in text
    overlap = any(k in text for k in ("tp-comm-overlap", "tp comm overlap", "tp_comm_overlap", "userbuffer"))
    if tp > 1 and src in SP_WITH_TP and not sp:
        sp = True
        notes.append(f"sequence parallelism with tp {tp}: {src}'s default")
    if tp > 1 and (src in RECIPE_OVERLAPS or software_of(row)["async_tp"]) and not overlap:
        overlap = True
        notes.append("tp communication overlapped with the GEMMs: " + ("async TP, as the row says" if src not in
                     RECIPE_OVERLAPS else "the NeMo / Megatron-Bridge performance recipes' tp_comm_overlap"))
    if overlap and not (sp and tp > 1):
        notes.append("tp-comm-overlap stated without sequence parallelism and tp > 1: not modelled")
        overlap = False
    return sp, overlap


def _fsdp_layout(row, L: dict[str, Any], notes: list[str]) -> tuple[Any, str, int]:
    """(build, layout text, dp) of an FSDP / ZeRO row with the ``fsdp`` baseline."""
    tp, pp, cp, vpp, dp, gpus, mbs, zero = (L[k] for k in ("tp", "pp", "cp", "vpp", "dp", "gpus", "mbs", "zero"))
    if vpp > 1:
        raise Skip(f"ZeRO-{zero} with interleaved pipelining (vpp {vpp}) is not modelled by the fsdp baseline")
    if dp is not None and tp * cp * pp * dp != gpus:
        raise Skip(f"tp*cp*pp*dp = {tp * cp * pp * dp} does not equal the row's {gpus} GPUs")
    if mbs is None:
        notes.append("micro_batch missing: no gradient accumulation (Composer's and DeepSpeed's default: the "
                     "whole per-device batch)" if pp == 1 else "micro_batch missing: 1 (pipelined)")
    zero = zero or 3
    k = L["shard_group"]
    acc = L["accumulate_unsharded"] and zero == 3
    if pp > 1 and source_of(row) in ("torchtitan", "torchtitan-community") and zero >= 2:
        # torchtitan's FSDP2 under torch's pipelining: reshard_after_forward "default" is "not
        # pp_enabled" (distributed/fsdp.py), and backward_maybe_with_nosync neither reshards nor
        # reduces between microbatches (torch/distributed/pipelining/stage.py): ZeRO-2 with
        # unsharded gradients accumulated to the step's one reduce-scatter
        zero, acc = 2, True
        notes.append("ZeRO-2 with unsharded gradient accumulation: torchtitan's FSDP2 under pipelining "
                     "(reshard_after_forward off with pp; no reduce-scatter between microbatches)")

    dp = gpus // (tp * cp * pp)

    sp, overlap = L["sp"] and tp > 1, L["overlap"] and L["sp"] and tp > 1
    # torchtitan's float8 is torchao's Float8Linear: at the tables' era (torchao 0.7, Dec 2024)
    # manual_float8_matmul_with_args_in_float8 saved the fp8 input and weight, as Transformer
    # Engine keeps its fp8 input (fp8_library te); torchao 0.18 keeps the bf16 ones (torchao)
    lib = "te"
    if L["fp8"] and source_of(row) in ("torchtitan", "torchtitan-community"):
        notes.append("fp8 by torchao 0.7 (the tables' era): each linear keeps its fp8 input for the backward, as "
                     "Transformer Engine does (fp8_library te; torchao 0.18 keeps the bf16 input: torchao)")

    def build(g, c, mbs=mbs, recompute=L["recompute"], zero=zero, tp=tp, pp=pp, unit=L["unit"], cp=cp, fp8=L["fp8"]):
        kw = dict(zero_stage=zero, micro_batch=mbs, recompute=recompute, tp=tp, pp=pp, gather_unit=unit, cp=cp, fp8=fp8,
                  shard_group=k if k and k < dp else 0, sequence_parallel=sp, tp_comm_overlap=overlap,
                  optimizer_state=L["optimizer_state"], accumulate_unsharded=acc,
                  offload_activations=L["offload"], loss_parallel=L["loss_parallel"], kernels=L["kernels"],
                  fp8_library=lib)
        if gpus < c.num_devices:
            # the fsdp baseline spreads over every device of the cluster; a row on part of a
            # preset node (2 or 4 of its 8 GPUs) states its data-parallel degree
            return build_layout(g, c, Layout(dp=dp, **kw))
        return fsdp(g, c, Layout(**{"zero_stage": 3, **kw}))

    if gpus < _gpus_per_node(L["cluster"].split(":")[0]):
        notes.append(f"the row's {gpus} GPUs are part of a preset node: FSDP over those {gpus} (dp {dp})")
    layout = (f"{'fp8 ' if L['fp8'] else ''}{'torchao ' if lib == 'torchao' else ''}{L['framework']}-zero{zero} tp{tp}/{f'cp{cp}/' if cp > 1 else ''}"
              f"pp{pp}/dp{dp} mbs{mbs} rc={L['recompute']}{' sp' if sp else ''}{' overlap' if overlap else ''}")
    layout += " per-op" if L["unit"] == "op" else ""
    layout += f" hybrid{k}" if k else ""
    layout += f" opt-{L['optimizer_state']}" if L["optimizer_state"] != "fp32" else ""
    layout += " no-sync" if acc else ""
    layout += f" offload{L['offload']}" if L["offload"] else ""
    layout += " gathered-loss" if not L["loss_parallel"] and tp > 1 else ""
    layout += f" {L['kernels']}" if L["kernels"] != "fused" else ""
    L["zero"] = zero
    return build, layout, dp


def _megatron_layout(row, src: str, L: dict[str, Any], notes: list[str]) -> tuple[Any, str, int]:
    """(build, layout text, dp) of a Megatron-style row with the ``megatron`` baseline."""
    tp, pp, cp, vpp, dp, gpus, mbs, zero = (L[k] for k in ("tp", "pp", "cp", "vpp", "dp", "gpus", "mbs", "zero"))
    if dp is None:
        dp = gpus // (tp * cp * pp)
        notes.append(f"dp missing: gpus/(tp*cp*pp) = {dp}")
    if tp * cp * pp * dp != gpus:
        raise Skip(f"tp*cp*pp*dp = {tp * cp * pp * dp} does not equal the row's {gpus} GPUs")
    if mbs is None and src == "Megatron 2019" and pp == 1:
        # Megatron-LM 2019 had no gradient accumulation: --batch-size is the batch of one
        # data-parallel replica, so global batch = batch-size x dp.
        mbs = L["B"] // dp
        notes.append(f"micro_batch missing: global_batch/dp = {mbs} (Megatron-LM 2019 has no gradient "
                     "accumulation; --batch-size is per data-parallel replica)")
    elif mbs is None:
        # Megatron-LM's --micro-batch-size default is None; the baseline's documented default
        # is global/dp without pipelining, 1 with it.
        notes.append("micro_batch missing: soapbox megatron baseline default (global/dp without pipelining, 1 with it)")
    sp, overlap = L["sp"], L["overlap"]
    gather = src in RECIPE_OVERLAPS and zero in (1, 2)
    if gather:
        notes.append("parameter all-gather overlapped with the forward: the recipes' overlap_param_gather")

    # Megatron-Bridge's performance scripts (scripts/performance/utils/helpers.py
    # set_basic_perf_overrides: mixed_precision and ddp grad_reduce_in_fp32 = False; NeMo 2's
    # scripts/performance likewise) and fp8 recipes (bf16_with_fp8_{delayed,current}_scaling_mixed:
    # fp8_param_gather = True; NeMo 2's bf16_with_fp8_mixed: fp8_params = True)
    bridge = src == "Megatron-Bridge"
    if bridge:
        notes.append("gradients reduced in bf16: the performance scripts' grad_reduce_in_fp32 = False"
                     + ("; fp8 parameters: the fp8 recipes' fp8_param_gather" if L["fp8"] else ""))

    def build(g, c, mbs=mbs, recompute=L["recompute"], fp8=L["fp8"], ep=1):
        return build_layout(g, c, Layout(tp=tp, pp=pp, dp=dp, micro_batch=mbs, vpp=vpp, recompute=recompute,
                                         sequence_parallel=sp and tp > 1, zero_stage=zero, cp=cp, fp8=fp8,
                                         tp_comm_overlap=overlap, overlap_param_gather=gather,
                                         grad_reduce_in_fp32=not bridge, fp8_params=bridge and fp8, ep=ep,
                                         optimizer_state=L["optimizer_state"], offload_activations=L["offload"],
                                         loss_parallel=L["loss_parallel"], kernels=L["kernels"]))

    layout = (f"{'fp8 ' if L['fp8'] else ''}tp{tp}/{f'cp{cp}/' if cp > 1 else ''}pp{pp}/dp{dp}/vpp{vpp} "
              f"{'zero' + str(zero) if zero else 'ddp'}{' sp' if sp else ''}{' overlap' if overlap else ''} "
              f"mbs{mbs if mbs is not None else '-'} rc={L['recompute']}"
              + (f" opt-{L['optimizer_state']}" if L["optimizer_state"] != "fp32" else "")
              + (f" offload{L['offload']}" if L["offload"] else "")
              + (" gathered-loss" if not L["loss_parallel"] and tp > 1 else "")
              + (f" {L['kernels']}" if L["kernels"] != "fused" else ""))
    return build, layout, dp


#: words of a MoE row's model name -> the sample builder with the model card's shape
#: (engine.models.moe; the row's columns are checked against it)
MOE_SAMPLES = (("deepseek", "deepseek-v3"), ("qwen3_30b", "qwen3-30b-a3b"), ("qwen3_235b", "qwen3-235b-a22b"),
               ("gpt oss", "gpt-oss-120b"), ("mixtral", "mixtral-8x7b"))


def _moe_model(row: dict[str, str], shape: dict[str, Any], precision: str, notes: list[str]):
    """(graph factory, top-k, sample name) of a MoE row: the sample of the model its name says, built with
    the row's batch and sequence; a Skip when the row's columns disagree with the sample."""
    name = (row.get("model") or "").lower()
    sample = next((s for k, s in MOE_SAMPLES if k in name), None)
    if sample is None:
        raise Skip(f"mixture-of-experts model {row.get('model')!r} has no sample with its published shape")
    g = build_sample(sample, shape["batch"], seq_len=shape["seq_len"], precision=precision)
    experts = [op for op in g.ops if op.kind == "experts"]
    first = experts[0]
    got = {"layers": sum(1 for op in g.ops if op.kind == "rmsnorm" and op.name.endswith(".norm1")),
           "hidden": first.in_tensors[0].shape[-1], "vocab": g["embed.tokens"].attrs["num_embeddings"],
           "ffn_hidden": first.attrs["ffn_hidden"]}
    bad = [f"{k} {shape[k]} (the sample has {v})" for k, v in got.items() if shape.get(k) not in (None, v)]
    if bad:
        raise Skip(f"the row's {', '.join(bad)} disagree with sample {sample}")
    notes.append(f"model: sample {sample} (its model card's shape; engine.models.moe)")
    return (lambda: g), first.attrs["top_k"], sample


#: What Megatron-Bridge's performance configs set for a MoE row, by (sample, container release),
#: read from github.com/NVIDIA-NeMo/Megatron-Bridge (scripts/performance; branches r0.1.0 =
#: 684a6861 for 25.09, r0.2.0 = 04651896 for 25.11, tags v0.3.0 = 21b02e0c for 26.02, v0.3.1 =
#: 9c9dd848 for 26.02.01, v0.4.0 = 0fbfe7d3 for 26.04): ``a2a_overlap``:
#: overlap_moe_expert_parallel_comm (merged 1F1B); ``tp_overlap``: tp_comm_overlap;
#: ``grad_overlap``: overlap_grad_reduce; ``dispatcher``: what ran (``alltoall`` is modelled;
#: DeepEP / HybridEP ``flex`` are priced as it); ``recompute``: the selective recompute
#: modules (``--recompute-modules``); ``stale``: where the config at that release
#: disagrees with the page's layout (the page's layout is simulated). Every row: etp 1, forced
#: load balancing (dropless) or capacity factor 1.0 padded (25.09's token-drop Qwen3 runs).
MOE_RECIPES: dict[tuple[str, str], dict[str, Any]] = {
    ("deepseek-v3", "25.09"): dict(a2a_overlap=True, tp_overlap=False, grad_overlap=False, dispatcher="flex (DeepEP)",
                                   recompute=("mla_up_proj", "mlp")),
    ("qwen3-30b-a3b", "25.09"): dict(a2a_overlap=False, tp_overlap=True, dispatcher="alltoall"),
    ("qwen3-30b-a3b", "25.11"): dict(a2a_overlap=True, tp_overlap=True, dispatcher="alltoall",
                                     stale="the 25.11 config is pp 2 x vp 12, micro-batch 1"),
    ("qwen3-30b-a3b", "26.02.01"): dict(a2a_overlap=False, tp_overlap=True, dispatcher="flex (HybridEP)",
                                        stale="the 26.02.01 config is pp 1 x ep 16 (as 26.04's row)"),
    ("qwen3-30b-a3b", "26.04.01"): dict(a2a_overlap=False, tp_overlap=True, dispatcher="flex (HybridEP)"),
    ("qwen3-235b-a22b", "25.09"): dict(a2a_overlap=False, tp_overlap=True, dispatcher="alltoall"),
    ("qwen3-235b-a22b", "25.11"): dict(a2a_overlap=True, tp_overlap=False, dispatcher="alltoall"),
    ("qwen3-235b-a22b", "26.04.01"): dict(a2a_overlap=True, tp_overlap=False, dispatcher="alltoall"),
    ("gpt-oss-120b", "25.11"): dict(a2a_overlap=False, tp_overlap=True, dispatcher="alltoall",
                                    recompute=("layernorm", "moe_act"), stale="the 25.11 config's micro-batch is 1"),
    ("gpt-oss-120b", "26.02"): dict(a2a_overlap=False, tp_overlap=True, dispatcher="alltoall",
                                    recompute=("layernorm", "moe_act")),
}
#: The same on Blackwell, by (sample, release, chip), where the config differs by GPU (DeepSeek-V3's
#: recompute modules): read from deepseek_workload_base_configs.py at v0.4.0 = 0fbfe7d3 (26.04:
#: GB300_V2 micro-batch 2, pp 2 x vp 8, ep 32, mla_up_proj; GB200_V2 pp 4 x vp 4, ep 64, mlp) and
#: workload_base_configs.py at r0.2.0 = 04651896 (25.11: GB200 pp 4 x vp 4, ep 64, mla_up_proj;
#: B200 pp 16, ep 8, mla_up_proj); HybridEP dispatchers, no all-to-all overlap; GPT-OSS 120B's
#: gpt_oss_workload_base_configs.py at 0fbfe7d3 (26.04, micro-batch 4: GB200_V2 ep 64 and B200_V2
#: ep 8 recompute layernorm and moe_act, GB200 with the all-to-all overlap; GB300 ep 64 and B300
#: ep 8 recompute nothing). Only rows whose layout is the config's (DeepSeek-V3's 26.04 B200 / B300
#: and 25.11 GB300 rows are not: left out).
MOE_RECIPES_BY_CHIP: dict[tuple[str, str, str], dict[str, Any]] = {
    ("deepseek-v3", "26.04.01", "GB300"): dict(a2a_overlap=False, tp_overlap=False, dispatcher="flex (HybridEP)",
                                               recompute=("mla_up_proj",)),
    ("deepseek-v3", "26.04.01", "GB200"): dict(a2a_overlap=False, tp_overlap=False, dispatcher="flex (HybridEP)",
                                               recompute=("mlp",)),
    ("deepseek-v3", "25.11", "GB200"): dict(a2a_overlap=False, tp_overlap=False, dispatcher="flex (HybridEP)",
                                            recompute=("mla_up_proj",)),
    ("deepseek-v3", "25.11", "B200"): dict(a2a_overlap=False, tp_overlap=False, dispatcher="flex (HybridEP)",
                                           recompute=("mla_up_proj",)),
    ("gpt-oss-120b", "26.04.01", "GB300"): dict(a2a_overlap=False, tp_overlap=False, dispatcher="alltoall"),
    ("gpt-oss-120b", "26.04.01", "GB200"): dict(a2a_overlap=True, tp_overlap=False, dispatcher="flex (HybridEP)",
                                                recompute=("layernorm", "moe_act")),
    ("gpt-oss-120b", "26.04.01", "B300"): dict(a2a_overlap=False, tp_overlap=False, dispatcher="flex (HybridEP)"),
    ("gpt-oss-120b", "26.04.01", "B200"): dict(a2a_overlap=False, tp_overlap=False, dispatcher="flex (HybridEP)",
                                               recompute=("layernorm", "moe_act")),
}


def _chip(row: dict[str, str]) -> str:
    """GB300, GB200, B300 or B200 from the row's GPU type ("" for others)."""
    gpu = row.get("gpu_type") or ""
    return next((c for c in ("GB300", "GB200", "B300", "B200") if c in gpu), "")


def _release(row: dict[str, str]) -> str:
    """The NeMo container release a Megatron-Bridge row was measured with (``25.09``, ``26.02.01``)."""
    m = re.match(r"\s*(\d\d\.\d\d(?:\.\d\d)?)", row.get("table_or_figure") or "")
    return m.group(1) if m else ""


def _moe_layout(row, src: str, L: dict[str, Any], notes: list[str], ep: int,
                sample: str) -> tuple[Any, str, int]:
    """(build, layout text, dp) of a Megatron-Core MoE row: the Megatron layout with ``ep``
    folded onto the attention's ranks, expert tensor parallelism 1, and what the release's
    performance config set (:data:`MOE_RECIPES`)."""
    recipe = (MOE_RECIPES_BY_CHIP.get((sample, _release(row), _chip(row)))
              or MOE_RECIPES.get((sample, _release(row)), {})) if src == "Megatron-Bridge" else {}
    if recipe:
        L["overlap"] = L["overlap"] and recipe["tp_overlap"]
    build_dense, layout, dp = _megatron_layout(row, src, L, notes)
    notes.append("expert tensor parallelism 1 (the MoE recipes' expert_tensor_parallel_size)")
    text = (row.get("notes") or "").lower()
    notes.append("routing balanced, as the row says (forced load balancing)" if "balanc" in text
                 else "routing balanced (the token-drop runs' capacity factor 1.0 is then never exceeded)"
                 if "tokendrop" in (row.get("model") or "").lower() else
                 "routing balanced (soapbox's default; the row does not say)")
    if recipe:
        notes.append(f"{_release(row)} recipe: all-to-all overlap {'on' if recipe['a2a_overlap'] else 'off'}, "
                     f"tp_comm_overlap {'on' if recipe['tp_overlap'] else 'off'}, dispatcher {recipe['dispatcher']}"
                     + ("" if recipe["dispatcher"] == "alltoall" else " (priced as all-to-all)"))
        if "recompute" in recipe:
            notes.append(f"selective recomputation of {', '.join(recipe['recompute'])} (the recipe's recompute_modules)")
        if "stale" in recipe:
            notes.append(f"the page's layout is simulated, but {recipe['stale']}")
    grad = recipe.get("grad_overlap", True)
    a2a = recipe.get("a2a_overlap", False)

    modules = recipe.get("recompute", ())

    def build(g, c):
        s = build_dense(g, c, ep=ep)
        return replace(s, moe_comm_overlap=a2a, overlap_grad_reduce=s.overlap_grad_reduce and grad,
                       **(dict(recompute="selective", recompute_modules=modules) if modules else {}))

    if modules:
        layout = layout.replace("rc=none", "rc=" + "+".join(modules))
    return build, f"{layout} ep{ep}{' a2a-overlap' if a2a else ''}", dp


def setup_for(row: dict[str, str]) -> Setup:
    """The model, cluster and layout a row states: its family's conventions
    (``published_rows.READERS``), then its columns; a framework default where a value is
    missing, printed with the row; a :class:`Skip` with the reason where nothing fits.
    Mixture-of-experts rows (``ep=`` notes) build the sample of their model
    (:data:`MOE_SAMPLES`) with the Megatron layout and the row's expert parallelism."""
    src = source_of(row)
    notes: list[str] = []
    row = {**row, **READERS.get(src, lambda r, n: {})(row, notes)}
    shape, gpus = _shape(row, src, notes)
    precision, fp8, recompute = _precision(row, notes)
    tp = cell_int(row, "tp") or 1
    L: dict[str, Any] = dict(tp=tp, pp=cell_int(row, "pp") or 1, dp=cell_int(row, "dp"), cp=cell_int(row, "cp") or 1,
                             vpp=cell_int(row, "vpp") or 1, gpus=gpus, mbs=cell_int(row, "micro_batch"),
                             B=shape["batch"], recompute=recompute, fp8=fp8, shard_group=0,
                             optimizer_state=(row.get("optimizer_state") or "fp32"),
                             accumulate_unsharded=bool(row.get("accumulate_unsharded")),
                             offload=cell_int(row, "offload_activations") or 0,
                             loss_parallel=(row.get("loss_parallel") or "yes") != "no",
                             kernels=row.get("kernels") or "fused")
    cluster_name = L["cluster"] = _cluster_name(row, gpus, notes)
    cfg = _model_config(row, src, shape, precision, notes)
    L["zero"], L["unit"], L["framework"], hybrid = _zero_of(row)
    if hybrid:
        per_node = cell_int(row, "gpus_per_node") or 8  # the DGX presets' 8
        L["shard_group"] = max(1, per_node // (tp * L["cp"]))
        notes.append(f"hybrid sharding: ZeRO-{L['zero']} within each node ({L['shard_group']} data-parallel ranks), "
                     "replicas across nodes")
    L["sp"], L["overlap"] = _overlaps(row, tp, notes)
    if is_moe(row):
        ep = expert_parallel_of(row)
        make_graph, top_k, sample = _moe_model(row, shape, precision, notes)
        build, layout, dp = _moe_layout(row, src, L, notes, ep, sample)
        return Setup(cfg, cluster_name, build, layout, recompute == "full", notes, family=src,
                     software=software_of(row), memory_counter=memory_counter(row), tp=tp, pp=L["pp"], dp=dp,
                     cp=L["cp"], zero_stage=L["zero"], make_graph=make_graph, ep=ep, top_k=top_k)
    if src == "MosaicML" or L["zero"] == 3 or (L["framework"] == "fsdp" and L["zero"]):
        build, layout, dp = _fsdp_layout(row, L, notes)
    else:
        build, layout, dp = _megatron_layout(row, src, L, notes)
    return Setup(cfg, cluster_name, build, layout, recompute == "full", notes, family=src, software=software_of(row),
                 memory_counter=memory_counter(row), tp=tp, pp=L["pp"], dp=dp, cp=L["cp"], zero_stage=L["zero"])
