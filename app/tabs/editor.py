"""Explore's two side panels: the layout panel (a Megatron or FSDP layout through the same
builders as the command line) and the op editor (an op's details, its degrees and devices).

The layout panel shows the layout of the strategy on the page, whatever set it (the panel, a
starting strategy, the guided tour, a share link, a file): :func:`panel_values`. A strategy
that has no layout (found by a search, edited by hand) leaves the fields empty and says so.
"""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from engine.strategy.runs import device_runs
from engine.errors import SoapboxError

from engine.layout.record import option_of

from ..actions import module_reasons, moe_overlap_reason
from ..fitscan import layout_of
from ..fmt import format_seconds
from ..panel import (CHOICES, DEGREES, EXPERT_DEGREES, FLAGS, LAYOUT_FORM, OFFLOADS, OVERLAPS, SWITCHES, component_id,
                     placeholder)
from ..sources import cluster_of, graph_of
from ..state import check_state, memo_key, page_strategy
from ..components import first_line, wire
from ..views import op_details

__all__ = ["layout_panel", "editor_panel", "render_editor", "op_panel", "panel_values", "overlap_choices", "register",
           "moe_fields", "module_choices", "model_reasons", "OFFLOAD_CHOICES", "MODULE_CHOICES", "NO_MOE"]

#: why the MoE overlap is off when the model is not known to have experts
NO_MOE = "needs a mixture-of-experts model"
#: Megatron-Core's recompute modules (engine.strategy.RECOMPUTE_MODULES): (name, what it reruns)
MODULE_CHOICES = (("core_attn", "the attention core (Megatron's default when none is ticked)"),
                  ("mlp", "the dense MLP layers"), ("moe", "the MoE layers, with the token dispatch"),
                  ("moe_act", "the experts' activation"), ("shared_experts", "the shared experts"),
                  ("layernorm", "the layer norms"), ("mla_up_proj", "MLA's up-projections"))
#: where ZeRO-Offload / ZeRO-Infinity keep what they offload (engine.strategy.OFFLOAD_DEVICES), in words
OFFLOAD_CHOICES = ({"label": "none", "value": "none"}, {"label": "CPU", "value": "cpu"},
                   {"label": "NVMe", "value": "nvme"})
#: the drop-downs' choices in words (a field's values else: its Option's choices)
_CHOICE_WORDS = {"zero_stage": [{"label": str(z), "value": z} for z in (0, 1, 2, 3)]}
#: what an empty drop-down takes
_CHOICE_EMPTY = {"zero_stage": "0 (megatron) / 3 (fsdp)", "schedule": "1f1b"}


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
    sp = isinstance(flags, (list, tuple)) and "sequence_parallel" in flags
    default_zero = 3 if kind == "fsdp" else 0
    z = zero if zero in (0, 1, 2, 3) and not isinstance(zero, bool) else default_zero
    other = "megatron" if kind == "fsdp" else "fsdp"
    why = {name: None if kind in option_of(name).kinds else f"only with {other} layouts (pick {other})"
           for name in OVERLAPS}
    why.update({"tp_comm_overlap": None if sp else "needs sequence parallel (tick it above)"})
    if why.get("overlap_param_gather") is None and z not in (1, 2):
        why["overlap_param_gather"] = ("only with ZeRO 1 or 2 under megatron (the distributed optimizer's all-gather; "
                                       "ZeRO-3 gathers before each use)")
    if why.get("moe_comm_overlap") is None and moe_why is not None:
        why["moe_comm_overlap"] = moe_why
    options = [{"label": " " + option_of(name).label, "value": name, "disabled": why[name] is not None,
                "title": f"{option_of(name).megatron}: {why[name] or option_of(name).help}"} for name in OVERLAPS]
    if all_off:
        return options, []
    if not isinstance(ticked, (list, tuple)):
        ticked = [name for name in OVERLAPS if SWITCHES[name]]
    on = {str(x) for x in ticked if isinstance(x, str)}
    return options, [name for name in OVERLAPS if name in on and why[name] is None]


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


def _number(name: str) -> html.Div:
    return html.Div([html.Label(option_of(name).label, htmlFor=component_id(name)),
                     dcc.Input(id=component_id(name), type="number", min=1, step=1, debounce=True,
                               placeholder=placeholder(name), className="layout-num")],
                    className="layout-field", title=option_of(name).help)


