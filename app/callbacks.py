"""Callbacks: plain functions of their inputs (tests call them directly), wired to the page by
:func:`register`.

State flows one way: every user action goes through :func:`on_event`, which returns a new
state (the session's ``dcc.Store``) and a message; the views are drawn from the state by
:func:`render_explore` and friends.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
import threading
import time
from typing import Any

import numpy as np
from dash import ALL, Dash, Input, Output, State, ctx, dcc, html, no_update

from engine.trace import trace_events
from engine.errors import SoapboxError, ValidationError
from engine.formats import load_strategy
from engine.models import MAX_SAMPLE_BATCH
from engine.strategy import strategy_from_dict

from . import jobs
from .cache import IdleCache
from .layout import cluster_options, model_options
from . import workspace as W
from .figures import (CONFIG_PALETTE, build_block_stack_figure, build_compare_figure, build_gantt_figure,
                      build_memory_figure, build_op_graph_figure, build_topology_figure, build_trace_figure,
                      empty_figure, gantt_notes)
from .fmt import format_bytes, format_count, format_rate, format_seconds
from .views import (block_stack, config_diff, config_label, gantt_data, graph_layout, memory_data, mfu, op_details,
                    stage_of_devices, summary_data, topology_data, why_text)

__all__ = ["on_event", "warm_up", "render_explore", "render_editor", "render_compare", "zoom_gantt", "decode_upload",
           "search_start", "search_poll", "search_poll_changed", "search_stop", "export_strategy", "export_trace", "share_link",
           "register", "MAX_UPLOAD_BYTES"]

#: largest file accepted by the upload box (a GPT-3 model file is ~1 MB, a 20,000-op model ~6 MB)
MAX_UPLOAD_BYTES = 16_000_000
#: points of a search's trace drawn (a long search's rows are thinned evenly, the last kept)
MAX_TRACE_POINTS = 1500


# --------------------------------------------------------------------------- events -> state


def decode_upload(contents: str, filename: str, binary: bool = False) -> str | bytes:
    """The text (or with ``binary`` the bytes) of a ``dcc.Upload`` data URL; raises ValueError
    saying what is wrong."""
    if not contents or "," not in contents:
        raise ValueError(f"{filename}: empty upload")
    payload = contents.split(",", 1)[1]
    if len(payload) * 3 // 4 > MAX_UPLOAD_BYTES:
        raise ValueError(f"{filename}: larger than {format_bytes(MAX_UPLOAD_BYTES)}; soapbox files are far smaller")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{filename}: the upload is not valid base64 data") from None
    if binary:
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{filename}: not a UTF-8 text file (byte {e.start} is not text); "
                         "soapbox reads JSON files") from None


def _detach_search(old: dict | None, new: dict, msg: str) -> tuple[dict, str]:
    """Stop the session's running search when the model or cluster changed under it (its
    answer would be for the old ones); say so."""
    if old is None or new is old or (old.get("model") == new.get("model") and old.get("cluster") == new.get("cluster")):
        return new, msg
    try:
        stopped = jobs.stop(old["sid"])
    except Exception:  # (a store that cannot be reached: the change stands)
        stopped = False
    return new, msg + (" The search running for the previous model or cluster was stopped." if stopped else "")


def on_event(trigger: str | None, state: dict | None, **kw: Any) -> tuple[dict, str]:
    """:func:`_on_event`, stopping a search whose model or cluster the action replaced."""
    new, msg = _on_event(trigger, state, **kw)
    if trigger in ("pick-model", "pick-cluster", "pick-batch", "pick-seq", "pick-precision", "upload",
                   "tour") and isinstance(state, dict):
        return _detach_search(state, new, msg)
    return new, msg


def _on_event(trigger: str | None, state: dict | None, *, query: str = "", model: str | None = None,
             cluster: str | None = None, baseline: str | None = None, upload: str | None = None,
             filename: str | None = None, ops: list[str] | None = None, degrees: dict[str, Any] | None = None,
             devices: str | None = None, click: dict | None = None, compare_name: str | None = None,
             batch: Any = None, layout: dict | None = None, step: str | None = None,
             size: Any = None) -> tuple[dict, str]:
    """Apply one user action to the session state.

    ``trigger`` names the component that fired; the keyword arguments carry what it sent.
    Returns (new state, message). Nothing here raises for bad input: a refused action
    returns the state unchanged and a message naming what and where.
    """
    if state is not None:
        try:
            W.check_state(state)
        except ValueError as e:  # a state from an older soapbox, or a crafted one
            return W.new_state(), f"The page's saved state could not be used ({_first_line(e)}); starting afresh."
    if state is None or trigger in (None, "url"):
        if state is not None:
            return state, ""
        try:
            return W.state_from_query(query or "")
        except Exception as e:  # a damaged link still opens the default
            return W.new_state(), f"The link could not be loaded ({_first_line(e)}); showing the default instead."
    try:
        if trigger == "pick-model" and model and model != state["model"].get("name"):
            try:
                return _fresh(state, model=model), f"Model: {model}, under {state.get('baseline', 'data-parallel')}."
            except ValidationError as e:
                hint = (" Pick a cluster whose GPUs have it first (the A100, H100 and H200 presets)."
                        if any("peak" in p.message for p in e.problems) else "")
                return state, (f"{model} cannot run on {state['cluster'].get('name', 'this cluster')}: "
                               f"{'; '.join(p.message for p in e.problems[:3])}.{hint}")
        if trigger == "pick-batch":
            return _set_size(state, "batch", batch)
        if trigger in ("pick-seq", "pick-precision"):
            return _set_size(state, "seq_len" if trigger == "pick-seq" else "precision", size)
        if trigger == "tour":
            return W.tour(state, str(step or ""))
        if trigger == "sim-cancel":
            return cancel_simulation(state)
        if trigger == "layout-apply":
            form = dict(layout or {})
            return W.apply_layout(state, str(form.pop("kind", "megatron")), form)
        if trigger == "pick-cluster" and cluster and (cluster != state["cluster"].get("name")
                                                       or "data" in state["cluster"]):
            return _fresh(state, cluster=cluster), f"Cluster: {cluster}."
        if trigger == "pick-baseline" and baseline and baseline != state.get("baseline"):
            return W.select_baseline(state, baseline)
        if trigger == "upload" and upload is not None:
            onnx_file = str(filename or "").lower().endswith(".onnx")
            try:
                text = decode_upload(upload, filename or "upload", binary=onnx_file)
            except ValueError as e:
                return state, f"Import refused: {e}"
            if onnx_file:
                new, msg, ok = W.import_onnx_file(state, text, filename or "upload.onnx")
            else:
                new, msg, ok = W.import_file(state, text, filename or "upload")
            return new, msg if ok else f"Import refused: {msg}"
        if trigger == "edit-apply":
            try:
                devs = W.parse_devices(devices or "", W.cluster_of(state).num_devices)
                deg = {dim: _degree(dim, v) for dim, v in (degrees or {}).items()}
            except ValueError as e:
                return state, f"Edit refused: {e}"
            new, msg = W.apply_edit(state, list(ops or state.get("selected") or []), deg, devs)
            if new is not state:
                new["selected"] = list(ops or state.get("selected") or [])
            return new, msg
        if trigger == "undo":
            return W.undo(state)
        if trigger == "redo":
            return W.redo(state)
        if trigger == "op-graph" and click:
            pts = click.get("points") or []
            if not pts or "customdata" not in pts[0]:
                return state, ""
            node = pts[0]["customdata"]
            g = W.graph_of(state)
            layout = _graph_view(g, W._strategy(state), bool(state.get("collapse")), None)
            members = layout["members"].get(node) or ([node] if node in g.index else [])
            if not members:
                return state, ""
            new = dict(state, selected=members)
            name = layout.get("labels", {}).get(node, node).split(" · ")[0]  # a run of blocks: "layers.0–15 (16 ...)"
            if name.endswith(")"):
                name = name[:-1] + f", {len(members)} ops)"
            elif len(members) > 1:
                name += f" ({len(members)} ops)"
            return new, f"Selected {name}."
        if trigger == "edit-ops":
            return dict(state, selected=list(ops or [])), ""
        if trigger == "search-adopt":
            found = jobs.best(state["sid"])
            if found is None:
                return state, "No finished search to adopt yet."
            best, cost_s = found
            try:
                best = load_strategy(best.to_dict(), W.graph_of(state), W.cluster_of(state))
            except ValueError:
                return state, "The search's best was found for another model or cluster; run a search here first."
            return W.adopt_strategy(state, best, f"Adopted the search's best ({format_seconds(cost_s)}).")
        if trigger == "compare-add":
            return W.add_to_compare(state, compare_name)
        if trigger == "compare-clear":
            return dict(state, compare=[]), "Cleared the comparison."
    except ValidationError as e:
        return state, f"That did not work: {W.problems_summary(e)}"
    except Exception as e:  # never lose the session over one action
        return state, f"That did not work: {type(e).__name__}: {str(e)[:500]}"
    return state, ""


def _first_line(e: Exception) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    if len(lines) > 1 and lines[0].endswith("found:"):
        return lines[0].rsplit(":", 2)[0] + ": " + lines[1].lstrip("- ")
    return lines[0] if lines else type(e).__name__


def _degree(dim: str, value: Any) -> int:
    """A degree typed by the user (empty: 1); ValueError naming the dim otherwise."""
    if value in (None, ""):
        return 1
    try:
        f = float(value)
        ok = math.isfinite(f) and f == int(f) and f >= 1
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"degree of {dim}: {value!r} is not a whole number >= 1")
    return int(f)


def _fresh(state: dict, model: str | None = None, cluster: str | None = None, sizes: dict | None = None) -> dict:
    """A new state for another sample model, preset cluster or model size, keeping the session
    id, the starting baseline (data parallel where it cannot run) and the model's sizes (batch,
    sequence length, precision) while the model stays the same (``sizes``: the ones to change,
    None for the model's default)."""
    m = model or (state["model"]["name"] if "data" not in state["model"] else W.DEFAULT_MODEL)
    c = cluster or (state["cluster"]["name"] if "data" not in state["cluster"] else W.DEFAULT_CLUSTER)
    kept = {k: state["model"].get(k) for k in W.MODEL_SIZES} if model is None else {}
    kept.update(sizes or {})
    try:
        new = W.new_state(m, c, state.get("baseline", "data-parallel"), sid=state["sid"], **kept)
    except ValueError:
        new = W.new_state(m, c, "data-parallel", sid=state["sid"], **kept)
    new["version"] = state.get("version", 0) + 1
    return new


#: the header's model sizes: (state key, what the message calls it, its unit)
_SIZES = {"batch": ("Batch", "samples"), "seq_len": ("Sequence length", "tokens"), "precision": ("Precision", "")}


def _set_size(state: dict, key: str, value: Any) -> tuple[dict, str]:
    """The sample model at another global batch (samples), sequence length (tokens) or
    precision (empty: its default); the strategy starts again from the baseline (a strategy's
    splits are made for one shape)."""
    what, unit = _SIZES[key]
    if key == "precision" and value == "default":
        value = None
    if "upload" in state["model"]:
        return state, f"{what} refused: an imported model states its own (export it with another one)."
    if "upload" in state["cluster"]:
        return state, f"{what} refused: it applies on preset clusters (pick one; the imported cluster stays as it is)."
    if value is None or (isinstance(value, str) and not value.strip()):
        if key not in state["model"]:
            return state, ""
        new = _fresh(state, sizes={key: None})
        return new, f"{what}: the model's default ({_size_text(W.graph_of(new), key)})."
    if key == "precision":
        v = str(value)[:20]
    else:
        try:
            v = int(value)
            if isinstance(value, bool) or v != float(value):
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            return state, f"{what} refused: {str(value)[:40]!r} is not a whole number of {unit}."
        top = MAX_SAMPLE_BATCH if key == "batch" else W.MAX_SAMPLE_SEQ
        if not 1 <= v <= top:
            return state, f"{what} refused: {v:,} {unit}; it must be from 1 to {top:,}."
    if v == state["model"].get(key):
        return state, ""
    try:
        new = _fresh(state, sizes={key: v})
    except ValueError as e:
        return state, f"{what} refused: {_first_line(e)}"
    msg = f"{what}: {_size_text(W.graph_of(new), key)}, under {new.get('baseline', 'data-parallel')}"
    if key == "batch":
        msg += f" ({v / W.cluster_of(new).num_devices:g} per GPU)"
    return new, msg + "."


def _size_text(graph, key: str) -> str:
    if key == "batch":
        return f"{graph.batch_size:,} samples"
    if key == "precision":
        return graph.precision
    from .views import tokens_per_sample

    return f"{tokens_per_sample(graph) or 0:,} tokens"


# --------------------------------------------------------------------------- views


def _graph_view(graph, strategy, collapse: bool, selected: list[str] | None) -> dict[str, Any]:
    """The op graph's drawing: collapsed, a model built from blocks is a stack of its blocks
    (:func:`app.views.block_stack`, the selected block expanded); else the layered DAG."""
    if collapse and any(op.block for op in graph.ops):
        return block_stack(graph, strategy, selected)
    return graph_layout(graph, collapse)


def _colours(graph, strategy, layout) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    labels: dict[str, str] = {}
    for op in graph.ops:
        labels[op.name] = config_label(strategy[op.name]) + f" on {len(strategy[op.name].devices)}"
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
                           f"<br>{op.fwd_flops / 1e9:.3g} GFLOP fwd · {op.param_count:,} params<br>{labels[op.name]} GPU(s)")
        else:
            hover[node] = f"{node}: {len(ms)} ops<br>{lab}"
    legend = {c: lab for lab, c in palette.items()}
    return colour_of, legend, hover


