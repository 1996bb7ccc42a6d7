"""What every operator kind is made of: the parallel dim kinds, dtypes and size limits, the
records an op kind returns (:class:`TensorInfo`, :class:`ParamInfo`, :class:`ParallelDim`),
:class:`OpKind` itself, and the checks of attributes every kind shares (the package face,
:mod:`engine.ops`, states the conventions)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

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


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_pair(value: Any, name: str, minimum: int) -> tuple[int, int]:
    """``value`` (an integer or a pair) as a pair, each in ``minimum..MAX_DIM``."""
    pair = (value, value) if is_int(value) else tuple(value) if isinstance(value, (list, tuple)) else None
    if pair is None or len(pair) != 2 or not all(is_int(v) for v in pair):
        raise OpError(f"expected an integer or a pair of integers, got {value!r}", f"attrs.{name}")
    if not all(minimum <= v <= MAX_DIM for v in pair):
        raise OpError(f"must be between {minimum} and {MAX_DIM:,}, got {value!r}", f"attrs.{name}")
    return (pair[0], pair[1])


def require(attrs: Mapping[str, Any], name: str) -> Any:
    if name not in attrs:
        raise OpError("missing required attribute", f"attrs.{name}")
    return attrs[name]


def positive_int(attrs: Mapping[str, Any], name: str, default: int | None = None) -> int:
    value = attrs.get(name, default) if default is not None else require(attrs, name)
    if not is_int(value) or value <= 0:
        raise OpError(f"must be a positive integer, got {value!r}", f"attrs.{name}")
    if value > MAX_DIM:
        raise OpError(f"must be at most {MAX_DIM:,}, got {value!r}", f"attrs.{name}")
    return value


def flag(attrs: Mapping[str, Any], name: str, default: bool) -> bool:
    """A true/false attribute (``bias``, ``transpose_b``, ...); ``"yes"`` or 1 is refused."""
    value = attrs.get(name, default)
    if not isinstance(value, bool):
        raise OpError(f"must be true or false, got {value!r}", f"attrs.{name}")
    return value


def shape_attr(attrs: Mapping[str, Any], name: str, allow_infer: bool = False) -> list[int]:
    """A shape attribute: 1 to MAX_RANK sizes, each 1..MAX_DIM (or one -1 to infer)."""
    shape = require(attrs, name)
    ok = isinstance(shape, (list, tuple)) and 0 < len(shape) <= MAX_RANK and all(
        is_int(s) and (0 < s <= MAX_DIM or (allow_infer and s == -1)) for s in shape)
    if not ok or (allow_infer and list(shape).count(-1) > 1):
        infer = " (or one -1 to infer)" if allow_infer else ""
        raise OpError(f"must be a list of 1 to {MAX_RANK} sizes from 1 to {MAX_DIM:,}{infer}, got {shape!r}",
                      f"attrs.{name}")
    return list(shape)


def axis_attr(attrs: Mapping[str, Any], rank: int, default: int = -1) -> int:
    axis = attrs.get("axis", default)
    if not is_int(axis) or not -rank <= axis < rank:
        raise OpError(f"axis {axis!r} is out of range for a rank-{rank} tensor", "attrs.axis")
    return axis % rank


def expect_inputs(ins: Sequence[TensorInfo], counts: Sequence[int]) -> None:
    if len(ins) not in counts:
        want = " or ".join(str(c) for c in counts)
        raise OpError(f"expects {want} input(s), got {len(ins)}", "inputs")


def expect_float(t: TensorInfo, i: int) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise OpError(f"input {i} must be a floating-point tensor, got {t.dtype}", f"inputs[{i}]")


def dedupe_axes(axes: Sequence[str]) -> tuple[str, ...]:
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
    kernel = int_pair(attrs.get("kernel", 1), "kernel", 1)
    stride = int_pair(attrs.get("stride", kernel if kind == "pool2d" else 1), "stride", 1)
    return kernel, stride, int_pair(attrs.get("padding", 0), "padding", 0)


def conv_out(size: int, kernel: int, stride: int, pad: int, what: str, field_: str) -> int:
    out = (size + 2 * pad - kernel) // stride + 1
    if out <= 0:
        raise OpError(
            f"{what} {size} with kernel {kernel}, stride {stride}, padding {pad} gives an empty output",
            field_,
        )
    return out


def axis_kind(name: str) -> str:
    return SAMPLE if name == "sample" else ATTRIBUTE


def pointwise_dims(
    outs: Sequence[TensorInfo], n_inputs: int, skip_axis: int | None = None, n_params: int = 0
) -> list[ParallelDim]:
    """Dims of an op whose output axes map one-to-one onto the same axes of each input."""
    out = outs[0]
    return [
        ParallelDim(name, axis_kind(name), out.shape[ax], ax, (ax,) * n_inputs, (None,) * n_params)
        for ax, name in enumerate(out.axes)
        if ax != skip_axis
    ]






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
    #: True for ops whose backward reads their output instead of their inputs (softmax:
    #: dx = y * (dy - sum(dy * y)); PyTorch's ``softmax`` saves its result): the tensor kept is
    #: the output, kept once with any later reader that keeps it too (attention's probabilities
    #: and the matmul with the values, where no dropout stands between them).
    bwd_keeps_output: bool = False
    #: True for table lookups (embedding): forward reads only the gathered rows, not the
    #: whole table, and backward scatters into the gathered rows only.
    gathers_params: bool = False


def no_params(ins: Sequence[TensorInfo], attrs: Mapping[str, Any]) -> list[ParamInfo]:
    return []


def zero_flops(ins, outs, params, attrs) -> float:
    return 0.0
