"""The ONNX importer's per-operator converters (:mod:`engine.models.onnx_import` walks the
nodes and calls them).

Each converter maps one form of an ONNX operator (https://onnx.ai/onnx/operators/) to soapbox
ops: Gemm and MatMul with a weight (linear), MatMul of two activations (batch_matmul), Conv,
MaxPool / AveragePool, ReduceMean over H, W (global average pool), ReduceMean / ReduceSum /
ReduceMax over the last axis, Slice of one axis and Gather of one index (split), Expand
(broadcast), GlobalAveragePool / GlobalMaxPool, BatchNormalization, LayerNormalization,
SimplifiedLayerNormalization / RMSNormalization, Relu, Gelu, Sigmoid, Tanh, Softmax, Add / Sub /
Mul / Div of equal shapes, Mul / Add by a learned vector (scale / bias), other elementwise ops
(elementwise), Dropout, Reshape / Flatten / Squeeze / Unsqueeze, Transpose, Concat, Split,
Gather of a table (embedding), Identity / Cast / Contiguous (pass through), and a table looked
up by constant ids (:func:`lookup_by_constant_ids`). :data:`ONNX_CONVERTERS` lists them by op
type, in the order they are tried; :func:`convert` runs them on one node.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..errors import ValidationError
from ..ops import OpError
from .onnx_state import ImportState, OnnxNode, Unmapped, clean_name, emit
from .onnx_ties import const_ints

__all__ = ["ONNX_CONVERTERS", "OnnxConverter", "KNOWN_OPS", "convert", "lookup_by_constant_ids", "slice_sizes",
           "vector_operand"]

_FLOAT = {1, 10, 16, 11}

_UNARY = {"Relu": "relu", "Gelu": "gelu", "Sigmoid": "sigmoid", "Tanh": "tanh"}
_BINARY = {"Add": "add", "Sub": "add", "Mul": "mul", "Div": "mul"}
#: FLOPs per element of the ops imported as ``elementwise`` (counted as a simple kernel does)
_GENERIC = {"Erf": 8.0, "Pow": 2.0, "Sqrt": 1.0, "Exp": 4.0, "Neg": 1.0, "Reciprocal": 1.0, "Log": 4.0,
            "Abs": 1.0, "IsNaN": 1.0, "Add": 1.0, "Sub": 1.0, "Mul": 1.0, "Div": 1.0, "Where": 1.0, "Clip": 2.0}
_VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}
_PASS = {"Identity", "Cast", "Contiguous"}
#: ops with a mapping (for some of their forms): not listed when skipped after an unmapped op
KNOWN_OPS = {"Gemm", "MatMul", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "ReduceMean",
             "BatchNormalization", "LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
             "Softmax", "Dropout", "Transpose", "Concat", "Split", "Gather", *_UNARY, *_BINARY, *_GENERIC, *_VIEWS,
             *_PASS}


def _attr(node, key: str, default: Any = None) -> Any:
    """The value of ``node``'s attribute ``key`` (``default`` when it has none)."""
    for a in node.attribute:
        if a.name == key:
            from onnx import helper

            return helper.get_attribute_value(a)
    return default


#: a converter: converts the node and returns True, or returns False when the node is not its
#: form (the next one is tried); raises :class:`Unmapped` for a form it recognises but cannot map
OnnxConverter = Callable[[ImportState, OnnxNode], bool]
#: ONNX op type -> its converters, in the order they are tried (the order they are defined in)
ONNX_CONVERTERS: dict[str, tuple[OnnxConverter, ...]] = {}


def _converts(*ops: str) -> Callable[[OnnxConverter], OnnxConverter]:
    """Register the decorated converter for each of ``ops``, after those registered before it."""
    def register(fn: OnnxConverter) -> OnnxConverter:
        for op in ops:
            ONNX_CONVERTERS[op] = ONNX_CONVERTERS.get(op, ()) + (fn,)
        return fn
    return register


