"""Figures of the Learn tab's measured topics, drawn from the committed measurements.

``init-sweep``: :func:`build_init_sweep_figure` draws ``app/data/init_sweep.json`` (package data,
shipped with the app; written by ``benchmarks/init_sweep.py``, which saves the same figure as the
SVG that BENCHMARKS.md links, benchmarks/measured/init_sweep.svg): per problem, the lowest loss reached against the compute spent, one line
per arm (the median over the seeds) and a band from the best to the worst seed.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from statistics import median
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["INIT_SWEEP_FILE", "ARM_STYLE", "load_init_sweep", "build_init_sweep_figure", "init_sweep_figure_json"]

#: the committed measurement, inside the ``app`` package (installed with it as package data)
INIT_SWEEP_FILE = Path(__file__).resolve().parent / "data" / "init_sweep.json"

#: the label of each arm's rows -> (legend name, colour, shown at first); the ablation starts hidden
ARM_STYLE: dict[str, tuple[str, str, bool]] = {
    "sweep": ("init-sweep", "#1f77b4", True),
    "independent": ("16 independent runs", "#ff7f0e", True),
    "single": ("one run", "#2ca02c", True),
    "sweep (no narrowing)": ("init-sweep, no narrowing", "#9467bd", False),
}


def load_init_sweep(path: str | Path | None = None) -> dict[str, Any] | None:
    """The measurement (``soapbox.init-sweep-bench/1``) from ``path``, else from
    :data:`INIT_SWEEP_FILE`; None when none is there, or when it holds no loss curves (a
    measurement made before they were recorded)."""
    p = Path(path) if path else INIT_SWEEP_FILE
    if not p.is_file():
        return None
    doc = json.loads(p.read_text())
    ok = doc.get("format") == "soapbox.init-sweep-bench/1" and all(
        "curve" in r for prob in doc.get("problems", []) for r in prob.get("rows", []))
    return doc if ok and doc.get("problems") else None


def _band(rows: list[dict[str, Any]]) -> tuple[list[float], list[float], list[float], list[float]]:
    """Compute (k examples) and the median, lowest and highest over ``rows`` of the lowest loss
    reached (nats), at the compute points where every row has a loss."""
    xs = rows[0]["curve"]["compute_examples"]
    x, mid, lo, hi = [], [], [], []
    for i, xi in enumerate(xs):
        vals = [r["curve"]["best_loss"][i] for r in rows]
        if any(v is None for v in vals):
            continue
        x.append(xi / 1e3)
        mid.append(median(vals))
        lo.append(min(vals))
        hi.append(max(vals))
    return x, mid, lo, hi


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[k:k + 2], 16) for k in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def build_init_sweep_figure(doc: dict[str, Any]) -> go.Figure:
    """One panel per problem of ``doc`` (:func:`load_init_sweep`): the lowest full-batch loss
    reached (nats, log scale) against the compute spent (thousands of examples through a
    forward and backward pass), for each arm: the median over the seeds as a line, the best
    and worst seed as a shaded band; the target loss dashed. An arm's line crosses the target
    at its median compute to target."""
    problems = doc["problems"]
    seeds = len(doc.get("seeds", []))
    fig = make_subplots(rows=1, cols=len(problems), horizontal_spacing=0.08,
                        subplot_titles=[f"{p['name']} (target {p['config']['target_loss']:g})" for p in problems])
    for col, prob in enumerate(problems, start=1):
        for label, (name, colour, shown) in ARM_STYLE.items():
            rows = [r for r in prob["rows"] if r.get("label", r["arm"]) == label]
            if not rows:
                continue
            x, mid, lo, hi = _band(rows)
            visible = True if shown else "legendonly"
            common = dict(legendgroup=label, visible=visible, hoverinfo="skip", showlegend=False)
            fig.add_trace(go.Scatter(x=x, y=hi, mode="lines", line=dict(width=0), **common), row=1, col=col)
            fig.add_trace(go.Scatter(x=x, y=lo, mode="lines", line=dict(width=0), fill="tonexty",
                                     fillcolor=_rgba(colour, 0.18), **common), row=1, col=col)
            fig.add_trace(go.Scatter(x=x, y=mid, mode="lines", name=name, legendgroup=label, visible=visible,
                                     line=dict(color=colour, width=2), showlegend=col == 1,
                                     hovertemplate=f"{name}<br>%{{x:,.0f}} k examples<br>median loss %{{y:.4f}}"
                                                   "<extra></extra>"), row=1, col=col)
        fig.add_hline(y=prob["config"]["target_loss"], line=dict(color="#444", dash="dash", width=1), row=1, col=col)
        fig.update_xaxes(title_text="compute spent (k examples, forward + backward)", row=1, col=col)
        fig.update_yaxes(type="log", dtick="D2", row=1, col=col)  # (labels at 1, 2, 5 x 10^k)
    fig.update_yaxes(title_text="lowest loss reached (nats)", row=1, col=1)
    fig.update_layout(template="plotly_white", height=430, margin=dict(l=60, r=20, t=60, b=50),
                      title=dict(text=f"Loss against compute, equal budgets: median over {seeds} seeds, "
                                      "band from best to worst seed", font=dict(size=14)),
                      legend=dict(orientation="h", y=-0.2))
    return fig


@lru_cache(maxsize=1)
def init_sweep_figure_json() -> dict[str, Any] | None:
    """The Learn tab's figure of the committed measurement as Plotly JSON, or None without it;
    made once per process (the page's layout is made on every load, and the file is committed
    data: building the figure costs about 0.2 s)."""
    doc = load_init_sweep()
    return None if doc is None else build_init_sweep_figure(doc).to_plotly_json()
