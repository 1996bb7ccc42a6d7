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


def expert_counts(graph) -> frozenset[int]:
    """The expert counts of a graph's mixture-of-experts layers (empty for a dense model; read
    once per graph: :attr:`engine.graph.OpGraph.expert_counts`)."""
    return graph.expert_counts


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


# --------------------------------------------------------------------------- the expert view


__all__ += ["expert_degrees", "ExpertTable", "expert_table", "parse_histogram", "MAX_HISTOGRAM_BYTES"]

from dataclasses import dataclass  # noqa: E402  (this section was added after the rest)

#: the largest routing-histogram file read (a count per expert, MAX_HISTOGRAM_EXPERTS of them)
MAX_HISTOGRAM_BYTES = 1 << 20


def expert_degrees(graph, strategy) -> tuple[int, int]:
    """(ep, etp) of ``strategy``'s first ``experts`` op: the product of its expert dims'
    degrees (``expert`` x ``expert_seq``) and its ``ffn`` degree; (1, 1) for a dense model."""
    from .ops import EXPERT

    op = next((o for o in graph.ops if o.kind == "experts"), None)
    if op is None:
        return 1, 1
    cfg = strategy.configs[op.name]
    ep = int(np.prod([cfg.degree(d.name) for d in op.dims if d.kind == EXPERT]))
    return ep, int(cfg.degree("ffn"))


@dataclass(frozen=True)
class ExpertTable:
    """Who holds which experts and how many routed token copies each expert-parallel rank
    receives in one microbatch of one mixture-of-experts layer (:func:`expert_table`).

    ``tokens_per_microbatch``: the routed token copies (tokens x top_k) one expert-parallel
    group shares out per microbatch and layer; ``rank_tokens`` [rank] each rank's part of
    them; ``gate``: the busiest rank's load over the mean (:func:`gate_factor`)."""

    layer: str  #: the first experts op (every MoE layer of the sample models is alike)
    layers: int  #: experts ops in the model
    num_experts: int
    top_k: int
    ep: int
    etp: int
    microbatches: int
    tokens_per_microbatch: float
    rank_experts: tuple[tuple[int, int], ...]  #: [rank] (first, last) expert held
    rank_shares: tuple[float, ...]  #: [rank] share of the routed copies
    rank_tokens: tuple[float, ...]  #: [rank] routed copies received per microbatch
    gate: float
    balanced: bool  #: no routing what-if (``strategy.expert_loads`` is None)

    def to_dict(self) -> dict:
        """JSON-ready: the fields, the tuples as lists."""
        return {k: (list(map(list, v)) if k == "rank_experts" else list(v) if isinstance(v, tuple) else v)
                for k, v in self.__dict__.items()}


