"""A search worker: a separate process that runs one queued search and exits.

Started by :class:`app.jobs.SearchPool` as ``python -m app.worker DB PARENT_PID`` (a fresh
interpreter: no state copied from the threaded server). Once a search is queued it warms up
(:func:`warm_up`: a search's budget counts from its claim, so its proposals should not pay for
loading the engine), then claims the first search in the store's fair order, resolves the
model and cluster the search names (samples, presets or the session's own uploads: never a
path), runs the engine's search, streams progress rows and the best strategy so far into the
store, and records the result. One search per process: when it
exits, the memory the search used goes back to the system, and the pool starts a fresh worker.

The worker never outlives the server: on Linux it asks the kernel to kill it when its parent
dies (``PR_SET_PDEATHSIG``), elsewhere it checks its parent between progress rows.

This module imports the engine and :mod:`app.store` / :mod:`app.sources` only (no Dash).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from dataclasses import fields
from typing import Any

__all__ = ["main", "run_search", "warm_up", "FLUSH_S"]

#: progress rows are written to the store at most this often (and the stop flag read)
FLUSH_S = 0.25
#: scheduling priority below the server's (a search under load gets fewer proposals in its
#: budget rather than slowing every page down). 15, not 5: with 20 sessions editing and a
#: search worker on a 2-core machine, edit -> figures p95 went from 1.38 s to 0.93 s, and every
#: search still made 45 proposals or more (benchmarks/bench_load.py: BENCHMARKS.md)
NICENESS = 15


def _finite(x: Any) -> Any:
    return x if not isinstance(x, float) or math.isfinite(x) else None


def run_search(store, row: dict, parent_pid: int | None = None, clock=time.monotonic) -> str:
    """Run the claimed search ``row`` to its end; returns the status recorded.

    Time budgets count from the moment the search was claimed: resolving the model and
    building the starting strategies spend the same budget as the search itself. A GPU
    comparison (:data:`app.store.PLAN_JOB`) is priced by :func:`app.planjob.run_plan`."""
    from .store import PLAN_JOB

    if row["algorithm"] == PLAN_JOB:
        from .planjob import run_plan

        return run_plan(store, row, parent_pid, clock)
    from engine.search import ALGORITHMS, Budget
    from engine.strategy import strategy_from_dict

    from .sources import cluster_of, graph_of

    t_claim = clock()
    sid = row["id"]
    best_seen = [math.inf, 0.0]  # cost of the best stored, when it was stored
    pending: list[dict] = []
    last_flush = [clock()]
    stop = [False]

    def flush(final: bool = False) -> None:
        store.add_progress(sid, pending)
        pending.clear()
        last_flush[0] = clock()
        if not final:
            stop[0] = stop[0] or store.stop_requested(sid)

    try:
        algorithm = ALGORITHMS[row["algorithm"]]
        budget = Budget.parse(row["budget"])
        refs = row["refs"]
        graph, cluster = graph_of(refs), cluster_of(refs)
        initial = strategy_from_dict(row["initial"]) if row.get("initial") else None
        if budget.seconds is not None:
            budget = Budget(budget.iterations, max(0.05, budget.seconds - (clock() - t_claim)))

        def on_progress(p) -> bool:
            d = {f.name: _finite(getattr(p, f.name)) for f in fields(p) if f.name != "best"}
            pending.append(d)
            best = getattr(p, "best", None)
            now = clock()
            if best is not None and p.best_cost_s < best_seen[0] and now - best_seen[1] >= 0.5:
                store.set_best(sid, p.best_cost_s, best.to_dict())
                best_seen[:] = [p.best_cost_s, now]
            if now - last_flush[0] >= FLUSH_S:
                flush()
                if parent_pid is not None and os.getppid() != parent_pid:
                    os._exit(0)  # the server is gone: nobody will read this search
            return not stop[0]

        given = refs.get("options") or {}
        options = algorithm.options(**given) if given else None  # (checked when the search was started)
        result = algorithm.run(graph, cluster, budget, seed=int(row["seed"]), progress=on_progress, initial=initial,
                               options=options)
        flush(final=True)
        summary = {"best_cost_s": _finite(result.best_cost_s), "iterations": result.iterations,
                   "elapsed_s": result.elapsed_s, "cancelled": result.cancelled,
                   "baselines": {k: _finite(v) for k, v in result.baselines.items()},
                   "speedup_vs_data_parallel": _finite(result.speedup_vs_data_parallel),
                   "locally_optimal": result.locally_optimal, "run_s": clock() - t_claim,
                   "best_time_s": _finite(result.best_time_s), "notes": list(result.notes)}
        status = "stopped" if result.cancelled else "finished"
        fits = math.isfinite(result.best_cost_s)
        store.finish(sid, status, result=summary, best=result.best.to_dict() if fits else None,
                     best_cost_s=result.best_cost_s if fits else None,
                     error=None if fits else "no strategy found fits in memory")
        return status
    except Exception as e:  # the search failed: say why on the page; the worker exits normally
        try:
            flush(final=True)
        except Exception:
            pass
        # a refusal (the engine's ValueError / SoapboxError) is its own one-line message; anything
        # else is a bug, shown with its type
        from engine.errors import SoapboxError

        refusal = isinstance(e, (ValueError, SoapboxError))
        store.finish(sid, "failed", error=str(e) if refusal else f"{type(e).__name__}: {e}")
        return "failed"


def warm_up() -> None:
    """Spend before a claim what a search's first proposals would otherwise spend: the engine's
    imports, its kernels loaded from numba's cache and its per-process tables, by a
    20-proposal MCMC on AlexNet / p100-4x4 (about 1.4 s on the development machine). Measured
    there: a fresh worker's 3 s MCMC on Inception-v3 / p100-4x4 makes 83 proposals cold and
    131-142 after this. A failure here is no search's: it is logged and the worker goes on."""
    try:
        from engine.cluster import preset
        from engine.models import build_sample
        from engine.search import ALGORITHMS, Budget

        ALGORITHMS["mcmc"].run(build_sample("alexnet", batch=64), preset("p100-4x4"), Budget(iterations=20), seed=0)
    except Exception:  # pragma: no cover - a broken install shows in the search itself
        import logging

        logging.getLogger("soapbox.worker").exception("search worker: warm-up failed")


def main(db_path: str, parent_pid: int, poll_s: float = 0.1) -> None:
    """Worker process entry point: wait for a queued search, run it, exit."""
    from engine.search.processes import die_with_parent

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C in the server's terminal: the server decides
    try:  # the page's requests come first: a search is batch work with a wall-clock budget
        os.nice(NICENESS)
    except OSError:
        pass
    from .store import configure

    store = configure(db_path)
    warm = False
    while True:
        if os.getppid() != parent_pid:
            return
        if not warm:  # (once a search waits, not before: an idle worker stays small, ~36 MB, not ~180)
            if not store.queued_count():
                time.sleep(poll_s)
                continue
            warm_up()  # (before the claim: a search's budget counts from its claim)
            warm = True
        row = store.claim_next(os.getpid())
        if row is None:
            time.sleep(poll_s)
            continue
        run_search(store, row, parent_pid)
        return


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