#: drawn Explore views by content (the default page, drawn at warm-up, is pinned: kept however idle)
_render_cache = IdleCache(12)


def _render_key(state: dict, collapse: bool, metric: str, gantt: dict | None = None) -> tuple:
    content = json.dumps([state["model"], state["cluster"], state["strategy"]["ops"],
                          {k: v for k, v in state["strategy"].items() if k not in ("ops", "found_by", "cost")}],
                         sort_keys=True)
    return (hashlib.sha256(content.encode()).hexdigest(), collapse, metric, tuple(state.get("selected") or ()),
            tuple(sorted((gantt or {}).items())))


def render_explore(state: dict, collapse: bool = False, metric: str = "utilization",
                   gantt: dict | None = None, wait_s: float | None = None) -> dict[str, Any] | None:
    """Every Explore view for ``state``: summary cards, why-text, op graph, op panel, Gantt,
    topology and memory. Returns a dict keyed by component id.

    Views of a strategy already drawn (for this or another session: a first page load shows
    the same default to everyone) come from a small cache; the session's simulation is then
    built in the background, ready for its first edit. ``gantt``: the timeline's row options
    (:func:`gantt_view`). ``wait_s``: wait at most this long for the simulation, then return
    None while it goes on in the background (:func:`app.workspace.workspace_within`)."""
    gantt = {k: str(v)[:200] for k, v in (gantt or {}).items() if k in GANTT_OPTIONS and v}
    key = _render_key(state, collapse, metric, gantt)
    hit = _render_cache.get(key)
    if hit is not None:
        if not W.has_workspace(state["sid"]):
            threading.Thread(target=W.workspace, args=(state,), daemon=True).start()
        _last_drawn.put(state["sid"], state)
        return hit
    if wait_s is not None and W.workspace_within(state, wait_s) is None:
        return None
    out = _render_explore(state, collapse, metric, gantt)
    _render_cache.put(key, out)
    _last_drawn.put(state["sid"], state)
    return out


