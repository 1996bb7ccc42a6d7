"""One prediction at LLM scale, in process: build the task graph, simulate it and make the memory
report (``engine.sim.report.simulate_strategy``), for Megatron layouts of GPT-3 175B on 1,024 A100s
(Narayanan et al. SC'21: tp 8 x pp 16 x dp 8, micro-batch 1, global batch 1,536, full
recomputation) with and without sequence parallelism, and with context parallelism 2 (tp 8 x
cp 2 x pp 8) with and without it (issue 28: the symmetry reduction surviving sequence and
context parallelism; goal: <= 0.5 s a prediction).

Each round runs every case in a fresh process (``python -c`` with ``PYTHONPATH`` set to the tree
under test; one warm-up prediction first in that process, so numba's compilation is not
counted), and reports the seconds of the second prediction (with ``--repeat N``: the median
of the N after the warm-up), the tasks simulated and the predicted iteration time. With
``--baseline TREE`` the same runs of another checkout are interleaved with the current tree's,
case by case, and the ratio of medians is printed.

With ``--steady`` the current tree also runs with ``simulate_strategy(steady=True)``
(:mod:`engine.sim.steady`: the pipeline's steady state simulated for a few microbatches and
extrapolated), interleaved with its full simulation (and the baseline's, given one that has
it); the table shows both predictions.

Usage: python benchmarks/bench_predict.py [--rounds 3] [--baseline /path/to/other/checkout]
       [--only nosp|sp|cp|cp-sp] [--steady] [--repeat 1]
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
#: name -> layout options (engine.layout.Layout.from_options), on dgx-a100-80gb:128
CASES = {
    "nosp": {"tp": 8, "pp": 16, "micro_batch": 1, "recompute": "full"},
    "sp": {"tp": 8, "pp": 16, "micro_batch": 1, "recompute": "full", "sequence_parallel": True},
    "cp": {"tp": 8, "cp": 2, "pp": 8, "micro_batch": 1, "recompute": "full"},
    "cp-sp": {"tp": 8, "cp": 2, "pp": 8, "micro_batch": 1, "recompute": "full", "sequence_parallel": True},
}
CODE = """
import json, sys, time
from engine.models import build_sample
from engine.cluster import preset
from engine.layout import Layout, resolved
from engine.search.baselines import build_layout
from engine.sim.report import simulate_strategy
g, c = build_sample("gpt3-175b"), preset("dgx-a100-80gb:128")
lay = Layout.from_options(json.loads(sys.argv[1]))
s = build_layout(g, c, resolved(lay, g, c))
out, secs = {}, []
for _ in range(1 + int(sys.argv[3])):  # the first compiles numba's loops (or loads them from its cache)
    t = time.perf_counter()
    r = simulate_strategy(g, s, c, check=False, **({"steady": True} if sys.argv[2] == "1" else {}))
    peak = float(r.memory.peak_bytes.max())
    secs.append(time.perf_counter() - t)
    timed = sorted(secs[1:]) or secs
    out = {"seconds": timed[len(timed) // 2], "tasks": int(getattr(r, "num_tasks", r.tasks.num_tasks)),
           "simulated": int(r.tasks.num_tasks), "iteration_s": r.timeline.makespan_s, "peak_gb": peak / 1e9}
print(json.dumps(out))
"""


def run(tree: Path, options: dict, steady: bool = False, repeat: int = 1) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # (in the tree: ``python -c`` puts the working folder ahead of PYTHONPATH)
    out = subprocess.run([sys.executable, "-c", CODE, json.dumps(options), "1" if steady else "0", str(repeat)],
                         env=env, cwd=tree,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path)
    ap.add_argument("--only", choices=sorted(CASES))
    ap.add_argument("--repeat", type=int, default=1,
                    help="predictions timed in each process after the warm-up (a run's figure: their median)")
    ap.add_argument("--steady", action="store_true",
                    help="also the current tree with simulate_strategy(steady=True) (engine.sim.steady), interleaved")
    args = ap.parse_args()
    trees = [("current", ROOT, False)] + ([("current, steady", ROOT, True)] if args.steady else []) + \
        ([("baseline", args.baseline, False)] if args.baseline else []) + \
        ([("baseline, steady", args.baseline, True)] if args.baseline and args.steady else [])
    print(f"# {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; median of {args.rounds} rounds")
    print("| case | tree | seconds (median, min-max) | tasks (simulated) | iteration s | peak GB |")
    print("|---|---|---:|---:|---:|---:|")
    for case, options in CASES.items():
        if args.only and case != args.only:
            continue
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in trees}
        for _ in range(args.rounds):
            for name, tree, steady in trees:
                runs[name].append(run(tree, options, steady, args.repeat))
        med = {}
        for name, rs in runs.items():
            secs = [r["seconds"] for r in rs]
            med[name] = statistics.median(secs)
            last = rs[-1]
            simulated = f" ({last['simulated']:,})" if last.get("simulated", last["tasks"]) != last["tasks"] else ""
            print(f"| {case} | {name} | {med[name]:.2f} ({min(secs):.2f}-{max(secs):.2f}) | "
                  f"{last['tasks']:,}{simulated} | "
                  f"{last['iteration_s']:.6f} | {last['peak_gb']:.3f} |", flush=True)
        for name in med:
            if name != "current":
                print(f"| {case} | {name} / current | {med[name] / med['current']:.3f} | | | |", flush=True)


if __name__ == "__main__":
    main()
