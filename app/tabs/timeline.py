"""Explore's timeline panel: one iteration's tasks on a row per GPU, per pipeline stage or per
node, link rows, a row filter, zoom (full detail when few tasks are in the window)."""

from __future__ import annotations

import math
from typing import Any

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from engine.errors import SoapboxError

from ..components import GRAPH_CONFIG, first_line, image_buttons, learn
from ..gantt_figure import build_gantt_figure, gantt_notes
from ..gantt import gantt_data, stage_of_devices
from ..simulation import workspace_shown
from ..state import check_state

__all__ = ["layout", "register", "gantt_view", "gantt_parts", "zoom_gantt", "GANTT_OPTIONS"]

#: the timeline's options (component values): row grouping, link rows, row filter
GANTT_OPTIONS = ("rows", "links", "filter")


def layout() -> html.Div:
    return html.Div([html.H3("Timeline of one iteration"),
                     html.Div([
                         html.Label("rows", htmlFor="gantt-rows"),
                         dcc.RadioItems(id="gantt-rows", value="auto", inline=True, options=[
                             {"label": " auto", "value": "auto"}, {"label": " each GPU", "value": "gpu"},
                             {"label": " per stage", "value": "stage"}, {"label": " per node", "value": "node"}]),
                         html.Label("link rows", htmlFor="gantt-links"),
                         dcc.RadioItems(id="gantt-links", value="auto", inline=True, options=[
                             {"label": " auto", "value": "auto"}, {"label": " show", "value": "on"},
                             {"label": " hide", "value": "off"}]),
                         # (every example here matches rows: GPU ids, a stage, a node, a link's name)
                         dcc.Input(id="gantt-filter", type="text", debounce=True, className="gantt-filter",
                                   placeholder="filter rows: 0-7, stage 1, node 1, nic"),
                     ], className="gantt-controls"),
                     html.P(id="gantt-notes", className="hint"), dcc.Store(id="gantt-zoom"),
                     html.Div(dcc.Graph(id="gantt", config=GRAPH_CONFIG), className="gantt-scroll"),
                     image_buttons("gantt"),
                     learn("gantt"), learn("pipeline")], className="panel")


def gantt_view(ws: Any, selected: list[str], window: tuple[float, float] | None,
               opts: dict | None) -> tuple[Any, str]:
    """The timeline figure and the line under it, for the workspace ``ws``: ``opts`` groups GPU
    rows (auto / gpu / stage / node), shows link rows (auto / on / off) and filters rows (see
    :func:`app.gantt.parse_row_filter`); a filter it cannot read is named and ignored."""
    fig, notes, _ = gantt_parts(ws, selected, window, opts)
    return fig, notes


def gantt_parts(ws: Any, selected: list[str], window: tuple[float, float] | None,
                opts: dict | None) -> tuple[Any, str, dict]:
    """:func:`gantt_view`, and the timeline's data (its pipeline bubble: the summary says it)."""
    opts = opts if isinstance(opts, dict) else {}
    s = ws.strategy
    links = {"on": True, "off": False}.get(str(opts.get("links") or "auto"))
    rows = str(opts.get("rows") or "auto")
    kw = dict(window=window, selected=selected, rows=rows if rows in ("auto", "gpu", "stage", "node") else "auto",
              stage_of_device=stage_of_devices(s, ws.cluster.num_devices), links=links,
              pipeline=(s.pipeline.stages, s.pipeline.microbatches, s.pipeline.virtual_stages))
    problem = ""
    try:
        gd = gantt_data(ws.graph, ws.cluster, ws.timeline, row_filter=str(opts.get("filter") or "")[:200], **kw)
    except ValueError as e:
        problem = f"Filter ignored: {first_line(e)}. "
        gd = gantt_data(ws.graph, ws.cluster, ws.timeline, **kw)
    if not gd["labels"]:
        problem += "No row matches the filter. "
    return build_gantt_figure(gd), problem + gantt_notes(gd), gd


def _window(relayout: dict) -> tuple[float, float] | None | bool:
    """The zoomed x range in seconds; None for the whole iteration; False for a relayout that
    is not a zoom (or a range that is not one)."""
    try:
        if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
            a, b = float(relayout["xaxis.range[0]"]), float(relayout["xaxis.range[1]"])
        elif "xaxis.range" in relayout:
            a, b = (float(x) for x in relayout["xaxis.range"])
        elif relayout.get("xaxis.autorange"):
            return None
        else:
            return False
    except (TypeError, ValueError, OverflowError):
        return False  # (a crafted range: a string, a list of three, ...)
    if not (math.isfinite(a) and math.isfinite(b) and b > a):
        return False  # (a crafted or degenerate range)
    return a / 1e3, b / 1e3


def zoom_gantt(state: dict, relayout: dict | None, opts: dict | None = None, trigger: str = "gantt") -> Any:
    """Redraw the Gantt (figure, notes) for the x range the user zoomed to (full detail when few
    tasks are in it), or for new row options (``trigger`` another than "gantt": the whole
    iteration); ``no_update`` for other relayouts, and while ``state`` is not what the page
    shows (:func:`app.simulation.workspace_shown`)."""
    if not state:
        return no_update, no_update
    window = None
    if trigger == "gantt":
        if not isinstance(relayout, dict) or not relayout:
            return no_update, no_update
        window = _window(relayout)
        if window is False:
            return no_update, no_update
    ws = workspace_shown(state)
    if ws is None:  # (a newer state is being drawn: its views come with the row options)
        return no_update, no_update
    selected = [n for n in (state.get("selected") or []) if n in ws.graph.index]
    return gantt_view(ws, selected, window, opts)


def register(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    # the redraw goes through a store: the page applies it only if the state it was drawn for
    # is still the page's (an answer that comes after an edit's views would show the older
    # strategy's timeline under the newer one's cards)
    @app.callback(Output("gantt-zoom", "data"),
                  Input("gantt", "relayoutData"), Input("gantt-rows", "value"), Input("gantt-links", "value"),
                  Input("gantt-filter", "value"), State("state", "data"), prevent_initial_call=True)
    def _zoom(relayout, rows, links, filt, state):
        try:
            check_state(state)
            fig, notes = zoom_gantt(state, relayout, {"rows": rows, "links": links, "filter": filt},
                                    trigger=str(ctx.triggered_id or "gantt"))
        except (ValueError, SoapboxError, TimeoutError) as e:
            fig, notes = no_update, f"Cannot redraw the timeline: {first_line(e)}"
        if (fig is no_update and notes is no_update) or not isinstance(state, dict):
            return no_update  # (a crafted request without a state: nothing to draw it for)
        return {"version": state.get("version"), "sid": state.get("sid"),
                "figure": None if fig is no_update else fig, "notes": None if notes is no_update else notes}

    app.clientside_callback(
        """
        function(drawn, state) {
            const nu = window.dash_clientside.no_update;
            if (!drawn || !state || drawn.version !== state.version || drawn.sid !== state.sid) {
                return [nu, nu];
            }
            return [drawn.figure === null ? nu : drawn.figure, drawn.notes === null ? nu : drawn.notes];
        }
        """,
        Output("gantt", "figure", allow_duplicate=True), Output("gantt-notes", "children", allow_duplicate=True),
        Input("gantt-zoom", "data"), State("state", "data"), prevent_initial_call=True)
