"""Memory-bound kinds that work element by element: normalisations, softmax, a learned bias or
gain, the elementwise kinds (activations, binary arithmetic, dropout) and an unnamed
elementwise op an importer could not map."""

from __future__ import annotations

import math

from .base import (ATTRIBUTE, PARAMETER, SAMPLE, axis_attr, axis_kind, expect_float, expect_inputs, no_params,
                   OpError, OpKind, ParallelDim, ParamInfo, pointwise_dims)

__all__ = ["kinds", "ELEMENTWISE_KINDS", "MAX_FLOPS_PER_ELEMENT"]

# FLOPs per output element of pointwise ops. Counting conventions, not measurements: these
# ops are memory-bound, so their time comes from bytes moved, and the FLOPs only need to be
# of the right order.
RELU_FLOPS_PER_ELEMENT = 1  # max(x, 0)
GELU_FLOPS_PER_ELEMENT = 8  # tanh approximation: x*0.5*(1+tanh(c*(x+0.044715x^3)))
SILU_FLOPS_PER_ELEMENT = 4  # x * sigmoid(x): exp, add, div, mul
BINARY_FLOPS_PER_ELEMENT = 1  # add, mul
DROPOUT_FLOPS_PER_ELEMENT = 2  # compare a random number, scale
LAYERNORM_FLOPS_PER_ELEMENT = 8  # mean, centre, square, variance, rsqrt-scale, affine (2)
RMSNORM_FLOPS_PER_ELEMENT = 5  # square, mean, rsqrt-scale, gain
BATCHNORM_FLOPS_PER_ELEMENT = 8  # as layernorm, statistics over the batch
SOFTMAX_FLOPS_PER_ELEMENT = 5  # max, subtract, exp, sum, divide

# normalisation ---------------------------------------------------------------------------
def _norm_infer(ins, attrs, precision):
    expect_inputs(ins, (1,))
    expect_float(ins[0], 0)
    return [ins[0]]


def _layernorm_params(ins, attrs):
    h = ins[0].shape[-1]
    return [ParamInfo("gain", (h,)), ParamInfo("bias", (h,))]


def _rmsnorm_params(ins, attrs):
    return [ParamInfo("gain", (ins[0].shape[-1],))]


def _lastnorm_dims(n_params):
    def dims(ins, outs, attrs):
        return pointwise_dims(outs, 1, skip_axis=len(outs[0].shape) - 1, n_params=n_params)

    return dims


def _batchnorm_infer(ins, attrs, precision):
    expect_inputs(ins, (1,))
    if len(ins[0].shape) != 4:
        raise OpError(f"input must be (batch, channel, height, width), got {list(ins[0].shape)}", "inputs[0]")
    return [ins[0]]


def _batchnorm_params(ins, attrs):
    c = ins[0].shape[1]
    return [ParamInfo("gain", (c,)), ParamInfo("bias", (c,))]


def _batchnorm_dims(ins, outs, attrs):
    n, c, h, w = outs[0].shape
    # Splitting the batch computes statistics per partition (as data-parallel training
    # without SyncBN does); channels split the per-channel gain and bias.
    return [
        ParallelDim("sample", SAMPLE, n, 0, (0,), (None, None)),
        ParallelDim("channel", PARAMETER, c, 1, (1,), (0, 0)),
        ParallelDim("height", ATTRIBUTE, h, 2, (2,), (None, None)),
        ParallelDim("width", ATTRIBUTE, w, 3, (3,), (None, None)),
    ]


def _per_element(cost: float):
    def flops(ins, outs, params, attrs):
        return float(cost * math.prod(outs[0]))

    return flops


# bias --------------------------------------------------------------------------------------
def _bias_params(ins, attrs):
    return [ParamInfo("bias", (ins[0].shape[-1],))]


def _bias_dims(ins, outs, attrs):
    """Pointwise; a split of the last axis splits the bias vector with it."""
    out = outs[0]
    last = len(out.shape) - 1
    return [ParallelDim(name, PARAMETER if ax == last else axis_kind(name), out.shape[ax], ax, (ax,),
                        (0 if ax == last else None,)) for ax, name in enumerate(out.axes)]


# softmax ---------------------------------------------------------------------------------
def _softmax_infer(ins, attrs, precision):
    expect_inputs(ins, (1,))
    expect_float(ins[0], 0)
    axis_attr(attrs, len(ins[0].shape))
    return [ins[0]]


def _softmax_dims(ins, outs, attrs):
    return pointwise_dims(outs, 1, skip_axis=axis_attr(attrs, len(outs[0].shape)))


