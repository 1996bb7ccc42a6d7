"""Figure builders: pure functions from view data (:mod:`app.views`) to Plotly figures.

A figure is Plotly's JSON form, a ``{"data": [...], "layout": {...}}`` dict, which ``dcc.Graph``
takes as it is: building ``plotly.graph_objects`` figures validates every property on every
redraw, which cost more than the rest of an edit's views together (benchmarks/bench_load.py).
The tests check each figure by loading it into ``go.Figure``, which validates it in full
(tests/app/test_app_figures.py); none reads session state.
"""

from __future__ import annotations

import math
from functools import lru_cache

from typing import Any

import numpy as np

from .fmt import format_bytes
from .gantt import A2A_LABEL

__all__ = [
    "KIND_COLOURS",
    "build_op_graph_figure",
    "build_block_stack_figure",
    "build_topology_figure",
    "build_memory_figure",
    "build_trace_figure",
    "build_expert_figure",
    "empty_figure",
    "figure_dict",
    "to_ms",
    "MARGIN",
]

#: task kind -> colour (colour-blind safe, Okabe-Ito)
KIND_COLOURS = {"forward": "#0072B2", "backward": "#E69F00", "optimizer": "#009E73", "transfer": "#CC79A7",
                "collective": "#D55E00", A2A_LABEL: "#882255"}  # (the all-to-alls: Tol's wine)
CRITICAL_COLOUR = "#C00000"
SELECTED_COLOUR = "#FFD400"
#: colours for configs in the op graph, in order of first appearance
CONFIG_PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#999999",
                  "#882255", "#44AA99", "#117733", "#AA4499"]
MEMORY_COLOURS = {"weights": "#0072B2", "gradients": "#56B4E9", "optimizer": "#009E73", "comm buffers": "#999999",
                  "activations (peak)": "#E69F00", "gathered parameters": "#CC79A7", "logits (fp32)": "#D55E00",
                  "allocator fragmentation": "#BBBBBB", "CUDA context and NCCL": "#555555"}
MARGIN = dict(l=10, r=10, t=30, b=30)


@lru_cache(maxsize=1)
def _template() -> dict[str, Any]:
    """Plotly's default template as JSON (what ``go.Figure`` puts in every layout: the look,
    and axis margins that grow to fit tick labels such as "GPU 12 collectives"); made once."""
    import plotly.io as pio

    return pio.templates[pio.templates.default].to_plotly_json()


def figure_dict(data: list[dict[str, Any]], **layout: Any) -> dict[str, Any]:
    """A figure as Plotly's JSON form: ``{"data": traces, "layout": layout}`` with Plotly's
    default template (layout entries given as None are left out)."""
    return {"data": data, "layout": {"template": _template(), **{k: v for k, v in layout.items() if v is not None}}}


def empty_figure(message: str = "") -> dict[str, Any]:
    return figure_dict([], xaxis={"visible": False}, yaxis={"visible": False}, margin=MARGIN, height=200,
                   annotations=[dict(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)]
                   if message else [])


def to_ms(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64) * 1e3


BUBBLE_COLOUR = "rgba(150,150,150,0.35)"
#: pixels per row of the op graph's block stack (labels at 10 px never overlap at this pitch)
STACK_ROW_PX = 24
#: pixels per timeline row: tick labels at 10 px never overlap at this pitch
ROW_PX = 18


def _edge_trace(ex: list, ey: list) -> dict[str, Any]:
    """The op graph's lines (segments separated by None), grey, not hoverable."""
    return dict(type="scatter", x=ex, y=ey, mode="lines", line=dict(color="#bbb", width=1), hoverinfo="skip",
                showlegend=False)


def _by_colour(nodes: list[str], colour_of: dict[str, str]) -> dict[str, list[int]]:
    """Node indices per colour (one trace, one legend entry, per config)."""
    out: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        out.setdefault(colour_of.get(n, "#999999"), []).append(i)
    return out


