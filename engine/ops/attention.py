"""Fused attention (FlashAttention) and the softmax cross-entropy loss."""

from __future__ import annotations

import math

from .base import (ATTRIBUTE, REDUCTION, axis_kind, expect_float, expect_inputs, is_int, no_params, OpError, OpKind,
                   ParallelDim, TensorInfo)

__all__ = ["kinds", "FLASH_BWD_FACTOR", "CROSS_ENTROPY_FLOPS_PER_ELEMENT"]

CROSS_ENTROPY_FLOPS_PER_ELEMENT = 6  # softmax (5) + log of the target

# fused attention (FlashAttention) ------------------------------------------------------------
# FlashAttention (Dao et al. NeurIPS'22; FlashAttention-2, Dao 2023) computes
# softmax(Q K^T / sqrt(d)) V in tiles without writing the s x s matrix to HBM, skips the
# blocks a causal mask zeroes (about half), and recomputes S and P in the backward pass,
# which runs five matmuls of the forward's two: 2.5x the forward FLOPs.
FLASH_BWD_FACTOR = 2.5


def _attention_infer(ins, attrs, precision):
    expect_inputs(ins, (3,))
    q, k, v = ins
    for i, t in enumerate(ins):
        expect_float(t, i)
        if len(t.shape) != 4:
            raise OpError(f"input {i} must be (batch, heads, length, head_dim), got {list(t.shape)}", f"inputs[{i}]")
    if k.shape[:3] != v.shape[:3]:
        raise OpError(f"key and value shapes differ: {list(k.shape)} vs {list(v.shape)}", "inputs[2]")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise OpError(f"query {list(q.shape)} and key {list(k.shape)} differ in batch or head_dim", "inputs[1]")
    if k.shape[1] > q.shape[1] or q.shape[1] % k.shape[1]:
        raise OpError(f"{k.shape[1]} key/value heads must divide {q.shape[1]} query heads", "inputs[1]")
    if not isinstance(attrs.get("causal", False), bool):
        raise OpError(f"must be true or false, got {attrs['causal']!r}", "attrs.causal")
    window = attrs.get("window")
    if window is not None:
        if not is_int(window) or window < 1:
            raise OpError(f"must be a positive integer (keys a query sees), got {window!r}", "attrs.window")
        if not attrs.get("causal", False):
            raise OpError("a sliding window needs causal attention (causal: true)", "attrs.window")
    # the values' head_dim may differ from the queries' and keys' (DeepSeek's multi-head latent
    # attention: 192 for q.k, 128 for v)
    return [TensorInfo(q.shape[:3] + v.shape[3:], q.axes, q.dtype)]


def _attention_dims(ins, outs, attrs):
    q, k, _ = ins
    b, h, s, _ = q.shape
    group = k.shape[1] if k.shape[1] != h else 0
    return [
        ParallelDim(q.axes[0], axis_kind(q.axes[0]), b, 0, (0, 0, 0)),
        ParallelDim(q.axes[1], ATTRIBUTE, h, 1, (1, 1, 1), group=group),
        # splitting queries along the sequence: every partition needs all keys and values
        ParallelDim(q.axes[2], ATTRIBUTE, s, 2, (2, None, None)),
    ]


def _attention_flops(ins, outs, params, attrs):
    """QK^T and PV over the keys each query sees: 2 b h s_q (d_q + d_v) x keys a query.

    * full attention: s_k keys a query;
    * causal: s_k / 2 (the triangle the causal mask keeps, counted as s^2 / 2 rather than
      the exact s (s + 1) / 2, as Megatron's and FlashAttention's FLOPs formulas count it);
    * causal in a sliding window of ``w`` keys (Mistral, Jiang et al. 2023 §2; each query
      sees itself and the w - 1 keys before it): w' = min(w, s_k) keys less the triangle
      of the first w' queries, (s_k w' - w'^2 / 2) / s_k keys a query on average, so
      2 b h (d_q + d_v) (s w' - w'^2 / 2) for the whole op (exactly s w' - w' (w' - 1) / 2
      keys; w' = s_k gives the causal s^2 / 2).

    A length (context-parallel) split divides the queries, never the keys (s_k stays the
    op's), so each query partition is priced at the average keys a query and the FLOPs of the
    partitions add up to the op's; the imbalance between early and late queries is the
    strategy's to balance (Megatron-Core's mirrored chunks), as for causal attention.
    """
    q, k, v = ins
    s_k = k[2]
    if not attrs.get("causal", False):
        keys = float(s_k)
    else:
        w = min(attrs.get("window") or s_k, s_k)
        keys = w - w * w / (2.0 * s_k)
    return 2.0 * math.prod(q[:3]) * keys * (q[3] + v[3])  # QK^T and PV


# softmax cross-entropy loss ---------------------------------------------------------------------
def _ce_infer(ins, attrs, precision):
    expect_inputs(ins, (2,))
    logits, labels = ins
    expect_float(logits, 0)
    if labels.dtype not in ("int32", "int64"):
        raise OpError(f"labels must be integer class ids, got {labels.dtype}", "inputs[1]")
    if labels.shape != logits.shape[:-1]:
        raise OpError(
            f"labels shape {list(labels.shape)} must equal logits shape without its class axis "
            f"{list(logits.shape[:-1])}",
            "inputs[1]",
        )
    # One loss value per example (per token for sequence models), in fp32.
    return [TensorInfo(logits.shape[:-1], logits.axes[:-1], "fp32")]


def _ce_dims(ins, outs, attrs):
    logits = ins[0]
    r = len(logits.shape)
    dims = [ParallelDim(name, axis_kind(name), logits.shape[ax], ax, (ax, ax))
            for ax, name in enumerate(logits.axes[:-1])]
    # Vocabulary-parallel cross-entropy (Megatron-LM): partitions hold slices of the class
    # axis and all-reduce the max and the sum of exponentials.
    dims.append(ParallelDim("vocab", REDUCTION, logits.shape[-1], None, (r - 1, None)))
    return dims


def _ce_flops(ins, outs, params, attrs):
    return float(CROSS_ENTROPY_FLOPS_PER_ELEMENT * math.prod(ins[0]))


def kinds() -> list[OpKind]:
    """The attention and loss kinds, as :data:`engine.ops.OP_KINDS` registers them."""
    return [
        OpKind("attention", "Fused scaled dot-product attention (FlashAttention) of q, k, v; attrs: causal, window "
                            "(a causal sliding window: the keys each query sees, itself included).",
               _attention_infer, no_params, _attention_dims, _attention_flops, FLASH_BWD_FACTOR,
               attrs=("causal", "window")),
        OpKind("softmax_cross_entropy",
               "Softmax cross-entropy of logits against integer labels (one loss per example).",
               _ce_infer, no_params, _ce_dims, _ce_flops, 1.0),
    ]
