"""Figure builders: pure functions from view data (:mod:`app.views`) to Plotly figures.

Each is tested on the figure's dict (tests/test_app_figures.py); none reads session state.
"""

from __future__ import annotations

import math

from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .fmt import format_bytes, format_seconds

__all__ = [
    "KIND_COLOURS",
    "build_gantt_figure",
    "build_op_graph_figure",
    "build_topology_figure",
    "build_memory_figure",
    "build_trace_figure",
    "build_compare_figure",
    "empty_figure",
]

#: task kind -> colour (colour-blind safe, Okabe-Ito)
KIND_COLOURS = {"forward": "#0072B2", "backward": "#E69F00", "optimizer": "#009E73", "transfer": "#CC79A7",
                "collective": "#D55E00"}
CRITICAL_COLOUR = "#C00000"
SELECTED_COLOUR = "#FFD400"
#: colours for configs in the op graph, in order of first appearance
CONFIG_PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#999999",
                  "#882255", "#44AA99", "#117733", "#AA4499"]
MEMORY_COLOURS = {"weights": "#0072B2", "gradients": "#56B4E9", "optimizer": "#009E73", "comm buffers": "#999999",
                  "activations (peak)": "#E69F00"}
_MARGIN = dict(l=10, r=10, t=30, b=30)


def empty_figure(message: str = "") -> go.Figure:
    fig = go.Figure()
    fig.update_layout(xaxis_visible=False, yaxis_visible=False, margin=_MARGIN, height=200,
                      annotations=[dict(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)]
                      if message else [])
    return fig


def _ms(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64) * 1e3


def _gantt_traces(data: dict[str, Any], showlegend: bool = True) -> list[go.Bar]:
    traces = []
    for label, b in data["bars"].items():
        traces.append(go.Bar(
            name=label, orientation="h", base=_ms(b["start"]), x=_ms(b["end"] - b["start"]),
            y=np.asarray(b["row"], np.float64), width=0.8, marker_color=KIND_COLOURS[label], marker_line_width=0,
            hovertext=np.asarray(b["text"], dtype=object), hoverinfo="text", legendgroup=label,
            showlegend=showlegend))
    for label, o in data["overlays"].items():
        if len(o["start"]) == 0:
            continue
        colour = CRITICAL_COLOUR if label == "critical path" else SELECTED_COLOUR
        traces.append(go.Bar(
            name=label, orientation="h", base=_ms(o["start"]), x=_ms(o["end"] - o["start"]),
            y=np.asarray(o["row"], np.float64), width=0.95, marker_color="rgba(0,0,0,0)",
            marker_line_color=colour, marker_line_width=2, hovertext=np.asarray(o["text"], dtype=object),
            hoverinfo="text",
            showlegend=showlegend))
    return traces


def build_gantt_figure(data: dict[str, Any], title: str = "") -> go.Figure:
    """Horizontal bars per task (or merged tasks) on numeric rows labelled by GPU and link;
    x in milliseconds. The critical chain is outlined in red, the selected ops in yellow."""
    fig = go.Figure(_gantt_traces(data))
    n = len(data["labels"])
    t0, t1 = data["window"]
    fig.update_layout(
        barmode="overlay", title=title or None, height=max(260, min(900, 22 * n + 90)), margin=_MARGIN,
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
        xaxis=dict(title="time (ms)", range=[t0 * 1e3, t1 * 1e3]),
        yaxis=dict(tickvals=list(range(n)), ticktext=data["labels"], autorange="reversed", fixedrange=True,
                   tickfont=dict(size=10)),
        uirevision="gantt",
    )
    if data["merged"]:
        fig.add_annotation(text=f"{data['tasks_in_view']:,} tasks in view: neighbours merged; zoom in for each",
                           xref="paper", yref="paper", x=1, y=1.0, xanchor="right", yanchor="bottom",
                           showarrow=False, font=dict(size=10, color="#666"))
    return fig


