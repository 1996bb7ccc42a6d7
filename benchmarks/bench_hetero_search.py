"""PaSE and the differentiable search on a mixed cluster (issue 28, item 5).

For each model: the plan each search finds on ``hetero-demo`` (4 x H100, 4 x A100-40GB,
4 x V100), its simulated iteration time against data parallel's (the plan's own time, also
when the search returns a baseline instead: ``found_by["plan_time_s"]``), which baseline
was returned if any, the search's own cost F of its plan (the model's estimate) and its wall
time. Before the fix both searches priced every op at device 0's speed (an H100 here): each
case runs with device-0 pricing ("before", :func:`engine.search.pase.compute_time_s` replaced
for the run by the old rule) and with the devices' own speeds ("after"), in one process.

``--cluster mixed-8`` is 4 x H100 and 4 x V100 (hetero-demo's first and last nodes): with
power-of-two dims every 8-way config reaches the V100s, while on hetero-demo's 12 GPUs only a
dim divisible by 3 does (PaSE's degrees divide the device count).

Usage: python benchmarks/bench_hetero_search.py [--cluster hetero-demo|mixed-8] [--models resnet101,...]
"""

from __future__ import annotations

import argparse
import time

import engine.search.pase as pase_module
from engine.cluster import DEVICE_TYPES, Cluster, preset
from engine.formats import resolve_model
from engine.search.api import Budget, price
from engine.search.baselines import data_parallel
from engine.search.differentiable import differentiable
from engine.search.pase import pase

MODELS = ["resnet101", "alexnet", "inception_v3", "rnnlm"]


def mixed8() -> Cluster:
    """hetero-demo's H100 node and V100 node: 8 GPUs."""
    demo = preset("hetero-demo")
    return Cluster("mixed-8", [demo.node_specs[0], demo.node_specs[2]], DEVICE_TYPES, "4 x H100 + 4 x V100")


def device0_compute_time_s(op, cfg, precision, cluster, cost) -> float:
    """The old rule: every config priced at device 0's speed."""
    f_s, b_s = cost.partition_times_s(op, cfg.degrees, precision, cluster.device_type(0))
    return f_s + b_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default="hetero-demo")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--searches", default="pase,differentiable")
    args = ap.parse_args()
    c = mixed8() if args.cluster == "mixed-8" else preset(args.cluster)
    print(f"{c.name}: {c.description}")
    print(f"{'model':13} {'search':15} {'pricing':8} {'DP ms':>9} {'plan ms':>9} {'plan/DP':>8} {'F ms':>9} "
          f"{'returned':>14} {'wall s':>7}")
    fair = pase_module.compute_time_s
    for model in args.models.split(","):
        g = resolve_model(model)
        dp = price(g, data_parallel(g, c), c)
        for name in args.searches.split(","):
            fn = {"pase": pase, "differentiable": differentiable}[name]
            for pricing, rule in (("before", device0_compute_time_s), ("after", fair)):
                pase_module.compute_time_s = rule
                try:
                    t0 = time.perf_counter()
                    r = fn(g, c, Budget(seconds=600.0), seed=0)
                    wall = time.perf_counter() - t0
                finally:
                    pase_module.compute_time_s = fair
                fb = r.best.found_by
                plan_s = fb.get("plan_time_s", r.best_time_s)
                model_s = fb.get("pase_cost_s", fb.get("model_cost_s", float("nan")))
                print(f"{model:13} {name:15} {pricing:8} {dp.time_s * 1e3:9.3f} {plan_s * 1e3:9.3f} "
                      f"{plan_s / dp.time_s:8.2f}x {model_s * 1e3:9.3f} {r.baseline_returned or '-':>14} "
                      f"{wall:7.1f}", flush=True)

if __name__ == "__main__":
    main()
