"""Parallel random initialisation at equal compute (issue 28 item 6): the init-sweep (sample N
inits, keep low loss + large gradients, perturb the survivors, successive halving, train the few
best) against N independent runs and one run, each spending the same examples x steps; and the
same sweep without the perturbation step (pure halving) as an ablation.

Writes the rows (each with its loss curve: the lowest loss reached against compute, at
``--curve-points`` points) and the summary as JSON, and next to it the Learn tab's figure of
them (:func:`app.learn_figures.build_init_sweep_figure`) as HTML and, with kaleido (an optional
extra; kaleido 1.x drives a Chrome or Chromium it finds, or the one BROWSER_PATH names), as SVG
for BENCHMARKS.md; prints a Markdown table for BENCHMARKS.md.

Usage: python benchmarks/init_sweep.py [--seeds 0-6] [--inits 16] [--budget-steps 2000]
       [--workers 2] [--backend pool|ray] [--curve-points 100] [-o app/data/init_sweep.json]
       python benchmarks/init_sweep.py --figure-only   (redraw the figure from the JSON)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import os
import platform
import time
from dataclasses import replace

from engine.cli.init_sweep import parse_seeds
from engine.experiments.init_sweep import InitSweepConfig, config_dict, premise, run_experiment, summarise

#: (name, hidden widths, target loss): the default wide MLP, and a narrow deep one whose
#: initialisations differ more (single runs from 12 inits took 80 to 360 steps to reach 0.15)
PROBLEMS = [("wide MLP 2-32-32-3", (32, 32), 0.02), ("narrow deep MLP 2-8-8-8-8-3", (8, 8, 8, 8), 0.15)]


def _md_row(name: str, s: dict) -> str:
    c, d, f = s["compute_to_target_examples"], s["steps_to_target"], s["final_loss"]
    cs = f"{c['median'] / 1e3:,.1f} [{c['min'] / 1e3:,.1f}, {c['max'] / 1e3:,.1f}]" if c else "-"
    ds = f"{d['median']:,.0f} [{d['min']:,}, {d['max']:,}]" if d else "-"
    return f"| {name} | {s['arm']} | {s['reached']}/{s['seeds']} | {cs} | {ds} | " \
           f"{f['median']:.4f} [{f['min']:.4f}, {f['max']:.4f}] |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0-6")
    ap.add_argument("--inits", type=int, default=16)
    ap.add_argument("--budget-steps", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--backend", choices=["pool", "ray"], default="pool")
    ap.add_argument("--curve-points", type=int, default=100, help="points of each row's loss curve")
    ap.add_argument("-o", "--output", default="app/data/init_sweep.json",
                    help="the measurement (the Learn page draws it: package data); the figures go to "
                         "benchmarks/measured/init_sweep.html and .svg")
    ap.add_argument("--figure-only", action="store_true", help="redraw the figure from the JSON; run nothing")
    args = ap.parse_args()
    if args.figure_only:
        with open(args.output) as fh:
            write_figure(json.load(fh), args.output)
        return
    seeds = parse_seeds(args.seeds)
    print(f"# {platform.node()}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}; {args.workers} workers; "
          f"seeds {args.seeds}; {args.inits} inits; {args.budget_steps:,} steps per arm")
    table, doc = [], {"format": "soapbox.init-sweep-bench/1", "seeds": seeds, "problems": []}
    for name, hidden, target in PROBLEMS:
        cfg = InitSweepConfig(inits=args.inits, budget_steps=args.budget_steps, target_loss=target, hidden=hidden)
        t0 = time.perf_counter()
        run = dict(workers=args.workers, backend=args.backend, curve_points=args.curve_points)
        rows = run_experiment(cfg, seeds, **run)
        for r in rows:
            r["label"] = r["arm"]
        plain = run_experiment(replace(cfg, narrow=False), seeds, arms=("sweep",), **run)
        for r in plain:
            r["label"] = "sweep (no narrowing)"
        summary = summarise(rows)
        ablation = summarise(plain)[0]
        ablation["arm"] = "sweep (no narrowing)"
        summary.append(ablation)
        check = premise(cfg, seeds[0], args.workers)
        wall_s = time.perf_counter() - t0
        print(f"{name}: {wall_s:.0f} s; target {target:g}; does the init score predict training (seed {seeds[0]}, "
              f"{cfg.inits} runs of {cfg.budget_steps:,} steps)? Spearman rho, init loss vs steps to target "
              f"{check['rho_loss']:+.2f}, minus grad norm vs steps {check['rho_minus_grad']:+.2f}; steps to target "
              f"{sorted(check['steps_to_target'])}", flush=True)
        table += [_md_row(name, s) for s in summary]
        doc["problems"].append({"name": name, "config": config_dict(cfg), "wall_s": wall_s, "summary": summary,
                                "premise": check, "rows": rows + plain})

    print(f"\ncompute per arm: {args.budget_steps:,} steps x 300 examples = {args.budget_steps * 0.3:,.0f} k examples; "
          f"median [min, max] over {len(seeds)} seeds (compute and steps over the seeds that reached the target)\n")
    print("| problem | arm | reached target | compute to target, k examples | sequential steps to target | "
          "final loss, nats |")
    print("|---|---|---|---|---|---|")
    print("\n".join(table))

    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as fh:
        json.dump(doc, fh, indent=1)
    write_figure(doc, args.output)


def write_figure(doc: dict, output: str) -> None:
    """The Learn tab's figure of ``doc`` in ``benchmarks/measured/`` named after ``output``: ``.html``
    always, ``.svg`` with kaleido."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # (the app, from the tree)
    from app.learn_figures import build_init_sweep_figure

    fig = build_init_sweep_figure(doc)
    fig.update_layout(width=1100, height=460)
    stem = os.path.join(os.path.dirname(os.path.abspath(__file__)), "measured",
                        os.path.splitext(os.path.basename(output))[0])
    written = [f"{stem}.html"]
    fig.write_html(written[0], include_plotlyjs="cdn")
    if importlib.util.find_spec("kaleido") is not None:
        written.append(f"{stem}.svg")
        fig.write_image(written[-1])
    print(f"\nwrote {output}, {', '.join(written)}" + ("" if written[-1].endswith(".svg") else
                                                       " (kaleido is not installed: no SVG; pip install kaleido)"))


if __name__ == "__main__":
    main()
