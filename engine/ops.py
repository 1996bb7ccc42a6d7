"""The operator catalogue: shapes, FLOPs, bytes, parameters and parallel dimensions.

Each operator kind knows, from its input tensors and attributes,

* its output tensors (shape, axis names, dtype),
* its parameter tensors (shapes, in elements),
* its forward and backward FLOPs,
* the dimensions along which it can be partitioned, each tagged as in FlexFlow's
  Table 1 (Jia et al., SysML'19, §4): **S**ample (the batch), **A**ttribute (e.g. height,
  width, sequence length; splitting needs no parameter replication change), **P**arameter
  (splitting divides the op's parameters), plus **R**eduction dimensions: splitting the
  contracted axis of a matmul leaves every partition with a partial sum of the whole
  output, which an all-reduce must combine afterwards (Megatron-LM's row-parallel linear,
  Shoeybi et al. 2019, §3; vocabulary-parallel embedding and cross-entropy).

FLOPs counting convention (documented, not measured): a multiply-add is 2 FLOPs; matmul-like
ops (conv2d, linear, batch_matmul, LSTM gates) count only their multiply-adds, as model-FLOP
utilisation accounting does (Chowdhery et al., PaLM 2022, Appendix B; Narayanan et al.
SC'21 Eq. 3), bias additions are not counted; pointwise ops count a fixed number of
FLOPs per element given by the ``*_FLOPS_PER_ELEMENT`` constants below. Every FLOPs
formula is *multiplicative* in the partitioned axes, so the FLOPs of an op's partitions add
up exactly to the op's FLOPs (a property the tests check by recomputing the formula on each
partition's shapes). Backward FLOPs are 2x forward for ops with a weight gradient and an
input gradient (both are matmuls of the same size), 1x for the others.

Preconditions not checked here: attribute values have already passed the JSON Schema
(types); this module checks their meaning (divisibility, shape agreement).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

__all__ = [
    "sliding_window",
    "SAMPLE",
    "ATTRIBUTE",
    "PARAMETER",
    "REDUCTION",
    "REPLICA",
    "EXPERT",
    "MOE_KINDS",
    "MOE_DISPATCHERS",
    "experts_capacity_share",
    "REPLICA_DIM",
    "replica_dim",
    "DIM_KINDS",
    "DTYPE_BYTES",
    "TensorInfo",
    "ParamInfo",
    "ParallelDim",
    "OpError",
    "OpKind",
    "OP_KINDS",
    "op_kind",
    "ELEMENTWISE_KINDS",
    "MAX_DIM",
    "MAX_RANK",
    "MAX_TENSOR_ELEMENTS",
    "MAX_OP_TENSORS",
    "FLOAT_ATTRS",
]

SAMPLE = "S"
ATTRIBUTE = "A"
PARAMETER = "P"
REDUCTION = "R"
REPLICA = "C"
#: An expert dim (mixture-of-experts layers): its partitions hold different experts *and*
#: different tokens; before the experts run, every token goes to the partitions holding the
#: experts its router chose and comes back after (the all-to-all of GShard, Lepikhin et al.
#: 2020 §2.2). Regions: the dim splits the token axis it names, nested inside the dims
#: declared before it on that axis (:func:`engine.taskgraph.regions.out_regions`).
EXPERT = "E"
DIM_KINDS = {
    SAMPLE: "sample",
    ATTRIBUTE: "attribute",
    PARAMETER: "parameter",
    REDUCTION: "reduction",
    REPLICA: "replica",
    EXPERT: "expert",
}
#: Name of the replica dim every op has: its partitions compute the same thing on different
#: devices (Unity's replica dimension, Unger et al. OSDI'22 §4). Megatron replicates
#: LayerNorm and residual adds across a tensor-parallel group this way. Any degree is valid.
REPLICA_DIM = "replica"

#: Bytes per element of each dtype.
DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "tf32": 4,  # fp32 storage; matmuls on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32)
    "fp16": 2,
    "bf16": 2,
    "int32": 4,
    "int64": 8,
}
FLOAT_DTYPES = ("fp32", "tf32", "fp16", "bf16")

# Sizes the simulator represents exactly: element counts and byte counts stay far inside
# int64 (2**63) and FLOPs and seconds far inside float64, whatever a file says.
#: Largest size of one axis and of any size attribute (out_features, kernel, padding, ...).
MAX_DIM = 2**31 - 1
#: Most axes a tensor may have.
MAX_RANK = 16
#: Most elements in one tensor: 2**44 ~ 1.8e13, 28x GPT-3 175B's largest activation
#: (attention scores at batch 1536: 6.2e11); its bytes (<= 2**47) fit int64 with room to sum.
MAX_TENSOR_ELEMENTS = 2**44
#: Most inputs of one op and most outputs of one split.
MAX_OP_TENSORS = 4096
#: Attributes that hold real numbers; every other number in ``attrs`` is an integer, and
#: one written ``5.0`` is read as ``5``.
FLOAT_ATTRS = frozenset({"rate", "flops_per_element", "capacity_factor"})

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
CROSS_ENTROPY_FLOPS_PER_ELEMENT = 6  # softmax (5) + log of the target
# LSTM cell pointwise work per hidden unit: 3 sigmoids, 2 tanh, 3 multiplies, 1 add
# (Hochreiter & Schmidhuber 1997 cell equations as in cuDNN's LSTM docs).
LSTM_POINTWISE_FLOPS_PER_UNIT = 9


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's shape (elements per axis), axis names and dtype."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def size_bytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class ParamInfo:
    """A parameter tensor of an op: its name within the op and its shape in elements."""

    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ParallelDim:
    """A dimension along which an operator can be partitioned.

    Attributes
    ----------
    name : str
        Name used in configs (``"sample"``, ``"height"``, ``"feature"``, ``"in_feature"``).
    kind : str
        One of ``S``, ``A``, ``P``, ``R``, or ``C`` for the replica dim (see the module
        docstring and :func:`replica_dim`).
    size : int
        Extent of the dimension in elements; a degree must divide it (0: any degree, for
        the replica dim).
    out_axis : int or None
        Axis of every output tensor this dim partitions; ``None`` for a reduction dim (every
        partition produces a partial sum of the whole output).
    in_axes : tuple of (int or None)
        For each input, the axis this dim partitions, or ``None`` when each partition needs
        the whole input along this dim (the input is replicated).
    param_axes : tuple of (int or None)
        For each parameter, the axis this dim partitions, or ``None`` (replicated).
    group : int
        When non-zero, a degree must divide ``group`` or be a multiple of it: grouped-query
        attention's head dim, where ``group`` is the number of key/value heads and a
        partition's query heads must not straddle two key/value heads.
    """

    name: str
    kind: str
    size: int
    out_axis: int | None
    in_axes: tuple[int | None, ...]
    param_axes: tuple[int | None, ...] = ()
    group: int = 0

    def degree_problem(self, degree: int) -> str | None:
        """Why ``degree`` is not valid for this dim, or ``None`` when it is."""
        if self.size and self.size % degree:
            return f"{degree} does not divide {self.name} ({self.size})"
        if self.group and self.group % degree and degree % self.group:
            return (f"{degree} splits the {self.size} {self.name}s across their {self.group} key/value groups; "
                    f"use a degree that divides {self.group} or is a multiple of it")
        return None

    @property
    def is_replica(self) -> bool:
        return self.kind == REPLICA

    @property
    def needs_reduction(self) -> bool:
        """True when partitions along this dim produce partial sums (an all-reduce follows)."""
        return self.kind == REDUCTION


def replica_dim(n_inputs: int, n_params: int) -> ParallelDim:
    """The replica dim: no tensor is split, every partition holds whole copies. Its
    ``size`` is 0, meaning any degree is allowed."""
    return ParallelDim(REPLICA_DIM, REPLICA, 0, None, (None,) * n_inputs, (None,) * n_params)


class OpError(ValueError):
    """A problem with one operator's inputs or attributes; ``field`` says which."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


