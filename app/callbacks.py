"""Wiring only: connects the page's components to the plain functions that answer them.

The header's actions go through :func:`app.events.on_event` (one reducer for every change of
the state); each tab registers its own callbacks (:mod:`app.tabs`). Every callback checks what
it is sent and answers a message, never an error page.
"""

from __future__ import annotations

from dash import ALL, Dash, Input, Output, State, ctx, no_update

from .events import on_event
from .layout import cluster_options, model_options
from .panel import LAYOUT_FORM, component_id
from .tabs import compare, explore, export, learn, plan, search
from .uploads import MAX_UPLOAD_BYTES

__all__ = ["register"]



def _shown(value, showing):
    """Set a dropdown only when it does not already show the state's choice: echoing the
    value it shows raced with the user's next pick (a slow answer reset it)."""
    return no_update if value == showing or value is None else value


def network_text(ref: dict) -> str | None:
    """What the header's network field shows for a cluster reference: a preset's network
    after its ``+`` (``nics=4 nic_gbps=400``), empty for its own; None for an upload."""
    if not isinstance(ref, dict) or "upload" in ref:
        return None
    return str(ref.get("name", "")).partition("+")[2].replace("+", " ")


def _options(old, new: dict, key: str, make):
    """The header's list of models (or clusters), sent only when an upload (or a preset with
    another network, which the list does not hold) comes or goes (sending it at every event
    reset a dropdown the user was changing)."""
    def extra(ref) -> bool:
        return isinstance(ref, dict) and ("upload" in ref or key == "cluster" and "+" in str(ref.get("name", "")))

    was = isinstance(old, dict) and extra(old.get(key))
    now = extra(new[key])
    if not was and not now:
        return no_update
    return make(new[key]["name"] if now else None)


