"""MCMC proposals per second (issue 13's speed goal: >= 100/s on Inception-v3 / 16 GPUs and
>= 30/s on NMT / 64 GPUs, one core).

Each case runs ``mcmc`` with one chain, no polish and a fixed number of proposals in a fresh
process (``python -c`` with ``PYTHONPATH`` set to the tree under test, after a warm-up run
that compiles numba's cache), and reports proposals / elapsed seconds (set-up included), proposals / CPU seconds of the
process (less sensitive to other processes on a shared machine) and the steady rate between the first
and the last progress rows (set-up excluded: on NMT / 64 GPUs building the two starting
simulations takes ~2.3 s, the length of some 40 proposals).
After the search, ``--samples`` single-op changes of the best strategy found are each timed
(CPU time) as a proposal (:meth:`DeltaSimulator.change`) and as a full build and simulation of
the changed strategy, and the median ratios are printed (FlexFlow's point: a proposal costs far
less than a simulation; issue 28's goal: >= 20x).
With ``--baseline TREE`` the same runs of another checkout are interleaved with the current
tree's, round by round, and the ratio of medians is printed.

Global moves (whole-strategy rebuilds, :mod:`engine.search.moves`) are off by default here
(``--global-share 0``): the rate is that of single-op proposals, the delta-simulated ones.

Usage: python benchmarks/bench_proposals.py [--rounds 3] [--baseline /path/to/other/checkout]
       [--global-share 0.1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [("inception_v3", "p100-4x4", 400), ("nmt", "k80-16x4", 200)]
CODE = """
import json, sys, time
from engine.formats import resolve_model
from engine.cluster import preset
from engine.search import ALGORITHMS, Budget
from engine.search.api import MCMCOptions
g, c = resolve_model(sys.argv[1]), preset(sys.argv[2])
opts = {"chains": 1, "polish": False}
if "global_share" in MCMCOptions.__dataclass_fields__:  # (a tree from before global moves has none)
    opts["global_share"] = float(sys.argv[4])
rows = []
t, cpu = time.perf_counter(), time.process_time()
r = ALGORITHMS["mcmc"].run(g, c, Budget(iterations=int(sys.argv[3])), options=MCMCOptions(**opts),
                           progress=rows.append)
seconds, cpu_s = time.perf_counter() - t, time.process_time() - cpu
# steady rate: proposals between the first and the last progress row (set-up excluded)
a, b = rows[0], rows[-2] if len(rows) > 2 else rows[-1]
steady = (b.iteration - a.iteration) / (b.elapsed_s - a.elapsed_s) if b.elapsed_s > a.elapsed_s else 0.0
# a proposal against a full simulation of the same graph: from the best strategy found,
# single-op changes (each reverted) timed as a proposal's change and as a full build and
# simulation of the changed strategy (no symmetry, like the delta simulator's own build)
import random
from engine.costs import CostModel
from engine.delta import DeltaSimulator
from engine.search.mcmc import random_config
from engine.simulate import simulate
from engine.taskgraph import TaskGraphBuilder
sim = DeltaSimulator(g, r.best, c)
rng, names, ratios, sim_ratios, tasks = random.Random(0), [op.name for op in g.ops], [], [], []
while len(ratios) < int(sys.argv[5]):
    name = rng.choice(names)
    config = random_config(g[name], c.num_devices, rng)
    if config == sim.strategy[name] or sim.check(name, config):
        continue
    t = time.process_time()
    sim.change(name, config)
    t_prop = time.process_time() - t
    t = time.process_time()
    tg = TaskGraphBuilder(g, sim.strategy, c, CostModel()).build()
    t_build = time.process_time() - t
    t = time.process_time()
    simulate(tg)
    t_sim = time.process_time() - t
    ratios.append((t_build + t_sim) / t_prop)
    sim_ratios.append(t_sim / t_prop)
    tasks.append(tg.num_tasks)
    sim.revert()
ratios.sort(); sim_ratios.sort(); tasks.sort()
print(json.dumps({"proposals": r.iterations, "seconds": seconds, "cpu_s": cpu_s, "best_s": r.best_cost_s,
                  "steady": steady, "ratio_full": ratios[len(ratios) // 2], "ratio_sim": sim_ratios[len(ratios) // 2],
                  "tasks": tasks[len(tasks) // 2]}))
"""


def run(tree: Path, model: str, cluster: str, n: int, share: float = 0.0, samples: int = 1) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CODE, model, cluster, str(n), str(share), str(samples)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path)
    ap.add_argument("--global-share", type=float, default=0.0,
                    help="MCMCOptions.global_share (default 0: single-op proposals only, the rate the goal names)")
    ap.add_argument("--samples", type=int, default=15,
                    help="proposals timed against a full build and simulation of the same graph (median ratio)")
    args = ap.parse_args()
    trees = [("current", ROOT)] + ([("baseline", args.baseline)] if args.baseline else [])
    print(f"# {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; median of {args.rounds} rounds")
    for model, cluster, n in CASES:
        for _, tree in trees:
            run(tree, model, cluster, 10)  # warm-up: numba's cache, the page cache
        rates: dict[str, list[float]] = {name: [] for name, _ in trees}
        steady: dict[str, list[float]] = {name: [] for name, _ in trees}
        per_cpu: dict[str, list[float]] = {name: [] for name, _ in trees}
        full: dict[str, list[float]] = {name: [] for name, _ in trees}
        sim: dict[str, list[float]] = {name: [] for name, _ in trees}
        tasks: dict[str, list[int]] = {name: [] for name, _ in trees}
        for _ in range(args.rounds):
            for name, tree in trees:
                r = run(tree, model, cluster, n, args.global_share, args.samples)
                rates[name].append(r["proposals"] / r["seconds"])
                steady[name].append(r["steady"])
                per_cpu[name].append(r["proposals"] / r["cpu_s"])
                full[name].append(r["ratio_full"])
                sim[name].append(r["ratio_sim"])
                tasks[name].append(r["tasks"])
        print(f"{model} on {cluster}: median tasks of the sampled proposals' graphs " +
              ", ".join(f"{name} {statistics.median(v):,.0f}" for name, v in tasks.items()))
        for label, table in (("with set-up", rates), ("steady (set-up excluded)", steady),
                             ("per CPU second, with set-up", per_cpu),
                             ("full build + simulation / proposal (x)", full),
                             ("simulation alone / proposal (x)", sim)):
            unit = "" if "(x)" in label else "/s"
            line = f"{model} on {cluster}, {label}: " + ", ".join(
                f"{name} {statistics.median(v):.1f}{unit} ({min(v):.1f}-{max(v):.1f})" for name, v in table.items())
            if args.baseline:
                line += f"; ratio {statistics.median(table['current']) / statistics.median(table['baseline']):.2f}"
            print(line, flush=True)
    print(f"# load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