#: the last state each session's Explore views were drawn for (where "Cancel" goes back to)
_last_drawn = IdleCache(64)


def sim_status_text(state: dict) -> str:
    """The line the page shows while the state's simulation runs in the background."""
    st = W.build_status(state) or {"phase": "starting", "elapsed_s": 0.0}
    return (f"Simulating off the page: {st['phase']} ({format_seconds(st['elapsed_s'])} so far). The views show "
            "the previous strategy until it is done; the page stays usable.")


def fit_view(state: Any, start: bool = False) -> tuple[str, bool]:
    """(the line under the memory chart, poll disabled): the smallest preset of the cluster's
    family on which the state's layout fits, scanned in the background when ``start``."""
    try:
        W.check_state(state)
        msg = W.fit_start(state) if start else ""
        st = W.fit_status(state)
    except (ValueError, SoapboxError) as e:
        return f"Cannot look for a cluster: {_first_line(e)}", True
    if st is None:
        return msg, True
    return st[0], st[1]


def cancel_simulation(state: dict) -> tuple[dict, str]:
    """Stop waiting for the state's background simulation and go back to the state last drawn
    (a newer version, so the page redraws it)."""
    running = W.drop_build(state["sid"])
    prev = _last_drawn.get(state["sid"])
    if prev is None or prev.get("strategy") == state.get("strategy") and prev.get("model") == state.get("model"):
        return state, "Nothing to go back to." if not running else \
            "Stopped waiting; no earlier view to go back to (pick another strategy)."
    back = dict(prev, version=int(state.get("version", 0)) + 1)
    return back, "Went back to the strategy shown before." + (
        " The simulation that was running finishes in the background and is not shown." if running else "")


def trim_render_cache(max_idle_s: float) -> int:
    """Drop drawn views (and Compare's simulations) unused for ``max_idle_s`` seconds (the
    default page stays); how many."""
    return _render_cache.trim(max_idle_s) + _compare_cache.trim(max_idle_s) + _last_drawn.trim(max_idle_s)


def warm_up() -> None:
    """Draw the default page once and edit it once (compiles the simulator's kernels, the
    delta simulation's included, and fills the caches), so that neither the first visitor nor
    the first edit waits for it, and what the server holds after start-up is what it holds
    when idle."""
    state, _ = on_event("url", None)
    render_explore(state, True, "utilization")
    _render_cache.pinned.add(_render_key(state, True, "utilization"))
    render_editor(state)
    render_compare(state)
    g = W.graph_of(state)
    op = next(o for o in g.ops if o.kind != "input")
    edited, _ = W.apply_edit(dict(state, sid=f"{state['sid']}-warm-up"), [op.name], {}, [0])
    for s in (edited, W.undo(edited)[0]):  # a delta change each way
        render_explore(s, True, "utilization")
        render_editor(s)
    W.forget(edited["sid"])
    trim_render_cache(0.0)


