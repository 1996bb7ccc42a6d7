"""Explore's two side panels: the layout panel (a Megatron or FSDP layout through the same
builders as the command line) and the op editor (an op's details, its degrees and devices).

The layout panel shows the layout of the strategy on the page, whatever set it (the panel, a
starting strategy, the guided tour, a share link, a file): :func:`panel_values`. A strategy
that has no layout (found by a search, edited by hand) leaves the fields empty and says so.
"""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from engine.strategy.device_runs import device_runs
from engine.errors import SoapboxError

from ..actions import LAYOUT_OVERLAPS, module_reasons, moe_overlap_reason
from ..fitscan import layout_of
from ..store import digest_of
from ..fmt import format_seconds
from ..sources import graph_of
from ..state import SWITCHES, check_state, page_strategy
from ..components import first_line
from ..views import op_details

__all__ = ["layout_panel", "editor_panel", "render_editor", "op_panel", "panel_values", "overlap_choices", "register",
           "moe_fields", "module_choices", "model_reasons", "PANEL_FIELDS", "MOE_FIELDS", "OVERLAP_CHOICES",
           "OFFLOAD_CHOICES", "MODULE_CHOICES", "NO_MOE"]

#: the layout panel's fields: (form name, label, placeholder, builder option)
PANEL_FIELDS = (("tp", "tp", "1", "tp"), ("pp", "pp", "1", "pp"), ("cp", "cp", "1", "cp"), ("vpp", "vpp", "1", "vpp"),
                ("mb", "micro-batch", "auto", "micro_batch"), ("shard", "shard group", "-", "shard_group"),
                ("ep", "ep (experts)", "1", "ep"), ("etp", "etp (experts)", "1", "etp"))
#: the expert-parallel fields (mixture-of-experts models, megatron only)
MOE_FIELDS = ("ep", "etp")

#: the overlap group's checkboxes: (value, label, what it is: Megatron-LM's flag), for the
#: layout fields of :data:`app.actions.LAYOUT_OVERLAPS`
OVERLAP_CHOICES = tuple(c for c in (("tp", " tensor-parallel comm with the GEMMs", "--tp-comm-overlap"),
                                    ("grad", " gradient reduce during backward", "--overlap-grad-reduce"),
                                    ("param", " parameter gather with the next forward", "--overlap-param-gather"),
                                    ("moe", " MoE all-to-all overlap (under another microbatch)",
                                     "--overlap-moe-expert-parallel-comm"))
                        if c[0] in LAYOUT_OVERLAPS)
#: why the MoE overlap is off when the model is not known to have experts
NO_MOE = "needs a mixture-of-experts model"
#: Megatron-Core's recompute modules (engine.strategy.RECOMPUTE_MODULES): (name, what it reruns)
MODULE_CHOICES = (("core_attn", "the attention core (Megatron's default when none is ticked)"),
                  ("mlp", "the dense MLP layers"), ("moe", "the MoE layers, with the token dispatch"),
                  ("moe_act", "the experts' activation"), ("shared_experts", "the shared experts"),
                  ("layernorm", "the layer norms"), ("mla_up_proj", "MLA's up-projections"))
#: where ZeRO-Offload / ZeRO-Infinity keep what they offload (engine.strategy.OFFLOAD_DEVICES)
OFFLOAD_CHOICES = ({"label": "none", "value": "none"}, {"label": "CPU", "value": "cpu"},
                   {"label": "NVMe", "value": "nvme"})


