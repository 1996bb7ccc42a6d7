"""The page's one reducer: every user action that changes the state goes through
:func:`on_event` — (trigger, state, what the component sent) -> (new state, message).

Nothing here raises for bad input: what a callback is sent is checked (the state against
:data:`app.state.STATE_SCHEMA`, every other value for its type and range), and a refused action
returns the state itself unchanged with a message naming what and where.
"""

from __future__ import annotations

import math
from typing import Any

from engine.errors import SoapboxError, ValidationError
from engine.formats import load_strategy
from engine.models import MAX_SAMPLE_BATCH, MAX_SAMPLE_SEQ
from engine.sim.report import tokens_per_sample
from engine.search.baselines import BASELINES, make_baseline

from . import jobs, store
from .actions import (add_to_compare, adopt_strategy, apply_edit, apply_layout, parse_devices,
                      problems_summary, redo, select_baseline, set_expert_loads, undo)
from .components import first_line
from .fitscan import layout_of
from .fmt import format_seconds
from .sources import MODEL_SIZES, cluster_of, graph_of, hf_upload, preset_cluster
from .state import blank_state, check_state, new_state, page_strategy, strategy_dict
from .profiles import detach_profile
from .tabs.experts import apply_whatif
from .tabs.explore import cancel_simulation, graph_view
from .tabs.learn import tour
from .uploads import decode_upload, import_file, import_onnx_file

__all__ = ["on_event", "TRIGGERS"]

#: the triggers :func:`on_event` knows (the components that fire them)
TRIGGERS = ("url", "pick-model", "pick-cluster", "pick-baseline", "pick-batch", "pick-seq", "pick-precision",
            "upload", "edit-apply", "undo", "redo", "op-graph", "edit-ops", "search-adopt", "compare-add",
            "compare-clear", "layout-apply", "tour", "sim-cancel", "expert-apply", "expert-balanced",
            "profile-detach", "plan-open", "pick-network")
#: triggers that replace the model or cluster (a running search is then stopped)
_REPLACING = ("pick-model", "pick-cluster", "pick-batch", "pick-seq", "pick-precision", "upload", "tour", "plan-open",
              "pick-network")
#: the layout options a GPU comparison's row opens with (:func:`engine.studies.plan.best_per_cluster`)
_PLAN_FORM = ("tp", "pp", "cp", "ep", "etp", "micro_batch", "recompute", "zero_stage")


def _detach_search(old: dict, new: dict, msg: str) -> tuple[dict, str]:
    """Stop the session's running search when the model or cluster changed under it (its
    answer would be for the old ones); say so."""
    if new is old or (old.get("model") == new.get("model") and old.get("cluster") == new.get("cluster")):
        return new, msg
    try:
        stopped = jobs.stop(old["sid"])
    except Exception:  # (a store that cannot be reached: the change stands)
        stopped = False
    return new, msg + (" The search running for the previous model or cluster was stopped." if stopped else "")


def on_event(trigger: str | None, state: dict | None, **kw: Any) -> tuple[dict, str]:
    """Apply one user action to the session state.

    ``trigger`` names the component that fired (:data:`TRIGGERS`); the keyword arguments carry
    what it sent. Returns (new state, message); a refused action returns ``state`` itself.
    """
    if state is not None:
        try:
            check_state(state)
        except ValueError as e:  # a state from an older soapbox, or a crafted one
            return new_state(), f"The page's saved state could not be used ({first_line(e)}); starting afresh."
    if state is None or trigger in (None, "url"):
        if state is not None:
            return state, ""
        try:
            from .links import state_from_query

            return state_from_query(kw.get("query") if isinstance(kw.get("query"), str) else "")
        except Exception as e:  # a damaged link still opens the default
            return new_state(), f"The link could not be loaded ({first_line(e)}); showing the default instead."
    try:
        new, msg = _apply(str(trigger), state, **kw)
    except ValidationError as e:
        return state, f"That did not work: {problems_summary(e)}"
    except Exception as e:  # never lose the session over one action
        return state, f"That did not work: {type(e).__name__}: {first_line(e)[:500]}"
    if trigger in _REPLACING:
        return _detach_search(state, new, msg)
    return new, msg


def _text(v: Any, limit: int = 200) -> str | None:
    return v[:limit] if isinstance(v, str) else None


