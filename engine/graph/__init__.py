"""``OpGraph``: operators joined by tensor edges, validated, with array and networkx views.

An operator reads tensors produced by earlier operators (a :class:`TensorRef` names the
producer and which of its outputs) and produces one or more tensors. Operators in the same
``param_group`` share one set of parameters (an unrolled LSTM's steps, a language model's
tied input and output embeddings); the group's parameters are counted and synchronised once.

Graphs are built with :class:`GraphBuilder` (shapes are inferred as each op is added, so a
mistake fails at the line that made it) or loaded from a ``soapbox.model/1`` file by
:func:`engine.formats.load_model`, which reports every problem at once.
"""


from __future__ import annotations

from .blocks import layer_blocks
from .building import GraphBuilder, check_model_size, check_param_groups, graph_from_dict
from .core import MAX_MODEL_BYTES, MAX_MODEL_FLOPS, MAX_OPS, PRECISIONS, Op, OpGraph, TensorRef

__all__ = ["TensorRef", "Op", "OpGraph", "GraphBuilder", "PRECISIONS", "MAX_OPS", "MAX_MODEL_BYTES",
           "MAX_MODEL_FLOPS", "graph_from_dict", "check_param_groups", "check_model_size", "layer_blocks"]
