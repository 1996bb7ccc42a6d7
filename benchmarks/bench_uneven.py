"""Pipelines whose layers do not split evenly, composed against simulated (issue 43).

The co-design sweep's points (``codesign_sweep.py``: GPT-3 175B and Llama-3 70B, every valid
layout on 16 to 128 nodes of DGX A100 / H100 / B200, selective recomputation, ZeRO-1, sequence
parallelism where tp > 1) include pipelines whose layers do not split evenly over their stages
(96 layers on 64 stages, 80 on 32 or 64). ``engine.sim.hier`` composes them now from a reference
that keeps a middle stage of each run of equal layer counts; the sweep simulated them in full
before (``build_layout`` + ``simulate_strategy(steady=True)``, a long pipeline's steady state
extrapolated).

For a seeded sample of those points, in one process, the two alternate point by point (which
goes first alternates too): the CPU seconds of each, their ratio, and whether they agree
(iteration time and every GPU's peak memory to 1e-9 of the larger). A point the composition
refuses is listed with its reason.

    PYTHONPATH=. python benchmarks/bench_uneven.py [--points 12] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from codesign_sweep import GPUS, SIZES, llama3_70b_file  # noqa: E402  (the sweep's models and clusters)

from engine.formats import resolve_cluster  # noqa: E402
from engine.graph.blocks import layer_blocks  # noqa: E402
from engine.layout import Layout, resolved  # noqa: E402
from engine.layout.build import build_layout  # noqa: E402
from engine.sim.hier import HierProblem, predict_layout  # noqa: E402
from engine.sim.report import simulate_strategy  # noqa: E402
from engine.studies.sweep import GRID_KEYS, layout_points, model_graph, parse_clusters  # noqa: E402


def uneven_points(models: dict[str, str]) -> list[tuple[str, dict]]:
    """(model, point) of every sweep point whose layers do not split evenly over its stages."""
    clusters = [c for g in GPUS for c in parse_clusters(f"{g}:{SIZES}")]
    out = []
    for name, model in models.items():
        n = len(layer_blocks(model_graph(model)))
        for pt in layout_points(model, clusters):
            if n % pt["pp"]:
                out.append((model, {**pt, "recompute": "selective", "zero": 1, "sp": pt["tp"] > 1}))
    return out


def _timed(f):
    t = time.process_time()
    try:
        return f(), time.process_time() - t
    except HierProblem as e:
        return e, time.process_time() - t


def measure(model: str, pt: dict, composed_first: bool, batch: int | None = None) -> dict:
    """One point, both ways (see the module); ``batch``: the model's global batch (default its own)."""
    g = model_graph(model, batch)
    c = resolve_cluster(pt["cluster"])
    lay = resolved(Layout.from_options({GRID_KEYS[k]: v for k, v in pt.items() if k in GRID_KEYS}), g, c)

    def full():
        return simulate_strategy(g, build_layout(g, c, lay), c, check=False, steady=True)

    def comp():
        return predict_layout(g, c, lay)

    order = (comp, full) if composed_first else (full, comp)
    got = {f.__name__: _timed(f) for f in order}
    (r_full, t_full), (r_comp, t_comp) = got["full"], got["comp"]
    row = {"point": pt, "full_s": t_full, "composed_s": t_comp}
    if isinstance(r_comp, HierProblem):
        row["refused"] = str(r_comp)
        return row
    row["time_err"] = abs(r_comp.iteration_time_s - r_full.iteration_time_s) / r_full.iteration_time_s
    row["memory_err"] = float(np.abs(r_comp.memory.peak_bytes - r_full.memory.peak_bytes).max()
                              / r_full.memory.peak_bytes.max())
    row["how"] = r_comp.describe()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    models = {"gpt3-175b": "gpt3-175b", "llama3-70b": llama3_70b_file(Path(tempfile.mkdtemp()))}
    pts = uneven_points(models)
    sample = random.Random(a.seed).sample(pts, min(a.points, len(pts)))
    print(f"# {platform.node()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.2f}; {len(sample)} of the sweep's {len(pts):,} uneven points (seed {a.seed})")
    rows = []
    for i, (model, pt) in enumerate(sample):
        model_graph(model)  # (made once per model, as the sweep does, outside the timing)
        r = measure(model, pt, composed_first=i % 2 == 0)
        rows.append(r)
        name = Path(model).stem
        what = (f"refused: {r['refused'][:90]}" if "refused" in r else
                f"{r['full_s']:.2f} s -> {r['composed_s']:.2f} s ({r['composed_s'] / r['full_s']:.2f}x), "
                f"time {r['time_err']:.1e}, memory {r['memory_err']:.1e}; {r['how']}")
        print(f"{name} {pt['cluster']} tp {pt['tp']} pp {pt['pp']} cp {pt['cp']} mb {pt['mb']}: {what}", flush=True)
    done = [r for r in rows if "refused" not in r]
    if done:
        agree = sum(r["time_err"] <= 1e-9 and r["memory_err"] <= 1e-9 for r in done)
        ratios = [r["composed_s"] / r["full_s"] for r in done]
        print(f"composed {len(done)} of {len(rows)}; {agree} agree with the full simulation to 1e-9; median "
              f"{statistics.median(r['full_s'] for r in done):.2f} s simulated, "
              f"{statistics.median(r['composed_s'] for r in done):.2f} s composed; ratio median "
              f"{statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
