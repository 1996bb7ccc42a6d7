"""Kinds that move or re-label elements without computing: graph inputs, concat, split, reshape,
transpose and broadcast."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from .base import (DTYPE_BYTES, MAX_OP_TENSORS, axis_attr, axis_kind, dedupe_axes, expect_inputs, flag, is_int,
                   no_params, OpError, OpKind, ParallelDim, pointwise_dims, positive_int, require, shape_attr,
                   TensorInfo, zero_flops)

__all__ = ["kinds"]

# input -------------------------------------------------------------------------------
def _input_infer(ins, attrs, precision):
    expect_inputs(ins, (0,))
    shape = shape_attr(attrs, "shape")
    dtype = attrs.get("dtype", precision)
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise OpError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}", "attrs.dtype")
    axes = axis_names(attrs) or default_axes(len(shape))
    if len(axes) != len(shape):
        raise OpError(f"{len(axes)} axis names for a rank-{len(shape)} shape", "attrs.axes")
    return [TensorInfo(tuple(shape), dedupe_axes(axes), dtype)]


def axis_names(attrs: Mapping[str, Any]) -> tuple[str, ...] | None:
    axes = attrs.get("axes")
    if axes is None:
        return None
    if not isinstance(axes, (list, tuple)) or not all(isinstance(a, str) and a for a in axes):
        raise OpError(f"must be a list of axis names (strings), got {axes!r}", "attrs.axes")
    return tuple(axes)


def default_axes(rank: int) -> tuple[str, ...]:
    return {
        1: ("sample",),
        2: ("sample", "feature"),
        3: ("sample", "length", "feature"),
        4: ("sample", "channel", "height", "width"),
    }.get(rank, ("sample",) + tuple(f"axis{i}" for i in range(1, rank)))


def _input_dims(ins, outs, attrs):
    return pointwise_dims(outs, 0)



# concat / split / reshape / transpose ---------------------------------------------------------
def _concat_infer(ins, attrs, precision):
    if len(ins) < 2:
        raise OpError(f"expects at least 2 inputs, got {len(ins)}", "inputs")
    first = ins[0]
    axis = axis_attr(attrs, len(first.shape))
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
    return pointwise_dims(outs, len(ins), skip_axis=axis_attr(attrs, len(outs[0].shape)))


def _split_infer(ins, attrs, precision):
    expect_inputs(ins, (1,))
    x = ins[0]
    axis = axis_attr(attrs, len(x.shape))
    sizes = require(attrs, "sizes")
    if not isinstance(sizes, (list, tuple)) or not 0 < len(sizes) <= MAX_OP_TENSORS \
            or not all(is_int(s) and s > 0 for s in sizes):
        raise OpError(f"must be a list of 1 to {MAX_OP_TENSORS} positive integers, got {sizes!r}", "attrs.sizes")
    if sum(sizes) != x.shape[axis]:
        raise OpError(f"sizes add up to {sum(sizes)}, but axis {axis} has {x.shape[axis]}", "attrs.sizes")
    squeeze = flag(attrs, "squeeze", False)
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
    axis = axis_attr(attrs, len(ins[0].shape))
    squeeze = bool(attrs.get("squeeze", False))
    dims = []
    for ax, name in enumerate(ins[0].axes):
        if ax == axis:
            continue
        out_ax = ax - 1 if (squeeze and ax > axis) else ax
        dims.append(ParallelDim(name, axis_kind(name), ins[0].shape[ax], out_ax, (ax,)))
    return dims


def _reshape_infer(ins, attrs, precision):
    expect_inputs(ins, (1,))
    x = ins[0]
    shape = shape_attr(attrs, "shape", allow_infer=True)
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
    axes = axis_names(attrs)
    if axes is None:
        axes = _reshape_default_axes(x, shape)
    elif len(axes) != len(shape):
        raise OpError(f"{len(axes)} axis names for a rank-{len(shape)} shape", "attrs.axes")
    return [TensorInfo(tuple(shape), dedupe_axes(axes), x.dtype)]


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
            dims.append(ParallelDim(name, axis_kind(name), size, ax, (in_ax,)))
    return dims


def _transpose_infer(ins, attrs, precision):
    expect_inputs(ins, (1,))
    x = ins[0]
    perm = require(attrs, "perm")
    if not isinstance(perm, (list, tuple)) or not all(is_int(p) for p in perm) \
            or sorted(perm) != list(range(len(x.shape))):
        raise OpError(f"must be a permutation of 0..{len(x.shape) - 1}, got {perm!r}", "attrs.perm")
    return [TensorInfo(tuple(x.shape[p] for p in perm), tuple(x.axes[p] for p in perm), x.dtype)]


def _transpose_dims(ins, outs, attrs):
    perm = attrs["perm"]
    y = outs[0]
    return [ParallelDim(name, axis_kind(name), y.shape[ax], ax, (perm[ax],)) for ax, name in enumerate(y.axes)]



# broadcast -----------------------------------------------------------------------------
def _broadcast_infer(ins, attrs, precision):
    expect_inputs(ins, (1,))
    x = ins[0]
    ax = axis_attr(attrs, len(x.shape))
    size = positive_int(attrs, "size")
    if x.shape[ax] != 1:
        raise OpError(f"axis {ax} of {list(x.shape)} must have size 1 to broadcast", "attrs.axis")
    return [TensorInfo(x.shape[:ax] + (size,) + x.shape[ax + 1:], x.axes, x.dtype)]


def _broadcast_dims(ins, outs, attrs):
    x, y = ins[0], outs[0]
    ax = axis_attr(attrs, len(x.shape))
    # every partition along the broadcast axis reads the whole (size-1) input
    return [ParallelDim(name, axis_kind(name), y.shape[i], i, (None if i == ax else i,))
            for i, name in enumerate(y.axes)]


def kinds() -> list[OpKind]:
    """The shape kinds, as :data:`engine.ops.OP_KINDS` registers them."""
    return [
        OpKind("input", "A graph input (data or labels); attrs: shape, dtype, axes.",
               _input_infer, no_params, _input_dims, zero_flops, 0.0, attrs=("shape", "dtype", "axes")),
        OpKind("concat", "Concatenate inputs along one axis; attrs: axis.",
               _concat_infer, no_params, _concat_dims, zero_flops, 1.0, attrs=("axis",), bwd_reads_inputs=False),
        OpKind("split", "Split one input along an axis; attrs: axis, sizes, squeeze.",
               _split_infer, no_params, _split_dims, zero_flops, 1.0, attrs=("axis", "sizes", "squeeze"),
               bwd_reads_inputs=False),
        OpKind("reshape", "Re-label the same elements with a new shape (flatten too); attrs: shape, axes.",
               _reshape_infer, no_params, _reshape_dims, zero_flops, 1.0, is_view=True, attrs=("shape", "axes")),
        OpKind("transpose", "Permute axes; attrs: perm.",
               _transpose_infer, no_params, _transpose_dims, zero_flops, 1.0, attrs=("perm",), bwd_reads_inputs=False),
        OpKind("broadcast", "Repeat a size-1 axis (a tensor shared by every head: DeepSeek's rotary key); attrs: "
                            "axis, size.",
               _broadcast_infer, no_params, _broadcast_dims, zero_flops, 1.0, attrs=("axis", "size"),
               bwd_reads_inputs=False),
    ]
