"""A model's first page: the state the explorer makes when a model and cluster are picked
(``app.state.new_state``: the data-parallel strategy built, checked and written for the page).

Cases: the default page (Inception-v3 on FlexFlow's 16 P100s, the baseline in the same
process), LLaMA-2 7B on 64 A100s and GPT-3 175B on 1,024 A100s; each round runs every case
once, in turn. Reports each case's median, min and max over the rounds and its ratio to the
default page's median, and the memory its data-parallel strategy holds (tracemalloc, once).

Usage: python benchmarks/bench_first_page.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import time
import tracemalloc

from app import state as ST
from engine.cluster import preset
from engine.models import build_sample
from engine.search.baselines import make_baseline

CASES = {"default page (Inception-v3, p100-4x4)": ("inception_v3", "p100-4x4"),
         "LLaMA-2 7B, 64 A100s": ("llama2-7b", "dgx-a100-80gb:8"),
         "GPT-3 175B, 1,024 A100s": ("gpt3-175b", "dgx-a100-80gb:128")}


def _strategy_mib(model: str, cluster: str) -> float:
    """MiB the data-parallel strategy of ``model`` on ``cluster`` holds (its model and cluster
    made before the count starts)."""
    g, c = build_sample(model), preset(cluster)
    make_baseline("data-parallel", g, c)  # (caches filled)
    gc.collect()
    tracemalloc.start()
    s = make_baseline("data-parallel", g, c)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del s
    return held / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"{platform.node()}, python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    for model, cluster in CASES.values():  # (warm: samples built, presets read, kernels loaded)
        ST.new_state(model, cluster)
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(args.rounds):
        for name, (model, cluster) in CASES.items():
            t = time.perf_counter()
            ST.new_state(model, cluster)
            times[name].append(time.perf_counter() - t)
    base = statistics.median(times[next(iter(CASES))])
    for name, (model, cluster) in CASES.items():
        m = statistics.median(times[name])
        print(f"{name}: median {m * 1e3:.0f} ms (min {min(times[name]) * 1e3:.0f}, max {max(times[name]) * 1e3:.0f}); "
              f"{m / base:.2f}x the default page; data-parallel strategy {_strategy_mib(model, cluster):.1f} MiB",
              flush=True)


if __name__ == "__main__":
    main()
