"""The composed prediction's time against the fewest stages its reference keeps
(``engine.sim.hier.REFERENCE_STAGES``), the two rules alternating call by call in one process
(issue 43).

The runs are ``bench_calculon.py``'s ten (GPT-3 175B on 1,024 A100s with and without sequence
parallelism, and Korthikanti et al.'s eight), predicted by ``engine.sim.hier.predict_layout``.
For each run, one untimed call per rule, then ``--rounds`` rounds of one call per rule in
turn; each call's process CPU time is taken and the medians are printed, with the reference
each rule used and whether both give the same iteration time and peak memory (they must: the
composition is exact either way, or refused). Alternating in one process puts both rules under
the same load, which two processes on this shared machine do not (an A/B of two trees in two
processes, run beside the test suite, moved unchanged runs by 0.64x-1.38x).

    PYTHONPATH=. python benchmarks/bench_reference_stages.py [--rules 4,3] [--rounds 9] [--only 0,1,8]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_calculon as bc  # noqa: E402
from engine.cluster import preset  # noqa: E402
from engine.layout import Layout  # noqa: E402
from engine.sim import hier as H  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rules", default="4,3", help="REFERENCE_STAGES values to alternate")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--only", help="run indices (bench_calculon's order), comma-separated")
    a = ap.parse_args(argv)
    rules = [int(x) for x in a.rules.split(",")]
    runs = list(enumerate(bc._runs()))
    if a.only:
        keep = {int(x) for x in a.only.split(",")}
        runs = [(i, r) for i, r in runs if i in keep]
    print(f"# {platform.node()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.2f}; rules {rules}, {a.rounds} rounds, CPU ms a prediction (median)")
    print("| run | " + " | ".join(f"{r} stages: ms (reference)" for r in rules) + " | ratio | same answer |")
    print("|---|" + "---:|" * len(rules) + "---:|---|")
    keep_rule = H.REFERENCE_STAGES
    failed = False
    try:
        for _, run in runs:
            graph, cluster = bc.soapbox_model(run), preset(run.cluster)
            lay = Layout.from_options(run.layout)
            times: dict[int, list[float]] = {r: [] for r in rules}
            got: dict[int, tuple] = {}
            for rnd in range(a.rounds + 1):
                for r in rules:
                    H.REFERENCE_STAGES = r
                    t = time.process_time()
                    h = H.predict_layout(graph, cluster, lay)
                    dt = time.process_time() - t
                    if rnd:
                        times[r].append(dt)
                    got[r] = (h.iteration_time_s, float(h.memory.peak_bytes.max()),
                              f"{h.reference_stages} x {h.reference_microbatches}, {h.reference_tasks:,} tasks")
            med = {r: statistics.median(times[r]) * 1e3 for r in rules}
            same = all(abs(got[r][0] - got[rules[0]][0]) <= 1e-9 * got[rules[0]][0] and got[r][1] == got[rules[0]][1]
                       for r in rules)
            failed |= not same
            print(f"| {run.name} | " + " | ".join(f"{med[r]:.0f} ({got[r][2]})" for r in rules)
                  + f" | {med[rules[-1]] / med[rules[0]]:.2f}x | {'yes' if same else 'NO'} |", flush=True)
    finally:
        H.REFERENCE_STAGES = keep_rule
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