# --------------------------------------------------------------------------- helpers


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_pair(value: Any, name: str, minimum: int) -> tuple[int, int]:
    """``value`` (an integer or a pair) as a pair, each in ``minimum..MAX_DIM``."""
    pair = (value, value) if _is_int(value) else tuple(value) if isinstance(value, (list, tuple)) else None
    if pair is None or len(pair) != 2 or not all(_is_int(v) for v in pair):
        raise OpError(f"expected an integer or a pair of integers, got {value!r}", f"attrs.{name}")
    if not all(minimum <= v <= MAX_DIM for v in pair):
        raise OpError(f"must be between {minimum} and {MAX_DIM:,}, got {value!r}", f"attrs.{name}")
    return (pair[0], pair[1])


def _require(attrs: Mapping[str, Any], name: str) -> Any:
    if name not in attrs:
        raise OpError("missing required attribute", f"attrs.{name}")
    return attrs[name]


def _positive_int(attrs: Mapping[str, Any], name: str, default: int | None = None) -> int:
    value = attrs.get(name, default) if default is not None else _require(attrs, name)
    if not _is_int(value) or value <= 0:
        raise OpError(f"must be a positive integer, got {value!r}", f"attrs.{name}")
    if value > MAX_DIM:
        raise OpError(f"must be at most {MAX_DIM:,}, got {value!r}", f"attrs.{name}")
    return value


def _flag(attrs: Mapping[str, Any], name: str, default: bool) -> bool:
    """A true/false attribute (``bias``, ``transpose_b``, ...); ``"yes"`` or 1 is refused."""
    value = attrs.get(name, default)
    if not isinstance(value, bool):
        raise OpError(f"must be true or false, got {value!r}", f"attrs.{name}")
    return value


def _shape_attr(attrs: Mapping[str, Any], name: str, allow_infer: bool = False) -> list[int]:
    """A shape attribute: 1 to MAX_RANK sizes, each 1..MAX_DIM (or one -1 to infer)."""
    shape = _require(attrs, name)
    ok = isinstance(shape, (list, tuple)) and 0 < len(shape) <= MAX_RANK and all(
        _is_int(s) and (0 < s <= MAX_DIM or (allow_infer and s == -1)) for s in shape)
    if not ok or (allow_infer and list(shape).count(-1) > 1):
        infer = " (or one -1 to infer)" if allow_infer else ""
        raise OpError(f"must be a list of 1 to {MAX_RANK} sizes from 1 to {MAX_DIM:,}{infer}, got {shape!r}",
                      f"attrs.{name}")
    return list(shape)


def _axis(attrs: Mapping[str, Any], rank: int, default: int = -1) -> int:
    axis = attrs.get("axis", default)
    if not _is_int(axis) or not -rank <= axis < rank:
        raise OpError(f"axis {axis!r} is out of range for a rank-{rank} tensor", "attrs.axis")
    return axis % rank


