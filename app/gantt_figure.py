"""The timeline's figure: the Gantt chart :func:`app.gantt.gantt_data` lays out, drawn as
Plotly bars on a time axis labelled in the unit :func:`app.fmt.format_seconds` uses, and the
line of notes under it (what the chart merges, groups or leaves out), and several timelines stacked on one time
axis for comparison. The other figures:
:mod:`app.figures`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from plotly.subplots import make_subplots

from .figures import (BUBBLE_COLOUR, CRITICAL_COLOUR, KIND_COLOURS, MARGIN, ROW_PX, SELECTED_COLOUR, empty_figure,
                      figure_dict, to_ms)
from .fmt import format_seconds

__all__ = ["build_gantt_figure", "build_compare_figure", "gantt_notes", "time_ticks"]


def time_ticks(t0_s: float, t1_s: float, target: int = 8) -> dict[str, Any]:
    """Axis ticks for a time axis drawn in milliseconds, labelled in the unit
    :func:`format_seconds` would use (``"250 ms"``, ``"1.5 s"``, ``"2 min"``): about ``target``
    ticks at 1-2-5 steps over the window, so a 30 s iteration reads "10 s, 20 s" rather than
    "10k, 20k" (ms).

    >>> time_ticks(0.0, 30.7)["ticktext"]
    ['0 s', '5 s', '10 s', '15 s', '20 s', '25 s', '30 s']
    >>> time_ticks(12.1, 12.4)["ticktext"][:3]
    ['12.10 s', '12.15 s', '12.20 s']
    >>> time_ticks(0.0, 72_000.0)["ticktext"][:3]
    ['0 h', '5 h', '10 h']
    """
    if not (math.isfinite(t0_s) and math.isfinite(t1_s)):
        return {}
    span = max(t1_s - t0_s, 1e-12)
    if not math.isfinite(span):  # (a crafted range past float's: its step overflowed)
        return {}
    raw = span / target

    def nice(x: float, unit: float = 1.0) -> float:  # the 1-2-5 step at or above x, in units
        mag = 10 ** math.floor(math.log10(x / unit))
        return unit * next(m * mag for m in (1, 2, 5, 10) if m * mag * unit >= x * (1 - 1e-12))

    step = nice(raw)
    if raw >= 2 * 3600:  # whole hours past two hours
        step = nice(raw, 3600.0)
    elif step >= 60:  # whole minutes past a minute
        step = next(m * 60 for m in (1, 2, 5, 10, 15, 30, 60, 120) if m * 60 >= raw)
    first = math.ceil(t0_s / step - 1e-9)
    vals = [(first + i) * step for i in range(int((t1_s - first * step) / step + 1e-9) + 1)]
    # one unit for the whole axis (format_seconds' rule, by the window's end), as many decimals
    # as the step needs in it: a zoom to 12.10-12.40 s reads 12.15 s, not 12.2 s twice
    top = max(abs(t0_s), abs(t1_s))
    unit, scale = next(((u, k) for u, k, lo in (("h", 3600, 7200), ("min", 60, 120), ("s", 1, 1), ("ms", 1e-3, 1e-3),
                                                  ("µs", 1e-6, 1e-6)) if top >= lo), ("ns", 1e-9))
    decimals = max(0, -math.floor(math.log10(step / scale) + 1e-9))
    text = [f"{v / scale:,.{decimals}f} {unit}" for v in vals]
    if len(set(text)) < len(text) or top > 1e12:  # (a window too narrow for its offset's digits: Plotly's own ticks)
        return {}
    return dict(tickvals=[v * 1e3 for v in vals], ticktext=text)


def _gantt_traces(data: dict[str, Any], showlegend: bool = True) -> list[dict[str, Any]]:
    traces = []
    bubble = data.get("bubble")
    if bubble is not None and len(bubble["start"]):
        traces.append(dict(
            type="bar", name="pipeline bubble (idle)", orientation="h", base=to_ms(bubble["start"]),
            x=to_ms(np.asarray(bubble["end"]) - np.asarray(bubble["start"])), y=np.asarray(bubble["row"], np.float64),
            width=0.8, marker=dict(color=BUBBLE_COLOUR, pattern=dict(shape="/", fgcolor="#888", size=6),
                                   line=dict(width=0)),
            hovertemplate="idle %{x:.3g} ms (pipeline bubble or a wait)<extra></extra>", showlegend=showlegend))
    for label, b in data["bars"].items():
        traces.append(dict(
            type="bar", name=label, orientation="h", base=to_ms(b["start"]), x=to_ms(b["end"] - b["start"]),
            y=np.asarray(b["row"], np.float64), width=0.8, marker=dict(color=KIND_COLOURS[label], line=dict(width=0)),
            hovertext=b["text"], hoverinfo="text", legendgroup=label, showlegend=showlegend))
    for label, o in data["overlays"].items():
        if len(o["start"]) == 0:
            continue
        colour = CRITICAL_COLOUR if label == "critical path" else SELECTED_COLOUR
        traces.append(dict(
            type="bar", name=label, orientation="h", base=to_ms(o["start"]), x=to_ms(o["end"] - o["start"]),
            y=np.asarray(o["row"], np.float64), width=0.95,
            marker=dict(color="rgba(0,0,0,0)", line=dict(color=colour, width=2)), hovertext=o["text"],
            hoverinfo="text", showlegend=showlegend))
    return traces


def gantt_notes(data: dict[str, Any]) -> str:
    """What the timeline leaves out or sums up, as one line under it: merged bars, GPUs drawn
    once per group, hidden link rows, and the pipeline bubble's measured share against the
    schedule's formula."""
    notes = []
    if data["merged"]:
        notes.append(f"{data['tasks_in_view']:,} tasks in view: neighbours merged; zoom in for each")
    if data.get("gpus_in_plan", 0) > data.get("gpu_rows", 0) > 0:
        how = []  # (why there are fewer rows than GPUs: each reason that holds, and only those)
        if data.get("rows") in ("stage", "node"):
            how.append(f"one GPU drawn per {data['rows']}")
        elif data.get("rows") == "gpu" and data.get("gpus_mirrored", 0) > 0:
            how.append("identical GPUs drawn once")
        if data.get("rows_filtered"):
            how.append(f"{data['rows_filtered']:,} row{'s' if data['rows_filtered'] > 1 else ''} hidden by the filter")
        if data.get("rows_cut"):
            how.append(f"the first {data['gpu_rows']:,} rows drawn, {data['rows_cut']:,} more left out: filter or "
                       "group the rows to see them")
        notes.append(f"{data['gpu_rows']:,} GPU rows for {data['gpus_in_plan']:,} GPUs" +
                     (f" ({'; '.join(how)})" if how else ""))
    if data.get("links_filtered"):
        k = data["links_filtered"]
        notes.append(f"{k:,} link row{'s' if k > 1 else ''} hidden by the filter (name a link, e.g. nic, to keep it)")
    if data.get("links_hidden"):
        notes.append(f"{data['links_hidden']:,} link rows hidden (tick 'link rows' to show them)")
    bubble = data.get("bubble")
    if bubble is not None:
        p, m, v = bubble["stages"], bubble["microbatches"], bubble["virtual"]
        vm = f"{v}×{m}" if v > 1 else f"{m}"
        pct = (lambda x: f"{x:.1%}" if x < 0.1 else f"{x:.0%}")
        notes.append(f"idle before the last backward (hatched grey): {pct(bubble['measured'])} of the time; of it, "
                     f"the schedule's bubble (p−1)/({'v·' if v > 1 else ''}m+p−1) = {p - 1}/({vm}+{p - 1}) = "
                     f"{pct(bubble['formula'])}, and {pct(bubble.get('beyond', 0.0))} more from stage imbalance "
                     f"(the busiest GPU computes {bubble.get('busy_spread', 0.0):.0%} longer than the least busy) "
                     "and waits for transfers")
    return " · ".join(notes)