def _apply(trigger: str, state: dict, *, query: Any = "", model: Any = None, cluster: Any = None,
           baseline: Any = None, upload: Any = None, filename: Any = None, ops: Any = None,
           degrees: Any = None, devices: Any = None, click: Any = None, compare_name: Any = None,
           batch: Any = None, layout: Any = None, step: Any = None, size: Any = None,
           whatif: Any = None, plan: Any = None, network: Any = None) -> tuple[dict, str]:
    model, cluster, baseline = _text(model), _text(cluster), _text(baseline)
    ops = [o for o in ops if isinstance(o, str)] if isinstance(ops, list) else []
    if trigger == "pick-model" and model and model != state["model"].get("name"):
        try:
            new, under = _fresh(state, model=model)
            return new, f"Model: {model}{under}."
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
        return tour(state, str(step or "")[:30])
    if trigger == "sim-cancel":
        return cancel_simulation(state)
    if trigger == "profile-detach":
        return detach_profile(state)
    if trigger == "expert-balanced":
        return set_expert_loads(state, None, "balanced")
    if trigger == "expert-apply":
        return apply_whatif(state, whatif)
    if trigger == "layout-apply":  # (a form that is not a dict: apply_layout refuses it)
        form = dict(layout) if isinstance(layout, dict) else layout
        kind = str(form.pop("kind", "megatron"))[:30] if isinstance(form, dict) else "megatron"
        return apply_layout(state, kind, form)
    if trigger == "pick-cluster" and cluster and (cluster != state["cluster"].get("name")
                                                   or "upload" in state["cluster"]):
        new, under = _fresh(state, cluster=cluster)
        plain = under == f", under {new['baseline']}"  # (the same starting strategy: nothing to say)
        return new, f"Cluster: {cluster}{'' if plain else under}."
    if trigger == "pick-network":
        return _set_network(state, network)
    if trigger == "pick-baseline" and baseline and baseline != state.get("baseline"):
        return select_baseline(state, baseline)
    if trigger == "upload" and upload is not None:
        name = _text(filename) or "upload"
        onnx_file = name.lower().endswith(".onnx")
        try:
            text = decode_upload(upload, name, binary=onnx_file)
        except ValueError as e:
            return state, f"Import refused: {e}"
        new, msg, ok = (import_onnx_file if onnx_file else import_file)(state, text, name)
        return new, msg if ok else f"Import refused: {msg}"
    if trigger == "edit-apply":
        try:
            devs = parse_devices(_text(devices, 100_000) or "", cluster_of(state).num_devices)
            if degrees is not None and not isinstance(degrees, dict):
                raise ValueError("degrees: not a mapping of dim to degree")
            deg = {str(dim)[:100]: _degree(dim, v) for dim, v in (degrees or {}).items()}
        except ValueError as e:
            return state, f"Edit refused: {e}"
        picked = ops or list(state.get("selected") or [])
        new, msg = apply_edit(state, picked, deg, devs)
        if new is not state:
            new["selected"] = picked
        return new, msg
    if trigger == "undo":
        return undo(state)
    if trigger == "redo":
        return redo(state)
    if trigger == "op-graph" and isinstance(click, dict):
        return _select_clicked(state, click)
    if trigger == "edit-ops":
        return dict(state, selected=ops[:1000]), ""
    if trigger == "search-adopt":
        found = jobs.best(state["sid"])
        if found is None:
            return state, "No finished search to adopt yet."
        best, cost_s = found
        try:
            best = load_strategy(best.to_dict(), graph_of(state), cluster_of(state))
        except ValueError:
            return state, "The search's best was found for another model or cluster; run a search here first."
        new, msg = adopt_strategy(state, best, f"Adopted the search's best ({format_seconds(cost_s)}).")
        if new is not state:
            new["baseline"] = state.get("baseline", "data-parallel")
        return new, msg
    if trigger == "compare-add":
        return add_to_compare(state, _text(compare_name, 100))
    if trigger == "compare-clear":
        return dict(state, compare=[]), "Cleared the comparison."
    if trigger == "plan-open":
        return _open_plan(state, plan)
    return state, ""