def _expect_inputs(ins: Sequence[TensorInfo], counts: Sequence[int]) -> None:
    if len(ins) not in counts:
        want = " or ".join(str(c) for c in counts)
        raise OpError(f"expects {want} input(s), got {len(ins)}", "inputs")


def _expect_float(t: TensorInfo, i: int) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise OpError(f"input {i} must be a floating-point tensor, got {t.dtype}", f"inputs[{i}]")


def _dedupe(axes: Sequence[str]) -> tuple[str, ...]:
    """Make axis names unique by suffixing repeats: (length, length) -> (length, length2)."""
    seen: dict[str, int] = {}
    out = []
    for a in axes:
        n = seen.get(a, 0) + 1
        seen[a] = n
        out.append(a if n == 1 else f"{a}{n}")
    return tuple(out)


def sliding_window(kind: str, attrs: Mapping[str, Any]) -> tuple[tuple[int, int], ...] | None:
    """``((kernel_h, kernel_w), (stride_h, stride_w), (pad_h, pad_w))`` of an op that slides a
    window over height and width (a convolution, a pooling that is not global), else None:
    the one rule for which input rows a height or width split must read (its halo) and for
    the output size. A pooling's stride defaults to its kernel, a convolution's to 1.

    >>> sliding_window("pool2d", {"kernel": 2}), sliding_window("relu", {})
    (((2, 2), (2, 2), (0, 0)), None)
    """
    if kind not in ("conv2d", "pool2d") or attrs.get("global", False):
        return None
    kernel = _int_pair(attrs.get("kernel", 1), "kernel", 1)
    stride = _int_pair(attrs.get("stride", kernel if kind == "pool2d" else 1), "stride", 1)
    return kernel, stride, _int_pair(attrs.get("padding", 0), "padding", 0)


def _conv_out(size: int, kernel: int, stride: int, pad: int, what: str, field_: str) -> int:
    out = (size + 2 * pad - kernel) // stride + 1
    if out <= 0:
        raise OpError(
            f"{what} {size} with kernel {kernel}, stride {stride}, padding {pad} gives an empty output",
            field_,
        )
    return out


def _axis_kind(name: str) -> str:
    return SAMPLE if name == "sample" else ATTRIBUTE


def _pointwise_dims(
    outs: Sequence[TensorInfo], n_inputs: int, skip_axis: int | None = None, n_params: int = 0
) -> list[ParallelDim]:
    """Dims of an op whose output axes map one-to-one onto the same axes of each input."""
    out = outs[0]
    return [
        ParallelDim(name, _axis_kind(name), out.shape[ax], ax, (ax,) * n_inputs, (None,) * n_params)
        for ax, name in enumerate(out.axes)
        if ax != skip_axis
    ]


# --------------------------------------------------------------------------- kinds


@dataclass(frozen=True)
class OpKind:
    """How one operator kind computes shapes, parameters, FLOPs and parallel dims.

    The callables receive the input :class:`TensorInfo` list and the attribute mapping
    (``infer``, ``params``), or the input, output and parameter *shapes* (``fwd_flops``),
    so that the FLOPs of a partition come from the same formula applied to its shapes.
    """

    name: str
    doc: str
    infer: Callable[[Sequence[TensorInfo], Mapping[str, Any], str], list[TensorInfo]]
    params: Callable[[Sequence[TensorInfo], Mapping[str, Any]], list[ParamInfo]]
    dims: Callable[[Sequence[TensorInfo], Sequence[TensorInfo], Mapping[str, Any]], list[ParallelDim]]
    fwd_flops: Callable[[Sequence[tuple], Sequence[tuple], Sequence[tuple], Mapping[str, Any]], float]
    bwd_factor: float = 1.0
    #: True for ops that only re-label memory (reshape): they move no bytes.
    is_view: bool = False
    attrs: tuple[str, ...] = field(default=())
    #: False for ops whose backward pass needs none of their inputs (add, concat, split,
    #: transpose: the gradient is routed, not computed from saved activations).
    bwd_reads_inputs: bool = True
    #: Bytes per input element kept for the backward pass instead of the inputs themselves
    #: (None: the float inputs at their dtype). Dropout keeps its mask, one byte per element
    #: (Korthikanti et al. 2022 §4.1).
    bwd_saved_bytes_per_element: float | None = None
    #: True for table lookups (embedding): forward reads only the gathered rows, not the
    #: whole table, and backward scatters into the gathered rows only.
    gathers_params: bool = False


def _no_params(ins: Sequence[TensorInfo], attrs: Mapping[str, Any]) -> list[ParamInfo]:
    return []


def _zero_flops(ins, outs, params, attrs) -> float:
    return 0.0


# input -------------------------------------------------------------------------------
def _input_infer(ins, attrs, precision):
    _expect_inputs(ins, (0,))
    shape = _shape_attr(attrs, "shape")
    dtype = attrs.get("dtype", precision)
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise OpError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}", "attrs.dtype")
    axes = _axis_names(attrs) or _default_axes(len(shape))
    if len(axes) != len(shape):
        raise OpError(f"{len(axes)} axis names for a rank-{len(shape)} shape", "attrs.axes")
    return [TensorInfo(tuple(shape), _dedupe(axes), dtype)]


