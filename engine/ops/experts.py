"""Mixture-of-experts kinds: the router (scores and top-k choice) and the routed experts as
grouped GEMMs with the token dispatch and combine."""

from __future__ import annotations

import math
from typing import Any, Mapping

from .base import (EXPERT, REDUCTION, axis_kind, dedupe_axes, expect_float, expect_inputs, flag, OpError, OpKind,
                   ParallelDim, ParamInfo, positive_int, TensorInfo)
from .pointwise import GELU_FLOPS_PER_ELEMENT

__all__ = ["kinds", "MOE_DISPATCHERS", "ROUTER_SCORES", "experts_capacity_share"]

# mixture of experts ----------------------------------------------------------------------
#: How tokens reach the experts: ``alltoall`` sends each token copy to the rank holding its
#: expert and back (Megatron-Core's MoEAlltoAllTokenDispatcher); ``allgather`` gathers every
#: token of the expert-parallel group on every rank and reduce-scatters the outputs
#: (MoEAllGatherTokenDispatcher).
MOE_DISPATCHERS = ("alltoall", "allgather")
#: Router scores: softmax over the experts (Mixtral, Qwen3-MoE, GPT-OSS) or a sigmoid per
#: expert with a load-balancing bias (DeepSeek-V3's auxiliary-loss-free balancing, Liu et
#: al. 2024 §2.1.2: the bias is added before the top-k, one FLOP per score).
ROUTER_SCORES = ("softmax", "sigmoid")
#: FLOPs per router score beyond the GEMM: the score function (softmax 5, sigmoid 4 + the bias
#: add 1, both counted as 5) and a top-k selection (one compare per score per chosen expert,
#: counted per score: a counting convention, the op is memory-bound).
ROUTER_SCORE_FLOPS = 5
#: SwiGLU's pointwise work per intermediate element: silu (4, as SILU_FLOPS_PER_ELEMENT) and the
#: gating multiply (1).
SWIGLU_FLOPS_PER_ELEMENT = 5


def _moe_counts(ins, attrs):
    experts = positive_int(attrs, "num_experts")
    top_k = positive_int(attrs, "top_k")
    if top_k > experts:
        raise OpError(f"top_k {top_k} exceeds the {experts} experts", "attrs.top_k")
    return experts, top_k


def _router_infer(ins, attrs, precision):
    expect_inputs(ins, (1,))
    x = ins[0]
    expect_float(x, 0)
    experts, _ = _moe_counts(ins, attrs)
    flag(attrs, "bias", False)
    score = attrs.get("score", "softmax")
    if score not in ROUTER_SCORES:
        raise OpError(f"score must be one of {', '.join(ROUTER_SCORES)}, got {score!r}", "attrs.score")
    # routing probabilities in fp32, as Megatron-Core computes them (--moe-router-dtype fp32)
    return [TensorInfo(x.shape[:-1] + (experts,), dedupe_axes(x.axes[:-1] + ("expert",)), "fp32")]


def _router_params(ins, attrs):
    ps = [ParamInfo("weight", (attrs["num_experts"], ins[0].shape[-1]))]
    if attrs.get("bias", False):
        ps.append(ParamInfo("bias", (attrs["num_experts"],)))
    return ps


def _token_dims(x: TensorInfo, n_inputs: int, n_params: int) -> list[ParallelDim]:
    return [ParallelDim(name, axis_kind(name), x.shape[ax], ax, (ax,) * n_inputs, (None,) * n_params)
            for ax, name in enumerate(x.axes[:-1])]


def _router_dims(ins, outs, attrs):
    # the router's GEMM is small (experts x hidden) and every framework replicates it
    return _token_dims(ins[0], 1, 2 if attrs.get("bias", False) else 1)


def _router_flops(ins, outs, params, attrs):
    tokens = math.prod(outs[0][:-1])
    experts, hidden = params[0]
    return 2.0 * tokens * hidden * experts + float(ROUTER_SCORE_FLOPS * tokens * experts)


def _experts_infer(ins, attrs, precision):
    expect_inputs(ins, (2,))
    x, probs = ins
    expect_float(x, 0)
    expect_float(probs, 1)
    experts, _ = _moe_counts(ins, attrs)
    positive_int(attrs, "ffn_hidden")
    flag(attrs, "gated", True)
    flag(attrs, "bias", False)
    cf = attrs.get("capacity_factor", 0)
    if not isinstance(cf, (int, float)) or isinstance(cf, bool) or not 0 <= cf <= 64:
        raise OpError(f"must be 0 (dropless) or a capacity factor up to 64, got {cf!r}", "attrs.capacity_factor")
    dispatcher = attrs.get("dispatcher", "alltoall")
    if dispatcher not in MOE_DISPATCHERS:
        raise OpError(f"dispatcher must be one of {', '.join(MOE_DISPATCHERS)}, got {dispatcher!r}",
                      "attrs.dispatcher")
    if probs.shape != x.shape[:-1] + (experts,):
        raise OpError(f"router scores {list(probs.shape)} must be the tokens {list(x.shape[:-1])} by the "
                      f"{experts} experts", "inputs[1]")
    return [TensorInfo(x.shape, x.axes, x.dtype)]