def overlap_choices(kind: Any, flags: Any, zero: Any, pp: Any, ticked: Any, all_off: bool = False,
                    moe_why: str | None = NO_MOE) -> tuple[list[dict], list[str]]:
    """The overlap checkboxes for what the panel's other fields say: (options, ticked values).

    A switch that does not apply is disabled, with the reason as its tooltip: tensor-parallel
    overlap without sequence parallelism, parameter-gather overlap outside ZeRO 1/2 under
    megatron, the MoE all-to-all overlap for a dense model (``moe_why``, None for a
    mixture-of-experts model: :func:`app.actions.moe_overlap_reason`) or under fsdp; a disabled
    switch is unticked (on, it would be refused). Pipeline sends always run beside compute (the
    engine has no switch for them). ``all_off``: nothing ticked. Values from the page may be
    anything: a ``ticked`` that is not a list is the layout's defaults.
    """
    sp = isinstance(flags, (list, tuple)) and "sp" in flags
    default_zero = 3 if kind == "fsdp" else 0
    z = zero if zero in (0, 1, 2, 3) and not isinstance(zero, bool) else default_zero
    why = {"tp": None if sp else "needs sequence parallel (tick it above)",
           "grad": None,
           "param": (None if kind == "megatron" and z in (1, 2) else
                     "only with ZeRO 1 or 2 under megatron (the distributed optimizer's all-gather; ZeRO-3 "
                     "gathers before each use)"),
           "moe": (moe_why if moe_why is not None else None if kind == "megatron" else
                   "Megatron-Core's, with megatron layouts (pick megatron)")}
    hide = "hides the all-to-alls under another microbatch's compute (2+ microbatches)"
    options = [{"label": label, "value": value, "disabled": why[value] is not None,
                "title": f"{flag}: {why[value]}" if why[value] else flag + (f": {hide}" if value == "moe" else "")}
               for value, label, flag in OVERLAP_CHOICES]
    if all_off:
        return options, []
    if not isinstance(ticked, (list, tuple)):
        ticked = [value for value, name in LAYOUT_OVERLAPS.items() if SWITCHES[name]]
    on = {str(x) for x in ticked if isinstance(x, str)}
    return options, [value for value, *_ in OVERLAP_CHOICES
                     if value in on and why[value] is None]


def module_choices(recompute: Any, kind: Any, reasons: Any, ticked: Any) -> tuple[list[dict], list[str], str]:
    """The recompute-module checkboxes (Megatron-Core's ``--recompute-modules``) for what the
    panel says: (options, ticked values, the line under them). Every module is disabled, with
    the reason in the line, unless recomputation is selective under megatron; a module that
    does not apply to the model (``reasons``: :func:`app.actions.module_reasons`) is disabled
    with its reason as the tooltip. A disabled module is unticked (on, it would be refused).
    Values from the page may be anything."""
    reasons = reasons if isinstance(reasons, dict) else {}
    off = ("Megatron-Core's --recompute-modules: pick megatron" if kind != "megatron" else
           None if recompute == "selective" else
           "Recompute modules: only with recomputation selective (Megatron's --recompute-granularity selective).")
    options = []
    for name, what in MODULE_CHOICES:
        why = reasons.get(name) if isinstance(reasons.get(name), str) else None
        options.append({"label": f" {name}", "value": name, "disabled": bool(off or why),
                        "title": f"{name}: {what}" + (f" (not here: {why})" if why else "")})
    if off:
        return options, [], off
    on = {x for x in ticked if isinstance(x, str)} if isinstance(ticked, (list, tuple)) else set()
    value = [o["value"] for o in options if o["value"] in on and not o["disabled"]]
    greyed = [o["value"] for o in options if o["disabled"]]
    return options, value, ("--recompute-modules: the ticked parts rerun their forward in the backward instead of "
                            "keeping activations; none ticked: core_attn (Megatron's default)."
                            + (f" Not for this model: {', '.join(greyed)} (hover for why)." if greyed else ""))


def model_reasons(state: Any) -> tuple[dict[str, str | None], str | None]:
    """(why each recompute module does not apply, why the MoE overlap does not) for the
    state's model (:func:`app.actions.module_reasons`, :func:`app.actions.moe_overlap_reason`);
    for a state that cannot be read, none known and the overlap off."""
    try:
        check_state(state)
        g = graph_of(state)
    except (ValueError, SoapboxError):
        return {}, NO_MOE
    return module_reasons(g), moe_overlap_reason(g)


