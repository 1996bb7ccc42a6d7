"""``auto`` on a mixture-of-experts model against its published layout (issue 26, item 4).

DeepSeek-V3 (engine.models.build_sample("deepseek-v3"): 61 layers, 256 routed experts, batch
8,192 x 4,096 tokens) on dgx-h100:128 (1,024 H100s). The reference is Megatron-Bridge's
published layout, tp 2 x pp 8 (vpp 4) x ep 64, micro-batch 1, sequence parallel, ZeRO-1,
fp8; it is priced with the searches' one memory-checked pricing
(:func:`engine.search.api.price`). Then ``auto`` with a time budget (the budget includes its
set-up): its answer, its simulated iteration time, where it came from, and its wall time to
answer, measured around the call. Every Megatron seed ``auto`` priced is listed.

Usage: python benchmarks/moe_auto.py [--model deepseek-v3] [--cluster dgx-h100:128] [--budget 120]
"""

from __future__ import annotations

import argparse
import math
import platform
import time

from engine.cluster import preset
from engine.layout import Layout
from engine.models import build_sample
from engine.search.api import Budget, price
from engine.search.auto import auto
from engine.layout.build import build_layout

#: Megatron-Bridge's DeepSeek-V3 pretraining layout on 1,024 H100s (as the issue cites it), with
#: what its 25.09 performance recipe sets (benchmarks/published_setup.py MOE_RECIPES: recompute
#: modules mla_up_proj and mlp, the all-to-all overlap, no grad-reduce overlap, fp8 parameters,
#: bf16 gradient reduction, parameter-gather overlap): validation row 3123's layout
PUBLISHED = Layout(tp=2, pp=8, vpp=4, ep=64, micro_batch=1, sequence_parallel=True, zero_stage=1, fp8=True,
                   fp8_params=True, grad_reduce_in_fp32=False, overlap_param_gather=True, overlap_grad_reduce=False,
                   recompute="selective", recompute_modules=("mla_up_proj", "mlp"), moe_comm_overlap=True)


def _s(t: float | None) -> str:
    return "n/a" if t is None or not math.isfinite(t) else f"{t:.3f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--cluster", default="dgx-h100:128")
    ap.add_argument("--budget", type=float, default=120.0, help="auto's time budget, seconds")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"{platform.node()} ({platform.processor() or platform.machine()}), Python {platform.python_version()}")
    g, c = build_sample(args.model), preset(args.cluster)
    print(f"{g.name}: {len(g.ops)} ops, batch {g.batch_size}; {c.name}: {c.num_devices} GPUs")

    t = time.perf_counter()
    p = price(g, build_layout(g, c, PUBLISHED), c)
    print(f"published {PUBLISHED.describe()}, vpp {PUBLISHED.vpp}, ZeRO-1, fp8: {_s(p.time_s)} "
          f"({'fits' if p.feasible else 'does NOT fit in memory'}; priced in {time.perf_counter() - t:.1f} s)")

    t = time.perf_counter()
    r = auto(g, c, Budget(seconds=args.budget), seed=args.seed)
    wall = time.perf_counter() - t
    fb = r.best.found_by
    print(f"auto ({args.budget:g} s budget): {_s(r.best_time_s)} ({'fits' if r.feasible else 'does NOT fit'}), "
          f"from {fb['source']}; wall time {wall:.1f} s")
    print(f"  options: {fb.get('options') or r.best.found_by}")
    for name, v in sorted(fb["contributions"].items(), key=lambda kv: (kv[1] is None, kv[1] or 0)):
        print(f"  {name:<80} {_s(v) if v is not None else 'does not fit'}")
    for n in r.notes:
        print(f"  note: {n}")
    if p.feasible and r.feasible:
        print(f"auto / published = {r.best_time_s / p.time_s:.3f} ({'no slower' if r.best_time_s <= p.time_s else 'SLOWER'})")


if __name__ == "__main__":
    main()
