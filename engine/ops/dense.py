"""Kinds with weights that compute by multiply-adds: convolution, pooling, linear layers,
batched matmuls, embeddings and an unrolled LSTM step."""

from __future__ import annotations

import math

from .base import (ATTRIBUTE, PARAMETER, REDUCTION, SAMPLE, axis_kind, conv_out, dedupe_axes, expect_float,
                   expect_inputs, flag, int_pair, no_params, OpError, OpKind, ParallelDim, ParamInfo, positive_int,
                   require, sliding_window, TensorInfo, zero_flops)

__all__ = ["kinds", "LSTM_POINTWISE_FLOPS_PER_UNIT"]

# LSTM cell pointwise work per hidden unit: 3 sigmoids, 2 tanh, 3 multiplies, 1 add
# (Hochreiter & Schmidhuber 1997 cell equations as in cuDNN's LSTM docs).
LSTM_POINTWISE_FLOPS_PER_UNIT = 9

# conv2d ------------------------------------------------------------------------------
def _conv_infer(ins, attrs, precision):
    expect_inputs(ins, (1,))
    x = ins[0]
    expect_float(x, 0)
    if len(x.shape) != 4:
        raise OpError(f"input must be (batch, channel, height, width), got shape {list(x.shape)}", "inputs[0]")
    n, c, h, w = x.shape
    k = positive_int(attrs, "out_channels")
    require(attrs, "kernel")
    (kh, kw), (sh, sw), (ph, pw) = sliding_window("conv2d", attrs)
    g = positive_int(attrs, "groups", 1)
    flag(attrs, "bias", True)
    if c % g or k % g:
        raise OpError(f"groups {g} must divide in channels {c} and out channels {k}", "attrs.groups")
    ho = conv_out(h, kh, sh, ph, "height", "attrs.kernel")
    wo = conv_out(w, kw, sw, pw, "width", "attrs.kernel")
    return [TensorInfo((n, k, ho, wo), ("sample", "channel", "height", "width"), x.dtype)]