def _register_reducer(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    @app.callback(
        Output("state", "data"), Output("message", "children"), Output("pick-model", "value"),
        Output("pick-cluster", "value"), Output("pick-baseline", "value"), Output("edit-ops", "value"),
        Output("pick-batch", "value"), Output("pick-seq", "value"), Output("pick-precision", "value"),
        Output("pick-model", "options"), Output("pick-cluster", "options"), Output("gantt-rows", "value"),
        Output("pick-network", "value"),
        Input("url", "search"), Input("pick-model", "value"), Input("pick-cluster", "value"),
        Input("pick-baseline", "value"), Input("upload-ok", "data"), Input("edit-apply", "n_clicks"),
        Input("undo", "n_clicks"), Input("redo", "n_clicks"), Input("op-graph", "clickData"),
        Input("edit-ops", "value"), Input("search-adopt", "n_clicks"), Input("compare-add", "n_clicks"),
        Input("compare-clear", "n_clicks"), Input("pick-batch", "value"), Input("layout-apply", "n_clicks"),
        Input({"type": "tour", "step": ALL}, "n_clicks"), Input("sim-cancel", "n_clicks"),
        Input("pick-seq", "value"), Input("pick-precision", "value"),
        Input("expert-apply", "n_clicks"), Input("expert-balanced", "n_clicks"), Input("profile-detach", "n_clicks"),
        Input("pick-network", "value"),
        Input({"type": "plan-open", "row": ALL}, "n_clicks"), State("plan-rows", "data"),
        State("expert-source", "value"), State("expert-skew", "value"), State("expert-hist", "data"),
        State({"type": "deg", "dim": ALL}, "value"),
        State({"type": "deg", "dim": ALL}, "id"), State("edit-devices", "value"), State("compare-name", "value"),
        State("collapse", "value"), State("state", "data"),
        *[State(component_id(name), "value") for name in LAYOUT_FORM])
    def _reduce(query, model, cluster, baseline, uploaded, _a, _u, _r, click, ops, _ad, _ca, _cc, batch, _la, _tour,
                _sc, seq, precision, _xa, _xb, _pd, network, _po, plan_rows, x_source, x_skew, x_hist, deg_values, deg_ids, devices, compare_name,
                collapse, state, *form):
        trigger = ctx.triggered_id if isinstance(ctx.triggered_id, str) else None
        step = None
        if isinstance(ctx.triggered_id, dict) and ctx.triggered_id.get("type") == "tour" and \
                isinstance(_tour, list) and any(_tour):
            trigger, step = "tour", str(ctx.triggered_id.get("step"))[:30]
        plan = None
        if isinstance(ctx.triggered_id, dict) and ctx.triggered_id.get("type") == "plan-open":
            row = ctx.triggered_id.get("row")
            rows = plan_rows if isinstance(plan_rows, list) else []
            # (the pattern's entries are the last input: a new table's buttons come unclicked)
            entries = ctx.inputs_list[-1] if ctx.inputs_list and isinstance(ctx.inputs_list[-1], list) else []
            clicked = any(isinstance(e, dict) and isinstance(e.get("id"), dict) and e["id"].get("row") == row
                          and e.get("value") for e in entries)
            if isinstance(row, int) and 0 <= row < len(rows) and clicked:
                trigger, plan = "plan-open", rows[row]
        if trigger == "upload-ok":
            trigger = "upload"
        uploaded = uploaded if isinstance(uploaded, dict) else {}
        if isinstance(state, dict):
            state = dict(state, collapse=bool(collapse))
        ids = deg_ids if isinstance(deg_ids, list) else []
        vals = deg_values if isinstance(deg_values, list) else []
        degrees = {i["dim"]: v for i, v in zip(ids, vals) if isinstance(i, dict) and isinstance(i.get("dim"), str)}
        new, msg = on_event(trigger, state, query=query, model=model, cluster=cluster, baseline=baseline,
                            upload=uploaded.get("contents"), filename=uploaded.get("filename"), ops=ops,
                            degrees=degrees, devices=devices, click=click, compare_name=compare_name, batch=batch,
                            step=step, size=seq if trigger == "pick-seq" else precision, network=network,
                            layout=dict(zip(LAYOUT_FORM, form)),
                            whatif={"source": x_source, "skew": x_skew, "histogram": x_hist}, plan=plan)
        # a refused or empty action leaves the state as it was: not sent again, so the editor
        # and the views keep what the user typed (sending it reset the op editor's fields)
        return (no_update if new is state else new, msg, _shown(new["model"].get("name"), model),
                _shown(new["cluster"].get("name"), cluster),
                new.get("baseline"), new.get("selected") or [],
                no_update if trigger == "pick-batch" else new["model"].get("batch"),
                no_update if trigger == "pick-seq" else new["model"].get("seq_len"),
                no_update if trigger == "pick-precision" else new["model"].get("precision", "default"),
                _options(state, new, "model", model_options), _options(state, new, "cluster", cluster_options),
                # a guided step's timeline rows, with its state (the views read both together)
                ("stage" if step == "pipeline" else "auto") if trigger == "tour" and new is not state else no_update,
                no_update if new is state else _shown(network_text(new["cluster"]), network))

    app.clientside_callback(
        f"""
        function(contents, filename) {{
            const nu = window.dash_clientside.no_update;
            if (!contents) {{ return [nu, nu, nu]; }}
            // the browser fires no change for the file its input already holds, nor Dash for the
            // contents it already has: forget both, so the same file can be uploaded again (after
            // an edit, or a refusal fixed elsewhere)
            const input = document.querySelector('#upload input[type=file]');
            if (input) {{ input.value = ''; }}
            const bytes = Math.floor((contents.length - contents.indexOf(',') - 1) * 3 / 4);
            if (bytes > {MAX_UPLOAD_BYTES}) {{
                const mb = (bytes / 1e6).toFixed(1);
                return [nu,
                        'Import refused: ' + filename + ' is ' + mb + ' MB; the explorer takes files up to '
                        + '{MAX_UPLOAD_BYTES / 1e6:g} MB (use the soapbox command line for larger ones).', null];
            }}
            return [{{contents: contents, filename: filename, at: Date.now()}}, nu, null];
        }}
        """,
        Output("upload-ok", "data"), Output("message", "children", allow_duplicate=True),
        Output("upload", "contents"),
        Input("upload", "contents"), State("upload", "filename"), prevent_initial_call=True)

    app.clientside_callback(
        """
        function(clicks) {
            const t = window.dash_clientside.callback_context.triggered_id;
            if (!t || !clicks.some(c => c)) { return window.dash_clientside.no_update; }
            const el = document.getElementById(t.fig);
            const gd = el && el.querySelector('.js-plotly-plot');
            if (gd) { Plotly.downloadImage(gd, {format: t.fmt, filename: 'soapbox-' + t.fig}); }
            return '';
        }
        """,
        Output("img-dummy", "children"), Input({"type": "img", "fig": ALL, "fmt": ALL}, "n_clicks"),
        prevent_initial_call=True)


def register(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    """Every callback of the page."""
    _register_reducer(app)
    for tab in (explore, search, plan, compare, export, learn):
        tab.register(app)
