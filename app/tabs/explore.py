"""The Explore tab: summary cards, the why-text, the op graph, the layout and op-editor panels
(:mod:`app.tabs.editor`), the timeline (:mod:`app.tabs.timeline`), the cluster and memory.

:func:`render_explore` draws every view from a state; a simulation that takes longer than a
request should wait goes on in the background (:func:`app.simulation.workspace_within`) while
the page shows what it is doing and can go back (:func:`cancel_simulation`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from engine.errors import Cancelled, SoapboxError

from ..components import GRAPH_CONFIG, card, first_line, image_buttons, learn, wire
from ..figures import (CONFIG_PALETTE, build_block_stack_figure, build_memory_figure, build_op_graph_figure,
                       build_topology_figure)
from ..fitscan import fit_start, fit_status
from ..fmt import format_bytes, format_count, format_rate, format_seconds, parse_count
from ..gantt import stage_of_devices
from ..profiles import coverage_note, op_cost_mark, profile_status
from ..sessions import Busy, current
from ..simulation import (INLINE_WAIT_S, baseline_comm_bytes, baseline_cost_s, baseline_fits, build_status,
                          cancel_build, paths_in_background, workspace, workspace_within)
from ..state import check_state, content_key
from engine.sim.report import mfu

from ..views import (block_stack, config_label, expert_param_share, graph_layout, memory_data, moe_text, summary_data,
                     topology_data, why_text)
from . import editor, experts, timeline

__all__ = ["layout", "register", "render_explore", "draw_explore", "graph_view", "train_estimate", "sim_status_text",
           "cancel_simulation", "fit_view", "EXPLORE_IDS"]

#: the components :func:`render_explore` fills
EXPLORE_IDS = ["sum-time", "sum-throughput", "sum-speedup", "sum-comm", "sum-memory", "sum-tasks", "why",
               "op-graph", "op-panel", "gantt", "gantt-notes", "topology", "memory", "rate", "profile-note"]


def layout() -> html.Div:
    return html.Div([
        html.Div([card("iteration time", "sum-time"), card("throughput", "sum-throughput"),
                  card("speedup over data parallel", "sum-speedup"), card("communication / iteration", "sum-comm"),
                  card("peak memory", "sum-memory"), card("tasks simulated", "sum-tasks")],
                 className="cards", id="summary"),
        html.Div([html.Label("train", htmlFor="train-tokens", title="tokens (or samples) to train: 1T, 300B, 2e12"),
                  dcc.Input(id="train-tokens", type="text", value="1T", debounce=True, className="train-tokens",
                            placeholder="1T"),
                  html.Span(id="train-estimate", className="train-estimate"),
                  dcc.Store(id="rate")], className="train"),
        html.P(id="why", className="why"),
        html.Div([html.Span(id="profile-note", className="hint", role="status"),
                  html.Button("Detach profile table", id="profile-detach", n_clicks=0, className="small",
                              title="price every op by the roofline again")], className="buttons profile"),
        html.Div([
            html.Div([
                html.H3("Operator graph"),
                dcc.Checklist(id="collapse", options=[{"label": " collapse blocks", "value": "on"}], value=["on"],
                              inline=True),
                dcc.Graph(id="op-graph", config=GRAPH_CONFIG), image_buttons("op-graph"),
                learn("graph"), learn("soap"),
            ], className="panel wide"),
            editor.layout_panel(),
            editor.editor_panel(),
        ], className="row"),
        timeline.layout(),
        experts.layout(),
        html.Div([
            html.Div([html.H3("Cluster"),
                      dcc.RadioItems(id="topo-metric", options=[{"label": " utilisation", "value": "utilization"},
                                                                {"label": " memory", "value": "memory"}],
                                     value="utilization", inline=True),
                      dcc.Graph(id="topology", config=GRAPH_CONFIG), image_buttons("topology"), learn("topology")],
                     className="panel half"),
            html.Div([html.H3("Memory per GPU"), dcc.Graph(id="memory", config=GRAPH_CONFIG), image_buttons("memory"),
                      html.Div([html.Button("Smallest cluster for this layout", id="fit-find", n_clicks=0,
                                            className="small"),
                                html.Span(id="fit-result", className="hint")], className="buttons"),
                      dcc.Interval(id="fit-poll", interval=700, disabled=True),
                      learn("memory")], className="panel half"),
        ], className="row"),
    ])


def graph_view(graph, strategy, collapse: bool, selected: list[str] | None) -> dict[str, Any]:
    """The op graph's drawing: collapsed, a model built from blocks is a stack of its blocks
    (:func:`app.views.block_stack`, the selected block expanded); else the layered DAG."""
    if collapse and any(op.block for op in graph.ops):
        return block_stack(graph, strategy, selected)
    cache = current().layouts
    key = (graph.fingerprint, bool(collapse))
    hit = cache.get(key)
    if hit is None:
        hit = graph_layout(graph, collapse)
        cache.put(key, hit)
    return hit


def _colours(graph, strategy, layout) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    labels = {op.name: config_label(strategy[op.name]) + f" on {len(strategy[op.name].devices)}" for op in graph.ops}
    palette: dict[str, str] = {}
    colour_of, hover = {}, {}
    for node in layout["nodes"]:
        ms = layout["members"][node]
        ls = {labels[m] for m in ms}
        lab = next(iter(ls)) if len(ls) == 1 else "mixed"
        if lab not in palette:
            palette[lab] = "#BBBBBB" if lab == "mixed" else CONFIG_PALETTE[len(palette) % len(CONFIG_PALETTE)]
        colour_of[node] = palette[lab]
        if len(ms) == 1:
            op = graph[ms[0]]
            hover[node] = (f"{op.name} ({op.kind})<br>out {' x '.join(map(str, op.out_tensors[0].shape))}"
                           f"<br>{op.fwd_flops / 1e9:.3g} GFLOP fwd · {op.param_count:,} params"
                           f"<br>{labels[op.name]} GPU(s)"
                           + (f"<br>{moe_text(op, strategy[op.name])}" if op.kind in ("router", "experts") else ""))
        else:
            hover[node] = f"{node}: {len(ms)} ops<br>{lab}"
    legend = {c: lab for lab, c in palette.items()}
    return colour_of, legend, hover


def _render_key(state: dict, collapse: bool, metric: str, gantt: dict) -> tuple:
    """What the Explore views of ``state`` depend on: its content (how the strategy was found
    and its recorded cost left out: the same configs draw the same views), the view options and
    the selection."""
    drawn = {k: v for k, v in state["strategy"].items() if k not in ("found_by", "cost")}
    return (content_key({**state, "strategy": drawn}), collapse, metric, tuple(state.get("selected") or ()),
            tuple(sorted(gantt.items())))


def render_explore(state: dict, collapse: bool = False, metric: str = "utilization",
                   gantt: dict | None = None, wait_s: float | None = None) -> dict[str, Any] | None:
    """Every Explore view for ``state``: summary cards, why-text, op graph, op panel, Gantt,
    topology and memory. Returns a dict keyed by component id.

    Views of a strategy already drawn (for this or another session: a first page load shows
    the same default to everyone) come from a small cache; the session's simulation is then
    built in the background, ready for its first edit. ``gantt``: the timeline's row options
    (:func:`app.tabs.timeline.gantt_view`). ``wait_s``: wait at most this long for the
    simulation, then return None while it goes on in the background."""
    gantt = {k: str(v)[:200] for k, v in (gantt if isinstance(gantt, dict) else {}).items()
             if k in timeline.GANTT_OPTIONS and v}
    metric = metric if metric in ("utilization", "memory") else "utilization"
    key = _render_key(state, bool(collapse), metric, gantt)
    sessions = current()
    hit = sessions.drawn.get(key)
    if hit is not None:
        if not sessions.has_workspace(state["sid"]):  # (ready for a first edit; bounded like any build)
            try:
                workspace_within(state, 0.0)
            except (ValueError, SoapboxError, Busy):
                pass
        sessions.last_drawn.put(state["sid"], state)
        return hit
    if wait_s is not None and workspace_within(state, wait_s) is None:
        return None
    out = draw_explore(state, bool(collapse), metric, gantt)
    sessions.drawn.put(key, out)
    sessions.last_drawn.put(state["sid"], state)
    return out


def pin_default(state: dict) -> None:
    """Keep the default page's views however idle (every first visit draws them)."""
    current().drawn.pinned.add(_render_key(state, True, "utilization", {}))


