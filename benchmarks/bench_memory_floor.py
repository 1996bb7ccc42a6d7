"""The memory floor (``engine.sim.memory_floor``) on the co-design sweep's points (issue 43): how
many points it finds sure not to fit, what it costs, and, on points also predicted in full
(``engine.studies.sweep.evaluate(time_all=True)``: composed or simulated), that it never refuses
a point that fits and how many of those that do not fit it finds.

The points are ``codesign_sweep.py``'s (GPT-3 175B and Llama-3 70B, every valid layout with
selective recomputation, ZeRO-1 and sequence parallelism where tp > 1, on 16-128 nodes of DGX
A100 80GB, H100 and B200), a fixed random sample of each model's (``--seed``).

Usage::

    PYTHONPATH=. python benchmarks/bench_memory_floor.py [--points 150] [--check 40] [--seed 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import codesign_sweep as CS  # noqa: E402  (the sweep's models and clusters)
from engine.formats import resolve_cluster  # noqa: E402
from engine.layout import Layout, resolved  # noqa: E402
from engine.layout.build import build_layout  # noqa: E402
from engine.sim.memory_floor import memory_floor  # noqa: E402
from engine.studies.sweep import GRID_KEYS, evaluate, layout_points, model_graph, parse_clusters  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=150, help="points sampled per model")
    ap.add_argument("--check", type=int, default=40, help="of them, per model, predicted in full too")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="/tmp/soapbox-memory-floor")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models = {"gpt3-175b": "gpt3-175b", "llama3-70b": CS.llama3_70b_file(out)}
    clusters = [c for g in CS.GPUS for c in parse_clusters(f"{g}:{CS.SIZES}")]
    print(f"# {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M %Z')}, load {os.getloadavg()[0]:.2f}; {args.points} points a model, "
          f"{args.check} predicted in full too, seed {args.seed}", flush=True)
    print("| model | points | sure not to fit (floor) | floor s a point (median, max) | predicted in full | "
          "do not fit | found by the floor | refused by the floor but fit |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rng = random.Random(args.seed)
    for name, m in models.items():
        pts = layout_points(m, clusters)
        for pt in pts:
            pt.update(recompute="selective", zero=1, sp=pt["tp"] > 1)
        g = model_graph(m, None)
        over = 0
        took: list[float] = []
        checked = infeasible = found = wrong = 0
        for i, pt in enumerate(rng.sample(pts, min(args.points, len(pts)))):
            c = resolve_cluster(pt["cluster"], allow_path=True)
            opts = {GRID_KEYS[k]: v for k, v in pt.items() if k in GRID_KEYS}
            t = time.perf_counter()
            lay = resolved(Layout.from_options(opts), g, c)
            floor = memory_floor(g, build_layout(g, c, lay), c)
            took.append(time.perf_counter() - t)
            over += not floor.fits
            if i < args.check:
                row = evaluate(m, pt, None, time_all=True)
                if row["peak_memory_bytes"] is None:
                    continue
                checked += 1
                infeasible += not row["feasible"]
                found += not floor.fits
                wrong += (not floor.fits) and row["feasible"]
                if row["peak_memory_bytes"] < float(floor.required_bytes.max()) * (1 - 1e-12):
                    print(f"  the floor is over the peak on {pt}", flush=True)
        print(f"| {name} | {len(took)} | {over} | {statistics.median(took):.3f}, {max(took):.3f} | {checked} | "
              f"{infeasible} | {found} | {wrong} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
