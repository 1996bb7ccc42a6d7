"""A class move priced by the delta simulator against priced whole (issue 43, seventeenth round).

The polish (``engine.search.polish``) gives a class of alike ops (an unrolled RNN's time steps)
one config together. Until this round each such candidate was priced whole (a new build and
simulation, ``engine.search.api.whole_cost``) and a class move taken built a new delta
simulator; now the candidate is one edit of the delta simulator
(``DeltaSimulator.trial_configs``: the segments that read any member rebuilt once, the run
resumed from the unchanged prefix and stopped at the bound). This script prices the same
candidates both ways, interleaved in one process, and checks that both give the same time.

For each case: from the start strategy, every class's aligned candidate
(``engine.search.class_moves.aligned_candidate``) and each class given each of the first
``--configs`` candidate configs of its first member; each candidate priced whole and by the
delta simulator (with the bound at infinity: the whole run, and at the start's time: what the
polish asks), ``--rounds`` times, medians reported (the pricing memo emptied before each whole
pricing: a candidate priced the round before would be answered from it).

    PYTHONPATH=. python benchmarks/bench_class_pricing.py [--rounds 3] [--configs 3]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time

from engine.cluster import preset
from engine.formats import resolve_model
from engine.search import api
from engine.search.api import whole_cost
from engine.search.baselines import data_parallel, expert
from engine.search.chains import candidate_configs
from engine.search.class_moves import aligned_candidate
from engine.search.visits import alike_classes
from engine.sim.delta import DeltaSimulator

CASES = [("rnnlm", "k80-16x4", "data-parallel"), ("nmt", "p100-4x4", "expert"), ("rnntc", "dgx-a100-40gb:8", "expert"),
         ("rnnlm", "dgx-a100-40gb:8", "data-parallel"), ("nmt", "k80-16x4", "data-parallel"),
         ("resnet101", "dgx-a100-40gb:8", "data-parallel")]


def candidates(g, c, s, per_class: int) -> list:
    classes = {tuple(m) for m in alike_classes(g).values() if len(m) > 1}
    out = []
    for members in sorted(classes):
        out += aligned_candidate(g, members, s)
        m = max(1, s.pipeline.microbatches)
        tries = [x for x in candidate_configs(g[members[0]], c.num_devices, m) if x != s[members[0]]][:per_class]
        out += [s.with_configs(members, x) for x in tries]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", type=int, default=3, help="configs tried per class besides the aligned one")
    args = ap.parse_args()
    print(f"# {platform.node()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.2f}; {args.rounds} rounds, interleaved")
    print("| case | candidates | whole s (median a candidate) | delta, whole run s | delta, bound at the start s "
          "| whole / delta with bound | times equal |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for model, cl, start in CASES:
        g, c = resolve_model(model), preset(cl)
        s = (data_parallel if start == "data-parallel" else expert)(g, c)
        sim = DeltaSimulator(g, s, c)
        t0 = sim.timeline.makespan_s
        cands = candidates(g, c, s, args.configs)
        whole, full, bounded = [], [], []
        equal = True
        for _ in range(args.rounds):
            for cand in cands:
                configs = sim.configs_to(cand)
                api._PRICED.clear()  # (priced anew each round: the memo would answer from the round before)
                t = time.perf_counter()
                w = whole_cost(g, cand, c, None, False)
                whole.append(time.perf_counter() - t)
                t = time.perf_counter()
                d = sim.trial_configs(configs, math.inf)
                full.append(time.perf_counter() - t)
                sim.revert()
                t = time.perf_counter()
                b = sim.trial_configs(configs, t0)
                bounded.append(time.perf_counter() - t)
                sim.revert()
                equal = equal and w is not None and abs(w - d) <= 1e-9 * w and (b == math.inf or b == d)
        mw, mf, mb = (statistics.median(x) for x in (whole, full, bounded))
        print(f"| {model} / {cl} from {start} | {len(cands)} | {mw:.3f} | {mf:.3f} | {mb:.3f} | {mw / mb:.1f}x | "
              f"{'yes' if equal else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
