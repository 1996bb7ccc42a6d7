"""Shared (tied) weights in an ONNX graph, and constant folding, for the importer
(:mod:`engine.models.onnx_import`).

A language model's output layer often reuses its token embedding (GPT-2, BERT's masked-LM
decoder). The exporters write that tie in one of three ways:

- one initializer read by both the ``Gather`` (the lookup) and a ``Gemm`` / ``MatMul``
  (torch's dynamo exporter; also any weight read twice);
- a ``Transpose`` (or ``Identity`` / ``Cast``) of the table feeding the ``MatMul``, folded
  as a constant by the importer;
- a second initializer holding the table's transpose, already folded by the exporter
  (torch's TorchScript exporter: ``onnx::MatMul_538`` of shape (H, V) beside ``wte`` (V, H)).

The first two are found from the graph; the third by comparing the two tensors' values, or,
when they are external data (not read), by the dynamo exporter's record of the parameter each
node read (its ``pkg.torch.onnx.fx_node`` metadata) (only the pairs of a lookup table (V, H) and a GEMM weight (H, V) or (V, H) of the same
element type; a table of all zeros equal to a zero weight would be taken for a tie).
Every tie becomes one soapbox ``param_group``, so the parameters are counted once.

Precondition not checked: weights equal in value are one tensor to the file. The dynamo
exporter itself merges initializers of equal values, so an untrained model whose layers are
copies of one another (``nn.TransformerEncoder`` deep-copies its layer) is imported with those
layers tied; export a trained (or re-initialised) model.

Also here, the importer's constant folding: small integer constants read (:func:`const_ints`),
and shapes that an exporter computes from constants (TorchScript's ``view`` / ``expand``
targets) evaluated by ONNX's reference evaluator on the few nodes that make them
(:func:`folded_ints`, :func:`fold_shape_inputs`).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

__all__ = ["find_ties", "is_external", "const_ints", "folded_ints", "fold_shape_inputs", "MAX_FOLDED_NODES", "FOLDABLE_OPS",
           "MAX_FOLD_ROUNDS"]

#: ops through which a constant stays the same parameter (folded by the importer)
_SAME = {"Transpose", "Identity", "Cast"}


def _roots(g: Any, inits: set[str]) -> dict[str, str]:
    """Each constant tensor that is an initializer, or a Transpose / Identity / Cast of one:
    the initializer it comes from."""
    root = {n: n for n in inits}
    for node in g.node:
        ins = [i for i in node.input if i]
        if node.op_type in _SAME and len(ins) == 1 and ins[0] in root and node.output:
            root[node.output[0]] = root[ins[0]]
    return root


def _weights(g: Any, root: dict[str, str], shapes: dict[str, Any]) -> tuple[list[str], list[str], dict[str, int]]:
    tables, gemms, uses = [], [], defaultdict(int)
    for node in g.node:
        ins = list(node.input)
        if node.op_type == "Gather" and len(ins) == 2 and ins[0] in root and len(shapes.get(ins[0]) or ()) == 2:
            tables.append(root[ins[0]])
            uses[root[ins[0]]] += 1
        elif node.op_type in ("Gemm", "MatMul") and len(ins) >= 2 and ins[1] in root and ins[0] not in root:
            gemms.append(root[ins[1]])
            uses[root[ins[1]]] += 1
    return tables, gemms, uses


def find_ties(g: Any, shapes: dict[str, Any]) -> tuple[dict[str, str], list[str], set[str]]:
    """The ``param_group`` of every constant tensor whose weight is read by more than one
    lookup or GEMM (keyed by the tensor the node reads), notes on the ties found, and the
    groups that hold a lookup table (whose GEMMs cannot share a bias with it).

    ``g`` is an ONNX ``GraphProto`` after shape inference; ``shapes`` maps tensor names to
    their shapes (``None`` when unknown).
    """
    import numpy as np
    from onnx import numpy_helper

    by_name = {t.name: t for t in g.initializer}
    root = _roots(g, set(by_name))
    tables, gemms, uses = _weights(g, root, shapes)
    alias: dict[str, str] = {}  # an initializer equal to a table (or its transpose) -> the table
    for w in dict.fromkeys(gemms):
        if w in tables:
            continue
        tw = by_name[w]
        for t in dict.fromkeys(tables):
            tt = by_name[t]
            if tt.data_type != tw.data_type or len(tw.dims) != 2 or sorted(tw.dims) != sorted(tt.dims):
                continue
            if is_external(tt) or is_external(tw):  # values not read: the exporter's own record, or no tie
                if _recorded_as(g, w, t):
                    alias[w] = t
                    break
                continue
            try:
                a, b = numpy_helper.to_array(tt), numpy_helper.to_array(tw)
            except Exception:  # (unreadable data: no tie claimed)
                continue
            if (a.shape == b.shape and np.array_equal(a, b)) or (a.shape == b.T.shape and np.array_equal(a, b.T)):
                alias[w] = t
                break
    count: dict[str, int] = defaultdict(int)
    for w, n in uses.items():
        count[alias.get(w, w)] += n
    groups, notes = {}, []
    for tensor, r in root.items():
        canon = alias.get(r, r)
        if count.get(canon, 0) >= 2:
            groups[tensor] = canon[:200]
    tied = sorted({c for c in groups.values()})
    if tied:
        notes.append("shared weights counted once: " + ", ".join(
            f"{c[:80]} ({count[c]} uses{', with its transposed copy' if c in alias.values() else ''})"
            for c in tied))
    return groups, notes, {alias.get(t, t)[:200] for t in tables} & set(tied)


def _recorded_as(g: Any, weight: str, table: str) -> bool:
    """Whether every node reading ``weight`` is recorded by torch's dynamo exporter as reading
    the parameter ``table``: its ``pkg.torch.onnx.fx_node`` metadata names the FX node it came
    from, e.g. ``aten.linear.default](args = (%alias, %p_model_lm_head_weight)`` for a GEMM whose
    weight the exporter folded into a transposed copy (``val_252``) of ``model.lm_head.weight``.
    Used when the two tensors' values are external data and cannot be compared."""
    token = re.compile(r"%p_(\w+)")
    readers = [n for n in g.node if weight in n.input]
    want = table.replace(".", "_")
    for n in readers:
        fx = next((p.value for p in n.metadata_props if p.key == "pkg.torch.onnx.fx_node"), "")
        if want not in token.findall(fx):
            return False
    return bool(readers)


def is_external(t: Any) -> bool:
    """Whether the ``TensorProto`` ``t`` keeps its values in another file (``data_location``
    EXTERNAL, or an ``external_data`` descriptor): its dims and type are read, its values never
    (reading them would open the path the file names)."""
    return t.data_location == 1 or len(t.external_data) > 0  # (1: onnx.TensorProto.EXTERNAL)


def const_ints(g: Any, name: str) -> list[int] | None:
    """The values of a small integer constant (an initializer or a ``Constant`` node's
    output, at most 64 elements; ``None`` when ``name`` is neither)."""
    from onnx import helper, numpy_helper

    for t in g.initializer:
        if t.name == name:
            if len(t.dims) > 1 or (t.dims and t.dims[0] > 64) or t.data_type not in (6, 7) or is_external(t):
                return None
            return [int(v) for v in numpy_helper.to_array(t).reshape(-1)]
    for node in g.node:
        if node.op_type == "Constant" and node.output and node.output[0] == name:
            for a in node.attribute:
                if a.name == "value":
                    if is_external(a.t):
                        return None
                    arr = numpy_helper.to_array(a.t)
                    return [int(v) for v in arr.reshape(-1)] if arr.size <= 64 and arr.dtype.kind == "i" else None
                if a.name in ("value_ints", "value_int"):
                    v = helper.get_attribute_value(a)
                    return [int(x) for x in (v if isinstance(v, list) else [v])]
    return None


#: the most nodes :func:`folded_ints` evaluates to get one folded value (a shape computed from
#: constants is a handful: TorchScript's expand writes ConstantOfShape, Mul, Equal, Where)
MAX_FOLDED_NODES = 32
#: the ops :func:`folded_ints` evaluates: shape arithmetic whose output is no larger than its
#: inputs (ConstantOfShape is checked apart: its output's size is its input's product)
FOLDABLE_OPS = frozenset({"Constant", "ConstantOfShape", "Identity", "Cast", "Add", "Sub", "Mul", "Div", "Mod", "Neg",
                          "Abs", "Min", "Max", "Equal", "Less", "Greater", "Not", "And", "Or", "Where", "Concat", "Gather",
                          "Slice", "Squeeze", "Unsqueeze", "Reshape", "Shape"})


def folded_ints(g: Any, name: str, opsets: Any = None,
                shapes: dict[str, tuple[int, ...] | None] | None = None) -> list[int] | None:
    """The values of a small integer tensor computed from constants only (e.g. the target
    shape of an ``Expand``), by ONNX's own reference evaluator on the few nodes that make it;
    ``None`` when it depends on an input, needs more than :data:`MAX_FOLDED_NODES` nodes, reads
    an initializer of more than 64 elements, or fails to evaluate. ``opsets``: the model's
    ``opset_import`` (the nodes run under their own opset's definitions). ``shapes``: tensors'
    inferred static shapes; a ``Shape`` of one of them is its (constant) shape."""
    direct = const_ints(g, name)
    if direct is not None:
        return direct
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    producer = {o: n for n in g.node for o in n.output if o}
    inits = {t.name: t for t in g.initializer}
    need, todo, seen = [], [name], set()
    while todo:
        t = todo.pop()
        if t in seen or t == "":
            continue
        seen.add(t)
        if t in inits:
            if math.prod(inits[t].dims) > 64 or is_external(inits[t]):
                return None
            continue
        n = producer.get(t)
        if n is None or len(need) >= MAX_FOLDED_NODES or n.op_type not in FOLDABLE_OPS:
            return None  # (a graph input, a value read from one, or an op that may grow a tensor)
        if any(x.type == 4 and is_external(x.t) for x in n.attribute):  # (4: a tensor attribute)
            return None
        if n.op_type == "ConstantOfShape":  # (a 64-element shape of 10^9: never evaluated)
            dims = folded_ints(g, n.input[0], opsets, shapes) if n.input else []
            if dims is None or math.prod(dims) > 64 or min(dims, default=0) < 0:
                return None
        if n.op_type == "Shape":
            known = (shapes or {}).get(n.input[0])
            if known is None:
                return None
            a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
            dims = list(known)[a.get("start", 0):a["end"] if "end" in a else None]
            n = helper.make_node("Constant", [], [t], value=helper.make_tensor(t + "#shape", 7, [len(dims)], dims))
            need.append(n)
            continue
        need.append(n)
        todo.extend(n.input)
    order = {o: k for k, n in enumerate(g.node) for o in n.output}
    nodes = sorted(need, key=lambda n: order.get(n.output[0], -1))
    used = [inits[t] for t in seen if t in inits]
    try:
        sub = helper.make_model(helper.make_graph(nodes, "folded", [], [helper.make_tensor_value_info(name, 7, None)],
                                                  used), opset_imports=list(opsets or []) or None)
        value = ReferenceEvaluator(sub).run(None, {})[0]
    except Exception:  # (an op the reference evaluator lacks, or a malformed node: not foldable here)
        return None
    if value.size > 64 or value.dtype.kind not in "iu":
        return None
    return [int(v) for v in value.reshape(-1)]


#: passes of :func:`fold_shape_inputs` and shape inference (a folded shape can make the next
#: one's ``Shape`` input known: TorchScript's attention reshapes chain a few)
MAX_FOLD_ROUNDS = 4


def fold_shape_inputs(model: Any) -> int:
    """Replace the shape operand of each ``Reshape`` / ``Expand`` whose output ONNX's shape
    inference left unknown by an initializer, when :func:`folded_ints` can compute it (a shape
    made from constants and known static shapes: TorchScript's ``view`` and ``expand``). Returns
    how many were folded; run shape inference again after it."""
    from onnx import helper

    g = model.graph
    known: dict[str, tuple[int, ...] | None] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            known[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    for t in g.initializer:
        known[t.name] = tuple(t.dims)
    folded = 0
    for n in g.node:
        if n.op_type not in ("Reshape", "Expand") or len(n.input) < 2 or not n.output or n.output[0] in known:
            continue
        if known.get(n.input[0]) is None or const_ints(g, n.input[1]) is not None:
            continue
        value = folded_ints(g, n.input[1], model.opset_import, known)
        if value is None:
            continue
        name = f"{n.output[0]}#folded_shape"
        g.initializer.append(helper.make_tensor(name, 7, [len(value)], value))
        n.input[1] = name
        folded += 1
    return folded
