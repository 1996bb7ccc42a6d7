"""What an ONNX import's node walk (:mod:`engine.models.onnx_import`) shares with the
converters (:mod:`engine.models.onnx_convert`): the import's state (:class:`ImportState`), one
node as the converters read it (:class:`OnnxNode`), op names (:func:`clean_name`), and adding an
op for a node with its shape checked against ONNX's (:func:`emit`)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import Problem, ValidationError
from ..graph import GraphBuilder, TensorRef
from ..graph.blocks import block_of_scopes
from ..ops import OpError

__all__ = ["ImportState", "OnnxNode", "Unmapped", "clean_name", "emit", "module_block"]


class Unmapped(Exception):
    """An ONNX node with no soapbox op (listed, or imported as elementwise)."""


@dataclass
class ImportState:
    """What the node walk and the converters share. ``g``: the ONNX ``GraphProto`` after shape
    inference; ``b``: the model being built; ``fail(where, message)``: the import's
    :class:`ValidationError`; ``shapes`` / ``partial`` / ``elem``: each tensor's static shape
    (``None`` when unknown), its shape with -1 for unknown axes, its element type; ``inits``:
    each initializer's shape; ``groups`` / ``table_groups``: :func:`find_ties`' param groups;
    ``data_shape``: the first data input's shape; ``max_ops``: the most operators to add."""

    g: Any
    b: GraphBuilder
    fail: Callable[[str, str], ValidationError]
    shapes: dict[str, tuple[int, ...] | None]
    partial: dict[str, tuple[int, ...]]
    elem: dict[str, int]
    inits: dict[str, tuple[int, ...]]
    groups: dict[str, str]
    table_groups: set[str]
    data_shape: tuple[int, ...]
    max_ops: int | None
    ref: dict[str, TensorRef] = field(default_factory=dict)  # ONNX tensor -> soapbox output
    const: set[str] = field(default_factory=set)  # tensors known without running the model (weights, shapes)
    used: set[str] = field(default_factory=set)  # soapbox op names taken
    nodes: list = field(default_factory=list)
    consumers: Counter = field(default_factory=Counter)
    groups_or_tables: set[str] = field(default_factory=set)
    problems: list[Problem] = field(default_factory=list)
    unmapped: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    weights: set[str] = field(default_factory=set)  # float initializers read as constant operands of elementwise ops
    dead: set[str] = field(default_factory=set)  # outputs of unmapped ops (error mode: listed, then skipped)
    const_ids: list[str] = field(default_factory=list)  # embeddings looked up by constant ids
    folded_add: dict[int, str] = field(default_factory=dict)  # node index of an Add folded into the linear before it
    added: int = 0  # operators added to the builder (for max_ops)

    @property
    def data_batch(self) -> int | None:
        """The first data input's first axis (its batch), if it has a known shape."""
        return self.data_shape[0] if self.data_shape else None


@dataclass
class OnnxNode:
    """One node as the converters read it: its index ``k``, the ``NodeProto``, ``where`` (as
    errors name it), its op type, its non-empty inputs ``ins`` and those not constant
    (``acts``), its first output ``out`` and that output's shape, and its soapbox name ``nm``."""

    k: int
    node: Any
    where: str
    op: str
    ins: list[str]
    acts: list[str]
    out: str
    oshape: tuple[int, ...] | None
    nm: str


def clean_name(name: str, k: int, op_type: str, used: set[str]) -> str:
    """A soapbox op name made from an ONNX name (the node's index and op type when it has none),
    not in ``used`` (then added to it)."""
    base = re.sub(r"[^A-Za-z0-9_.\-]+", ".", name).strip(".")[:200] or f"{op_type.lower()}_{k}"
    out, j = base, 1
    while out in used:
        j += 1
        out = f"{base}.{j}"
    used.add(out)
    return out


def emit(s: ImportState, n: OnnxNode, kind: str, inputs: list[str], name: str | None = None, **attrs: Any) -> None:
    """Add the soapbox op ``kind`` for node ``n``, reading the ONNX tensors ``inputs``: counted
    against ``max_ops``, named ``name`` or the node's name, each output's shape checked against
    ONNX's inference."""
    s.added += 1
    if s.max_ops is not None and s.added > s.max_ops:
        raise s.fail("graph", f"more than {s.max_ops:,} operators, the most a model may have here")
    try:
        r = s.b.add(kind, name or n.nm, [s.ref[i] for i in inputs], **attrs)
    except (OpError, ValueError) as e:
        raise s.fail(n.where, f"as soapbox {kind}: {e}") from None
    rs = r if isinstance(r, list) else [r]
    for o, rr in zip([o for o in n.node.output if o], rs):
        s.ref[o] = rr
        want = s.shapes.get(o)
        got = s.b.shape_of(rr)
        if want is not None and tuple(got) != tuple(want):
            raise s.fail(n.where, f"soapbox's {kind} gives shape {list(got)}, ONNX infers {list(want)}")


_QUOTED = re.compile(r"'([^']*)'")


def module_block(node: Any) -> str | None:
    """The layer block of an ONNX node, from the module path its exporter recorded
    (:func:`engine.graph.blocks.block_of_scopes`): torch's dynamo exporter's
    ``pkg.torch.onnx.name_scopes`` metadata (a printed list of module paths, read as text,
    never evaluated), or the TorchScript exporter's node name ``/transformer/h.0/attn/Gemm``."""
    scopes = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), None)
    if scopes is not None:
        return block_of_scopes(_QUOTED.findall(scopes[:4096]))
    name = node.name or ""
    if name.startswith("/"):
        parts = [p for p in name.split("/")[1:-1] if p]
        return block_of_scopes([".".join(parts[:k + 1]) for k in range(len(parts))])
    return None