# elementwise -------------------------------------------------------------------------------
ELEMENTWISE_KINDS = {
    "relu": (1, RELU_FLOPS_PER_ELEMENT),
    "gelu": (1, GELU_FLOPS_PER_ELEMENT),
    "silu": (1, SILU_FLOPS_PER_ELEMENT),
    "tanh": (1, GELU_FLOPS_PER_ELEMENT),
    "sigmoid": (1, SILU_FLOPS_PER_ELEMENT),
    "dropout": (1, DROPOUT_FLOPS_PER_ELEMENT),
    "add": (2, BINARY_FLOPS_PER_ELEMENT),
    "mul": (2, BINARY_FLOPS_PER_ELEMENT),
}


def _elementwise_infer(n_inputs):
    def infer(ins, attrs, precision):
        expect_inputs(ins, (n_inputs,))
        for i, t in enumerate(ins):
            expect_float(t, i)
        first = ins[0]
        for i, t in enumerate(ins[1:], start=1):
            if t.shape != first.shape:
                raise OpError(
                    f"input shapes differ: {list(first.shape)} vs {list(t.shape)} (no broadcasting)",
                    f"inputs[{i}]",
                )
        if n_inputs == 1 and "rate" in attrs:
            rate = attrs["rate"]
            if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 <= rate < 1:
                raise OpError(f"must be in [0, 1), got {rate!r}", "attrs.rate")
        return [first]

    return infer


def _elementwise_dims(ins, outs, attrs):
    return pointwise_dims(outs, len(ins))


#: the most FLOPs per element a generic elementwise op may declare (erf, pow: tens)
MAX_FLOPS_PER_ELEMENT = 1000.0


def _generic_infer(ins, attrs, precision):
    expect_inputs(ins, (1,))
    f = attrs.get("flops_per_element", 1.0)
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= MAX_FLOPS_PER_ELEMENT:
        raise OpError(f"must be a number from 0 to {MAX_FLOPS_PER_ELEMENT:g}, got {f!r}", "attrs.flops_per_element")
    label = attrs.get("label", "")
    if not isinstance(label, str) or len(label) > 200:
        raise OpError("must be a string of at most 200 characters", "attrs.label")
    return [ins[0]]


def _generic_flops(ins, outs, params, attrs):
    return float(attrs.get("flops_per_element", 1.0) * math.prod(outs[0]))


def kinds() -> list[OpKind]:
    """The pointwise kinds, as :data:`engine.ops.OP_KINDS` registers them."""
    return [
        OpKind("layernorm", "Layer normalisation over the last axis (gain and bias).",
               _norm_infer, _layernorm_params, _lastnorm_dims(2), _per_element(LAYERNORM_FLOPS_PER_ELEMENT), 2.0),
        OpKind("rmsnorm", "RMS normalisation over the last axis (gain only; Zhang & Sennrich 2019).",
               _norm_infer, _rmsnorm_params, _lastnorm_dims(1), _per_element(RMSNORM_FLOPS_PER_ELEMENT), 2.0),
        OpKind("batchnorm", "Batch normalisation of NCHW activations (gain and bias per channel).",
               _batchnorm_infer, _batchnorm_params, _batchnorm_dims, _per_element(BATCHNORM_FLOPS_PER_ELEMENT), 2.0),
        OpKind("softmax", "Softmax along one axis; attrs: axis.",
               _softmax_infer, no_params, _softmax_dims, _per_element(SOFTMAX_FLOPS_PER_ELEMENT), 1.0,
               attrs=("axis",), bwd_keeps_output=True),
        OpKind("bias", "A learned bias added along the last axis, apart from its GEMM (the bias of a layer whose "
                       "weight is tied to another op's, e.g. BERT's masked-LM decoder).",
               _norm_infer, _bias_params, _bias_dims, _per_element(BINARY_FLOPS_PER_ELEMENT), 1.0,
               bwd_reads_inputs=False),
        OpKind("scale", "A learned gain multiplied along the last axis, apart from its norm (a normalisation an "
                        "exporter decomposed into elementwise ops: the RMSNorm of LLaMA in ONNX).",
               _norm_infer, _bias_params, _bias_dims, _per_element(BINARY_FLOPS_PER_ELEMENT), 2.0),
        OpKind("elementwise", "A memory-bound op on each element of one input, with no kind of its own (an "
                              "imported op: a constant scale or bias, erf, pow...); attrs: flops_per_element, label.",
               _generic_infer, no_params, _elementwise_dims, _generic_flops, 1.0,
               attrs=("flops_per_element", "label")),
        *(OpKind(name, f"Elementwise {name} of {n_in} equal-shaped input(s).",
                 _elementwise_infer(n_in), no_params, _elementwise_dims, _per_element(cost), 1.0,
                 attrs=("rate",) if name == "dropout" else (), bwd_reads_inputs=name != "add",
                 bwd_saved_bytes_per_element=1.0 if name == "dropout" else None)
          for name, (n_in, cost) in ELEMENTWISE_KINDS.items()),
    ]
