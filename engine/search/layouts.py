"""``layouts``: the fastest framework layout under a user's constraints (issue 44).

A search a user can launch from: every valid Megatron-shaped layout of the model
(:func:`engine.layout.valid_layouts`: tp x pp x cp x dp, with ep / etp for mixture-of-experts
models, and the micro-batch), each built as the frameworks build it and priced by the one
memory-checked :func:`~engine.search.api.price`. Per layout, as Megatron-LM trains large models:
sequence parallelism with tensor parallelism, and the least memory saving that fits
(:data:`LADDER`: no distributed optimizer, then ZeRO-1, then selective, then full recomputation;
each step only adds work or communication, so the first that fits is the fastest of them).

Constraints (:class:`~engine.search.api.LayoutOptions`): fixed or bounded tp / pp / ep; the
model's own precision (fp8 only when asked and every GPU has it); a memory headroom (the fit is
checked against ``1 - headroom`` of each GPU's memory); and ``exportable``: a candidate the
chosen exporter (``megatron``, ``deepspeed``, ``torchtitan``: :func:`engine.export.infer.export`)
refuses is skipped (the next memory setting of the layout is tried: DeepSpeed takes full
recomputation but not selective), so the answer is one the framework's launcher takes. ``auto`` delegates here
when any constraint is given (per-op moves would leave the framework's shape).

A time budget may end the enumeration early: the candidates are priced smallest pipeline first
and the notes say how many of how many were priced.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any, Iterator

from ..cluster import Cluster
from ..costs import CostModel
from ..errors import first_line
from ..graph import OpGraph
from ..layout import Layout, valid_layouts
from ..layout.build import build_layout
from ..strategy import Strategy
from .api import Budget, LayoutOptions, Price, Progress, ProgressFn, SearchResult, price, price_baselines, stamp

__all__ = ["layouts", "headroom_cluster", "candidates"]

#: the (ZeRO stage, recomputation) tried for a layout with data parallelism, least work first:
#: the distributed optimizer only where its memory is needed, then more recomputation
LADDER = ((0, "none"), (1, "none"), (1, "selective"), (1, "full"))


def headroom_cluster(cluster: Cluster, headroom: float) -> Cluster:
    """``cluster`` with each GPU's memory cut to ``1 - headroom`` of it (times and links the
    same): a strategy fits it exactly when its peak leaves ``headroom`` of every GPU free."""
    if headroom == 0:
        return cluster
    types = {k: replace(t, memory_bytes=int(t.memory_bytes * (1.0 - headroom))) for k, t in cluster.device_types.items()}
    return Cluster(cluster.name, cluster.node_specs, types, cluster.description, pod_gpus=cluster.pod_gpus,
                   oversubscription=cluster.oversubscription)


def _bounded(value: int, fixed: int, most: int) -> bool:
    return (fixed == 0 or value == fixed) and (most == 0 or value <= most)


def candidates(graph: OpGraph, cluster: Cluster, opts: LayoutOptions) -> list[Layout]:
    """The layouts the constraints allow, smallest pipeline first (then tp, cp, micro-batch as
    :func:`~engine.layout.valid_layouts` orders them), each with sequence parallelism where
    tp > 1; fp8 where asked for and every GPU has it."""
    fp8 = opts.fp8 and all(_has_fp8(t) for t in cluster.device_types.values())
    out = [lay for lay in valid_layouts(graph, cluster, fp8=fp8)
           if _bounded(lay.tp, opts.tp, opts.max_tp) and _bounded(lay.pp, opts.pp, opts.max_pp)
           and _bounded(lay.ep, opts.ep, 0)]
    out = [replace(lay, sequence_parallel=lay.tp > 1) for lay in out]
    return sorted(out, key=lambda lay: lay.pp)  # (stable: valid_layouts' order within a pp)


def _has_fp8(t: Any) -> bool:
    try:
        return t.peak("fp8") > 0
    except ValueError:
        return False


def _variants(graph: OpGraph, cluster: Cluster, lay: Layout) -> Iterator[tuple[str, Strategy]]:
    seen = set()
    for zero, recompute in LADDER:
        step = (zero if lay.dp > 1 else 0, recompute)
        if step not in seen:
            seen.add(step)
            yield f"ZeRO-{step[0]}, recompute {recompute}", build_layout(
                graph, cluster, replace(lay, zero_stage=step[0], recompute=recompute))


def layouts(graph: OpGraph, cluster: Cluster, budget: Budget | None = None, *, seed: int = 0,
            progress: ProgressFn | None = None, initial: Strategy | None = None, cost: CostModel | None = None,
            options: LayoutOptions | None = None) -> SearchResult:
    """The search interface (:mod:`engine.search.api`). ``budget``: seconds, or how many
    layouts to price (each with up to four memory settings, :data:`LADDER`); ``seed`` and ``initial``
    are not used (the enumeration is deterministic and starts from nothing)."""
    from ..export.infer import EXPORT_FORMATS, export

    opts = options or LayoutOptions()
    if opts.exportable and opts.exportable not in EXPORT_FORMATS:
        raise ValueError(f"exportable must be one of {', '.join(EXPORT_FORMATS)}, got {opts.exportable!r}")
    if not 0 <= opts.headroom < 1:
        raise ValueError(f"headroom must be a fraction of memory in [0, 1), got {opts.headroom!r}")
    t0 = time.perf_counter()
    cost_model = cost or CostModel()
    fit = headroom_cluster(cluster, opts.headroom)
    todo = candidates(graph, cluster, opts)
    if not todo:
        raise ValueError(f"no layout of {graph.name!r} on {cluster.name!r} meets the constraints "
                         f"(tp {opts.tp or 'any'}, pp {opts.pp or 'any'}, ep {opts.ep or 'any'}, "
                         f"max tp {opts.max_tp or '-'}, max pp {opts.max_pp or '-'})")
    limit = budget.iterations if budget is not None and budget.iterations is not None else len(todo)
    deadline = t0 + budget.seconds if budget is not None and budget.seconds is not None else math.inf
    best: tuple[Price, Strategy, str] | None = None
    rows: list[Progress] = []
    refused: dict[str, int] = {}
    priced = 0
    for lay in todo[:limit]:
        if time.perf_counter() > deadline:
            break
        priced += 1
        for recompute, s in _variants(graph, cluster, lay):
            if opts.exportable:
                try:
                    export(opts.exportable, graph, s, cluster)
                except ValueError as e:  # (this memory setting; the next may be one the framework takes)
                    why = first_line(e)[:160]
                    refused[why] = refused.get(why, 0) + 1
                    continue
            try:
                p = price(graph, s, fit, cost_model)
            except ValueError:
                break
            if p.feasible:
                if best is None or p.cost_s < best[0].cost_s:
                    best = (p, s, recompute)
                break
        rows.append(Progress(priced, time.perf_counter() - t0, math.inf if best is None else best[0].cost_s,
                             math.inf if best is None else best[0].cost_s, 1.0, 1,
                             best=None if best is None else best[1]))
        if progress is not None:
            progress(rows[-1])
    notes = [f"layouts: priced {priced:,} of the {len(todo):,} the constraints allow"
             + (f" ({opts.headroom:.0%} of each GPU's memory kept free)" if opts.headroom else "")]
    notes += [f"{n:,} refused by the {opts.exportable} export: {why}" for why, n in sorted(refused.items())[:3]]
    if best is None:
        raise ValueError(f"no layout of {graph.name!r} on {cluster.name!r} that meets the constraints fits in "
                         f"memory ({priced:,} of {len(todo):,} priced). " + " ".join(notes[1:]))
    p, s, recompute = best
    baselines, more = price_baselines(graph, cluster, cost_model)
    found = {"algorithm": "layouts", "seed": seed, "options": _options_dict(opts), "memory": recompute}
    return SearchResult(best=stamp(s, graph, cluster, found, p), best_cost_s=p.cost_s, baselines=baselines,
                        iterations=priced, elapsed_s=time.perf_counter() - t0, trace=rows, algorithm="layouts",
                        notes=notes + more)


def _options_dict(opts: LayoutOptions) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: v for k, v in asdict(opts).items() if v not in (0, 0.0, "", False)}