def build_op_graph_figure(layout: dict[str, Any], colour_of: dict[str, str], legend: dict[str, str],
                          hover: dict[str, str], selected: set[str] | None = None) -> dict[str, Any]:
    """The operator DAG, left to right: ``layout`` from :func:`app.views.graph_layout`,
    ``colour_of`` node -> colour, ``legend`` colour -> config label, ``hover`` node -> text."""
    nodes, xs, ys = layout["nodes"], layout["x"], layout["y"]
    where = {n: (x, y) for n, x, y in zip(nodes, xs, ys)}
    ex: list[float | None] = []
    ey: list[float | None] = []
    for a, b in layout["edges"]:
        (x0, y0), (x1, y1) = where[a], where[b]
        ex += [x0, x1, None]
        ey += [y0, y1, None]
    data = [_edge_trace(ex, ey)]
    by_colour = _by_colour(nodes, colour_of)
    size = 14 if layout["collapsed"] else 9
    for colour, idx in by_colour.items():
        data.append(dict(
            type="scatter", x=[xs[i] for i in idx], y=[ys[i] for i in idx], mode="markers",
            name=legend.get(colour, "mixed"), marker=dict(color=colour, size=size, line=dict(color="#333", width=0.5)),
            customdata=[nodes[i] for i in idx], hovertext=[hover.get(nodes[i], nodes[i]) for i in idx],
            hoverinfo="text"))
    if selected:
        idx = [i for i, n in enumerate(nodes) if n in selected]
        data.append(dict(
            type="scatter", x=[xs[i] for i in idx], y=[ys[i] for i in idx], mode="markers", name="selected",
            marker=dict(color="rgba(0,0,0,0)", size=size + 8, line=dict(color=SELECTED_COLOUR, width=3)),
            customdata=[nodes[i] for i in idx], hoverinfo="skip"))
    return figure_dict(data, height=420, margin=MARGIN, clickmode="event+select", dragmode="pan",
                   xaxis=dict(visible=False), yaxis=dict(visible=False),
                   legend=dict(title=dict(text="config (split)"), orientation="h", y=-0.05), uirevision="opgraph")


def build_block_stack_figure(stack: dict[str, Any], colour_of: dict[str, str], legend: dict[str, str],
                             hover: dict[str, str], selected: set[str] | None = None) -> dict[str, Any]:
    """The block stack (:func:`app.views.block_stack`): a row per block (or run of blocks split
    alike), top to bottom, labelled with its ops, split, GPUs and stage; the expanded block's ops
    as a small DAG under its row. Rows keep a fixed pitch, so labels never overlap."""
    nodes, xs, ys = stack["nodes"], stack["x"], stack["y"]
    where = {n: (x, y) for n, x, y in zip(nodes, xs, ys)}
    rows = set(stack["rows"])
    index = {n: i for i, n in enumerate(stack["rows"])}
    ex: list[float | None] = []
    ey: list[float | None] = []
    for k, (a, b) in enumerate(stack["edges"]):
        (x0, y0), (x1, y1) = where[a], where[b]
        if a in rows and b in rows and abs(index[a] - index[b]) > 1 or (a in rows and b in rows and
                                                                         stack.get("expanded") == a):
            d = -0.25 - 0.08 * (k % 4)  # a skip (or one passing the expanded ops): a bracket at the left
            ex += [x0, d, d, x1, None]
            ey += [y0, y0, y1, y1, None]
        else:
            ex += [x0, x1, None]
            ey += [y0, y1, None]
    data = [_edge_trace(ex, ey)]
    by_colour = _by_colour(nodes, colour_of)
    for colour, idx in by_colour.items():
        text, pos = [], []
        for j, i in enumerate(idx):
            n = nodes[i]
            if n in rows:
                text.append(("▾ " if stack.get("expanded") == n else "▸ ") + stack["labels"][n])
                pos.append("middle right")
            else:  # an op of the expanded block: its layer's ops named once, at the right
                text.append(stack.get("op_text", {}).get(n, ""))
                pos.append("middle right")
        data.append(dict(
            type="scatter", x=[xs[i] for i in idx], y=[ys[i] for i in idx], mode="markers+text",
            name=legend.get(colour, "mixed"), text=text, textposition=pos, textfont=dict(size=10),
            cliponaxis=False,
            marker=dict(color=colour, size=[14 if nodes[i] in rows else 9 for i in idx],
                        symbol=["square" if nodes[i] in rows else "circle" for i in idx],
                        line=dict(color="#333", width=0.5)),
            customdata=[nodes[i] for i in idx], hovertext=[hover.get(nodes[i], nodes[i]) for i in idx],
            hoverinfo="text",  # (a click does not dim the rest)
            unselected=dict(marker=dict(opacity=1.0), textfont=dict(color="#333"))))
    if selected:
        idx = [i for i, n in enumerate(nodes) if n in selected]
        data.append(dict(
            type="scatter", x=[xs[i] for i in idx], y=[ys[i] for i in idx], mode="markers", name="selected",
            marker=dict(color="rgba(0,0,0,0)", size=[22 if nodes[i] in rows else 16 for i in idx],
                        line=dict(color=SELECTED_COLOUR, width=3)),
            customdata=[nodes[i] for i in idx], hoverinfo="skip", unselected=dict(marker=dict(opacity=1.0))))
    low = min(ys, default=0.0)
    return figure_dict(data, height=max(260, int(STACK_ROW_PX * (1.4 - low)) + 90), margin={**MARGIN, "t": 10},
                   clickmode="event+select", dragmode="pan",
                   xaxis=dict(visible=False, range=[-0.7, 9.0], fixedrange=True),
                   yaxis=dict(visible=False, range=[low - 0.7, 0.7], fixedrange=True),
                   legend=dict(title=dict(text="config (split)"), orientation="h", y=0, yanchor="top"),
                   uirevision="opgraph")


