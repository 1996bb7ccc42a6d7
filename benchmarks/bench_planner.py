"""The pipeline planner's planning time (``engine.search.pipeline.plan_pipeline``: every layout's
analytic cost and best layer split, before any plan is simulated), per case, and a hash of the
plans it returns (each plan's analytic cost and layout, in order): run it in two trees to time
a change and to see that the plans are the same to the bit (issue 43).

Usage: PYTHONPATH=<tree> python benchmarks/bench_planner.py [--rounds 2] [--cases resnet101@k80-16x4,...]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time

from engine.cluster import preset
from engine.costs import CostModel
from engine.formats import resolve_model
from engine.search.pipeline import plan_pipeline

CASES = ["resnet101@dgx-a100-40gb:8", "resnet101@k80-16x4", "resnet101@p100-4x4", "gpt2@dgx-h100:2",
         "llama2-7b@dgx-a100-80gb:8", "mixtral-8x7b@dgx-h100:8", "gpt2@hetero-demo"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    print(f"# {os.uname().nodename}, {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}; "
          f"{args.rounds} rounds (the first case of the first round carries the process's warm-up)")
    print("| case | layouts | planning s (median) | each round |")
    print("|---|---:|---:|---|")
    digest = hashlib.sha256()
    for case in args.cases.split(","):
        model, _, cluster = case.partition("@")
        g, c = resolve_model(model), preset(cluster)
        took = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            plans = plan_pipeline(g, c, CostModel(), True)
            took.append(time.perf_counter() - t)
        for p in plans:
            digest.update(repr((p.model_cost_s, p.describe())).encode())
        print(f"| {case} | {len(plans)} | {statistics.median(took):.2f} | {', '.join(f'{x:.2f}' for x in took)} |",
              flush=True)
    print(f"plans hash: {digest.hexdigest()}")


if __name__ == "__main__":
    main()