def build_op_graph_figure(layout: dict[str, Any], colour_of: dict[str, str], legend: dict[str, str],
                          hover: dict[str, str], selected: set[str] | None = None) -> go.Figure:
    """The operator DAG, left to right: ``layout`` from :func:`app.views.graph_layout`,
    ``colour_of`` node -> colour, ``legend`` colour -> config label, ``hover`` node -> text."""
    nodes, xs, ys = layout["nodes"], layout["x"], layout["y"]
    where = {n: (x, y) for n, x, y in zip(nodes, xs, ys)}
    ex, ey = [], []
    for a, b in layout["edges"]:
        (x0, y0), (x1, y1) = where[a], where[b]
        ex += [x0, x1, None]
        ey += [y0, y1, None]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=np.asarray(ex, dtype=float), y=np.asarray(ey, dtype=float), mode="lines",
                             line=dict(color="#bbb", width=1), hoverinfo="skip",
                             showlegend=False))
    by_colour: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        by_colour.setdefault(colour_of.get(n, "#999999"), []).append(i)
    size = 14 if layout["collapsed"] else 9
    for colour, idx in by_colour.items():
        fig.add_trace(go.Scatter(
            x=np.asarray([xs[i] for i in idx]), y=np.asarray([ys[i] for i in idx]), mode="markers",
            name=legend.get(colour, "mixed"),
            marker=dict(color=colour, size=size, line=dict(color="#333", width=0.5)),
            customdata=np.asarray([nodes[i] for i in idx], dtype=object),
            hovertext=np.asarray([hover.get(nodes[i], nodes[i]) for i in idx], dtype=object), hoverinfo="text"))
    if selected:
        idx = [i for i, n in enumerate(nodes) if n in selected]
        fig.add_trace(go.Scatter(
            x=[xs[i] for i in idx], y=[ys[i] for i in idx], mode="markers", name="selected",
            marker=dict(color="rgba(0,0,0,0)", size=size + 8, line=dict(color=SELECTED_COLOUR, width=3)),
            customdata=[nodes[i] for i in idx], hoverinfo="skip"))
    fig.update_layout(height=420, margin=_MARGIN, clickmode="event+select", dragmode="pan",
                      xaxis=dict(visible=False), yaxis=dict(visible=False, scaleanchor=None),
                      legend=dict(title="config (split)", orientation="h", y=-0.05), uirevision="opgraph")
    return fig


def build_topology_figure(data: dict[str, Any]) -> go.Figure:
    """GPUs (coloured by ``data['metric']``), switches, NICs and the fabric, with links
    labelled by bandwidth on hover."""
    fig = go.Figure()
    kinds: dict[str, list[dict]] = {}
    for e in data["edges"]:
        kinds.setdefault(e["kind"], []).append(e)
    styles = {"nvlink": ("#76B900", 2), "pcie": ("#888", 1), "network": ("#0072B2", 1.5)}
    for kind, es in kinds.items():
        x, y, mx, my, text = [], [], [], [], []
        for e in es:
            (x0, y0), (x1, y1) = e["from"], e["to"]
            x += [x0, x1, None]
            y += [y0, y1, None]
            mx.append((x0 + x1) / 2)
            my.append((y0 + y1) / 2)
            text.append(f"{kind} link · {e['bw'] / 1e9:g} GB/s per direction")
        colour, width = styles.get(kind, ("#aaa", 1))
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line=dict(color=colour, width=width), name=kind,
                                 hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=mx, y=my, mode="markers", marker=dict(size=6, color=colour, opacity=0.01),
                                 hovertext=text, hoverinfo="text", showlegend=False))
    if data["hubs"]:
        fig.add_trace(go.Scatter(x=[h["x"] for h in data["hubs"]], y=[h["y"] for h in data["hubs"]], mode="markers",
                                 marker=dict(symbol="square", size=9, color="#555"), name="switch / NIC / fabric",
                                 hovertext=[h["name"] for h in data["hubs"]], hoverinfo="text"))
    metric = data["metric"]
    values = [g["value"] for g in data["gpus"]]
    unit = "utilisation" if metric == "utilization" else "memory used / capacity"
    fig.add_trace(go.Scatter(
        x=[g["x"] for g in data["gpus"]], y=[g["y"] for g in data["gpus"]], mode="markers", name="GPU",
        marker=dict(size=16, symbol="square", color=values, colorscale="Viridis", cmin=0,
                    cmax=max(1.0, max(values, default=1.0)), colorbar=dict(title=unit, thickness=10),
                    line=dict(color="#222", width=1)),
        customdata=[g["id"] for g in data["gpus"]],
        hovertext=[f"{g['name']} ({g['type']}) · {unit} {g['value']:.0%}" for g in data["gpus"]], hoverinfo="text"))
    fig.update_layout(height=300, margin=_MARGIN, xaxis=dict(visible=False), yaxis=dict(visible=False),
                      legend=dict(orientation="h", y=-0.1))
    return fig


