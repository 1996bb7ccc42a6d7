"""Which GPUs, in the page: the page's model priced on several GPU types and sizes, each
cluster's fastest feasible layout with tokens/s per GPU, MFU, days, GPU-hours and cost for a
token budget (:mod:`engine.studies.plan`, what ``soapbox plan`` prints).

A comparison is a job of the search queue (:mod:`app.jobs`: the same workers, time limit and
stop flag, stored under the algorithm name :data:`app.store.PLAN_JOB`): it prices hundreds to
thousands of layouts, minutes of work that never run on a request's thread. The page polls
:func:`plan_view`. The grid is thinned (:data:`engine.studies.plan.THIN_MICRO_BATCHES`) and the
clusters are priced in turn, so a comparison stopped early (by the user or its
:data:`PLAN_BUDGET_S`) shows each cluster's best of about as many layouts, and says how many.

This module imports the engine, :mod:`app.store` and :mod:`app.sources` only (no Dash): the
worker process runs :func:`run_plan`.
"""

from __future__ import annotations

import math
import os
import re
import time
from typing import Any

from engine.cluster import preset
from engine.cluster.presets import PRESETS

from . import store as S
from .clients import client_address
from .sources import MAX_APP_DEVICES, graph_of, refs

__all__ = ["GPU_TYPES", "PLAN_BUDGET_S", "MAX_PLAN_CLUSTERS", "plan_clusters", "parse_price_text", "start_plan",
           "stop_plan", "plan_view", "run_plan"]

#: how long a comparison prices layouts (seconds of one worker); past it, the best so far
PLAN_BUDGET_S = 300.0
#: the most clusters (GPU types x sizes) one comparison prices
MAX_PLAN_CLUSTERS = 8
#: the longest network text the page takes (the header's field, the Which GPUs tab's line):
#: longer is refused, not cut (cut, ``nic_gbps=4000`` could read as 40)
NETWORK_TEXT_MAX = 300
#: the same for the GPU counts and the prices typed there
GPUS_TEXT_MAX = 200
PRICE_TEXT_MAX = 400
#: the GPU types offered: the presets sold as whole nodes (a size is a node count), by name
GPU_TYPES = tuple(name for name, entry in PRESETS.items() if entry[1])
_FLUSH_S = 0.5


def _per_node(family: str) -> int:
    return preset(f"{family}:1").gpus_per_node


def plan_clusters(families: Any, gpus_text: Any, network_text: Any = "") -> tuple[list[str], list[str]]:
    """(the presets to price, a note per size a GPU type does not come in) for the GPU types
    ``families`` (names of :data:`GPU_TYPES`) at the GPU counts typed in ``gpus_text``
    (``"64, 256"``): a type sold in nodes of k GPUs makes N GPUs when k divides N; each on
    every network of ``network_text`` (``"nics=4,8 nic_gbps=400"``, as ``soapbox sweep
    --network`` takes it: :func:`engine.studies.network.parse_network`; empty: the presets'
    own). ValueError for what cannot be read or priced here, naming it."""
    fams = [str(f) for f in (families if isinstance(families, (list, tuple)) else [])][:32]
    unknown = [f for f in fams if f not in GPU_TYPES]
    if unknown:
        raise ValueError(f"unknown GPU type {unknown[0][:40]!r}; pick from the list")
    if not fams:
        raise ValueError("pick at least one GPU type")
    sizes: list[int] = []
    if len(str(gpus_text or "")) > GPUS_TEXT_MAX:  # (cut short, " " * 198 + "160" read as 16)
        raise ValueError(f"GPUs: at most {GPUS_TEXT_MAX} characters")
    for part in re.split(r"[,\s;]+", str(gpus_text or "").strip()):
        if not part:
            continue
        if not (part.isascii() and part.isdigit() and len(part) <= 7) or not 0 < int(part) <= MAX_APP_DEVICES:
            raise ValueError(f"GPUs {part[:20]!r}: give whole numbers from 1 to {MAX_APP_DEVICES:,} (64, 256)")
        sizes.append(int(part))
    if not sizes:
        raise ValueError("give the GPU counts to compare (64, 256)")
    out, notes = [], []
    for f in dict.fromkeys(fams):
        k = _per_node(f)
        for n in dict.fromkeys(sizes):
            if n % k:
                notes.append(f"{f} comes in nodes of {k} GPUs: not {n:,}")
            else:
                out.append(f"{f}:{n // k}")
    if not out:
        raise ValueError("none of these GPU types comes in these sizes: " + "; ".join(notes))
    out = _on_networks(out, network_text)
    if len(out) > MAX_PLAN_CLUSTERS:
        raise ValueError(f"{len(out)} clusters: the page compares at most {MAX_PLAN_CLUSTERS} at once "
                         "(soapbox plan takes more)")
    for name in out:  # (a network these nodes cannot have, e.g. more NICs than GPUs: said now)
        if "+" in name:
            preset(name)
    return out, notes


def _on_networks(names: list[str], text: Any) -> list[str]:
    """``names`` on each network ``text`` asks for (none: as they are)."""
    from engine.studies.network import network_points, parse_network

    if len(str(text or "")) > NETWORK_TEXT_MAX:  # (cut short, "nic_gbps=4000" could read as 40)
        raise ValueError(f"network: at most {NETWORK_TEXT_MAX} characters")
    items = str(text or "").split()
    if not items:
        return names
    try:
        net = parse_network(items)
    except ValueError as e:
        raise ValueError(str(e).replace("--network", "network")) from None
    return [p["cluster"] for p in network_points([{"cluster": n} for n in names], net)]