def layout_panel() -> html.Div:
    options, ticked = overlap_choices("megatron", [], None, None, None)
    modules, _, why = module_choices("none", "megatron", {}, [])
    return html.Div([
        html.H3("Layout"),
        html.P("A Megatron (tensor x pipeline x data) or FSDP layout; data parallel fills the rest. "
               "Empty fields take the default.", className="hint", id="layout-hint"),
        dcc.RadioItems(id="layout-kind", options=["megatron", "fsdp"], value="megatron", inline=True),
        html.Div([html.Div([html.Label(label, htmlFor=f"layout-{name}"),
                            dcc.Input(id=f"layout-{name}", type="number", min=1, step=1, debounce=True,
                                      placeholder=ph, className="layout-num")], className="layout-field")
                  for name, label, ph, _ in PANEL_FIELDS], className="layout-grid"),
        html.P(id="layout-moe-hint", className="hint"),
        html.Label("recomputation", htmlFor="layout-recompute"),
        dcc.Dropdown(id="layout-recompute", options=["none", "selective", "full"], value="none", clearable=False),
        dcc.Checklist(id="layout-recompute-modules", options=modules, value=[], inline=True,
                      className="layout-modules"),
        html.P(why, id="layout-modules-hint", className="hint"),
        html.Label("ZeRO stage", htmlFor="layout-zero"),
        dcc.Dropdown(id="layout-zero", options=[{"label": str(z), "value": z} for z in (0, 1, 2, 3)],
                     placeholder="0 (megatron) / 3 (fsdp)"),
        html.Label("schedule (pipeline)", htmlFor="layout-schedule"),
        dcc.Dropdown(id="layout-schedule", options=["1f1b", "gpipe", "interleaved"], placeholder="1f1b"),
        dcc.Checklist(id="layout-flags", options=[{"label": " sequence parallel", "value": "sp"},
                                                  {"label": " fp8 GEMMs", "value": "fp8"}], value=[], inline=True),
        html.Fieldset([html.Legend("Overlap"),
                       dcc.Checklist(id="layout-overlap", options=options, value=ticked),
                       html.Button("All overlap off", id="layout-overlap-off", n_clicks=0, className="small",
                                   title="untick every overlap (the command line's --no-overlap)")],
                      className="layout-group"),
        html.Fieldset([html.Legend("Offload (ZeRO-Offload / ZeRO-Infinity)"), html.Div([
            html.Div([html.Label("optimizer (ZeRO >= 1)", htmlFor="layout-opt-offload"),
                      dcc.Dropdown(id="layout-opt-offload", options=list(OFFLOAD_CHOICES), value="none",
                                   clearable=False)], className="layout-field",
                     title="optimizer state and step on the host CPU or NVMe (needs ZeRO stage 1 or above)"),
            html.Div([html.Label("parameters (ZeRO-3)", htmlFor="layout-param-offload"),
                      dcc.Dropdown(id="layout-param-offload", options=list(OFFLOAD_CHOICES), value="none",
                                   clearable=False)], className="layout-field",
                     title="parameters in host memory or on NVMe, fetched for each use (fsdp, ZeRO stage 3)"),
        ], className="layout-grid layout-two")], className="layout-group"),
        html.Div([html.Button("Apply layout", id="layout-apply", n_clicks=0, className="primary")],
                 className="buttons"),
        dcc.Store(id="layout-seen", storage_type="memory"),  # the strategy the fields were last set from
    ], className="panel narrow")


def editor_panel() -> html.Div:
    return html.Div([
        html.H3("Op and edit"),
        html.Div(id="op-panel", className="op-panel"),
        html.Label("ops to edit"),
        dcc.Dropdown(id="edit-ops", multi=True, placeholder="click an op, or pick ops here"),
        html.Div(id="edit-degrees", className="degrees"),
        html.Label("devices (e.g. 0-3 or 0,2,4,6)"),
        dcc.Input(id="edit-devices", type="text", debounce=False, className="devices"),
        html.Div([html.Button("Apply", id="edit-apply", n_clicks=0, className="primary"),
                  html.Button("Undo", id="undo", n_clicks=0), html.Button("Redo", id="redo", n_clicks=0)],
                 className="buttons"),
    ], className="panel narrow")


