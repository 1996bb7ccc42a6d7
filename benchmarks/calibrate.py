"""Fit the cost model's calibrated constants on named public rows, and print them.

Every fitted constant of ``engine/costs.py`` comes from this script, on the in-sample rows
listed by ``benchmarks/published.py`` (``in_sample``) of ``shared/validation/published_runs_public.csv``; every other
row is held out (``benchmarks/validate_published.py`` reports the two sets apart). The
constants are physically meaningful and per device type where the hardware differs:

* A100 (40 and 80 GB, one silicon): ``MATMUL_EFFICIENCY`` (the large-GEMM fraction of
  tensor-core peak) and ``MATMUL_HALF_DIM`` (the GEMM inner dimension at which half of it is
  reached), on Megatron-LM SC'21 Table 1 (tensor, pipeline and data parallelism, 32 to 3,072
  GPUs) and the MosaicML A100 FSDP runs on one and two nodes (8 and 16 GPUs: compute-bound,
  so communication physics is not fitted into a compute constant).
* H100 SXM5: its large-GEMM fraction (``DEVICE_MATMUL_EFFICIENCY``), on the MosaicML H100 FSDP
  runs on one and two nodes, with the A100's half-dimension.

Objective: the median |error| of the rows' published metric (ties: the mean), over a grid
(a coarse pass, then a fine one around the best). No per-row factor exists anywhere.

Usage: python benchmarks/calibrate.py [--quick]   (--quick: the coarse grid only)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(Path(__file__).resolve().parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

from published import Predictor, Skip, in_sample, load_rows, megatron_flops, setup_for  # noqa: E402

from engine.cluster import preset  # noqa: E402
from engine.costs import CostModel  # noqa: E402
from engine.models.transformer import gpt  # noqa: E402
from engine.report import simulate_strategy  # noqa: E402


class Rows:
    """The in-sample rows' graphs, clusters and strategies, built once; their errors under a
    cost model."""

    def __init__(self, rows, ids: list[int]):
        self.pred = Predictor(rows)
        self.items = []
        by_id = {int(r["row_id"]): r for r in rows}
        for rid in ids:
            row = by_id[rid]
            try:
                setup = setup_for(row)
                g = gpt(setup.cfg)
                c = preset(setup.cluster_name)
                self.items.append((row, setup, g, c, setup.build(g, c)))
            except (Skip, ValueError) as e:
                print(f"  row {rid} left out: {e}")

    def errors(self, cost: CostModel) -> list[float]:
        out = []
        for row, setup, g, c, s in self.items:
            t = simulate_strategy(g, s, c, cost, check=False).iteration_time_s
            cfg = setup.cfg
            F = megatron_flops(cfg.batch, cfg.seq_len, cfg.layers, cfg.hidden, cfg.vocab, setup.recompute_full)
            got, _ = self.pred.metric(row, row["metric_name"], float(row["metric_value"]), setup, t, F)
            out.append(100.0 * (got - float(row["metric_value"])) / float(row["metric_value"]))
        return out


def score(errs: list[float]) -> tuple[float, float]:
    a = [abs(e) for e in errs]
    return statistics.median(a), statistics.fmean(a)


def grid(values_a, values_b, evaluate) -> tuple[tuple, tuple[float, float]]:
    best = None
    for a in values_a:
        for b in values_b:
            s = score(evaluate(a, b))
            if best is None or s < best[1]:
                best = ((a, b), s)
    return best


def frange(lo: float, hi: float, step: float) -> list[float]:
    n = int(round((hi - lo) / step))
    return [round(lo + k * step, 6) for k in range(n + 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the coarse grid only")
    args = ap.parse_args()
    rows = load_rows()
    sets = in_sample(rows)
    t0 = time.perf_counter()
    base = CostModel()

    print(f"A100: MATMUL_EFFICIENCY and MATMUL_HALF_DIM on rows {', '.join(map(str, sets['A100']))}")
    a100 = Rows(rows, sets["A100"])
    (eff, half), s = grid(frange(0.70, 0.90, 0.05), [350, 700, 1050, 1400],
                          lambda e, h: a100.errors(replace(base, matmul_efficiency=e, matmul_half_dim=h)))
    if not args.quick:
        (eff, half), s = grid(frange(eff - 0.02, eff + 0.02, 0.01), [half - 175, half, half + 175],
                              lambda e, h: a100.errors(replace(base, matmul_efficiency=e, matmul_half_dim=h)))
    print(f"  MATMUL_EFFICIENCY = {eff}, MATMUL_HALF_DIM = {half}: in-sample median |err| {s[0]:.1f}%, "
          f"mean {s[1]:.1f}% over {len(a100.items)} rows")
    fitted = replace(base, matmul_efficiency=eff, matmul_half_dim=half)

    print(f"H100-SXM5-80GB: its large-GEMM fraction on rows {', '.join(map(str, sets['H100']))}")
    h100 = Rows(rows, sets["H100"])

    def h_errors(e, _):
        return h100.errors(replace(fitted, device_matmul_efficiency=(("H100-SXM5-80GB", e),)))

    (h_eff, _), hs = grid(frange(0.40, 0.90, 0.05), [None], h_errors)
    if not args.quick:
        (h_eff, _), hs = grid(frange(h_eff - 0.04, h_eff + 0.04, 0.01), [None], h_errors)
    print(f"  DEVICE_MATMUL_EFFICIENCY = ((\"H100-SXM5-80GB\", {h_eff}),): in-sample median |err| {hs[0]:.1f}%, "
          f"mean {hs[1]:.1f}% over {len(h100.items)} rows")
    print(f"calibrated in {time.perf_counter() - t0:.0f} s; the held-out rows: benchmarks/validate_published.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
