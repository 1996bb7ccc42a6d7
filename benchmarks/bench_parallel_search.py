"""MCMC chains on the sweep's backends (issue 28, item 4): proposals per second and best time,
one process against a process pool, and the same answer on each.

For each case, with a proposal budget (``--proposals``, seeded, no final polish so that the
figures are the chains' own):

* ``classic``: :func:`engine.search.mcmc.mcmc` without a backend (chains one after another,
  successive halving);
* ``serial``: the round-based chains (:mod:`engine.search.parallel_chains`) in this process;
* ``pool xN``: the same on a process pool of N workers (and ``ray x2`` with ``--ray``).

Printed per run: seconds, proposals per second, best simulated time (ms), proposals priced
from the shared cache, and whether the answer equals the serial run's (it must: same seed, same
proposal budget). The machine's load (``os.getloadavg``) is printed before and after: on a
shared machine the pool's speed-up depends on the cores the others leave free.

Usage: python benchmarks/bench_parallel_search.py [--proposals 400] [--workers 1,2] [--chains 4]
       [--cases alexnet/p100-4x4,inception_v3/p100-4x4] [--ray]
"""

from __future__ import annotations

import argparse
import os
import time

from engine.cluster import preset
from engine.formats import resolve_model
from engine.search.api import Budget, MCMCOptions
from engine.search.mcmc import mcmc


def run(g, c, proposals: int, seed: int, chains: int, backend: str | None, workers: int) -> tuple:
    t = time.perf_counter()
    r = mcmc(g, c, Budget(iterations=proposals), seed=seed,
             options=MCMCOptions(chains=chains, polish=False, backend=backend, workers=workers))
    s = time.perf_counter() - t
    cache = r.best.found_by.get("cache") or {}
    return s, r, cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proposals", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--workers", default="1,2", help="pool sizes, comma-separated")
    ap.add_argument("--cases", default="alexnet/p100-4x4,inception_v3/p100-4x4")
    ap.add_argument("--ray", action="store_true", help="also Ray's local mode with 2 CPUs")
    args = ap.parse_args()
    print(f"cores {os.cpu_count()}, load average (1, 5, 15 min) before: "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'case':26} {'run':9} {'s':>7} {'proposals/s':>11} {'best ms':>9} {'proposals':>9} "
          f"{'cache hits':>10} {'same answer':>11}")
    for case in args.cases.split(","):
        model, cl = case.split("/")
        g, c = resolve_model(model), preset(cl)
        runs = [("classic", None, 1), ("serial", "serial", 1)]
        runs += [(f"pool x{w}", "pool", int(w)) for w in args.workers.split(",") if int(w) > 1]
        if args.ray:
            runs.append(("ray x2", "ray", 2))
        ref = None
        for label, backend, workers in runs:
            s, r, cache = run(g, c, args.proposals, args.seed, args.chains, backend, workers)
            key = (r.best_cost_s, r.best.to_dict()["ops"], r.iterations)
            if backend == "serial":
                ref = key
            same = "-" if backend is None else ("yes" if key == ref else "NO")
            hits = "-" if backend is None else str(cache.get("hits_other", 0) + cache.get("hits_own", 0))
            print(f"{case:26} {label:9} {s:7.2f} {r.iterations / s:11.1f} {r.best_cost_s * 1e3:9.3f} "
                  f"{r.iterations:9d} {hits:>10} {same:>11}", flush=True)
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
