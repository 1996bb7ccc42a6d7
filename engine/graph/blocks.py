"""Layer blocks: the numbered repeated blocks of a model (``layers.0``, ``encoder.3``, ...), in
order, which pipeline stages split and which the views stack."""

from __future__ import annotations

import re

from .core import OpGraph

__all__ = ["layer_blocks", "block_of_scopes"]

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


def block_of_scopes(scopes: list[str]) -> str | None:
    """The layer block of an op imported from a module path (``scopes``: its enclosing module
    paths, outermost first, e.g. ``["model", "model.transformer", "model.transformer.h.0",
    "model.transformer.h.0.attn"]``): the outermost scope that is a numbered child (a
    ``ModuleList`` or ``Sequential`` entry, ``...h.0``); None outside every numbered module
    (embeddings, the final norm and the head).

    >>> block_of_scopes(["model", "model.layers", "model.layers.3", "model.layers.3.mlp", "model.layers.3.mlp.0"])
    'model.layers.3'
    >>> block_of_scopes(["model", "model.norm"]) is None
    True
    """
    for scope in scopes:
        if scope and _LAYER_RE.match(scope):
            return scope
    return None
