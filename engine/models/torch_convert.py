"""The torch importer's per-ATen-op converters (:mod:`engine.models.torch_import` walks the
``torch.export`` graph and calls them).

Each converter maps one form of an ATen call to soapbox ops: linear, addmm / mm / matmul with
a weight (linear), matmul / bmm of two activations (batch_matmul), conv2d / convolution, max /
avg / adaptive-avg pooling, batch_norm variants, layer_norm, rms_norm, relu, gelu, silu,
sigmoid, tanh, dropout, softmax, add / sub / mul / div (equal shapes; with a scalar, constant or
broadcast operand as ``elementwise``, as are rsqrt, exp, clamp and the other pointwise calls),
scaled_dot_product_attention (attention), embedding, cat, views, transpose / permute, select /
split / chunk (split), slice, expand (broadcast), the pass-through calls, and a table looked up
by constant ids (:func:`lookup_by_constant_ids`). :data:`ATEN_CONVERTERS` lists them by ATen
name, in the order they are tried; :func:`convert` runs them on one call, after the pieces of
an RMSNorm spelled out (:func:`engine.models.torch_patterns.rms_norms`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ValidationError
from ..graph import GraphBuilder, TensorRef
from ..ops import OpError
from .torch_patterns import PASS_THROUGH

__all__ = ["TorchState", "AtenCall", "Unmapped", "ATEN_CONVERTERS", "AtenConverter", "convert", "emit", "node_shape",
           "lookup_by_constant_ids"]

_UNARY = {"relu": "relu", "gelu": "gelu", "silu": "silu", "sigmoid": "sigmoid", "tanh": "tanh"}
_BINARY = {"add": "add", "sub": "add", "mul": "mul", "div": "mul"}
_VIEWS = {"view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze", "expand_as"}
_GENERIC = {"rsqrt": 2.0, "sqrt": 1.0, "exp": 4.0, "pow": 2.0, "neg": 1.0, "reciprocal": 1.0, "erf": 8.0,
            "log": 4.0, "abs": 1.0, "clamp": 2.0, "mean": 1.0, "hardtanh": 2.0, "leaky_relu": 2.0,
            "hardswish": 4.0, "hardsigmoid": 3.0, "elu": 4.0, "sin": 4.0, "cos": 4.0}


class Unmapped(Exception):
    """This ATen call has no soapbox op."""


@dataclass
class TorchState:
    """What the walk over the captured graph and the converters share. ``b``: the model being
    built; ``fail(where, message)``: the import's :class:`ValidationError`; ``dtypes``: torch's
    float dtypes -> soapbox's; ``params``: the parameters' placeholders; ``tied``: shared ones
    -> their ``param_group`` (:func:`shared_parameters`); ``absorbed`` / ``norms`` / ``gains``:
    RMSNorms spelled out (:func:`rms_norms`); ``int_inputs``: the integer inputs' shapes."""

    b: GraphBuilder
    fail: Callable[[str, str], ValidationError]
    precision: str
    dtypes: dict
    user_inputs: set[str]
    params: set[str]
    tied: dict[str, str]
    absorbed: set[str]
    norms: dict[str, str]
    gains: dict[str, str]
    int_inputs: list
    ref: dict[str, Any] = field(default_factory=dict)  # fx node name -> TensorRef, or a list of them (a split)
    const: dict[str, tuple] = field(default_factory=dict)  # parameters, buffers and constants: name -> shape
    split_cache: dict[tuple, list[TensorRef]] = field(default_factory=dict)
    unmapped: dict[str, list[str]] = field(default_factory=dict)
    problems: int = 0
    used: Counter = field(default_factory=Counter)

    def nm(self, n) -> str:
        """The soapbox name of fx node ``n``'s next op: its name, then ``name.2``, ``name.3``..."""
        self.used[n.name] += 1
        return n.name if self.used[n.name] == 1 else f"{n.name}.{self.used[n.name]}"


@dataclass
class AtenCall:
    """One ``call_function`` node as the converters read it: the fx node ``n``, its ATen name
    ``op``, its arguments, those that are activations (``acts``), its output's shape, and its
    first argument ``x`` (None when it has none)."""

    n: Any
    op: str
    args: list
    acts: list
    out: tuple[int, ...] | None
    x: Any