def build_topology_figure(data: dict[str, Any]) -> dict[str, Any]:
    """GPUs (coloured by ``data['metric']``), switches, NICs and the fabric, with links
    labelled by bandwidth on hover."""
    traces: list[dict[str, Any]] = []
    kinds: dict[str, list[dict]] = {}
    for e in data["edges"]:
        kinds.setdefault(e["kind"], []).append(e)
    styles = {"nvlink": ("#76B900", 2), "pcie": ("#888", 1), "network": ("#0072B2", 1.5)}
    for kind, es in kinds.items():
        x: list[float | None] = []
        y: list[float | None] = []
        mx, my, text = [], [], []
        for e in es:
            (x0, y0), (x1, y1) = e["from"], e["to"]
            x += [x0, x1, None]
            y += [y0, y1, None]
            mx.append((x0 + x1) / 2)
            my.append((y0 + y1) / 2)
            text.append(f"{kind} link · {e['bw'] / 1e9:g} GB/s per direction")
        colour, width = styles.get(kind, ("#aaa", 1))
        traces.append(dict(type="scatter", x=x, y=y, mode="lines", line=dict(color=colour, width=width), name=kind,
                           hoverinfo="skip"))
        traces.append(dict(type="scatter", x=mx, y=my, mode="markers",
                           marker=dict(size=6, color=colour, opacity=0.01), hovertext=text, hoverinfo="text",
                           showlegend=False))
    if data["hubs"]:
        traces.append(dict(type="scatter", x=[h["x"] for h in data["hubs"]], y=[h["y"] for h in data["hubs"]],
                           mode="markers", marker=dict(symbol="square", size=9, color="#555"),
                           name="switch / NIC / fabric", hovertext=[h["name"] for h in data["hubs"]],
                           hoverinfo="text"))
    metric = data["metric"]
    values = [g["value"] for g in data["gpus"]]
    unit = "utilisation" if metric == "utilization" else "memory used / capacity"
    traces.append(dict(
        type="scatter", x=[g["x"] for g in data["gpus"]], y=[g["y"] for g in data["gpus"]], mode="markers",
        name="GPU",
        marker=dict(size=16, symbol="square", color=values, colorscale="Viridis", cmin=0,
                    cmax=max(1.0, max(values, default=1.0)), colorbar=dict(title=dict(text=unit), thickness=10),
                    line=dict(color="#222", width=1)),
        customdata=[g["id"] for g in data["gpus"]],
        hovertext=[f"{g['name']} ({g['type']}) · {unit} {g['value']:.0%}" for g in data["gpus"]], hoverinfo="text"))
    return figure_dict(traces, height=300, margin=MARGIN, xaxis=dict(visible=False), yaxis=dict(visible=False),
                   legend=dict(orientation="h", y=-0.1))


