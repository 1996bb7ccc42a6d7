"""Predict every row of ``validation/published_runs_public.csv`` with soapbox, and report the
errors per source family, in-sample apart from held out.

For each published run the script builds the row's model (its shape and global batch), the
cluster preset matching its GPUs and the row's parallel layout with the matching baseline
(``fsdp`` for FSDP / FSDP2 / ZeRO-3 rows, ``megatron`` otherwise; see
``benchmarks/published_setup.py``), simulates one iteration and converts the predicted
iteration time into the row's published metrics with the formulas of
``validation/README.md``. No per-row factor is applied anywhere: every row is modelled only
from what its columns state; where a needed value is missing the framework's documented
default is used and printed; rows that cannot be modelled are skipped with the reason.

Usage::

    python benchmarks/validate_published.py [--rows 1,2,5] [--max-gpus N] [--json out.json]
                                            [--markdown] [--csv PATH]

Prints one line per row (published and predicted metric, signed error, feasibility, tasks,
wall seconds, memory), the skipped rows grouped by reason, then per source family: the
metric's median and max |error| and rows within 10%; the peak-memory error over the rows that
publish one; Spearman's rho of each layout sweep (rows of one family, model, GPU type and
software, >= 3 of them) between published and predicted ranking; and the rows predicted out
of memory although they ran ("called OOM but ran"). In-sample rows (``in_sample`` in
``benchmarks/published.py``) are reported apart from held-out ones. ``--markdown`` prints the
tables for BENCHMARKS.md; ``--json`` writes rows and summaries. A CSV that cannot be read is
a one-line error (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
for p in (str(HERE.parent), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from published_rows import source_of  # noqa: E402
from published import (SOURCES, CsvError, Predictor, RowResult, Setup, Skip, cell_int, default_csv,  # noqa: E402,F401
                       group_key, in_sample, load_rows, megatron_flops, setup_for)

# (the row-reading names are re-exported: tests/benchmarks/test_validate_rows.py and test_accuracy.py read them here)
__all__ = ["main", "format_row", "summarize", "calibration_rows", "spearman", "sweeps", "family_summary", "HEADER",
           "Predictor", "RowResult", "Setup", "Skip", "setup_for", "megatron_flops"]


# --------------------------------------------------------------------------- statistics


def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``; tied values share the average of their ranks."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    xs = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a, b) -> float | None:
    """Spearman's rank correlation: Pearson's r of the average ranks (ties share their mean
    rank; Spearman 1904, the form of ``scipy.stats.spearmanr``). None for fewer than 2 values
    or a constant side.

    >>> spearman([1, 2, 3], [30, 20, 10])
    -1.0
    >>> round(spearman([1, 2, 3, 4], [1, 3, 2, 2]), 6)  # 1 / sqrt(10)
    0.316228
    """
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return None
    da, db = ra - ra.mean(), rb - rb.mean()
    return float((da * db).sum() / np.sqrt((da * da).sum() * (db * db).sum()))


def _rank_values(r: RowResult, row: dict[str, str], by_rate: bool) -> tuple[float, float]:
    """(published, predicted) value a sweep ranks: the metric itself, or for iteration-time
    rows whose tokens per GPU change across the sweep the throughput tokens / (t x GPUs)."""
    if not by_rate:
        return r.published, r.predicted
    tokens = (cell_int(row, "global_batch") or 0) * (cell_int(row, "seq_len") or 0)
    return tokens / (r.published_iteration_time_s * r.gpus), tokens / (r.iteration_time_s * r.gpus)


def sweeps(results: list[RowResult], rows: dict[int, dict[str, str]]) -> list[dict]:
    """Every layout sweep (>= 3 predicted rows sharing ``published.group_key``) with its
    Spearman rho between the published and the predicted ranking."""
    groups: dict[tuple, list[RowResult]] = {}
    for r in results:
        if r.predicted is not None and r.published is not None:
            groups.setdefault(group_key(rows[r.row_id]), []).append(r)
    out = []
    for key, members in groups.items():
        if len(members) < 3:
            continue
        by_rate = key[-1].startswith("iteration_time") and len(
            {(cell_int(rows[m.row_id], "global_batch") or 0) * (cell_int(rows[m.row_id], "seq_len") or 0) / m.gpus
             for m in members}) > 1
        vals = [_rank_values(m, rows[m.row_id], by_rate) for m in members]
        out.append({"family": key[0], "model": key[1], "gpu_type": key[2], "precision": key[3],
                    "metric": "tokens/s/GPU (from t)" if by_rate else key[-1],
                    "rows": [m.row_id for m in members],
                    "rho": spearman([v[0] for v in vals], [v[1] for v in vals])})
    return out


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def family_summary(results: list[RowResult], groups: list[dict], fitted: set[int]) -> dict:
    """Counts and errors of ``results`` (one family, or any set of rows)."""
    done = [r for r in results if r.error_pct is not None]
    errs = [abs(r.error_pct) for r in done]
    worst = max(done, key=lambda r: abs(r.error_pct)) if done else None
    mem = [abs(r.memory_error_pct) for r in results if r.memory_error_pct is not None]
    ids = {r.row_id for r in results}
    rhos = [g["rho"] for g in groups if g["rho"] is not None and set(g["rows"]) <= ids]
    return {"rows": len(results), "predicted": len(done), "skipped": sum(1 for r in results if r.skipped),
            "in_sample": sum(1 for r in results if r.row_id in fitted),
            "median_abs_err_pct": _median(errs), "max_abs_err_pct": max(errs) if errs else None,
            "max_row": worst.row_id if worst else None, "within_10pct": sum(e <= 10 for e in errs),
            "memory_rows": len(mem), "memory_median_abs_err_pct": _median(mem),
            "memory_max_abs_err_pct": max(mem) if mem else None,
            "sweeps": len(rhos), "median_rho": _median(rhos),
            "called_oom_but_ran": [r.row_id for r in done if r.feasible is False]}


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
    if r.memory_error_pct is not None and r.metric2_name not in ("peak_memory_gib", "peak_alloc_gib"):
        line += (f"   [memory ({r.memory_counter}): pub {_fmt(r.published_memory_gib)} "
                 f"pred {_fmt(r.predicted_memory_gib)} GiB {r.memory_error_pct:+.1f}%]")
    return line


def calibration_rows(rows: list[dict[str, str]]) -> dict[str, list[int]]:
    """The in-sample rows (set name -> row ids): ``in_sample`` of benchmarks/published.py."""
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


FAMILY_COLUMNS = (("rows", "rows"), ("predicted", "pred"), ("skipped", "skip"), ("in_sample", "in"),
                  ("median_abs_err_pct", "med |err| %"), ("max_abs_err_pct", "max |err| %"),
                  ("within_10pct", "<=10%"), ("memory_rows", "mem rows"), ("memory_median_abs_err_pct", "mem med %"),
                  ("memory_max_abs_err_pct", "mem max %"), ("sweeps", "sweeps"), ("median_rho", "med rho"),
                  ("called_oom_but_ran", "OOM but ran"))


def _cell(v) -> str:
    if isinstance(v, list):
        return str(len(v))
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 2 else f"{v:.1f}"
    return "-" if v is None else str(v)


def table(headers: list[str], body: list[list[str]], markdown: bool) -> str:
    """A plain fixed-width table, or a Markdown one."""
    if markdown:
        headers, body = [h.replace("|", "\\|") for h in headers], [[c.replace("|", "\\|") for c in r] for r in body]
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join("  " + fmt.format(*r) for r in [headers] + body)


#: the fits benchmarks/calibrate.py --loso wrote: every fitted constant, and the same once
#: without each source family's rows
LOSO_FITS = HERE / "measured" / "loso_shares.json"


def loso_fits(path: Path = LOSO_FITS) -> dict:
    """``{"full": {device: share}, "without": {family: {device: share}}}``, as calibrate.py wrote it."""
    return json.loads(Path(path).read_text())


def leave_one_source_out(selected: list[dict[str, str]], rows: list[dict[str, str]], fits: dict) -> list[RowResult]:
    """Every selected row predicted with the constants fitted without its own source family's
    rows (a family none of the fits saw: the full fit, which is out of its sample already)."""
    from dataclasses import replace as _replace

    from engine.costs import CostModel

    by_family: dict[str, list[dict[str, str]]] = {}
    for row in selected:
        by_family.setdefault(source_of(row), []).append(row)
    out: dict[int, RowResult] = {}
    for fam, members in by_family.items():
        shares = fits["without"].get(fam, fits["full"])
        pred = Predictor(rows, _replace(CostModel(), sustained_fractions=tuple(shares.items())))
        for row in members:
            out[int(row["row_id"])] = pred.run(row)
    return [out[int(r["row_id"])] for r in selected]


def report(results: list[RowResult], rows: list[dict[str, str]], markdown: bool,
           loso: list[RowResult] | None = None) -> tuple[str, dict]:
    """The summary tables (text) and the same figures as a dict for ``--json``; with ``loso``
    (:func:`leave_one_source_out`), a column of each family's median |error| out of sample."""
    fitted = {rid for ids in calibration_rows(rows).values() for rid in ids}
    groups = sweeps(results, {int(r["row_id"]): r for r in rows})
    names = list(SOURCES) + sorted({r.source for r in results} - set(SOURCES))  # (with "<family> MoE")
    sets = {fam: [r for r in results if r.source == fam] for fam in names}
    sets.update({"in-sample": [r for r in results if r.row_id in fitted],
                 "held out": [r for r in results if r.row_id not in fitted], "all": results})
    summaries = {name: family_summary(sub, groups, fitted) for name, sub in sets.items() if sub}
    columns = list(FAMILY_COLUMNS)
    if loso is not None:
        by_id = {r.row_id: r for r in loso}
        for name, sub in sets.items():
            if sub:
                errs = [abs(by_id[r.row_id].error_pct) for r in sub
                        if r.row_id in by_id and by_id[r.row_id].error_pct is not None]
                summaries[name]["loso_median_abs_err_pct"] = _median(errs)
        columns.insert(5, ("loso_median_abs_err_pct", "LOSO med |err| %"))
    body = [[name] + [_cell(s[k]) for k, _ in columns] for name, s in summaries.items()]
    out = ["Per source family (error of each row's primary metric; memory: published peak vs soapbox's"
           + ("; LOSO: each family predicted with the constants fitted without its rows" if loso else "") + "):",
           table(["family"] + [h for _, h in columns], body, markdown)]
    gbody = [[g["family"], g["model"][:24], g["gpu_type"][:28], g["metric"][:30], str(len(g["rows"])),
              _cell(g["rho"])] for g in groups]
    out += ["", "Layout sweeps (Spearman rho, published vs predicted ranking):",
            table(["family", "model", "gpu", "ranked by", "n", "rho"], gbody, markdown)]
    oom = [(r.row_id, r.source) for r in results if r.error_pct is not None and r.feasible is False]
    out += ["", f"Called OOM but ran ({len(oom)}): " + ", ".join(f"{rid} ({src})" for rid, src in oom)]
    return "\n".join(out), {"families": summaries, "sweeps": groups, "called_oom_but_ran": [i for i, _ in oom],
                            "in_sample": calibration_rows(rows)}