def _axis_names(attrs: Mapping[str, Any]) -> tuple[str, ...] | None:
    axes = attrs.get("axes")
    if axes is None:
        return None
    if not isinstance(axes, (list, tuple)) or not all(isinstance(a, str) and a for a in axes):
        raise OpError(f"must be a list of axis names (strings), got {axes!r}", "attrs.axes")
    return tuple(axes)


def _default_axes(rank: int) -> tuple[str, ...]:
    return {
        1: ("sample",),
        2: ("sample", "feature"),
        3: ("sample", "length", "feature"),
        4: ("sample", "channel", "height", "width"),
    }.get(rank, ("sample",) + tuple(f"axis{i}" for i in range(1, rank)))


def _input_dims(ins, outs, attrs):
    return _pointwise_dims(outs, 0)


# conv2d ------------------------------------------------------------------------------
def _conv_infer(ins, attrs, precision):
    _expect_inputs(ins, (1,))
    x = ins[0]
    _expect_float(x, 0)
    if len(x.shape) != 4:
        raise OpError(f"input must be (batch, channel, height, width), got shape {list(x.shape)}", "inputs[0]")
    n, c, h, w = x.shape
    k = _positive_int(attrs, "out_channels")
    _require(attrs, "kernel")
    (kh, kw), (sh, sw), (ph, pw) = sliding_window("conv2d", attrs)
    g = _positive_int(attrs, "groups", 1)
    _flag(attrs, "bias", True)
    if c % g or k % g:
        raise OpError(f"groups {g} must divide in channels {c} and out channels {k}", "attrs.groups")
    ho = _conv_out(h, kh, sh, ph, "height", "attrs.kernel")
    wo = _conv_out(w, kw, sw, pw, "width", "attrs.kernel")
    return [TensorInfo((n, k, ho, wo), ("sample", "channel", "height", "width"), x.dtype)]


def _conv_params(ins, attrs):
    c = ins[0].shape[1]
    k = attrs["out_channels"]
    kh, kw = _int_pair(attrs["kernel"], "kernel", 1)
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
    _expect_inputs(ins, (1,))
    x = ins[0]
    if len(x.shape) != 4:
        raise OpError(f"input must be (batch, channel, height, width), got shape {list(x.shape)}", "inputs[0]")
    mode = attrs.get("mode", "max")
    if mode not in ("max", "avg"):
        raise OpError(f"mode must be 'max' or 'avg', got {mode!r}", "attrs.mode")
    n, c, h, w = x.shape
    if _flag(attrs, "global", False):
        return [TensorInfo((n, c, 1, 1), ("sample", "channel", "height", "width"), x.dtype)]
    _require(attrs, "kernel")
    (kh, kw), (sh, sw), (ph, pw) = sliding_window("pool2d", attrs)
    ho = _conv_out(h, kh, sh, ph, "height", "attrs.kernel")
    wo = _conv_out(w, kw, sw, pw, "width", "attrs.kernel")
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
    kh, kw = _int_pair(attrs["kernel"], "kernel", 1)
    return float(math.prod(outs[0]) * kh * kw)


# linear ------------------------------------------------------------------------------
def _linear_infer(ins, attrs, precision):
    _expect_inputs(ins, (1,))
    x = ins[0]
    _expect_float(x, 0)
    out = _positive_int(attrs, "out_features")
    _flag(attrs, "bias", True)
    axes = _dedupe(x.axes[:-1] + ("feature",))
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
        ParallelDim(name, _axis_kind(name), y.shape[ax], ax, (ax,), (None,) * nparams)
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
    _expect_inputs(ins, (2,))
    a, b = ins
    _expect_float(a, 0)
    _expect_float(b, 1)
    if len(a.shape) < 3 or len(a.shape) != len(b.shape):
        raise OpError(
            f"inputs must have the same rank >= 3, got shapes {list(a.shape)} and {list(b.shape)}", "inputs"
        )
    tb = _flag(attrs, "transpose_b", False)
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
    axes = _dedupe(a.axes[:-1] + (n_axis,))
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
        dims.append(ParallelDim(name, _axis_kind(name), y.shape[ax], ax, (ax, ax), group=group))
    dims.append(ParallelDim(y.axes[r - 2], ATTRIBUTE, y.shape[r - 2], r - 2, (r - 2, None)))
    dims.append(ParallelDim(y.axes[r - 1], ATTRIBUTE, y.shape[r - 1], r - 1, (None, b_n_axis)))
    dims.append(ParallelDim("inner", REDUCTION, a.shape[-1], None, (r - 1, b_k_axis)))
    return dims


def _bmm_flops(ins, outs, params, attrs):
    return 2.0 * math.prod(outs[0]) * ins[0][-1]


# embedding ---------------------------------------------------------------------------
def _embedding_infer(ins, attrs, precision):
    _expect_inputs(ins, (1,))
    ids = ins[0]
    if ids.dtype not in ("int32", "int64"):
        raise OpError(f"input must be integer ids, got {ids.dtype}", "inputs[0]")
    _positive_int(attrs, "num_embeddings")
    dim = _positive_int(attrs, "embedding_dim")
    return [TensorInfo(ids.shape + (dim,), _dedupe(ids.axes + ("feature",)), precision)]


def _embedding_params(ins, attrs):
    return [ParamInfo("weight", (attrs["num_embeddings"], attrs["embedding_dim"]))]