def panel_values(state: dict) -> dict[str, Any]:
    """What the layout panel shows for the state's strategy: its kind and the options that
    made it (``None`` fields take the builder's default), and a hint; for a strategy with no
    layout, empty fields and a hint that says why."""
    s = page_strategy(state)
    found = layout_of(s)
    empty = {name: None for name, *_ in PANEL_FIELDS}
    switches = {"overlap": [value for value, name in LAYOUT_OVERLAPS.items() if getattr(s, name)],
                "opt-offload": s.offload_optimizer, "param-offload": s.offload_params,
                "recompute-modules": list(s.recompute_modules)}
    if found is None or found[0] not in ("megatron", "fsdp"):
        how = str((s.found_by or {}).get("algorithm", "a file"))
        return {"kind": "megatron", **empty, "recompute": "none", "zero": None, "schedule": None, "flags": [],
                **switches, "hint": f"The strategy shown ({how[:60]}) is not a layout: set one here to replace it."}
    kind, opts, text = found
    values = dict(empty)
    for name, _, _, opt in PANEL_FIELDS:  # (what made the layout: a micro-batch the builder chose stays "auto")
        v = opts.get(opt)
        if isinstance(v, int) and not isinstance(v, bool) and (v != 1 or opt in ("tp", "pp", "micro_batch")):
            values[name] = v
    flags = [f for f, on in (("sp", s.sequence_parallel), ("fp8", s.fp8)) if on]
    schedule = None
    if s.pipeline.stages > 1:
        schedule = "interleaved" if s.pipeline.virtual_stages > 1 else s.pipeline.schedule
        values["pp"] = s.pipeline.stages
        if s.pipeline.virtual_stages > 1:
            values["vpp"] = s.pipeline.virtual_stages
    return {"kind": kind, **values, "recompute": s.recompute, "zero": s.zero_stage, "schedule": schedule,
            "flags": flags, **switches,
            "hint": f"Showing the page's layout: {text}; {s.pipeline.microbatches} microbatches."}


def op_panel(graph, strategy, timeline, selected: list[str], cost_mark: str | None = None) -> Any:
    """The selected op's details (shape, dims, FLOPs, parameters, config, device time);
    ``cost_mark``: where its compute time came from (:func:`app.profiles.op_cost_mark`)."""
    if not selected:
        return html.P("Click an op in the graph to see it here and edit its config.")
    name = selected[0]
    d = op_details(graph, strategy, timeline, name)
    rows = [("op", f"{d['name']} ({d['kind']})"), ("block", d["block"] or "–"),
            ("output", ", ".join(" x ".join(map(str, s)) for s in d["outputs"])),
            ("dims", ", ".join(f"{x['name']} {x['size'] or 'copies'} [{x['kind']}]" for x in d["dims"])),
            ("FLOPs", f"{d['fwd_flops'] / 1e9:.3g} G fwd, {d['bwd_flops'] / 1e9:.3g} G bwd"),
            ("parameters", f"{d['params']:,}"), ("config", f"{d['label']} on {len(d['config']['devices'])} GPU(s)"),
            *([("mixture of experts", d["moe"])] if d.get("moe") else []),
            ("device time", ", ".join(f"{k} {format_seconds(v)}" for k, v in d["time_s"].items() if v > 0) or "–"),
            *([("cost", cost_mark)] if cost_mark else [])]
    body = [html.Tr([html.Th(k), html.Td(v)]) for k, v in rows]
    extra = [html.P(f"+ {len(selected) - 1} more selected op(s): an edit applies to all of them.")] \
        if len(selected) > 1 else []
    return html.Div([html.Table(body, className="kv")] + extra)


def render_editor(state: dict) -> tuple[list, list, str]:
    """Options of the op picker, degree inputs for the selected op's dims, and its devices."""
    g = graph_of(state)
    s = page_strategy(state)
    options = [{"label": op.name, "value": op.name} for op in g.ops if op.kind != "input"]
    selected = [n for n in (state.get("selected") or []) if n in g.index]
    if not selected:
        return options, [html.P("Select an op to edit its degrees.", className="hint")], ""
    op = g[selected[0]]
    cfg = s[op.name]
    inputs = []
    for d in op.dims:
        inputs.append(html.Div([
            html.Label(f"{d.name} ({d.kind}, " + (f"size {d.size})" if d.size else "any degree: copies)")),
            dcc.Input(id={"type": "deg", "dim": d.name}, type="number", min=1, step=1, value=cfg.degree(d.name)),
        ], className="deg"))
    return options, inputs, device_runs(cfg.devices).replace(",", ", ")