def build_memory_figure(data: dict[str, Any]) -> dict[str, Any]:
    """A stacked bar per group of identical GPUs (:func:`app.views.memory_data`): its memory by
    kind, which sums to its peak, and its capacity as a dashed mark (GB). Bars run across, one
    row each at a fixed pitch, so labels never overlap however many groups there are."""
    y = data.get("labels") or [f"GPU {d}" for d in data["devices"]]
    n = len(y)
    share = data.get("expert_share")  # (a MoE model: the routed experts' part of the parameters)
    moe = ("weights", "gradients", "optimizer")
    traces = [dict(type="bar", orientation="h", y=y, x=np.asarray(values) / 1e9, name=label,
                   marker=dict(color=MEMORY_COLOURS[label]),
                   **(dict(customdata=np.asarray(share, np.float64),
                           hovertemplate="%{y}: %{x:.3g} GB " + label + ", %{customdata:.0%} of it routed experts'"
                                         "<extra></extra>") if share is not None and label in moe else
                      dict(hovertemplate="%{y}: %{x:.3g} GB " + label + "<extra></extra>")))
              for label, values in data["parts"].items()]
    traces.append(dict(type="scatter", y=y, x=np.asarray(data["capacity"]) / 1e9, mode="markers",
                       name="capacity", marker=dict(symbol="line-ns", size=max(12, ROW_PX - 2),
                                                    line=dict(width=3, color=CRITICAL_COLOUR)),
                       hovertemplate="%{y}: capacity %{x:.3g} GB<extra></extra>"))
    over = data["over"]
    total = np.sum([np.asarray(v, np.float64) for v in data["parts"].values()], axis=0) if data["parts"] else 0.0
    past = int(np.count_nonzero(np.asarray(total) > np.asarray(data["capacity"], np.float64)))
    # out of memory is decided on what is allocated (engine.sim.memory): PyTorch's caching
    # allocator frees its cached blocks and retries before it fails, so a bar whose fragmentation
    # takes it past the mark still fits; the title says so rather than "fits" beside it alone
    title = (f"fits in memory: allocated within capacity; on {past:,} bar{'s' if past != 1 else ''} the allocator's "
             "cache goes past it (freed before an out-of-memory)") if data["feasible"] and past else \
        "fits in memory" if data["feasible"] else (
        f"OVER CAPACITY on {len(over):,} GPU{'s' if len(over) != 1 else ''}; worst GPU {over[0][0]} "
        f"(+{format_bytes(over[0][1])})")
    if data.get("hidden"):
        title += f" · the {n} fullest of {n + data['hidden']} groups shown"
    height = max(300, ROW_PX * n + 170)
    margin = {**MARGIN, "t": 40, "b": 100}  # (the legend's two lines below the axis title)
    return figure_dict(traces, barmode="stack", height=height, margin=margin,
                   xaxis=dict(title=dict(text="GB", standoff=4)),
                   yaxis=dict(autorange="reversed", tickfont=dict(size=10), fixedrange=True, type="category"),
                   title=dict(text=title, x=0),
                   # below the axis title whatever the height: 42 px under the plot, in plot units
                   legend=dict(orientation="h", y=-42 / (height - margin["t"] - margin["b"]), yanchor="top"))


def build_trace_figure(rows: list[dict[str, float]], title: str = "") -> dict[str, Any]:
    """Search progress: current and best cost (ms) against proposals."""
    it = [r["iteration"] for r in rows]

    def ms(v: float | None) -> float | None:  # None (no strategy that fits yet): a gap in the line
        return None if v is None or not math.isfinite(v) else v * 1e3

    return figure_dict(
        [dict(type="scatter", x=it, y=[ms(r["current_cost_s"]) for r in rows], mode="lines", name="current",
              line=dict(color="#999")),
         dict(type="scatter", x=it, y=[ms(r["best_cost_s"]) for r in rows], mode="lines", name="best",
              line=dict(color=CRITICAL_COLOUR, width=2))],
        height=320, margin={**MARGIN, "t": 60},
        # whole proposals or steps only (a 4-step planner's axis showed 1.5 and 2.5)
        xaxis=dict(title=dict(text="proposals"), tickformat="d", dtick=max(1, math.ceil(max(it, default=1) / 8))),
        yaxis=dict(title=dict(text="iteration time (ms)")),
        title=dict(text=title, x=0.01, xanchor="left", y=0.97, yanchor="top") if title else None,
        # the legend at the right of the title's line, never under it
        legend=dict(orientation="h", x=1.0, xanchor="right", y=1.0, yanchor="bottom"))


#: the expert view's colours: an expert's (or rank's) own tokens and work, the busiest rank's,
#: the wait of the others for it, and the balanced share
EXPERT_COLOURS = {"work": "#0072B2", "busiest": CRITICAL_COLOUR, "wait": "rgba(150,150,150,0.45)",
                  "balanced": "#333333"}


