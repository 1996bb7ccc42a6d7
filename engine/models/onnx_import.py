"""soapbox models from ONNX files (``soapbox import model.onnx``), with the ``onnx`` package
(the ``soapbox[onnx]`` extra) and its shape inference.

What is read: the graph's nodes, inputs and the *shapes* of its initializers (weights); no
weight values (but the few small integer ones of a shape computed from constants), never
external data (an initializer stored in another file, as torch's exporter writes a model's
weights, is imported from the dims and type its descriptor states; the importer opens no file but
the one it was given, so the data file is never needed and its ``location`` never followed).
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
error naming it.

The import runs in stages: parse (after the size limits), bind the inputs' symbolic dims, infer
shapes (:mod:`engine.models.onnx_shapes`), read the shape tables, add the inputs, walk the nodes
(each converted by :mod:`engine.models.onnx_convert`'s converter for its op type), note what was
approximated."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable, Mapping

from ..errors import Problem, ValidationError
from ..graph import GraphBuilder, OpGraph
from ..ops import MAX_RANK, MAX_TENSOR_ELEMENTS, OpError
from .onnx_convert import KNOWN_OPS, convert, lookup_by_constant_ids
from .onnx_state import ImportState, OnnxNode, Unmapped, clean_name, emit, module_block
from .onnx_shapes import infer_shapes_light
from .onnx_ties import MAX_FOLD_ROUNDS, find_ties, fold_shape_inputs, is_external
from .onnx_wire import onnx_node_count

__all__ = ["import_onnx", "MAX_ONNX_BYTES", "MAX_ONNX_NODES"]

#: the largest ONNX file read (protobuf's own limit for one message)
MAX_ONNX_BYTES = 2 * 1024**3
#: the most nodes an import takes (the model format's op limit)
MAX_ONNX_NODES = 200_000

#: ONNX element types -> soapbox dtype (https://onnx.ai/onnx/api/mapping.html)
_ELEM = {1: "fp32", 10: "fp16", 16: "bf16", 6: "int32", 7: "int64"}

_Fail = Callable[[str, str], ValidationError]


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
        the size limits, a graph out of topological order (or with a cycle), a small integer
        constant a shape is computed from stored as external data, operators that cannot be mapped (all of them listed, with counts), shapes that
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
    model = _parse(onnx, data, max_bytes, max_nodes, fail)

    # -- bind symbolic input dims, then infer every shape
    dims = dict(dims or {})
    inits = {t.name: tuple(int(d) for d in t.dims) for t in model.graph.initializer}
    bound, fixed_notes = _bind_inputs(model.graph, inits, dims, batch, seq_len, fixed_batch, fail)
    model = _infer(model, fail)
    g = model.graph
    inits.update((t.name, tuple(int(d) for d in t.dims)) for t in g.initializer if t.name not in inits)
    shapes, elem, partial = _shape_tables(g, inits, fail)
    groups, tie_notes, table_groups = find_ties(g, shapes)

    # -- inputs, then nodes
    s = _start(g, inits, shapes, elem, partial, groups, table_groups, precision=precision, name=name,
               source=source, max_ops=max_ops, fail=fail)
    _walk(s, unknown)
    if s.problems:
        listed = "; ".join(f"{op} x {len(v)} (e.g. {', '.join(x[:60] for x in v[:3])})"
                           for op, v in sorted(s.unmapped.items(), key=lambda kv: -len(kv[1])))
        raise fail("graph", f"{len(s.problems)} node(s) soapbox cannot map: {listed}. Import them as memory-bound "
                            "elementwise ops with --unknown elementwise (when they keep their input's shape), or "
                            "export without them")
    outside = sum(1 for t in g.initializer if is_external(t))
    if outside:
        tie_notes = tie_notes + [f"{outside} initializer(s) stored as external data: their shapes imported, their "
                                 "data file not read (nor needed)"]
    notes = _notes(s, fixed_notes + tie_notes, bound)
    try:
        return s.b.build(), notes
    except (OpError, ValueError) as e:
        raise fail("graph", str(e)) from None


def _parse(onnx: Any, data: bytes, max_bytes: int, max_nodes: int, fail: _Fail) -> Any:
    """The ``ModelProto`` of ``data``, after the size and node-count limits (read from the
    bytes' length and wire format, before parsing), refusing an empty graph and model-local
    functions. Initializers stored as external data keep their dims and type; their values are
    never read (:func:`engine.models.onnx_ties.is_external`)."""
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
    for fn in model.functions:
        raise fail(f"function {fn.name[:80]!r}", "model-local functions are not imported (inline them on export)")
    return model


def _bind_inputs(g: Any, inits: dict[str, tuple[int, ...]], dims: dict[str, int], batch: int | None,
                 seq_len: int | None, fixed_batch: str, fail: _Fail) -> tuple[dict[str, int], list[str]]:
    """Bind the data inputs' symbolic dims in ``g`` (the first symbolic axis of an input to
    ``batch``, the others to ``seq_len``, any by name from ``dims``); a fixed batch that
    ``batch`` would change refused or kept. Returns the dims bound by label, and notes."""
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
    return bound, fixed_notes


def _infer(model: Any, fail: _Fail) -> Any:
    """``model`` with every shape ONNX's inference finds (:func:`infer_shapes_light`), the
    shapes computed from constants folded (:func:`fold_shape_inputs`) and inferred again."""
    try:
        model = infer_shapes_light(model, check_type=False, strict_mode=False, data_prop=True)
        for _ in range(MAX_FOLD_ROUNDS):  # shapes computed from constants (TorchScript's), folded, then inferred
            if not fold_shape_inputs(model):
                break
            model = infer_shapes_light(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:
        raise fail("graph", f"ONNX shape inference failed: {str(e).splitlines()[0][:300]}") from None
    return model


def _shape_tables(g: Any, inits: dict[str, tuple[int, ...]], fail: _Fail) -> tuple[dict, dict, dict]:
    """Each tensor's static shape (``None`` when not fully known), element type, and partial
    shape (-1 for an unknown axis); a shape over soapbox's limits refused."""
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
    return shapes, elem, partial