def _set_network(state: dict, text: Any) -> tuple[dict, str]:
    """The page's preset on the network typed in the header (``nics=4 nic_gbps=400``, as a
    preset's name takes it after a ``+``: :mod:`engine.cluster.network`; empty: the preset's
    own); refused, with the reason, for an uploaded cluster or a network its nodes cannot have."""
    from engine.cluster.network import parse_variant, variant_name

    from .planjob import NETWORK_TEXT_MAX

    if not isinstance(text, str) and text is not None:
        return state, ""
    if "upload" in state["cluster"]:
        return state, ("Network refused: the page's cluster is an uploaded file; change its NICs and fabric in the "
                       "file (nics, fabric.pod_gpus, fabric.oversubscription) and upload it again.")
    if len(text or "") > NETWORK_TEXT_MAX:  # (cut short, "nic_gbps=4000" could read as 40)
        return state, f"Network refused: at most {NETWORK_TEXT_MAX} characters (nics=4 nic_gbps=400 pod=256 oversub=2)."
    items = (text or "").split()
    head = str(state["cluster"].get("name", "")).partition("+")[0]
    try:
        name = variant_name(head, parse_variant("+".join(items), "network")) if items else head
        if name != state["cluster"].get("name"):
            preset_cluster(name)  # (a network the nodes cannot have: said here, the page kept)
    except ValueError as e:
        return state, f"Network refused: {first_line(e)[:300]}"
    if name == state["cluster"].get("name"):
        return state, ""
    new, under = _fresh(state, cluster=name)
    plain = under == f", under {new['baseline']}"  # (the same starting strategy: nothing to say)
    return new, f"Cluster: {name}{'' if plain else under}."


def _open_plan(state: dict, plan: Any) -> tuple[dict, str]:
    """The page on a GPU comparison's cluster under that cluster's best layout (``plan``: the
    row's cluster, layout options and the model the comparison priced, as the Which GPUs tab
    keeps them); refused, with the reason, for another model than the page's or a layout the
    builder refuses."""
    from .planjob import GPU_TYPES

    if not isinstance(plan, dict) or not isinstance(plan.get("cluster"), str) or \
            not isinstance(plan.get("options"), dict):
        return state, ""
    cluster = plan["cluster"][:200]
    head, plus, net = cluster.partition("+")
    family, _, nodes = head.partition(":")
    if family not in GPU_TYPES or not (nodes.isascii() and nodes.isdigit() and len(nodes) <= 4) or int(nodes) < 1:
        return state, f"Cannot open {cluster!r}: not a cluster a comparison prices."
    cluster = f"{family}:{int(nodes)}{plus}{net}"  # (the name a comparison gives it: dgx-h100:0002 is dgx-h100:2)
    if plan.get("model") != state["model"]:
        return state, ("That comparison priced another model (or other sizes) than the page shows now: compare "
                       "again to open its layouts.")
    opts = plan["options"]
    form: dict[str, Any] = {k: opts[k] for k in _PLAN_FORM if isinstance(opts.get(k), (int, str))}
    form["flags"] = ["sequence_parallel"] if opts.get("sequence_parallel") is True else []
    new = state
    if cluster != state["cluster"].get("name") or "upload" in state["cluster"]:
        new, _ = _fresh(state, cluster=cluster)
    new, msg = apply_layout(new, "megatron", form)
    if msg.startswith("Layout refused"):
        return state, msg
    return new, f"Opened the comparison's best layout on {cluster}. {msg}"


def _select_clicked(state: dict, click: dict) -> tuple[dict, str]:
    """Select the op (or the block's ops) a click on the op graph names."""
    pts = click.get("points")
    if not isinstance(pts, list) or not pts or not isinstance(pts[0], dict) or "customdata" not in pts[0]:
        return state, ""
    node = pts[0]["customdata"]
    if not isinstance(node, str):
        return state, ""
    g = graph_of(state)
    view = graph_view(g, page_strategy(state), bool(state.get("collapse")), None)
    members = view["members"].get(node) or ([node] if node in g.index else [])
    if not members:
        return state, ""
    new = dict(state, selected=members)
    name = view.get("labels", {}).get(node, node).split(" · ")[0]  # a run of blocks: "layers.0–15 (16 ...)"
    if name.endswith(")"):
        name = name[:-1] + f", {len(members)} ops)"
    elif len(members) > 1:
        name += f" ({len(members)} ops)"
    return new, f"Selected {name}."


def _degree(dim: Any, value: Any) -> int:
    """A degree typed by the user (empty: 1); ValueError naming the dim otherwise."""
    if value in (None, ""):
        return 1
    try:
        f = float(value)
        ok = not isinstance(value, bool) and math.isfinite(f) and f == int(f) and 1 <= f <= 1 << 20
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"degree of {str(dim)[:40]}: {repr(value)[:40]} is not a whole number >= 1")
    return int(f)