def node_shape(n) -> tuple[int, ...] | None:
    """The shape of fx node ``n``'s tensor value (None when it has no tensor value)."""
    import torch

    v = n.meta.get("val") if hasattr(n, "meta") else None
    return tuple(int(d) for d in v.shape) if isinstance(v, torch.Tensor) else None


def emit(s: TorchState, c: AtenCall, kind: str, inputs, **attrs: Any):
    """Add the soapbox op ``kind`` for call ``c``, reading ``inputs`` (fx nodes, or soapbox
    tensors), its output's shape checked against torch's; returns what the builder returns."""
    n, op, out = c.n, c.op, c.out
    try:
        r = s.b.add(kind, s.nm(n), [s.ref[a.name] if hasattr(a, "name") else a for a in inputs], **attrs)
    except (OpError, ValueError) as e:
        raise s.fail(f"node {n.name} ({op})", f"as soapbox {kind}: {e}") from None
    if not isinstance(r, list) and out is not None and tuple(s.b.shape_of(r)) != out:
        raise s.fail(f"node {n.name} ({op})", f"soapbox's {kind} gives {list(s.b.shape_of(r))}, torch {list(out)}")
    s.ref[n.name] = r
    return r


#: a converter: converts the call and returns True, or returns False when the call is not its
#: form (the next one is tried); raises :class:`Unmapped` for a form it recognises but cannot map
AtenConverter = Callable[[TorchState, AtenCall], bool]
#: ATen name -> its converters, in the order they are tried (the order they are defined in)
ATEN_CONVERTERS: dict[str, tuple[AtenConverter, ...]] = {}


def _converts(*ops: str) -> Callable[[AtenConverter], AtenConverter]:
    """Register the decorated converter for each of ``ops``, after those registered before it."""
    def register(fn: AtenConverter) -> AtenConverter:
        for op in ops:
            ATEN_CONVERTERS[op] = ATEN_CONVERTERS.get(op, ()) + (fn,)
        return fn
    return register


def convert(s: TorchState, c: AtenCall) -> None:
    """Convert call ``c``: an RMSNorm's normalising ``mul`` (``rmsnorm``) or its gain (a pass-
    through), else by the first of its ATen name's converters that takes it.

    Raises
    ------
    Unmapped
        No converter takes it (so may a converter's TypeError, IndexError, KeyError,
        AttributeError or ValueError on arguments it cannot read: the walk lists the call).
    ValidationError
        A soapbox op refused.
    """
    n = c.n
    if n.name in s.norms:
        emit(s, c, "rmsnorm", [s.ref[s.norms[n.name]]])
    elif n.name in s.gains:  # (the rmsnorm's gain)
        s.ref[n.name] = s.ref[s.gains[n.name]]
    else:
        for fn in ATEN_CONVERTERS.get(c.op, ()):
            if fn(s, c):
                return
        raise Unmapped()


def lookup_by_constant_ids(s: TorchState, c: AtenCall) -> bool:
    """An ``embedding`` of a parameter by constant ids (positions from ``arange``): kept, its
    ids an input, one row per sample as the token ids have, so that the table stays a
    parameter. False when ``c`` is not such a lookup."""
    n, args = c.n, c.args
    if not (c.op == "embedding" and not c.acts and args[0].name in s.params and node_shape(args[1]) is not None):
        return False
    # a table looked up by constant ids (positions from arange): ids become an input,
    # one row per sample as the token ids have, so that the table stays a parameter
    ids = node_shape(args[1])
    tokens = next((t for t in s.int_inputs if len(ids) == 2 and ids[0] == 1 and t and len(t) == 2
                   and t[1] == ids[1]), None)  # [batch, seq] of the token ids
    name_ = s.nm(n)
    pos = s.b.input(f"{name_}.ids", list(tokens or ids), dtype="int64",
                    **({"axes": ["sample", "length"]} if tokens else {}))
    v, d = s.const[args[0].name]
    s.ref[n.name] = s.b.add("embedding", name_, [pos], num_embeddings=v, embedding_dim=d,
                            param_group=s.tied.get(args[0].name))
    return True


# -- the converters, by ATen name (each form in the order it is tried)

