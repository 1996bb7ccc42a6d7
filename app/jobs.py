"""Searches off the request path: a bounded pool of worker processes fed from the store.

A session's search is a row in the store (:mod:`app.store`), queued by :func:`start`. A pool of
at most ``cores - 1`` worker processes (:mod:`app.worker`, each a fresh interpreter; at least one) takes queued searches
oldest first; beyond that they wait, and the page shows their place in the queue. Workers
write progress rows and the best strategy so far into the store, which the page polls, so the
server's threads only read a little SQLite and callbacks stay fast however many searches run.

The pool's manager thread keeps the workers alive (a worker runs one search and exits, and a
fresh one takes its place), notices a worker that died mid-search (the search is marked
failed, keeping its best so far) and enforces a hard time limit: a search that runs past
``1.5 x its budget + 5 s`` (or :data:`MAX_SEARCH_S` for a budget in proposals) is asked to stop
and, if it does not within :data:`GRACE_S`, its worker is killed (the best so far is kept).
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from engine.search import ALGORITHMS, Budget
from engine.strategy import Strategy, strategy_from_dict

from . import store as S
from .clients import client_address
from .fmt import format_seconds

__all__ = ["SearchPool", "JobView", "MAX_SEARCH_S", "start", "get", "stop", "best", "pool", "configure", "worker_env"]

#: longest a search may run in the explorer (a shared server); longer ones belong to the CLI
MAX_SEARCH_S = 600.0
#: after being asked to stop, a search has this long to return its best before its worker is killed
GRACE_S = 3.0
_TICK_S = 0.1


@dataclass
class JobView:
    """A search as the page shows it (read from the store)."""

    id: int
    algorithm: str
    budget: str
    seed: int
    status: str
    rows: list[dict] = field(default_factory=list)
    queue_position: int = 0
    best_cost_s: float | None = None
    result: dict | None = None
    error: str | None = None
    workers: int = 1

    @property
    def running(self) -> bool:
        """Queued or running: it may still change."""
        return self.status in ("queued", "running")

    def message(self) -> str:
        """The status line: queued, running, finished (with the search's notes: what each of
        auto's parts found, a baseline that does not fit), stopped, interrupted or failed."""
        unit = "proposals" if self.algorithm in ("mcmc", "auto") else "steps"
        best = f"best {format_seconds(self.best_cost_s)}" if self.best_cost_s is not None else None
        if self.status == "queued":
            ahead = self.queue_position - 1
            return (f"{self.algorithm}: queued, {'next' if ahead == 0 else f'{ahead} search(es) ahead'} "
                    f"(this server runs {self.workers} search{'es' if self.workers != 1 else ''} at a time; visitors "
                    f"take turns, and its {self.budget} budget starts when it does).")
        if self.status == "running":
            last = self.rows[-1] if self.rows else None
            if last is None:
                return f"{self.algorithm}: starting (building the first strategies)..."
            cost = last.get("best_cost_s")
            acc = last.get("acceptance_rate")
            return (f"{self.algorithm}: {last['iteration']:,} {unit} in {last['elapsed_s']:.1f} s, best "
                    + (format_seconds(cost) if cost is not None else "none that fits yet")
                    + (f", acceptance {acc:.0%}" if self.algorithm == "mcmc" and acc is not None else ""))
        if self.status in ("finished", "stopped"):
            r = self.result or {}
            if best is None:
                return f"{self.algorithm} {self.status}: {self.error or 'nothing found'}."
            sp = r.get("speedup_vs_data_parallel")
            return (f"{self.algorithm} {self.status}: {best} after {r.get('iterations', 0):,} {unit} in "
                    f"{r.get('elapsed_s', 0.0):.1f} s" + (f" ({sp:.2f}x data parallel)" if sp else "")
                    + ". Adopt it to edit it." + _notes(r.get("notes")))
        if self.status == "interrupted":
            return (f"{self.algorithm} interrupted ({self.error}): "
                    + (f"{best} so far. Adopt it to edit it." if best else "it had found nothing yet."))
        tail = f" Its {best} so far can still be adopted." if best else ""
        return f"Search failed: {self.error}.{tail}"


def worker_env() -> dict[str, str]:
    """The environment of a worker: the server's, with ``app`` importable from wherever the
    server imported it (a source tree found from the current folder included)."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in {os.path.abspath(p) for p in sys.path if p}:  # a source tree, found from the current folder
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


class SearchPool:
    """Worker processes that run queued searches (see the module docstring)."""

    def __init__(self, store: S.Store, workers: int | None = None) -> None:
        self.store = store
        self.workers = max(1, workers if workers is not None else (os.cpu_count() or 2) - 1)
        self._procs: list[Any] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._asked: dict[int, float] = {}  # search id -> when the pool asked it to stop

    def ensure_running(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stopping.clear()
            self._fill()
            self._thread = threading.Thread(target=self._manage, name="soapbox-search-pool", daemon=True)
            self._thread.start()

    def _fill(self) -> None:
        # a fresh interpreter per worker (``python -m app.worker``): nothing of the threaded
        # server is copied into it, and the caller's main module is never re-imported
        for p in self._procs:
            p.poll()
        self._procs = [p for p in self._procs if p.returncode is None]
        while len(self._procs) < self.workers:
            self._procs.append(subprocess.Popen(
                [sys.executable, "-m", "app.worker", str(self.store.path), str(os.getpid())],
                stdin=subprocess.DEVNULL, close_fds=True, start_new_session=False, env=worker_env()))

    def _manage(self) -> None:
        while not self._stopping.wait(_TICK_S):
            try:
                self.tick()
            except Exception:  # a locked database or a vanished process: logged, tried again next tick
                logging.getLogger("soapbox.jobs").exception("search pool: tick failed")

    def tick(self) -> None:
        """One round of the manager: reap and replace workers, watch running searches."""
        with self._lock:
            dead = {p.pid: p.returncode for p in self._procs if p.poll() is not None}
            if self._stopping.is_set():
                return
            self._fill()
            alive = {p.pid: p for p in self._procs}
        now = time.time()
        for row in self.store.running_searches():
            pid = row["worker_pid"]
            if pid in dead or pid not in alive:
                code = dead.get(pid)
                why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                self.store.finish(row["id"], "failed", error=f"its worker process died ({why})")
                continue
            limit = MAX_SEARCH_S if row["budget_s"] is None else min(MAX_SEARCH_S, 1.5 * row["budget_s"] + 5.0)
            ran = now - (row["started_at"] or now)
            if ran > limit and row["id"] not in self._asked:
                self.store.request_stop(row["id"])
                self._asked[row["id"]] = now
            elif row["id"] in self._asked and now - self._asked[row["id"]] > GRACE_S:
                alive[pid].kill()
                self.store.finish(row["id"], "stopped", error=f"stopped after {ran:.0f} s, past its time limit "
                                                               f"({limit:.0f} s)")
        if len(self._asked) > 256:
            self._asked = {k: v for k, v in self._asked.items() if now - v < 60}

    def shutdown(self) -> None:
        self._stopping.set()
        with self._lock:
            for p in self._procs:
                if p.poll() is None:
                    p.kill()
            for p in self._procs:
                try:
                    p.wait(2)
                except subprocess.TimeoutExpired:
                    pass
            self._procs = []

    def pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._procs if p.poll() is None]


_pool: SearchPool | None = None
_pool_lock = threading.Lock()


def configure(store: S.Store, workers: int | None = None) -> SearchPool:
    """The process's pool over ``store`` (replacing an earlier one)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown()
        _pool = SearchPool(store, workers)
        return _pool


def pool() -> SearchPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = SearchPool(S.current())
        return _pool


@atexit.register
def _shutdown() -> None:
    if _pool is not None:
        _pool.shutdown()


# --------------------------------------------------------------------------- the page's API


def start(sid: str, refs: dict, algorithm: str, budget_text: str, seed: int,
          initial: Strategy | None = None) -> JobView:
    """Queue a search for session ``sid`` over the model and cluster ``refs`` names.

    Raises
    ------
    ValueError
        For an unknown algorithm, a budget that does not parse or is over
        :data:`MAX_SEARCH_S`, or a search of this session still queued or running.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown search algorithm {algorithm!r}; available: {', '.join(ALGORITHMS)}")
    budget = Budget.parse(budget_text)
    if budget.seconds is not None and budget.seconds > MAX_SEARCH_S:
        raise ValueError(f"budget {budget_text!r}: the explorer runs a search for at most "
                         f"{MAX_SEARCH_S / 60:g} minutes; use `soapbox search` for longer ones")
    p = pool()
    old = p.store.latest_search(sid)
    if old is not None and old["status"] in ("queued", "running"):
        raise ValueError("a search is already running in this session; stop it first")
    p.store.create_search(sid, algorithm, str(budget_text).strip(), budget.seconds, int(seed), refs,
                          initial.to_dict() if initial is not None else None, client=client_address())
    p.ensure_running()
    view = get(sid)
    assert view is not None
    return view


def _progress(store: S.Store, search_id: int) -> list[dict]:
    """The search's progress rows (read from the store once; later polls read what is new;
    kept in :attr:`app.sessions.Sessions.progress`)."""
    from .sessions import current

    cache = current().progress
    seen, rows = cache.get(search_id, (-1, []))
    new = store.progress_since(search_id, seen)
    if new:
        rows = rows + [r for _, r in new]
        if len(rows) > S.MAX_PROGRESS_ROWS:
            rows = rows[:-1:2] + rows[-1:]
        seen = new[-1][0]
    cache.put(search_id, (seen, rows))
    return rows


def get(sid: str) -> JobView | None:
    """The session's latest search, or None."""
    p = pool()
    row = p.store.latest_search(sid)
    if row is None:
        return None
    cost = row["best_cost_s"]
    return JobView(id=row["id"], algorithm=row["algorithm"], budget=str(Budget.parse(row["budget"])), seed=row["seed"],
                   status=row["status"], rows=_progress(p.store, row["id"]),
                   queue_position=p.store.queue_position(row["id"]) if row["status"] == "queued" else 0,
                   best_cost_s=cost if cost is not None and math.isfinite(cost) else None,
                   result=row["result"], error=row["error"], workers=p.workers)


def stop(sid: str) -> bool:
    """Ask the session's search to stop (a queued one never starts); whether one was running."""
    p = pool()
    row = p.store.latest_search(sid)
    if row is None or row["status"] not in ("queued", "running"):
        return False
    return p.store.request_stop(row["id"]) in ("queued", "running")


def best(sid: str) -> tuple[Strategy, float] | None:
    """The best strategy of the session's latest search that is no longer running."""
    p = pool()
    row = p.store.latest_search(sid)
    if row is None or row["status"] in ("queued", "running") or row["best"] is None:
        return None
    return strategy_from_dict(row["best"]), float(row["best_cost_s"])


#: at most this many of a search's notes in its status line, each cut to NOTE_CHARS
MAX_NOTES, NOTE_CHARS = 8, 160


def _notes(notes) -> str:
    """`` Notes: a; b; c.`` from a result's notes (none: empty)."""
    if not isinstance(notes, list) or not notes:
        return ""
    shown = [str(n)[:NOTE_CHARS] for n in notes[:MAX_NOTES]]
    more = f" (+{len(notes) - MAX_NOTES} more)" if len(notes) > MAX_NOTES else ""
    return " Notes: " + "; ".join(shown) + more + "."
