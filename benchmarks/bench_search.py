"""Delta simulation and MCMC search: speed and quality.

1. Time per proposal, delta vs full: from the data-parallel strategy, ``--proposals`` random
   single-op changes (seeded); *delta* = DeltaSimulator.change (rebuild the touched segments,
   resume the timeline), *full* = build the whole task graph and simulate it, both in this
   process; median seconds and their ratio. Inception-v3 and NMT on 16 (p100-4x4) and 64
   (k80-16x4) GPUs.
2. Search quality: for FlexFlow's six models on p100-4x4 and k80-16x4, MCMC for ``--budget``
   against data parallel and the expert strategy, and MCMC proposals per second.

Usage: python benchmarks/bench_search.py [--proposals 30] [--budget 60s] [--only delta|quality]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

from engine.cluster import preset
from engine.costs import CostModel
from engine.sim.delta import DeltaSimulator
from engine.formats import resolve_model
from engine.search.baselines import data_parallel
from engine.search.api import Budget
from engine.search.mcmc import mcmc
from engine.search.chains import random_config
from engine.sim.full import simulate
from engine.taskgraph import TaskGraphBuilder

DELTA_CASES = [("inception_v3", "p100-4x4"), ("inception_v3", "k80-16x4"), ("nmt", "p100-4x4"), ("nmt", "k80-16x4")]
QUALITY_MODELS = ["alexnet", "inception_v3", "resnet101", "rnntc", "rnnlm", "nmt"]
QUALITY_CLUSTERS = ["p100-4x4", "k80-16x4"]


def delta_vs_full(proposals: int) -> None:
    print(f"{'case':28} {'GPUs':>4} {'tasks':>9} {'delta ms':>9} {'full ms':>9} {'ratio':>6}")
    for model, cl in DELTA_CASES:
        g, c = resolve_model(model), preset(cl)
        sim = DeltaSimulator(g, data_parallel(g, c), c)
        rng = random.Random(0)
        names = [op.name for op in g.ops if op.kind != "input"]
        d_times, f_times = [], []
        for _ in range(proposals):
            name = rng.choice(names)
            config = random_config(g[name], c.num_devices, rng)
            if sim.check(name, config) or config == sim.strategy[name]:
                continue
            t = time.perf_counter()
            sim.change(name, config)
            d_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            simulate(TaskGraphBuilder(g, sim.strategy, c, CostModel()).build())
            f_times.append(time.perf_counter() - t)
            sim.revert()
        d, f = statistics.median(d_times), statistics.median(f_times)
        print(f"{model + ' on ' + cl:28} {c.num_devices:4d} {sim.tasks.num_tasks:9,} {d * 1e3:9.1f} {f * 1e3:9.1f} "
              f"{f / d:6.1f}", flush=True)


def quality(budget: Budget) -> None:
    print(f"{'model':14} {'cluster':9} {'best ms':>9} {'data-par ms':>11} {'expert ms':>10} {'vs dp':>6} "
          f"{'vs expert':>9} {'proposals':>9} {'prop/s':>7} {'local opt':>9}")
    for cl in QUALITY_CLUSTERS:
        for model in QUALITY_MODELS:
            g, c = resolve_model(model), preset(cl)
            r = mcmc(g, c, budget, seed=0)
            dp, ex = r.baselines["data-parallel"], r.baselines["expert"]
            print(f"{model:14} {cl:9} {r.best_cost_s * 1e3:9.2f} {dp * 1e3:11.2f} {ex * 1e3:10.2f} "
                  f"{dp / r.best_cost_s:6.2f} {ex / r.best_cost_s:9.2f} {r.iterations:9d} "
                  f"{r.iterations / r.elapsed_s:7.1f} {str(r.locally_optimal):>9}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--proposals", type=int, default=30)
    ap.add_argument("--budget", default="60s")
    ap.add_argument("--only", choices=["delta", "quality"])
    args = ap.parse_args()
    print(f"# {platform.node()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    if args.only != "quality":
        delta_vs_full(args.proposals)
    if args.only != "delta":
        quality(Budget.parse(args.budget))


if __name__ == "__main__":
    main()
