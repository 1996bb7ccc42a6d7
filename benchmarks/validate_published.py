"""Predict every row of ``shared/validation/published_runs_public.csv`` with soapbox.

For each published run the script builds the row's model (its shape and global batch), the
cluster preset matching its GPUs, and the row's parallel layout with the matching baseline
(Megatron rows: ``megatron``; MosaicML FSDP rows: ``fsdp``, ZeRO-3 for FULL_SHARD and ZeRO-2
for SHARD_GRAD_OP; H100 rows on ``dgx-h100``), simulates one
iteration and converts the predicted iteration time into the row's published metric with the
formulas of ``shared/validation/README.md``. No per-row factor is applied anywhere: every row
is modelled only from what its columns state; where a needed value is missing the
framework's documented default is used and printed.

Usage::

    python benchmarks/validate_published.py [--rows 1,2,5] [--max-gpus N] [--json out.json]
                                            [--csv PATH]

Prints one line per row (published and predicted metric, signed error, feasibility, tasks,
wall seconds), then the skipped rows with their reasons and a summary: all rows, per source,
and the in-sample rows (those ``benchmarks/calibrate.py`` fits its constants on) apart from
the held-out ones. Reading the rows and predicting them lives in ``benchmarks/published.py``,
shared with ``benchmarks/calibrate.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (str(HERE.parent), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from published import (SOURCES, Predictor, RowResult, Setup, Skip, cell_int, default_csv,  # noqa: E402,F401
                       in_sample, load_rows, megatron_flops, setup_for)

# (the row-reading names are re-exported: tests/test_validate_rows.py and test_accuracy.py read them here)
__all__ = ["main", "format_row", "summarize", "calibration_rows", "HEADER", "Predictor", "RowResult", "Setup", "Skip",
           "setup_for", "megatron_flops"]


# --------------------------------------------------------------------------- output


def _fmt(v: float | None, nd: int = 1) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{nd}f}"


HEADER = (f"{'row':>4} {'model':<22} {'gpus':>5} {'layout':<44} {'metric':<28} {'published':>10} "
          f"{'predicted':>10} {'err%':>7} {'feas':>4} {'tasks':>9} {'wall_s':>7} {'peak/cap GiB':>12}")


def format_row(r: RowResult) -> str:
    if r.skipped:
        return f"{r.row_id:>4} {r.model[:22]:<22} {r.gpus:>5} {r.layout[:44]:<44} SKIPPED: {r.skipped}"
    err = f"{r.error_pct:+.1f}" if r.error_pct is not None else "-"
    line = (f"{r.row_id:>4} {r.model[:22]:<22} {r.gpus:>5} {r.layout[:44]:<44} {r.metric_name[:28]:<28} "
            f"{_fmt(r.published):>10} {_fmt(r.predicted):>10} {err:>7} {'yes' if r.feasible else 'NO':>4} "
            f"{r.num_tasks or 0:>9,} {r.wall_s:>7.1f} {_fmt(r.peak_memory_gb, 0):>5}/{_fmt(r.capacity_gb, 0)}")
    if r.predicted2 is not None:
        e2 = f"{r.error2_pct:+.1f}%" if r.error2_pct is not None else "-"
        line += f"   [{r.metric2_name}: pub {_fmt(r.published2)} pred {_fmt(r.predicted2)} {e2}]"
    return line


def calibration_rows(rows: list[dict[str, str]]) -> dict[str, list[int]]:
    """The in-sample rows of benchmarks/calibrate.py (device family -> row ids)."""
    return in_sample(rows)


def summarize(results: list[RowResult], label: str) -> str:
    done = [r for r in results if r.error_pct is not None]
    skipped = [r for r in results if r.skipped]
    if not done:
        return f"{label}: {len(results)} rows, 0 predicted, {len(skipped)} skipped"
    errs = [abs(r.error_pct) for r in done]
    worst = max(done, key=lambda r: abs(r.error_pct))
    within = sum(e <= 10 for e in errs)
    signed = statistics.median(r.error_pct for r in done)
    infeasible = sum(1 for r in done if not r.feasible)
    return (f"{label}: {len(results)} rows, {len(done)} predicted, {len(skipped)} skipped; "
            f"median |err| {statistics.median(errs):.1f}%, median signed {signed:+.1f}%, "
            f"max |err| {abs(worst.error_pct):.1f}% (row {worst.row_id}), within 10%: {within}/{len(done)}, "
            f"infeasible: {infeasible}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, default=default_csv())
    ap.add_argument("--rows", help="comma-separated row ids to run (default: all)")
    ap.add_argument("--max-gpus", type=int, help="only rows with at most this many GPUs")
    ap.add_argument("--json", type=Path, help="write the results to this JSON file")
    args = ap.parse_args(argv)

    rows = load_rows(args.csv)
    selected = rows
    if args.rows:
        want = {int(x) for x in args.rows.split(",") if x.strip()}
        unknown = want - {int(r["row_id"]) for r in rows}
        if unknown:
            ap.error(f"no such row(s): {', '.join(map(str, sorted(unknown)))}")
        selected = [r for r in selected if int(r["row_id"]) in want]
    if args.max_gpus is not None:
        selected = [r for r in selected if (cell_int(r, "gpus") or 0) <= args.max_gpus]

    pred = Predictor(rows)
    print(f"{len(selected)} of {len(rows)} rows from {args.csv}")
    print(HEADER, flush=True)
    results: list[RowResult] = []
    t_all = time.perf_counter()
    for row in selected:
        r = pred.run(row)
        results.append(r)
        print(format_row(r), flush=True)
        for a in r.assumptions:
            print(f"       note: {a}", flush=True)
    total = time.perf_counter() - t_all

    uncompared: dict[str, list[str]] = {}
    for r in results:
        if r.not_compared:
            uncompared.setdefault(f"{r.metric2_name}: {r.not_compared}", []).append(str(r.row_id))
    for why, ids in uncompared.items():
        print(f"\nSecondary metric not compared ({why}): rows {', '.join(ids)}")
    skipped = [r for r in results if r.skipped]
    if skipped:
        print("\nSkipped rows:")
        for r in skipped:
            print(f"  row {r.row_id} ({r.model}): {r.skipped}")
    print("\nSummary (primary metric of each row; error = (predicted - published) / published):")
    print("  " + summarize(results, "all"))
    for src in SOURCES:
        sub = [r for r in results if r.source == src]
        if sub:
            print("  " + summarize(sub, src))
    fitted = {rid for ids in calibration_rows(rows).values() for rid in ids}
    print("  " + summarize([r for r in results if r.row_id in fitted], "in-sample (benchmarks/calibrate.py fits on them)"))
    print("  " + summarize([r for r in results if r.row_id not in fitted], "held out (public rows no constant was fitted on)"))
    print(f"  total wall time {total:.1f} s")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"csv": str(args.csv), "total_wall_s": total,
                                         "rows": [asdict(r) for r in results]}, indent=1))
        print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