def _start(g: Any, inits: dict[str, tuple[int, ...]], shapes: dict, elem: dict, partial: dict, groups: dict[str, str],
           table_groups: set[str], *, precision: str | None, name: str | None, source: str, max_ops: int | None,
           fail: _Fail) -> ImportState:
    """The walk's state: the builder (its precision the first float data input's unless given)
    with every data input added."""
    data_shape = next((s for v in g.input if v.name not in inits and (s := shapes.get(v.name))), ())
    precision = precision or next((_ELEM[elem[v.name]] for v in g.input if v.name not in inits
                                   and elem.get(v.name) in (1, 10, 16)), "fp32")
    b = GraphBuilder(name or (g.name or "onnx-model")[:200], precision,
                     f"imported from ONNX ({len(g.node)} nodes)", f"soapbox import {source}")
    s = ImportState(g, b, fail, shapes, partial, elem, inits, groups, table_groups, data_shape, max_ops,
                    const=set(inits), nodes=list(g.node), consumers=Counter(i for n in g.node for i in n.input if i),
                    groups_or_tables=set(groups) | {t.name for t in g.initializer if len(t.dims) == 2})
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
        s.ref[vi.name] = b.input(clean_name(vi.name, 0, "input", s.used), list(shp),
                                 dtype=dt if dt.startswith("int") else precision, **kw)
    return s


def _walk(s: ImportState, unknown: str) -> None:
    """Convert every node in file order (:func:`convert`): a node read before it is made is
    refused; shape arithmetic and constants are folded; the ops an unmapped op feeds are skipped
    (listed when they have no mapping themselves)."""
    produced = set(s.ref) | s.const
    for k, node in enumerate(s.nodes):
        where = f"node {node.name[:80] or k} ({node.op_type})"
        missing = [i for i in node.input if i and i not in produced]
        if missing:
            raise s.fail(where, f"reads {missing[0][:80]!r} before any node produces it (the graph is not in "
                                "topological order, or has a cycle)")
        produced.update(o for o in node.output if o)
        if k in s.folded_add:
            s.ref[node.output[0]] = s.ref[s.folded_add[k]]
            continue
        ins = [i for i in node.input if i]
        acts = [i for i in ins if i not in s.const]
        op = node.op_type
        if op in ("Shape", "Size"):  # (known from ONNX's inference, even after an unmapped op)
            s.const.update(o for o in node.output if o)
            continue
        where_dead = [i for i in acts if i in s.dead]
        if where_dead:  # fed by an op that could not be mapped: skipped, listed if unmapped itself
            s.dead.update(o for o in node.output if o)
            if op not in KNOWN_OPS:
                s.unmapped.setdefault(op, []).append(node.name or node.output[0])
                s.problems.append(Problem(where, "not mapped"))
            continue
        if lookup_by_constant_ids(s, k, node, where, ins, acts):
            continue
        if not acts or op in ("Shape", "Constant", "ConstantOfShape", "Size"):
            s.const.update(o for o in node.output if o)  # shape arithmetic and constants: folded
            continue
        out = node.output[0]
        n = OnnxNode(k, node, where, op, ins, acts, out, s.shapes.get(out), clean_name(node.name or out, k, op, s.used))
        s.b.block = module_block(node)  # (a numbered module's ops form a layer block: pipelines split them)
        try:
            convert(s, n)
        except Unmapped:
            _unmapped(s, n, unknown)


def _unmapped(s: ImportState, n: OnnxNode, unknown: str) -> None:
    """A node no converter takes: an ``elementwise`` op (``unknown="elementwise"``, when it keeps
    its input's shape), or listed as a problem, its outputs dead."""
    if unknown == "elementwise" and len(n.acts) >= 1 and n.oshape is not None and \
            s.shapes.get(n.acts[0]) == n.oshape and len([o for o in n.node.output if o]) == 1:
        emit(s, n, "elementwise", n.acts[:1], flops_per_element=1.0, label=n.op)
        s.unmapped.setdefault(n.op, []).append(n.node.name or n.out)
    else:
        s.unmapped.setdefault(n.op, []).append(n.node.name or n.out)
        s.problems.append(Problem(n.where, "not mapped"))
        s.used.discard(n.nm)
        s.dead.update(o for o in n.node.output if o)


def _notes(s: ImportState, first: list[str], bound: dict[str, int]) -> list[str]:
    """The import's notes: ``first`` (a fixed batch kept, ties found), the walk's own, then
    tables kept by constant ids, constant operands not counted, ops imported as elementwise
    and the dims bound."""
    notes = s.notes
    notes[:0] = first
    if s.const_ids:
        notes.append("tables looked up by constant ids kept as embeddings, their ids an input each: " +
                     ", ".join(x[:60] for x in s.const_ids[:8]))
    if s.weights:
        notes.append(f"constant operands of elementwise ops not counted as parameters (rotary tables, folded rows): "
                     f"{sum(math.prod(s.inits[w]) for w in s.weights):,} elements in {len(s.weights)} tensor(s)")
    if s.unmapped:
        notes.append("imported as elementwise (memory-bound, 1 FLOP an element): " + "; ".join(
            f"{op} x {len(v)}" for op, v in sorted(s.unmapped.items())))
    if bound:
        notes.append("symbolic dimensions bound: " + ", ".join(f"{k}={v}" for k, v in bound.items()))
    return notes
