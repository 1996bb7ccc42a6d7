"""``auto``'s time budget (issue 28): wall time against the budget (set-up included), where
the answer came from, and how it compares with MCMC given ten times the budget.

    PYTHONPATH=. python benchmarks/bench_auto_budget.py [--budget 10s] [--model alexnet]
        [--cluster p100-4x4] [--no-mcmc]

Prints one Markdown row per run with the machine's load (``os.getloadavg``): the machine is
shared, so figures are one run each, not a timing test.
"""

from __future__ import annotations

import argparse
import os
import time

from engine.cluster import preset
from engine.formats import resolve_model
from engine.search import ALGORITHMS, Budget


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="10s")
    ap.add_argument("--model", default="alexnet")
    ap.add_argument("--cluster", default="p100-4x4")
    ap.add_argument("--no-mcmc", action="store_true", help="skip MCMC with ten times the budget")
    args = ap.parse_args()
    budget = Budget.parse(args.budget)
    g, c = resolve_model(args.model), preset(args.cluster)
    print(f"# {args.model} on {args.cluster}, load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M')}")
    print("| algorithm | budget s | wall s | wall / budget | best ms | source |")
    print("|---|---:|---:|---:|---:|---|")
    t = time.perf_counter()
    r = ALGORITHMS["auto"].run(g, c, budget, seed=0)
    wall = time.perf_counter() - t
    print(f"| auto | {budget.seconds:g} | {wall:.1f} | {wall / budget.seconds:.2f} | {r.best_cost_s * 1e3:.2f} | "
          f"{r.best.found_by['source']} |", flush=True)
    for n in r.notes:
        print(f"<!-- {n} -->")
    if not args.no_mcmc:
        long = Budget(seconds=10 * budget.seconds)
        t = time.perf_counter()
        m = ALGORITHMS["mcmc"].run(g, c, long, seed=0)
        wall = time.perf_counter() - t
        print(f"| mcmc | {long.seconds:g} | {wall:.1f} | {wall / long.seconds:.2f} | {m.best_cost_s * 1e3:.2f} | "
              f"mcmc |")
        print(f"auto / mcmc at 10x: {r.best_cost_s / m.best_cost_s:.3f}")


if __name__ == "__main__":
    main()
