"""One prediction (``simulate_strategy(steady=True)``: what a sweep and ``soapbox simulate`` run)
with the steady state tried every microbatch only (before) and every microbatch then every p
microbatches (after, :func:`engine.sim.steady.steady_periods`), interleaved in one process, on
Megatron layouts of LLaMA-2 7B (64 A100s) and GPT-3 175B (256 H100s): tp 1-8, pp 2-8,
micro-batch 1-2, with and without sequence parallelism. Each layout's iteration time is checked
equal both ways (the extrapolation is exact, or the full simulation runs).

Usage: PYTHONPATH=. python benchmarks/bench_steady_periods.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import time

from engine.cluster import preset
from engine.layout import Layout, build_layout
from engine.models import build_sample
from engine.sim import steady
from engine.sim.report import simulate_strategy

CASES = (("llama2-7b", "dgx-a100-80gb:8"), ("gpt3-175b", "dgx-h100:32"))


def _layouts():
    for model, cl in CASES:
        g, c = build_sample(model), preset(cl)
        for tp, pp, mb, sp in itertools.product((1, 2, 4, 8), (2, 4, 8), (1, 2), (False, True)):
            if sp and tp == 1:
                continue
            try:
                s = build_layout(g, c, Layout(tp=tp, pp=pp, micro_batch=mb, sequence_parallel=sp))
            except ValueError:
                continue
            if steady.short_runs(g, s):
                yield f"{model} tp{tp} pp{pp} mb{mb}{' sp' if sp else ''}", g, c, s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"# {platform.node()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.2f}; median of {args.rounds} interleaved rounds")
    tried = steady.steady_periods
    every_one = lambda p, v, schedule: tried(p, v, schedule)[:1]  # noqa: E731 (before: one period tried)
    layouts = list(_layouts())
    for _, g, c, s in layouts[:2]:  # (numba's kernels loaded, the caches warm)
        simulate_strategy(g, s, c, check=False, steady=True)
    rows, before_all, after_all = [], [], []
    for name, g, c, s in layouts:
        t = {"before": [], "after": []}
        got = {}
        for _ in range(args.rounds):
            for label, fn in (("before", every_one), ("after", tried)):
                steady.steady_periods = fn
                try:
                    a = time.perf_counter()
                    r = simulate_strategy(g, s, c, check=False, steady=True)
                    t[label].append(time.perf_counter() - a)
                finally:
                    steady.steady_periods = tried
                got[label] = (r.iteration_time_s, r.steady.period if r.steady else None)
        assert abs(got["before"][0] - got["after"][0]) <= 1e-9 * got["before"][0], (name, got)
        b, a = statistics.median(t["before"]), statistics.median(t["after"])
        before_all.append(b)
        after_all.append(a)
        rows.append((name, b, a, got["before"][1], got["after"][1]))
    print("| layout | before s | after s | after / before | period before | period after |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, b, a, pb, pa in rows:
        if pb != pa:
            print(f"| {name} | {b:.3f} | {a:.3f} | {a / b:.2f} | {pb or 'full'} | {pa or 'full'} |")
    changed = [r for r in rows if r[3] != r[4]]
    same = [r for r in rows if r[3] == r[4]]
    print(f"\n{len(rows)} layouts; {len(changed)} now extrapolated with period p: "
          f"{sum(r[1] for r in changed):.2f} s -> {sum(r[2] for r in changed):.2f} s; "
          f"{sum(1 for r in same if r[3] is None)} simulated in full both ways (each pays a second short run: "
          f"{sum(r[1] for r in same if r[3] is None):.2f} s -> {sum(r[2] for r in same if r[3] is None):.2f} s); "
          f"all {len(rows)}: {sum(before_all):.2f} s -> {sum(after_all):.2f} s ({sum(after_all) / sum(before_all):.2f}x)")


if __name__ == "__main__":
    main()