def _with_loso(row: dict, loso: list[RowResult] | None) -> dict:
    """A row of ``--json``, with its error out of sample (``loso_error_pct``) when ``--loso``."""
    if loso is not None:
        mine = next((r for r in loso if r.row_id == row["row_id"]), None)
        row["loso_error_pct"] = None if mine is None else mine.error_pct
    return row


def _select(rows: list[dict[str, str]], args, ap) -> list[dict[str, str]]:
    selected = rows
    if args.rows:
        want = {int(x) for x in args.rows.split(",") if x.strip()}
        unknown = want - {int(r["row_id"]) for r in rows}
        if unknown:
            ap.error(f"no such row(s): {', '.join(map(str, sorted(unknown)))}")
        selected = [r for r in selected if int(r["row_id"]) in want]
    if args.max_gpus is not None:
        selected = [r for r in selected if (cell_int(r, "gpus") or 0) <= args.max_gpus]
    return selected


def _print_skips(results: list[RowResult]) -> None:
    uncompared: dict[str, list[str]] = {}
    for r in results:
        if r.not_compared:
            uncompared.setdefault(f"{r.metric2_name}: {r.not_compared}", []).append(str(r.row_id))
    for why, ids in uncompared.items():
        print(f"\nSecondary metric not compared ({why}): rows {', '.join(ids)}")
    by_reason: dict[str, list[str]] = {}
    for r in results:
        if r.skipped:
            by_reason.setdefault(r.skipped, []).append(str(r.row_id))
    if by_reason:
        print("\nSkipped rows, by reason:")
        for why, ids in by_reason.items():
            print(f"  {why}: rows {', '.join(ids)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, default=default_csv(), help="the published-runs CSV (default: %(default)s)")
    ap.add_argument("--rows", help="comma-separated row ids to run (default: all)")
    ap.add_argument("--max-gpus", type=int, help="only rows with at most this many GPUs")
    ap.add_argument("--json", type=Path, help="write the rows and summaries to this JSON file")
    ap.add_argument("--markdown", action="store_true", help="print the summary tables as Markdown (BENCHMARKS.md)")
    ap.add_argument("--loso", nargs="?", const=LOSO_FITS, type=Path, metavar="JSON",
                    help="also predict each family with the constants fitted without it (the fits "
                         "benchmarks/calibrate.py --loso wrote; default %(const)s)")
    args = ap.parse_args(argv)
    try:
        rows = load_rows(args.csv)
    except CsvError as e:
        print(f"validate_published.py: error: {e}", file=sys.stderr)
        return 2
    selected = _select(rows, args, ap)
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
    _print_skips(results)
    loso = None
    if args.loso:
        try:
            loso = leave_one_source_out(selected, rows, loso_fits(args.loso))
        except (OSError, ValueError, KeyError) as e:
            print(f"validate_published.py: error: --loso {args.loso}: {e}", file=sys.stderr)
            return 2
    text, summary = report(results, rows, args.markdown, loso)
    print("\n" + text)
    print(f"\n  total wall time {total:.1f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"csv": str(args.csv), "total_wall_s": total, **summary,
                                         "rows": [_with_loso(asdict(r), loso) for r in results]}, indent=1))
        print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
