"""PaSE and the differentiable search on a mixed cluster (issue 28, item 5).

For each model: the plan each search finds on a mixed cluster, its simulated iteration time
against data parallel's and the best baseline's (the plan's own time, also when the search
returns a baseline instead: ``found_by["plan_time_s"]``), which baseline was returned if any,
the search's own cost F of its plan (the model's estimate) and its wall time. Each case runs
twice in one process, "before" and "after":

* ``--before prefix`` (default): before = a k-way config on devices 0..k-1 only, with its
  collectives over the first devices (PaSE's placement; :func:`engine.search.pase_placement.is_mixed`
  answered False for the run); after = the device set is part of the search on a mixed cluster
  (:mod:`engine.search.pase_placement`).
* ``--before device0``: before = every op priced at device 0's speed (the rule before commit
  e7fe51b, :func:`engine.search.pase.compute_time_s` replaced for the run); after = today's.

Clusters: ``hetero-demo`` (4 x H100, 4 x A100-40GB, 4 x V100), ``mixed-8`` (its H100 node and
V100 node: 4 x H100 + 4 x V100) and ``mixed-8-v100-first`` (the same two nodes, the V100 node
listed first, as a cluster file may list them: PaSE's first devices are then the slow ones) and
``v100-h100-h100`` (the V100 node, then two H100 nodes: the 8 fastest GPUs span two nodes).

Usage: python benchmarks/bench_hetero_search.py [--cluster hetero-demo|mixed-8|mixed-8-v100-first|v100-h100-h100]
       [--models alexnet,transformer] [--searches pase,differentiable] [--before prefix|device0]
"""

from __future__ import annotations

import argparse
import time

import math
from dataclasses import replace

import engine.search.pase as pase_module
import engine.search.pase_placement as placement_module
from engine.cluster import DEVICE_TYPES, Cluster, preset
from engine.formats import resolve_model
from engine.search.api import Budget, price
from engine.search.baselines import data_parallel
from engine.search.differentiable import differentiable
from engine.search.pase import pase

MODELS = ["alexnet", "transformer"]


def mixed8(v100_first: bool = False) -> Cluster:
    """hetero-demo's H100 node and V100 node: 8 GPUs (the V100s first when ``v100_first``)."""
    demo = preset("hetero-demo")
    nodes = [demo.node_specs[0], demo.node_specs[2]]
    if v100_first:
        return Cluster("mixed-8-v100-first", nodes[::-1], DEVICE_TYPES, "4 x V100 + 4 x H100")
    return Cluster("mixed-8", nodes, DEVICE_TYPES, "4 x H100 + 4 x V100")


def v100_h100_h100() -> Cluster:
    """hetero-demo's V100 node, then two of its H100 nodes: 12 GPUs, the 8 fastest span two nodes."""
    demo = preset("hetero-demo")
    return Cluster("v100-h100-h100", [demo.node_specs[2], replace(demo.node_specs[0], repeat=2)], DEVICE_TYPES,
                   "4 x V100 + 2 x (4 x H100)")


def cluster_named(name: str) -> Cluster:
    return {"mixed-8": lambda: mixed8(), "mixed-8-v100-first": lambda: mixed8(True),
            "v100-h100-h100": v100_h100_h100}.get(name, lambda: preset(name))()


def device0_compute_time_s(op, cfg, precision, cluster, cost) -> float:
    """The old rule: every config priced at device 0's speed."""
    f_s, b_s = cost.partition_times_s(op, cfg.degrees, precision, cluster.device_type(0))
    return f_s + b_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default="hetero-demo")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--searches", default="pase,differentiable")
    ap.add_argument("--before", choices=("prefix", "device0"), default="prefix")
    args = ap.parse_args()
    c = cluster_named(args.cluster)
    print(f"{c.name}: {c.description}; before = {args.before}")
    print(f"{'model':13} {'search':15} {'run':7} {'DP ms':>9} {'base ms':>9} {'base':>14} {'plan ms':>9} "
          f"{'plan/DP':>8} {'plan/base':>9} {'F ms':>9} {'returned':>14} {'wall s':>7}")
    fair_compute, fair_mixed = pase_module.compute_time_s, placement_module.is_mixed
    for model in args.models.split(","):
        g = resolve_model(model)
        dp = price(g, data_parallel(g, c), c)
        for name in args.searches.split(","):
            fn = {"pase": pase, "differentiable": differentiable}[name]
            for run in ("before", "after"):
                if run == "before" and args.before == "device0":
                    pase_module.compute_time_s = device0_compute_time_s
                elif run == "before":
                    placement_module.is_mixed = lambda cluster: False
                try:
                    t0 = time.perf_counter()
                    r = fn(g, c, Budget(seconds=600.0), seed=0)
                    wall = time.perf_counter() - t0
                finally:
                    pase_module.compute_time_s, placement_module.is_mixed = fair_compute, fair_mixed
                fb = r.best.found_by
                plan_s = fb.get("plan_time_s", r.best_time_s)
                model_s = fb.get("pase_cost_s", fb.get("model_cost_s", float("nan")))
                fits = {n: t for n, t in r.baselines.items() if math.isfinite(t)}
                base = min(fits, key=lambda n: fits[n]) if fits else "-"
                base_s = fits.get(base, math.inf)
                print(f"{model:13} {name:15} {run:7} {dp.time_s * 1e3:9.3f} {base_s * 1e3:9.3f} {base:>14} "
                      f"{plan_s * 1e3:9.3f} {plan_s / dp.time_s:7.2f}x {plan_s / base_s:8.2f}x {model_s * 1e3:9.3f} "
                      f"{r.baseline_returned or '-':>14} {wall:7.1f}", flush=True)


if __name__ == "__main__":
    main()