def _render_explore(state: dict, collapse: bool, metric: str, gantt: dict | None = None) -> dict[str, Any]:
    ws = W.workspace(state)
    g, c, tl = ws.graph, ws.cluster, ws.timeline
    s = ws.strategy
    mem = ws.memory
    dp_cost = W.baseline_cost_s(state)
    dp_fits = W.baseline_fits(state)
    summ = summary_data(g, tl, mem, dp_cost if mem.feasible else None)
    selected = [n for n in (state.get("selected") or []) if n in g.index]
    layout = _graph_view(g, s, collapse, selected)
    colour_of, legend, hover = _colours(g, s, layout)
    sel_nodes = {n for n in layout["nodes"] if set(layout["members"][n]) & set(selected)}
    if layout.get("expanded"):  # the whole row selected: its square ringed; else the ops picked in it
        row = layout["expanded"]
        sel_nodes = {row} if set(layout["members"][row]) <= set(selected) else sel_nodes - {row}
    gantt_fig, notes = gantt_view(ws, selected, None, gantt)
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
    if sel_devs:
        gp = {x["id"]: x for x in topo["gpus"]}
        topo_fig["data"].append(dict(
            type="scatter", x=[gp[d]["x"] for d in sel_devs], y=[gp[d]["y"] for d in sel_devs], mode="markers",
            marker=dict(size=24, symbol="square-open", color="#FFD400", line=dict(width=3)),
            name="selected op's GPUs", hoverinfo="skip"))
    dp_comm_bytes = W.baseline_comm_bytes(state)
    dp_comm = {"comm_bytes": dp_comm_bytes} if dp_comm_bytes else None
    return {
        "sum-time": format_seconds(summ["iteration_time_s"]),
        "sum-throughput": (format_rate(summ["tokens_per_s"], "tokens") if summ.get("tokens_per_s") else
                           format_rate(summ["throughput_samples_per_s"])) + _mfu_note(g, tl, c, used),
        "sum-speedup": f"{summ['speedup_vs_data_parallel']:.2f}x" if summ["speedup_vs_data_parallel"] else
        "– (data parallel does not fit)" if dp_fits is False else "– (over memory)" if not mem.feasible else "–",
        "sum-comm": format_bytes(summ["comm_bytes"]),
        "sum-memory": format_bytes(summ["peak_memory_bytes"]) + ("" if summ["feasible"] else " (over!)"),
        "sum-tasks": format_count(summ["tasks"]) + _symmetry_note(tl),
        "rate": {"per_s": summ.get("tokens_per_s") or summ.get("throughput_samples_per_s"), "gpus": len(used),
                 "unit": "tokens" if summ.get("tokens_per_s") else "samples"},
        "why": why_text(summ, dp_comm, tl, mem) + ("" if dp_fits is not False else
                                              " Data parallel does not fit in memory here: no speedup over it is given."),
        "op-graph": (build_block_stack_figure if layout.get("stack") else build_op_graph_figure)(
            layout, colour_of, legend, hover, sel_nodes),
        "op-panel": _op_panel(g, s, tl, selected),
        "gantt": gantt_fig,
        "gantt-notes": notes,
        "topology": topo_fig,
        "memory": build_memory_figure(memory_data(mem, used, stage_of_devices(s, c.num_devices))),
        "summary": summ,
    }


_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}


def train_estimate(rate: dict | None, text: Any) -> str:
    """'1T tokens: 12.3 days on 64 GPUs (18,900 GPU-hours)' from the page's rate (units per
    second, GPUs) and a count typed as 1T / 300B / 2e12; the reason when it cannot."""
    if not isinstance(rate, dict) or not rate.get("per_s"):
        return ""
    raw = str(text or "").strip().lower().replace(",", "").replace("_", "")
    m = re.fullmatch(r"(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmbgtp]?)", raw)
    if not m:
        return f"'{str(text)[:20]}': give a count like 1T, 300B or 2e12"
    n = float(m.group(1)) * _SUFFIX[m.group(2)]
    if not 0 < n < 1e18:
        return "give a count above 0 and below 1e18"
    seconds = n / rate["per_s"]
    gpus = int(rate.get("gpus") or 1)
    span = format_seconds(seconds) if seconds < 86400 else f"{seconds / 86400:,.1f} days"
    unit = rate.get("unit", "tokens")
    return (f"{format_count(int(n)) if n < 1e6 else f'{n:.3g}'} {unit}: {span} on {gpus:,} GPUs "
            f"({seconds * gpus / 3600:,.0f} GPU-hours), at the simulated rate, without failures")


def _mfu_note(graph, timeline, cluster, used: list[int]) -> str:
    u = mfu(graph, timeline, cluster, used)
    return f", MFU {u:.0%}" if u is not None else ""


def _shown(value: Any, showing: Any) -> Any:
    return no_update if value == showing or value is None else value


def _options(old: dict | None, new: dict, key: str, make) -> Any:
    was = isinstance(old, dict) and isinstance(old.get(key), dict) and "upload" in old[key]
    now = "upload" in new[key]
    if not was and not now:
        return no_update
    return make(new[key]["name"] if now else None)


def _symmetry_note(timeline) -> str:
    """' (8 of 64 GPUs simulated: the rest mirror them)' under symmetry, else ''."""
    image = timeline.tasks.info.get("device_image")
    if image is None:
        return ""
    reps, used = int(np.sum(image == np.arange(image.size))), int(np.sum(image >= 0))
    return f" ({reps} of {used} GPUs simulated; the rest mirror them)" if reps < used else ""


def _op_panel(graph, strategy, timeline, selected: list[str]) -> Any:
    if not selected:
        return html.P("Click an op in the graph to see it here and edit its config.")
    name = selected[0]
    d = op_details(graph, strategy, timeline, name)
    rows = [("op", f"{d['name']} ({d['kind']})"), ("block", d["block"] or "–"),
            ("output", ", ".join(" x ".join(map(str, s)) for s in d["outputs"])),
            ("dims", ", ".join(f"{x['name']} {x['size'] or 'copies'} [{x['kind']}]" for x in d["dims"])),
            ("FLOPs", f"{d['fwd_flops'] / 1e9:.3g} G fwd, {d['bwd_flops'] / 1e9:.3g} G bwd"),
            ("parameters", f"{d['params']:,}"), ("config", f"{d['label']} on {len(d['config']['devices'])} GPU(s)"),
            ("device time", ", ".join(f"{k} {format_seconds(v)}" for k, v in d["time_s"].items() if v > 0) or "–")]
    body = [html.Tr([html.Th(k), html.Td(v)]) for k, v in rows]
    extra = [html.P(f"+ {len(selected) - 1} more selected op(s): an edit applies to all of them.")] \
        if len(selected) > 1 else []
    return html.Div([html.Table(body, className="kv")] + extra)


