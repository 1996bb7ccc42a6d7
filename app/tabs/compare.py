"""The Compare tab: strategies kept side by side — a summary row each (time, throughput,
speedup over the first kept, MFU, idle share, memory, communication, GPUs, fit), the ops that
differ between the first and the last, and their timelines on one time axis."""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from engine.errors import SoapboxError
from engine.formats import load_strategy

from ..components import GRAPH_CONFIG, first_line, image_buttons, wire
from ..figures import empty_figure
from ..gantt_figure import build_compare_figure
from ..fmt import format_bytes, format_rate, format_seconds
from ..gantt import gantt_data, stage_of_devices
from ..sessions import current
from ..sources import APP_MAX_TASKS, cluster_of, graph_of
from ..state import check_page_strategy, check_state, content_key
from engine.sim.report import mfu

from ..views import config_diff, summary_data

__all__ = ["plan_fields", "plan_text", "layout_fields", "LAYOUT_FIELDS", "layout", "register", "render_compare", "compare_shown", "compared"]


def layout() -> html.Div:
    return html.Div([
        html.Div([dcc.Input(id="compare-name", type="text", placeholder="name (optional)", maxLength=100),
                  html.Button("Keep current strategy", id="compare-add", n_clicks=0, className="primary"),
                  html.Button("Clear", id="compare-clear", n_clicks=0)], className="buttons"),
        html.Div(id="compare-table"),
        html.Div([html.Label("timelines drawn (one time axis):", htmlFor="compare-show"),
                  dcc.Checklist(id="compare-show", options=[], value=[], inline=True)], className="gantt-controls"),
        html.Div(dcc.Graph(id="compare-gantt", config=GRAPH_CONFIG), className="gantt-scroll"),
        image_buttons("compare-gantt"),
        html.Div(id="compare-diff"),
    ], className="panel")


def compared(state: dict, item: dict) -> tuple[Any, Any, Any]:
    """(strategy, timeline, memory report) of a kept strategy, simulated through the engine's
    one entry point with its symmetry reduction (the page's own path: an LLM plan on 64 GPUs
    is a few representatives, not millions of tasks); cached, as the Compare tab redraws on
    every state."""
    from engine.sim.report import simulate_strategy

    key = content_key({**state, "strategy": item["strategy"]})
    cache = current().compared
    hit = cache.get(key)
    if hit is not None:
        return hit
    g, c = graph_of(state), cluster_of(state)
    check_page_strategy(item["strategy"], f"the kept strategy {str(item.get('name'))[:40]!r}")
    s = load_strategy(item["strategy"], g, c)  # (kept from an earlier page: checked again)
    r = simulate_strategy(g, s, c, check=False, symmetry="auto", max_tasks=APP_MAX_TASKS)  # (never past the cap)
    out = (s, r.timeline, r.memory)
    cache.put(key, out)
    return out


def compare_shown(state: dict, shown: list | None, had: list | None) -> tuple[list[str], list[str]]:
    """(kept names, the names whose timelines are drawn): what the user ticked, and every
    strategy kept since the list was last drawn (a new one opens drawn)."""
    names = [it["name"] for it in state.get("compare") or []]
    known = {o.get("value") for o in (had if isinstance(had, list) else []) if isinstance(o, dict)}
    ticked = {x for x in shown if isinstance(x, str)} if isinstance(shown, list) else set()
    return names, [n for n in names if n in ticked or n not in known]


def _idle_text(bubble: dict | None) -> str:
    """'46% (bubble 9%)': the measured idle share and, of it, the schedule's bubble."""
    if bubble is None:
        return "–"
    return f"{bubble['measured']:.0%} (bubble {bubble['formula']:.0%})"


#: the layout fields Compare shows and diffs, with their labels
LAYOUT_FIELDS = (("tp", "tp"), ("pp", "pp"), ("vpp", "vpp"), ("cp", "cp"), ("dp", "dp"), ("ep", "ep"), ("etp", "etp"),
                 ("micro_batch", "mb"), ("zero_stage", "ZeRO"), ("recompute", "recompute"),
                 ("sequence_parallel", "sp"), ("fp8", "fp8"))


def plan_fields(graph: Any, cluster: Any, strategy: Any) -> dict[str, Any] | None:
    """A strategy's framework layout as Compare shows it (:data:`LAYOUT_FIELDS`), read from its
    ops (:func:`engine.export.infer.infer_layout`: a searched plan included); None for a per-op plan."""
    from engine.export.infer import infer_layout

    try:
        lay = infer_layout(graph, strategy, cluster)
    except (ValueError, SoapboxError):
        return None
    return layout_fields(lay)


def layout_fields(lay: Any) -> dict[str, Any]:
    """A :class:`engine.layout.Layout`'s :data:`LAYOUT_FIELDS`."""
    return {k: getattr(lay, k) for k, _ in LAYOUT_FIELDS}


