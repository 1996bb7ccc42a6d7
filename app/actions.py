"""What a user does to a strategy: edit ops, undo and redo, pick a baseline, set a layout,
adopt a search's answer, keep one for Compare.

Every action takes a state and returns a new one (never mutating its argument) plus a message;
a refused action returns the state *itself* unchanged and says why (the page then sends
nothing back, so what the user typed stays).
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from typing import Any

from engine.errors import ROOT_CAUSE_PATHS, SoapboxError, TooLargeError, ValidationError, first_line
from engine.layout import OPTION_NAMES
from engine.moe import expert_counts
from engine.search.baselines import BASELINES, make_baseline
from engine.strategy import RECOMPUTE_MODULES, Config, Strategy, validate_strategy

from .panel import DEGREES, layout_options
from .sessions import current
from .simulation import check_size, size_checked_key, valid_checked_key, workspace
from .sources import cluster_of, graph_of
from .state import (MAX_COMPARED, MAX_HISTORY, bump, config_dict, content_key, page_strategy,
                    remember_strategy, same_settings, strategy_dict, switch_notes)

__all__ = ["parse_devices", "apply_edit", "undo", "redo", "set_strategy", "select_baseline", "apply_layout",
           "set_expert_loads", "module_reasons", "moe_overlap_reason", "adopt_strategy",
           "add_to_compare", "problems_summary", "describe_config", "SHOWN_PROBLEMS"]

#: the problems a message shows (the rest are counted)
SHOWN_PROBLEMS = 5


def problems_summary(e: ValidationError) -> str:
    """A ValidationError in a few lines for the page: the root cause alone when there is one (a
    strategy for another model or cluster: every op's problem follows from it), else the first
    few problems and how many more."""
    head = f"{e.source}: " if e.source else ""
    root = [p for p in e.problems if p.path in ROOT_CAUSE_PATHS]  # (the engine's: the CLI's summary reads them too)
    if root:
        rest = len(e.problems) - len(root)
        return head + "; ".join(str(p) for p in root) + (f" ({rest:,} other problems follow from it)" if rest else "")
    shown = "; ".join(str(p)[:300] for p in e.problems[:SHOWN_PROBLEMS])
    more = len(e.problems) - SHOWN_PROBLEMS
    return (f"{head}{len(e.problems):,} problem{'s' if len(e.problems) != 1 else ''}: {shown}"
            + (f" (+{more:,} more)" if more > 0 else ""))


def parse_devices(text: str, n_devices: int) -> list[int]:
    """``"0-3, 8, 10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]``.

    Raises
    ------
    ValueError
        Naming the part that is not a device id or range, or a device the cluster lacks.
    """
    out: list[int] = []
    for part in (p.strip() for p in str(text)[:100_000].replace(";", ",").split(",")):
        if not part:
            continue
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                if b < a:
                    raise ValueError
                out.extend(range(a, min(b, max(a, n_devices)) + 1))  # (past the cluster: one id, named below)
            else:
                out.append(int(part))
        except ValueError:
            raise ValueError(f"devices: {part[:40]!r} is not a device id or a range like 0-3") from None
        if len(out) > 4 * n_devices:
            raise ValueError(f"devices: more ids listed than the cluster's {n_devices} devices")
    if not out:
        raise ValueError("devices: none given (e.g. 0-3)")
    bad = [d for d in out if not 0 <= d < n_devices]
    if bad:
        raise ValueError(f"devices: {bad[0]} does not exist; this cluster has devices 0..{n_devices - 1}")
    return out


def describe_config(config: Config) -> str:
    """``"sample 4 on devices 0-3"``."""
    deg = " x ".join(f"{k} {v}" for k, v in config.degrees.items()) or "no split"
    devs = config.devices
    span = f"device {devs[0]}" if len(devs) == 1 else (
        f"devices {devs[0]}-{devs[-1]}" if list(devs) == list(range(devs[0], devs[-1] + 1)) else
        f"devices {', '.join(map(str, devs))}")
    return f"{deg} on {span}"


def apply_edit(state: dict, ops: list[str], degrees: dict[str, int], devices: list[int]) -> tuple[dict, str]:
    """Give every op in ``ops`` the config (``degrees``, ``devices``): one undoable edit.

    Returns the new state and a message; an invalid edit (for any of the ops) returns the
    state unchanged and every reason, with the op and field it concerns. The edit is checked
    on the edited strategy itself (the session's simulation is not waited for), and the check
    is remembered so that drawing the edited state does not repeat it.
    """
    if not ops:
        return state, "Select an op first (click one in the graph or pick it in the editor)."
    graph, cluster = graph_of(state), cluster_of(state)
    strategy = page_strategy(state)
    config = Config({k: int(v) for k, v in degrees.items() if int(v) != 1}, tuple(devices))
    unknown = [f"{op}: no such op in {graph.name}" for op in ops if op not in graph.index]
    if unknown:
        return state, "Edit refused: " + "; ".join(unknown[:5])
    edited = strategy
    for op in ops:
        edited = edited.with_config(op, config)
    problems = [str(p) for p in validate_strategy(edited, graph, cluster)]
    if problems:
        more = f" (+{len(problems) - SHOWN_PROBLEMS} more)" if len(problems) > SHOWN_PROBLEMS else ""
        return state, "Edit refused: " + "; ".join(problems[:SHOWN_PROBLEMS]) + more
    try:  # (an edited strategy is simulated in full: an edit breaks the symmetry)
        check_size(graph, edited, "a hand edit needs the full simulation (no symmetry): it")
    except TooLargeError as e:
        return state, f"Edit refused: {e}."
    entries = [{"op": op, "before": config_dict(strategy[op]), "after": config_dict(config)}
               for op in ops if strategy[op] != config]
    if not entries:
        return state, "No change: the op already has that config."
    new = _with_configs(state, entries, "after")
    origin = state["strategy"].get("found_by", {})
    if origin.get("algorithm") == "hand-edited":  # one level: what the hand edits started from
        origin = origin.get("from", {})
    new["strategy"]["found_by"] = {"algorithm": "hand-edited", "from": origin}
    new["strategy"]["cost"] = {}
    new["undo"] = (state["undo"] + [entries])[-MAX_HISTORY:]
    new["redo"] = []
    current().checked.put(content_key(new), True)
    remember_strategy(new, replace(edited, found_by=new["strategy"]["found_by"], cost={}))
    what = entries[0]["op"] if len(entries) == 1 else f"{len(entries)} ops"
    return bump(new), f"Changed {what} to {describe_config(config)}."


def _with_configs(state: dict, entries: list[dict], key: str) -> dict:
    """A copy of ``state`` whose strategy has each entry's ``key`` config; only what changes
    is copied (the state is never mutated: earlier states stay valid for undo)."""
    new = dict(state)
    new["strategy"] = dict(state["strategy"])
    ops = new["strategy"]["ops"] = dict(state["strategy"]["ops"])
    for e in entries:
        if e["op"] not in ops:
            raise ValueError(f"the history names op {str(e['op'])[:80]!r}, which this strategy does not have")
        entry = {k: v for k, v in ops[e["op"]].items() if k not in ("degrees", "devices")}
        ops[e["op"]] = {**entry, **copy.deepcopy(e[key])}
    new["strategy"]["cost"] = {}
    return new


def _step(state: dict, back: bool) -> tuple[dict, str]:
    """Undo (``back``) or redo the last edit: move it from one stack to the other."""
    src, dst, key, verb = ("undo", "redo", "before", "Undid") if back else ("redo", "undo", "after", "Redid")
    if not state[src]:
        return state, f"Nothing to {src}."
    entries = state[src][-1]
    try:
        new = _with_configs(state, entries, key)
    except ValueError as e:  # (a history that does not fit this strategy: dropped, or every undo stays stuck on it)
        new = dict(state)
        new[src], new[dst] = [], []
        return bump(new), f"Cannot {src} ({e}): the edit history was cleared."
    new[src] = state[src][:-1]
    new[dst] = (state[dst] + [entries])[-MAX_HISTORY:]
    what = entries[0]["op"] if len(entries) == 1 else f"{len(entries)} ops"
    return bump(new), f"{verb} the change to {what}."


def undo(state: dict) -> tuple[dict, str]:
    return _step(state, back=True)


def redo(state: dict) -> tuple[dict, str]:
    return _step(state, back=False)


def set_strategy(state: dict, strategy: Strategy, message: str, validated: bool = False) -> tuple[dict, str]:
    """Replace the whole strategy as one undoable edit (refused, nothing changed, when the
    explorer could not simulate it: :data:`app.sources.APP_MAX_TASKS`). ``validated``: the
    caller made ``strategy`` with a builder that validates what it returns (a layout, a
    baseline), so that drawing it does not validate it again."""
    try:
        check_size(graph_of(state), strategy, cluster=cluster_of(state))
    except TooLargeError as e:
        return state, f"Not set: {e}."
    old = page_strategy(state)
    # (every part copied but the strategy and the history, replaced below: a deep copy of the
    # old strategy, 774 configs on LLaMA-2 7B, took 10 ms for nothing)
    new = copy.deepcopy({k: v for k, v in state.items() if k not in ("strategy", "undo", "redo")})
    new["strategy"] = strategy_dict(strategy)
    # (the op entries only when the settings are the same: a layout change on a 2,410-op model
    # would write ~5,000 configs as runs for nothing)
    entries = [{"op": op, "before": config_dict(old[op]), "after": config_dict(c)}
               for op, c in strategy.configs.items() if op in old.configs and old[op] != c] \
        if same_settings(old, strategy) else []
    if entries:
        new["undo"] = (state["undo"] + [entries])[-MAX_HISTORY:]
    else:  # settings (pipeline, ZeRO, ...) changed too: the history no longer applies
        new["undo"] = []
    new["redo"] = []
    new = bump(new)
    current().checked.put(size_checked_key(new), True)  # (drawing it does not repeat the size check)
    if validated:
        current().checked.put(valid_checked_key(new), True)
        # what parsing the page's form gives (its JSON parts as written; the rest round-trips
        # exactly: tests/app/test_app_explore_fast.py), so that drawing it does not parse it
        # again: 20 ms on LLaMA-2 7B's 774 ops, 65 ms on GPT-3 175B's 2,410
        remember_strategy(new, replace(strategy, found_by=copy.deepcopy(new["strategy"]["found_by"]),
                                       cost=copy.deepcopy(new["strategy"]["cost"])))
    return new, message


def select_baseline(state: dict, kind: str) -> tuple[dict, str]:
    if kind not in BASELINES:
        return state, f"Unknown baseline {str(kind)[:40]!r}; baselines: {', '.join(BASELINES)}."
    try:
        s = make_baseline(kind, graph_of(state), cluster_of(state))
    except (ValueError, SoapboxError) as e:
        return state, f"{kind} cannot run here: {e}"
    new, msg = set_strategy(state, s, f"Strategy set to the {kind} baseline.", validated=True)
    if new is not state:  # (refused: the state stays as it was)
        new["baseline"] = kind
    return new, msg


def module_reasons(graph) -> dict[str, str | None]:
    """Why each of Megatron-Core's recompute modules (:data:`engine.strategy.RECOMPUTE_MODULES`)
    does not apply to ``graph`` (None where it does), by the names the model builders give
    (:func:`engine.strategy.recompute.recomputed_ops`): ``mlp`` needs a dense MLP layer (``*.mlp.*``
    outside the MoE layers), the MoE ones mixture-of-experts layers (``shared_experts`` shared
    experts too), ``layernorm`` norms, ``mla_up_proj`` multi-head latent attention (ops named
    ``*.attn.q_up`` / ``*.attn.kv_up``); ``core_attn``, Megatron's default, always applies."""
    moe_blocks = {op.block for op in graph.ops if op.kind == "experts"}
    has = {"mlp": any(".mlp." in op.name and op.block not in moe_blocks for op in graph.ops),
           "moe": bool(expert_counts(graph)), "moe_act": bool(expert_counts(graph)),
           "shared_experts": any(".mlp.shared." in op.name for op in graph.ops),
           "layernorm": any(op.kind in ("layernorm", "rmsnorm") for op in graph.ops),
           "mla_up_proj": any(op.name.endswith((".attn.q_up", ".attn.kv_up")) for op in graph.ops)}
    what = {"mlp": "dense MLP layers", "moe": "mixture-of-experts layers", "moe_act": "mixture-of-experts layers",
            "shared_experts": "shared experts", "layernorm": "layer norms",
            "mla_up_proj": "multi-head latent attention (MLA)"}
    return {m: None if has.get(m, True) else f"{graph.name} has no {what[m]}" for m in RECOMPUTE_MODULES}


def moe_overlap_reason(graph) -> str | None:
    """Why the MoE all-to-all overlap (``--overlap-moe-expert-parallel-comm``) does not apply
    to ``graph`` (a dense model has no all-to-alls); None for a mixture-of-experts model."""
    return None if expert_counts(graph) else f"{graph.name} has no mixture-of-experts layers (no all-to-alls)"


def _model_problem(graph, opts: dict[str, Any]) -> str | None:
    """What in the layout options does not apply to ``graph``: a recompute module it lacks the
    layers for, or the MoE overlap on a dense model (the engine would ignore them silently)."""
    reasons = module_reasons(graph)
    for m in opts.get("recompute_modules") or ():
        if reasons.get(m):
            return f"recompute module {m}: {reasons[m]}"
    if opts.get("moe_comm_overlap") and moe_overlap_reason(graph):
        return f"MoE all-to-all overlap (--overlap-moe-expert-parallel-comm): {moe_overlap_reason(graph)}"
    return None


def apply_layout(state: dict, kind: str, form: dict[str, Any]) -> tuple[dict, str]:
    """The strategy a layout panel describes (Megatron or FSDP with tp / pp / cp / vpp /
    micro-batch / recomputation / ZeRO / sequence parallelism / fp8 / schedule / the overlap
    and offload switches), through the same baseline builders as the command line; refused
    with the builder's reason (nothing changes then). An empty field takes the builder's
    default; 0 or a fraction is refused."""
    try:
        if not isinstance(form, dict):  # (read as empty, the default layout would replace the user's)
            raise ValueError(f"the layout form must be fields and values, got {type(form).__name__}")
        opts = layout_options(kind, form)
        why = _model_problem(graph_of(state), opts)
        if why:
            raise ValueError(why)
        s = make_baseline(kind, graph_of(state), cluster_of(state), layout=BASELINES[kind].layout_of(opts))
    except (ValueError, SoapboxError) as e:
        # a strategy's problems are listed under a "N problems found:" head: name them
        text = "; ".join(str(p) for p in e.problems[:3]) if isinstance(e, ValidationError) else first_line(e)
        return state, f"Layout refused: {text[:300]}."
    o = s.found_by.get("options", {})
    # the layout's degrees (those of the panel's number boxes, and dp), tp, pp and dp always
    parts = [f"{k.replace('_', '-')} {o.get(k, 1)}" for k in OPTION_NAMES if k in DEGREES + ("dp",)
             and (o.get(k) not in (None, 0, 1) or k in ("tp", "pp", "dp"))]
    loads = state["strategy"].get("expert_loads")
    if loads is not None and not validate_strategy(replace(s, expert_loads=tuple(loads)), graph_of(state),
                                                   cluster_of(state)):
        s = replace(s, expert_loads=tuple(float(x) for x in loads))  # (the routing what-if stays)
        parts.append("routing what-if kept")
    mods = f" ({', '.join(s.recompute_modules)})" if s.recompute_modules else ""
    extra = [x for x in (f"ZeRO {s.zero_stage}" if s.zero_stage else "", f"recompute {s.recompute}{mods}"
                         if s.recompute != "none" else "", "sequence parallel" if s.sequence_parallel else "",
                         "fp8" if s.fp8 else "") if x] + switch_notes(s)
    # the options the user gave, so that another cluster size rebuilds the layout from them (a
    # micro-batch the builder chose for 64 GPUs does not fit 512)
    s = replace(s, found_by={**s.found_by, "options": {**s.found_by.get("options", {}), "given": dict(opts)}})
    new, msg = set_strategy(state, s, f"Layout ({kind}): {', '.join(parts + extra)}; "
                                      f"{s.pipeline.microbatches} microbatches.", validated=True)
    if new is state:  # (refused: the state stays as it was)
        return state, msg
    new["baseline"] = kind
    return new, msg


def set_expert_loads(state: dict, loads: Any, what: str) -> tuple[dict, str]:
    """The routing-imbalance what-if on the state's strategy (:attr:`engine.strategy.Strategy.
    expert_loads`: each expert's share of the routed tokens; None: balanced routing, the
    default and what published runs measure), checked against the model first; the op edits'
    undo history stays (it does not touch the configs). ``what`` names it in the message."""
    graph = graph_of(state)
    counts = sorted({op.attrs["num_experts"] for op in graph.ops if op.kind == "experts"})
    if not counts:
        return state, f"No routing what-if: {graph.name} has no mixture-of-experts layers."
    current_loads = state["strategy"].get("expert_loads")
    if loads is None:
        if current_loads is None:
            return state, "Routing is balanced already."
        new = dict(state, strategy={k: v for k, v in state["strategy"].items() if k not in ("expert_loads", "cost")})
        return bump(new), "Routing back to balanced (every expert gets the same share of tokens)."
    shares = [float(x) for x in loads]
    if len(counts) > 1:
        return state, f"The routing what-if needs one expert count; {graph.name} has layers of {counts} experts."
    if len(shares) != counts[0]:
        return state, f"Routing what-if refused: {len(shares)} shares for {counts[0]} experts."
    total = sum(shares)
    if not all(math.isfinite(x) and x >= 0 for x in shares) or not total > 0:
        return state, "Routing what-if refused: expert shares must be finite, non-negative and not all zero."
    shares = [x / total for x in shares]
    if current_loads is not None and [round(x, 12) for x in current_loads] == [round(x, 12) for x in shares]:
        return state, "That routing what-if is already applied."
    strategy = dict(state["strategy"], expert_loads=shares, cost={})
    new = bump(dict(state, strategy=strategy))
    try:
        problems = validate_strategy(page_strategy(new), graph, cluster_of(state))
    except ValidationError as e:
        problems = e.problems
    if problems:
        return state, f"Routing what-if refused: {problems[0]}"
    return new, f"Routing what-if applied ({what}); the views show it simulated."


def adopt_strategy(state: dict, strategy: Strategy, message: str) -> tuple[dict, str]:
    """Take a strategy found elsewhere (a search, a file) as one undoable edit."""
    return set_strategy(state, strategy, message)


def add_to_compare(state: dict, name: str | None = None) -> tuple[dict, str]:
    """Keep the state's strategy (with its simulated time) for Compare under ``name``."""
    name = str(name or "").strip()[:100] or \
        f"#{len(state['compare']) + 1} {state['strategy'].get('found_by', {}).get('algorithm', 'strategy')}"[:100]
    if any(c["name"] == name for c in state["compare"]):
        return state, f"A compared strategy is already called {name!r}."
    if len(state["compare"]) >= MAX_COMPARED:
        return state, f"At most {MAX_COMPARED} strategies are compared at once; remove one first."
    ws = workspace(state)
    new = copy.deepcopy(state)
    new["compare"].append({"name": name, "strategy": state["strategy"], "cost_s": ws.timeline.makespan_s})
    return new, f"Kept {name!r} for comparison ({len(new['compare'])} kept)."
