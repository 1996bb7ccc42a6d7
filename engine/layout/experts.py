"""The expert-parallel shapes a mixture-of-experts model may take on one pipeline stage's mesh:
what :func:`engine.layout.valid_layouts` and MCMC's block moves (:mod:`engine.search.moves`)
enumerate beside tp, cp and dp. A dense model has one, (ep 1, etp 1), so its enumeration is
what it was before experts existed.
"""

from __future__ import annotations

import math

from ..graph import OpGraph
from ..moe import expert_counts, expert_split

__all__ = ["expert_shapes", "megatron_eps", "EP_MAX_NODES"]


def expert_shapes(graph: OpGraph, tp: int, cp: int, dp: int) -> list[tuple[int, int]]:
    """The (ep, etp) of ``graph``'s mixture-of-experts layers on a (tp, cp, dp) stage mesh, ep
    then etp ascending; [(1, 1)] for a dense model. Megatron-Core's rules
    (``megatron/training/arguments.py``; :func:`engine.moe.moe_layout_problem`): ep divides
    every layer's experts and folds onto the mesh's ranks (:func:`engine.moe.expert_split`:
    the sequence shards first, then whole samples); etp is 1 (Megatron-Core's advice for
    fine-grained experts) or tp (its default when ``--expert-tensor-parallel-size`` is unset)
    and divides the experts' FFN width. The expert data-parallel degree is the rest,
    tp x cp x dp / (ep x etp).

    >>> from engine.models.moe import MoEConfig, moe_gpt
    >>> expert_shapes(moe_gpt(MoEConfig(2, 64, 4, 64, 100, 8, 4, 2, 64)), 2, 1, 2)
    [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)]
    """
    counts = expert_counts(graph)
    if not counts:
        return [(1, 1)]
    widths = {op.attrs["ffn_hidden"] for op in graph.ops if op.kind == "experts"}
    common = math.gcd(*counts)
    out = []
    for ep in (d for d in range(1, common + 1) if common % d == 0):
        for etp in sorted({1, tp}):
            if not any(w % etp for w in widths) and _folds(tp, cp, dp, ep, etp):
                out.append((ep, etp))
    return out


def _folds(tp: int, cp: int, dp: int, ep: int, etp: int) -> bool:
    """Whether ep x etp folds onto the (tp, cp, dp) ranks (:func:`engine.moe.expert_split`)."""
    try:
        expert_split(tp, cp, dp, ep, etp)
    except ValueError:
        return False
    return True


#: the most nodes an expert-parallel group of :func:`megatron_eps` spans: DeepSeek-V3 trains
#: with "64-way Expert Parallelism (EP) spanning 8 nodes" (DeepSeek-AI 2024 §3.2), and its
#: node-limited routing sends each token to at most 4 of them (§2.1.2)
EP_MAX_NODES = 8


def megatron_eps(graph: OpGraph, gpus_per_node: int, tp: int, cp: int, dp: int) -> list[int]:
    """The expert-parallel degrees (etp 1) published Megatron-style runs take on a (tp, cp, dp)
    stage mesh, ascending: the largest that folds onto one node's GPUs (the all-to-all over
    NVLink: Mixtral's ep 8) and the largest that folds onto at most :data:`EP_MAX_NODES` nodes
    (DeepSeek-V3's ep 64); [1] for a dense model.

    >>> from engine.models.moe import MoEConfig, moe_gpt
    >>> megatron_eps(moe_gpt(MoEConfig(2, 64, 4, 64, 100, 16, 64, 2, 64)), 2, 1, 1, 16)
    [2, 16]
    """
    eps = [ep for ep, etp in expert_shapes(graph, tp, cp, dp) if etp == 1]
    inside = max(e for e in eps if e <= gpus_per_node)
    return sorted({inside, max(e for e in eps if e <= EP_MAX_NODES * gpus_per_node)})
