"""One search, before and after a change, side by side: each case runs in a fresh process
(``python -c`` with ``PYTHONPATH`` and the working folder set to the tree under test), the base
tree and this one alternating per case, and prints the best simulated iteration time (ms), the
process's seconds and, for ``auto``, its polish's and MCMC's notes.

``--algo descent-expert`` (or ``descent-dp``) runs auto's polish alone, greedy coordinate descent
(``engine.search.polish.coordinate_descent``) from FlexFlow's expert strategy (or data
parallelism), with a number budget: the candidates it prices, the same answer in both trees
where the change is exact, so the seconds compare the same work.

Usage: python benchmarks/bench_search_ab.py --base /path/to/other/checkout [--algo mcmc|auto|descent-expert]
       [--budget 15s] [--seed 0] [--cases alexnet/p100-4x4,nmt/p100-4x4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ["alexnet/p100-4x4", "alexnet/k80-16x4", "inception_v3/p100-4x4", "resnet101/p100-4x4", "rnntc/p100-4x4",
         "rnnlm/p100-4x4", "nmt/p100-4x4"]
CODE = """
import json, sys, time
from engine.cluster import preset
from engine.formats import resolve_model
from engine.search import ALGORITHMS
from engine.search.api import Budget
algo, case, budget, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
model, cluster = case.split("/")
g, c = resolve_model(model), preset(cluster)
t = time.perf_counter()
if algo.startswith("descent-"):
    from engine.search.baselines import data_parallel, expert
    from engine.search.polish import coordinate_descent
    start = (expert if algo == "descent-expert" else data_parallel)(g, c)
    r = coordinate_descent(g, c, start, max_evals=Budget.parse(budget).iterations)
    print(json.dumps({"ms": r.cost_s * 1e3, "s": time.perf_counter() - t, "notes": [f"{r.evals} candidates"]}))
    sys.exit()
r = ALGORITHMS[algo].run(g, c, Budget.parse(budget), seed=seed)
notes = [n for n in r.notes if n.startswith(("polish", "mcmc from"))]
print(json.dumps({"ms": r.best_cost_s * 1e3, "s": time.perf_counter() - t, "notes": notes}))
"""


def run(tree: Path, algo: str, case: str, budget: str, seed: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CODE, algo, case, budget, str(seed)], env=env, cwd=tree,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--algo", default="mcmc")
    ap.add_argument("--budget", default="15s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    print(f"# {os.uname().nodename}, {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}; "
          f"{args.algo}, budget {args.budget}, seed {args.seed}; base {args.base} vs {ROOT}")
    print("| case | before ms (s) | after ms (s) |")
    print("|---|---:|---:|")
    for case in args.cases.split(","):
        before = run(args.base, args.algo, case, args.budget, args.seed)
        after = run(ROOT, args.algo, case, args.budget, args.seed)
        print(f"| {case} | {before['ms']:.2f} ({before['s']:.1f}) | {after['ms']:.2f} ({after['s']:.1f}) |",
              flush=True)
        for name, r in (("before", before), ("after", after)):
            if r["notes"]:
                print(f"  {name}: " + " | ".join(r["notes"]), flush=True)


if __name__ == "__main__":
    main()
