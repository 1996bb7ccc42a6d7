"""Routing loads of mixture-of-experts layers: how many tokens each expert and each
expert-parallel rank receives, and how much the busiest rank gates a step.

Published MoE training runs are balanced: Megatron-Core's and Megatron-Bridge's performance
tables are measured with forced-balanced routing (``--moe-router-force-load-balancing``) or
with balancing losses that keep every expert near its share, and the simulator's default is
that balance (every expert gets ``tokens x top_k / experts`` token copies). A real run is not:
the routing-imbalance what-if states a distribution of tokens over experts, either a skew
(Zipf's law over the experts, exponent ``skew``: 0 is uniform) or a measured histogram, and
the simulator prices every expert-parallel rank at the busiest rank's load, because the
dispatch's all-to-all waits for the slowest rank (Lepikhin et al., GShard 2020 §2.2; Fedus et
al., Switch Transformer 2022 §2.2: "the slowest expert gates the step").

Experts are placed on ranks in order (rank r holds experts r*E/ep .. (r+1)*E/ep - 1), as
Megatron-Core places them (``local_expert_indices``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["expert_loads", "rank_loads", "gate_factor", "active_parameters", "expert_split", "moe_layout_problem",
           "expert_counts", "MAX_SKEW", "MAX_HISTOGRAM_EXPERTS"]

#: the largest Zipf exponent the what-if takes (at 4 the busiest of 8 experts has 92% of the tokens)
MAX_SKEW = 4.0
#: the most experts a histogram may list
MAX_HISTOGRAM_EXPERTS = 4096


def expert_loads(num_experts: int, skew: float = 0.0, histogram: Sequence[float] | None = None) -> np.ndarray:
    """[expert] share of the routed token copies each expert receives (sums to 1).

    ``histogram``: measured token counts per expert (any scale; normalised), which wins over
    ``skew``; else Zipf's law with exponent ``skew`` over experts in rank order (expert i gets
    a share proportional to 1 / (i + 1)^skew; 0 is balanced).

    >>> expert_loads(4).tolist()
    [0.25, 0.25, 0.25, 0.25]
    >>> [round(float(x), 3) for x in expert_loads(4, 1.0)]
    [0.48, 0.24, 0.16, 0.12]

    Raises
    ------
    ValueError
        A histogram of the wrong length, with a negative or non-finite count, or all zero; a
        skew outside 0..MAX_SKEW.
    """
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive integer, got {num_experts!r}")
    if histogram is not None:
        h = np.asarray(histogram, dtype=np.float64)
        if h.ndim != 1 or h.size != num_experts:
            raise ValueError(f"the routing histogram lists {h.size} experts; the model has {num_experts}")
        if not np.all(np.isfinite(h)) or (h < 0).any():
            raise ValueError("the routing histogram's token counts must be finite and non-negative")
        if h.sum() <= 0:
            raise ValueError("the routing histogram's token counts are all zero")
        return h / h.sum()
    if not isinstance(skew, (int, float)) or isinstance(skew, bool) or not 0 <= skew <= MAX_SKEW:
        raise ValueError(f"the routing skew must be a number from 0 (balanced) to {MAX_SKEW:g}, got {skew!r}")
    w = 1.0 / np.arange(1, num_experts + 1, dtype=np.float64) ** float(skew)
    return w / w.sum()


def rank_loads(loads: np.ndarray, ep: int) -> np.ndarray:
    """[rank] share of the token copies each of ``ep`` expert-parallel ranks receives (its
    experts' shares summed; experts placed in order)."""
    loads = np.asarray(loads, dtype=np.float64)
    if ep < 1 or loads.size % ep:
        raise ValueError(f"ep {ep} does not divide the {loads.size} experts")
    return loads.reshape(ep, -1).sum(axis=1)


def gate_factor(loads: np.ndarray | None, ep: int) -> float:
    """How much longer the busiest of ``ep`` ranks works than a balanced rank: max rank load x
    ep (1 when balanced, or ``loads`` is None; ep when one rank receives everything).

    >>> gate_factor(expert_loads(4, 1.0), 2)
    1.44
    """
    if loads is None or ep <= 1:
        return 1.0
    return round(float(rank_loads(loads, ep).max() * ep), 12)


def active_parameters(graph) -> int:
    """Parameters one token passes through: every op's, but of each ``experts`` op only the
    share top_k / experts (the routed experts a token visits; shared experts are ordinary
    MLPs and count whole). Mixtral 8x7B: 12.9 B of 46.7 B (Jiang et al. 2024 §2)."""
    total = 0.0
    for op in graph.ops:
        n = sum(p.numel for p in op.params)
        if op.kind == "experts":
            n = n * op.attrs["top_k"] / op.attrs["num_experts"]
        total += n
    return int(round(total))


def expert_counts(graph) -> set[int]:
    """The expert counts of a graph's mixture-of-experts layers (empty for a dense model)."""
    return {op.attrs["num_experts"] for op in graph.ops if op.kind == "experts"}


def expert_split(tp: int, cp: int, dp: int, ep: int, etp: int) -> tuple[int, int]:
    """(ep_s, ep_l): how ``ep`` expert-parallel ranks fold onto the attention's token shards,
    ``ep_s`` over data-parallel ranks (whole samples) and ``ep_l`` over the sequence shards of
    the context- and tensor-parallel ranks (under sequence parallelism each of the tp ranks
    holds 1/tp of the sequence; an expert-tensor-parallel group of ``etp`` ranks shares one
    shard). Megatron-Core ranks expert-parallel groups etp fastest, then ep, then edp
    (``parallel_state.initialize_model_parallel``'s expert rank generator), so on the token
    shards in rank order ep takes the sequence shards first, then samples.

    >>> expert_split(2, 1, 64, 64, 1), expert_split(2, 1, 16, 32, 1), expert_split(8, 1, 8, 4, 2)
    ((32, 2), (16, 2), (1, 4))

    Raises
    ------
    ValueError
        When ep neither divides the sequence shards nor is a multiple of them that divides
        the data-parallel ranks too.
    """
    shards = cp * tp // etp
    if ep <= shards:
        if shards % ep:
            raise ValueError(f"ep {ep} does not divide the {shards} sequence shards (cp {cp} x tp {tp} / etp {etp}) "
                             "it folds onto")
        return 1, ep
    if ep % shards or dp % (ep // shards):
        raise ValueError(f"ep {ep} does not fold onto dp {dp} x {shards} sequence shards (cp {cp} x tp {tp} / etp "
                         f"{etp}): it must divide them or be a multiple of the shards that divides dp")
    return ep // shards, shards


def moe_layout_problem(graph, tp: int, cp: int, dp: int, ep: int, etp: int, sequence_parallel: bool) -> str | None:
    """Why expert parallelism ``ep`` with expert tensor parallelism ``etp`` cannot lay out
    ``graph``'s mixture-of-experts layers on a (tp, cp, dp) mesh per stage, or None (Megatron-
    Core's rules, ``megatron/training/arguments.py``: experts divisible by ep; tensor
    parallelism with MoE needs sequence parallelism)."""
    counts = expert_counts(graph)
    if not counts:
        if ep > 1 or etp > 1:
            return (f"ep {ep}, etp {etp}: expert parallelism needs a mixture-of-experts model; {graph.name!r} has "
                    "no experts")
        return None
    bad = sorted(n for n in counts if n % ep)
    if bad:
        return f"ep {ep} does not divide the {bad[0]} experts of {graph.name!r}"
    if tp > 1 and not sequence_parallel:
        return (f"tp {tp} with mixture-of-experts layers needs sequence parallelism (Megatron-LM's rule: the "
                "experts read each rank's sequence shard)")
    if tp % etp:
        return f"etp {etp} must divide tp {tp} (the expert tensor-parallel group sits inside the tensor-parallel one)"
    widths = sorted({op.attrs["ffn_hidden"] for op in graph.ops if op.kind == "experts"})
    if any(w % etp for w in widths):
        return f"etp {etp} does not divide the experts' FFN width {widths[0]}"
    try:
        expert_split(tp, cp, dp, ep, etp)
    except ValueError as e:
        return str(e)
    return None
