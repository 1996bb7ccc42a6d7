"""soapbox models from ONNX files (``soapbox import model.onnx``), with the ``onnx`` package
(the ``soapbox[onnx]`` extra) and its shape inference.

What is read: the graph's nodes, inputs and the *shapes* of its initializers (weights); no
weight values (but the few small integer ones of a shape computed from constants), never
external data (an initializer stored in another file is refused by default, or imported from
the dims its descriptor states: the importer opens no file but the one it was given).
Symbolic input dimensions are bound before shape inference: the first symbolic axis of an
input to ``--batch``, the others to ``--seq-len``, any by name with ``--dim NAME=N``.

Mapped operators (https://onnx.ai/onnx/operators/): Gemm and MatMul with a weight (linear; a
following bias Add folded in), MatMul of two activations (batch_matmul), Conv, MaxPool /
AveragePool / GlobalAveragePool / GlobalMaxPool, ReduceMean over H, W (global average pool),
BatchNormalization, LayerNormalization, SimplifiedLayerNormalization / RMSNormalization, Relu,
Gelu, Sigmoid, Tanh, Softmax, Add / Sub / Mul / Div of equal shapes, Mul / Add by a learned
vector (scale / bias: a decomposed norm's gain), Expand (broadcast), Dropout, Gather of a table
by ids (embedding; by constant ids, as exporters fold position and token-type lookups, the ids
become an input); Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat, Split, Slice of one
axis and Gather of one index as views and layout ops; Identity and float-to-float Cast pass
through; Shape, Constant and nodes whose inputs are all constants are folded. Other elementwise
ops with a constant or broadcast operand, Erf, Pow, Sqrt, Exp, Neg, Reciprocal, IsNaN and
reductions over the last axis become ``elementwise`` ops (memory-bound). A weight read by
several nodes (tied embeddings; :mod:`engine.models.onnx_ties`) is one ``param_group``, counted
once. Anything else is listed with its count and node names (the ops it feeds skipped, never a
traceback); ``unknown="elementwise"`` imports a shape-preserving unknown op as ``elementwise``
and says so. Each op's output shape is checked against ONNX's; a malformed node is a one-line
error naming it."""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Mapping

from ..errors import Problem, ValidationError
from ..graph import GraphBuilder, OpGraph, TensorRef
from ..ops import MAX_RANK, MAX_TENSOR_ELEMENTS, OpError
from .onnx_ties import (MAX_FOLD_ROUNDS, Unmapped, const_ints, find_ties, fold_shape_inputs, infer_shapes_light,
    slice_sizes, vector_operand)
from .onnx_wire import onnx_node_count

__all__ = ["import_onnx", "MAX_ONNX_BYTES", "MAX_ONNX_NODES"]

#: the largest ONNX file read (protobuf's own limit for one message)
MAX_ONNX_BYTES = 2 * 1024**3
#: the most nodes an import takes (the model format's op limit)
MAX_ONNX_NODES = 200_000

#: ONNX element types -> soapbox dtype (https://onnx.ai/onnx/api/mapping.html)
_ELEM = {1: "fp32", 10: "fp16", 16: "bf16", 6: "int32", 7: "int64"}
_FLOAT = {1, 10, 16, 11}

_UNARY = {"Relu": "relu", "Gelu": "gelu", "Sigmoid": "sigmoid", "Tanh": "tanh"}
_BINARY = {"Add": "add", "Sub": "add", "Mul": "mul", "Div": "mul"}
#: FLOPs per element of the ops imported as ``elementwise`` (counted as a simple kernel does)
_GENERIC = {"Erf": 8.0, "Pow": 2.0, "Sqrt": 1.0, "Exp": 4.0, "Neg": 1.0, "Reciprocal": 1.0, "Log": 4.0,
            "Abs": 1.0, "IsNaN": 1.0, "Add": 1.0, "Sub": 1.0, "Mul": 1.0, "Div": 1.0, "Where": 1.0, "Clip": 2.0}
_VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}
_PASS = {"Identity", "Cast", "Contiguous"}
#: ops with a mapping (for some of their forms): not listed when skipped after an unmapped op
_KNOWN = {"Gemm", "MatMul", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "ReduceMean",
          "BatchNormalization", "LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "Softmax",
          "Dropout", "Transpose", "Concat", "Split", "Gather", *_UNARY, *_BINARY, *_GENERIC, *_VIEWS, *_PASS}


def _clean(name: str, k: int, op_type: str, used: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.\-]+", ".", name).strip(".")[:200] or f"{op_type.lower()}_{k}"
    out, j = base, 1
    while out in used:
        j += 1
        out = f"{base}.{j}"
    used.add(out)
    return out


def import_onnx(data: bytes, *, batch: int | None = None, seq_len: int | None = None,
                dims: Mapping[str, int] | None = None, unknown: str = "error", precision: str | None = None,
                name: str | None = None, source: str = "model.onnx", max_bytes: int = MAX_ONNX_BYTES,
                max_nodes: int = MAX_ONNX_NODES, max_ops: int | None = None,
                fixed_batch: str = "refuse") -> tuple[OpGraph, list[str]]:
    """The soapbox model of an ONNX file's bytes, and notes on what was approximated.

    ``max_bytes`` and ``max_nodes`` are checked first, from the bytes' length and their wire
    format (:func:`onnx_node_count`), before anything is parsed or built: a server passes its
    own smaller limits (the explorer's op limit), so that a file it would refuse anyway costs
    milliseconds, not the seconds a build takes (about 80 us a node). ``max_ops`` stops the
    build as soon as it passes that many soapbox operators (nodes folded as constants or shape
    arithmetic are not operators), so a refusal costs no more than the largest model accepted.

    ``batch`` binds a symbolic first axis. A model exported with a *fixed* batch (every data
    input's first axis a number) keeps it: its reshapes hold that batch as constants, so it
    cannot be rescaled. Then a different ``batch`` is refused (``fixed_batch="refuse"``, the
    command line's choice), or ignored with a note (``fixed_batch="keep"``, the explorer's:
    it always offers its default batch).

    Raises
    ------
    ValidationError
        Naming the node or input: not ONNX, a symbolic dimension left unbound, a tensor over
        the size limits, a graph out of topological order (or with a cycle), external data,
        operators that cannot be mapped (all of them listed, with counts), shapes that
        disagree with ONNX's inference.
    """
    try:
        import onnx
    except ImportError:  # pragma: no cover - the extra is installed with the tests
        raise ValueError("importing ONNX needs the onnx package: pip install 'soapbox[onnx]'") from None

    def fail(where: str, message: str) -> ValidationError:
        return ValidationError([Problem(where, message)], source)

    if fixed_batch not in ("refuse", "keep"):
        raise ValueError(f"fixed_batch must be 'refuse' or 'keep', got {fixed_batch!r}")
    if unknown not in ("error", "elementwise"):
        raise ValueError(f"unknown must be 'error' or 'elementwise', got {unknown!r}")
    if len(data) > max_bytes:
        raise fail("", f"{len(data):,} bytes, more than the {max_bytes:,} an ONNX file may have here")
    try:
        nodes = onnx_node_count(data, stop_after=max_nodes)
    except ValueError as e:
        raise fail("", f"not an ONNX model (its protobuf encoding is broken: {e})") from None
    if nodes > max_nodes:
        raise fail("graph", f"more than {max_nodes:,} nodes, the most a model may have here")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(bytes(data))
    except Exception as e:  # (protobuf's DecodeError and friends)
        raise fail("", f"not an ONNX model ({type(e).__name__})") from None
    g = model.graph
    if not g.node:
        raise fail("graph", "an ONNX graph with no nodes")
    if len(g.node) > max_nodes:  # (counted above; kept should the two readers ever disagree)
        raise fail("graph", f"{len(g.node):,} nodes, more than the {max_nodes:,} a model may have here")
    for t in g.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raise fail(f"initializer {t.name[:80]!r}", "stored as external data; soapbox reads no file but the "
                                                       "one given (export with the weights inside the file)")
    for fn in model.functions:
        raise fail(f"function {fn.name[:80]!r}", "model-local functions are not imported (inline them on export)")

    # -- bind symbolic input dims, then infer every shape
    dims = dict(dims or {})
    inits = {t.name: tuple(int(d) for d in t.dims) for t in g.initializer}
    bound: dict[str, int] = {}
    fixed: dict[str, int] = {}  # data input -> its fixed first axis
    for vi in g.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        first = True
        if tt.shape.dim and tt.shape.dim[0].HasField("dim_value") and tt.shape.dim[0].dim_value > 0:
            fixed[vi.name] = int(tt.shape.dim[0].dim_value)
        for k, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                first = False
                continue
            label = d.dim_param or f"{vi.name}[{k}]"
            value = dims.get(label, bound.get(label))
            if value is None:
                value = batch if first else seq_len
            first = False
            if value is None:
                raise fail(f"input {vi.name[:80]!r} axis {k}",
                           f"symbolic dimension {label[:80]!r} is not bound: give --batch (first axis), --seq-len "
                           f"(other axes) or --dim {label[:40]}=N")
            if not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
                raise fail(f"input {vi.name[:80]!r} axis {k}", f"dimension {label[:80]!r} = {value!r} is not a size")
            bound[label] = value
            d.Clear()
            d.dim_value = value
    fixed_notes = []
    if batch is not None and fixed and len(fixed) == len([v for v in g.input if v.name not in inits]) \
            and batch not in fixed.values():
        nm0, b0 = next(iter(fixed.items()))
        if fixed_batch == "refuse":
            raise fail(f"input {nm0[:80]!r} axis 0", f"exported with a fixed batch of {b0}: --batch {batch} cannot "
                       "change it (the graph's reshapes hold it as constants); re-export with a dynamic batch axis "
                       "(torch.onnx.export's dynamic_axes or dynamic_shapes) or leave --batch out")
        fixed_notes.append(f"exported with a fixed batch of {b0}, kept (batch {batch} applies to symbolic axes)")
    try:
        model = infer_shapes_light(model, check_type=False, strict_mode=False, data_prop=True)
        for _ in range(MAX_FOLD_ROUNDS):  # shapes computed from constants (TorchScript's), folded, then inferred
            if not fold_shape_inputs(model):
                break
            model = infer_shapes_light(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:
        raise fail("graph", f"ONNX shape inference failed: {str(e).splitlines()[0][:300]}") from None
    g = model.graph
    inits.update((t.name, tuple(int(d) for d in t.dims)) for t in g.initializer if t.name not in inits)
    shapes: dict[str, tuple[int, ...] | None] = {}
    elem: dict[str, int] = {}
    partial: dict[str, tuple[int, ...]] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        elem[vi.name] = tt.elem_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
        else:
            shapes.setdefault(vi.name, None)
            if tt.HasField("shape"):  # (-1: unknown)
                partial[vi.name] = tuple(int(d.dim_value) if d.HasField("dim_value") else -1 for d in tt.shape.dim)
    for t in g.initializer:
        shapes[t.name], elem[t.name] = inits[t.name], t.data_type
    for nm, shp in shapes.items():
        if shp is not None and (len(shp) > MAX_RANK or any(d < 0 for d in shp) or
                                math.prod(shp) > MAX_TENSOR_ELEMENTS):
            raise fail(f"tensor {nm[:80]!r}", f"shape {list(shp)[:8]} is over the limits (rank <= {MAX_RANK}, "
                                              f"at most 2**44 elements)")

    groups, tie_notes, table_groups = find_ties(g, shapes)
    data_shape = next((s for v in g.input if v.name not in inits and (s := shapes.get(v.name))), ())
    data_batch = data_shape[0] if data_shape else None

    # -- inputs
    precision = precision or next((_ELEM[elem[v.name]] for v in g.input if v.name not in inits
                                   and elem.get(v.name) in (1, 10, 16)), "fp32")
    b = GraphBuilder(name or (g.name or "onnx-model")[:200], precision,
                     f"imported from ONNX ({len(g.node)} nodes)", f"soapbox import {source}")
    used: set[str] = set()
    ref: dict[str, TensorRef] = {}  # ONNX tensor -> soapbox output
    const: set[str] = set(inits)  # tensors known without running the model (weights, shapes)
    for vi in g.input:
        if vi.name in inits:
            continue
        shp = shapes.get(vi.name)
        if shp is None:
            raise fail(f"input {vi.name[:80]!r}", "its shape is unknown")
        dt = _ELEM.get(elem.get(vi.name, 1))
        if dt is None:
            raise fail(f"input {vi.name[:80]!r}", f"element type {elem.get(vi.name)} is not imported")
        axes = ("sample", "length") if dt.startswith("int") and len(shp) == 2 else None
        kw = {"axes": list(axes)} if axes else {}
        ref[vi.name] = b.input(_clean(vi.name, 0, "input", used), list(shp),
                               dtype=dt if dt.startswith("int") else precision, **kw)

    # -- nodes
    produced = set(ref) | const
    consumers = Counter(i for n in g.node for i in n.input if i)
    problems: list[Problem] = []
    unmapped: dict[str, list[str]] = {}
    notes: list[str] = []
    weights: set[str] = set()  # float initializers read as constant operands of elementwise ops
    dead: set[str] = set()  # outputs of unmapped ops (error mode: listed, then skipped)
    const_ids: list[str] = []  # embeddings looked up by constant ids
    groups_or_tables = set(groups) | {t.name for t in g.initializer if len(t.dims) == 2}
    folded_add: dict[int, str] = {}  # node index of an Add folded into the linear before it
    nodes = list(g.node)
    added = [0]  # operators added to the builder (for max_ops)

    def attr(node, key: str, default: Any = None) -> Any:
        for a in node.attribute:
            if a.name == key:
                return onnx.helper.get_attribute_value(a)
        return default

    for k, node in enumerate(nodes):
        where = f"node {node.name[:80] or k} ({node.op_type})"
        missing = [i for i in node.input if i and i not in produced]
        if missing:
            raise fail(where, f"reads {missing[0][:80]!r} before any node produces it (the graph is not in "
                              "topological order, or has a cycle)")
        produced.update(o for o in node.output if o)
        if k in folded_add:
            ref[node.output[0]] = ref[folded_add[k]]
            continue
        ins = [i for i in node.input if i]
        acts = [i for i in ins if i not in const]
        op = node.op_type
        if op in ("Shape", "Size"):  # (known from ONNX's inference, even after an unmapped op)
            const.update(o for o in node.output if o)
            continue
        where_dead = [i for i in acts if i in dead]
        if where_dead:  # fed by an op that could not be mapped: skipped, listed if unmapped itself
            dead.update(o for o in node.output if o)
            if op not in _KNOWN:
                unmapped.setdefault(op, []).append(node.name or node.output[0])
                problems.append(Problem(where, "not mapped"))
            continue
        if op == "Gather" and not acts and ins[0] in groups_or_tables and len(ins) == 2 and node.output \
                and elem.get(ins[0]) in _FLOAT and attr(node, "axis", 0) == 0 and data_batch and \
                2 <= len(shapes.get(node.output[0]) or partial.get(node.output[0]) or ()) <= 3:
            # a table looked up by constant ids (positions, token types): kept, its ids an input; ids
            # broadcast over the batch by the exporter get the batch, a length ONNX leaves unknown the input's
            out, (v, d) = node.output[0], shapes[ins[0]]
            ids = list((shapes.get(out) or partial[out])[:-1])
            if len(ids) == 1 or (len(ids) == 2 and ids[0] in (1, -1)):
                ids = [data_batch, ids[-1]]
            if ids[-1] == -1 and len(ids) == 2 and len(data_shape) == 2:
                ids[-1] = data_shape[1]
            nm = _clean(node.name or out, k, op, used)
            if min(ids) < 1:  # (folded as before, and said)
                const.update(o for o in node.output if o)
                notes.append(f"{nm}: a table looked up by constant ids of unknown shape is not counted")
                continue
            kw = {"axes": ["sample", "length"]} if len(ids) == 2 else {}
            try:
                r = b.add("embedding", nm, [b.input(_clean(f"{nm}.ids", k, op, used), ids, dtype="int64", **kw)],
                          num_embeddings=int(v), embedding_dim=int(d), param_group=groups.get(ins[0]))
            except (OpError, ValueError) as e:
                raise fail(where, f"as soapbox embedding: {e}") from None
            ref[out], shapes[out] = r, tuple(ids) + (int(d),)
            const_ids.append(nm)
            continue
        if not acts or op in ("Shape", "Constant", "ConstantOfShape", "Size"):
            const.update(o for o in node.output if o)  # shape arithmetic and constants: folded
            continue
        out = node.output[0]
        oshape = shapes.get(out)
        nm = _clean(node.name or out, k, op, used)

        def add(kind: str, inputs: list[str], name: str | None = None, **attrs: Any) -> None:
            added[0] += 1
            if max_ops is not None and added[0] > max_ops:
                raise fail("graph", f"more than {max_ops:,} operators, the most a model may have here")
            try:
                r = b.add(kind, name or nm, [ref[i] for i in inputs], **attrs)
            except (OpError, ValueError) as e:
                raise fail(where, f"as soapbox {kind}: {e}") from None
            rs = r if isinstance(r, list) else [r]
            for o, rr in zip([o for o in node.output if o], rs):
                ref[o] = rr
                want = shapes.get(o)
                got = b.shape_of(rr)
                if want is not None and tuple(got) != tuple(want):
                    raise fail(where, f"soapbox's {kind} gives shape {list(got)}, ONNX infers {list(want)}")

        try:
            if op in ("Gemm", "MatMul") and len(acts) == 1 and acts[0] == ins[0] and ins[1] in const:
                w = shapes[ins[1]]
                if op == "Gemm" and (attr(node, "transA", 0) or attr(node, "alpha", 1.0) != 1.0):
                    raise Unmapped()
                n_out = w[0] if op == "Gemm" and attr(node, "transB", 0) else w[-1]
                bias = op == "Gemm" and len(ins) > 2
                if op == "MatMul" and consumers[out] == 1:  # fold a following bias Add
                    nxt = next((j for j in range(k + 1, len(nodes)) if out in nodes[j].input), None)
                    if nxt is not None and nodes[nxt].op_type == "Add":
                        other = [i for i in nodes[nxt].input if i != out]
                        if len(other) == 1 and other[0] in const and shapes.get(other[0]) in ((n_out,), (1, n_out)):
                            bias, folded_add[nxt] = True, out
                if len(w) != 2:
                    raise Unmapped()
                group = groups.get(ins[1])
                if group in table_groups and bias:  # its own bias beside the tied weight: a bias op of its own
                    ref[out + "#tied"] = b.add("linear", _clean(nm + ".tied", k, op, used), [ref[ins[0]]],
                                               out_features=int(n_out), bias=False, param_group=group)
                    add("bias", [out + "#tied"])
                else:
                    add("linear", [ins[0]], out_features=int(n_out), bias=bias, param_group=group)
            elif op == "MatMul" and len(acts) == 2:
                add("batch_matmul", acts)
            elif op == "Conv" and len(acts) == 1 and ins[1] in const:
                w = shapes[ins[1]]
                pads = list(attr(node, "pads", [0] * 4))
                if len(w) != 4 or pads[:2] != pads[2:] or any(d != 1 for d in attr(node, "dilations", [1, 1])):
                    raise Unmapped()
                add("conv2d", [ins[0]], out_channels=int(w[0]), kernel=[int(w[2]), int(w[3])],
                    stride=list(attr(node, "strides", [1, 1])), padding=pads[:2], groups=int(attr(node, "group", 1)),
                    bias=len(ins) > 2)
            elif op in ("MaxPool", "AveragePool"):
                pads = list(attr(node, "pads", [0] * 4))
                if pads[:2] != pads[2:] or attr(node, "ceil_mode", 0):
                    raise Unmapped()
                kern = list(attr(node, "kernel_shape"))
                add("pool2d", acts, mode="max" if op == "MaxPool" else "avg", kernel=kern,
                    stride=list(attr(node, "strides", kern)), padding=pads[:2])
            elif op == "ReduceMean" and len(shapes[acts[0]]) == 4 and sorted(
                    a % 4 for a in (attr(node, "axes") or const_ints(g, ins[1]) if len(ins) > 1 else attr(node, "axes"))
                    or ()) == [2, 3]:  # global average pool (the dynamo exporter's, torch.mean over H, W)
                if attr(node, "keepdims", 1):
                    add("pool2d", acts, mode="avg", **{"global": True})
                else:
                    ref[out + "#pool"] = b.add("pool2d", nm, [ref[acts[0]]], mode="avg", **{"global": True})
                    add("reshape", [out + "#pool"], name=_clean(nm + ".squeeze", k, op, used), shape=list(oshape))
            elif op in ("ReduceMean", "ReduceSum", "ReduceMax") and len(acts) == 1 and oshape is not None and \
                    oshape == shapes[acts[0]][:-1] + (1,):  # over the last axis (a norm's statistics)
                red = b.add("elementwise", nm, [ref[acts[0]]], flops_per_element=1.0, label=op)
                h = shapes[acts[0]][-1]
                first = b.add("split", _clean(nm + ".first", k, op, used), [red], axis=len(oshape) - 1,
                              sizes=[1, h - 1] if h > 1 else [1])
                ref[out + "#red"] = first[0] if isinstance(first, list) else first
                add("reshape", [out + "#red"], name=_clean(nm + ".keep", k, op, used), shape=list(oshape))
            elif (op == "Slice" and len(acts) == 1 and acts[0] == ins[0] and oshape is not None and len(ins) >= 3) \
                    or (op == "Gather" and acts == ins[:1] and oshape is not None):  # (Gather: one index)
                if op == "Gather":
                    idx = const_ints(g, ins[1])
                    sizes = slice_sizes(shapes[acts[0]], idx, [idx[0] + 1 if idx and idx[0] != -1 else 2**62]
                                         if idx else None, [int(attr(node, "axis", 0))], None) \
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
                parts = b.add("split", nm, [ref[acts[0]]], axis=axis, sizes=pieces)
                ref[out + "#part"] = parts[keep] if isinstance(parts, list) else parts
                add("reshape", [out + "#part"], name=_clean(nm + ".part", k, op, used), shape=list(oshape))
            elif op == "Expand" and acts == ins[:1] and oshape is not None and shapes.get(acts[0]) is not None:
                # (grouped-query attention's key/value heads repeated: a broadcast per size-1 axis that grows)
                want = tuple(oshape)
                have = (1,) * (len(want) - len(shapes[acts[0]])) + tuple(shapes[acts[0]])
                if len(have) != len(want) or any(h not in (1, w) for h, w in zip(have, want)):
                    raise Unmapped()
                r = ref[out + "#in"] = b.add("reshape", _clean(nm + ".in", k, op, used), [ref[acts[0]]],
                                             shape=list(have))
                for a in [a for a, (h, w) in enumerate(zip(have, want)) if h != w]:
                    r = ref[out + "#in"] = b.add("broadcast", _clean(f"{nm}.axis{a}", k, op, used), [r], axis=a,
                                                 size=want[a])
                add("reshape", [out + "#in"], shape=list(want))
            elif op in ("GlobalAveragePool", "GlobalMaxPool"):
                add("pool2d", acts, mode="avg" if op == "GlobalAveragePool" else "max", **{"global": True})
            elif op == "BatchNormalization":
                add("batchnorm", acts[:1])
            elif op == "LayerNormalization":
                if attr(node, "axis", -1) not in (-1, len(shapes[ins[0]] or ()) - 1):
                    raise Unmapped()
                add("layernorm", acts[:1])
            elif op in ("SimplifiedLayerNormalization", "RMSNormalization"):
                add("rmsnorm", acts[:1])
            elif op in _UNARY:
                add(_UNARY[op], acts)
            elif op == "Softmax":
                add("softmax", acts, axis=int(attr(node, "axis", -1)))
            elif op in _BINARY and len(acts) == 2 and shapes.get(acts[0]) == shapes.get(acts[1]) == oshape:
                add(_BINARY[op], acts)
            elif op in ("Mul", "Add") and shapes.get(acts[0]) == oshape and \
                    (vec := vector_operand(ins, acts, inits, elem, oshape, _FLOAT)) is not None:
                add("scale" if op == "Mul" else "bias", acts, param_group=groups.get(vec))
            elif op in _GENERIC and oshape is not None and oshape in [shapes.get(a) for a in acts]:
                # (with a broadcast operand, a norm's statistics or a mask: memory-bound on the full-size one)
                add("elementwise", [a for a in acts if shapes.get(a) == oshape][:1], flops_per_element=_GENERIC[op],
                    label=op)
                weights.update(i for i in ins if i in inits and math.prod(inits[i]) > 1 and elem.get(i) in _FLOAT)
            elif op == "Dropout":
                add("dropout", acts[:1], rate=float(attr(node, "ratio", 0.5)) if len(ins) < 2 else 0.1)
            elif op in _VIEWS and oshape is not None:
                add("reshape", acts[:1], shape=list(oshape))
            elif op == "Transpose":
                perm = attr(node, "perm")
                add("transpose", acts, perm=list(perm) if perm is not None
                    else list(range(len(shapes[acts[0]]) - 1, -1, -1)))
            elif op == "Concat" and len(acts) == len(ins) and len(acts) >= 2:
                add("concat", acts, axis=int(attr(node, "axis")))
            elif op == "Split" and len(acts) == 1:
                axis = int(attr(node, "axis", 0))
                sizes = [shapes[o][axis] for o in node.output]
                add("split", acts, axis=axis, sizes=sizes)
            elif op == "Gather" and ins[0] in const and len(shapes[ins[0]]) == 2 and attr(node, "axis", 0) == 0:
                v, d = shapes[ins[0]]
                add("embedding", acts, num_embeddings=int(v), embedding_dim=int(d), param_group=groups.get(ins[0]))
            elif op in _PASS and len(acts) == 1 and (op != "Cast" or attr(node, "to") in _FLOAT and
                                                     elem.get(acts[0]) in _FLOAT):
                ref[out] = ref[acts[0]]
                used.discard(nm)
            else:
                raise Unmapped()
        except ValidationError:
            raise
        except (KeyError, TypeError, IndexError, ValueError, AttributeError, OpError) as e:
            raise fail(where, f"malformed node ({type(e).__name__}: {str(e)[:120]}): check its inputs, attributes "
                              "and shapes") from None
        except Unmapped:
            if unknown == "elementwise" and len(acts) >= 1 and oshape is not None and \
                    shapes.get(acts[0]) == oshape and len([o for o in node.output if o]) == 1:
                add("elementwise", acts[:1], flops_per_element=1.0, label=op)
                unmapped.setdefault(op, []).append(node.name or out)
            else:
                unmapped.setdefault(op, []).append(node.name or out)
                problems.append(Problem(where, "not mapped"))
                used.discard(nm)
                dead.update(o for o in node.output if o)
    if problems:
        listed = "; ".join(f"{op} x {len(v)} (e.g. {', '.join(x[:60] for x in v[:3])})"
                           for op, v in sorted(unmapped.items(), key=lambda kv: -len(kv[1])))
        raise fail("graph", f"{len(problems)} node(s) soapbox cannot map: {listed}. Import them as memory-bound "
                            "elementwise ops with --unknown elementwise (when they keep their input's shape), or "
                            "export without them")
    notes[:0] = fixed_notes + tie_notes
    if const_ids:
        notes.append("tables looked up by constant ids kept as embeddings, their ids an input each: " +
                     ", ".join(x[:60] for x in const_ids[:8]))
    if weights:
        notes.append(f"constant operands of elementwise ops not counted as parameters (rotary tables, folded rows): "
                     f"{sum(math.prod(inits[w]) for w in weights):,} elements in {len(weights)} tensor(s)")
    if unmapped:
        notes.append("imported as elementwise (memory-bound, 1 FLOP an element): " + "; ".join(
            f"{op} x {len(v)}" for op, v in sorted(unmapped.items())))
    if bound:
        notes.append("symbolic dimensions bound: " + ", ".join(f"{k}={v}" for k, v in bound.items()))
    try:
        return b.build(), notes
    except (OpError, ValueError) as e:
        raise fail("graph", str(e)) from None
