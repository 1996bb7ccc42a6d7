"""Which ops the coordinate descent (:mod:`engine.search.polish`) visits and in which order:
the most parameters for their compute first (:func:`visit_order`), one op of each class of
alike ops before the twins (:func:`alike_classes`, :func:`distinct_first`), and how many GPUs
each op's pipeline stage spans (:func:`stage_spans`, the first rounds' candidates)."""

from __future__ import annotations

import math

from ..graph import OpGraph
from ..strategy import Strategy

__all__ = ["visit_order", "param_share", "alike_classes", "distinct_first", "stage_spans"]


def visit_order(graph: OpGraph) -> list[str]:
    """The ops with parameters, those with the most parameters for their compute first (by
    :func:`param_share`: powers of two), most parameters first within a power, then every other
    op in graph order (ties keep graph order).

    Krizhevsky's "one weird trick" (arXiv:1404.5997, §2) decides data against model parallelism
    per layer by that ratio: a layer whose parameters outweigh its compute gains most from not
    replicating them. A lookup (an embedding: rows gathered, next to no arithmetic) comes first,
    fully connected and recurrent layers (about 1 / (2 x batch) parameters a flop) next, then
    convolutions (1 / (2 x batch x pixels)). The lookups' visits are also the cheapest while the
    strategy is still small: on NMT / ``k80-16x4`` from data parallelism, the 40 output ops' class
    move first (the most parameters, by their bias) grew the graph to about a million tasks and the
    embeddings' single-op candidates after it cost 0.4 s each instead of 0.04 s; visiting the
    embeddings first reached the best-known 70.02 ms at 12.8 s instead of 27.9 s (issue 43).

    >>> from engine.graph import GraphBuilder
    >>> b = GraphBuilder("t"); x = b.input("x", [4, 8])
    >>> y = b.add("linear", "small", [x], out_features=2); z = b.add("linear", "big", [y], out_features=64)
    >>> visit_order(b.build())
    ['big', 'small', 'x']
    """
    index = {op.name: i for i, op in enumerate(graph.ops)}
    weighted = sorted((op for op in graph.ops if op.param_count),
                      key=lambda op: (-param_share(op), -op.param_count, index[op.name]))
    return [op.name for op in weighted] + [op.name for op in graph.ops if not op.param_count]


def param_share(op) -> float:
    """The power of two of ``op``'s parameters per flop of its forward and backward passes (a
    whole batch), rounded down; infinite for an op with parameters and no flops (a lookup).

    >>> from engine.formats import resolve_model
    >>> g = resolve_model("nmt")
    >>> [param_share(g[n]) for n in ("encoder.embedding", "decoder.t0.logits", "encoder.l0.t0")]
    [inf, -9, -9]
    """
    flops = op.fwd_flops + op.bwd_flops
    return math.inf if flops <= 0 else math.floor(math.log2(op.param_count / flops))


def alike_classes(graph: OpGraph) -> dict[str, tuple[str, ...]]:
    """Op name -> the ops alike to it, in graph order: the same :attr:`~engine.graph.Op.signature`
    (kind, shapes, attributes) and parameter group, as the time steps of an unrolled RNN (which
    share their weights); only ops with at least one such twin.

    >>> from engine.formats import resolve_model
    >>> alike_classes(resolve_model("rnnlm"))["output.t3.logits"][:2]
    ('output.t0.logits', 'output.t1.logits')
    """
    groups: dict[tuple, list[str]] = {}
    for op in graph.ops:
        groups.setdefault((op.signature, op.param_group), []).append(op.name)
    classes = [tuple(names) for names in groups.values() if len(names) > 1]
    return {name: members for members in classes for name in members}


def distinct_first(order: list[str], classes: dict[str, tuple[str, ...]]) -> list[str]:
    """``order`` with each class of alike ops (:func:`alike_classes`) kept at its first member
    and its other members moved after every op that is first of its class or has no twin (in
    ``order``'s order), the twins last in ``order`` first: a round reaches every distinct op
    before the twins. RNNTC's 156 LSTM steps fall in 4 classes; its classifier and input split,
    visited 161st and 164th in :func:`visit_order`, gave the descent from auto's 4.45 ms plan
    4.31 -> 4.15 ms at 34-40 s of a first round (issue 43).

    The twins come last first because the time steps of an unrolled recurrence nearest its
    output are where a single step's move pays; measured, not derived (issue 43, eighteenth
    round; 15 s descents, the twins in ``order``'s order against reversed): RNNTC /
    dgx-a100-40gb:8 from FlexFlow's expert strategy 4.278 -> 3.866 ms (``lstm.l2.t39`` split by
    its features, 108th candidate, where the graph order reached that cost at the 1,054th,
    46.6 s in), RNNTC / p100-4x4 26.645 -> 25.481 ms from either start; RNNLM within
    0.5% either way, NMT, ResNet-101 and Inception-v3 the same plans (Inception-v3 / p100-4x4
    lands on 29.29 or 29.40 ms in either order, by timing). Longer, it can cost: a 150 s descent
    on NMT / p100-4x4 from the expert strategy ended at 40.18 ms reversed, 39.81 in order.

    >>> distinct_first(["a1", "b", "a2", "c", "a3"], {"a1": ("a1", "a2", "a3"), "a2": ("a1", "a2", "a3"),
    ...                                              "a3": ("a1", "a2", "a3")})
    ['a1', 'b', 'c', 'a3', 'a2']
    """
    seen: set[tuple[str, ...]] = set()
    first, rest = [], []
    for name in order:
        members = classes.get(name)
        if members is not None and members in seen:
            rest.append(name)
        else:
            first.append(name)
            if members is not None:
                seen.add(members)
    return first + rest[::-1]


def stage_spans(graph: OpGraph, strategy: Strategy) -> dict[str, int]:
    """Op name -> how many GPUs its pipeline stage uses (the union of its stage's ops'
    devices); empty without a pipeline. The descent's first rounds try the candidates that span
    an op's whole stage: with a pipeline none spans the cluster, and those rounds tried nothing
    (ResNet-101 / k80-16x4, 4 stages of 16 GPUs, issue 43)."""
    p = max(1, strategy.pipeline.stages)
    if p == 1:
        return {}
    used: dict[int, set[int]] = {}
    stage = {op.name: strategy.stage_of.get(op.name, 0) % p for op in graph.ops}
    for op in graph.ops:
        used.setdefault(stage[op.name], set()).update(strategy[op.name].devices)
    return {name: len(used[st]) for name, st in stage.items()}