def sim_status_text(state: dict) -> str:
    """The line the page shows while the state's simulation runs in the background."""
    st = build_status(state) or {"phase": "starting", "elapsed_s": 0.0}
    return (f"Simulating off the page: {st['phase']} ({format_seconds(st['elapsed_s'])} so far). The views show "
            "the previous strategy until it is done; the page stays usable.")


def fit_view(state: Any, start: bool = False) -> tuple[str, bool]:
    """(the line under the memory chart, poll disabled): the smallest preset of the cluster's
    family on which the state's layout fits, scanned in the background when ``start``."""
    try:
        check_state(state)
        msg = fit_start(state) if start else ""
        st = fit_status(state)
    except (ValueError, SoapboxError) as e:
        return f"Cannot look for a cluster: {first_line(e)}", True
    if st is None:
        return msg, True
    return st[0], st[1]


def cancel_simulation(state: dict) -> tuple[dict, str]:
    """Stop the state's background simulation (it stops, within about a second) and go back to
    the state last drawn (a newer version, so the page redraws it)."""
    running = cancel_build(state["sid"])
    prev = current().last_drawn.get(state["sid"])
    if prev is None or prev.get("strategy") == state.get("strategy") and prev.get("model") == state.get("model"):
        return state, "Nothing to go back to." if not running else \
            "Stopped the simulation; no earlier view to go back to (pick another strategy)."
    back = dict(prev, version=int(state.get("version", 0)) + 1)
    return back, "Went back to the strategy shown before." + (" The simulation that was running was stopped."
                                                              if running else "")




