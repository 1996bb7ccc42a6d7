"""The "Which GPUs" tab: the page's model priced on the GPU types and sizes the user picks
(:mod:`app.planjob`, a job of the search workers), each cluster's fastest feasible layout with
tokens/s per GPU, MFU, days, GPU-hours and cost for a token budget, as a table and a figure."""

from __future__ import annotations

from typing import Any

from dash import ALL, Dash, Input, Output, State, ctx, dcc, html, no_update

from engine.cluster import preset
from engine.errors import SoapboxError

from .. import planjob
from ..components import GRAPH_CONFIG, first_line, image_buttons
from ..figures import empty_figure
from ..fmt import format_amount, format_bytes, format_seconds, parse_count
from ..sources import graph_of
from ..state import check_state

__all__ = ["layout", "register", "plan_start", "plan_stop", "plan_poll", "plan_table", "plan_rows_data", "model_line"]

#: the GPU types ticked on a first visit
DEFAULT_TYPES = ("dgx-h100", "dgx-h200", "dgx-b200")


def _type_label(name: str) -> str:
    c = preset(f"{name}:1")
    return f" {name} ({c.devices[0].type}, {c.gpus_per_node} a node)"


def layout() -> html.Div:
    options = [{"label": _type_label(n), "value": n} for n in planjob.GPU_TYPES]
    return html.Div([
        html.Div([
            html.H3("Which GPUs: each GPU type's best layout, and what the run costs"),
            html.P(id="plan-model", className="hint"),
            html.Label("GPU types", htmlFor="plan-types"),
            dcc.Checklist(id="plan-types", options=options, value=list(DEFAULT_TYPES), className="plan-types",
                          inline=True),
            html.Label("GPUs (one count or several: 64, 256)", htmlFor="plan-gpus"),
            dcc.Input(id="plan-gpus", type="text", value="64", debounce=False),
            html.Label("tokens to train (1T, 300B, 2e12)", htmlFor="plan-tokens"),
            dcc.Input(id="plan-tokens", type="text", value="1T"),
            html.Label("price per GPU-hour by type (none assumed): dgx-h100=2.49, dgx-b200=4.9",
                       htmlFor="plan-prices"),
            dcc.Input(id="plan-prices", type="text", value="", placeholder="dgx-h100=2.49, dgx-b200=4.9"),
            html.Label("network, each value a cluster of its own (empty: each type's own): nics=4,8 nic_gbps=400 "
                       "pod=256 oversub=2", htmlFor="plan-network"),
            dcc.Input(id="plan-network", type="text", value="", placeholder="nics=4,8 nic_gbps=400"),
            html.Div([html.Button("Compare GPUs", id="plan-start", n_clicks=0, className="primary"),
                      html.Button("Stop", id="plan-stop", n_clicks=0)], className="buttons"),
            html.P(id="plan-status", className="status", role="status"),
            html.P("Each layout as Megatron-LM trains large models: selective recomputation, the distributed "
                   "optimizer (ZeRO-1), sequence parallelism with tp > 1, full recomputation where that does not "
                   "fit; micro-batches 1, 2 and 4 (else the smallest valid). Figures are the simulator's, with its "
                   "error against published runs (BENCHMARKS.md). soapbox plan prices the full grid.",
                   className="hint"),
        ], className="panel narrow"),
        html.Div([html.Div(id="plan-table"),
                  dcc.Graph(id="plan-figure", figure=empty_figure("Compare GPUs to see each type's best layout"),
                            config=GRAPH_CONFIG),
                  image_buttons("plan-figure")], className="panel wide"),
        dcc.Interval(id="plan-poll", interval=1000, disabled=True), dcc.Store(id="plan-rows"),
    ], className="row")


def model_line(state: Any) -> str:
    """What the comparison prices: the page's model at its sizes."""
    try:
        check_state(state)
        g = graph_of(state)
    except (ValueError, SoapboxError) as e:
        return f"Cannot read the page's model: {first_line(e)}"
    from engine.sim.report import tokens_per_sample

    per = tokens_per_sample(g)
    if not per:
        return f"{g.name} is not a language model: the comparison prices runs in tokens (pick one in the header)."
    return (f"The page's model: {g.name}, {g.batch_size:,} sequences of {int(per):,} tokens a step, "
            f"{g.precision}. Change it in the header.")


def plan_start(state: Any, types: Any, gpus: Any, tokens: Any, prices: Any, network: Any = "") -> tuple[str, bool]:
    """(the status line, poll disabled) after asking for a comparison."""
    try:
        check_state(state)
        n = parse_count(tokens)
        return planjob.start_plan(state, types, gpus, n, prices, network), False
    except (ValueError, SoapboxError) as e:
        return f"Not started: {first_line(e)}", True


def plan_stop(state: Any) -> str:
    try:
        check_state(state)
    except (ValueError, SoapboxError) as e:
        return f"Cannot stop: {first_line(e)}"
    if planjob.stop_plan(state["sid"]):
        return "Stopping: each cluster's best of the layouts priced so far comes in a moment."
    return "No comparison is running."


def _status(v: dict) -> str:
    st, priced, grid = v["status"], v["priced"], v["grid"]
    if st == "queued":
        ahead = max(0, v["queue_position"] - 1)
        return f"Queued behind {ahead} job{'s' if ahead != 1 else ''} of the server's search workers."
    if st == "running":
        return (f"Pricing layouts: {priced:,} of {grid:,} so far (then full recomputation for those that did not "
                "fit)…" if grid else "Listing the valid layouts…")
    if st == "failed":
        return f"The comparison failed: {v['error']}"
    if st == "interrupted":
        return "The comparison was interrupted (the server restarted): start it again."
    res = v["result"] or {}
    took = format_seconds(float(res.get("run_s") or 0.0))
    tokens = format_amount(float(v["options"].get("tokens") or 0))
    if st == "stopped":
        return (f"Stopped after {res.get('priced', priced):,} layouts of {res.get('grid', grid):,} ({took}): each "
                f"cluster's best of those priced, for {tokens} tokens.")
    return f"{res.get('priced', priced):,} layouts priced in {took}; each cluster's best for {tokens} tokens."


