"""Shared (tied) weights in an ONNX graph, for the importer (:mod:`engine.models.onnx_import`).

A language model's output layer often reuses its token embedding (GPT-2, BERT's masked-LM
decoder). The exporters write that tie in one of three ways:

- one initializer read by both the ``Gather`` (the lookup) and a ``Gemm`` / ``MatMul``
  (torch's dynamo exporter; also any weight read twice);
- a ``Transpose`` (or ``Identity`` / ``Cast``) of the table feeding the ``MatMul``, folded
  as a constant by the importer;
- a second initializer holding the table's transpose, already folded by the exporter
  (torch's TorchScript exporter: ``onnx::MatMul_538`` of shape (H, V) beside ``wte`` (V, H)).

The first two are found from the graph; the third by comparing the two tensors' values
(only the pairs of a lookup table (V, H) and a GEMM weight (H, V) or (V, H) of the same
element type; a table of all zeros equal to a zero weight would be taken for a tie).
Every tie becomes one soapbox ``param_group``, so the parameters are counted once.

Precondition not checked: weights equal in value are one tensor to the file. The dynamo
exporter itself merges initializers of equal values, so an untrained model whose layers are
copies of one another (``nn.TransformerEncoder`` deep-copies its layer) is imported with those
layers tied; export a trained (or re-initialised) model.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

__all__ = ["find_ties", "const_ints"]

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


def const_ints(g: Any, name: str) -> list[int] | None:
    """The values of a small integer constant (an initializer or a ``Constant`` node's
    output, at most 64 elements; ``None`` when ``name`` is neither)."""
    from onnx import helper, numpy_helper

    for t in g.initializer:
        if t.name == name:
            if len(t.dims) > 1 or (t.dims and t.dims[0] > 64) or t.data_type not in (6, 7):
                return None
            return [int(v) for v in numpy_helper.to_array(t).reshape(-1)]
    for node in g.node:
        if node.op_type == "Constant" and node.output and node.output[0] == name:
            for a in node.attribute:
                if a.name == "value":
                    arr = numpy_helper.to_array(a.t)
                    return [int(v) for v in arr.reshape(-1)] if arr.size <= 64 and arr.dtype.kind == "i" else None
                if a.name in ("value_ints", "value_int"):
                    v = helper.get_attribute_value(a)
                    return [int(x) for x in (v if isinstance(v, list) else [v])]
    return None
