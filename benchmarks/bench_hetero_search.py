"""PaSE and the differentiable search on a mixed cluster (issue 28, item 5).

For each model: the plan each search finds on ``hetero-demo`` (4 x H100, 4 x A100-40GB,
4 x V100), its simulated iteration time against data parallel's (the plan's own time, also
when the search returns a baseline instead: ``found_by["plan_time_s"]``), which baseline
was returned if any, and the search's wall time. Before the fix both searches priced every
op at device 0's speed (an H100 here).

Usage: python benchmarks/bench_hetero_search.py [--cluster hetero-demo] [--models resnet101,...]
"""

from __future__ import annotations

import argparse
import time

from engine.cluster import preset
from engine.formats import resolve_model
from engine.search.api import Budget, price
from engine.search.baselines import data_parallel
from engine.search.differentiable import differentiable
from engine.search.pase import pase

MODELS = ["resnet101", "alexnet", "inception_v3", "rnnlm"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default="hetero-demo")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--searches", default="pase,differentiable")
    args = ap.parse_args()
    c = preset(args.cluster)
    print(f"{'model':13} {'search':15} {'DP ms':>9} {'plan ms':>9} {'plan/DP':>8} {'returned':>14} "
          f"{'devices':>8} {'wall s':>7}")
    for model in args.models.split(","):
        g = resolve_model(model)
        dp = price(g, data_parallel(g, c), c)
        for name in args.searches.split(","):
            fn = {"pase": pase, "differentiable": differentiable}[name]
            t0 = time.perf_counter()
            r = fn(g, c, Budget(seconds=600.0), seed=0)
            wall = time.perf_counter() - t0
            fb = r.best.found_by
            plan_s = fb.get("plan_time_s", r.best_time_s)
            used = len({d for cfg in r.best.configs.values() for d in cfg.devices}) if not r.baseline_returned else 0
            print(f"{model:13} {name:15} {dp.time_s * 1e3:9.3f} {plan_s * 1e3:9.3f} {plan_s / dp.time_s:8.2f}x "
                  f"{r.baseline_returned or '-':>14} {used or '-':>8} {wall:7.1f}", flush=True)


if __name__ == "__main__":
    main()
