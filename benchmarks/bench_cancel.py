"""Cooperative cancellation: how soon a cancelled build or simulation stops, and what the
cancel checks cost the event loop.

The case is the explorer's largest background build: LLaMA-2 7B under FlexFlow's "expert"
strategy on ``dgx-a100-80gb:8`` (64 A100s; no exact symmetry, so ~9 M tasks are built and
simulated). A worker thread runs :func:`engine.sim.report.simulate_strategy` (build, simulate,
account memory) with a :class:`threading.Event` as ``cancel``; the main thread asks to cancel
at several points of the run and measures the seconds from just before ``cancel.set()``
(waiting for the interpreter lock included, as a request thread would) to the worker's
:class:`engine.errors.Cancelled`. The simulation alone is cancelled the same way on a
prebuilt task graph.

Overhead: :func:`engine.sim.full.run_schedule` of the same task graph with no cancel (one
compiled call) against a never-set cancel (chunks of ``CANCEL_CHECK_EVENTS`` tasks with a
check between them), and the build likewise, alternated, median and minimum of ``--repeat``
runs each (on a shared machine the minimum is the steadier figure).

Usage: python benchmarks/bench_cancel.py [--repeat 5] [--model llama2-7b] [--cluster dgx-a100-80gb:8]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
from typing import Any, Callable

from engine.errors import Cancelled
from engine.formats import resolve_cluster, resolve_model
from engine.sim.report import simulate_strategy
from engine.search.baselines import make_baseline
from engine.sim.full import CANCEL_CHECK_EVENTS, run_schedule
from engine.taskgraph import build_task_graph


def cancel_latency_s(work: Callable[[Any], Any], after_s: float) -> tuple[float, str]:
    """Run ``work(cancel)`` in a thread, ask to cancel ``after_s`` seconds in; (seconds from
    the request to the thread's end, how it ended)."""
    cancel = threading.Event()
    outcome: list[str] = []
    ended = [0.0]

    def run() -> None:
        try:
            work(cancel)
            outcome.append("finished")
        except Cancelled:
            outcome.append("cancelled")
        ended[0] = time.perf_counter()

    th = threading.Thread(target=run)
    th.start()
    time.sleep(after_s)
    asked = time.perf_counter()
    cancel.set()
    th.join()
    return ended[0] - asked, outcome[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--cluster", default="dgx-a100-80gb:8")
    ap.add_argument("--strategy", default="expert")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    g, c = resolve_model(args.model), resolve_cluster(args.cluster)
    s = make_baseline(args.strategy, g, c)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"{args.model} {args.strategy} on {args.cluster}")
    simulate_strategy(g, s, c, check=False)  # (warms the compiled loops and the caches)
    t0 = time.perf_counter()
    r = simulate_strategy(g, s, c, check=False)
    whole_s = time.perf_counter() - t0
    tg = r.tasks
    print(f"uncancelled simulate_strategy: {whole_s:.1f} s, {tg.num_tasks:,} tasks, makespan {r.iteration_time_s:.6f} s")
    del r

    print("\ncancel during simulate_strategy (build, simulate, memory):")
    lat = []
    for frac in (0.05, 0.2, 0.35, 0.5, 0.65, 0.8):
        after = frac * whole_s
        dt, how = cancel_latency_s(lambda ev: simulate_strategy(g, s, c, check=False, cancel=ev), after)
        if how == "cancelled":
            lat.append(dt)
        print(f"  cancel at {after:5.1f} s ({frac:.0%} of a run): {how} {dt * 1e3:7.1f} ms after the request")
    _stats(lat)

    sim_s = min(_time(lambda: run_schedule(tg)) for _ in range(2))
    print(f"\ncancel during the event loop alone ({sim_s:.2f} s uncancelled, checks every "
          f"{CANCEL_CHECK_EVENTS:,} tasks):")
    lat_sim = []
    for frac in (0.1, 0.3, 0.5, 0.7, 0.9):
        dt, how = cancel_latency_s(lambda ev: run_schedule(tg, cancel=ev), frac * sim_s)
        if how == "cancelled":
            lat_sim.append(dt)
        print(f"  cancel at {frac * sim_s:5.2f} s: {how} {dt * 1e3:7.1f} ms after the request")
    _stats(lat_sim)

    never = threading.Event()
    for label, plain_fn, checked_fn in (
            ("event loop", lambda: run_schedule(tg), lambda: run_schedule(tg, cancel=never)),
            ("build", lambda: build_task_graph(g, s, c), lambda: build_task_graph(g, s, c, cancel=never))):
        plain, checked = [], []
        for _ in range(args.repeat):  # (alternated: a busy machine slows both alike)
            plain.append(_time(plain_fn))
            checked.append(_time(checked_fn))
        p, q = statistics.median(plain), statistics.median(checked)
        print(f"{label}, {tg.num_tasks:,} tasks, {args.repeat} runs each: no cancel median {p:.3f} s (min "
              f"{min(plain):.3f}), never-set cancel median {q:.3f} s (min {min(checked):.3f}): overhead "
              f"{100 * (q - p) / p:+.1f}% by medians, {100 * (min(checked) - min(plain)) / min(plain):+.1f}% by minima")
    return 0


def _stats(lat: list[float]) -> None:
    if lat:
        print(f"  median {statistics.median(lat) * 1e3:.1f} ms, max {max(lat) * 1e3:.1f} ms over {len(lat)} cancels")


def _time(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    raise SystemExit(main())