def train_estimate(rate: dict | None, text: Any) -> str:
    """'1T tokens: 12.3 days on 64 GPUs (18,900 GPU-hours)' from the page's rate (units per
    second, GPUs used, GPUs in the cluster) and a count typed as 1T / 300B / 2e12; the reason
    when it cannot. GPU-hours count every GPU of the cluster: one the layout leaves idle is
    paid for too (the line says how many)."""
    if not isinstance(rate, dict) or not isinstance(rate.get("per_s"), (int, float)) or not rate["per_s"] > 0:
        return ""
    try:
        n = parse_count(text)
    except ValueError as e:
        return str(e)
    seconds = n / float(rate["per_s"])
    try:
        gpus = max(1, int(rate.get("gpus") or 1))
        total = max(gpus, int(rate.get("cluster_gpus") or gpus))
    except (TypeError, ValueError, OverflowError):
        return ""
    span = format_seconds(seconds) if seconds < 86400 else f"{seconds / 86400:,.1f} days"
    unit = str(rate.get("unit", "tokens"))[:10]
    idle = f" of {total:,} ({total - gpus:,} idle, counted in the GPU-hours)" if total > gpus else ""
    return (f"{format_count(int(n)) if n < 1e6 else f'{n:.3g}'} {unit}: {span} on {gpus:,} GPUs{idle} "
            f"({seconds * total / 3600:,.0f} GPU-hours), at the simulated rate, without failures")


def _symmetry_note(tl) -> str:
    """What the task count stands for, kept to a line: ' (8 of 64 GPUs simulated; the rest
    mirror them)' under symmetry; with the microbatches simulated when the timeline was
    unfolded from a steady short run (:mod:`engine.sim.unfold`): ' (16 of 1024 GPUs, 51 of 192
    microbatches simulated; the rest mirror or repeat them)'; else ''."""
    image = tl.tasks.info.get("device_image")
    parts = []
    if image is not None:
        reps, used = int(np.sum(image == np.arange(image.size))), int(np.sum(image >= 0))
        parts = [f"{reps} of {used} GPUs"] if reps < used else []
    st = tl.tasks.info.get("unfolded")
    if st is not None:
        parts.append(f"{st.simulated} of {st.microbatches} microbatches")
    if not parts:
        return ""
    rest = "mirror or repeat them" if len(parts) == 2 else "repeat them" if st is not None else "mirror them"
    return f" ({', '.join(parts)} simulated; the rest {rest})"


