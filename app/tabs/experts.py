"""Explore's expert panel (mixture-of-experts models): tokens and time per expert and per
expert-parallel rank for one MoE layer, under balanced routing and under the routing-imbalance
what-if (a Zipf skew or an uploaded histogram of tokens per expert), the busiest rank that
gates the step, and the iteration time re-simulated with the what-if
(:attr:`engine.strategy.Strategy.expert_loads`).

Published MoE runs are measured with balanced routing (Megatron-Core's performance tables
force it: ``--moe-router-force-load-balancing``); soapbox simulates balanced routing unless a
what-if is applied, and the panel says so. Hidden for a dense model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from dash import Dash, Input, Output, State, dcc, html, no_update

from engine.errors import SoapboxError
from engine.moe import MAX_HISTOGRAM_BYTES, MAX_SKEW, expert_loads, gate_factor, parse_histogram, rank_loads
from engine.ops import EXPERT, experts_capacity_share
from engine.taskgraph import BWD, COLL, COLL_INDEX, FWD

from ..actions import set_expert_loads
from ..components import GRAPH_CONFIG, first_line, image_buttons, learn
from ..figures import build_expert_figure, empty_figure
from ..fmt import format_count, format_seconds
from ..sessions import current
from ..simulation import workspace
from ..sources import APP_MAX_TASKS, graph_of
from ..state import check_state, content_key
from ..uploads import decode_upload

__all__ = ["layout", "register", "moe_layers", "read_histogram", "whatif_loads", "apply_whatif",
           "expert_table", "expert_view", "MAX_HISTOGRAM_BYTES", "BALANCED_NOTE"]

#: what the panel says of published runs (and of soapbox's default)
BALANCED_NOTE = ("Published MoE runs are measured with balanced routing (Megatron-Core's performance tables force "
                 "it; balancing losses keep real runs near it), and soapbox simulates balanced routing unless you "
                 "apply a what-if here.")


def moe_layers(graph) -> list[str]:
    """The graph's ``experts`` ops (one per MoE layer), in graph order."""
    return [op.name for op in graph.ops if op.kind == "experts"]


def read_histogram(contents: Any, filename: Any, graph) -> tuple[dict | None, str]:
    """(the histogram to keep, the line to show) from an upload: None and the reason when it
    cannot be used (the histogram kept before stays). The file is read as the CLI's
    ``--routing-histogram`` reads it (the same cap, :func:`engine.moe.parse_histogram`), so a
    file is taken or refused alike, with the same reason."""
    name = str(filename or "histogram")[:100]
    counts_of = sorted({op.attrs["num_experts"] for op in graph.ops if op.kind == "experts"})
    if not counts_of:
        return None, f"{name}: {graph.name} has no mixture-of-experts layers."
    too_large = f"{name}: the file is larger than the limit of {MAX_HISTOGRAM_BYTES / 2**20:g} MiB"
    try:
        if isinstance(contents, str) and len(contents) > MAX_HISTOGRAM_BYTES * 4 // 3 + 200:
            raise ValueError(too_large)  # (before decoding: base64 is 4/3 the bytes)
        raw = decode_upload(contents, name, binary=True)
        if len(raw) > MAX_HISTOGRAM_BYTES:
            raise ValueError(too_large)
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{name}: not UTF-8 text (byte {e.start})") from None
        counts = parse_histogram(text, name)
    except ValueError as e:
        return None, f"Histogram refused: {first_line(e)}. The what-if is unchanged."
    if len(counts) not in counts_of:
        return None, (f"Histogram refused: {name} lists {len(counts)} experts; {graph.name} has "
                      f"{' or '.join(map(str, counts_of))} per layer. The what-if is unchanged.")
    return {"counts": counts, "filename": name}, f"Histogram {name}: {len(counts)} experts, " \
                                                  f"{format_count(int(sum(counts)))} tokens."


def whatif_loads(graph, whatif: Any) -> tuple[list[float] | None, str]:
    """The expert shares the panel's controls describe (``whatif``: source ``skew`` or
    ``histogram``, the skew, the kept histogram) and their name; ValueError saying what is
    missing or out of range."""
    w = whatif if isinstance(whatif, dict) else {}
    counts = sorted({op.attrs["num_experts"] for op in graph.ops if op.kind == "experts"})
    if not counts:
        raise ValueError(f"{graph.name} has no mixture-of-experts layers")
    if w.get("source") == "histogram":
        hist = w.get("histogram")
        if not isinstance(hist, dict) or not isinstance(hist.get("counts"), list):
            raise ValueError("no histogram uploaded yet (drop a file of token counts per expert)")
        return expert_loads(counts[0], histogram=hist["counts"]).tolist(), \
            f"histogram {str(hist.get('filename', ''))[:60]}"
    skew = w.get("skew", 0.0)
    if isinstance(skew, bool) or not isinstance(skew, (int, float)):
        raise ValueError(f"the skew must be a number from 0 to {MAX_SKEW:g}")
    return expert_loads(counts[0], float(skew)).tolist(), f"Zipf skew {float(skew):g}"