def convert(s: ImportState, n: OnnxNode) -> None:
    """Convert node ``n`` with the first of its op type's converters that takes it.

    Raises
    ------
    Unmapped
        No converter takes it.
    ValidationError
        A converter's, or a malformed node's (a converter's lookup or conversion failed).
    """
    try:
        for fn in ONNX_CONVERTERS.get(n.op, ()):
            if fn(s, n):
                return
        raise Unmapped()
    except ValidationError:
        raise
    except (KeyError, TypeError, IndexError, ValueError, AttributeError, OpError) as e:
        raise s.fail(n.where, f"malformed node ({type(e).__name__}: {str(e)[:120]}): check its inputs, attributes "
                              "and shapes") from None


def lookup_by_constant_ids(s: ImportState, k: int, node, where: str, ins: list[str], acts: list[str]) -> bool:
    """A table looked up by constant ids (positions, token types): kept as an ``embedding``, its
    ids an input (or folded, with a note, when their shape is unknown). False when ``node`` is
    not such a lookup."""
    shapes, partial = s.shapes, s.partial
    if not (node.op_type == "Gather" and not acts and ins[0] in s.groups_or_tables and len(ins) == 2 and node.output
            and s.elem.get(ins[0]) in _FLOAT and _attr(node, "axis", 0) == 0 and s.data_batch and
            2 <= len(shapes.get(node.output[0]) or partial.get(node.output[0]) or ()) <= 3):
        return False
    op, data_shape = node.op_type, s.data_shape
    # a table looked up by constant ids (positions, token types): kept, its ids an input; ids
    # broadcast over the batch by the exporter get the batch, a length ONNX leaves unknown the input's
    out, (v, d) = node.output[0], shapes[ins[0]]
    ids = list((shapes.get(out) or partial[out])[:-1])
    if len(ids) == 1 or (len(ids) == 2 and ids[0] in (1, -1)):
        ids = [s.data_batch, ids[-1]]
    if ids[-1] == -1 and len(ids) == 2 and len(data_shape) == 2:
        ids[-1] = data_shape[1]
    nm = clean_name(node.name or out, k, op, s.used)
    if min(ids) < 1:  # (folded as before, and said)
        s.const.update(o for o in node.output if o)
        s.notes.append(f"{nm}: a table looked up by constant ids of unknown shape is not counted")
        return True
    kw = {"axes": ["sample", "length"]} if len(ids) == 2 else {}
    try:
        r = s.b.add("embedding", nm, [s.b.input(clean_name(f"{nm}.ids", k, op, s.used), ids, dtype="int64", **kw)],
                    num_embeddings=int(v), embedding_dim=int(d), param_group=s.groups.get(ins[0]))
    except (OpError, ValueError) as e:
        raise s.fail(where, f"as soapbox embedding: {e}") from None
    s.ref[out], shapes[out] = r, tuple(ids) + (int(d),)
    s.const_ids.append(nm)
    return True


# -- the converters, by op type (each form in the order it is tried)

@_converts("Gemm", "MatMul")
def _linear(s: ImportState, n: OnnxNode) -> bool:
    """A Gemm or MatMul of one activation by a weight: ``linear`` (a following bias Add folded
    in); with a weight tied to a table and a bias of its own, ``linear`` then ``bias``."""
    op, node, ins, k, out = n.op, n.node, n.ins, n.k, n.out
    if not (len(n.acts) == 1 and n.acts[0] == ins[0] and ins[1] in s.const):
        return False
    w = s.shapes[ins[1]]
    if op == "Gemm" and (_attr(node, "transA", 0) or _attr(node, "alpha", 1.0) != 1.0):
        raise Unmapped()
    n_out = w[0] if op == "Gemm" and _attr(node, "transB", 0) else w[-1]
    bias = op == "Gemm" and len(ins) > 2
    if op == "MatMul" and s.consumers[out] == 1:  # fold a following bias Add
        nodes = s.nodes
        nxt = next((j for j in range(k + 1, len(nodes)) if out in nodes[j].input), None)
        if nxt is not None and nodes[nxt].op_type == "Add":
            other = [i for i in nodes[nxt].input if i != out]
            if len(other) == 1 and other[0] in s.const and s.shapes.get(other[0]) in ((n_out,), (1, n_out)):
                bias, s.folded_add[nxt] = True, out
    if len(w) != 2:
        raise Unmapped()
    group = s.groups.get(ins[1])
    if group in s.table_groups and bias:  # its own bias beside the tied weight: a bias op of its own
        s.ref[out + "#tied"] = s.b.add("linear", clean_name(n.nm + ".tied", k, op, s.used), [s.ref[ins[0]]],
                                       out_features=int(n_out), bias=False, param_group=group)
        emit(s, n, "bias", [out + "#tied"])
    else:
        emit(s, n, "linear", [ins[0]], out_features=int(n_out), bias=bias, param_group=group)
    return True