def render_editor(state: dict) -> tuple[list, list, str]:
    """Options of the op picker, degree inputs for the selected op's dims, and its devices."""
    g = W.graph_of(state)
    s = strategy_from_dict(state["strategy"])
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
    from engine.device_runs import device_runs

    return options, inputs, device_runs(cfg.devices).replace(",", ", ")


#: the timeline's options (component values): row grouping, link rows, row filter
GANTT_OPTIONS = ("rows", "links", "filter")


def gantt_view(ws: Any, selected: list[str], window: tuple[float, float] | None,
               opts: dict | None) -> tuple[Any, str]:
    """The timeline figure and the line under it, for the workspace ``ws``: ``opts`` groups GPU
    rows (auto / gpu / stage / node), shows link rows (auto / on / off) and filters rows (see
    :func:`app.views.parse_row_filter`); a filter it cannot read is named and ignored."""
    opts = opts or {}
    s = ws.strategy
    links = {"on": True, "off": False}.get(str(opts.get("links") or "auto"))
    kw = dict(window=window, selected=selected, rows=str(opts.get("rows") or "auto"),
              stage_of_device=stage_of_devices(s, ws.cluster.num_devices), links=links,
              pipeline=(s.pipeline.stages, s.pipeline.microbatches, s.pipeline.virtual_stages))
    problem = ""
    try:
        gd = gantt_data(ws.graph, ws.cluster, ws.timeline, row_filter=str(opts.get("filter") or ""), **kw)
    except ValueError as e:
        problem = f"Filter ignored: {_first_line(e)}. "
        gd = gantt_data(ws.graph, ws.cluster, ws.timeline, **kw)
    if not gd["labels"]:
        problem += "No row matches the filter. "
    return build_gantt_figure(gd), problem + gantt_notes(gd)


def zoom_gantt(state: dict, relayout: dict | None, opts: dict | None = None, trigger: str = "gantt") -> Any:
    """Redraw the Gantt (figure, notes) for the x range the user zoomed to (full detail when few
    tasks are in it), or for new row options (``trigger`` another than "gantt": the whole
    iteration); ``no_update`` for other relayouts."""
    if not state:
        return no_update, no_update
    window = None
    if trigger == "gantt":
        if not relayout:
            return no_update, no_update
        if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
            window = (float(relayout["xaxis.range[0]"]) / 1e3, float(relayout["xaxis.range[1]"]) / 1e3)
        elif "xaxis.range" in relayout:
            a, b = relayout["xaxis.range"]
            window = (float(a) / 1e3, float(b) / 1e3)
        elif not relayout.get("xaxis.autorange"):
            return no_update, no_update
        if window is not None and not (math.isfinite(window[0]) and math.isfinite(window[1]) and window[1] > window[0]):
            return no_update, no_update  # (a crafted or degenerate range)
    ws = W.workspace(state)
    selected = [n for n in (state.get("selected") or []) if n in ws.graph.index]
    return gantt_view(ws, selected, window, opts)


_compare_cache = IdleCache(12)


def _compare_result(state: dict, item: dict) -> tuple[Any, Any, Any]:
    """(strategy, timeline, memory report) of a kept strategy, simulated with the engine's
    symmetry reduction where it is exact (the page's own path: an LLM plan on 64 GPUs is a few
    representatives, not millions of tasks); cached, as the Compare tab redraws on every state."""
    from engine.memory import memory_report
    from engine.simulate import simulate
    from engine.taskgraph import build_task_graph

    key = W.content_key({**state, "strategy": item["strategy"]})
    hit = _compare_cache.get(key)
    if hit is not None:
        return hit
    g, c = W.graph_of(state), W.cluster_of(state)
    W.check_page_strategy(item["strategy"], f"the kept strategy {str(item.get('name'))[:40]!r}")
    s = load_strategy(item["strategy"], g, c)  # (kept from an earlier page: checked again)
    tl = simulate(build_task_graph(g, s, c, max_tasks=W.APP_MAX_TASKS))  # (a crafted page: never past the cap)
    out = (s, tl, memory_report(g, s, c, tl))
    _compare_cache.put(key, out)
    return out


def compare_shown(state: dict, shown: list | None, had: list | None) -> tuple[list[str], list[str]]:
    """(kept names, the names whose timelines are drawn): what the user ticked, and every
    strategy kept since the list was last drawn (a new one opens drawn)."""
    names = [it["name"] for it in state.get("compare") or []]
    known = {o.get("value") for o in (had or []) if isinstance(o, dict)}
    ticked = {x for x in shown if isinstance(x, str)} if isinstance(shown, list) else set()
    return names, [n for n in names if n in ticked or n not in known]


