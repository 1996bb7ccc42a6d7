"""How close :func:`engine.taskgraph.estimate_tasks` comes to the real task count of a full (not
symmetric) build, over Megatron / FSDP layouts of GPT-2, LLaMA-2 7B and GPT-3 175B on DGX A100
nodes, data parallelism and FlexFlow-style per-op splits of AlexNet and Inception-v3 on 16 P100s,
and a mixture-of-experts layout with expert parallelism; the estimate of before issue 28 (the
quadratic pair formula, kept as ``engine.taskgraph.quick_task_bound``, the cap checks'
first test) beside today's, in one run.

Each real count is ``build_task_graph(..., symmetry="off").num_tasks``; a case whose estimate
is above ``--max-tasks`` (default 2 M) is skipped with a note (its build would take minutes and
gigabytes). Batches are cut from the samples' defaults so that the builds stay small.

    python benchmarks/estimate_tasks.py [--max-tasks 2000000] [--only gpt2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path
import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.cluster import preset  # noqa: E402
from engine.graph import OpGraph  # noqa: E402
from engine.models import build_sample  # noqa: E402
from engine.search.baselines import data_parallel, expert
from engine.layout.build import fsdp  # noqa: E402
from engine.search.chains import random_config  # noqa: E402
from engine.strategy import Strategy, check_strategy  # noqa: E402
from engine.taskgraph import build_task_graph, estimate_tasks, quick_task_bound  # noqa: E402
from engine.layout import Layout, build_layout


def flexflow_random(graph: OpGraph, cluster, seed: int) -> Strategy:
    """Per-op random splits and placements (the moves of FlexFlow's MCMC search,
    :func:`engine.search.chains.random_config`)."""
    rng = random.Random(seed)
    base = data_parallel(graph, cluster)
    configs = {op.name: random_config(op, cluster.num_devices, rng) for op in graph.ops}
    return check_strategy(replace(base, configs=configs), graph, cluster, f"random seed {seed}")


def cases():
    """(label, model, batch, seq_len, cluster, strategy maker) of the matrix."""
    a1, a2, a4, a8 = "dgx-a100-80gb:1", "dgx-a100-80gb:2", "dgx-a100-80gb:4", "dgx-a100-80gb:8"
    p100 = "p100-4x4"
    return [
        ("gpt2 dp8", "gpt2", 8, None, a1, lambda g, c: data_parallel(g, c)),
        ("gpt2 tp2 dp4", "gpt2", 8, None, a1, lambda g, c: build_layout(g, c, Layout(tp=2))),
        ("gpt2 tp4 dp2", "gpt2", 8, None, a1, lambda g, c: build_layout(g, c, Layout(tp=4))),
        ("gpt2 tp2 pp2 dp2 m4", "gpt2", 8, None, a1, lambda g, c: build_layout(g, c, Layout(tp=2, pp=2,
                                                                                            micro_batch=1))),
        ("gpt2 tp2 pp2 vpp2 dp2", "gpt2", 8, None, a1,
         lambda g, c: build_layout(g, c, Layout(tp=2, pp=2, vpp=2, micro_batch=1))),
        ("gpt2 tp4 sp dp2", "gpt2", 8, None, a1, lambda g, c: build_layout(g, c, Layout(tp=4, sequence_parallel=True))),
        ("gpt2 tp2 cp2 dp2", "gpt2", 8, None, a1, lambda g, c: build_layout(g, c, Layout(tp=2, cp=2))),
        ("gpt2 dp8 zero1", "gpt2", 8, None, a1, lambda g, c: build_layout(g, c, Layout(zero_stage=1))),
        ("gpt2 fsdp zero3", "gpt2", 8, None, a1, lambda g, c: fsdp(g, c, Layout(zero_stage=3))),
        ("gpt2 dp32", "gpt2", 32, None, a4, lambda g, c: data_parallel(g, c)),
        ("gpt2 tp4 dp8", "gpt2", 32, None, a4, lambda g, c: build_layout(g, c, Layout(tp=4))),
        ("gpt2 tp4 pp2 dp4 sp", "gpt2", 32, None, a4,
         lambda g, c: build_layout(g, c, Layout(tp=4, pp=2, micro_batch=2, sequence_parallel=True))),
        ("gpt2 tp4 sp dp8 zero1", "gpt2", 32, None, a4,
         lambda g, c: build_layout(g, c, Layout(tp=4, sequence_parallel=True, zero_stage=1))),
        ("gpt2 fsdp3 tp4 sp", "gpt2", 32, None, a4, lambda g, c: fsdp(g, c, Layout(zero_stage=3, tp=4,
                                                                                   sequence_parallel=True))),
        ("gpt2 zero3 per-op gathers", "gpt2", 32, None, a4, lambda g, c: fsdp(g, c, Layout(zero_stage=3,
                                                                                           gather_unit="op"))),
        ("gpt2 tp2 pp2 dp8 zero2", "gpt2", 32, None, a4,
         lambda g, c: build_layout(g, c, Layout(tp=2, pp=2, micro_batch=2, zero_stage=2))),
        ("gpt2 tp2 dp16 zero1", "gpt2", 32, None, a4, lambda g, c: build_layout(g, c, Layout(tp=2, zero_stage=1))),
        ("gpt2 fsdp3 tp2 hsdp4", "gpt2", 32, None, a4, lambda g, c: fsdp(g, c, Layout(zero_stage=3, tp=2,
                                                                                      shard_group=4))),
        ("gpt2 tp2 dp64", "gpt2", 128, None, "dgx-a100-80gb:16", lambda g, c: build_layout(g, c, Layout(tp=2))),
        ("gpt2 tp2 dp512 (1,024 GPUs)", "gpt2", 512, None, "dgx-a100-80gb:128", lambda g, c: build_layout(g, c,
                                                                                                          Layout(tp=2))),
        ("llama2-7b tp8 pp2", "llama2-7b", 16, 1024, a2, lambda g, c: build_layout(g, c, Layout(tp=8, pp=2,
                                                                                                micro_batch=1))),
        ("llama2-7b tp4 sp dp4", "llama2-7b", 16, 1024, a2,
         lambda g, c: build_layout(g, c, Layout(tp=4, sequence_parallel=True))),
        ("llama2-7b tp2 cp2 dp4", "llama2-7b", 16, 1024, a2, lambda g, c: build_layout(g, c, Layout(tp=2, cp=2))),
        ("llama2-7b fsdp3 tp2", "llama2-7b", 16, 1024, a2, lambda g, c: fsdp(g, c, Layout(zero_stage=3, tp=2))),
        ("llama2-7b tp8 pp2 dp4 z1", "llama2-7b", 32, 1024, a8,
         lambda g, c: build_layout(g, c, Layout(tp=8, pp=2, micro_batch=2, zero_stage=1))),
        ("gpt3-175b tp8 pp8", "gpt3-175b", 8, 2048, a8, lambda g, c: build_layout(g, c, Layout(tp=8, pp=8,
                                                                                               micro_batch=1))),
        ("gpt3-175b tp8 pp4 vpp2 dp2", "gpt3-175b", 8, 2048, a8,
         lambda g, c: build_layout(g, c, Layout(tp=8, pp=4, vpp=2, micro_batch=1, sequence_parallel=True))),
        ("gpt3-175b tp8 pp16 dp8 (1,024 GPUs)", "gpt3-175b", 1536, 2048, "dgx-a100-80gb:128",
         lambda g, c: build_layout(g, c, Layout(tp=8, pp=16, micro_batch=1))),
        ("mixtral tp2 sp ep4", "mixtral-8x7b", 16, 1024, a2,
         lambda g, c: build_layout(g, c, Layout(tp=2, ep=4, micro_batch=1, sequence_parallel=True))),
        ("mixtral tp2 pp2 ep4 sp", "mixtral-8x7b", 16, 1024, a2,
         lambda g, c: build_layout(g, c, Layout(tp=2, pp=2, ep=4, micro_batch=1, sequence_parallel=True))),
        ("alexnet dp16", "alexnet", None, None, p100, lambda g, c: data_parallel(g, c)),
        ("alexnet expert", "alexnet", None, None, p100, lambda g, c: expert(g, c)),
        ("alexnet random 1", "alexnet", None, None, p100, lambda g, c: flexflow_random(g, c, 1)),
        ("alexnet random 2", "alexnet", None, None, p100, lambda g, c: flexflow_random(g, c, 2)),
        ("inception_v3 dp16", "inception_v3", None, None, p100, lambda g, c: data_parallel(g, c)),
        ("inception_v3 expert", "inception_v3", None, None, p100, lambda g, c: expert(g, c)),
        ("inception_v3 random 1", "inception_v3", None, None, p100, lambda g, c: flexflow_random(g, c, 1)),
        ("inception_v3 random 2", "inception_v3", None, None, p100, lambda g, c: flexflow_random(g, c, 2)),
    ]


def summary(ratios: list[float]) -> str:
    return f"min {min(ratios):.2f}  median {statistics.median(ratios):.2f}  max {max(ratios):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tasks", type=int, default=2_000_000, help="skip builds estimated above this")
    ap.add_argument("--only", default="", help="run the cases whose label contains this")
    args = ap.parse_args()
    before, after = [], []
    print(f"{'case':28s} {'real':>10s} {'before':>12s} {'ratio':>8s} {'after':>10s} {'ratio':>6s} "
          f"{'est ms':>7s} {'build s':>7s}")
    graphs: dict[tuple, OpGraph] = {}
    for label, model, batch, seq, cname, make in cases():
        if args.only not in label:
            continue
        key = (model, batch, seq)
        if key not in graphs:
            graphs[key] = build_sample(model, batch, **({"seq_len": seq} if seq else {}))
        g, c = graphs[key], preset(cname)
        try:
            s = make(g, c)
        except ValueError as e:
            print(f"{label:28s} skipped: {e}")
            continue
        old = quick_task_bound(g, s)
        t = time.perf_counter()
        new = estimate_tasks(g, s, c)
        est_ms = (time.perf_counter() - t) * 1e3
        if new > args.max_tasks:
            print(f"{label:28s} skipped: about {new:,} tasks (estimated in {est_ms:.1f} ms), more than "
                  f"--max-tasks {args.max_tasks:,}")
            continue
        t = time.perf_counter()
        real = build_task_graph(g, s, c, symmetry="off").num_tasks
        build_s = time.perf_counter() - t
        before.append(old / real)
        after.append(new / real)
        print(f"{label:28s} {real:>10,} {old:>12,} {old / real:>7.2f}x {new:>10,} {new / real:>5.2f}x "
              f"{est_ms:>7.1f} {build_s:>7.2f}", flush=True)
    if after:
        print(f"\nbefore/real over {len(before)} cases: {summary(before)}")
        print(f"after/real  over {len(after)} cases: {summary(after)}")


if __name__ == "__main__":
    main()