def expert_table(graph, strategy) -> ExpertTable | None:
    """The expert view of ``strategy`` on ``graph``'s first mixture-of-experts layer (None
    for a dense model): per expert-parallel rank its experts (placed in order), its share of
    the routed tokens (``strategy.expert_loads``, else balanced) and the copies it receives
    per microbatch, and the gate the busiest rank sets.

    Tokens: the layer's input tokens (every axis but the hidden one) over the microbatches
    and the expert data-parallel groups (tp x cp x dp / (ep x etp) on a stage, each with its
    own tokens), times top_k. Copies over an expert's capacity (``capacity_factor``) are
    counted as received; the simulator drops them from the compute.
    """
    ops = [o for o in graph.ops if o.kind == "experts"]
    if not ops:
        return None
    op = ops[0]
    cfg = strategy.configs[op.name]
    ep, etp = expert_degrees(graph, strategy)
    n, top_k = int(op.attrs["num_experts"]), int(op.attrs["top_k"])
    x = op.in_tensors[0]
    m = max(1, int(strategy.pipeline.microbatches))
    tokens = float(np.prod(x.shape[:-1])) / (m if "sample" in x.axes else 1)
    edp = max(1, len(cfg.devices) // (ep * etp))
    copies = tokens / edp * top_k
    loads = None if strategy.expert_loads is None else expert_loads(n, histogram=strategy.expert_loads)
    shares = rank_loads(loads if loads is not None else expert_loads(n), ep)
    per = n // ep
    return ExpertTable(op.name, len(ops), n, top_k, ep, etp, m, copies,
                       tuple((r * per, (r + 1) * per - 1) for r in range(ep)),
                       tuple(float(s) for s in shares), tuple(float(s * copies) for s in shares),
                       gate_factor(loads, ep), loads is None)


def parse_histogram(text: str, source: str = "<histogram>") -> list[float]:
    """Token counts per expert from text, as the CLI's ``--routing-histogram`` and the
    explorer's upload both read them: a JSON list (``[120, 80, ...]``); a JSON object holding
    that list under ``counts``, ``tokens_per_expert`` or ``histogram``; numbers one a line or
    separated by commas, semicolons or spaces; or a CSV table whose first line is a header (text,
    not numbers), of which each row's last cell is read (``expert,tokens`` then ``0,120`` ...).
    Blank lines and ``#`` comments are skipped (outside JSON). Never evaluated: each count must
    read as a plain decimal number.

    >>> parse_histogram("[3, 1.5]"), parse_histogram("# layer 7\\n3\\n1e2\\n"), parse_histogram("1,2;3 4")
    ([3.0, 1.5], [3.0, 100.0], [1.0, 2.0, 3.0, 4.0])
    >>> parse_histogram('{"counts": [4, 2]}'), parse_histogram("expert,tokens\\n0,10\\n1,30")
    ([4.0, 2.0], [10.0, 30.0])

    Raises
    ------
    ValueError
        One line naming ``source`` and the line (in a JSON object: the item): text of more
        than MAX_HISTOGRAM_BYTES characters, invalid JSON, no counts, text that is not a
        number, a negative or non-finite count, more than MAX_HISTOGRAM_EXPERTS counts, every
        count zero.
    """
    import json
    import math
    import re

    class Literal(str):
        """A JSON number's (or NaN's) source text, to be read as a token is."""

    number = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
    forms = "give one count per expert: a JSON list, one a line, or separated by commas or spaces"
    counts: list[float] = []

    def add(tok: object, where: str) -> None:
        shown = tok if isinstance(tok, str) else "[...]" if isinstance(tok, list) else \
            "{...}" if isinstance(tok, dict) else json.dumps(tok)
        shown = shown if len(shown) <= 30 else shown[:30] + "..."
        if not isinstance(tok, str) or not number.fullmatch(tok):
            raise ValueError(f"{where}: {shown!r} is not a token count (a number such as 1200 or 3.5e4; {forms})")
        v = float(tok)
        if not math.isfinite(v):
            raise ValueError(f"{where}: {shown!r} is too large a token count")
        if v < 0:
            raise ValueError(f"{where}: {shown!r}: a token count cannot be negative")
        counts.append(v)
        if len(counts) > MAX_HISTOGRAM_EXPERTS:
            raise ValueError(f"{where}: more than {MAX_HISTOGRAM_EXPERTS:,} token counts (one per expert)")

    if len(text) > MAX_HISTOGRAM_BYTES:  # (a file within the CLI's byte cap is within this one)
        raise ValueError(f"{source}: the text is larger than the limit of {MAX_HISTOGRAM_BYTES / 2**20:g} MiB "
                         f"({len(text):,} characters; {MAX_HISTOGRAM_EXPERTS:,} counts are far fewer)")
    text = text[1:] if text.startswith("\ufeff") else text  # (a byte-order mark, as spreadsheets write)
    body = text.strip()
    if body.startswith("{"):
        try:
            data = json.loads(text, parse_int=Literal, parse_float=Literal, parse_constant=Literal)
        except RecursionError:
            raise ValueError(f"{source}: not valid JSON (nested too deeply)") from None
        except ValueError as e:
            msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            where = f" at line {e.lineno}, column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
            raise ValueError(f"{source}: not valid JSON ({msg[:80]}{where})") from None
        key = next((k for k in ("counts", "tokens_per_expert", "histogram") if k in data), None)
        if key is None:
            raise ValueError(f"{source}: a JSON object needs a 'counts' list (token counts per expert; "
                             "'tokens_per_expert' or 'histogram' are read too)")
        if not isinstance(data[key], list):
            raise ValueError(f"{source}: {key!r} must be a list of token counts, one per expert")
        for i, v in enumerate(data[key], 1):
            add(v if isinstance(v, Literal) else json.dumps(v) if isinstance(v, str) else v,
                f"{source}, item {i} of {key!r}")
    else:
        bracketed = body.startswith("[")
        if bracketed:
            if not body.endswith("]"):
                raise ValueError(f"{source}: not valid JSON (a JSON list must end with ']')")
            text = text.replace("[", " ", 1)[::-1].replace("]", " ", 1)[::-1]
        rows = []  # [row] (line number, cells)
        for line_no, line in enumerate(text.splitlines(), 1):
            cells = re.split(r"[,;\s]+", line if bracketed else line.split("#", 1)[0])
            if any(cells):
                rows.append((line_no, [c for c in cells if c]))
            if len(rows) > MAX_HISTOGRAM_EXPERTS + 1:  # (enough to find the first problem, a header aside)
                break

        def readable(cell: str) -> bool:  # (float() reads nan, inf and 1_000: a header has none of them)
            try:
                float(cell)
            except ValueError:
                return False
            return True

        header = (not bracketed and len(rows) > 1 and re.search(r"[A-Za-z]", " ".join(rows[0][1])) is not None
                  and not any(readable(c) for c in rows[0][1]))
        for line_no, cells in rows[1:] if header else rows:
            for tok in cells[-1:] if header else cells:
                add(tok, f"{source}, line {line_no}")
    if not counts:
        raise ValueError(f"{source}: no token counts ({forms})")
    if not any(counts):
        raise ValueError(f"{source}: the token counts are all zero (at least one expert must receive tokens)")
    return counts
