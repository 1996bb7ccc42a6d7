"""Simulator speed: task-graph build time and full-simulation throughput, 1k to 1M+ tasks.

Prints one row per case: tasks, edges, build seconds, simulation seconds and simulated tasks
per second (median of ``--repeat`` runs after one warm-up), and, for the cases small enough,
the same simulation by the pure-Python reference loop (``engine.sim.full.run_reference``) in
the same process, with the speed-up ratio. The last case is GPT-3 175B on 1,024 A100s with
Megatron's layout (tp 8, pp 16, dp 8, 1F1B, micro-batch 1): end-to-end seconds (baseline
construction excluded: build + simulate), target < 2 s.

Usage: python benchmarks/bench_simulate.py [--repeat 5] [--quick]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from engine.cluster import preset
from engine.formats import resolve_model
from engine.search.baselines import data_parallel, expert
from engine.sim.full import run_reference, simulate
from engine.taskgraph import build_task_graph
from engine.layout import Layout, build_layout

REFERENCE_MAX_TASKS = 600_000  # the Python loop takes ~1 s per 250k tasks


def cases(quick: bool):
    inc = resolve_model("inception_v3")
    out = [
        ("inception_v3 dp 4 GPUs", inc, lambda c: data_parallel(inc, c), "dgx-a100-80gb:1", {"symmetry": "off"}),
        ("inception_v3 expert p100-4x4", inc, lambda c: expert(inc, c), "p100-4x4", {}),
        ("inception_v3 dp 16 GPUs, 4 mb", inc, lambda c: data_parallel(inc, c, micro_batch=1),
         "dgx-a100-80gb:2", {"symmetry": "off"}),
        ("inception_v3 expert k80 64 GPUs", inc, lambda c: expert(inc, c), "k80-16x4", {}),
    ]
    if quick:
        return out
    gpt3 = resolve_model("gpt3-175b")
    nmt = resolve_model("nmt")
    return out + [
        ("gpt3 tp8 pp8 dp1 64 GPUs, 96 mb", gpt3, lambda c: build_layout(gpt3, c, Layout(tp=8, pp=8, dp=1,
                                                                                         micro_batch=16)),
         "dgx-a100-80gb:8", {}),
        ("gpt3 tp8 pp16 dp2 256 GPUs", gpt3, lambda c: build_layout(gpt3, c, Layout(tp=8, pp=16, dp=2, micro_batch=4)),
         "dgx-a100-80gb:32", {}),
        ("nmt expert k80-16x4 (no symmetry)", nmt, lambda c: expert(nmt, c), "k80-16x4", {}),
        ("gpt3 tp8 pp16 dp8 1024 GPUs", gpt3, lambda c: build_layout(gpt3, c, Layout(tp=8, pp=16, dp=8, micro_batch=1)),
         "dgx-a100-80gb:128", {}),
    ]


def median_time(fn, repeat: int):
    fn()  # warm-up (compiles, fills caches)
    times = []
    result = None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small cases only")
    args = ap.parse_args()
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}; median of {args.repeat} runs after a warm-up")
    print(f"{'case':34} {'tasks':>9} {'edges':>9} {'build s':>8} {'sim s':>7} {'Mtasks/s':>9} "
          f"{'python s':>9} {'ratio':>6} {'end-to-end s':>12}")
    for name, g, make, cl, kw in cases(args.quick):
        c = preset(cl)
        s = make(c)
        build_s, tg = median_time(lambda g=g, s=s, c=c, kw=kw: build_task_graph(g, s, c, **kw), args.repeat)
        sim_s, tl = median_time(lambda tg=tg: simulate(tg), args.repeat)
        py = ratio = ""
        if tg.num_tasks <= REFERENCE_MAX_TASKS:
            py_s, _ = median_time(lambda tg=tg: run_reference(tg), max(1, args.repeat // 2))
            py, ratio = f"{py_s:9.3f}", f"{py_s / sim_s:6.1f}"
        e2e = f"{build_s + sim_s:12.2f}"
        print(f"{name:34} {tg.num_tasks:9,} {tg.num_edges:9,} {build_s:8.3f} {sim_s:7.3f} "
              f"{tg.num_tasks / sim_s / 1e6:9.2f} {py:>9} {ratio:>6} {e2e}  makespan {tl.makespan_s:.4g} s")


if __name__ == "__main__":
    main()