@_converts("MatMul")
def _batch_matmul(s: ImportState, n: OnnxNode) -> bool:
    """A MatMul of two activations: ``batch_matmul``."""
    if len(n.acts) != 2:
        return False
    emit(s, n, "batch_matmul", n.acts)
    return True


@_converts("Conv")
def _conv(s: ImportState, n: OnnxNode) -> bool:
    """A 2-d Conv by a weight, padded alike on both sides, undilated: ``conv2d``."""
    node, ins = n.node, n.ins
    if not (len(n.acts) == 1 and ins[1] in s.const):
        return False
    w = s.shapes[ins[1]]
    pads = list(_attr(node, "pads", [0] * 4))
    if len(w) != 4 or pads[:2] != pads[2:] or any(d != 1 for d in _attr(node, "dilations", [1, 1])):
        raise Unmapped()
    emit(s, n, "conv2d", [ins[0]], out_channels=int(w[0]), kernel=[int(w[2]), int(w[3])],
         stride=list(_attr(node, "strides", [1, 1])), padding=pads[:2], groups=int(_attr(node, "group", 1)),
         bias=len(ins) > 2)
    return True


@_converts("MaxPool", "AveragePool")
def _pool(s: ImportState, n: OnnxNode) -> bool:
    """MaxPool / AveragePool padded alike on both sides, without ceil mode: ``pool2d``."""
    node = n.node
    pads = list(_attr(node, "pads", [0] * 4))
    if pads[:2] != pads[2:] or _attr(node, "ceil_mode", 0):
        raise Unmapped()
    kern = list(_attr(node, "kernel_shape"))
    emit(s, n, "pool2d", n.acts, mode="max" if n.op == "MaxPool" else "avg", kernel=kern,
         stride=list(_attr(node, "strides", kern)), padding=pads[:2])
    return True


@_converts("ReduceMean")
def _mean_over_hw(s: ImportState, n: OnnxNode) -> bool:
    """A ReduceMean of a 4-d tensor over H, W: a global average pool (the dynamo exporter's,
    torch.mean over H, W), then a reshape when the axes are not kept."""
    node, ins, acts, k, op = n.node, n.ins, n.acts, n.k, n.op
    if not (len(s.shapes[acts[0]]) == 4 and sorted(
            a % 4 for a in (_attr(node, "axes") or const_ints(s.g, ins[1]) if len(ins) > 1 else _attr(node, "axes"))
            or ()) == [2, 3]):  # global average pool (the dynamo exporter's, torch.mean over H, W)
        return False
    if _attr(node, "keepdims", 1):
        emit(s, n, "pool2d", acts, mode="avg", **{"global": True})
    else:
        s.ref[n.out + "#pool"] = s.b.add("pool2d", n.nm, [s.ref[acts[0]]], mode="avg", **{"global": True})
        emit(s, n, "reshape", [n.out + "#pool"], name=clean_name(n.nm + ".squeeze", k, op, s.used),
             shape=list(n.oshape))
    return True


