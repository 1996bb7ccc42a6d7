"""A co-design sweep (issue 43): two models' layouts x four cluster sizes x three GPU types, run
with ``engine.studies.sweep.run_sweep`` on the local process pool, timed, saved and drawn.

The points are every valid layout (``engine.layout.valid_layouts``, ``soapbox sweep --grid
auto``) of GPT-3 175B (sample ``gpt3-175b``) and Llama-3 70B (80 layers, hidden 8,192, 64
heads, 8 key/value heads, MLP 28,672, SwiGLU, 8,192 tokens, vocabulary 128,256, batch 512
sequences, fused attention, bf16: the shape of Meta's model card, built with ``soapbox model
gpt``) on 16, 32, 64 and 128 nodes of DGX A100 80GB, DGX H100 and DGX B200, each with selective
recomputation, the distributed optimizer (ZeRO-1) and sequence parallelism where tp > 1, as
Megatron-LM trains these models (Korthikanti et al. 2022); ``--points N`` takes a fixed random
sample of them (seed 0), split between the models in proportion.

Usage::

    python benchmarks/codesign_sweep.py [--points 10000] [--workers 2] [--out DIR] [--time-all]
    python benchmarks/codesign_sweep.py --report-only --out DIR   # redraw from DIR/rows-*.json

Writes ``DIR/rows-<model>.json`` (``soapbox.sweep/1``) and ``DIR/codesign-<model>.html`` (the
Pareto figures: ``engine.studies.sweep_files.write_report``), and prints the time, the rate, and the
days / GPU-hours front for ``--tokens``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

from engine.studies.sweep import layout_points, parse_clusters, run_sweep
from engine.studies.sweep_files import write_rows

SIZES = "16,32,64,128"
GPUS = ("dgx-a100-80gb", "dgx-h100", "dgx-b200")
LLAMA3_70B = dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, swiglu=True, norm="rmsnorm",
                  positions="rotary", bias=False, tie_embeddings=False, dropout=0.0, flash_attention=True,
                  seq_len=8192, vocab=128256, batch=512, precision="bf16", name="llama3-70b")


def llama3_70b_file(out: Path) -> str:
    """Llama-3 70B's model file (written once under ``out``)."""
    from engine.formats import save_json
    from engine.models.transformer import GPTConfig, gpt
    path = out / "llama3-70b.json"
    if not path.exists():
        save_json(gpt(GPTConfig(**LLAMA3_70B), source="Meta Llama 3 70B model card shape").to_dict(), path)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default="benchmarks/measured/codesign")
    ap.add_argument("--tokens", type=float, default=1e12, help="tokens to train, for the report (default 1e12)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--time-all", action="store_true",
                    help="simulate the points whose memory floor is over capacity too (soapbox sweep --time-all)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models = {"gpt3-175b": "gpt3-175b", "llama3-70b": llama3_70b_file(out)}
    if not args.report_only:
        clusters = [c for g in GPUS for c in parse_clusters(f"{g}:{SIZES}")]
        pts = {k: layout_points(m, clusters) for k, m in models.items()}
        for v in pts.values():  # as Megatron-LM trains these models (Korthikanti et al. 2022's defaults)
            for pt in v:
                pt.update(recompute="selective", zero=1, sp=pt["tp"] > 1)
        total = sum(len(v) for v in pts.values())
        rng = random.Random(0)
        for k in pts:
            want = round(args.points * len(pts[k]) / total) if args.points < total else len(pts[k])
            pts[k] = [pts[k][i] for i in sorted(rng.sample(range(len(pts[k])), want))]
        n = sum(len(v) for v in pts.values())
        print(f"# {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"{time.strftime('%Y-%m-%d %H:%M %Z')}, load {os.getloadavg()[0]:.2f}; {n:,} of {total:,} points, "
              f"{args.workers} workers (process pool)", flush=True)
        t0 = time.perf_counter()
        for k, m in models.items():
            t = time.perf_counter()
            rows = run_sweep(m, pts[k], backend="pool", workers=args.workers, time_all=args.time_all)
            dt = time.perf_counter() - t
            write_rows(rows, str(out / f"rows-{k}.json"))
            floored = sum(1 for r in rows if r.get("memory_floor_bytes") is not None)
            print(f"{k}: {len(rows):,} predictions in {dt:.1f} s ({len(rows) / dt:.2f}/s, "
                  f"{len(rows) / dt / args.workers:.2f}/s per core); {sum(r['feasible'] for r in rows):,} fit; "
                  f"{floored:,} sure not to fit by their memory floor (not simulated)", flush=True)
        dt = time.perf_counter() - t0
        print(f"all: {n:,} predictions in {dt:.1f} s ({n / dt:.2f}/s, {n / dt / args.workers:.2f}/s per core); "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
    from engine.studies.sweep import training_front
    from engine.studies.sweep_files import write_report
    for k in models:
        rows = json.loads((out / f"rows-{k}.json").read_text())["rows"]
        write_report(rows, str(out / f"codesign-{k}.html"), f"{k}: {len(rows):,} layouts x clusters", tokens=args.tokens)
        composed = sum(1 for r in rows if r.get("predicted_by") == "composed")
        front = training_front(rows, args.tokens)
        print(f"report: {out / f'codesign-{k}.html'}; {composed:,} of {len(rows):,} composed; "
              f"days / GPU-hours front for {args.tokens:.3g} tokens ({len(front)} runs):")
        for r in front[:12]:
            print(f"  {r['cluster']:>20} tp {r['tp']} pp {r['pp']} cp {r['cp']} dp {r['dp']} mb {r['mb']} "
                  f"{r['recompute']}: {r['days']:.1f} days, {r['gpu_hours']:,.0f} GPU-hours, "
                  f"{r['throughput_per_s'] / r['gpus']:,.0f} tokens/s per GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
