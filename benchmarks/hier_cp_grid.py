"""The composed prediction against the full simulation on context-parallel layouts of GPT-3 175B
(issue 43, twenty-first round): where a unit's collectives share a NIC link with the pipeline
transfers, the composed run's queue orders are checked (``engine.sim.composed.order_problem``),
and a layout whose whole pipeline reverses one is refused.

The grid is the one a helper session surveyed: GPT-3 175B (sample ``gpt3-175b``, batch 1,536)
on ``dgx-a100-80gb:64`` and ``:128``, tp 4 or 8, cp 2 or 4, pp 4, 8, 16 or 32, micro-batch 1, 2,
3, 4, 6, 8 or 12, dp the GPUs left, at least pp microbatches; ZeRO-1, selective recomputation,
sequence parallelism (Megatron-LM's way with these models): 217 layouts (the survey, bounded in
time, predicted 136 of them in a shuffled order; ``/tmp`` scripts then). Each is composed
(``engine.sim.hier.predict_layout``) and simulated whole (``simulate_strategy(steady=True)``)
and the two times compared; a refusal is counted with its reason. ``--limit`` takes a fixed
random sample (``--seed``). Run in another tree (``cd OTHER && PYTHONPATH=. python
/path/to/this/script``) it measures that tree.

    PYTHONPATH=. python benchmarks/hier_cp_grid.py [--limit 40] [--seed 1] [--json F]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import platform
import random
import time


def layouts() -> list[tuple[str, dict]]:
    """(cluster, layout options) of the grid, in a fixed order."""
    out = []
    for cl, tp, cp, pp, mb in itertools.product(["dgx-a100-80gb:64", "dgx-a100-80gb:128"], [4, 8], [2, 4],
                                                [4, 8, 16, 32], [1, 2, 3, 4, 6, 8, 12]):
        n = int(cl.split(":")[1]) * 8
        if n % (tp * cp * pp):
            continue
        dp = n // (tp * cp * pp)
        if 1536 % (dp * mb) or 1536 // (dp * mb) < pp:
            continue
        out.append((cl, dict(tp=tp, pp=pp, cp=cp, dp=dp, micro_batch=mb, zero_stage=1, recompute="selective",
                             sequence_parallel=True)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=0, help="a random sample of this many layouts (0: all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write every layout's row here")
    args = ap.parse_args()
    from engine.cluster import preset
    from engine.layout import Layout, resolved
    from engine.layout.build import build_layout
    from engine.models import build_sample
    from engine.sim.hier import HierProblem, predict_layout
    from engine.sim.report import simulate_strategy

    g = build_sample("gpt3-175b", batch=1536)
    todo = layouts()
    if args.limit:
        todo = random.Random(args.seed).sample(todo, min(args.limit, len(todo)))
    print(f"# {platform.node()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M %Z')}; "
          f"{len(todo)} layouts", flush=True)
    rows, counts, worst = [], collections.Counter(), 0.0
    for cl, opts in todo:
        c = preset(cl)
        lay = Layout.from_options(opts)
        try:
            s = build_layout(g, c, resolved(lay, g, c))
        except ValueError:
            counts["not buildable"] += 1
            continue
        t = time.perf_counter()
        try:
            got, why = predict_layout(g, c, lay).iteration_time_s, ""
        except HierProblem as e:
            got, why = None, str(e).split(" (")[0][:80]
        t_hier = time.perf_counter() - t
        t = time.perf_counter()
        full = simulate_strategy(g, s, c, check=False, steady=True).iteration_time_s
        t_full = time.perf_counter() - t
        rel = None if got is None else got / full - 1
        if rel is None:
            counts[f"refused: {why}"] += 1
        else:
            counts["composed, exact (1e-9)" if abs(rel) <= 1e-9 else "composed, NOT exact"] += 1
            worst = max(worst, abs(rel))
        rows.append(dict(cluster=cl, **{k: opts[k] for k in ("tp", "pp", "cp", "dp", "micro_batch")}, composed=got,
                         full=full, rel=rel, why=why, composed_s=round(t_hier, 3), full_s=round(t_full, 3)))
    for k, v in sorted(counts.items()):
        print(f"{v:4d}  {k}")
    print(f"largest difference where composed: {worst:.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
