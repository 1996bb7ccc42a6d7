"""PaSE's dynamic programming: search time on the instances of PaSE's paper (issue 6).

For each instance: build the cost tables (configs, vertex and edge costs) and run the DP,
median of ``--repeats`` runs in this process; the largest dependent set and table; the
optimum's analytic cost and simulated iteration time. The reference times are those the
issue gives for PaSE's own code on a 2-core machine; the ratio is reference / ours.

Clusters: P100 nodes as in FlexFlow's cluster (4 GPUs a node, NVLink, EDR InfiniBand), 1, 2
or 4 nodes for 4, 8 or 16 devices.

With ``--diff``: the differentiable search on the same cost tables (warm start from data
parallel, 400 steps, then the polish) against the DP optimum of F, on FlexFlow's six models on
p100-4x4 and PaSE's Transformer on 8 GPUs: the gap and both times.

With ``--versus``: PaSE's plan against the data-parallel and expert baselines (issue 28: "on
8 of 15 cases its answer simulates slower than data parallel or expert"), on the instances
above and FlexFlow's six models on ``p100-4x4`` and ``k80-16x4``; an instance PaSE estimates
at more than ``--max-seconds`` is listed as skipped.

Usage: python benchmarks/bench_pase.py [--repeats 3] [--diff] [--versus [--max-seconds 60]]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from engine.cluster import DEVICE_TYPES, IB_EDR_BW, NVLINK1_PAIR_BW, PCIE3_BW, Cluster, NodeSpec
from engine.formats import resolve_model
from engine.search.pase import build_problem, solve
from engine.sim.full import simulate
from engine.taskgraph import build_task_graph

#: (model, devices, PaSE's reference seconds from the issue)
CASES = [("alexnet", 4, 1.0), ("inception_v3", 4, 11.7), ("inception_v3", 16, 29.3), ("transformer", 4, 12.8),
         ("transformer", 8, 43.9)]


def p100_nodes(devices: int) -> Cluster:
    spec = NodeSpec("node", 4, "P100-SXM2-16GB", "mesh", NVLINK1_PAIR_BW, nics=1, nic_bw_bytes_per_s=IB_EDR_BW,
                    attach_bw_bytes_per_s=PCIE3_BW, repeat=devices // 4)
    return Cluster(f"p100-{devices // 4}x4", [spec], DEVICE_TYPES)


def differentiable_gap() -> None:
    from engine.cluster import preset
    from engine.search.baselines import data_parallel
    from engine.search.differentiable import optimise

    print(f"{'model':13} {'cluster':10} {'DP F ms':>9} {'DP s':>6} {'diff F ms':>9} {'gap':>8} {'diff s':>7}")
    for model, cl in [(m, "p100-4x4") for m in ("alexnet", "inception_v3", "resnet101", "rnntc", "rnnlm", "nmt")] + \
            [("transformer", "p100-2x4")]:
        g = resolve_model(model)
        c = preset(cl) if cl != "p100-2x4" else p100_nodes(8)
        problem = build_problem(g, c)
        r = solve(problem)
        dp = data_parallel(g, c)
        start = [cs.index(dp[op.name]) if dp[op.name] in cs else 0 for op, cs in zip(g.ops, problem.configs)]
        d = optimise(problem, seed=0, start=start)
        print(f"{model:13} {cl:10} {r.cost_s * 1e3:9.3f} {r.seconds:6.2f} {d.cost_s * 1e3:9.3f} "
              f"{d.cost_s / r.cost_s - 1:+8.2%} {d.seconds:7.2f}", flush=True)


def versus(max_seconds: float) -> None:
    import math

    from engine.cluster import preset
    from engine.search.pase import estimate_seconds, pase

    cases = [(m, p100_nodes(n)) for m, n, _ in CASES]
    cases += [(m, preset(c)) for c in ("p100-4x4", "k80-16x4")
              for m in ("alexnet", "inception_v3", "resnet101", "rnntc", "rnnlm", "nmt")]
    print(f"{'model':13} {'cluster':10} {'plan ms':>9} {'DP ms':>9} {'expert ms':>9} {'plan/min':>8} {'wall s':>7}")
    slower, ran = 0, 0
    seen = set()
    for model, c in cases:
        if (model, c.name) in seen:
            continue
        seen.add((model, c.name))
        g = resolve_model(model)
        est = estimate_seconds(g, c)
        if est > max_seconds:
            print(f"{model:13} {c.name:10} skipped: PaSE estimates {est:.0f} s", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            r = pase(g, c)
        except ValueError as e:
            print(f"{model:13} {c.name:10} refused: {str(e)[:80]}", flush=True)
            continue
        wall = time.perf_counter() - t0
        plan_s = r.best.found_by.get("plan_time_s", r.best_time_s)
        dp, ex = r.baselines.get("data-parallel", math.inf), r.baselines.get("expert", math.inf)
        ratio = plan_s / min(dp, ex)
        ran += 1
        slower += ratio > 1
        print(f"{model:13} {c.name:10} {plan_s * 1e3:9.3f} {dp * 1e3:9.3f} {ex * 1e3:9.3f} {ratio:7.3f}x "
              f"{wall:7.1f}", flush=True)
    print(f"PaSE's plan slower than data parallel or expert on {slower} of {ran} cases")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--diff", action="store_true", help="the differentiable search's gap instead")
    ap.add_argument("--versus", action="store_true", help="PaSE's plan against data parallel and expert instead")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="with --versus: skip longer instances")
    args = ap.parse_args()
    print(f"# {platform.node()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    if args.diff:
        differentiable_gap()
        return
    if args.versus:
        versus(args.max_seconds)
        return
    print(f"{'model':13} {'GPUs':>4} {'tables s':>8} {'DP s':>6} {'total s':>7} {'PaSE ref s':>10} {'ratio':>6} "
          f"{'|D| max':>7} {'table max':>10} {'F ms':>7} {'simulated ms':>12}")
    for model, n, ref in CASES:
        g, c = resolve_model(model), p100_nodes(n)
        build_t, dp_t, totals = [], [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            problem = build_problem(g, c)
            b = time.perf_counter() - t
            r = solve(problem)
            build_t.append(b)
            dp_t.append(r.seconds)
            totals.append(time.perf_counter() - t)
        best = {op.name: problem.configs[v][r.choice[v]] for v, op in enumerate(g.ops)}
        from engine.search.baselines import data_parallel
        from dataclasses import replace

        s = replace(data_parallel(g, c), configs=best)
        sim = simulate(build_task_graph(g, s, c)).makespan_s
        tot = statistics.median(totals)
        print(f"{model:13} {n:4d} {statistics.median(build_t):8.2f} {statistics.median(dp_t):6.2f} {tot:7.2f} "
              f"{ref:10.1f} {ref / tot:6.1f} {r.largest_dependent_set:7d} {r.largest_table_entries:10,} "
              f"{r.cost_s * 1e3:7.2f} {sim * 1e3:12.2f}", flush=True)


if __name__ == "__main__":
    main()