@_converts("ReduceMean", "ReduceSum", "ReduceMax")
def _reduce_last_axis(s: ImportState, n: OnnxNode) -> bool:
    """A reduction over the last axis (a norm's statistics): ``elementwise``, its first column
    split off, reshaped to ONNX's output."""
    acts, oshape, k, op, nm = n.acts, n.oshape, n.k, n.op, n.nm
    if not (len(acts) == 1 and oshape is not None and
            oshape == s.shapes[acts[0]][:-1] + (1,)):  # over the last axis (a norm's statistics)
        return False
    red = s.b.add("elementwise", nm, [s.ref[acts[0]]], flops_per_element=1.0, label=op)
    h = s.shapes[acts[0]][-1]
    first = s.b.add("split", clean_name(nm + ".first", k, op, s.used), [red], axis=len(oshape) - 1,
                    sizes=[1, h - 1] if h > 1 else [1])
    s.ref[n.out + "#red"] = first[0] if isinstance(first, list) else first
    emit(s, n, "reshape", [n.out + "#red"], name=clean_name(nm + ".keep", k, op, s.used), shape=list(oshape))
    return True


@_converts("Slice", "Gather")
def _slice(s: ImportState, n: OnnxNode) -> bool:
    """A Slice of one axis, or a Gather of one constant index, of an activation: a ``split``,
    the piece kept reshaped to ONNX's output (:func:`slice_sizes`)."""
    op, node, ins, acts, oshape, g, shapes = n.op, n.node, n.ins, n.acts, n.oshape, s.g, s.shapes
    if not ((op == "Slice" and len(acts) == 1 and acts[0] == ins[0] and oshape is not None and len(ins) >= 3)
            or (op == "Gather" and acts == ins[:1] and oshape is not None)):  # (Gather: one index)
        return False
    if op == "Gather":
        idx = const_ints(g, ins[1])
        sizes = slice_sizes(shapes[acts[0]], idx, [idx[0] + 1 if idx and idx[0] != -1 else 2**62]
                            if idx else None, [int(_attr(node, "axis", 0))], None) \
            if idx and len(idx) == 1 else None
    else:
        axes = const_ints(g, ins[3]) if len(ins) > 3 else list(range(len(oshape)))
        sizes = slice_sizes(shapes[acts[0]], const_ints(g, ins[1]), const_ints(g, ins[2]), axes,
                            const_ints(g, ins[4]) if len(ins) > 4 else None)
    diff = [a for a, (i, o) in enumerate(zip(shapes[acts[0]], oshape)) if i != o]
    if sizes is None and op == "Slice" and len(diff) == 1 and len(oshape) == len(shapes[acts[0]]):
        # bounds computed in the graph: the piece's size from ONNX's inference, at offset 0
        a = diff[0]
        sizes = (a, [oshape[a], shapes[acts[0]][a] - oshape[a]], 0)
    if sizes is None:
        raise Unmapped()
    axis, pieces, keep = sizes
    parts = s.b.add("split", n.nm, [s.ref[acts[0]]], axis=axis, sizes=pieces)
    s.ref[n.out + "#part"] = parts[keep] if isinstance(parts, list) else parts
    emit(s, n, "reshape", [n.out + "#part"], name=clean_name(n.nm + ".part", n.k, op, s.used), shape=list(oshape))
    return True


def slice_sizes(shape, starts, ends, axes, steps) -> tuple[int, list[int], int] | None:
    """A Slice of one axis with step 1 as a split: (axis, the pieces' sizes, the one kept)."""
    if not starts or not ends or axes is None or len(starts) != 1 or len(ends) != 1 or len(axes) != 1 \
            or (steps and steps != [1]):
        return None
    axis = axes[0] % len(shape)
    dim = shape[axis]
    start, end = (max(0, min(dim, v + dim if v < 0 else v)) for v in (starts[0], ends[0]))
    if end <= start:
        return None
    pieces = [p for p in (start, end - start, dim - end) if p > 0]
    return axis, pieces, 1 if start > 0 else 0