def _choice(name: str) -> list:
    o = option_of(name)
    options = _CHOICE_WORDS.get(name) or list(o.choices)
    fixed = name == "recompute"  # (always one of its values; the others may be left to the builder)
    return [html.Label(o.label, htmlFor=component_id(name)),
            dcc.Dropdown(id=component_id(name), options=options, value=o.choices[0] if fixed else None,
                         clearable=not fixed, placeholder=_CHOICE_EMPTY.get(name))]


def _offload(name: str) -> html.Div:
    return html.Div([html.Label(option_of(name).label, htmlFor=component_id(name)),
                     dcc.Dropdown(id=component_id(name), options=list(OFFLOAD_CHOICES), value="none",
                                  clearable=False)], className="layout-field", title=option_of(name).help)


def layout_panel() -> html.Div:
    """The layout panel, made from the layout record's fields (:mod:`app.panel`): a number box
    per degree, a drop-down per choice, the recompute modules, the flags' and the overlaps'
    check boxes and the offload drop-downs."""
    options, ticked = overlap_choices("megatron", [], None, None, None)
    modules, _, why = module_choices("none", "megatron", {}, [])
    others = [part for name in CHOICES if name != "recompute" for part in _choice(name)]
    return html.Div([
        html.H3("Layout"),
        html.P("A Megatron (tensor x pipeline x data) or FSDP layout; data parallel fills the rest. "
               "Empty fields take the default.", className="hint", id="layout-hint"),
        dcc.RadioItems(id="layout-kind", options=["megatron", "fsdp"], value="megatron", inline=True),
        html.Div([_number(name) for name in DEGREES], className="layout-grid"),
        html.P(id="layout-moe-hint", className="hint"),
        *_choice("recompute"),
        dcc.Checklist(id="layout-recompute-modules", options=modules, value=[], inline=True,
                      className="layout-modules"),
        html.P(why, id="layout-modules-hint", className="hint"),
        *others,
        dcc.Checklist(id="layout-flags", options=[{"label": " " + option_of(n).label, "value": n,
                                                   "title": option_of(n).help} for n in FLAGS],
                      value=[], inline=True),
        html.Fieldset([html.Legend("Overlap"),
                       dcc.Checklist(id="layout-overlap", options=options, value=ticked),
                       html.Button("All overlap off", id="layout-overlap-off", n_clicks=0, className="small",
                                   title="untick every overlap (the command line's --no-overlap)")],
                      className="layout-group"),
        html.Fieldset([html.Legend("Offload (ZeRO-Offload / ZeRO-Infinity)"),
                       html.Div([_offload(name) for name in OFFLOADS], className="layout-grid layout-two")],
                      className="layout-group"),
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
    """What the layout panel shows for the state's strategy, one value per entry of
    :data:`app.panel.LAYOUT_FORM`: its kind and the options that made it (``None`` fields take
    the builder's default), and a hint; for a strategy with no layout, empty fields and a hint
    that says why."""
    s = page_strategy(state)
    found = layout_of(s)
    empty = {name: None for name in DEGREES}
    switches = {"overlap": [name for name in OVERLAPS if getattr(s, name)],
                **{name: getattr(s, name) for name in OFFLOADS}, "recompute_modules": list(s.recompute_modules),
                # the other drop-downs that carry a strategy field of their name (optimizer state)
                **{name: getattr(s, name) for name in CHOICES
                   if name not in ("recompute", "zero_stage", "schedule") and hasattr(s, name)}}
    if found is None or found[0] not in ("megatron", "fsdp"):
        how = str((s.found_by or {}).get("algorithm", "a file"))
        read = None if how.startswith("baseline:") else _read_layout(state, s)
        if read is not None:  # a searched or imported plan that is a framework layout: shown as one
            lay, text = read
            values = {name: getattr(lay, name) for name in DEGREES if hasattr(lay, name)}
            values = {k: (v if isinstance(v, int) and not isinstance(v, bool) and (v != 1 or k in ("tp", "pp"))
                          else None) for k, v in values.items()}
            schedule = ("interleaved" if s.pipeline.virtual_stages > 1 else s.pipeline.schedule) \
                if s.pipeline.stages > 1 else None
            return {"kind": "megatron", **{**empty, **values}, "recompute": s.recompute, "zero_stage": s.zero_stage,
                    "schedule": schedule, "flags": [name for name in FLAGS if getattr(s, name)], **switches,
                    "hint": f"The plan shown ({how[:60]}) is the layout {text}{' with fp8 GEMMs' if s.fp8 else ''}; "
                            "the Export tab writes its framework flags."}
        return {"kind": "megatron", **empty, "recompute": "none", "zero_stage": None, "schedule": None, "flags": [],
                **switches, "hint": f"The strategy shown ({how[:60]}) is not a layout: set one here to replace it."}
    kind, opts, text = found
    values = dict(empty)
    for name in DEGREES:  # (what made the layout: a micro-batch the builder chose stays "auto")
        v = opts.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and (v != 1 or name in ("tp", "pp", "micro_batch")):
            values[name] = v
    schedule = None
    if s.pipeline.stages > 1:
        schedule = "interleaved" if s.pipeline.virtual_stages > 1 else s.pipeline.schedule
        values["pp"] = s.pipeline.stages
        if s.pipeline.virtual_stages > 1:
            values["vpp"] = s.pipeline.virtual_stages
    return {"kind": kind, **values, "recompute": s.recompute, "zero_stage": s.zero_stage, "schedule": schedule,
            "flags": [name for name in FLAGS if getattr(s, name)], **switches,
            "hint": f"Showing the page's layout: {text}; {s.pipeline.microbatches} microbatches."}


def _read_layout(state: dict, strategy) -> tuple[Any, str] | None:
    """The framework layout a strategy's ops make (:func:`engine.export.infer.infer_layout`)
    and its description, or None (a per-op plan)."""
    from engine.export.infer import infer_layout

    from .compare import layout_fields, plan_text

    try:
        lay = infer_layout(graph_of(state), strategy, cluster_of(state))
    except (ValueError, SoapboxError):
        return None
    return lay, plan_text(layout_fields(lay))


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
            ("time", "; ".join(f"{k} {format_seconds(v)}" + (" on its busiest GPU" if k in ("forward", "backward")
                                                              else " in flight")
                               for k, v in d["time_s"].items() if v > 0) or "–"),
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

    from ..panel import layout_options

    try:
        check_state(state)
        g, c = graph_of(state), cluster_of(state)
    except (ValueError, SoapboxError):
        return True, ""
    counts = sorted({op.attrs["num_experts"] for op in g.ops if op.kind == "experts"})
    if not counts:
        return True, f"ep / etp: expert parallelism needs a mixture-of-experts model; {g.name} has no experts."
    try:
        opts = layout_options(kind if kind in ("megatron", "fsdp") else "megatron", form)
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




def register(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    @app.callback(Output("edit-ops", "options"), Output("edit-degrees", "children"),
                  Output("edit-devices", "value"), Input("state", "data"))
    def _editor(state):
        try:
            check_state(state)
            return [wire(x) for x in render_editor(state)]
        except (ValueError, SoapboxError):
            return no_update, no_update, no_update

    @app.callback([Output(component_id(i), "value") for i in LAYOUT_FORM] +
                  [Output("layout-hint", "children"), Output("layout-seen", "data")],
                  Input("state", "data"), State("layout-seen", "data"))
    def _panel(state, seen):
        # set from the page's strategy when it changes (not on a selection or a zoom: the
        # fields keep what the user is typing until then)
        nothing = [no_update] * (len(LAYOUT_FORM) + 2)
        try:
            check_state(state)
            key = memo_key(state["strategy"])
            if key == seen:
                return nothing
            v = panel_values(state)
        except (ValueError, SoapboxError):
            return nothing
        return [v[i] for i in LAYOUT_FORM] + [v["hint"], key]

    @app.callback(*[Output(component_id(n), "disabled") for n in EXPERT_DEGREES],
                  Output("layout-moe-hint", "children"),
                  Input("state", "data"), Input("layout-kind", "value"),
                  *[Input(component_id(n), "value") for n in DEGREES], Input("layout-flags", "value"))
    def _moe(state, kind, *values):
        off, hint = moe_fields(state, kind, dict(zip(DEGREES + ("flags",), values)))
        return *([off] * len(EXPERT_DEGREES)), hint

    @app.callback(Output("layout-overlap", "options"), Output("layout-overlap", "value", allow_duplicate=True),
                  Input("layout-kind", "value"), Input("layout-flags", "value"), Input("layout-zero-stage", "value"),
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