@_converts("linear")
def _linear(s: TorchState, c: AtenCall) -> bool:
    """linear by a weight: ``linear``; a tied weight with a bias of its own: ``linear``, ``bias``."""
    n, op, args, x = c.n, c.op, c.args, c.x
    if not (x.name in s.ref and args[1].name in s.const):
        return False
    bias, group = len(args) > 2 and args[2] is not None, s.tied.get(args[1].name)
    if bias and group:  # (BERT's MLM decoder: its own bias beside the tied weight, a bias op)
        name_ = s.nm(n)
        try:
            lin = s.b.add("linear", name_, [s.ref[x.name]], out_features=s.const[args[1].name][0], bias=False,
                          param_group=group)
            s.ref[n.name] = s.b.add("bias", f"{name_}.bias", [lin])
        except (OpError, ValueError) as e:
            raise s.fail(f"node {n.name} ({op})", f"as soapbox linear and bias: {e}") from None
    else:
        emit(s, c, "linear", [x], out_features=s.const[args[1].name][0], bias=bias, param_group=group)
    return True


@_converts("mm", "matmul")
def _matmul_by_weight(s: TorchState, c: AtenCall) -> bool:
    """mm / matmul of one activation by a weight: ``linear`` without bias."""
    if not (len(c.acts) == 1 and c.x.name in s.ref and c.args[1].name in s.const):
        return False
    emit(s, c, "linear", [c.x], out_features=s.const[c.args[1].name][-1], bias=False)
    return True


@_converts("addmm")
def _addmm(s: TorchState, c: AtenCall) -> bool:
    """addmm of an activation by a weight: ``linear`` with bias."""
    args = c.args
    if not (args[1].name in s.ref and args[2].name in s.const):
        return False
    emit(s, c, "linear", [args[1]], out_features=s.const[args[2].name][-1], bias=True)
    return True


@_converts("matmul", "bmm")
def _batch_matmul(s: TorchState, c: AtenCall) -> bool:
    """matmul / bmm of two activations: ``batch_matmul``."""
    if len(c.acts) != 2:
        return False
    emit(s, c, "batch_matmul", c.acts)
    return True


@_converts("conv2d", "convolution")
def _conv(s: TorchState, c: AtenCall) -> bool:
    """A 2-d convolution by a weight, undilated and not transposed: ``conv2d``."""
    op, args = c.op, c.args
    if args[1].name not in s.const:
        return False
    w = s.const[args[1].name]
    stride = list(args[3]) if len(args) > 3 else [1, 1]
    pad = list(args[4]) if len(args) > 4 else [0, 0]
    dil = list(args[5]) if len(args) > 5 else [1, 1]
    if op == "convolution" and (args[6] if len(args) > 6 else False):
        raise Unmapped()
    groups = int(args[8] if op == "convolution" and len(args) > 8 else (args[6] if op == "conv2d"
                                                                       and len(args) > 6 else 1))
    if any(d != 1 for d in dil) or len(w) != 4:
        raise Unmapped()
    emit(s, c, "conv2d", [c.x], out_channels=w[0], kernel=[w[2], w[3]], stride=stride, padding=pad,
         groups=groups, bias=len(args) > 2 and args[2] is not None)
    return True


@_converts("max_pool2d", "avg_pool2d", "max_pool2d_with_indices")
def _pool(s: TorchState, c: AtenCall) -> bool:
    """max / avg pooling: ``pool2d`` (the indices of ``max_pool2d_with_indices``: the same)."""
    op, args = c.op, c.args
    kern = list(args[1])
    stride = list(args[2]) if len(args) > 2 and args[2] else kern
    pad = list(args[3]) if len(args) > 3 else [0, 0]
    r = emit(s, c, "pool2d", [c.x], mode="avg" if op == "avg_pool2d" else "max", kernel=kern, stride=stride,
             padding=pad)
    if op == "max_pool2d_with_indices":
        s.ref[c.n.name] = [r, r]
    return True


@_converts("adaptive_avg_pool2d")
def _adaptive_pool(s: TorchState, c: AtenCall) -> bool:
    """adaptive_avg_pool2d to 1 x 1: a global ``pool2d``."""
    if list(c.args[1]) != [1, 1]:
        return False
    emit(s, c, "pool2d", [c.x], mode="avg", **{"global": True})
    return True


