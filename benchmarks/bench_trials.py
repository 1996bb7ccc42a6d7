"""One op's candidates priced two ways in one process (issue 43): re-simulated to the end
(``DeltaSimulator.change``) and priced against the best they must beat
(``DeltaSimulator.trial``), alternating round by round; the median milliseconds a candidate of
each, their ratio, whether every verdict agrees, and how far into the graph the trials stopped.

Usage: python benchmarks/bench_trials.py [--rounds 5] [--cases nmt@p100-4x4@expert@decoder.t0.logits,...]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

from engine.cluster import preset
from engine.formats import resolve_model
from engine.search.baselines import data_parallel, expert
from engine.search.chains import candidate_configs
from engine.sim.delta import DeltaSimulator, Paused

CASES = ["nmt@p100-4x4@expert@decoder.t0.logits", "alexnet@p100-4x4@expert@fc6", "alexnet@p100-4x4@expert@conv3",
         "inception_v3@p100-4x4@expert@fc", "rnntc@dgx-a100-40gb:8@expert@lstm.l0.t5"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--candidates", type=int, default=40)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    print(f"# {os.uname().nodename}, {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}; "
          f"{args.rounds} rounds of {args.candidates} candidates")
    print("| case | tasks | change ms | trial ms | ratio | verdicts agree | faster than the best | stopped at (share of tasks) |")
    print("|---|---:|---:|---:|---:|---|---:|---|")
    for case in args.cases.split(","):
        model, cluster, start, op = case.split("@")
        g, c = resolve_model(model), preset(cluster)
        sim = DeltaSimulator(g, (expert if start == "expert" else data_parallel)(g, c), c)
        best = sim.timeline.makespan_s
        cands = [x for x in candidate_configs(g[op], c.num_devices, 1)
                 if x != sim.strategy[op] and not sim.check(op, x)][:args.candidates]
        full_ms, trial_ms, agree, stops = [], [], True, []
        for _ in range(args.rounds):
            t = time.perf_counter()
            times = []
            for x in cands:
                times.append(sim.change(op, x).makespan_s)
                sim.revert()
            full_ms.append((time.perf_counter() - t) / len(cands) * 1e3)
            t = time.perf_counter()
            got, stops = [], []
            for x in cands:
                got.append(sim.trial(op, x, best))
                state = sim._timeline
                stops.append(state.done / state.tasks.num_tasks if isinstance(state, Paused) else 1.0)
                sim.revert()
            trial_ms.append((time.perf_counter() - t) / len(cands) * 1e3)
            agree = agree and all((f if f < best else math.inf) == r for f, r in zip(times, got))
        a, b = statistics.median(full_ms), statistics.median(trial_ms)
        faster = sum(f < best for f in times)
        print(f"| {case} | {sim.tasks.num_tasks:,} | {a:.2f} | {b:.2f} | {b / a:.2f} | {agree} | {faster} of "
              f"{len(cands)} | {min(stops):.2f}-{max(stops):.2f} |", flush=True)


if __name__ == "__main__":
    main()