def moe_fields(state: Any, kind: Any, form: dict[str, Any]) -> tuple[bool, str]:
    """(ep and etp disabled, the line under them) for the layout panel's current form: disabled
    for a dense model, with the reason; for a mixture-of-experts model (megatron or fsdp) the
    engine's verdict on the layout typed so far (:func:`engine.layout.layout_problem`, which
    applies Megatron-Core's expert rules: :func:`engine.moe.moe_layout_problem`) or what it makes:
    experts per rank and the expert data-parallel degree."""
    from engine.layout import Layout, layout_problem

    from ..actions import layout_options
    from ..sources import cluster_of

    try:
        check_state(state)
        g, c = graph_of(state), cluster_of(state)
    except (ValueError, SoapboxError):
        return True, ""
    counts = sorted({op.attrs["num_experts"] for op in g.ops if op.kind == "experts"})
    if not counts:
        return True, f"ep / etp: expert parallelism needs a mixture-of-experts model; {g.name} has no experts."
    try:
        opts = layout_options("megatron", {k: form.get(k) for k in ("tp", "pp", "cp", "ep", "etp", "flags")})
        lay = Layout.from_options(opts)
        why = layout_problem(g, c, lay)
    except ValueError as e:
        why = first_line(e)
    if why:
        return False, f"Not valid yet: {why}."
    tp_cp = lay.tp * lay.cp
    dp = c.num_devices // (tp_cp * lay.pp)
    edp = tp_cp * dp // (lay.ep * lay.etp)
    per = ", ".join(f"{n // lay.ep:g}" for n in counts)
    return False, (f"{counts[0]} experts over ep {lay.ep}: {per} per rank, etp {lay.etp}, expert data parallel "
                   f"{edp}; tokens reach their experts by an all-to-all within each group of {lay.ep} ranks.")


_PANEL_IDS = ["kind"] + [name for name, *_ in PANEL_FIELDS] + ["recompute", "recompute-modules", "zero", "schedule",
                                                                "flags", "overlap", "opt-offload", "param-offload"]


def register(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    @app.callback(Output("edit-ops", "options"), Output("edit-degrees", "children"),
                  Output("edit-devices", "value"), Input("state", "data"))
    def _editor(state):
        try:
            check_state(state)
            return render_editor(state)
        except (ValueError, SoapboxError):
            return no_update, no_update, no_update

    @app.callback([Output(f"layout-{i}", "value") for i in _PANEL_IDS] +
                  [Output("layout-hint", "children"), Output("layout-seen", "data")],
                  Input("state", "data"), State("layout-seen", "data"))
    def _panel(state, seen):
        # set from the page's strategy when it changes (not on a selection or a zoom: the
        # fields keep what the user is typing until then)
        nothing = [no_update] * (len(_PANEL_IDS) + 2)
        try:
            check_state(state)
            key = digest_of(state["strategy"])
            if key == seen:
                return nothing
            v = panel_values(state)
        except (ValueError, SoapboxError):
            return nothing
        return [v[i] for i in _PANEL_IDS] + [v["hint"], key]

    @app.callback(Output("layout-ep", "disabled"), Output("layout-etp", "disabled"),
                  Output("layout-moe-hint", "children"),
                  Input("state", "data"), Input("layout-kind", "value"), Input("layout-tp", "value"),
                  Input("layout-pp", "value"), Input("layout-cp", "value"), Input("layout-ep", "value"),
                  Input("layout-etp", "value"), Input("layout-flags", "value"))
    def _moe(state, kind, tp, pp, cp, ep, etp, flags):
        off, hint = moe_fields(state, kind, {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "etp": etp, "flags": flags})
        return off, off, hint

    @app.callback(Output("layout-overlap", "options"), Output("layout-overlap", "value", allow_duplicate=True),
                  Input("layout-kind", "value"), Input("layout-flags", "value"), Input("layout-zero", "value"),
                  Input("layout-pp", "value"), Input("layout-overlap-off", "n_clicks"), Input("state", "data"),
                  State("layout-overlap", "value"), prevent_initial_call=True)
    def _overlap(kind, flags, zero, pp, _off, state, ticked):
        # which overlaps apply follows the fields they depend on (as the user types, and when
        # the panel is set from the page's strategy: it sets the ticks first) and the model
        off = ctx.triggered_id == "layout-overlap-off"
        options, value = overlap_choices(kind, flags, zero, pp, ticked, all_off=off, moe_why=model_reasons(state)[1])
        return options, (no_update if value == ticked else value)

    @app.callback(Output("layout-recompute-modules", "options"),
                  Output("layout-recompute-modules", "value", allow_duplicate=True),
                  Output("layout-modules-hint", "children"),
                  Input("layout-recompute", "value"), Input("layout-kind", "value"), Input("state", "data"),
                  State("layout-recompute-modules", "value"), prevent_initial_call=True)
    def _modules(recompute, kind, state, ticked):
        options, value, hint = module_choices(recompute, kind, model_reasons(state)[0], ticked)
        return options, (no_update if value == ticked else value), hint
