"""Layer blocks: the numbered repeated blocks of a model (``layers.0``, ``encoder.3``, ...), in
order, which pipeline stages split and which the views stack."""

from __future__ import annotations

import re

from .core import OpGraph

__all__ = ["layer_blocks"]

_LAYER_RE = re.compile(r"^(?:.*\.)?\d+$")


def layer_blocks(graph: OpGraph) -> list[str]:
    """The numbered layer blocks (``layers.0``, ``encoder.3``, ...) in order: what pipeline
    stages split."""
    layers: list[str] = []
    for op in graph.ops:
        if op.block and _LAYER_RE.match(op.block) and op.block not in layers:
            layers.append(op.block)
    return layers