def render_compare(state: dict, shown: list[str] | None = None) -> tuple[Any, Any, Any]:
    """The Compare tab: a summary row per kept strategy (time, throughput, speedup over the
    first kept, MFU, bubble, memory, communication, fit), the ops that differ between the first
    and the last, and their timelines aligned on one time axis, rows grouped as in Explore.
    ``shown``: the names whose timelines are drawn (None: all); the others are collapsed to
    their summary row."""
    items = state.get("compare") or []
    if not items:
        return html.P("Keep strategies here to compare them side by side."), "", empty_figure(
            "Keep two or more strategies to compare them.")
    g, c = W.graph_of(state), W.cluster_of(state)
    rows, gantts, strategies = [], [], []
    first_t = None
    for it in items:
        s, tl, mem = _compare_result(state, it)
        strategies.append((it["name"], s))
        t = tl.makespan_s
        first_t = first_t or t
        summ = summary_data(g, tl, mem, None)
        used = sorted(s.devices_used())
        rate = (format_rate(summ["tokens_per_s"], "tokens") if summ.get("tokens_per_s") else
                format_rate(summ["throughput_samples_per_s"]))
        u = mfu(g, tl, c, used)
        p = s.pipeline
        bubble = "–"
        gd = None
        if shown is None or it["name"] in shown or p.stages > 1:
            gd = gantt_data(g, c, tl, max_bars=1500, rows="auto", stage_of_device=stage_of_devices(s, c.num_devices),
                            pipeline=(p.stages, p.microbatches, p.virtual_stages))
            if gd["bubble"] is not None:
                bubble = f"{gd['bubble']['measured']:.0%}"
        rows.append(html.Tr([html.Td(it["name"]), html.Td(format_seconds(t)), html.Td(rate),
                             html.Td(f"{first_t / t:.2f}x" if t > 0 else "–"),
                             html.Td(f"{u:.0%}" if u is not None else "–"), html.Td(bubble),
                             html.Td(format_bytes(float(mem.peak_bytes.max()))), html.Td(format_bytes(tl.comm_bytes)),
                             html.Td(f"{len(used):,}"), html.Td("yes" if mem.feasible else "NO")]))
        if gd is not None and (shown is None or it["name"] in shown):
            gantts.append((it["name"], gd))
    head = ("strategy", "iteration time", "throughput", f"speedup over {items[0]['name']}", "MFU",
            "idle (bubble)", "peak memory", "communication", "GPUs", "fits")
    table = html.Table([html.Tr([html.Th(h) for h in head])] + rows, className="compare")
    diff: Any = ""
    if len(strategies) >= 2:
        (na, a), (nb, b) = strategies[0], strategies[-1]
        d = config_diff(a, b)
        head = html.P(f"{len(d)} op(s) differ between {na} and {nb}" + (" (first 50 shown)" if len(d) > 50 else ""))
        diff = html.Div([head, html.Table([html.Tr([html.Th("op"), html.Th(na), html.Th(nb)])] +
                                          [html.Tr([html.Td(x["op"]), html.Td(x["a"]), html.Td(x["b"])])
                                           for x in d[:50]], className="diff")])
    if not gantts:
        return table, diff, empty_figure("Tick a strategy above to draw its timeline.")
    return table, diff, build_compare_figure(gantts)


# --------------------------------------------------------------------------- search


def search_start(state: dict, algorithm: str, budget: str, seed: Any) -> tuple[str, bool]:
    """Queue the session's search (it runs in a worker process); (status, poll disabled)."""
    try:
        W.check_state(state)
        seed_i = int(seed or 0)
        if not 0 <= seed_i < 2**63:
            raise ValueError(f"seed {seed_i} must be between 0 and 2**63 - 1")
        job = jobs.start(state["sid"], W.refs(state), algorithm, budget or "20s", seed_i,
                         initial=load_strategy(state["strategy"], W.graph_of(state), W.cluster_of(state)))
    except (ValueError, OverflowError, TypeError) as e:
        return f"Search not started: {_first_line(e)}", True
    return job.message(), False


def _trace_title(job: jobs.JobView) -> str:
    return f"{job.algorithm}, budget {job.budget}, seed {job.seed}"


def _session_job(state: Any) -> jobs.JobView | None:
    """The latest search of the session ``state`` names (None for none, or a bad state)."""
    try:
        W.check_state(state)
        return jobs.get(state["sid"])
    except ValueError:
        return None


def search_poll(state: dict) -> tuple[Any, str, bool]:
    """(trace figure, status, poll disabled) for the session's search."""
    fig, status, disabled, _ = search_poll_changed(state, None)
    return fig, status, disabled


def search_poll_changed(state: dict, seen: dict | None) -> tuple[Any, Any, bool, dict]:
    """:func:`search_poll` for the page's interval: the trace figure and status only when the
    search changed since the page last drew it (``seen``: its id, rows and status then)."""
    job = _session_job(state)
    if job is None:
        return empty_figure("Start a search to see its cost trace here."), "", True, {}
    now = {"id": job.id, "rows": len(job.rows), "status": job.status, "best": job.best_cost_s}
    if seen == now:
        return no_update, no_update, not job.running, now
    rows = job.rows if len(job.rows) <= MAX_TRACE_POINTS else \
        job.rows[:-1:math.ceil(len(job.rows) / MAX_TRACE_POINTS)] + job.rows[-1:]
    return build_trace_figure(rows, _trace_title(job)), job.message(), not job.running, now


def search_stop(state: dict) -> str:
    try:
        W.check_state(state)
    except ValueError:
        return "No search is running."
    return "Stopping: the search returns its best so far..." if jobs.stop(state["sid"]) else "No search is running."


# --------------------------------------------------------------------------- export


def export_strategy(state: dict) -> dict:
    data = W.strategy_export(state)
    name = f"strategy-{state['model'].get('name', 'model')}-{state['cluster'].get('name', 'cluster')}.json"
    return {"content": json.dumps(data, indent=1), "filename": name.replace(":", "_"), "type": "application/json"}


def export_framework(state: dict, fmt: str) -> tuple[dict | None, str]:
    """(download, message): the strategy as ``fmt`` settings (engine.export), or no download
    and why the framework cannot express it."""
    from engine.export import export

    ws = W.workspace(state)
    try:
        text = export(fmt, ws.graph, ws.strategy, ws.cluster)
    except (ValueError, SoapboxError) as e:
        lines = str(e).splitlines()
        shown = "; ".join(x.strip(" -") for x in lines[1:6]) or lines[0]
        more = f" (+{len(lines) - 6} more)" if len(lines) > 6 else ""
        return None, f"Not exported to {fmt}: {shown}{more}"
    ext = {"megatron": "txt", "deepspeed": "json", "torchtitan": "toml"}[fmt]
    name = f"{fmt}-{state['model'].get('name', 'model')}-{state['cluster'].get('name', 'cluster')}.{ext}"
    return ({"content": text, "filename": name.replace(":", "_"), "type": "text/plain"},
            f"Exported {fmt} settings ({name}).")


#: the most trace events the page downloads (a few hundred bytes each: ~100 MB); larger
#: plans are written by the command line (`soapbox simulate --trace`), which streams to a file
MAX_TRACE_EVENTS = 400_000


def export_trace(state: dict) -> tuple[dict | None, str]:
    """(download, message): the Chrome trace of the state's iteration, or no download and why
    (a plan whose trace would be too large for a page download)."""
    ws = W.workspace(state)
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
    name = f"trace-{state['model'].get('name', 'model')}-{state['cluster'].get('name', 'cluster')}.json"
    return ({"content": body, "filename": name.replace(":", "_"), "type": "application/json"},
            f"Exported the trace ({len(events):,} events).")


def share_link(state: dict, href: str | None) -> str:
    base = (href or "").split("?")[0]
    try:
        return base + W.share_query(state)
    except ValueError as e:
        return f"Cannot share: {e}"


# --------------------------------------------------------------------------- wiring