def _embedding_dims(ins, outs, attrs):
    y = outs[0]
    r = len(y.shape)
    dims = [ParallelDim(name, _axis_kind(name), y.shape[ax], ax, (ax,), (None,)) for ax, name in enumerate(y.axes[:-1])]
    dims.append(ParallelDim("feature", PARAMETER, y.shape[-1], r - 1, (None,), (1,)))
    # Vocabulary-parallel embedding (Megatron-LM): each partition holds a slice of rows and
    # writes zeros for ids outside it; the partial outputs are all-reduced.
    dims.append(ParallelDim("vocab", REDUCTION, attrs["num_embeddings"], None, (None,), (0,)))
    return dims


# lstm (one unrolled step) ---------------------------------------------------------------
def _lstm_infer(ins, attrs, precision):
    _expect_inputs(ins, (1, 3))
    x = ins[0]
    _expect_float(x, 0)
    hidden = _positive_int(attrs, "hidden_size")
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


# normalisation ---------------------------------------------------------------------------
def _norm_infer(ins, attrs, precision):
    _expect_inputs(ins, (1,))
    _expect_float(ins[0], 0)
    return [ins[0]]


def _layernorm_params(ins, attrs):
    h = ins[0].shape[-1]
    return [ParamInfo("gain", (h,)), ParamInfo("bias", (h,))]


def _rmsnorm_params(ins, attrs):
    return [ParamInfo("gain", (ins[0].shape[-1],))]


def _lastnorm_dims(n_params):
    def dims(ins, outs, attrs):
        return _pointwise_dims(outs, 1, skip_axis=len(outs[0].shape) - 1, n_params=n_params)

    return dims


def _batchnorm_infer(ins, attrs, precision):
    _expect_inputs(ins, (1,))
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
    return [ParallelDim(name, PARAMETER if ax == last else _axis_kind(name), out.shape[ax], ax, (ax,),
                        (0 if ax == last else None,)) for ax, name in enumerate(out.axes)]


# softmax ---------------------------------------------------------------------------------
def _softmax_infer(ins, attrs, precision):
    _expect_inputs(ins, (1,))
    _expect_float(ins[0], 0)
    _axis(attrs, len(ins[0].shape))
    return [ins[0]]


def _softmax_dims(ins, outs, attrs):
    return _pointwise_dims(outs, 1, skip_axis=_axis(attrs, len(outs[0].shape)))


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
        _expect_inputs(ins, (n_inputs,))
        for i, t in enumerate(ins):
            _expect_float(t, i)
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
    return _pointwise_dims(outs, len(ins))


#: the most FLOPs per element a generic elementwise op may declare (erf, pow: tens)
MAX_FLOPS_PER_ELEMENT = 1000.0


def _generic_infer(ins, attrs, precision):
    _expect_inputs(ins, (1,))
    f = attrs.get("flops_per_element", 1.0)
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= MAX_FLOPS_PER_ELEMENT:
        raise OpError(f"must be a number from 0 to {MAX_FLOPS_PER_ELEMENT:g}, got {f!r}", "attrs.flops_per_element")
    label = attrs.get("label", "")
    if not isinstance(label, str) or len(label) > 200:
        raise OpError("must be a string of at most 200 characters", "attrs.label")
    return [ins[0]]


def _generic_flops(ins, outs, params, attrs):
    return float(attrs.get("flops_per_element", 1.0) * math.prod(outs[0]))


# concat / split / reshape / transpose ---------------------------------------------------------
def _concat_infer(ins, attrs, precision):
    if len(ins) < 2:
        raise OpError(f"expects at least 2 inputs, got {len(ins)}", "inputs")
    first = ins[0]
    axis = _axis(attrs, len(first.shape))
    for i, t in enumerate(ins[1:], start=1):
        if len(t.shape) != len(first.shape) or any(
            a != b for j, (a, b) in enumerate(zip(t.shape, first.shape)) if j != axis
        ):
            raise OpError(
                f"shape {list(t.shape)} does not match {list(first.shape)} outside axis {axis}", f"inputs[{i}]"
            )
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in ins)
    return [TensorInfo(tuple(shape), first.axes, first.dtype)]


def _concat_dims(ins, outs, attrs):
    return _pointwise_dims(outs, len(ins), skip_axis=_axis(attrs, len(outs[0].shape)))


def _split_infer(ins, attrs, precision):
    _expect_inputs(ins, (1,))
    x = ins[0]
    axis = _axis(attrs, len(x.shape))
    sizes = _require(attrs, "sizes")
    if not isinstance(sizes, (list, tuple)) or not 0 < len(sizes) <= MAX_OP_TENSORS \
            or not all(_is_int(s) and s > 0 for s in sizes):
        raise OpError(f"must be a list of 1 to {MAX_OP_TENSORS} positive integers, got {sizes!r}", "attrs.sizes")
    if sum(sizes) != x.shape[axis]:
        raise OpError(f"sizes add up to {sum(sizes)}, but axis {axis} has {x.shape[axis]}", "attrs.sizes")
    squeeze = _flag(attrs, "squeeze", False)
    if squeeze and any(s != 1 for s in sizes):
        raise OpError("squeeze needs every size to be 1", "attrs.squeeze")
    outs = []
    for s in sizes:
        shape = list(x.shape)
        axes = list(x.axes)
        if squeeze:
            del shape[axis]
            del axes[axis]
        else:
            shape[axis] = s
        outs.append(TensorInfo(tuple(shape), tuple(axes), x.dtype))
    return outs