def build_expert_figure(table: dict[str, Any]) -> dict[str, Any]:
    """One MoE layer's routing (:func:`app.tabs.experts.expert_table`): at the left the token
    copies each expert receives per iteration (thousands; the busiest rank's experts in red, the
    balanced share dashed), at the right each expert-parallel rank's experts' time per
    iteration (ms): its own work, and the wait for the busiest rank, which every rank does at
    the combine all-to-all (hatched). Numeric axes (128 experts keep readable ticks); titles
    above each panel, the legend under both."""
    e = np.arange(len(table["expert_tokens"]))
    r = np.arange(len(table["rank_own_s"]))
    busiest = int(table["busiest_rank"])
    per = int(table["experts_per_rank"])
    hot = (e // per) == busiest
    tok = np.asarray(table["expert_tokens"], np.float64) / 1e3
    own = to_ms(table["rank_own_s"])
    gated = float(np.max(own)) if own.size else 0.0
    wait = gated - own
    bal_tok = float(table["balanced_expert_tokens"]) / 1e3
    bal_s = float(table["balanced_rank_s"]) * 1e3
    traces = [
        dict(type="bar", x=e[~hot], y=tok[~hot], name="token copies per expert", xaxis="x", yaxis="y",
             marker=dict(color=EXPERT_COLOURS["work"]), hovertemplate="expert %{x}: %{y:.4g}k tokens<extra></extra>"),
        dict(type="bar", x=e[hot], y=tok[hot], name=f"rank {busiest}'s experts (busiest)", xaxis="x", yaxis="y",
             marker=dict(color=EXPERT_COLOURS["busiest"]),
             hovertemplate="expert %{x}: %{y:.4g}k tokens (on the busiest rank)<extra></extra>"),
        dict(type="scatter", x=[-0.5, e.size - 0.5], y=[bal_tok, bal_tok], mode="lines", name="balanced",
             xaxis="x", yaxis="y", line=dict(color=EXPERT_COLOURS["balanced"], dash="dash", width=1.5),
             hovertemplate="balanced: %{y:.4g}k tokens per expert<extra></extra>"),
        dict(type="bar", x=r, y=own, name="a rank's own experts' work", xaxis="x2", yaxis="y2",
             marker=dict(color=[EXPERT_COLOURS["busiest"] if i == busiest else EXPERT_COLOURS["work"] for i in r]),
             showlegend=False, hovertemplate="rank %{x}: %{y:.3g} ms of its own work<extra></extra>"),
        dict(type="bar", x=r, y=wait, name="waiting for the busiest rank", xaxis="x2", yaxis="y2",
             marker=dict(color=EXPERT_COLOURS["wait"], pattern=dict(shape="/", fgcolor="#888", size=6)),
             hovertemplate="rank %{x}: waits %{y:.3g} ms for the busiest<extra></extra>"),
        dict(type="scatter", x=[-0.5, r.size - 0.5], y=[bal_s, bal_s], mode="lines", name="balanced ", xaxis="x2",
             yaxis="y2", line=dict(color=EXPERT_COLOURS["balanced"], dash="dash", width=1.5), showlegend=False,
             hovertemplate="balanced: %{y:.3g} ms per rank<extra></extra>"),
    ]
    titles = [dict(text=f"token copies per expert ({table['layer_short']})", x=0.22, xref="paper",
                   y=1.0, yref="paper", yanchor="bottom", xanchor="center", showarrow=False, font=dict(size=12)),
              dict(text=f"experts' time per EP rank (ep {table['ep']})", x=0.78, xref="paper", y=1.0, yref="paper",
                   yanchor="bottom", xanchor="center", showarrow=False, font=dict(size=12))]
    height = 360
    margin = {**MARGIN, "l": 60, "t": 40, "b": 110}
    return figure_dict(traces, barmode="stack", height=height, margin=margin, annotations=titles,
                   xaxis=dict(domain=[0.0, 0.44], title=dict(text="expert", standoff=4), range=[-0.5, e.size - 0.5],
                              zeroline=False, dtick=1 if e.size <= 16 else None),
                   yaxis=dict(title=dict(text="thousands of tokens"), rangemode="tozero"),
                   xaxis2=dict(domain=[0.56, 1.0], title=dict(text="expert-parallel rank", standoff=4),
                               range=[-0.5, r.size - 0.5], zeroline=False, anchor="y2",
                               dtick=1 if r.size <= 16 else None),
                   yaxis2=dict(title=dict(text="ms per iteration"), anchor="x2", rangemode="tozero"),
                   legend=dict(orientation="h", y=-70 / (height - margin["t"] - margin["b"]), yanchor="top", x=0),
                   uirevision="experts")
