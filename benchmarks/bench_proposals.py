"""MCMC proposals per second (issue 28's speed goal: >= 200/s on Inception-v3 / 16 GPUs and
>= 30/s on NMT / 64 GPUs, one core, steady; issue 13's was 100/s on Inception-v3).

Each case runs ``mcmc`` with one chain, no polish and a fixed number of proposals in a fresh
process (``python -c`` with ``PYTHONPATH`` set to the tree under test, after a warm-up run
that compiles numba's cache; the working directory is that tree too: ``python -c`` puts it
first on ``sys.path``, ahead of ``PYTHONPATH``), and reports proposals / elapsed seconds
(set-up included), proposals / CPU seconds of the process (less sensitive to other processes
on a shared machine) and the steady rate between the first and the last progress rows
(set-up excluded: on NMT / 64 GPUs building the two starting simulations takes ~2.3 s, the
length of some 40 proposals).
After the search, ``--samples`` single-op changes of the best strategy found are each timed
(CPU time) as a proposal (:meth:`DeltaSimulator.change`) and as a full build and simulation of
the changed strategy, and the median ratios are printed (FlexFlow's point: a proposal costs far
less than a simulation; issue 28's goal: >= 20x).
With ``--baseline TREE`` the same runs of another checkout are interleaved with the current
tree's, round by round, and the ratio of medians is printed.

Global moves (whole-strategy rebuilds, :mod:`engine.search.moves`) are off by default here
(``--global-share 0``): the rate is that of single-op proposals, the delta-simulated ones.

``--phases`` instead times a proposal's phases (CPU time: resume, its first-change search,
restored state and event loop; rebuild, its assembly and splice) on fixed moves, per tree.

Usage: python benchmarks/bench_proposals.py [--rounds 3] [--baseline /path/to/other/checkout]
       [--global-share 0.1] [--samples 15] [--phases] [--only inception_v3|nmt]
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
from engine.sim.delta import DeltaSimulator
from engine.search.chains import random_config
from engine.sim.full import simulate
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

#: ``--phases``: CPU ms of a proposal (one op's change, then its revert) by phase, on the graph
#: after ``argv[3]`` accepted random moves from data parallel (the same moves in every tree)
PHASES = """
import json, random, sys, time
import engine.sim.delta as D
import engine.taskgraph.assembly as AS
import engine.taskgraph.builder as B
from engine.formats import resolve_model
from engine.cluster import preset
from engine.search.baselines import data_parallel
from engine.search.chains import random_config
acc = {}
def timed(owner, name, label):
    f = getattr(owner, name)
    def wrapper(*a, **k):
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            acc[label] = acc.get(label, 0.0) + time.process_time() - t
    setattr(owner, name, wrapper)
timed(D, "resume", "resume")
timed(D, "_first_change", "  first change (t_c)")
timed(D, "_restore", "  loop state restored")
timed(D, "event_loop", "  event loop (the suffix)")
timed(B.TaskGraphBuilder, "rebuild", "rebuild")
timed(B, "assemble", "  assembly")
timed(AS.SegmentStore, "splice", "    splice of the arrays")
g, c = resolve_model(sys.argv[1]), preset(sys.argv[2])
sim = D.DeltaSimulator(g, data_parallel(g, c), c)
rng, names = random.Random(3), [op.name for op in g.ops]
def step(keep):
    while True:
        name = rng.choice(names)
        cfg = random_config(g[name], c.num_devices, rng)
        if not sim.check(name, cfg):
            break
    sim.change(name, cfg)
    sim.commit() if keep else sim.revert()
for _ in range(int(sys.argv[3])):
    step(True)
for _ in range(3):
    step(False)
acc.clear()
n = int(sys.argv[4])
t = time.process_time()
for _ in range(n):
    step(False)
total = time.process_time() - t
per = {k: 1e3 * v / n for k, v in acc.items()}
print(json.dumps({"tasks": sim.tasks.num_tasks, "proposal": 1e3 * total / n, **per}))
"""


def phases(trees: list[tuple[str, Path]], model: str, cluster: str, moves: int, n: int) -> None:
    rows = {}
    for name, tree in trees:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run([sys.executable, "-c", PHASES, model, cluster, str(moves), str(n)], env=env,
                             capture_output=True, text=True, check=True, cwd=tree)
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
    first = next(iter(rows.values()))
    print(f"\n{model} on {cluster} after {moves} accepted moves ({first['tasks']:,} tasks): CPU ms per proposal "
          f"(change + revert, mean of {n})")
    print("| phase | " + " | ".join(rows) + " |\n|---|" + "---:|" * len(rows))
    for key in ["proposal", "rebuild", "  assembly", "    splice of the arrays", "resume", "  first change (t_c)",
                "  loop state restored", "  event loop (the suffix)"]:
        label = key.strip().replace("proposal", "whole proposal")
        print(f"| {'&nbsp;' * (len(key) - len(key.lstrip()))}{label} | " +
              " | ".join(f"{r.get(key, float('nan')):.1f}" for r in rows.values()) + " |")


def run(tree: Path, model: str, cluster: str, n: int, share: float = 0.0, samples: int = 1) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CODE, model, cluster, str(n), str(share), str(samples)], env=env,
                         capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path)
    ap.add_argument("--global-share", type=float, default=0.0,
                    help="MCMCOptions.global_share (default 0: single-op proposals only, the rate the goal names)")
    ap.add_argument("--samples", type=int, default=15,
                    help="proposals timed against a full build and simulation of the same graph (median ratio)")
    ap.add_argument("--only", choices=[m for m, _, _ in CASES],
                    help="run one model's case (default: all; with --phases too)")
    ap.add_argument("--phases", action="store_true",
                    help="instead: CPU ms of a proposal by phase (NMT / 64 GPUs after 12 moves, Inception-v3 / 16)")
    args = ap.parse_args()
    trees = [("current", ROOT)] + ([("baseline", args.baseline)] if args.baseline else [])
    if args.phases:
        print(f"# {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
        if args.only in (None, "nmt"):
            phases(trees, "nmt", "k80-16x4", 12, 20)
        if args.only in (None, "inception_v3"):
            phases(trees, "inception_v3", "p100-4x4", 12, 100)
        return
    print(f"# {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; median of {args.rounds} rounds")
    for model, cluster, n in CASES:
        if args.only not in (None, model):
            continue
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
