"""The smallest cluster for a layout: the preset sizes of the page's cluster family tried in
the background, smallest first, until the layout fits in memory
(:func:`engine.studies.sweep.smallest_fit`); the page polls :func:`fit_status`."""

from __future__ import annotations

from typing import Any

from engine.cluster import preset
from engine.layout import OPTION_NAMES, Layout
from engine.search.baselines import BASELINES
from engine.strategy import Strategy

from .sessions import FitScan, current
from .sources import APP_MAX_TASKS, MAX_APP_DEVICES, family_sizes, graph_of
from .state import SWITCHES, content_key, page_strategy, switch_notes

__all__ = ["fit_start", "fit_status", "layout_of"]

#: the options a layout carries to another cluster size: the fields of the one layout record
#: but those that depend on the cluster (dp, the stages' mesh) or the model (the global batch)
_DEFAULT = Layout()
_GIVEN = tuple(n for n in OPTION_NAMES if n not in ("dp", "stage_mesh", "global_batch"))


def _plain(k: str, v: Any) -> bool:
    """Whether option ``k``'s value is one a layout carries: a flag, a number or a word, or
    for ``recompute_modules`` a list of words (Megatron-Core's --recompute-modules)."""
    if k == "recompute_modules":
        return isinstance(v, (list, tuple)) and all(isinstance(m, str) for m in v)
    return isinstance(v, (bool, int, str))


def _said(k: str, v: Any) -> bool:
    """Whether a layout's description names option ``k``: the degrees and the micro-batch
    always; any other only away from its default (the optimizer state's fp32 goes unsaid)."""
    if k in ("tp", "pp", "micro_batch"):
        return True
    return v is True or (v not in (None, False, "none", 0, 1, []) and v != getattr(_DEFAULT, k, None))


def _shown(k: str, v: Any) -> str:
    """An option in words: ``tp 2``, ``sequence parallel``, ``recompute modules mlp,moe``."""
    return k.replace("_", " ") + ("" if v is True else f" {','.join(v) if isinstance(v, (list, tuple)) else v}")


def layout_of(strategy: Strategy) -> tuple[str, dict[str, Any], str] | None:
    """(baseline kind, the options that rebuild the strategy's layout on another cluster size,
    a description) for a strategy made by a baseline builder or the layout panel; None for a
    hand-edited or searched one (it has no layout to carry over)."""
    found = strategy.found_by or {}
    algo = str(found.get("algorithm", ""))
    if not algo.startswith("baseline:"):
        return None
    kind = algo.split(":", 1)[1]
    o = dict(found.get("options") or {})
    given = o.pop("given", None)
    if kind not in BASELINES:
        return None
    if isinstance(given, dict):  # the layout panel's: exactly what the user set (the builder's defaults else)
        o = {k: v for k, v in given.items() if k in _GIVEN and _plain(k, v)}
    elif kind in ("megatron", "fsdp"):  # a file's or a starting baseline's: its degrees, not the micro-batch
        o = {k: v for k, v in o.items() if k in _GIVEN and k != "micro_batch" and _plain(k, v)}
        o["zero_stage"] = strategy.zero_stage
        if kind == "megatron":
            o["fp8"] = strategy.fp8
            if strategy.pipeline.stages > 1:
                o["schedule"] = "interleaved" if strategy.pipeline.virtual_stages > 1 else strategy.pipeline.schedule
    else:
        o = {}
    try:
        Layout.from_options({k: v for k, v in o.items() if k != "shard_group" or kind == "fsdp"})
    except (ValueError, TypeError):
        return None  # (a file's options no layout can hold: nothing to carry over)
    shown = ", ".join([_shown(k, v) for k, v in o.items() if k not in SWITCHES and _said(k, v)] + switch_notes(o))
    return kind, o, f"{kind}" + (f" ({shown})" if shown else "")


def fit_start(state: dict) -> str:
    """Start scanning the cluster family for the smallest size on which the state's layout fits
    (in the background: each size is a simulation); the message to show."""
    sid = state["sid"]
    if state["cluster"].get("upload"):
        return "The smallest cluster is found among presets with a node count (dgx-a100-80gb:N, ...), not for an uploaded cluster."
    sizes = family_sizes(state["cluster"].get("name", ""))
    if not sizes:
        return (f"{state['cluster'].get('name')} has no sizes to try: pick a preset with a node count "
                "(dgx-a100-80gb:N, dgx-h100:N, ...).")
    layout = layout_of(page_strategy(state))
    if layout is None:
        return ("This strategy was edited by hand or found by a search: it has no layout to carry to other sizes. "
                "Set one in the Layout panel (or pick a starting strategy) first.")
    kind, opts, text = layout
    key = content_key(state)
    sessions = current()
    old = sessions.scan(sid)
    if old is not None and old.key == key and not old.error:
        return f"Looking for the smallest cluster for {old.layout}." if not old.done else ""
    scan = FitScan(key, text)
    graph = graph_of(state)

    def run() -> None:
        from engine.studies.sweep import smallest_fit

        try:
            smallest_fit(graph, kind, opts, [preset(n) for n in sizes], max_tasks=APP_MAX_TASKS,
                         stop=lambda: scan.cancelled, progress=scan.rows.append)
        except Exception as e:  # (reported on the page, never raised into a request)
            scan.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        finally:
            scan.done = True

    sessions.start_scan(sid, scan, run)
    return f"Looking for the smallest cluster for {text}…"


def fit_status(state: dict) -> tuple[str, bool] | None:
    """(text, done) of the session's scan for the state shown; None when it has none."""
    scan = current().scan(str(state.get("sid", "")))
    if scan is None or scan.key != content_key(state):
        return None
    tried = []
    found = None
    for r in list(scan.rows):
        name = r["cluster"]
        if r["feasible"]:
            found = r
        elif r["peak_memory_bytes"] is not None:
            tried.append(f"{name} ({r['gpus']:,} GPUs): {r['peak_memory_bytes'] / 1e9:,.1f} GB, over")
        elif r.get("memory_floor_bytes") is not None:  # (sure not to fit: not simulated)
            tried.append(f"{name} ({r['gpus']:,} GPUs): at least {r['memory_floor_bytes'] / 1e9:,.1f} GB, over")
        else:
            tried.append(f"{name}: {r['why']}")
    head = f"Smallest cluster for {scan.layout}: "
    top = f"{MAX_APP_DEVICES:,} GPUs"
    if found is not None:
        text = (f"{found['cluster']} ({found['gpus']:,} GPUs) fits, peak {found['peak_memory_bytes'] / 1e9:,.1f} GB of "
                f"{found['capacity_bytes'] / 1e9:,.1f} GB, {found['iteration_time_s']:.3g} s per iteration.")
    elif scan.error:
        text = f"stopped: {scan.error}."
    elif scan.done and scan.rows and all(r["peak_memory_bytes"] is None and r.get("memory_floor_bytes") is None
                                         for r in scan.rows):
        text = f"it cannot be built on any size of this family up to {top} ({scan.rows[-1]['why']})."
    elif scan.done:
        text = (f"none of this family's sizes up to {top} fits (try recomputation, ZeRO, more pipeline stages "
                "or a smaller micro-batch).")
    else:
        text = f"trying ({len(scan.rows)} size{'s' if len(scan.rows) != 1 else ''} so far)…"
    shown = tried[:4] + ([f"+{len(tried) - 4} more"] if len(tried) > 4 else [])
    return head + text + (" Tried: " + "; ".join(shown) + "." if shown else ""), scan.done
