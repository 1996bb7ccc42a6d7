"""The Search tab: a search of the session runs in a worker process (:mod:`app.jobs`), its cost
trace drawn as it goes; its best can be adopted (:mod:`app.events`).

The poll (every 0.5 s while a search is queued or runs) and the stop button send the session's
id alone (the ``sid`` store, copied from the state in the browser), not the page's state: with
20 sessions searching, polls were most of the server's requests, and each parsed, checked and
hashed a 25 kB state to read one id."""

from __future__ import annotations

import math
from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from engine.formats import load_strategy
from engine.search import ALGORITHMS

from .. import jobs
from ..components import GRAPH_CONFIG, first_line, image_buttons, learn
from ..figures import build_trace_figure, empty_figure
from ..sources import cluster_of, graph_of, refs
from ..state import check_state, issued

__all__ = ["layout", "register", "search_start", "search_options", "search_poll", "search_poll_changed", "search_stop",
           "MAX_TRACE_POINTS"]

#: points of a search's trace drawn (a long search's rows are thinned evenly, the last kept)
MAX_TRACE_POINTS = 1500


def layout() -> html.Div:
    return html.Div([
        html.Div([
            html.Label("algorithm"),
            dcc.Dropdown(id="search-algo", options=[{"label": f"{k}: {v.description}", "value": k}
                                                    for k, v in ALGORITHMS.items()],
                         value=next(iter(ALGORITHMS)), clearable=False),
            html.Label("budget (seconds like 20s, or a number of proposals)"),
            dcc.Input(id="search-budget", type="text", value="20s"),
            html.Label("seed"),
            dcc.Input(id="search-seed", type="number", value=0, min=0, step=1),
            html.Details([
                html.Summary("constraints (auto and layouts): what you can run"),
                html.Label("exportable to", htmlFor="search-exportable"),
                dcc.Dropdown(id="search-exportable", clearable=False, value="",
                             options=[{"label": "any plan", "value": ""}] +
                                     [{"label": f, "value": f} for f in ("megatron", "deepspeed", "torchtitan")]),
                dcc.Checklist(id="search-fp8", options=[{"label": " allow fp8 (else the model's precision)",
                                                         "value": "fp8"}], value=[], inline=True),
                html.Div([html.Label("tp", htmlFor="search-tp"),
                          dcc.Input(id="search-tp", type="number", min=1, step=1, placeholder="any"),
                          html.Label("pp", htmlFor="search-pp"),
                          dcc.Input(id="search-pp", type="number", min=1, step=1, placeholder="any"),
                          html.Label("ep", htmlFor="search-ep"),
                          dcc.Input(id="search-ep", type="number", min=1, step=1, placeholder="any")],
                         className="inline"),
                html.Label("memory headroom (% of each GPU kept free)", htmlFor="search-headroom"),
                dcc.Input(id="search-headroom", type="number", min=0, max=90, step=1, placeholder="0"),
            ], id="search-constraints"),
            html.Div([html.Button("Start search", id="search-start", n_clicks=0, className="primary"),
                      html.Button("Stop", id="search-stop", n_clicks=0),
                      html.Button("Adopt best", id="search-adopt", n_clicks=0)], className="buttons"),
            html.P(id="search-status", className="status"),
        ], className="panel narrow"),
        html.Div([dcc.Graph(id="search-trace", config=GRAPH_CONFIG), image_buttons("search-trace"), learn("search")],
                 className="panel wide"),
        dcc.Interval(id="search-poll", interval=500, disabled=True),
        dcc.Store(id="search-seen", storage_type="memory"),  # what the trace last drew
    ], className="row")


