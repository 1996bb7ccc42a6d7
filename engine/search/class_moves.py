"""What the polish's class moves (:mod:`engine.search.polish`) price for a class of alike ops:
the configs that made its op fastest alone (:func:`class_tries`), and each member reading its
input where its producer left it (:func:`aligned_config`, :func:`aligned_candidate`).

An op split the way its input already is needs no redistribution of that input: the loss split
by the vocabulary under logits split by the vocabulary is Megatron-LM's vocabulary-parallel cross
entropy (Shoeybi et al., arXiv:1909.08053, §3), which spares gathering the logits. Alone, one
such op may gain nothing while its class of alike ops, all aligned, gains much: NMT /
``p100-4x4`` from FlexFlow's expert strategy (65.14 ms), one loss op split by the vocabulary
67.40 ms, all 40 of them 53.53 ms (issue 43).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..graph import OpGraph
from ..strategy import Config, Strategy

__all__ = ["CLASS_TRIES", "class_tries", "aligned_config", "aligned_candidate"]

#: a class move (:meth:`_Descent.class_move`) prices for the whole class the configs that made its
#: op alone fastest, this many of them. RNNLM / dgx-a100-40gb:8 from auto's 9.06 ms plan, the 40
#: ``output.tN.logits`` ops: the best of the 40 tried for the class (7.34 ms, feature 4 x
#: in_feature 8 x sample 2) was 5th for ``output.t20.logits`` alone (8.87 ms), the second best
#: (7.62 ms) 4th; the first three, each the best alone, are worse for the class (issue 43)
CLASS_TRIES = 6


def class_tries(alone: list) -> list:
    """The configs a class move prices for the whole class, from ``alone`` ((time, order,
    config) of its op's configs faster alone than the current strategy): the fastest alone of
    each degree of the batch dim (``sample``), in the order of their times alone, then the
    fastest of the rest, :data:`CLASS_TRIES` in all or one per batch degree if more.

    Why by batch degree: alone, an op's configs differ little and favour what suits its
    neighbours, the rest of its class; moved together, how the class splits the batch decides
    what it exchanges with the ops around it. RNNLM / dgx-a100-40gb:8 from data parallelism
    (12.079 ms), ``output.t20.logits``: the six fastest alone (11.877-11.880 ms) split no batch
    or split it by 2; for the whole class of 40 they give 10.56 ms at best. The fastest alone
    of batch degree 8 (``feature 8 x sample 8``, 11.897 ms, 44th alone) gives 4.862 ms (the best
    known before, a 150 s descent, 5.914 ms; of all 461 configs priced for the class the best
    is 4.639 ms). Measured in issue 43."""
    ranked = sorted(alone, key=lambda a: a[:2])
    firsts: dict[int, tuple] = {}
    for a in ranked:
        firsts.setdefault(a[2].degree("sample"), a)
    picks = list(firsts.values())
    chosen = {id(a) for a in picks}
    picks += [a for a in ranked if id(a) not in chosen][:max(0, CLASS_TRIES - len(picks))]
    return [a[2] for a in picks]


def aligned_candidate(graph: OpGraph, members: tuple[str, ...], strategy: Strategy) -> list[Strategy]:
    """``strategy`` with each of ``members`` given its :func:`aligned_config` (a list of one),
    or no strategy where a member has none or every member has it already."""
    configs = {m: aligned_config(graph, m, strategy) for m in members}
    if any(c is None for c in configs.values()) or all(configs[m] == strategy[m] for m in members):
        return []
    return [replace(strategy, configs={**strategy.configs, **configs}, cost={})]


def aligned_config(graph: OpGraph, name: str, strategy: Strategy) -> Config | None:
    """The config of op ``name`` that splits its first input it can follow (in input order)
    as that input's producer splits it, on the producer's devices in the same grid order;
    None where no input can be followed: a producer unsplit or with a split that leaves partial
    sums or copies (no output axis), or an op with no dim along a split axis, or whose dim
    does not take that degree.

    >>> from engine.formats import resolve_model
    >>> from engine.cluster import preset
    >>> from engine.search.baselines import expert
    >>> g, c = resolve_model("nmt"), preset("p100-4x4")
    >>> s = expert(g, c)
    >>> s["decoder.t0.logits"].degrees["feature"], dict(aligned_config(g, "decoder.t0.loss", s).degrees)
    (16, {'vocab': 16})
    """
    op = graph[name]
    for i, ref in enumerate(op.inputs):
        producer, config = graph[ref.op], strategy.configs[ref.op]
        split = [d for d in producer.dims if config.degree(d.name) > 1]
        if not split or any(d.out_axis is None for d in split):
            continue
        mine = []
        for d in split:
            e = next((e for e in op.dims if not e.is_replica and len(e.in_axes) > i
                      and e.in_axes[i] == d.out_axis and e not in mine), None)
            if e is None or e.degree_problem(config.degree(d.name)):
                break
            mine.append(e)
        else:
            order = sorted(range(len(split)), key=lambda j: op.dims.index(mine[j]))  # (the op's grid order)
            grid = np.asarray(config.devices, np.int64).reshape([config.degree(d.name) for d in split])
            devices = grid.transpose(order).ravel().tolist()
            return Config({mine[j].name: config.degree(split[j].name) for j in order}, devices)
    return None