def plan_table(plans: list[dict]) -> html.Table:
    """The plans, a row per cluster: its best layout and what the run takes (or why nothing fits)."""
    head = ["cluster", "GPUs", "best layout", "tokens/s per GPU", "MFU", "days", "GPU-hours", "price / GPU-hour",
            "cost", "peak memory", "layouts fitting", ""]
    body = []
    for i, p in enumerate(plans):
        fit = f"{p['feasible_layouts'] or 0:,} / {p['layouts'] or 0:,}"
        if p.get("days") is None:
            body.append(html.Tr([html.Td(p["cluster"]), html.Td(f"{p['gpus'] or 0:,}"),
                                 html.Td(p.get("why") or "nothing fits", colSpan=8), html.Td(fit)]))
            continue
        price, cost, mfu = p.get("price_per_gpu_hour"), p.get("cost"), p.get("mfu")
        body.append(html.Tr([html.Td(p["cluster"]), html.Td(f"{p['gpus']:,}"), html.Td(p["layout"]),
                             html.Td(f"{p['tokens_per_s_per_gpu']:,.0f}"),
                             html.Td("–" if mfu is None else f"{mfu:.1%}"), html.Td(f"{p['days']:,.1f}"),
                             html.Td(f"{p['gpu_hours']:,.0f}"), html.Td("–" if price is None else f"{price:,.2f}"),
                             html.Td("–" if cost is None else f"{cost:,.0f}"),
                             html.Td(format_bytes(p["peak_memory_bytes"])), html.Td(fit),
                             html.Td(html.Button("Open", id={"type": "plan-open", "row": i}, n_clicks=0,
                                                 className="small", title="show this layout on this cluster in "
                                                                           "Explore (then Export)"))]))
    return html.Table([html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(body)], className="plan-table")


def plan_rows_data(v: dict) -> list[dict | None]:
    """What each table row's Open button opens (:func:`app.events.on_event` "plan-open"): the
    cluster, its best layout's options and the model the comparison priced; None where
    nothing fits."""
    plans = (v.get("result") or {}).get("plans") or []
    return [{"cluster": p["cluster"], "options": p["layout_options"], "model": v.get("model")}
            if p.get("layout_options") else None for p in plans]


def plan_poll(state: Any) -> tuple[Any, Any, Any, bool, Any]:
    """(status line, table, figure, poll disabled, the rows' Open data) of the session's latest
    comparison."""
    try:
        check_state(state)
        v = planjob.plan_view(state["sid"])
    except (ValueError, SoapboxError) as e:
        return f"Cannot read the comparison: {first_line(e)}", no_update, no_update, True, no_update
    if v is None:
        return "", no_update, no_update, True, no_update
    done = v["status"] not in ("queued", "running")
    plans = (v["result"] or {}).get("plans") if done else None
    if not plans:
        return _status(v), (no_update if not done else html.Div()), no_update, done, no_update
    from engine.studies.plan import plan_figure

    title = f"{(v['result'] or {}).get('model', '')}: {format_amount(float(v['options'].get('tokens') or 0))} tokens"
    fig = plan_figure(plans, title)
    fig.update_layout(height=420, margin=dict(t=70, l=50, r=20, b=110))
    return _status(v), plan_table(plans), fig, True, plan_rows_data(v)


def register(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    @app.callback(Output("plan-status", "children"), Output("plan-poll", "disabled"),
                  Input("plan-start", "n_clicks"), State("state", "data"), State("plan-types", "value"),
                  State("plan-gpus", "value"), State("plan-tokens", "value"), State("plan-prices", "value"),
                  State("plan-network", "value"), prevent_initial_call=True)
    def _start(_n, state, types, gpus, tokens, prices, network):
        return plan_start(state, types, gpus, tokens, prices, network)

    @app.callback(Output("plan-status", "children", allow_duplicate=True), Input("plan-stop", "n_clicks"),
                  State("state", "data"), prevent_initial_call=True)
    def _stop(_n, state):
        return plan_stop(state)

    @app.callback(Output("plan-status", "children", allow_duplicate=True), Output("plan-table", "children"),
                  Output("plan-figure", "figure"), Output("plan-poll", "disabled", allow_duplicate=True),
                  Output("plan-rows", "data"),
                  Input("plan-poll", "n_intervals"), Input("tabs", "value"), State("state", "data"),
                  prevent_initial_call=True)
    def _poll(_n, tab, state):
        if ctx.triggered_id == "tabs" and tab != "plan":
            return no_update, no_update, no_update, no_update, no_update
        return plan_poll(state)

    @app.callback(Output("tabs", "value", allow_duplicate=True), Input({"type": "plan-open", "row": ALL}, "n_clicks"),
                  prevent_initial_call=True)
    def _opened(clicks):  # (the header's reducer opens the layout; the page shows it)
        return "explore" if isinstance(clicks, list) and any(clicks) and ctx.triggered_id else no_update

    @app.callback(Output("plan-model", "children"), Input("state", "data"), Input("tabs", "value"))
    def _model(state, tab):
        return model_line(state) if tab == "plan" else no_update