def apply_whatif(state: dict, whatif: Any) -> tuple[dict, str]:
    """The reducer's ``expert-apply``: the what-if on the state's strategy (re-simulated by the
    views); skew 0 is balanced routing. Refused, the state unchanged, with the reason."""
    try:
        loads, what = whatif_loads(graph_of(state), whatif)
    except ValueError as e:
        return state, f"Routing what-if refused: {first_line(e)}."
    if max(loads) - min(loads) < 1e-12:
        return set_expert_loads(state, None, "balanced")
    return set_expert_loads(state, loads, what)


def _ep_of(op, cfg) -> tuple[int, int]:
    """(ep, etp) of an experts op's config: the degrees of its expert dims, of its ffn dim."""
    return int(np.prod([cfg.degree(d.name) for d in op.dims if d.kind == EXPERT])), cfg.degree("ffn")


def expert_table(graph, strategy, timeline, layer: str, loads: Any = None) -> dict[str, Any]:
    """Tokens and time per expert and per expert-parallel rank of the MoE layer ``layer`` (an
    ``experts`` op) over one iteration, under ``loads`` (expert shares; None: balanced).

    Token copies: the layer's tokens x top_k (x the capacity share when tokens are dropped),
    each expert receiving its share over all its expert-data-parallel replicas; a rank of one
    expert-parallel group receives 1 / edp of them for its experts. Time: the simulated
    experts' compute (forward and backward) of one rank, made balanced (the simulation prices
    every rank at the busiest's load when the strategy has a what-if, :func:`engine.moe.
    gate_factor`), then shared out by load: a rank's own work is its load x ep x the balanced
    rank's, and every rank ends with the busiest (the combine all-to-all waits for it).
    """
    op = graph[layer]
    cfg = strategy[layer]
    ep, etp = _ep_of(op, cfg)
    n_exp = op.attrs["num_experts"]
    edp = max(1, len(cfg.devices) // (ep * etp))
    shares = expert_loads(n_exp, histogram=loads) if loads is not None else expert_loads(n_exp)
    ranks = rank_loads(shares, ep)
    x = op.in_tensors[0]
    copies = float(np.prod(x.shape[:-1])) * op.attrs["top_k"] * experts_capacity_share(op.attrs)
    tg = timeline.tasks
    oi = graph.index[layer]
    mine = np.flatnonzero((tg.op == oi) & ((tg.kind == FWD) | (tg.kind == BWD)))
    dev = int(tg.device[mine[0]]) if mine.size else -1
    applied = gate_factor(np.asarray(strategy.expert_loads), ep) if strategy.expert_loads is not None else 1.0
    rank_s = float(tg.dur_s[mine[tg.device[mine] == dev]].sum()) / applied if mine.size else 0.0
    a2a_s = 0.0
    coll = tg.info.get("coll_devices")
    if coll is not None and dev >= 0:
        ptr, idx, tasks = coll
        ours = (tg.op[tasks] == oi) & (tg.kind[tasks] == COLL) & (tg.coll[tasks] == COLL_INDEX["all_to_all"])
        for i in np.flatnonzero(ours):
            if dev in idx[ptr[i]:ptr[i + 1]]:
                a2a_s += float(tg.dur_s[tasks[i]])
    per = n_exp // ep
    busiest = int(np.argmax(ranks))
    return {"layer": layer, "layer_short": layer.rsplit(".mlp", 1)[0], "experts": n_exp, "top_k": op.attrs["top_k"],
            "ep": ep, "etp": etp, "edp": edp, "experts_per_rank": per,
            "expert_share": shares.tolist(), "expert_tokens": (shares * copies).tolist(),
            "rank_share": ranks.tolist(), "rank_tokens": (ranks * copies / edp).tolist(),
            "rank_own_s": (ranks * ep * rank_s).tolist(), "balanced_rank_s": rank_s,
            "balanced_expert_tokens": copies / n_exp, "busiest_rank": busiest,
            "busiest_experts": (busiest * per, busiest * per + per - 1), "gate": gate_factor(shares, ep),
            "a2a_s": a2a_s, "a2a_applied_gate": applied, "device": dev}


def _balanced_time_s(state: dict, ws) -> float | None:
    """The page's strategy simulated with balanced routing (for the iteration-time effect of an
    applied what-if), once per state content."""
    from engine.sim.report import simulate_strategy

    key = ("moe-balanced", content_key(state))
    cache = current().baselines
    hit = cache.get(key)
    if hit is None:
        try:
            s = replace(ws.strategy, expert_loads=None)
            hit = (simulate_strategy(ws.graph, s, ws.cluster, check=False, symmetry="auto",
                                     max_tasks=APP_MAX_TASKS, account_memory=False).iteration_time_s,)
        except (ValueError, SoapboxError):
            hit = ()
        cache.put(key, hit)
    return hit[0] if hit else None


def expert_view(state: dict, layer: Any, whatif: Any) -> tuple[Any, list[dict], str, list]:
    """(figure, the layer picker's options, the layer shown, the summary's paragraphs) of the
    expert panel for ``state``: the controls' what-if (``whatif`` as :func:`whatif_loads` reads
    it) drawn against balanced routing, and the applied one's iteration time against balanced."""
    ws = workspace(state, wait_s=30.0)
    g, s, tl = ws.graph, ws.strategy, ws.timeline
    layers = moe_layers(g)
    options = [{"label": n.rsplit(".mlp", 1)[0] + " experts", "value": n} for n in layers]
    if not layers:
        return empty_figure("No mixture-of-experts layers in this model."), options, None, []
    shown = layer if isinstance(layer, str) and layer in layers else layers[0]  # (a crafted list or dict: the first)
    try:
        loads, what = whatif_loads(g, whatif)
        problem = ""
    except ValueError as e:
        loads, what, problem = None, "balanced", f"What-if not drawn: {first_line(e)}. "
    t = expert_table(g, s, tl, shown, loads)
    e0, e1 = t["busiest_experts"]
    experts = f"expert {e0}" if e0 == e1 else f"experts {e0}–{e1}"
    balanced = loads is None or t["gate"] <= 1.0 + 1e-9
    body = (f"{t['experts']} experts, top-{t['top_k']}, ep {t['ep']} x etp {t['etp']}, expert data parallel "
            f"{t['edp']}: {t['experts_per_rank']} expert{'s' if t['experts_per_rank'] > 1 else ''} per rank. ")
    if balanced:
        body += (f"Balanced routing: each rank works {format_seconds(t['balanced_rank_s'])} per iteration on this "
                 "layer's experts; no rank waits for another.")
    else:
        body += (f"Under {what}, EP rank {t['busiest_rank']} ({experts}) receives "
                 f"{t['rank_share'][t['busiest_rank']]:.0%} of the token copies, {t['gate']:.2f}x a balanced "
                 "rank's: every rank waits for it at the combine all-to-all (the slowest expert gates the step), so "
                 f"this layer's experts take {format_seconds(t['balanced_rank_s'] * t['gate'])} instead of "
                 f"{format_seconds(t['balanced_rank_s'])} per iteration, and the all-to-alls carry the busiest rank's share too.")
    applied = s.expert_loads is not None
    now = format_seconds(tl.makespan_s)
    if applied:
        base = _balanced_time_s(state, ws)
        gate_now = gate_factor(np.asarray(s.expert_loads), t["ep"])
        effect = (f"Simulated now: the applied what-if (busiest rank {gate_now:.2f}x), iteration {now}"
                  + (f" against {format_seconds(base)} balanced ({tl.makespan_s / base - 1:+.0%})." if base else "."))
    else:
        effect = f"Simulated now: balanced routing, iteration {now}."
    drawn = None if balanced else np.asarray(t["expert_share"])
    if applied != (drawn is not None) or (applied and not np.allclose(np.asarray(s.expert_loads), drawn, atol=1e-9)):
        effect += (" Press 'Apply what-if' to re-simulate the iteration with the distribution drawn."
                   if drawn is not None else " The controls show balanced routing: press 'Balanced routing' to "
                   "simulate it.")
    a2a = (f" As simulated now, this layer's all-to-alls take {format_seconds(t['a2a_s'])} per iteration on GPU "
           f"{t['device']}.") if t["a2a_s"] > 0 else ""
    return build_expert_figure(t), options, shown, [html.P(problem + body + a2a), html.P(effect)]


def layout() -> html.Div:
    return html.Div([
        html.H3("Experts (mixture of experts)"),
        html.P(BALANCED_NOTE, className="hint"),
        html.Div([
            html.Div([html.Label("MoE layer", htmlFor="expert-layer"),
                      dcc.Dropdown(id="expert-layer", clearable=False, searchable=True)], className="expert-pick"),
            html.Div([html.Label("routing what-if", htmlFor="expert-source"),
                      dcc.RadioItems(id="expert-source", value="skew", inline=True, options=[
                          {"label": " skew (Zipf)", "value": "skew"},
                          {"label": " uploaded histogram", "value": "histogram"}])], className="expert-pick"),
            html.Div([html.Label("skew: 0 balanced, 1 Zipf, up to 4", htmlFor="expert-skew"),
                      dcc.Slider(id="expert-skew", min=0.0, max=MAX_SKEW, step=0.1, value=0.0,
                                 marks={i: str(i) for i in range(int(MAX_SKEW) + 1)},
                                 tooltip={"placement": "bottom"})], className="expert-skew"),
        ], className="expert-controls"),
        dcc.Upload(id="expert-upload", children=html.Div([
            "Drop or ", html.A("choose"), " a histogram: token counts per expert (JSON, CSV or one a line)"]),
                   className="upload", multiple=False),
        dcc.Store(id="expert-upload-ok", storage_type="memory"),
        dcc.Store(id="expert-hist", storage_type="memory"),
        html.P(id="expert-hist-note", className="hint", role="status"),
        html.Div([html.Button("Apply what-if: re-simulate", id="expert-apply", n_clicks=0, className="primary"),
                  html.Button("Balanced routing", id="expert-balanced", n_clicks=0)], className="buttons"),
        html.Div(id="expert-summary", className="why"),
        dcc.Graph(id="expert-figure", config=GRAPH_CONFIG), image_buttons("expert-figure"),
        learn("experts"),
    ], className="panel", id="expert-panel", style={"display": "none"})


def register(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    app.clientside_callback(
        f"""
        function(contents, filename) {{
            if (!contents) {{ return [window.dash_clientside.no_update, window.dash_clientside.no_update]; }}
            const bytes = Math.floor((contents.length - contents.indexOf(',') - 1) * 3 / 4);
            if (bytes > {MAX_HISTOGRAM_BYTES}) {{
                return [window.dash_clientside.no_update, 'Histogram refused: ' + filename + ': the file is larger '
                        + 'than the limit of {MAX_HISTOGRAM_BYTES / 2**20:g} MiB. The what-if is unchanged.'];
            }}
            return [{{contents: contents, filename: filename}}, window.dash_clientside.no_update];
        }}
        """,
        Output("expert-upload-ok", "data"), Output("expert-hist-note", "children", allow_duplicate=True),
        Input("expert-upload", "contents"), State("expert-upload", "filename"), prevent_initial_call=True)

    @app.callback(Output("expert-hist", "data"), Output("expert-hist-note", "children"),
                  Output("expert-source", "value"), Input("expert-upload-ok", "data"), State("state", "data"),
                  prevent_initial_call=True)
    def _upload(up, state):
        try:
            check_state(state)
            up = up if isinstance(up, dict) else {}
            kept, note = read_histogram(up.get("contents"), up.get("filename"), graph_of(state))
        except (ValueError, SoapboxError) as e:
            return no_update, f"Histogram refused: {first_line(e)}.", no_update
        return (kept, note, "histogram") if kept is not None else (no_update, note, no_update)

    @app.callback(Output("expert-panel", "style"), Output("expert-figure", "figure"),
                  Output("expert-layer", "options"), Output("expert-layer", "value"),
                  Output("expert-summary", "children"),
                  Input("state", "data"), Input("expert-layer", "value"), Input("expert-source", "value"),
                  Input("expert-skew", "value"), Input("expert-hist", "data"), Input("sim-poll", "n_intervals"))
    def _view(state, layer, source, skew, hist, _tick):
        hidden = {"display": "none"}
        try:
            check_state(state)
            if not moe_layers(graph_of(state)):
                return hidden, no_update, [], None, []
            fig, options, shown, text = expert_view(state, layer, {"source": source, "skew": skew,
                                                                   "histogram": hist})
        except (ValueError, SoapboxError, TimeoutError) as e:
            return no_update, no_update, no_update, no_update, [html.P(f"Cannot draw the experts: {first_line(e)}")]
        return {}, fig, options, (no_update if shown == layer else shown), text