def parse_price_text(text: Any) -> dict[str, float]:
    """``"dgx-h100=2.49, dgx-b200=4.9"`` -> {GPU type: price per GPU-hour}
    (:func:`engine.studies.plan.parse_prices`); ValueError naming the part it cannot read."""
    from engine.studies.plan import parse_prices

    if len(str(text or "")) > PRICE_TEXT_MAX:  # (cut short, "4.99" could read as 4)
        raise ValueError(f"prices: at most {PRICE_TEXT_MAX} characters")
    items = [p for p in re.split(r"[,\s;]+", str(text or "").strip()) if p]
    try:
        prices = parse_prices(items)
    except ValueError as e:
        raise ValueError(str(e).replace("--price ", "price ")) from None
    unknown = [k for k in prices if k not in GPU_TYPES]
    if unknown:
        raise ValueError(f"price for {unknown[0][:40]!r}: not a GPU type of the list")
    return prices


def start_plan(state: dict, families: Any, gpus_text: Any, tokens: float, price_text: Any,
               network_text: Any = "") -> str:
    """Queue a comparison of the state's model on the GPU types, sizes (and networks) asked;
    the message to show (what was queued, or why not)."""
    from engine.sim.report import tokens_per_sample

    from .jobs import pool

    clusters, notes = plan_clusters(families, gpus_text, network_text)
    prices = parse_price_text(price_text)
    g = graph_of(state)
    if not tokens_per_sample(g):
        raise ValueError(f"{g.name} is not a language model (no tokens per sample): the comparison prices runs "
                         "in tokens")
    p = pool()
    old = p.store.latest_search(state["sid"], plans=True)
    if old is not None and old["status"] in ("queued", "running"):
        raise ValueError("a GPU comparison is already running in this page; stop it first")
    options = {"clusters": clusters, "tokens": float(tokens), "prices": prices}
    p.store.create_search(state["sid"], S.PLAN_JOB, f"{PLAN_BUDGET_S:g}s", PLAN_BUDGET_S, 0,
                          {**refs(state), "options": options}, None, client=client_address())
    p.ensure_running()
    return (f"Comparing {g.name} on {', '.join(clusters)}" + (f" ({'; '.join(notes)})" if notes else "") + "…")


def stop_plan(sid: str) -> bool:
    """Ask the session's comparison to stop (it keeps what it priced); whether one was running."""
    from .jobs import pool

    st = pool().store
    row = st.latest_search(sid, plans=True)
    if row is None or row["status"] not in ("queued", "running"):
        return False
    return st.request_stop(row["id"]) in ("queued", "running")


def plan_view(sid: str) -> dict | None:
    """The session's latest comparison as the page shows it: status, queue position, layouts
    priced so far and, when done, the plans (:data:`engine.studies.plan.PLAN_COLUMNS`) and the
    options asked; None when it has none."""
    from .jobs import pool

    st = pool().store
    row = st.latest_search(sid, plans=True)
    if row is None:
        return None
    seen = st.progress_since(row["id"], -1)
    last = seen[-1][1] if seen else {}
    return {"id": row["id"], "status": row["status"], "error": row["error"], "result": row["result"],
            "options": (row["refs"] or {}).get("options") or {}, "model": (row["refs"] or {}).get("model") or {},
            "queue_position": st.queue_position(row["id"]) if row["status"] == "queued" else 0,
            "priced": int(last.get("priced") or 0), "grid": int(last.get("grid") or 0)}


def run_plan(store: S.Store, row: dict, parent_pid: int | None = None, clock=time.monotonic) -> str:
    """Price the claimed comparison ``row`` (in the worker process) until done, stopped or past
    its budget; the status recorded. Progress rows: ``{"priced": k, "grid": n}``."""
    from engine.studies.plan import best_per_cluster, iter_plan_rows, plan_points

    t0 = clock()
    job = row["id"]
    try:
        opts = row["refs"].get("options") or {}
        clusters, tokens, prices = list(opts["clusters"]), float(opts["tokens"]), dict(opts.get("prices") or {})
        graph = graph_of(row["refs"])
        pts = plan_points(graph, clusters, thin=True)
        rows: list[dict[str, Any]] = []
        stopped, last = False, clock()
        budget = float(row.get("budget_s") or PLAN_BUDGET_S)
        for r in iter_plan_rows(graph, clusters, points=pts):
            rows.append(r)
            if clock() - last >= _FLUSH_S:
                store.add_progress(job, [{"priced": len(rows), "grid": len(pts)}])
                last = clock()
                if parent_pid is not None and os.getppid() != parent_pid:
                    os._exit(0)  # the server is gone: nobody will read this comparison
                if store.stop_requested(job) or clock() - t0 >= budget:
                    stopped = True
                    break
        store.add_progress(job, [{"priced": len(rows), "grid": len(pts)}])
        plans = best_per_cluster(graph, rows, clusters, tokens, prices)
        plans = [{k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in p.items()}
                 for p in plans]
        status = "stopped" if stopped else "finished"
        store.finish(job, status, result={"plans": plans, "priced": len(rows), "grid": len(pts),
                                          "run_s": clock() - t0, "model": graph.name})
        return status
    except Exception as e:  # (said on the page; the worker exits normally)
        from engine.errors import SoapboxError, first_line

        refusal = isinstance(e, (ValueError, SoapboxError))
        store.finish(job, "failed", error=first_line(e) if refusal else f"{type(e).__name__}: {first_line(e)}")
        return "failed"