def build_memory_figure(data: dict[str, Any]) -> go.Figure:
    """Stacked bars of each device's memory by kind, with its capacity as a line (GB)."""
    x = [f"GPU {d}" for d in data["devices"]]
    fig = go.Figure()
    for label, values in data["parts"].items():
        fig.add_trace(go.Bar(x=x, y=np.asarray(values) / 1e9, name=label, marker_color=MEMORY_COLOURS[label],
                             hovertemplate="%{x}: %{y:.3g} GB " + label + "<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=np.asarray(data["capacity"]) / 1e9, mode="lines+markers", name="capacity",
                             line=dict(color=CRITICAL_COLOUR, dash="dash"),
                             hovertemplate="%{x}: capacity %{y:.3g} GB<extra></extra>"))
    title = "fits in memory" if data["feasible"] else \
        "OVER CAPACITY on " + ", ".join(f"GPU {d} (+{format_bytes(b)})" for d, b in data["over"][:4])
    fig.update_layout(barmode="stack", height=300, margin=_MARGIN, yaxis_title="GB", title=dict(text=title, x=0),
                      legend=dict(orientation="h", y=-0.2))
    return fig


def build_trace_figure(rows: list[dict[str, float]], title: str = "") -> go.Figure:
    """Search progress: current and best cost (ms) against proposals."""
    fig = go.Figure()
    it = [r["iteration"] for r in rows]

    def ms(v: float | None) -> float | None:  # None (no strategy that fits yet): a gap in the line
        return None if v is None or not math.isfinite(v) else v * 1e3

    fig.add_trace(go.Scatter(x=it, y=[ms(r["current_cost_s"]) for r in rows], mode="lines", name="current",
                             line=dict(color="#999")))
    fig.add_trace(go.Scatter(x=it, y=[ms(r["best_cost_s"]) for r in rows], mode="lines", name="best",
                             line=dict(color=CRITICAL_COLOUR, width=2)))
    fig.update_layout(height=300, margin=_MARGIN, xaxis_title="proposals", yaxis_title="iteration time (ms)",
                      title=title or None, legend=dict(orientation="h", y=1.02, yanchor="bottom"))
    return fig


def build_compare_figure(items: list[tuple[str, dict[str, Any]]]) -> go.Figure:
    """Timelines of several strategies stacked on one shared time axis (ms)."""
    if not items:
        return empty_figure("Keep two or more strategies to compare them.")
    fig = make_subplots(rows=len(items), cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        subplot_titles=[f"{name} · {format_seconds(d['makespan_s'])}" for name, d in items],
                        row_heights=[max(1, len(d["labels"])) for _, d in items])
    for r, (_, d) in enumerate(items, start=1):
        for tr in _gantt_traces({**d, "overlays": {}}, showlegend=(r == 1)):
            fig.add_trace(tr, row=r, col=1)
        n = len(d["labels"])
        fig.update_yaxes(tickvals=list(range(n)), ticktext=d["labels"], autorange="reversed", row=r, col=1,
                         tickfont=dict(size=9), fixedrange=True)
    rows = sum(len(d["labels"]) for _, d in items)
    fig.update_layout(barmode="overlay", height=min(1400, 120 + 16 * rows + 60 * len(items)), margin=_MARGIN,
                      legend=dict(orientation="h", y=1.02, yanchor="bottom"))
    fig.update_xaxes(title_text="time (ms)", row=len(items), col=1)
    return fig
