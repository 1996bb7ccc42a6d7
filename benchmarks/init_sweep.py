"""Parallel random initialisation at equal compute (issue 28 item 6): the init-sweep (sample N
inits, keep low loss + large gradients, perturb the survivors, successive halving, train the few
best) against N independent runs and one run, each spending the same examples x steps; and the
same sweep without the perturbation step (pure halving) as an ablation.

Writes the rows and the summary as JSON and a Plotly figure (PNG when kaleido is installed, else
HTML) next to it; prints a Markdown table for BENCHMARKS.md.

Usage: python benchmarks/init_sweep.py [--seeds 0-6] [--inits 16] [--budget-steps 2000]
       [--target-loss 0.02] [--workers 2] [-o benchmarks/measured/init_sweep.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import time
from dataclasses import replace

from engine.cli.init_sweep import parse_seeds
from engine.init_sweep import InitSweepConfig, config_dict, premise, run_experiment, summarise

#: colour per arm (the ablation's sweep is the "sweep" colour, lighter)
COLOURS = {"sweep": "#1f77b4", "sweep (no narrowing)": "#9ecae1", "independent": "#ff7f0e", "single": "#2ca02c"}


def build_figure(rows: list[dict], target: float):
    """Two panels, one point per seed: compute to the target (k examples) and final loss, per arm."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"compute to loss {target:g} (k examples; lower is better)",
                                                        "final loss at equal compute (nats; lower is better)"))
    for arm, colour in COLOURS.items():
        mine = [r for r in rows if r["label"] == arm]
        if not mine:
            continue
        hit = [r for r in mine if r["compute_to_target_examples"] is not None]
        fig.add_trace(go.Box(y=[r["compute_to_target_examples"] / 1e3 for r in hit], name=arm, marker_color=colour,
                             boxpoints="all", showlegend=False), row=1, col=1)
        fig.add_trace(go.Box(y=[r["final_loss"] for r in mine], name=arm, marker_color=colour, boxpoints="all",
                             showlegend=False), row=1, col=2)
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_layout(title="Parallel random initialisation vs N runs vs one run, equal compute (spiral MLP)",
                      width=1100, height=480, template="plotly_white")
    return fig


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
    ap.add_argument("-o", "--output", default="benchmarks/measured/init_sweep.json")
    args = ap.parse_args()
    seeds = parse_seeds(args.seeds)
    print(f"# {platform.node()}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}; {args.workers} workers; "
          f"seeds {args.seeds}; {args.inits} inits; {args.budget_steps:,} steps per arm")
    table, doc, figs = [], {"format": "soapbox.init-sweep-bench/1", "seeds": seeds, "problems": []}, []
    for name, hidden, target in PROBLEMS:
        cfg = InitSweepConfig(inits=args.inits, budget_steps=args.budget_steps, target_loss=target, hidden=hidden)
        t0 = time.perf_counter()
        rows = run_experiment(cfg, seeds, workers=args.workers)
        for r in rows:
            r["label"] = r["arm"]
        plain = run_experiment(replace(cfg, narrow=False), seeds, workers=args.workers, arms=("sweep",))
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
        figs.append((name, rows + plain, target))

    print(f"\ncompute per arm: {args.budget_steps:,} steps x 300 examples = {args.budget_steps * 0.3:,.0f} k examples; "
          f"median [min, max] over {len(seeds)} seeds (compute and steps over the seeds that reached the target)\n")
    print("| problem | arm | reached target | compute to target, k examples | sequential steps to target | "
          "final loss, nats |")
    print("|---|---|---|---|---|---|")
    print("\n".join(table))

    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as fh:
        json.dump(doc, fh, indent=1)
    stem = os.path.splitext(args.output)[0]
    written = [args.output]
    for k, (name, rows, target) in enumerate(figs):
        fig = build_figure(rows, target)
        fig.update_layout(title=f"Parallel random initialisation vs N runs vs one run, equal compute: {name}")
        if importlib.util.find_spec("kaleido") is not None:
            written.append(f"{stem}_{k}.png")
            fig.write_image(written[-1])
        else:
            written.append(f"{stem}_{k}.html")
            fig.write_html(written[-1], include_plotlyjs="cdn")
    print(f"\nwrote {', '.join(written)}" + ("" if written[-1].endswith(".png") else
                                              " (kaleido is not installed: HTML, no PNG)"))


if __name__ == "__main__":
    main()