def register(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    @app.callback(
        Output("state", "data"), Output("message", "children"), Output("pick-model", "value"),
        Output("pick-cluster", "value"), Output("pick-baseline", "value"), Output("edit-ops", "value"),
        Output("pick-batch", "value"), Output("pick-seq", "value"), Output("pick-precision", "value"),
        Output("pick-model", "options"), Output("pick-cluster", "options"),
        Input("url", "search"), Input("pick-model", "value"), Input("pick-cluster", "value"),
        Input("pick-baseline", "value"), Input("upload-ok", "data"), Input("edit-apply", "n_clicks"),
        Input("undo", "n_clicks"), Input("redo", "n_clicks"), Input("op-graph", "clickData"),
        Input("edit-ops", "value"), Input("search-adopt", "n_clicks"), Input("compare-add", "n_clicks"),
        Input("compare-clear", "n_clicks"), Input("pick-batch", "value"), Input("layout-apply", "n_clicks"),
        Input({"type": "tour", "step": ALL}, "n_clicks"), Input("sim-cancel", "n_clicks"),
        Input("pick-seq", "value"), Input("pick-precision", "value"),
        State({"type": "deg", "dim": ALL}, "value"),
        State({"type": "deg", "dim": ALL}, "id"), State("edit-devices", "value"), State("compare-name", "value"),
        State("collapse", "value"), State("state", "data"),
        State("layout-kind", "value"), State("layout-tp", "value"), State("layout-pp", "value"),
        State("layout-cp", "value"), State("layout-vpp", "value"), State("layout-mb", "value"),
        State("layout-shard", "value"), State("layout-recompute", "value"), State("layout-zero", "value"),
        State("layout-schedule", "value"), State("layout-flags", "value"))
    def _reduce(query, model, cluster, baseline, uploaded, _a, _u, _r, click, ops, _ad, _ca, _cc, batch, _la, _tour, _sc,
                seq, precision, deg_values, deg_ids, devices, compare_name, collapse, state, l_kind, l_tp, l_pp, l_cp, l_vpp, l_mb,
                l_shard, l_recompute, l_zero, l_schedule, l_flags):
        trigger = ctx.triggered_id if isinstance(ctx.triggered_id, str) else None
        step = None
        if isinstance(ctx.triggered_id, dict) and ctx.triggered_id.get("type") == "tour" and any(_tour or []):
            trigger, step = "tour", str(ctx.triggered_id.get("step"))
        if trigger == "upload-ok":
            trigger = "upload"
        uploaded = uploaded if isinstance(uploaded, dict) else {}
        upload, filename = uploaded.get("contents"), str(uploaded.get("filename") or "upload")[:200]
        if state is not None:
            state = dict(state, collapse=bool(collapse))
        degrees = {i["dim"]: v for i, v in zip(deg_ids or [], deg_values or [])}
        new, msg = on_event(trigger, state, query=str(query or ""), model=model, cluster=cluster, baseline=baseline,
                            upload=upload, filename=filename, ops=ops, degrees=degrees, devices=devices,
                            click=click, compare_name=compare_name, batch=batch, step=step,
                            size=seq if trigger == "pick-seq" else precision,
                            layout={"kind": l_kind, "tp": l_tp, "pp": l_pp, "cp": l_cp, "vpp": l_vpp, "mb": l_mb,
                                    "shard": l_shard, "recompute": l_recompute, "zero": l_zero,
                                    "schedule": l_schedule, "flags": l_flags})
        # a refused or empty action leaves the state as it was: not sent again, so the editor
        # and the views keep what the user typed (sending it reset the op editor's fields)
        # a dropdown is set only when it does not already show the state's choice: echoing the
        # value it shows raced with the user's next pick (a slow answer reset it)
        return (no_update if new is state else new, msg, _shown(new["model"].get("name"), model),
                _shown(new["cluster"].get("name"), cluster),
                new.get("baseline"), new.get("selected") or [],
                no_update if trigger == "pick-batch" else new["model"].get("batch"),
                no_update if trigger == "pick-seq" else new["model"].get("seq_len"),
                no_update if trigger == "pick-precision" else new["model"].get("precision", "default"),
                # the header follows uploads: an uploaded model or cluster is listed (and shown); the
                # lists are sent only when an upload comes or goes (sending them at every event reset
                # a dropdown the user was changing)
                _options(state, new, "model", model_options), _options(state, new, "cluster", cluster_options))

    @app.callback(Output("tabs", "value"), Output("gantt-rows", "value"),
                  Input({"type": "tour", "step": ALL}, "n_clicks"), prevent_initial_call=True)
    def _tour_tab(clicks):
        step = ctx.triggered_id.get("step") if isinstance(ctx.triggered_id, dict) else None
        if step not in W.TOUR or not any(clicks or []):
            return no_update, no_update
        return W.TOUR[step][2], ("stage" if step == "pipeline" else "auto")

    app.clientside_callback(
        f"""
        function(contents, filename) {{
            if (!contents) {{ return [window.dash_clientside.no_update, window.dash_clientside.no_update]; }}
            const bytes = Math.floor((contents.length - contents.indexOf(',') - 1) * 3 / 4);
            if (bytes > {MAX_UPLOAD_BYTES}) {{
                const mb = (bytes / 1e6).toFixed(1);
                return [window.dash_clientside.no_update,
                        'Import refused: ' + filename + ' is ' + mb + ' MB; the explorer takes files up to '
                        + '{MAX_UPLOAD_BYTES / 1e6:g} MB (use the soapbox command line for larger ones).'];
            }}
            return [{{contents: contents, filename: filename}}, window.dash_clientside.no_update];
        }}
        """,
        Output("upload-ok", "data"), Output("message", "children", allow_duplicate=True),
        Input("upload", "contents"), State("upload", "filename"), prevent_initial_call=True)

    explore_ids = ["sum-time", "sum-throughput", "sum-speedup", "sum-comm", "sum-memory", "sum-tasks", "why",
                   "op-graph", "op-panel", "gantt", "gantt-notes", "topology", "memory", "rate"]
    props = {"op-graph": "figure", "gantt": "figure", "topology": "figure", "memory": "figure", "rate": "data"}

    sim_outputs = [Output("sim-status", "children"), Output("sim-poll", "disabled"), Output("sim-box", "style")]
    idle = ["", True, {"display": "none"}]

    @app.callback([Output(i, props.get(i, "children")) for i in explore_ids] + sim_outputs,
                  Input("state", "data"), Input("collapse", "value"), Input("topo-metric", "value"),
                  Input("sim-poll", "n_intervals"),
                  State("gantt-rows", "value"), State("gantt-links", "value"), State("gantt-filter", "value"))
    def _explore(state, collapse, metric, _tick, g_rows, g_links, g_filter):
        if not state:
            return [no_update] * len(explore_ids) + idle
        t = time.perf_counter()
        try:
            W.check_state(state)
            # a poll only looks; an action waits a little (what takes longer goes on off the page)
            wait = 0.2 if ctx.triggered_id == "sim-poll" else W.INLINE_WAIT_S
            out = render_explore(state, bool(collapse), metric or "utilization",
                                 {"rows": g_rows, "links": g_links, "filter": g_filter}, wait_s=wait)
            if out is None:
                return [no_update] * len(explore_ids) + [sim_status_text(state), False, {"display": "flex"}]
        except (ValueError, SoapboxError) as e:  # a stale or crafted state: say so, draw nothing
            return [no_update] * explore_ids.index("why") + [f"Cannot draw this state: {_first_line(e)}"] + \
                [no_update] * (len(explore_ids) - explore_ids.index("why") - 1) + idle
        app.server.logger.debug("explore rendered in %.1f ms", (time.perf_counter() - t) * 1e3)
        return [out[i] for i in explore_ids] + idle

    @app.callback(Output("fit-result", "children"), Output("fit-poll", "disabled"),
                  Input("fit-find", "n_clicks"), Input("fit-poll", "n_intervals"), Input("state", "data"),
                  prevent_initial_call=True)
    def _fit(_n, _tick, state):
        return fit_view(state, start=ctx.triggered_id == "fit-find")

    @app.callback(Output("train-estimate", "children"), Input("rate", "data"), Input("train-tokens", "value"))
    def _train(rate, tokens):
        return train_estimate(rate, tokens)

    @app.callback(Output("edit-ops", "options"), Output("edit-degrees", "children"),
                  Output("edit-devices", "value"), Input("state", "data"))
    def _editor(state):
        try:
            W.check_state(state)
            return render_editor(state)
        except (ValueError, SoapboxError):
            return no_update, no_update, no_update

    @app.callback(Output("gantt", "figure", allow_duplicate=True), Output("gantt-notes", "children",
                                                                          allow_duplicate=True),
                  Input("gantt", "relayoutData"), Input("gantt-rows", "value"), Input("gantt-links", "value"),
                  Input("gantt-filter", "value"), State("state", "data"), prevent_initial_call=True)
    def _zoom(relayout, rows, links, filt, state):
        try:
            W.check_state(state)
            return zoom_gantt(state, relayout, {"rows": rows, "links": links, "filter": filt},
                              trigger=str(ctx.triggered_id or "gantt"))
        except (ValueError, SoapboxError, TypeError):
            return no_update, no_update

    @app.callback(Output("compare-table", "children"), Output("compare-diff", "children"),
                  Output("compare-gantt", "figure"), Output("compare-show", "options"), Output("compare-show", "value"),
                  Input("state", "data"), Input("compare-show", "value"), State("compare-show", "options"))
    def _compare(state, shown, had):
        try:
            W.check_state(state)
            names, value = compare_shown(state, shown, had)
            return (*render_compare(state, value), [{"label": f" {n}", "value": n} for n in names], value)
        except (ValueError, SoapboxError, KeyError, TypeError) as e:
            return html.P(f"Cannot compare: {_first_line(e)}"), "", no_update, no_update, no_update

    @app.callback(Output("search-status", "children"), Output("search-poll", "disabled"),
                  Input("search-start", "n_clicks"), State("state", "data"), State("search-algo", "value"),
                  State("search-budget", "value"), State("search-seed", "value"), prevent_initial_call=True)
    def _start(_n, state, algo, budget, seed):
        return search_start(state, algo, budget, seed)

    @app.callback(Output("search-trace", "figure"), Output("search-status", "children", allow_duplicate=True),
                  Output("search-poll", "disabled", allow_duplicate=True), Output("search-seen", "data"),
                  Input("search-poll", "n_intervals"), State("state", "data"), State("search-seen", "data"),
                  prevent_initial_call="initial_duplicate")
    def _poll(_n, state, seen):
        return search_poll_changed(state, seen)

    @app.callback(Output("search-status", "children", allow_duplicate=True), Input("search-stop", "n_clicks"),
                  State("state", "data"), prevent_initial_call=True)
    def _stop(_n, state):
        return search_stop(state)

    @app.callback(Output("download", "data"), Input("export-strategy", "n_clicks"), State("state", "data"),
                  prevent_initial_call=True)
    def _export_strategy(_n, state):
        try:
            W.check_state(state)
            return export_strategy(state)
        except (ValueError, SoapboxError):
            return no_update

    @app.callback(Output("download", "data", allow_duplicate=True),
                  Output("export-fw-message", "children", allow_duplicate=True), Input("export-trace", "n_clicks"),
                  State("state", "data"), prevent_initial_call=True)
    def _export_trace(_n, state):
        try:
            W.check_state(state)
            data, msg = export_trace(state)
        except (ValueError, SoapboxError) as e:
            return no_update, f"Not exported: {_first_line(e)}"
        return (data if data is not None else no_update), msg

    @app.callback(Output("download", "data", allow_duplicate=True), Output("export-fw-message", "children"),
                  Input("export-megatron", "n_clicks"), Input("export-deepspeed", "n_clicks"),
                  Input("export-torchtitan", "n_clicks"), State("state", "data"), prevent_initial_call=True)
    def _export_framework(_m, _d, _t, state):
        fmt = str(ctx.triggered_id or "").removeprefix("export-")
        try:
            W.check_state(state)
            data, msg = export_framework(state, fmt)
        except (ValueError, SoapboxError) as e:
            return no_update, f"Not exported: {_first_line(e)}"
        return (data if data is not None else no_update), msg

    @app.callback(Output("share-url", "value"), Input("share", "n_clicks"), State("state", "data"),
                  State("url", "href"), prevent_initial_call=True)
    def _share(_n, state, href):
        try:
            W.check_state(state)
        except ValueError as e:
            return f"Cannot share: {_first_line(e)}"
        return share_link(state, href)

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
