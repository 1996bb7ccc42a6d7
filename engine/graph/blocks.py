"""Layer blocks: the numbered repeated blocks of a model (``layers.0``, ``encoder.3``, ...), in
order, which pipeline stages split and which the views stack."""

from __future__ import annotations

import re

from .core import OpGraph

__all__ = ["layer_blocks"]

_LAYER_RE = re.compile(r"^(?:.*\.)?\d+$")


def layer_blocks(graph: OpGraph) -> list[str]:
    """The numbered layer blocks (``layers.0``, ``encoder.3``, ...) in order: what pipeline
    stages split. Found once per graph (a graph's ops do not change) and copied out."""
    found = graph.__dict__.get("_layer_blocks")
    if found is None:
        seen: dict[str, None] = {}
        for op in graph.ops:
            b = op.block
            if b and b not in seen and _LAYER_RE.match(b):
                seen[b] = None
        found = graph.__dict__["_layer_blocks"] = tuple(seen)
    return list(found)
