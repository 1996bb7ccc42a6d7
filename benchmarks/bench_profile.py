"""Measured against roofline per op kind on this machine's CPU (issue 14), and the profile's
effect on a small model's predicted iteration time.

The CPU is described as a device type: its fp32 peak from its clock, cores and vector width
(AVX-512 FMA: 2 units x 16 lanes x 2 FLOPs a cycle, stated as an assumption; ``--flops-per-cycle``
changes it) and its memory bandwidth measured here (a 256 MiB copy, read + write, best of 5):
a CPU has no spec sheet to quote. Each distinct op partition of the model under data
parallelism on one such device is measured once (``engine.studies.profiling``), then the model is
simulated with the roofline alone and with the profile.

Usage: python benchmarks/bench_profile.py [--model alexnet] [--batch 16] [--repeats 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections import defaultdict

import torch

from engine.cluster import Cluster, DeviceType, NodeSpec
from engine.costs import CostModel, ProfileTable
from engine.formats import resolve_model
from engine.studies.profiling import coverage, local_device_name, measure, needed_keys
from engine.sim.report import simulate_strategy
from engine.search.baselines import data_parallel


def clock_hz() -> float:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":")[1]) * 1e6
    except OSError:
        pass
    return 2.5e9


def copy_bandwidth() -> float:
    a = torch.empty(64 * 1024 * 1024, dtype=torch.float32)  # 256 MiB
    b = torch.empty_like(a)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        b.copy_(a)
        best = max(best, 2 * a.numel() * 4 / (time.perf_counter() - t))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="alexnet")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--flops-per-cycle", type=float, default=64.0)
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    name = local_device_name("cpu")
    peak = clock_hz() * (os.cpu_count() or 1) * args.flops_per_cycle
    bw = copy_bandwidth()
    dt = DeviceType(name, {"fp32": peak}, bw, 16 * 2**30, "this VM: clock x cores x FLOPs a cycle; copy bandwidth")
    cluster = Cluster("this-cpu", [NodeSpec("cpu", 1, name, "switch", 10e9)], {name: dt}, "one CPU as a device")
    g = resolve_model(args.model, batch=args.batch)
    s = data_parallel(g, cluster)
    print(f"# {platform.node()}, {os.cpu_count()} cores, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"# device type {name!r}: fp32 peak {peak / 1e9:.1f} GFLOP/s (assumed {args.flops_per_cycle:g} FLOPs a "
          f"cycle a core), copy bandwidth {bw / 1e9:.1f} GB/s (measured)")
    table = ProfileTable()
    t0 = time.perf_counter()
    keys = needed_keys(g, [s], cluster)
    for key in keys:
        m = measure(key, "cpu", repeats=args.repeats)
        table.add(*key, m.fwd_s, m.bwd_s)
    print(f"# {len(keys)} distinct op partitions measured in {time.perf_counter() - t0:.1f} s")
    roof = CostModel()
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for op in g.ops:
        if op.kind == "input":
            continue
        cfg = s.configs[op.name]
        ins, outs, params = op.partition_shapes(cfg.degrees)
        hit = table.get(ProfileTable.key(op.kind, ins, outs, params, g.precision, name))
        if hit is None:
            continue
        f, b = roof.partition_times_s(op, cfg.degrees, g.precision, dt)
        row = by_kind[op.kind]
        row[0] += f + b
        row[1] += hit[0] + hit[1]
        row[2] += 1
    print("| op kind | ops | roofline fwd+bwd ms | measured fwd+bwd ms | measured / roofline |")
    print("|---|---:|---:|---:|---:|")
    for kind, (r, m, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"| {kind} | {n} | {r * 1e3:.2f} | {m * 1e3:.2f} | {m / r:.2f} |")
    a = simulate_strategy(g, s, cluster, roof, check=False)
    prof = CostModel(profile=table)
    b = simulate_strategy(g, s, cluster, prof, check=False)
    cov = coverage(g, s, cluster, prof)
    print(f"# {args.model}, batch {args.batch}, one CPU: predicted iteration roofline {a.iteration_time_s * 1e3:.1f} ms, "
          f"with the profile {b.iteration_time_s * 1e3:.1f} ms ({cov['measured_share_of_compute']:.0%} of compute "
          f"time measured, {cov['measured_partitions']} of {cov['partitions']} partitions)")


if __name__ == "__main__":
    main()
