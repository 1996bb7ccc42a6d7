"""Searches running in the background, one per session, streaming their progress.

A search runs in a thread of the server process (no external queue or broker: the app runs
anywhere ``pip install`` does). The engine's progress stream (:class:`engine.search.Progress`)
is appended to the job as it comes; the page polls it. Stopping sets a flag that the
progress callback returns, and the search ends with the best strategy so far.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field

from engine.search import ALGORITHMS, Budget, Progress, SearchResult

__all__ = ["SearchJob", "start", "get", "stop"]


@dataclass
class SearchJob:
    algorithm: str
    budget: str
    seed: int
    rows: list[dict[str, float]] = field(default_factory=list)
    result: SearchResult | None = None
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def status(self) -> str:
        if self.error:
            return f"Search failed: {self.error}"
        last = self.rows[-1] if self.rows else None
        if self.running:
            if last is None:
                return f"{self.algorithm}: starting (building the first chains)..."
            return (f"{self.algorithm}: {last['iteration']:,} proposals in {last['elapsed_s']:.1f} s, best "
                    f"{last['best_cost_s'] * 1e3:.3f} ms, acceptance {last['acceptance_rate']:.0%}")
        if self.result is not None:
            r = self.result
            how = "stopped" if r.cancelled else "finished"
            sp = r.speedup_vs_data_parallel
            unit = "proposals" if self.algorithm == "mcmc" else "steps"
            return (f"{self.algorithm} {how}: best {r.best_cost_s * 1e3:.3f} ms after {r.iterations:,} {unit} "
                    f"in {r.elapsed_s:.1f} s" + (f" ({sp:.2f}x data parallel)" if sp else "") +
                    ". Adopt it to edit it.")
        return ""


_jobs: dict[str, SearchJob] = {}
_lock = threading.Lock()


def start(sid: str, graph, cluster, algorithm: str, budget_text: str, seed: int, initial=None) -> SearchJob:
    """Start a search for session ``sid`` (replacing a finished one).

    Raises
    ------
    ValueError
        For an unknown algorithm, a budget that does not parse, or a search already running.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown search algorithm {algorithm!r}; available: {', '.join(ALGORITHMS)}")
    budget = Budget.parse(budget_text)
    with _lock:
        old = _jobs.get(sid)
        if old is not None and old.running:
            raise ValueError("a search is already running in this session; stop it first")
        job = _jobs[sid] = SearchJob(algorithm, str(budget), seed)
    fn = ALGORITHMS[algorithm][0]

    def on_progress(p: Progress) -> bool:
        job.rows.append(asdict(p))
        return not job._stop.is_set()

    def run() -> None:
        try:
            job.result = fn(graph, cluster, budget, seed=seed, progress=on_progress, initial=initial)
        except Exception as e:  # reported on the page; the server keeps serving
            job.error = f"{type(e).__name__}: {e}"

    job.thread = threading.Thread(target=run, name=f"search-{sid[:8]}", daemon=True)
    job.thread.start()
    return job


def get(sid: str) -> SearchJob | None:
    with _lock:
        return _jobs.get(sid)


def stop(sid: str) -> bool:
    """Ask the session's search to stop; whether one was running."""
    job = get(sid)
    if job is None or not job.running:
        return False
    job._stop.set()
    return True