def plan_text(fields: dict[str, Any] | None) -> str:
    if fields is None:
        return "no framework layout (ops split one by one)"
    parts = [f"{label} {fields[k]}" for k, label in LAYOUT_FIELDS[:8] if k in ("tp", "pp", "dp") or fields[k] not in (1, None)]
    parts += [f"ZeRO-{fields['zero_stage']}"] if fields["zero_stage"] else []
    parts += [f"recompute {fields['recompute']}"] if fields["recompute"] != "none" else []
    parts += ["sp"] if fields["sequence_parallel"] else []
    return " · ".join(parts)


def _field_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [f"{label} {a[k]} → {b[k]}" for k, label in LAYOUT_FIELDS if a[k] != b[k]]


def render_compare(state: dict, shown: list[str] | None = None) -> tuple[Any, Any, Any]:
    """The Compare tab's table, diff and aligned timelines. ``shown``: the names whose
    timelines are drawn (None: all); the others are collapsed to their summary row."""
    items = state.get("compare") or []
    if not items:
        return html.P("Keep strategies here to compare them side by side."), "", empty_figure(
            "Keep two or more strategies to compare them.")
    g, c = graph_of(state), cluster_of(state)
    rows, gantts, strategies, plans = [], [], [], []
    first_t = None
    for it in items:
        s, tl, mem = compared(state, it)
        strategies.append((it["name"], s))
        plans.append(plan_fields(g, c, s))
        t = tl.makespan_s
        first_t = first_t or t
        summ = summary_data(g, tl, mem, None)
        used = sorted(s.devices_used())
        rate = (format_rate(summ["tokens_per_s"], "tokens") if summ.get("tokens_per_s") else
                format_rate(summ["throughput_samples_per_s"]))
        u = mfu(g, t, c, used)
        p = s.pipeline
        gd = None
        if shown is None or it["name"] in shown or p.stages > 1:
            gd = gantt_data(g, c, tl, max_bars=1500, rows="auto", stage_of_device=stage_of_devices(s, c.num_devices),
                            pipeline=(p.stages, p.microbatches, p.virtual_stages))
        rows.append(html.Tr([html.Td(it["name"]), html.Td(plan_text(plans[-1])),
                             html.Td(g.precision + (" · fp8 GEMMs" if s.fp8 else "")),
                             html.Td(format_seconds(t)), html.Td(rate),
                             html.Td(f"{first_t / t:.2f}x" if t > 0 else "–"),
                             html.Td(f"{u:.0%}" if u is not None else "–"),
                             html.Td(_idle_text(gd["bubble"] if gd is not None else None)),
                             html.Td(format_bytes(float(mem.peak_bytes.max()))), html.Td(format_bytes(tl.comm_bytes)),
                             html.Td(f"{len(used):,} of {c.num_devices:,}"), html.Td("yes" if mem.feasible else "NO")]))
        if gd is not None and (shown is None or it["name"] in shown):
            gantts.append((it["name"], gd))
    head = ("strategy", "layout", "precision", "iteration time", "throughput", f"speedup over {items[0]['name']}", "MFU",
            "idle (of it, the schedule's bubble)", "peak memory", "communication", "GPUs used", "fits")
    table = html.Table([html.Tr([html.Th(h) for h in head])] + rows, className="compare")
    diff: Any = ""
    if len(strategies) >= 2:
        (na, a), (nb, b) = strategies[0], strategies[-1]
        d = config_diff(a, b)
        fields = _field_diff(plans[0], plans[-1]) if plans[0] is not None and plans[-1] is not None else None
        lead = [html.P(f"Layout: {', '.join(fields) if fields else 'the same fields'} ({na} → {nb}); precision "
                       f"{'the same' if a.fp8 == b.fp8 else ('fp8 → model precision' if a.fp8 else 'model precision → fp8')}.")] \
            if fields is not None else []
        top = html.P(f"{len(d)} op(s) differ between {na} and {nb}" + (" (first 50 shown)" if len(d) > 50 else ""))
        diff = html.Div(lead + [top, html.Table([html.Tr([html.Th("op"), html.Th(na), html.Th(nb)])] +
                                         [html.Tr([html.Td(x["op"]), html.Td(x["a"]), html.Td(x["b"])])
                                          for x in d[:50]], className="diff")])
    if not gantts:
        return table, diff, empty_figure("Tick a strategy above to draw its timeline.")
    return table, diff, build_compare_figure(gantts)


def register(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    @app.callback(Output("compare-table", "children"), Output("compare-diff", "children"),
                  Output("compare-gantt", "figure"), Output("compare-show", "options"), Output("compare-show", "value"),
                  Input("state", "data"), Input("compare-show", "value"), State("compare-show", "options"))
    def _compare(state, shown, had):
        try:
            check_state(state)
            names, value = compare_shown(state, shown, had)
            return (*(wire(x) for x in render_compare(state, value)), [{"label": f" {n}", "value": n} for n in names],
                    value)
        except (ValueError, SoapboxError, KeyError, TypeError) as e:
            return html.P(f"Cannot compare: {first_line(e)}"), "", no_update, no_update, no_update
