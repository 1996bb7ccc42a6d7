"""Whole-process time of simulating DeepSeek-V3 on 1,024 H100s in Megatron-Bridge's published
layout (issue 26: at most 10 s warm), beside GPT-3 175B on the same 1,024 GPUs in a Megatron
layout as the baseline, interleaved in one run.

Each measurement is a fresh ``python`` process that imports soapbox, builds the sample model,
the cluster and the layout, simulates (task graph, event loop, memory) and prints the
iteration time: what ``soapbox simulate`` does, without argument parsing. The first run of
each warms the disk cache and is not counted.

    python benchmarks/bench_moe.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    # Megatron-Bridge docs/performance-summary-archive.md, 25.09, DGX-H100 (validation row 3123)
    "deepseek-v3": ("deepseek-v3", "dgx-h100:128",
                    "tp=2, pp=8, vpp=4, ep=64, micro_batch=1, sequence_parallel=True, zero_stage=1, fp8=True, "
                    "fp8_params=True, grad_reduce_in_fp32=False, overlap_param_gather=True, overlap_grad_reduce=False, "
                    "recompute='selective', recompute_modules=('mla_up_proj', 'mlp'), moe_comm_overlap=True"),
    # GPT-3 175B in a Megatron layout of Narayanan et al. SC'21's family (tp 8 x pp 16 x dp 8)
    "gpt3-175b": ("gpt3-175b", "dgx-h100:128", "tp=8, pp=16, micro_batch=1"),
}

SCRIPT = """
import time
t0 = time.perf_counter()
from engine.models import build_sample
from engine.cluster import preset
from engine.layout import Layout
from engine.search.baselines import build_layout
from engine.sim.report import simulate_strategy
g = build_sample({model!r})
c = preset({cluster!r})
s = build_layout(g, c, Layout({layout}))
r = simulate_strategy(g, s, c)
print(r.iteration_time_s, r.tasks.num_tasks, time.perf_counter() - t0)
"""


def once(name: str) -> tuple[float, float, int]:
    model, cluster, layout = CASES[name]
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(model=model, cluster=cluster, layout=layout)],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return time.perf_counter() - t, float(out[0]), int(out[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    walls: dict[str, list[float]] = {k: [] for k in CASES}
    info = {}
    for name in CASES:  # warm-up
        once(name)
    for _ in range(args.runs):
        for name in CASES:  # interleaved
            wall, it, tasks = once(name)
            walls[name].append(wall)
            info[name] = (it, tasks)
    base = statistics.median(walls["gpt3-175b"])
    for name, w in walls.items():
        it, tasks = info[name]
        print(f"{name:12s} wall median {statistics.median(w):6.2f} s (runs {', '.join(f'{x:.2f}' for x in w)}), "
              f"x{statistics.median(w) / base:.2f} the baseline; {tasks:,} tasks; iteration {it:.2f} s")


if __name__ == "__main__":
    main()
