"""``soapbox sweep``: every layout of a grid on each cluster (and network), predicted
(:mod:`engine.studies.sweep`), written as rows and a report (:mod:`engine.studies.sweep_files`)."""

from __future__ import annotations

import argparse
import sys
import time

__all__ = ["cmd_sweep"]


def cmd_sweep(args: argparse.Namespace) -> int:
    from ..studies.sweep import ModelRef, model_graph, pareto, run_sweep, sweep_points
    from ..studies.sweep_files import check_output, write_report, write_rows

    if args.address and args.backend != "ray":
        raise ValueError(f"--address is a Ray cluster's: give --backend ray with it (not {args.backend})")
    check_output(args.output, (".csv", ".json", ".parquet"), "-o")  # (before the sweep: a typo loses no work)
    if args.report:
        check_output(args.report, (".html", ".htm"), "--report")
    model, batch = args.model, args.batch
    if args.seq_len is not None or args.model_precision is not None:  # (made as simulate makes it, per worker)
        model = ModelRef(args.model, args.seq_len, args.model_precision)
        model_graph(model, batch)  # (a length or precision the model cannot take: said before the sweep)
    pts = sweep_points(model, args.grid, args.clusters, args.network or (), batch=batch)
    tty = sys.stderr.isatty()
    t0 = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if tty:
            print(f"\r  {done:,}/{total:,} layouts", end="", file=sys.stderr, flush=True)

    rows = run_sweep(model, pts, backend=args.backend, workers=args.workers, batch_points=args.batch_points,
                     address=args.address, batch=batch, progress=progress, time_all=args.time_all)
    if tty:
        print(file=sys.stderr)
    seconds = time.perf_counter() - t0
    write_rows(rows, args.output)
    if args.report:
        from ..sim.report import tokens_per_s

        unit = "tokens" if tokens_per_s(model_graph(model, batch), 1.0) is not None else "samples"
        write_report(rows, args.report, f"{args.model} sweep", tokens=args.tokens, unit=unit)
    ok = sum(1 for r in rows if r["feasible"])
    composed = sum(1 for r in rows if r.get("predicted_by") == "composed")
    floored = sum(1 for r in rows if r.get("memory_floor_bytes") is not None)
    print(f"wrote {args.output}: {len(rows):,} layouts ({ok:,} fit; {composed:,} composed from reference runs, "
          f"engine.sim.hier; {floored:,} sure not to fit by their memory floor, not simulated) in {seconds:.1f} s "
          f"({len(rows) / seconds:.1f} layouts/s, backend {args.backend}); "
          f"Pareto front: {len(pareto(rows))}"
          + (f"; report {args.report}" if args.report else ""))
    return 0