def _experts_params(ins, attrs):
    e, h, f = attrs["num_experts"], ins[0].shape[-1], attrs["ffn_hidden"]
    f_in = 2 * f if attrs.get("gated", True) else f  # SwiGLU: gate and up projections side by side
    ps = [ParamInfo("w_in", (e, h, f_in)), ParamInfo("w_out", (e, f, h))]
    if attrs.get("bias", False):  # GPT-OSS's experts have biases
        ps += [ParamInfo("b_in", (e, f_in)), ParamInfo("b_out", (e, h))]
    return ps


def _experts_dims(ins, outs, attrs):
    """Token axes as any op's; ``expert`` splits the experts (and the expert weights' first
    axis) and, nested inside ``sample``, the tokens each partition holds before the dispatch;
    ``expert_seq`` does the same inside ``length`` (expert parallelism folded over the
    tensor- or context-parallel ranks' sequence shards, Megatron-Core's "MoE parallel
    folding", Liu et al. 2025); ``ffn`` splits each expert's intermediate width (expert
    tensor parallelism: partial sums, reduced afterwards)."""
    x = ins[0]
    e = attrs["num_experts"]
    bias = attrs.get("bias", False)
    split_e = (0, 0, 0, 0) if bias else (0, 0)
    dims: list[ParallelDim] = []
    for d in _token_dims(x, 2, len(split_e)):
        dims.append(d)
        if d.name == "sample":
            dims.append(ParallelDim("expert", EXPERT, e, d.out_axis, d.in_axes, split_e))
        elif d.name == "length":
            dims.append(ParallelDim("expert_seq", EXPERT, e, d.out_axis, d.in_axes, split_e))
    # the output bias is added once, after the partial sums are reduced (as a row-parallel linear's)
    dims.append(ParallelDim("ffn", REDUCTION, attrs["ffn_hidden"], None, (None, None),
                            (2, 1, 1, None) if bias else (2, 1)))
    return dims


def experts_capacity_share(attrs: Mapping[str, Any]) -> float:
    """Share of the routed token copies an experts op computes under balanced routing: 1
    dropless, else min(1, capacity factor) (tokens over an expert's capacity are dropped;
    GShard §2.2). A measured imbalance is the what-if's business
    (:func:`engine.moe.expert_loads`)."""
    cf = float(attrs.get("capacity_factor", 0) or 0)
    return 1.0 if cf <= 0 else min(1.0, cf)


def _experts_flops(ins, outs, params, attrs):
    """Each token copy (top_k per token) through one expert's GEMMs: (h x f_in) and (f x h),
    and SwiGLU's pointwise work on f; tokens and widths are this partition's, so the FLOPs
    of partitions add up to the op's."""
    tokens = math.prod(outs[0][:-1]) * attrs["top_k"] * experts_capacity_share(attrs)
    _, h, f_in = params[0]
    f = params[1][1]
    act = SWIGLU_FLOPS_PER_ELEMENT * f if attrs.get("gated", True) else GELU_FLOPS_PER_ELEMENT * f
    return tokens * (2.0 * h * f_in + 2.0 * f * h + act)


def kinds() -> list[OpKind]:
    """The mixture-of-experts kinds, as :data:`engine.ops.OP_KINDS` registers them."""
    return [
        OpKind("router", "Mixture-of-experts router: scores of each token for each expert (fp32) and its top-k "
                         "choice; attrs: num_experts, top_k, score, bias.",
               _router_infer, _router_params, _router_dims, _router_flops, 2.0,
               attrs=("num_experts", "top_k", "score", "bias")),
        OpKind("experts", "Mixture-of-experts layer: the routed experts as grouped GEMMs (SwiGLU or GeLU MLPs), "
                          "with the token dispatch and combine; inputs: tokens, router scores; attrs: num_experts, "
                          "top_k, ffn_hidden, gated, bias, capacity_factor, dispatcher.",
               _experts_infer, _experts_params, _experts_dims, _experts_flops, 2.0,
               attrs=("num_experts", "top_k", "ffn_hidden", "gated", "bias", "capacity_factor", "dispatcher")),
    ]
