"""Cooperative cancellation: how soon a cancelled build or simulation stops, and what the
cancel checks cost the event loop.

The case is the explorer's largest background build: LLaMA-2 7B under FlexFlow's "expert"
strategy on ``dgx-a100-80gb:8`` (64 A100s; no exact symmetry, so ~9 M tasks are built and
simulated). A worker thread runs :func:`engine.report.simulate_strategy` (build, simulate,
account memory) with a :class:`threading.Event` as ``cancel``; the main thread asks to cancel
at several points of the run and measures the seconds from just before ``cancel.set()``
(waiting for the interpreter lock included, as a request thread would) to the worker's
:class:`engine.errors.Cancelled`. The simulation alone is cancelled the same way on a
prebuilt task graph.

Overhead: :func:`engine.simulate.run_schedule` of the same task graph with no cancel (one
compiled call) against a never-set cancel (chunks of ``CANCEL_CHECK_EVENTS`` tasks with a
check between them), alternated, median of ``--repeat`` runs each.

Usage: python benchmarks/bench_cancel.py [--repeat 3] [--model llama2-7b] [--cluster dgx-a100-80gb:8]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import threading
import time
from typing import Any, Callable

from engine.errors import Cancelled
from engine.formats import resolve_cluster, resolve_model
from engine.report import simulate_strategy
from engine.search.baselines import make_baseline
from engine.simulate import CANCEL_CHECK_EVENTS, run_schedule
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
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    g, c = resolve_model(args.model), resolve_cluster(args.cluster)
    s = make_baseline(args.strategy, g, c)
    print(f"{platform.processor() or platform.machine()}, {args.model} {args.strategy} on {args.cluster}")
    t0 = time.perf_counter()
    r = simulate_strategy(g, s, c, check=False)  # (also warms the compiled loop)
    whole_s = time.perf_counter() - t0
    tg = r.tasks
    print(f"uncancelled simulate_strategy: {whole_s:.1f} s, {tg.num_tasks:,} tasks, makespan {r.iteration_time_s:.6f} s")
    del r

    print("\ncancel during simulate_strategy (build, simulate, memory):")
    lat = []
    for frac in (0.05, 0.25, 0.5, 0.75, 0.9):
        after = frac * whole_s
        dt, how = cancel_latency_s(lambda ev: simulate_strategy(g, s, c, check=False, cancel=ev), after)
        lat.append(dt)
        print(f"  cancel at {after:5.1f} s ({frac:.0%} of a run): stopped {dt * 1e3:7.1f} ms later ({how})")
    print(f"  median {statistics.median(lat) * 1e3:.1f} ms, max {max(lat) * 1e3:.1f} ms")

    sim_s = min(_time(lambda: run_schedule(tg)) for _ in range(2))
    print(f"\ncancel during the event loop alone ({sim_s:.2f} s uncancelled, checks every "
          f"{CANCEL_CHECK_EVENTS:,} tasks):")
    lat_sim = []
    for frac in (0.1, 0.3, 0.5, 0.7, 0.9):
        dt, how = cancel_latency_s(lambda ev: run_schedule(tg, cancel=ev), frac * sim_s)
        lat_sim.append(dt)
        print(f"  cancel at {frac * sim_s:5.2f} s: stopped {dt * 1e3:7.1f} ms later ({how})")
    print(f"  median {statistics.median(lat_sim) * 1e3:.1f} ms, max {max(lat_sim) * 1e3:.1f} ms")

    never = threading.Event()
    plain, checked = [], []
    for _ in range(args.repeat):
        plain.append(_time(lambda: run_schedule(tg)))
        checked.append(_time(lambda: run_schedule(tg, cancel=never)))
    p, q = statistics.median(plain), statistics.median(checked)
    print(f"\nevent loop, {tg.num_tasks:,} tasks, median of {args.repeat}: no cancel {p:.3f} s, never-set cancel "
          f"{q:.3f} s: overhead {100 * (q - p) / p:+.1f}%")
    build_plain = _time(lambda: build_task_graph(g, s, c))
    build_checked = _time(lambda: build_task_graph(g, s, c, cancel=never))
    print(f"build, one run each: no cancel {build_plain:.2f} s, never-set cancel {build_checked:.2f} s")
    return 0


def _time(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    raise SystemExit(main())
