"""The pipeline planner (issue 6).

1. GPT-3 175B (batch 1536) on dgx-a100-80gb:192 (1,536 A100s): the planner's plan against
   Megatron's published layout for that run (tp 8, pp 12, dp 16, micro-batch 1, full
   recomputation; Narayanan et al. SC'21 Table 2 / run_table_1.sh), both simulated.
2. hetero-demo (4 H100 + 4 A100-40GB + 4 V100): the same planner with hardware-aware placement
   and with placement ignoring device speeds (every mesh planned as if it were the first),
   both simulated on the real cluster; the ratio is blind / aware.

Usage: python benchmarks/bench_pipeline.py [--only gpt3|hetero]
"""

from __future__ import annotations

import argparse
import platform
import time

from engine.cluster import preset
from engine.formats import resolve_model
from engine.sim.report import simulate_strategy
from engine.search.api import PipelineOptions
from engine.search.pipeline import pipeline
from engine.layout import Layout, build_layout


def gpt3() -> None:
    g, c = resolve_model("gpt3-175b"), preset("dgx-a100-80gb:192")
    t = time.perf_counter()
    r = pipeline(g, c, None)
    planned = time.perf_counter() - t
    meg = simulate_strategy(g, build_layout(g, c, Layout(tp=8, pp=12, dp=16, micro_batch=1, recompute="full")), c,
                            check=False)
    print(f"GPT-3 175B on 1,536 A100s: planner {r.best_cost_s:.2f} s per iteration ({r.best.found_by['plan']}); "
          f"planning + {r.iterations} simulations {planned:.1f} s")
    print(f"  Megatron's layout tp8 pp12 dp16 mb1 full recompute: {meg.iteration_time_s:.2f} s "
          f"(fits: {meg.memory.feasible}); planner / Megatron = {r.best_cost_s / meg.iteration_time_s:.3f}")


def hetero() -> None:
    for model in ("gpt2", "bert-large"):
        g, c = resolve_model(model), preset("hetero-demo")
        try:
            aware = pipeline(g, c, None)
            blind = pipeline(g, c, None, options=PipelineOptions(hardware_aware=False))
        except ValueError as e:
            print(f"{model} on hetero-demo: {e}")
            continue
        print(f"{model} on hetero-demo: hardware-aware {aware.best_cost_s * 1e3:.2f} ms "
              f"({aware.best.found_by['plan']}); speed-blind {blind.best_cost_s * 1e3:.2f} ms "
              f"({blind.best.found_by['plan']}); blind / aware = {blind.best_cost_s / aware.best_cost_s:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["gpt3", "hetero"])
    args = ap.parse_args()
    print(f"# {platform.node()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    if args.only != "gpt3":
        hetero()
    if args.only != "hetero":
        gpt3()


if __name__ == "__main__":
    main()
