"""The Export tab: the strategy file, a Chrome trace, a framework's settings (Megatron-LM,
DeepSpeed, torchtitan: :mod:`engine.export`) and a share link."""

from __future__ import annotations

import json

import numpy as np
from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from engine.errors import SoapboxError
from engine.sim.trace import trace_events

from ..components import first_line
from ..links import share_query
from ..simulation import workspace
from ..state import check_state

__all__ = ["layout", "register", "strategy_export", "export_strategy", "export_framework", "export_trace",
           "share_link", "MAX_TRACE_EVENTS"]

#: the most trace events the page downloads (a few hundred bytes each: ~100 MB); larger
#: plans are written by the command line (`soapbox simulate --trace`), which streams to a file
MAX_TRACE_EVENTS = 400_000
_EXT = {"megatron": "txt", "deepspeed": "json", "torchtitan": "sh"}


def layout() -> html.Div:
    return html.Div([
        html.Div([html.Button("Download strategy (JSON)", id="export-strategy", n_clicks=0, className="primary"),
                  html.Button("Download Chrome trace (Perfetto)", id="export-trace", n_clicks=0)],
                 className="buttons"),
        html.P("Import a strategy, model or cluster file with the upload box at the top. Every figure has PNG "
               "and SVG buttons under it (and the camera in its toolbar)."),
        html.H4("For a framework"),
        html.Div([html.Button("Megatron-LM flags (core_v0.19)", id="export-megatron", n_clicks=0),
                  html.Button("DeepSpeed config (0.19.8)", id="export-deepspeed", n_clicks=0),
                  html.Button("torchtitan launch line (0.3.0)", id="export-torchtitan", n_clicks=0)], className="buttons"),
        html.Div(id="export-fw-message", className="message", role="status"),
        html.H4("Share"),
        html.Div([html.Button("Make a link to this state", id="share", n_clicks=0),
                  dcc.Input(id="share-url", type="text", readOnly=True, className="share")], className="buttons"),
        dcc.Download(id="download"),
    ], className="panel")


def _file_name(kind: str, state: dict, ext: str) -> str:
    return f"{kind}-{state['model'].get('name', 'model')}-{state['cluster'].get('name', 'cluster')}.{ext}" \
        .replace(":", "_").replace("/", "_")


def strategy_export(state: dict) -> dict:
    """The strategy file to download: self-describing, with its simulated cost."""
    ws = workspace(state)
    d = ws.strategy.to_dict()
    g, c = ws.graph, ws.cluster
    d["model"] = {**d.get("model", {}), "name": g.name, "fingerprint": g.fingerprint}
    d["cluster"] = {**d.get("cluster", {}), "name": c.name, "devices": c.num_devices}
    d["cost"] = {"iteration_time_s": ws.timeline.makespan_s}
    return d


def export_strategy(state: dict) -> dict:
    return {"content": json.dumps(strategy_export(state), indent=1), "filename": _file_name("strategy", state, "json"),
            "type": "application/json"}


def export_framework(state: dict, fmt: str) -> tuple[dict | None, str]:
    """(download, message): the strategy as ``fmt`` settings (engine.export), or no download
    and why the framework cannot express it."""
    from engine.export import export

    if fmt not in _EXT:
        return None, f"Not exported: {str(fmt)[:30]!r} is not one of {', '.join(_EXT)}"
    ws = workspace(state)
    try:
        text = export(fmt, ws.graph, ws.strategy, ws.cluster)
    except (ValueError, SoapboxError) as e:
        lines = str(e).splitlines()
        shown = "; ".join(x.strip(" -") for x in lines[1:6]) or lines[0]
        more = f" (+{len(lines) - 6} more)" if len(lines) > 6 else ""
        return None, f"Not exported to {fmt}: {shown}{more}"
    name = _file_name(fmt, state, _EXT[fmt])
    return {"content": text, "filename": name, "type": "text/plain"}, f"Exported {fmt} settings ({name})."


def export_trace(state: dict) -> tuple[dict | None, str]:
    """(download, message): the Chrome trace of the state's iteration, or no download and why
    (a plan whose trace would be too large for a page download)."""
    ws = workspace(state)
    tl = ws.timeline
    image = tl.tasks.info.get("device_image")
    mirror = 1.0
    if image is not None:
        reps, used = int(np.sum(image == np.arange(image.size))), int(np.sum(image >= 0))
        mirror = used / max(1, reps)
    estimate = int(tl.tasks.num_tasks * mirror)
    if estimate > MAX_TRACE_EVENTS:
        return None, (f"Not exported: the trace would have about {estimate:,} events (~{estimate * 250 / 1e6:,.0f} MB), "
                      f"more than a page download takes ({MAX_TRACE_EVENTS:,}). Write it with the command line: "
                      "soapbox simulate --model M --cluster C --strategy strategy.json --trace trace.json "
                      "(download the strategy above).")
    events = list(trace_events(ws.graph, ws.cluster, tl, ws.memory))
    body = json.dumps({"displayTimeUnit": "ms", "otherData": {"generator": "soapbox"}, "traceEvents": events},
                      separators=(",", ":"))
    return ({"content": body, "filename": _file_name("trace", state, "json"), "type": "application/json"},
            f"Exported the trace ({len(events):,} events).")


def share_link(state: dict, href: str | None) -> str:
    base = (href if isinstance(href, str) else "")[:2000].split("?")[0]
    try:
        return base + share_query(state)
    except ValueError as e:
        return f"Cannot share: {e}"


def register(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    @app.callback(Output("download", "data"), Output("export-fw-message", "children", allow_duplicate=True),
                  Input("export-strategy", "n_clicks"), State("state", "data"), prevent_initial_call=True)
    def _export_strategy(_n, state):
        try:
            check_state(state)
            return export_strategy(state), no_update
        except (ValueError, SoapboxError, TimeoutError) as e:
            return no_update, f"Not exported: {first_line(e)}"

    @app.callback(Output("download", "data", allow_duplicate=True),
                  Output("export-fw-message", "children", allow_duplicate=True), Input("export-trace", "n_clicks"),
                  State("state", "data"), prevent_initial_call=True)
    def _export_trace(_n, state):
        try:
            check_state(state)
            data, msg = export_trace(state)
        except (ValueError, SoapboxError, TimeoutError) as e:
            return no_update, f"Not exported: {first_line(e)}"
        return (data if data is not None else no_update), msg

    @app.callback(Output("download", "data", allow_duplicate=True), Output("export-fw-message", "children"),
                  Input("export-megatron", "n_clicks"), Input("export-deepspeed", "n_clicks"),
                  Input("export-torchtitan", "n_clicks"), State("state", "data"), prevent_initial_call=True)
    def _export_framework(_m, _d, _t, state):
        fmt = str(ctx.triggered_id or "").removeprefix("export-")
        try:
            check_state(state)
            data, msg = export_framework(state, fmt)
        except (ValueError, SoapboxError, TimeoutError) as e:
            return no_update, f"Not exported: {first_line(e)}"
        return (data if data is not None else no_update), msg

    @app.callback(Output("share-url", "value"), Input("share", "n_clicks"), State("state", "data"),
                  State("url", "href"), prevent_initial_call=True)
    def _share(_n, state, href):
        try:
            check_state(state)
            return share_link(state, href)
        except (ValueError, SoapboxError) as e:
            return f"Cannot share: {first_line(e)}"