@_converts("Expand")
def _expand(s: ImportState, n: OnnxNode) -> bool:
    """An Expand of an activation: a reshape to the output's rank, a ``broadcast`` per size-1
    axis that grows, a reshape."""
    acts, oshape, k, op, nm, shapes = n.acts, n.oshape, n.k, n.op, n.nm, s.shapes
    if not (acts == n.ins[:1] and oshape is not None and shapes.get(acts[0]) is not None):
        return False
    # (grouped-query attention's key/value heads repeated: a broadcast per size-1 axis that grows)
    want = tuple(oshape)
    have = (1,) * (len(want) - len(shapes[acts[0]])) + tuple(shapes[acts[0]])
    if len(have) != len(want) or any(h not in (1, w) for h, w in zip(have, want)):
        raise Unmapped()
    r = s.ref[n.out + "#in"] = s.b.add("reshape", clean_name(nm + ".in", k, op, s.used), [s.ref[acts[0]]],
                                       shape=list(have))
    for a in [a for a, (h, w) in enumerate(zip(have, want)) if h != w]:
        r = s.ref[n.out + "#in"] = s.b.add("broadcast", clean_name(f"{nm}.axis{a}", k, op, s.used), [r], axis=a,
                                           size=want[a])
    emit(s, n, "reshape", [n.out + "#in"], shape=list(want))
    return True