def _split_dims(ins, outs, attrs):
    axis = _axis(attrs, len(ins[0].shape))
    squeeze = bool(attrs.get("squeeze", False))
    dims = []
    for ax, name in enumerate(ins[0].axes):
        if ax == axis:
            continue
        out_ax = ax - 1 if (squeeze and ax > axis) else ax
        dims.append(ParallelDim(name, _axis_kind(name), ins[0].shape[ax], out_ax, (ax,)))
    return dims


def _reshape_infer(ins, attrs, precision):
    _expect_inputs(ins, (1,))
    x = ins[0]
    shape = _shape_attr(attrs, "shape", allow_infer=True)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if x.numel % known:
            raise OpError(f"cannot infer -1: {x.numel} elements are not a multiple of {known}", "attrs.shape")
        shape[shape.index(-1)] = x.numel // known
    if math.prod(shape) != x.numel:
        raise OpError(
            f"shape {shape} holds {math.prod(shape)} elements, the input {list(x.shape)} holds {x.numel}",
            "attrs.shape",
        )
    axes = _axis_names(attrs)
    if axes is None:
        axes = _reshape_default_axes(x, shape)
    elif len(axes) != len(shape):
        raise OpError(f"{len(axes)} axis names for a rank-{len(shape)} shape", "attrs.axes")
    return [TensorInfo(tuple(shape), _dedupe(axes), x.dtype)]


