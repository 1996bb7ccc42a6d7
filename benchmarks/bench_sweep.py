"""Sweep throughput (issue 15): layouts per second on one process, the local process pool and
Ray's local mode, on the same points, interleaved round by round; and Ray's overhead per task
(an empty remote call, after start-up).

Usage: python benchmarks/bench_sweep.py [--rounds 3] [--model gpt2] [--batch 64]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from engine.studies.sweep import parse_clusters, parse_grid, points, run_sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    pts = points(parse_grid(["tp=1,2,4,8", "pp=1,2,4", "mb=1,2"]), parse_clusters("dgx-a100-80gb:1,2,4,8"))
    workers = os.cpu_count() or 1
    print(f"# {platform.node()}, {workers} cores, {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}; "
          f"{len(pts)} layouts of {args.model} (batch {args.batch}); median of {args.rounds} rounds")
    run_sweep(args.model, pts[:4], backend="serial", batch=args.batch)  # warm-up: numba's cache, imports
    rates: dict[str, list[float]] = {"serial": [], "pool": [], "ray": []}
    ref = None
    for _ in range(args.rounds):
        for backend in rates:
            t = time.perf_counter()
            rows = run_sweep(args.model, pts, backend=backend, workers=workers, batch=args.batch)
            rates[backend].append(len(pts) / (time.perf_counter() - t))
            ref = ref or rows
            assert rows == ref, backend
    for backend, v in rates.items():
        print(f"{backend}: {statistics.median(v):.1f} layouts/s ({min(v):.1f}-{max(v):.1f}); "
              f"ratio to serial {statistics.median(v) / statistics.median(rates['serial']):.2f}")
    import ray

    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        noop = ray.remote(lambda: None)
        ray.get([noop.remote() for _ in range(20)])
        n = 500
        t = time.perf_counter()
        ray.get([noop.remote() for _ in range(n)])
        print(f"ray: {(time.perf_counter() - t) / n * 1e3:.2f} ms per empty task ({n} tasks)")
        t = time.perf_counter()
        for _ in range(50):
            ray.get(noop.remote())
        print(f"ray: {(time.perf_counter() - t) / 50 * 1e3:.2f} ms per empty task, one at a time")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