def build_gantt_figure(data: dict[str, Any], title: str = "") -> dict[str, Any]:
    """Horizontal bars per task (or merged tasks) on numeric rows labelled by GPU (or group)
    and link; x in milliseconds. The critical chain is outlined in red, the selected ops in
    yellow, the pipeline bubble hatched grey. Rows keep a fixed pitch (:data:`ROW_PX`), so
    tick labels never overlap; the page scrolls a tall timeline."""
    n = len(data["labels"])
    t0, t1 = data["window"]
    return figure_dict(
        _gantt_traces(data),
        barmode="overlay", title=dict(text=title) if title else None, height=max(260, ROW_PX * n + 100),
        margin={**MARGIN, "t": 40}, legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0),
        xaxis=dict(title=dict(text="time"), range=[t0 * 1e3, t1 * 1e3], **time_ticks(t0, t1)),
        yaxis=dict(tickvals=list(range(n)), ticktext=list(data["labels"]), autorange="reversed", fixedrange=True,
                   tickfont=dict(size=10)),
        uirevision="gantt")


def build_compare_figure(items: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Timelines of several strategies stacked on one shared time axis (ms), each with its rows
    grouped as :func:`app.views.gantt_data` made them, at the timeline's row pitch."""
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
    fig.update_layout(barmode="overlay", height=120 + ROW_PX * rows + 60 * len(items), margin=MARGIN,
                      legend=dict(orientation="h", y=1.02, yanchor="bottom"))
    fig.update_xaxes(title_text="time", row=len(items), col=1)
    # every timeline its own time labels (in a scrolled view the bottom axis is out of sight)
    fig.update_xaxes(showticklabels=True, **time_ticks(0.0, max(d["makespan_s"] for _, d in items)))
    return fig.to_dict()