def _microbatch_note(tl) -> str:
    """The summary's sentence on the microbatches: how many were simulated and how the rest
    were drawn (a timeline unfolded from a steady short run), or why every one was simulated
    (``timeline.extra["every_microbatch"]``, :func:`engine.sim.steady.why_not_extrapolated`);
    '' otherwise."""
    st = tl.tasks.info.get("unfolded")
    if st is not None:
        every = "the one before" if st.period == 1 else f"the one {st.period} before"
        return (f" Of the {st.microbatches} microbatches, the first {st.simulated} were simulated: from microbatch "
                f"{st.first} on each repeats {every}, {st.period_s * 1e3:,.3f} ms later, and the rest are drawn from "
                "that repeat, task for task as simulating them all would.")
    why = tl.extra.get("every_microbatch")
    if why is not None:
        return f" All {tl.tasks.info.get('microbatches', 0)} microbatches were simulated ({why})."
    return ""


def _bubble_note(bubble: dict | None) -> str:
    """The pipeline's idle time in the summary, the schedule's bubble and the rest apart."""
    if not bubble or bubble["measured"] <= 0:
        return ""
    return (f" GPUs idle {bubble['measured']:.0%} of the time before the last backward: the pipeline schedule's "
            f"bubble accounts for {bubble['formula']:.0%}, stage imbalance and waits for transfers for the other "
            f"{bubble['beyond']:.0%} (the busiest GPU computes {bubble['busy_spread']:.0%} longer than the least "
            "busy).")


def draw_explore(state: dict, collapse: bool, metric: str, gantt: dict | None = None) -> dict[str, Any]:
    """Every Explore view of ``state`` drawn now, without the cache of drawn views
    (:func:`render_explore` is the page's path; this is what it calls on a miss)."""
    ws = workspace(state)
    g, c, tl = ws.graph, ws.cluster, ws.timeline
    s = ws.strategy
    paths = paths_in_background(tl)  # (the views that do not read the critical chain are made meanwhile)
    mem = ws.memory
    dp_cost = baseline_cost_s(state)
    dp_fits = baseline_fits(state)
    selected = [n for n in (state.get("selected") or []) if n in g.index]
    view = graph_view(g, s, collapse, selected)
    colour_of, legend, hover = _colours(g, s, view)
    sel_nodes = {n for n in view["nodes"] if set(view["members"][n]) & set(selected)}
    if view.get("expanded"):  # the whole row selected: its square ringed; else the ops picked in it
        row = view["expanded"]
        sel_nodes = {row} if set(view["members"][row]) <= set(selected) else sel_nodes - {row}
    used = sorted(s.devices_used())
    if metric == "memory":
        per_dev = np.where(mem.capacity_bytes > 0, mem.peak_bytes / mem.capacity_bytes, 0.0)
    else:
        per_dev = np.array(tl.utilization, dtype=float)
        image = tl.tasks.info.get("device_image")
        if image is not None:  # mirrored GPUs are as busy as the one they mirror
            has = image >= 0
            per_dev[has] = per_dev[image[has]]
    topo = topology_data(c, per_dev, metric)
    sel_devs = sorted({d for n in selected for d in s[n].devices})
    topo_fig = build_topology_figure(topo)
    # the Gantt's bars meanwhile too: only its critical-chain overlay, made last, waits for the paths
    gantt_fig, notes, gd = timeline.gantt_parts(ws, selected, None, gantt)
    paths.join()
    summ = summary_data(g, tl, mem, dp_cost if mem.feasible else None)
    if sel_devs:
        gp = {x["id"]: x for x in topo["gpus"]}
        topo_fig["data"].append(dict(
            type="scatter", x=[gp[d]["x"] for d in sel_devs], y=[gp[d]["y"] for d in sel_devs], mode="markers",
            marker=dict(size=24, symbol="square-open", color="#FFD400", line=dict(width=3)),
            name="selected op's GPUs", hoverinfo="skip"))
    dp_comm_bytes = baseline_comm_bytes(state)
    dp_comm = {"comm_bytes": dp_comm_bytes} if dp_comm_bytes else None
    u = mfu(g, tl.makespan_s, c, used)
    idle = c.num_devices - len(used)
    idle_note = (f" {idle:,} of the cluster's {c.num_devices:,} GPUs are left idle by this strategy (they count in "
                 "GPU-hours; a layout that uses them all may be faster)." if idle > 0 else "")
    return {
        "sum-time": format_seconds(summ["iteration_time_s"]),
        "sum-throughput": (format_rate(summ["tokens_per_s"], "tokens") if summ.get("tokens_per_s") else
                           format_rate(summ["throughput_samples_per_s"])) + (f", MFU {u:.0%}" if u is not None else ""),
        "sum-speedup": f"{summ['speedup_vs_data_parallel']:.2f}x" if summ["speedup_vs_data_parallel"] else
        "– (data parallel does not fit)" if dp_fits is False else "– (over memory)" if not mem.feasible else "–",
        "sum-comm": format_bytes(summ["comm_bytes"]),
        "sum-memory": format_bytes(summ["peak_memory_bytes"]) + ("" if summ["feasible"] else " (over!)"),
        "sum-tasks": format_count(summ["tasks"]) + _symmetry_note(tl),
        "rate": {"per_s": summ.get("tokens_per_s") or summ.get("throughput_samples_per_s"), "gpus": len(used),
                 "cluster_gpus": c.num_devices, "unit": "tokens" if summ.get("tokens_per_s") else "samples"},
        "why": why_text(summ, dp_comm, tl, mem) + _bubble_note(gd.get("bubble")) + _microbatch_note(tl) + idle_note
        + ("" if dp_fits is not False else " Data parallel does not fit in memory here: no speedup over it is given."),
        "op-graph": (build_block_stack_figure if view.get("stack") else build_op_graph_figure)(
            view, colour_of, legend, hover, sel_nodes),
        "op-panel": editor.op_panel(g, s, tl, selected, op_cost_mark(ws, selected[0]) if selected else None),
        "profile-note": coverage_note(ws) or profile_status(state),
        "gantt": gantt_fig,
        "gantt-notes": notes,
        "topology": topo_fig,
        "memory": build_memory_figure(memory_data(mem, used, stage_of_devices(s, c.num_devices),
                                                  expert_share=expert_param_share(g, s, c.num_devices))),
        "summary": summ,
    }


