"""Published orderings that a planner must get right (issue 25), predicted side by side.

* **Async vs vanilla tensor parallelism** (torchtitan's tables, rows of
  validation/published_runs_public.csv that differ only in "async TP"): the async row is
  faster in every published pair.
* **Interleaved vs plain 1F1B** (the same model, cluster and batch): interleaving shrinks the
  pipeline bubble (Narayanan et al. SC'21 §2.2.2; torchtitan's schedule sweep).
* **ZeRO-3 vs PTD-P at scale** (Narayanan et al. SC'21 §5.2: DeepSpeed ZeRO-3 without model
  parallelism against Megatron's PTD-P on GPT-3 175B, 384 to 1,536 A100s, global batch 1,536):
  PTD-P is faster, increasingly with scale. The published figures are not in this project's
  rows and are not used: only the direction is stated here, and the predicted times printed.

Usage: python benchmarks/orderings.py [--sizes 384,768,1536] [--skip-zero3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(Path(__file__).resolve().parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

from published import Predictor, load_rows  # noqa: E402
from published_rows import software_of  # noqa: E402

from engine.cluster import preset  # noqa: E402
from engine.models.transformer import GPTConfig, gpt  # noqa: E402
from engine.sim.report import simulate_strategy  # noqa: E402
from engine.layout.build import fsdp
from engine.layout import Layout, build_layout


def async_pairs(rows):
    """(vanilla row, async row) pairs: same model, GPUs, precision, layout; async TP differs."""
    key = lambda r: (r["source"], r["model"], r["gpus"], r["precision"], r["tp"], r["pp"], r["dp"],  # noqa: E731
                     r["global_batch"], r["micro_batch"])
    by = {}
    for r in rows:
        by.setdefault(key(r), []).append(r)
    for group in by.values():
        van = [r for r in group if not software_of(r)["async_tp"]]
        asy = [r for r in group if software_of(r)["async_tp"]]
        for a in asy:
            for v in van:
                if ("compile" in (v["notes"] or "").lower()) == ("compile" in (a["notes"] or "").lower()):
                    yield v, a


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="384,768,1536")
    ap.add_argument("--skip-zero3", action="store_true")
    args = ap.parse_args()
    rows = load_rows()
    pred = Predictor(rows)
    print("Async vs vanilla TP (published tokens/s/GPU; predicted):")
    agree = total = 0
    for v, a in async_pairs(rows):
        rv, ra = pred.run(v), pred.run(a)
        if rv.predicted is None or ra.predicted is None:
            print(f"  rows {v['row_id']}/{a['row_id']}: not predicted ({rv.skipped or ra.skipped})")
            continue
        ok = (ra.predicted > rv.predicted) == (ra.published > rv.published)
        agree += ok
        total += 1
        print(f"  {v['model'][:22]:<22} {v['gpus']:>4} GPUs  rows {v['row_id']}/{a['row_id']}: published "
              f"{rv.published:,.0f} -> {ra.published:,.0f} ({ra.published / rv.published:.3f}x); predicted "
              f"{rv.predicted:,.0f} -> {ra.predicted:,.0f} ({ra.predicted / rv.predicted:.3f}x) "
              f"{'same order' if ok else 'ORDER DIFFERS'}")
    print(f"  ordering reproduced in {agree} of {total} pairs")
    print("Interleaved vs 1F1B (GPT-3 175B, 1,024 A100-80GB, tp 8 pp 16, batch 1,536, micro-batch 1, full "
          "recompute):")
    g = gpt(GPTConfig(96, 12288, 96, 2048, 51200, 1536, precision="fp16", name="gpt3-175b"))
    c = preset("dgx-a100-80gb:128")
    t1 = simulate_strategy(g, build_layout(g, c, Layout(tp=8, pp=16, micro_batch=1, recompute="full")),
                           c).iteration_time_s
    t2 = simulate_strategy(g, build_layout(g, c, Layout(tp=8, pp=16, micro_batch=1, vpp=2, recompute="full")),
                           c).iteration_time_s
    print(f"  1F1B {t1:.2f} s, interleaved (vpp 2) {t2:.2f} s: "
          f"{'interleaved faster (the published order)' if t2 < t1 else 'ORDER DIFFERS'}")
    if args.skip_zero3:
        return 0
    print("ZeRO-3 (DeepSpeed: per-module gathers, 5e7-parameter prefetch) vs PTD-P, GPT-3 175B, batch 1,536, full "
          "recompute:")
    for n in (int(x) for x in args.sizes.split(",")):
        c = preset(f"dgx-a100-80gb:{n // 8}")
        t0 = time.perf_counter()
        ptdp = simulate_strategy(g, build_layout(g, c, Layout(tp=8, pp=8, micro_batch=1, recompute="full")), c)
        z3 = simulate_strategy(g, fsdp(g, c, Layout(zero_stage=3, gather_unit="op", recompute="full", micro_batch=1)),
                               c)
        print(f"  {n:>5} GPUs: PTD-P (tp 8, pp 8) {ptdp.iteration_time_s:.2f} s, ZeRO-3 {z3.iteration_time_s:.2f} s "
              f"-> {'PTD-P faster (the published order)' if ptdp.iteration_time_s < z3.iteration_time_s else 'ORDER DIFFERS'}"
              f" ({z3.iteration_time_s / ptdp.iteration_time_s:.2f}x; {time.perf_counter() - t0:.0f} s wall)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