@_converts("batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm", "_native_batch_norm_legit")
def _batchnorm(s: TorchState, c: AtenCall) -> bool:
    """batch_norm and its native variants (three outputs, all the op's): ``batchnorm``."""
    r = emit(s, c, "batchnorm", [c.x])
    if c.op != "batch_norm":
        s.ref[c.n.name] = [r, r, r]
    return True


@_converts("layer_norm", "native_layer_norm")
def _layernorm(s: TorchState, c: AtenCall) -> bool:
    """layer_norm (native_layer_norm's three outputs: all the op's): ``layernorm``."""
    r = emit(s, c, "layernorm", [c.x])
    if c.op == "native_layer_norm":
        s.ref[c.n.name] = [r, r, r]
    return True


@_converts("rms_norm")
def _rmsnorm(s: TorchState, c: AtenCall) -> bool:
    """rms_norm: ``rmsnorm``."""
    emit(s, c, "rmsnorm", [c.x])
    return True


@_converts(*_UNARY)
def _unary(s: TorchState, c: AtenCall) -> bool:
    """relu, gelu, silu, sigmoid, tanh: the soapbox op of that name."""
    emit(s, c, _UNARY[c.op], [c.x])
    return True


@_converts("dropout")
def _dropout(s: TorchState, c: AtenCall) -> bool:
    """dropout: ``dropout`` at its rate."""
    emit(s, c, "dropout", [c.x], rate=float(c.args[1]) if len(c.args) > 1 else 0.5)
    return True


@_converts("softmax", "_softmax")
def _softmax(s: TorchState, c: AtenCall) -> bool:
    """softmax: ``softmax`` over its axis."""
    emit(s, c, "softmax", [c.x], axis=int(c.args[1]))
    return True


@_converts(*_BINARY)
def _binary(s: TorchState, c: AtenCall) -> bool:
    """add / sub / mul / div of two activations of the output's shape: ``add`` / ``mul``."""
    acts = c.acts
    if not (len(acts) == 2 and node_shape(acts[0]) == node_shape(acts[1]) == c.out):
        return False
    emit(s, c, _BINARY[c.op], acts)
    return True


@_converts(*_BINARY, *_GENERIC)
def _elementwise(s: TorchState, c: AtenCall) -> bool:
    """A pointwise call (or add / sub / mul / div with a scalar, constant or broadcast operand)
    whose first argument has the output's shape: ``elementwise`` on it."""
    x = c.x
    if not (x is not None and hasattr(x, "name") and x.name in s.ref and node_shape(x) == c.out):
        return False
    emit(s, c, "elementwise", [x], flops_per_element=_GENERIC.get(c.op, 1.0), label=c.op)
    return True


@_converts("scaled_dot_product_attention")
def _attention(s: TorchState, c: AtenCall) -> bool:
    """scaled_dot_product_attention: ``attention`` (causal when it says so)."""
    causal = bool(c.n.kwargs.get("is_causal", c.args[5] if len(c.args) > 5 else False))
    emit(s, c, "attention", c.acts[:3], causal=causal)
    return True


@_converts("embedding")
def _embedding(s: TorchState, c: AtenCall) -> bool:
    """embedding of a constant table by activation ids: ``embedding``."""
    args = c.args
    if args[0].name not in s.const:
        return False
    v, d = s.const[args[0].name]
    emit(s, c, "embedding", [args[1]], num_embeddings=v, embedding_dim=d, param_group=s.tied.get(args[0].name))
    return True


@_converts(*_VIEWS)
def _view(s: TorchState, c: AtenCall) -> bool:
    """A view of a known output shape: ``reshape``."""
    if c.out is None:
        return False
    emit(s, c, "reshape", [c.x], shape=list(c.out))
    return True


@_converts("transpose", "t", "permute")
def _transpose(s: TorchState, c: AtenCall) -> bool:
    """transpose, t, permute: ``transpose`` by the permutation."""
    op, args = c.op, c.args
    rank = len(node_shape(c.x))
    if op == "permute":
        perm = [int(p) % rank for p in args[1]]
    else:
        d0, d1 = (int(args[1]) % rank, int(args[2]) % rank) if op == "transpose" else (0, 1)
        perm = list(range(rank))
        perm[d0], perm[d1] = perm[d1], perm[d0]
    emit(s, c, "transpose", [c.x], perm=perm)
    return True