def register(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    props = {"op-graph": "figure", "gantt": "figure", "topology": "figure", "memory": "figure", "rate": "data"}
    sim_outputs = [Output("sim-status", "children"), Output("sim-poll", "disabled"), Output("sim-box", "style")]
    idle = ["", True, {"display": "none"}]
    why = EXPLORE_IDS.index("why")

    @app.callback([Output(i, props.get(i, "children")) for i in EXPLORE_IDS] + sim_outputs,
                  Input("state", "data"), Input("collapse", "value"), Input("topo-metric", "value"),
                  Input("sim-poll", "n_intervals"),
                  State("gantt-rows", "value"), State("gantt-links", "value"), State("gantt-filter", "value"))
    def _explore(state, collapse, metric, _tick, g_rows, g_links, g_filter):
        if not state:
            return [no_update] * len(EXPLORE_IDS) + idle
        t = time.perf_counter()
        try:
            check_state(state)
            # a poll only looks; an action waits a little (what takes longer goes on off the page)
            wait = 0.2 if ctx.triggered_id == "sim-poll" else INLINE_WAIT_S
            out = render_explore(state, bool(collapse), str(metric or "utilization"),
                                 {"rows": g_rows, "links": g_links, "filter": g_filter}, wait_s=wait)
            if out is None:
                return [no_update] * len(EXPLORE_IDS) + [sim_status_text(state), False, {"display": "flex"}]
        except Cancelled:
            return [no_update] * len(EXPLORE_IDS) + idle
        except (ValueError, SoapboxError, Busy, TimeoutError) as e:  # a stale or crafted state, a busy server
            return [no_update] * why + [f"Cannot draw this state: {first_line(e)}"] + \
                [no_update] * (len(EXPLORE_IDS) - why - 1) + idle
        app.server.logger.debug("explore rendered in %.1f ms", (time.perf_counter() - t) * 1e3)
        return [wire(out[i]) for i in EXPLORE_IDS] + idle

    @app.callback(Output("fit-result", "children"), Output("fit-poll", "disabled"),
                  Input("fit-find", "n_clicks"), Input("fit-poll", "n_intervals"), Input("state", "data"),
                  prevent_initial_call=True)
    def _fit(_n, _tick, state):
        return fit_view(state, start=ctx.triggered_id == "fit-find")

    @app.callback(Output("train-estimate", "children"), Input("rate", "data"), Input("train-tokens", "value"))
    def _train(rate, tokens):
        return train_estimate(rate, tokens)

    editor.register(app)
    timeline.register(app)
    experts.register(app)
