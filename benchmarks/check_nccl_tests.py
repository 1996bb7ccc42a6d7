"""soapbox's collective model against published nccl-tests bus bandwidths (issue 42).

``validation/collectives/nccl_tests.csv`` holds bus bandwidths that NCCL's developers stated or
users measured with ``all_reduce_perf`` / ``all_gather_perf`` (each row cites its thread). This
script prices each row's collective on the row's cluster preset with the default cost model
(:meth:`engine.cluster.Cluster.collective_group` and
:func:`engine.costs.group_collective_time_s`, each link at its kind's data-rate share), turns
the time into nccl-tests' bus bandwidth (algorithm bandwidth ``size / time`` times
``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather and reduce-scatter; nccl-tests'
doc/PERFORMANCE.md) and prints predicted against published.

    python benchmarks/check_nccl_tests.py [--sizes] [--json]

``--sizes``: the whole sweeps of ``validation/collectives/nccl_tests_sizes.csv`` instead.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CSV = ROOT / "validation" / "collectives" / "nccl_tests.csv"
#: whole nccl-tests sweeps (8 MB to 1 GB), each row a size of one published run: how the model
#: fares at the sizes tensor-parallel collectives have (a 22B layer's: 100 MB)
SIZES_CSV = ROOT / "validation" / "collectives" / "nccl_tests_sizes.csv"

#: nccl-tests' bus-bandwidth factor per collective (doc/PERFORMANCE.md)
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def rows(csv_path: Path = CSV) -> list[dict]:
    """The published rows, with ``predicted_GBps`` and ``error_pct`` (predicted / published - 1)."""
    from engine.cluster import preset
    from engine.costs import CostModel, group_collective_time_s
    cost = CostModel()
    out = []
    with csv_path.open(newline="") as f:
        for r in csv.DictReader(f):
            n, size = int(r["gpus"]), float(r["size_bytes"])
            group = preset(r["cluster"]).collective_group(range(n))
            t = group_collective_time_s(r["collective"], size, group, cost.links)
            bus = size / t * BUS_FACTOR[r["collective"]](n) / 1e9
            out.append(dict(r, predicted_GBps=round(bus, 1),
                            error_pct=round((bus / float(r["busbw_GBps"]) - 1) * 100, 1)))
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sizes = "--sizes" in argv
    res = rows(SIZES_CSV if sizes else CSV)
    if "--json" in argv:
        print(json.dumps(res, indent=1))
        return
    if sizes:
        print("| row | sweep | collective | GPUs | size | published busbw GB/s | soapbox GB/s | error |")
        print("|---|---|---|---:|---:|---:|---:|---:|")
        for r in res:
            print(f"| {r['row_id']} | {r['sweep']} | {r['collective']} | {r['gpus']} | "
                  f"{float(r['size_bytes']) / 2**20:g} MiB | {r['busbw_GBps']} | {r['predicted_GBps']} | "
                  f"{r['error_pct']:+.1f}% |")
        return
    print("| row | cluster | collective | GPUs | size | published busbw GB/s | soapbox GB/s | error |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in res:
        size = float(r["size_bytes"]) / 2**30
        print(f"| {r['row_id']} | {r['cluster']} | {r['collective']} | {r['gpus']} | {size:g} GiB "
              f"| {r['busbw_GBps']} | {r['predicted_GBps']} | {r['error_pct']:+.1f}% |")


if __name__ == "__main__":
    main()