def _fresh(state: dict, model: str | None = None, cluster: str | None = None,
           sizes: dict | None = None) -> tuple[dict, str]:
    """A new state for another sample model, preset cluster or model size, keeping the session
    id, the model (an uploaded one included: picking another cluster never swaps it for a
    sample) and its sizes (batch, sequence length, precision) while the model stays the same
    (``sizes``: the ones to change, None for the model's default), the cluster (uploaded or
    preset) unless another is picked, and the strategy's layout: a Megatron or FSDP layout
    (tp 8 x pp 8 ...) is built again on the new model or cluster, or, where it cannot run, the
    page says why and shows data parallel. Returns the state and how its strategy was made
    (", under megatron (tp 8) (kept)", ...)."""
    kept = {k: state["model"].get(k) for k in MODEL_SIZES} if model is None else {}
    kept.update(sizes or {})
    kind, opts, text = state.get("baseline", "data-parallel"), {}, ""
    try:
        layout = layout_of(page_strategy(state))
    except (ValueError, SoapboxError):
        layout = None
    if layout is not None and layout[0] in ("megatron", "fsdp"):
        kind, opts, text = layout
    mref = {k: v for k, v in state["model"].items() if k not in MODEL_SIZES} if model is None else {"name": model}
    mref.update((k, v) for k, v in kept.items() if v is not None)
    new = blank_state(state["sid"], mref, {"name": cluster} if cluster else state["cluster"])
    g, cl = graph_of(new), cluster_of(new)
    try:
        b = BASELINES.get(kind)
        # (a layout travels as one record: the options it was made from, on the new cluster)
        s = make_baseline(kind, g, cl, layout=b.layout_of(opts)) if b is not None and b.layout else \
            make_baseline(kind, g, cl)
        under = f", under the layout {text} (kept)" if text else f", under {kind}"
    except (ValueError, SoapboxError) as e:
        s = make_baseline("data-parallel", g, cl)
        under = f", under data-parallel: {text or kind} cannot run here ({first_line(e)[:200]})"
        kind = "data-parallel"
    new["strategy"] = strategy_dict(s)
    new["baseline"] = kind
    new["version"] = state.get("version", 0) + 1
    if state.get("profile"):  # (a measured table stays attached: it prices whatever ops it has)
        new["profile"] = state["profile"]
    return new, under


#: the header's model sizes: (state key, what the message calls it, its unit)
_SIZES = {"batch": ("Batch", "samples"), "seq_len": ("Sequence length", "tokens"), "precision": ("Precision", "")}


def _set_size(state: dict, key: str, value: Any) -> tuple[dict, str]:
    """The sample model at another global batch (samples), sequence length (tokens) or
    precision (empty: its default); the layout is built again for the new shape."""
    what, unit = _SIZES[key]
    if key == "precision" and value == "default":
        value = None
    if "upload" in state["model"] and not _uploaded_config(state):
        return state, (f"{what} refused: an imported model file states its own (import it again with another one; "
                       "a Hugging Face config.json takes the header's sizes).")
    if value is None or (isinstance(value, str) and not value.strip()):
        if key not in state["model"]:
            return state, ""
        new, under = _fresh(state, sizes={key: None})
        return new, f"{what}: the model's default ({_size_text(graph_of(new), key)}){under}."
    if key == "precision":
        v = str(value)[:20]
    else:
        try:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ValueError
            f = float(value)
            if not math.isfinite(f) or f != int(f):
                raise ValueError
            v = int(f)
        except (TypeError, ValueError, OverflowError):
            return state, f"{what} refused: {str(value)[:40]!r} is not a whole number of {unit}."
        top = MAX_SAMPLE_BATCH if key == "batch" else MAX_SAMPLE_SEQ
        if not 1 <= v <= top:
            return state, f"{what} refused: {v:,} {unit}; it must be from 1 to {top:,}."
    if v == state["model"].get(key):
        return state, ""
    try:
        new, under = _fresh(state, sizes={key: v})
    except ValueError as e:
        return state, f"{what} refused: {first_line(e)}"
    head = f"{what}: {_size_text(graph_of(new), key)}"
    if key == "batch":
        head += f" ({v / cluster_of(new).num_devices:g} per GPU)"
    return new, f"{head}{under}."


def _uploaded_config(state: dict) -> bool:
    """Whether the state's model is a Hugging Face config this session uploaded (sizes apply)."""
    m = state["model"]
    return "upload" in m and hf_upload(store.current().get_upload(state["sid"], m["upload"], "model"))


def _size_text(graph, key: str) -> str:
    if key == "batch":
        return f"{graph.batch_size:,} samples"
    if key == "precision":
        return graph.precision
    return f"{tokens_per_sample(graph) or 0:,} tokens"