@_converts("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(s: ImportState, n: OnnxNode) -> bool:
    """A global pool: ``pool2d`` with ``global``."""
    emit(s, n, "pool2d", n.acts, mode="avg" if n.op == "GlobalAveragePool" else "max", **{"global": True})
    return True


@_converts("BatchNormalization")
def _batchnorm(s: ImportState, n: OnnxNode) -> bool:
    """BatchNormalization: ``batchnorm``."""
    emit(s, n, "batchnorm", n.acts[:1])
    return True


@_converts("LayerNormalization")
def _layernorm(s: ImportState, n: OnnxNode) -> bool:
    """LayerNormalization over the last axis: ``layernorm``."""
    if _attr(n.node, "axis", -1) not in (-1, len(s.shapes[n.ins[0]] or ()) - 1):
        raise Unmapped()
    emit(s, n, "layernorm", n.acts[:1])
    return True


@_converts("SimplifiedLayerNormalization", "RMSNormalization")
def _rmsnorm(s: ImportState, n: OnnxNode) -> bool:
    """SimplifiedLayerNormalization / RMSNormalization: ``rmsnorm``."""
    emit(s, n, "rmsnorm", n.acts[:1])
    return True


@_converts(*_UNARY)
def _unary(s: ImportState, n: OnnxNode) -> bool:
    """Relu, Gelu, Sigmoid, Tanh: the soapbox op of that name."""
    emit(s, n, _UNARY[n.op], n.acts)
    return True


@_converts("Softmax")
def _softmax(s: ImportState, n: OnnxNode) -> bool:
    """Softmax: ``softmax`` over its axis."""
    emit(s, n, "softmax", n.acts, axis=int(_attr(n.node, "axis", -1)))
    return True


@_converts(*_BINARY)
def _binary(s: ImportState, n: OnnxNode) -> bool:
    """Add / Sub / Mul / Div of two activations of the output's shape: ``add`` / ``mul``."""
    acts, shapes = n.acts, s.shapes
    if not (len(acts) == 2 and shapes.get(acts[0]) == shapes.get(acts[1]) == n.oshape):
        return False
    emit(s, n, _BINARY[n.op], acts)
    return True


@_converts("Mul", "Add")
def _learned_vector(s: ImportState, n: OnnxNode) -> bool:
    """Mul / Add of an activation by a learned vector (:func:`vector_operand`; a decomposed
    norm's gain): ``scale`` / ``bias``."""
    acts, oshape = n.acts, n.oshape
    if not (s.shapes.get(acts[0]) == oshape and
            (vec := vector_operand(n.ins, acts, s.inits, s.elem, oshape, _FLOAT)) is not None):
        return False
    emit(s, n, "scale" if n.op == "Mul" else "bias", acts, param_group=s.groups.get(vec))
    return True


def vector_operand(ins: list[str], acts: list[str], inits: dict[str, tuple[int, ...]], elem: dict[str, int],
                   out_shape: tuple[int, ...] | None, floats: Any) -> str | None:
    """The learned vector of a ``Mul`` / ``Add`` of one activation by a float initializer of
    the output's last width (leading axes of 1: a decomposed norm's gain or a bias), or None.

    >>> vector_operand(["x", "g"], ["x"], {"g": (1, 1, 8)}, {"g": 1}, (2, 4, 8), {1})
    'g'
    >>> vector_operand(["x", "s"], ["x"], {"s": (1,)}, {"s": 1}, (2, 4, 8), {1}) is None
    True
    """
    other = [i for i in ins if i not in acts]
    if len(acts) != 1 or len(other) != 1 or out_shape is None or out_shape[-1] < 2:
        return None
    shape = inits.get(other[0])
    if shape is None or elem.get(other[0]) not in floats or not shape or shape[-1] != out_shape[-1] \
            or any(d != 1 for d in shape[:-1]):
        return None
    return other[0]


@_converts(*_GENERIC)
def _elementwise(s: ImportState, n: OnnxNode) -> bool:
    """An elementwise op with an operand of the output's shape: ``elementwise`` on it."""
    acts, oshape, shapes = n.acts, n.oshape, s.shapes
    if not (oshape is not None and oshape in [shapes.get(a) for a in acts]):
        return False
    # (with a broadcast operand, a norm's statistics or a mask: memory-bound on the full-size one)
    emit(s, n, "elementwise", [a for a in acts if shapes.get(a) == oshape][:1], flops_per_element=_GENERIC[n.op],
         label=n.op)
    s.weights.update(i for i in n.ins if i in s.inits and math.prod(s.inits[i]) > 1 and s.elem.get(i) in _FLOAT)
    return True


@_converts("Dropout")
def _dropout(s: ImportState, n: OnnxNode) -> bool:
    """Dropout: ``dropout`` at its ratio (0.1 when the ratio is an input)."""
    emit(s, n, "dropout", n.acts[:1], rate=float(_attr(n.node, "ratio", 0.5)) if len(n.ins) < 2 else 0.1)
    return True


@_converts(*_VIEWS)
def _view(s: ImportState, n: OnnxNode) -> bool:
    """Reshape, Flatten, Squeeze, Unsqueeze of a known output shape: ``reshape``."""
    if n.oshape is None:
        return False
    emit(s, n, "reshape", n.acts[:1], shape=list(n.oshape))
    return True


@_converts("Transpose")
def _transpose(s: ImportState, n: OnnxNode) -> bool:
    """Transpose: ``transpose`` (no perm: the axes reversed)."""
    perm = _attr(n.node, "perm")
    emit(s, n, "transpose", n.acts, perm=list(perm) if perm is not None
         else list(range(len(s.shapes[n.acts[0]]) - 1, -1, -1)))
    return True


@_converts("Concat")
def _concat(s: ImportState, n: OnnxNode) -> bool:
    """A Concat of two or more activations: ``concat``."""
    if not (len(n.acts) == len(n.ins) and len(n.acts) >= 2):
        return False
    emit(s, n, "concat", n.acts, axis=int(_attr(n.node, "axis")))
    return True


@_converts("Split")
def _split(s: ImportState, n: OnnxNode) -> bool:
    """A Split of an activation: ``split`` into its outputs' sizes."""
    if len(n.acts) != 1:
        return False
    axis = int(_attr(n.node, "axis", 0))
    sizes = [s.shapes[o][axis] for o in n.node.output]
    emit(s, n, "split", n.acts, axis=axis, sizes=sizes)
    return True


@_converts("Gather")
def _embedding(s: ImportState, n: OnnxNode) -> bool:
    """A Gather of rows of a constant table: ``embedding``."""
    ins = n.ins
    if not (ins[0] in s.const and len(s.shapes[ins[0]]) == 2 and _attr(n.node, "axis", 0) == 0):
        return False
    v, d = s.shapes[ins[0]]
    emit(s, n, "embedding", n.acts, num_embeddings=int(v), embedding_dim=int(d), param_group=s.groups.get(ins[0]))
    return True


@_converts(*_PASS)
def _pass_through(s: ImportState, n: OnnxNode) -> bool:
    """Identity, float-to-float Cast, Contiguous: the input itself (no op)."""
    acts = n.acts
    if not (len(acts) == 1 and (n.op != "Cast" or _attr(n.node, "to") in _FLOAT and s.elem.get(acts[0]) in _FLOAT)):
        return False
    s.ref[n.out] = s.ref[acts[0]]
    s.used.discard(n.nm)
    return True