def _reshape_groups(in_shape: Sequence[int], out_shape: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Pair runs of input and output axes whose element counts agree (row-major)."""
    groups = []
    i = j = 0
    while i < len(in_shape) or j < len(out_shape):
        gi, gj = [i], [j]
        pi = in_shape[i] if i < len(in_shape) else 1
        pj = out_shape[j] if j < len(out_shape) else 1
        i += 1
        j += 1
        while pi != pj:
            if pi < pj:
                pi *= in_shape[i]
                gi.append(i)
                i += 1
            else:
                pj *= out_shape[j]
                gj.append(j)
                j += 1
        groups.append(([a for a in gi if a < len(in_shape)], [b for b in gj if b < len(out_shape)]))
    return groups


def _reshape_default_axes(x: TensorInfo, shape: Sequence[int]) -> tuple[str, ...]:
    """Name output axes after the input axes they come from: in each group of axes that
    reshape keeps, merges or splits, the outermost output axis longer than 1 takes the name
    of the outermost input axis longer than 1 (``feature`` when a merge makes the last
    axis, as a flatten does); the other output axes are named ``axisN``."""
    names: list[str] = []
    for gi, gj in _reshape_groups(x.shape, shape):
        big_in = [a for a in gi if x.shape[a] > 1] or gi
        lead = next((b for b in gj if shape[b] > 1), gj[0] if gj else None)
        for b in gj:
            if b == lead and big_in:
                merged_last = len(big_in) > 1 and b == len(shape) - 1
                names.append("feature" if merged_last else x.axes[big_in[0]])
            else:
                names.append(f"axis{b}")
    return tuple(names)


def _reshape_dims(ins, outs, attrs):
    # The outermost output axis longer than 1 of each group of axes that reshape keeps,
    # merges or splits can be partitioned: with a row-major layout its contiguous ranges
    # are contiguous ranges of the group's outermost input axis longer than 1, for any
    # degree dividing both extents.
    x, y = ins[0], outs[0]
    dims = []
    for gi, gj in _reshape_groups(x.shape, y.shape):
        big_in = [a for a in gi if x.shape[a] > 1]
        big_out = [b for b in gj if y.shape[b] > 1]
        if not big_in or not big_out:
            continue
        ax, in_ax = big_out[0], big_in[0]
        size = math.gcd(y.shape[ax], x.shape[in_ax])
        if size > 1:
            name = y.axes[ax]
            dims.append(ParallelDim(name, _axis_kind(name), size, ax, (in_ax,)))
    return dims


def _transpose_infer(ins, attrs, precision):
    _expect_inputs(ins, (1,))
    x = ins[0]
    perm = _require(attrs, "perm")
    if not isinstance(perm, (list, tuple)) or not all(_is_int(p) for p in perm) \
            or sorted(perm) != list(range(len(x.shape))):
        raise OpError(f"must be a permutation of 0..{len(x.shape) - 1}, got {perm!r}", "attrs.perm")
    return [TensorInfo(tuple(x.shape[p] for p in perm), tuple(x.axes[p] for p in perm), x.dtype)]


def _transpose_dims(ins, outs, attrs):
    perm = attrs["perm"]
    y = outs[0]
    return [ParallelDim(name, _axis_kind(name), y.shape[ax], ax, (perm[ax],)) for ax, name in enumerate(y.axes)]


# fused attention (FlashAttention) ------------------------------------------------------------
# FlashAttention (Dao et al. NeurIPS'22; FlashAttention-2, Dao 2023) computes
# softmax(Q K^T / sqrt(d)) V in tiles without writing the s x s matrix to HBM, skips the
# blocks a causal mask zeroes (about half), and recomputes S and P in the backward pass,
# which runs five matmuls of the forward's two: 2.5x the forward FLOPs.
FLASH_BWD_FACTOR = 2.5


def _attention_infer(ins, attrs, precision):
    _expect_inputs(ins, (3,))
    q, k, v = ins
    for i, t in enumerate(ins):
        _expect_float(t, i)
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
        if not _is_int(window) or window < 1:
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
        ParallelDim(q.axes[0], _axis_kind(q.axes[0]), b, 0, (0, 0, 0)),
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
    _expect_inputs(ins, (2,))
    logits, labels = ins
    _expect_float(logits, 0)
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
    dims = [ParallelDim(name, _axis_kind(name), logits.shape[ax], ax, (ax, ax)) for ax, name in enumerate(logits.axes[:-1])]
    # Vocabulary-parallel cross-entropy (Megatron-LM): partitions hold slices of the class
    # axis and all-reduce the max and the sum of exponentials.
    dims.append(ParallelDim("vocab", REDUCTION, logits.shape[-1], None, (r - 1, None)))
    return dims


def _ce_flops(ins, outs, params, attrs):
    return float(CROSS_ENTROPY_FLOPS_PER_ELEMENT * math.prod(ins[0]))



# broadcast -----------------------------------------------------------------------------
def _broadcast_infer(ins, attrs, precision):
    _expect_inputs(ins, (1,))
    x = ins[0]
    ax = _axis(attrs, len(x.shape))
    size = _positive_int(attrs, "size")
    if x.shape[ax] != 1:
        raise OpError(f"axis {ax} of {list(x.shape)} must have size 1 to broadcast", "attrs.axis")
    return [TensorInfo(x.shape[:ax] + (size,) + x.shape[ax + 1:], x.axes, x.dtype)]


def _broadcast_dims(ins, outs, attrs):
    x, y = ins[0], outs[0]
    ax = _axis(attrs, len(x.shape))
    # every partition along the broadcast axis reads the whole (size-1) input
    return [ParallelDim(name, _axis_kind(name), y.shape[i], i, (None if i == ax else i,))
            for i, name in enumerate(y.axes)]


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
    experts = _positive_int(attrs, "num_experts")
    top_k = _positive_int(attrs, "top_k")
    if top_k > experts:
        raise OpError(f"top_k {top_k} exceeds the {experts} experts", "attrs.top_k")
    return experts, top_k


def _router_infer(ins, attrs, precision):
    _expect_inputs(ins, (1,))
    x = ins[0]
    _expect_float(x, 0)
    experts, _ = _moe_counts(ins, attrs)
    _flag(attrs, "bias", False)
    score = attrs.get("score", "softmax")
    if score not in ROUTER_SCORES:
        raise OpError(f"score must be one of {', '.join(ROUTER_SCORES)}, got {score!r}", "attrs.score")
    # routing probabilities in fp32, as Megatron-Core computes them (--moe-router-dtype fp32)
    return [TensorInfo(x.shape[:-1] + (experts,), _dedupe(x.axes[:-1] + ("expert",)), "fp32")]


def _router_params(ins, attrs):
    ps = [ParamInfo("weight", (attrs["num_experts"], ins[0].shape[-1]))]
    if attrs.get("bias", False):
        ps.append(ParamInfo("bias", (attrs["num_experts"],)))
    return ps


def _token_dims(x: TensorInfo, n_inputs: int, n_params: int) -> list[ParallelDim]:
    return [ParallelDim(name, _axis_kind(name), x.shape[ax], ax, (ax,) * n_inputs, (None,) * n_params)
            for ax, name in enumerate(x.axes[:-1])]


def _router_dims(ins, outs, attrs):
    # the router's GEMM is small (experts x hidden) and every framework replicates it
    return _token_dims(ins[0], 1, 2 if attrs.get("bias", False) else 1)


def _router_flops(ins, outs, params, attrs):
    tokens = math.prod(outs[0][:-1])
    experts, hidden = params[0]
    return 2.0 * tokens * hidden * experts + float(ROUTER_SCORE_FLOPS * tokens * experts)


def _experts_infer(ins, attrs, precision):
    _expect_inputs(ins, (2,))
    x, probs = ins
    _expect_float(x, 0)
    _expect_float(probs, 1)
    experts, _ = _moe_counts(ins, attrs)
    _positive_int(attrs, "ffn_hidden")
    _flag(attrs, "gated", True)
    _flag(attrs, "bias", False)
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


# --------------------------------------------------------------------------- registry


def _build_registry() -> dict[str, OpKind]:
    kinds = [
        OpKind("input", "A graph input (data or labels); attrs: shape, dtype, axes.",
               _input_infer, _no_params, _input_dims, _zero_flops, 0.0, attrs=("shape", "dtype", "axes")),
        OpKind("conv2d", "2-D convolution, NCHW; attrs: out_channels, kernel, stride, padding, groups, bias.",
               _conv_infer, _conv_params, _conv_dims, _conv_flops, 2.0,
               attrs=("out_channels", "kernel", "stride", "padding", "groups", "bias")),
        OpKind("pool2d", "2-D max/avg pooling, NCHW; attrs: mode, kernel, stride, padding, global.",
               _pool_infer, _no_params, _pool_dims, _pool_flops, 1.0,
               attrs=("mode", "kernel", "stride", "padding", "global")),
        OpKind("linear", "Fully-connected layer y = x W + b over the last axis; attrs: out_features, bias.",
               _linear_infer, _linear_params, _linear_dims, _linear_flops, 2.0, attrs=("out_features", "bias")),
        OpKind("batch_matmul", "Batched matmul a @ b (or a @ b^T); attention scores and context; attrs: transpose_b.",
               _bmm_infer, _no_params, _bmm_dims, _bmm_flops, 2.0, attrs=("transpose_b",)),
        OpKind("embedding", "Table lookup of integer ids; attrs: num_embeddings, embedding_dim.",
               _embedding_infer, _embedding_params, _embedding_dims, _zero_flops, 1.0,
               attrs=("num_embeddings", "embedding_dim"), gathers_params=True),
        OpKind("lstm", "One unrolled LSTM step; inputs x_t[, h_prev, c_prev]; outputs h_t, c_t; attrs: hidden_size.",
               _lstm_infer, _lstm_params, _lstm_dims, _lstm_flops, 2.0, attrs=("hidden_size",)),
        OpKind("layernorm", "Layer normalisation over the last axis (gain and bias).",
               _norm_infer, _layernorm_params, _lastnorm_dims(2), _per_element(LAYERNORM_FLOPS_PER_ELEMENT), 2.0),
        OpKind("rmsnorm", "RMS normalisation over the last axis (gain only; Zhang & Sennrich 2019).",
               _norm_infer, _rmsnorm_params, _lastnorm_dims(1), _per_element(RMSNORM_FLOPS_PER_ELEMENT), 2.0),
        OpKind("batchnorm", "Batch normalisation of NCHW activations (gain and bias per channel).",
               _batchnorm_infer, _batchnorm_params, _batchnorm_dims, _per_element(BATCHNORM_FLOPS_PER_ELEMENT), 2.0),
        OpKind("softmax", "Softmax along one axis; attrs: axis.",
               _softmax_infer, _no_params, _softmax_dims, _per_element(SOFTMAX_FLOPS_PER_ELEMENT), 1.0,
               attrs=("axis",)),
        OpKind("concat", "Concatenate inputs along one axis; attrs: axis.",
               _concat_infer, _no_params, _concat_dims, _zero_flops, 1.0, attrs=("axis",), bwd_reads_inputs=False),
        OpKind("split", "Split one input along an axis; attrs: axis, sizes, squeeze.",
               _split_infer, _no_params, _split_dims, _zero_flops, 1.0, attrs=("axis", "sizes", "squeeze"), bwd_reads_inputs=False),
        OpKind("reshape", "Re-label the same elements with a new shape (flatten too); attrs: shape, axes.",
               _reshape_infer, _no_params, _reshape_dims, _zero_flops, 1.0, is_view=True, attrs=("shape", "axes")),
        OpKind("transpose", "Permute axes; attrs: perm.",
               _transpose_infer, _no_params, _transpose_dims, _zero_flops, 1.0, attrs=("perm",), bwd_reads_inputs=False),
        OpKind("attention", "Fused scaled dot-product attention (FlashAttention) of q, k, v; attrs: causal, window "
                            "(a causal sliding window: the keys each query sees, itself included).",
               _attention_infer, _no_params, _attention_dims, _attention_flops, FLASH_BWD_FACTOR,
               attrs=("causal", "window")),
        OpKind("softmax_cross_entropy", "Softmax cross-entropy of logits against integer labels (one loss per example).",
               _ce_infer, _no_params, _ce_dims, _ce_flops, 1.0),
        OpKind("broadcast", "Repeat a size-1 axis (a tensor shared by every head: DeepSeek's rotary key); attrs: "
                            "axis, size.",
               _broadcast_infer, _no_params, _broadcast_dims, _zero_flops, 1.0, attrs=("axis", "size"),
               bwd_reads_inputs=False),
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
    kinds.append(
        OpKind("bias", "A learned bias added along the last axis, apart from its GEMM (the bias of a layer whose "
                       "weight is tied to another op's, e.g. BERT's masked-LM decoder).",
               _norm_infer, _bias_params, _bias_dims, _per_element(BINARY_FLOPS_PER_ELEMENT), 1.0,
               bwd_reads_inputs=False))
    kinds.append(
        OpKind("scale", "A learned gain multiplied along the last axis, apart from its norm (a normalisation an "
                        "exporter decomposed into elementwise ops: the RMSNorm of LLaMA in ONNX).",
               _norm_infer, _bias_params, _bias_dims, _per_element(BINARY_FLOPS_PER_ELEMENT), 2.0))
    kinds.append(
        OpKind("elementwise", "A memory-bound op on each element of one input, with no kind of its own (an "
                              "imported op: a constant scale or bias, erf, pow...); attrs: flops_per_element, label.",
               _generic_infer, _no_params, _elementwise_dims, _generic_flops, 1.0,
               attrs=("flops_per_element", "label")))
    for name, (n_in, cost) in ELEMENTWISE_KINDS.items():
        kinds.append(
            OpKind(name, f"Elementwise {name} of {n_in} equal-shaped input(s).",
                   _elementwise_infer(n_in), _no_params, _elementwise_dims, _per_element(cost), 1.0,
                   attrs=("rate",) if name == "dropout" else (), bwd_reads_inputs=name != "add",
                   bwd_saved_bytes_per_element=1.0 if name == "dropout" else None)
        )
    return {k.name: k for k in kinds}


#: The mixture-of-experts kinds.
MOE_KINDS = ("router", "experts")
#: Every operator kind, by name.
OP_KINDS: dict[str, OpKind] = _build_registry()
#: Alias accepted for ``reshape``.
OP_ALIASES = {"flatten": "reshape", "matmul": "linear"}


def op_kind(name: str) -> OpKind:
    """Return the :class:`OpKind` called ``name``.

    Raises
    ------
    OpError
        When no kind has that name; the message lists the valid ones.
    """
    kind = OP_KINDS.get(OP_ALIASES.get(name, name))
    if kind is None:
        raise OpError(f"unknown op kind {name!r}; valid: {', '.join(sorted(OP_KINDS))}", "kind")
    return kind