def _whole(name: str, value: Any, lo: int, hi: int) -> int:
    """A number box's whole number in [lo, hi] (0 for an empty box)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return 0
    try:
        if isinstance(value, bool):
            raise ValueError
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} {str(value)[:20]!r} is not a whole number") from None
    if not (math.isfinite(f) and f == int(f) and lo <= f <= hi):
        raise ValueError(f"{name} {str(value)[:20]} must be a whole number from {lo} to {hi}")
    return int(f)


def search_options(algorithm: str, constraints: dict | None) -> dict[str, Any]:
    """The options of a search from the constraint boxes: exportable to a framework, fp8
    allowed (else the model's precision), fixed tp / pp / ep, a memory headroom in percent. Only
    ``auto`` and ``layouts`` take constraints; ``auto`` with none keeps the model's precision
    unless fp8 is allowed.

    Raises
    ------
    ValueError
        Naming the box: a value out of range, or constraints for a search that takes none.
    """
    c = constraints if isinstance(constraints, dict) else {}
    exportable = c.get("exportable") or ""
    if exportable not in ("", "megatron", "deepspeed", "torchtitan"):
        raise ValueError(f"exportable to {str(exportable)[:20]!r}: pick megatron, deepspeed or torchtitan")
    fp8 = bool(c.get("fp8"))
    fixed = {k: _whole(k, c.get(k), 1, 1 << 20) for k in ("tp", "pp", "ep")}
    headroom = _whole("memory headroom", c.get("headroom"), 0, 90) / 100.0
    opts: dict[str, Any] = {k: v for k, v in fixed.items() if v}
    if exportable:
        opts["exportable"] = exportable
    if headroom:
        opts["headroom"] = headroom
    if algorithm not in ("auto", "layouts"):
        if opts or fp8:
            raise ValueError(f"{algorithm} takes no constraints; use auto or layouts (or clear them)")
        return {}
    opts["fp8"] = fp8
    return opts


def search_start(state: dict, algorithm: Any, budget: Any, seed: Any, constraints: dict | None = None) -> tuple[str, bool]:
    """Queue the session's search (it runs in a worker process); (status, poll disabled).
    ``constraints``: the constraint boxes (:func:`search_options`)."""
    try:
        check_state(state)
        if isinstance(seed, bool) or not isinstance(seed, (int, float, str, type(None))):
            raise ValueError(f"seed {str(seed)[:20]!r} is not a whole number")
        seed_f = float(seed or 0)
        if not (math.isfinite(seed_f) and seed_f == int(seed_f) and 0 <= seed_f < 2**63):
            raise ValueError(f"seed {str(seed)[:20]} must be a whole number between 0 and 2**63 - 1")
        options = search_options(str(algorithm)[:40], constraints)
        job = jobs.start(state["sid"], {**refs(state), "options": options}, str(algorithm)[:40],
                         str(budget or "20s")[:40], int(seed_f),
                         initial=load_strategy(state["strategy"], graph_of(state), cluster_of(state)))
    except (ValueError, OverflowError, TypeError) as e:
        return f"Search not started: {first_line(e)}", True
    return job.message(), False


def _trace_title(job: jobs.JobView) -> str:
    return f"{job.algorithm}, budget {job.budget}, seed {job.seed}"


def _session_job(sid: Any) -> jobs.JobView | None:
    """The latest search of the session ``sid`` (None for none, or an id this server did not
    issue)."""
    return jobs.get(sid) if issued(sid) else None


def search_poll(sid: Any) -> tuple[Any, str, bool]:
    """(trace figure, status, poll disabled) for the session's search."""
    fig, status, disabled, _ = search_poll_changed(sid, None)
    return fig, status, disabled


def search_poll_changed(sid: Any, seen: dict | None) -> tuple[Any, Any, bool, dict]:
    """:func:`search_poll` for the page's interval: the trace figure and status only when the
    search changed since the page last drew it (``seen``: its id, rows and status then)."""
    job = _session_job(sid)
    if job is None:
        return empty_figure("Start a search to see its cost trace here."), "", True, {}
    now = {"id": job.id, "rows": len(job.rows), "status": job.status, "best": job.best_cost_s}
    if seen == now:
        return no_update, no_update, not job.running, now
    rows = job.rows if len(job.rows) <= MAX_TRACE_POINTS else \
        job.rows[:-1:math.ceil(len(job.rows) / MAX_TRACE_POINTS)] + job.rows[-1:]
    return build_trace_figure(rows, _trace_title(job)), job.message(), not job.running, now


def search_stop(sid: Any) -> str:
    if not issued(sid):
        return "No search is running."
    return "Stopping: the search returns its best so far..." if jobs.stop(sid) else "No search is running."


def register(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    @app.callback(Output("search-status", "children"), Output("search-poll", "disabled"),
                  Input("search-start", "n_clicks"), State("state", "data"), State("search-algo", "value"),
                  State("search-budget", "value"), State("search-seed", "value"), State("search-exportable", "value"),
                  State("search-fp8", "value"), State("search-tp", "value"), State("search-pp", "value"),
                  State("search-ep", "value"), State("search-headroom", "value"), prevent_initial_call=True)
    def _start(_n, state, algo, budget, seed, exportable, fp8, tp, pp, ep, headroom):
        return search_start(state, algo, budget, seed, {"exportable": exportable, "fp8": bool(fp8), "tp": tp, "pp": pp,
                                                        "ep": ep, "headroom": headroom})

    @app.callback(Output("search-trace", "figure"), Output("search-status", "children", allow_duplicate=True),
                  Output("search-poll", "disabled", allow_duplicate=True), Output("search-seen", "data"),
                  Input("search-poll", "n_intervals"), State("sid", "data"), State("search-seen", "data"),
                  prevent_initial_call="initial_duplicate")
    def _poll(_n, sid, seen):
        return search_poll_changed(sid, seen)

    @app.callback(Output("search-status", "children", allow_duplicate=True), Input("search-stop", "n_clicks"),
                  State("sid", "data"), prevent_initial_call=True)
    def _stop(_n, sid):
        return search_stop(sid)

    # (in the browser: the poll and stop read the id from here, not the whole state)
    app.clientside_callback("function(s) { return (s && typeof s.sid === 'string') ? s.sid : null; }",
                            Output("sid", "data"), Input("state", "data"))