@_converts("cat")
def _cat(s: TorchState, c: AtenCall) -> bool:
    """cat of activations: ``concat``."""
    args = c.args
    if not all(hasattr(a, "name") and a.name in s.ref for a in args[0]):
        return False
    emit(s, c, "concat", list(args[0]), axis=int(args[1]) if len(args) > 1 else 0)
    return True


@_converts("select")
def _select(s: TorchState, c: AtenCall) -> bool:
    """select: one piece of a ``split`` of the axis into size-1 pieces (one split per tensor and
    axis, shared by every select of it)."""
    n, x, args = c.n, c.x, c.args
    rank = len(node_shape(x))
    axis = int(args[1]) % rank
    key = (x.name, axis)
    if key not in s.split_cache:
        size = node_shape(x)[axis]
        try:
            rs = s.b.add("split", f"{x.name}.select{axis}", [s.ref[x.name]], axis=axis, sizes=[1] * size,
                         squeeze=True)
        except (OpError, ValueError) as e:
            raise s.fail(f"node {n.name} (select)", f"as soapbox split: {e}") from None
        s.split_cache[key] = rs if isinstance(rs, list) else [rs]
    s.ref[n.name] = s.split_cache[key][int(args[2]) % node_shape(x)[axis]]
    return True


@_converts("split", "split_with_sizes", "chunk")
def _split(s: TorchState, c: AtenCall) -> bool:
    """split, split_with_sizes, chunk: ``split`` into the outputs' sizes."""
    rank = len(node_shape(c.x))
    axis = int(c.args[2]) % rank if len(c.args) > 2 else 0
    outs = [tuple(int(d) for d in v.shape) for v in c.n.meta["val"]]
    r = emit(s, c, "split", [c.x], axis=axis, sizes=[o[axis] for o in outs])
    s.ref[c.n.name] = r if isinstance(r, list) else [r]
    return True


@_converts("expand")
def _broadcast(s: TorchState, c: AtenCall) -> bool:
    """expand to a known shape: broadcasts (:func:`_expand`)."""
    if c.out is None:
        return False
    s.ref[c.n.name] = _expand(s.b, s.ref[c.x.name], node_shape(c.x), c.out, c.n.name)
    return True


def _expand(b: GraphBuilder, r: TensorRef, have: tuple[int, ...], want: tuple[int, ...], name: str) -> TensorRef:
    """``expand`` as soapbox ops: a reshape adding the leading axes, then a ``broadcast`` per
    size-1 axis that grows (grouped-query attention's repeated key/value heads)."""
    if len(want) > len(have):
        have = (1,) * (len(want) - len(have)) + tuple(have)
        r = b.add("reshape", f"{name}.lead", [r], shape=list(have))
    for axis, (h, w) in enumerate(zip(have, want)):
        if h != w:
            r = b.add("broadcast", f"{name}.axis{axis}", [r], axis=axis, size=w)
    return r


@_converts("slice")
def _slice(s: TorchState, c: AtenCall) -> bool:
    """slice with step 1: a ``split``, the piece kept (nothing when the slice is whole)."""
    args, out, x = c.args, c.out, c.x
    if not (out is not None and (args[4] if len(args) > 4 else 1) == 1):
        return False
    axis = int(args[1]) % len(out)
    size = node_shape(x)[axis]
    start = min(max(int(args[2]) + (size if int(args[2]) < 0 else 0), 0), size) if len(args) > 2 else 0
    pieces = [p for p in (start, out[axis], size - start - out[axis]) if p]
    r = emit(s, c, "split", [x], axis=axis, sizes=pieces) if len(pieces) > 1 else s.ref[x.name]
    s.ref[c.n.name] = r[0 if start == 0 else 1] if isinstance(r, list) else r
    return True


@_converts(*PASS_THROUGH)
def _pass_through(s: TorchState, c: AtenCall) -> bool:
    """A call that only relabels or copies its input: the input itself (no op)."""
    s.ref[c.n.name] = s.ref[c.x.name]
    s.used[c.n.name] -= 1
    return True