def _conv_params(ins, attrs):
    c = ins[0].shape[1]
    k = attrs["out_channels"]
    kh, kw = int_pair(attrs["kernel"], "kernel", 1)
    g = attrs.get("groups", 1)
    ps = [ParamInfo("weight", (k, c // g, kh, kw))]
    if attrs.get("bias", True):
        ps.append(ParamInfo("bias", (k,)))
    return ps


def _conv_dims(ins, outs, attrs):
    n, k, ho, wo = outs[0].shape
    bias = (0,) if attrs.get("bias", True) else ()
    groups = attrs.get("groups", 1)
    # Splitting output channels of a grouped conv would also split its input channels;
    # only plain (groups == 1) convs offer the channel (P) dim.
    dims = [
        ParallelDim("sample", SAMPLE, n, 0, (0,), (None,) + (None,) * len(bias)),
        # Attribute splits need a halo of input rows (kernel - stride) beyond the
        # proportional range; the task-graph builder accounts for it.
        ParallelDim("height", ATTRIBUTE, ho, 2, (2,), (None,) + (None,) * len(bias)),
        ParallelDim("width", ATTRIBUTE, wo, 3, (3,), (None,) + (None,) * len(bias)),
    ]
    if groups == 1:
        dims.append(ParallelDim("channel", PARAMETER, k, 1, (None,), (0,) + bias))
    return dims


def _conv_flops(ins, outs, params, attrs):
    # 2 * (output elements) * (input channels per group * kh * kw) multiply-adds.
    _, cg, kh, kw = params[0]
    return 2.0 * math.prod(outs[0]) * cg * kh * kw


# pool2d ------------------------------------------------------------------------------
def _pool_infer(ins, attrs, precision):
    expect_inputs(ins, (1,))
    x = ins[0]
    if len(x.shape) != 4:
        raise OpError(f"input must be (batch, channel, height, width), got shape {list(x.shape)}", "inputs[0]")
    mode = attrs.get("mode", "max")
    if mode not in ("max", "avg"):
        raise OpError(f"mode must be 'max' or 'avg', got {mode!r}", "attrs.mode")
    n, c, h, w = x.shape
    if flag(attrs, "global", False):
        return [TensorInfo((n, c, 1, 1), ("sample", "channel", "height", "width"), x.dtype)]
    require(attrs, "kernel")
    (kh, kw), (sh, sw), (ph, pw) = sliding_window("pool2d", attrs)
    ho = conv_out(h, kh, sh, ph, "height", "attrs.kernel")
    wo = conv_out(w, kw, sw, pw, "width", "attrs.kernel")
    return [TensorInfo((n, c, ho, wo), ("sample", "channel", "height", "width"), x.dtype)]


def _pool_dims(ins, outs, attrs):
    n, c, ho, wo = outs[0].shape
    # FlexFlow Table 1: pooling has Sample and Attribute dims only (no parameters);
    # channels are an attribute here.
    dims = [
        ParallelDim("sample", SAMPLE, n, 0, (0,)),
        ParallelDim("channel", ATTRIBUTE, c, 1, (1,)),
    ]
    if not attrs.get("global", False):
        dims += [ParallelDim("height", ATTRIBUTE, ho, 2, (2,)), ParallelDim("width", ATTRIBUTE, wo, 3, (3,))]
    return dims


def _pool_flops(ins, outs, params, attrs):
    if attrs.get("global", False):
        # one op per input element, attributed per output element for multiplicativity
        n, c, h, w = ins[0]
        return float(n * c * h * w)
    kh, kw = int_pair(attrs["kernel"], "kernel", 1)
    return float(math.prod(outs[0]) * kh * kw)


# linear ------------------------------------------------------------------------------
def _linear_infer(ins, attrs, precision):
    expect_inputs(ins, (1,))
    x = ins[0]
    expect_float(x, 0)
    out = positive_int(attrs, "out_features")
    flag(attrs, "bias", True)
    axes = dedupe_axes(x.axes[:-1] + ("feature",))
    return [TensorInfo(x.shape[:-1] + (out,), axes, x.dtype)]


def _linear_params(ins, attrs):
    # (out, in) as PyTorch's nn.Linear stores it, so a language model's output layer has the
    # token embedding's (vocab, hidden) layout and the two can share one parameter tensor.
    ps = [ParamInfo("weight", (attrs["out_features"], ins[0].shape[-1]))]
    if attrs.get("bias", True):
        ps.append(ParamInfo("bias", (attrs["out_features"],)))
    return ps


def _linear_dims(ins, outs, attrs):
    x, y = ins[0], outs[0]
    rank = len(y.shape)
    bias = attrs.get("bias", True)
    nparams = 2 if bias else 1
    dims = [
        ParallelDim(name, axis_kind(name), y.shape[ax], ax, (ax,), (None,) * nparams)
        for ax, name in enumerate(y.axes[:-1])
    ]
    # Column-parallel (Megatron §3): split output features, weight rows and bias.
    dims.append(ParallelDim("feature", PARAMETER, y.shape[-1], rank - 1, (None,), (0, 0) if bias else (0,)))
    # Row-parallel: split input features and weight columns; outputs are partial sums.
    dims.append(
        ParallelDim("in_feature", REDUCTION, x.shape[-1], None, (rank - 1,), (1, None) if bias else (1,))
    )
    return dims


def _linear_flops(ins, outs, params, attrs):
    fan_in = params[0][1]
    return 2.0 * math.prod(outs[0]) * fan_in


# batch_matmul ------------------------------------------------------------------------
def _bmm_infer(ins, attrs, precision):
    expect_inputs(ins, (2,))
    a, b = ins
    expect_float(a, 0)
    expect_float(b, 1)
    if len(a.shape) < 3 or len(a.shape) != len(b.shape):
        raise OpError(
            f"inputs must have the same rank >= 3, got shapes {list(a.shape)} and {list(b.shape)}", "inputs"
        )
    tb = flag(attrs, "transpose_b", False)
    k_b, n = (b.shape[-1], b.shape[-2]) if tb else (b.shape[-2], b.shape[-1])
    n_axis = b.axes[-2] if tb else b.axes[-1]
    if a.shape[-1] != k_b:
        raise OpError(
            f"inner dimensions differ: {list(a.shape)} x {list(b.shape)}"
            f"{' (b transposed)' if tb else ''}: {a.shape[-1]} != {k_b}",
            "inputs",
        )
    for i, (da, db) in enumerate(zip(a.shape[:-2], b.shape[:-2])):
        # b may have fewer heads than a when they divide it: grouped-query attention
        # shares each key/value head among da/db query heads (Ainslie et al. 2023).
        if da != db and (db > da or da % db):
            raise OpError(
                f"batch axis {i} differs: {da} vs {db} (b's must equal a's or divide it)", "inputs"
            )
    axes = dedupe_axes(a.axes[:-1] + (n_axis,))
    return [TensorInfo(a.shape[:-1] + (n,), axes, a.dtype)]


def _bmm_dims(ins, outs, attrs):
    a, b = ins
    y = outs[0]
    r = len(y.shape)
    tb = bool(attrs.get("transpose_b", False))
    b_n_axis, b_k_axis = (r - 2, r - 1) if tb else (r - 1, r - 2)
    dims = []
    for ax in range(r - 2):
        # With grouped heads (b has fewer heads than a, Ainslie et al. 2023) a split of a's
        # heads maps onto b's proportionally when the degree divides b's head count, and
        # replicates one of b's heads per partition when it is a multiple of it.
        name = y.axes[ax]
        group = b.shape[ax] if b.shape[ax] != a.shape[ax] else 0
        dims.append(ParallelDim(name, axis_kind(name), y.shape[ax], ax, (ax, ax), group=group))
    dims.append(ParallelDim(y.axes[r - 2], ATTRIBUTE, y.shape[r - 2], r - 2, (r - 2, None)))
    dims.append(ParallelDim(y.axes[r - 1], ATTRIBUTE, y.shape[r - 1], r - 1, (None, b_n_axis)))
    dims.append(ParallelDim("inner", REDUCTION, a.shape[-1], None, (r - 1, b_k_axis)))
    return dims


def _bmm_flops(ins, outs, params, attrs):
    return 2.0 * math.prod(outs[0]) * ins[0][-1]


# embedding ---------------------------------------------------------------------------
def _embedding_infer(ins, attrs, precision):
    expect_inputs(ins, (1,))
    ids = ins[0]
    if ids.dtype not in ("int32", "int64"):
        raise OpError(f"input must be integer ids, got {ids.dtype}", "inputs[0]")
    positive_int(attrs, "num_embeddings")
    dim = positive_int(attrs, "embedding_dim")
    return [TensorInfo(ids.shape + (dim,), dedupe_axes(ids.axes + ("feature",)), precision)]


def _embedding_params(ins, attrs):
    return [ParamInfo("weight", (attrs["num_embeddings"], attrs["embedding_dim"]))]


def _embedding_dims(ins, outs, attrs):
    y = outs[0]
    r = len(y.shape)
    dims = [ParallelDim(name, axis_kind(name), y.shape[ax], ax, (ax,), (None,)) for ax, name in enumerate(y.axes[:-1])]
    dims.append(ParallelDim("feature", PARAMETER, y.shape[-1], r - 1, (None,), (1,)))
    # Vocabulary-parallel embedding (Megatron-LM): each partition holds a slice of rows and
    # writes zeros for ids outside it; the partial outputs are all-reduced.
    dims.append(ParallelDim("vocab", REDUCTION, attrs["num_embeddings"], None, (None,), (0,)))
    return dims


# lstm (one unrolled step) ---------------------------------------------------------------
def _lstm_infer(ins, attrs, precision):
    expect_inputs(ins, (1, 3))
    x = ins[0]
    expect_float(x, 0)
    hidden = positive_int(attrs, "hidden_size")
    if len(x.shape) != 2:
        raise OpError(f"input must be (batch, feature) for one step, got shape {list(x.shape)}", "inputs[0]")
    for i in (1, 2):
        if len(ins) == 3 and ins[i].shape != (x.shape[0], hidden):
            raise OpError(
                f"state input {i} must have shape {[x.shape[0], hidden]}, got {list(ins[i].shape)}",
                f"inputs[{i}]",
            )
    t = TensorInfo((x.shape[0], hidden), ("sample", "feature"), x.dtype)
    return [t, t]  # h_t, c_t


def _lstm_params(ins, attrs):
    h = attrs["hidden_size"]
    # Gates i, f, g, o stacked: W (in, 4H), U (H, 4H), one bias (4H) as in Keras/TF.
    return [
        ParamInfo("w_input", (ins[0].shape[-1], 4 * h)),
        ParamInfo("w_hidden", (h, 4 * h)),
        ParamInfo("bias", (4 * h,)),
    ]


def _lstm_dims(ins, outs, attrs):
    b, h = outs[0].shape
    n = len(ins)
    # Splitting hidden units splits each gate's columns; every partition still needs the
    # whole previous hidden state (the recurrent matmul contracts over it) but only its
    # slice of the cell state.
    hid_in = (None, None, 1) if n == 3 else (None,)
    return [
        ParallelDim("sample", SAMPLE, b, 0, (0,) * n, (None, None, None)),
        ParallelDim("feature", PARAMETER, h, 1, hid_in, (1, 1, 0)),
    ]


def _lstm_flops(ins, outs, params, attrs):
    (fan_x, gates), (fan_h, _), _ = params
    b = outs[0][0]
    units = gates / 4
    return 2.0 * b * (fan_x + fan_h) * gates + LSTM_POINTWISE_FLOPS_PER_UNIT * b * units


def kinds() -> list[OpKind]:
    """The dense kinds, as :data:`engine.ops.OP_KINDS` registers them."""
    return [
        OpKind("conv2d", "2-D convolution, NCHW; attrs: out_channels, kernel, stride, padding, groups, bias.",
               _conv_infer, _conv_params, _conv_dims, _conv_flops, 2.0,
               attrs=("out_channels", "kernel", "stride", "padding", "groups", "bias")),
        OpKind("pool2d", "2-D max/avg pooling, NCHW; attrs: mode, kernel, stride, padding, global.",
               _pool_infer, no_params, _pool_dims, _pool_flops, 1.0,
               attrs=("mode", "kernel", "stride", "padding", "global")),
        OpKind("linear", "Fully-connected layer y = x W + b over the last axis; attrs: out_features, bias.",
               _linear_infer, _linear_params, _linear_dims, _linear_flops, 2.0, attrs=("out_features", "bias")),
        OpKind("batch_matmul", "Batched matmul a @ b (or a @ b^T); attention scores and context; attrs: transpose_b.",
               _bmm_infer, no_params, _bmm_dims, _bmm_flops, 2.0, attrs=("transpose_b",)),
        OpKind("embedding", "Table lookup of integer ids; attrs: num_embeddings, embedding_dim.",
               _embedding_infer, _embedding_params, _embedding_dims, zero_flops, 1.0,
               attrs=("num_embeddings", "embedding_dim"), gathers_params=True),
        OpKind("lstm", "One unrolled LSTM step; inputs x_t[, h_prev, c_prev]; outputs h_t, c_t; attrs: hidden_size.",
               _lstm_infer, _lstm_params, _lstm_dims, _lstm_flops, 2.0, attrs=("hidden_size",)),
    ]
