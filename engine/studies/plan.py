"""``soapbox plan``: which GPUs, how many, and what a training run costs (issue 44).

For a model and a token budget, every valid layout (:func:`engine.studies.sweep.layout_points`)
is predicted on each cluster asked for, as Megatron-LM trains large models: selective
recomputation, the distributed optimizer (ZeRO-1) and, with tensor parallelism, sequence
parallelism; a layout that does not fit that way is tried again with full recomputation. The
best feasible layout of each cluster (the most tokens per second) is that cluster's plan: its
tokens/s per GPU, model FLOPs utilisation, the days and GPU-hours ``tokens`` take and, at a
price per GPU-hour the user gives (prices vary by provider and contract: none is assumed),
what the run costs.

Each figure is the simulator's (:func:`engine.studies.sweep.evaluate`): the prediction's own
error applies (BENCHMARKS.md, accuracy against published runs).
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from .sweep import gpu_type, layout_points, model_graph, run_sweep

__all__ = ["parse_prices", "plan_rows", "iter_plan_rows", "plan_points", "best_per_cluster", "plan_table", "plan_figure",
           "write_plan_figure", "PLAN_COLUMNS", "THIN_MICRO_BATCHES"]

#: the micro-batch sizes a thinned plan prices per shape (tp, pp, cp, ep, etp): these where
#: valid, else the shape's smallest valid one (large models train at 1-2 sequences per micro-batch:
#: Narayanan et al. SC'21, Table 1; Megatron-Bridge's recipes)
THIN_MICRO_BATCHES = (1, 2, 4)

#: the columns of a plan row, in order (units in the names: s, bytes, per GPU-hour)
PLAN_COLUMNS = ("cluster", "gpu_type", "gpus", "layout", "iteration_time_s", "tokens_per_s_per_gpu", "mfu", "days",
                "gpu_hours", "price_per_gpu_hour", "cost", "peak_memory_bytes", "feasible_layouts", "layouts", "why",
                "layout_options")


#: the highest price per GPU-hour taken (a run's cost must stay a finite number)
MAX_PRICE = 1e6


def parse_prices(items: Sequence[str] | None) -> dict[str, float]:
    """``["dgx-h100=2.49", "dgx-b200=4.9"]`` -> {GPU type (a preset's name before ``:``): price
    per GPU-hour}; a price must be a number from 0 to :data:`MAX_PRICE`.

    >>> parse_prices(["dgx-h100=2.49", "gb200-nvl72:18=6"])
    {'dgx-h100': 2.49, 'gb200-nvl72': 6.0}
    """
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, value = str(item).partition("=")
        try:
            price = float(value)
        except ValueError:
            price = float("nan")
        if not sep or not name.strip() or not 0 <= price <= MAX_PRICE:
            raise ValueError(f"--price {str(item)[:60]!r}: expected GPU_TYPE=PRICE per GPU-hour from 0 to "
                             f"{MAX_PRICE:,.0f}, e.g. dgx-h100=2.49")
        out[gpu_type(name.strip())] = price
    return out


def plan_points(model: Any, clusters: Sequence[str], *, batch: int | None = None,
                thin: bool = False) -> list[dict[str, Any]]:
    """The layouts a plan prices (:func:`engine.studies.sweep.layout_points`), clusters taken
    in turn (a plan stopped early has priced each about as far). ``thin``: per shape (cluster,
    tp, pp, cp, ep, etp) only the micro-batches of :data:`THIN_MICRO_BATCHES` (else its
    smallest): Mixtral 8x7B on 64 H100s, 1,667 layouts of 3,287."""
    pts = layout_points(model, clusters, batch=batch)
    if thin:
        shapes: dict[tuple, list[dict[str, Any]]] = {}
        for p in pts:
            shapes.setdefault((p["cluster"], p["tp"], p["pp"], p["cp"], p.get("ep", 1), p.get("etp", 1)), []).append(p)
        pts = []
        for same in shapes.values():
            pts += [p for p in same if p["mb"] in THIN_MICRO_BATCHES] or [min(same, key=lambda p: p["mb"])]
    per: dict[str, list[dict[str, Any]]] = {}
    for p in pts:
        per.setdefault(p["cluster"], []).append(p)
    queues = list(per.values())
    return [q[i] for i in range(max((len(q) for q in queues), default=0)) for q in queues if i < len(q)]


def iter_plan_rows(model: Any, clusters: Sequence[str], *, batch: int | None = None, thin: bool = False,
                   points: list[dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
    """The rows :func:`plan_rows` computes, one by one in this process (for a caller that
    stops early and keeps what it has): every point of :func:`plan_points` (or ``points``)
    with selective recomputation, then full recomputation for those that did not fit."""
    from .sweep import evaluate

    pts = points if points is not None else plan_points(model, clusters, batch=batch, thin=thin)
    again = []
    for p in _variants(pts, "selective"):
        r = evaluate(model, p, batch)
        if _retry_full(r):
            again.append(dict(p, recompute="full"))
        yield r
    for p in again:
        yield evaluate(model, p, batch)


def _variants(pts: list[dict[str, Any]], recompute: str) -> list[dict[str, Any]]:
    return [dict(p, recompute=recompute, zero=1, sp=p["tp"] > 1) for p in pts]


def _retry_full(row: dict[str, Any]) -> bool:
    """Whether a selective-recomputation row is priced again with full recomputation: it was
    built, and did not fit (simulated, or sure not to by its memory floor)."""
    return not row["feasible"] and (bool(row.get("iteration_time_s")) or row.get("memory_floor_bytes") is not None)


def plan_rows(model: Any, clusters: Sequence[str], *, batch: int | None = None, backend: str = "pool",
              workers: int | None = None, progress: Any = None) -> list[dict[str, Any]]:
    """Every valid layout's sweep row on each of ``clusters``: selective recomputation, ZeRO-1
    and sequence parallelism with tp > 1, and full recomputation where that did not fit.
    ``model``: a name or a graph (:func:`engine.studies.sweep.model_graph`); ``progress`` as
    :func:`engine.studies.sweep.run_sweep` takes it (the second pass's points counted after
    the first's). :func:`iter_plan_rows` gives the same rows one by one."""
    pts = layout_points(model, clusters, batch=batch)
    if not pts:
        return []
    kw = dict(backend=backend, workers=workers, batch=batch)
    rows = run_sweep(model, _variants(pts, "selective"), progress=progress, **kw)
    again = [p for p, r in zip(_variants(pts, "full"), rows) if _retry_full(r)]
    if again:
        first = len(rows)
        rows += run_sweep(model, again, progress=None if progress is None else (
            lambda done, n: progress(first + done, first + n)), **kw)
    return rows


def _layout_text(r: dict[str, Any]) -> str:
    parts = [f"tp {r['tp']}", f"pp {r['pp']}", f"dp {r['dp']}"]
    parts += [f"{k} {r[k]}" for k in ("cp", "ep", "etp") if (r.get(k) or 1) > 1]
    parts += [f"mb {r['mb']}", f"{r['recompute']} recompute", f"ZeRO-{r['zero']}"] + (["sp"] if r.get("sp") else [])
    return ", ".join(parts)


def _layout_options(r: dict[str, Any]) -> dict[str, Any]:
    """A row's layout as :class:`engine.layout.Layout` options (what rebuilds it: the page's
    layout panel, ``soapbox simulate --layout``)."""
    return {"tp": r["tp"], "pp": r["pp"], "cp": r.get("cp") or 1, "ep": r.get("ep") or 1, "etp": r.get("etp") or 1,
            "micro_batch": r["mb"], "recompute": r["recompute"], "zero_stage": r["zero"],
            "sequence_parallel": bool(r.get("sp"))}


def best_per_cluster(model: Any, rows: list[dict[str, Any]], clusters: Sequence[str], tokens: float,
                     prices: dict[str, float] | None = None, batch: int | None = None) -> list[dict[str, Any]]:
    """Each cluster's plan (:data:`PLAN_COLUMNS`): its fastest feasible row, with tokens/s per
    GPU, MFU, the days and GPU-hours ``tokens`` take and their cost at ``prices`` (per GPU-hour,
    by GPU type); a cluster where nothing fits has its reason in ``why``. Sorted by cost where
    priced, else by GPU-hours."""
    from ..formats import resolve_cluster
    from ..sim.report import model_flops, peak_flops_per_s, tokens_per_sample

    if not tokens > 0:
        raise ValueError(f"--tokens must be a positive number of tokens, got {tokens!r}")
    g = model_graph(model, batch)
    if not tokens_per_sample(g):
        raise ValueError(f"{g.name} is not a language model (no tokens per sample): plan prices runs in tokens")
    prices = prices or {}
    out = []
    for name in clusters:
        mine = [r for r in rows if r["cluster"] == name]
        ok = [r for r in mine if r["feasible"] and r.get("throughput_per_s")]
        row: dict[str, Any] = {k: None for k in PLAN_COLUMNS}
        row.update(cluster=name, gpu_type=gpu_type(name), layouts=len(mine), feasible_layouts=len(ok),
                   price_per_gpu_hour=prices.get(gpu_type(name)))
        if not ok:
            whys = [r["why"] for r in mine if r.get("why")]
            row["why"] = (f"no layout fits ({len(mine)} tried; e.g. {whys[0]})" if whys
                          else "no valid layout for this model and cluster")
            row["gpus"] = resolve_cluster(name, allow_path=True).num_devices
            out.append(row)
            continue
        best = max(ok, key=lambda r: r["throughput_per_s"])
        c = resolve_cluster(name, allow_path=True)
        gpus, t = best["gpus"], best["iteration_time_s"]
        seconds = tokens / best["throughput_per_s"]
        peak = peak_flops_per_s(c, range(gpus), g.precision)
        row.update(gpus=gpus, layout=_layout_text(best), layout_options=_layout_options(best), iteration_time_s=t,
                   tokens_per_s_per_gpu=best["throughput_per_s"] / gpus,
                   mfu=model_flops(g) / (t * peak) if peak and t > 0 else None,
                   days=seconds / 86400.0, gpu_hours=seconds / 3600.0 * gpus,
                   peak_memory_bytes=best["peak_memory_bytes"])
        if row["price_per_gpu_hour"] is not None:
            row["cost"] = row["gpu_hours"] * row["price_per_gpu_hour"]
        out.append(row)
    inf = float("inf")
    return sorted(out, key=lambda r: (r["days"] is None, r["cost"] if r["cost"] is not None else inf,
                                      r["gpu_hours"] if r["gpu_hours"] is not None else inf))


def plan_table(plans: list[dict[str, Any]], tokens: float) -> str:
    """The plans as a Markdown table (what ``soapbox plan`` prints)."""
    head = ("| cluster | GPUs | best layout | tokens/s per GPU | MFU | days | GPU-hours | price / GPU-hour | cost | "
            "peak memory GB | layouts fitting |")
    lines = [f"Training {tokens:,.3g} tokens:", "", head, "|" + "---|" * 11]
    for p in plans:
        if p["days"] is None:
            lines.append(f"| {p['cluster']} | {p['gpus']:,} | {p['why']} | | | | | | | | 0 / {p['layouts']} |")
            continue
        price = "-" if p["price_per_gpu_hour"] is None else f"{p['price_per_gpu_hour']:,.2f}"
        cost = "-" if p["cost"] is None else f"{p['cost']:,.0f}"
        mfu = "-" if p["mfu"] is None else f"{p['mfu']:.1%}"
        lines.append(f"| {p['cluster']} | {p['gpus']:,} | {p['layout']} | {p['tokens_per_s_per_gpu']:,.0f} | {mfu} | "
                     f"{p['days']:,.1f} | {p['gpu_hours']:,.0f} | {price} | {cost} | "
                     f"{p['peak_memory_bytes'] / 1e9:,.1f} | {p['feasible_layouts']} / {p['layouts']} |")
    return "\n".join(lines)


def plan_figure(plans: list[dict[str, Any]], title: str) -> Any:
    """A Plotly figure: tokens/s per GPU, days and GPU-hours (and cost where priced) per
    cluster, one panel each, the best layout in each bar's hover."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ok = [p for p in plans if p["days"] is not None]
    priced = any(p["cost"] is not None for p in ok)
    panels = ["tokens/s per GPU", "days to train", "GPU-hours"] + (["cost"] if priced else [])
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=panels)
    x = [f"{p['cluster']} ({p['gpus']:,} GPUs)" for p in ok]
    keys = ["tokens_per_s_per_gpu", "days", "gpu_hours"] + (["cost"] if priced else [])
    for k, key in enumerate(keys, start=1):
        fig.add_trace(go.Bar(x=x, y=[p[key] for p in ok], name=panels[k - 1], showlegend=False,
                             hovertext=[p["layout"] for p in ok]), row=1, col=k)
    fig.update_layout(title=title, height=480)
    return fig


def write_plan_figure(plans: list[dict[str, Any]], path: str, title: str) -> None:
    """:func:`plan_figure` as a Plotly page."""
    plan_figure(plans, title).write_html(path, include_plotlyjs="cdn")
