"""``soapbox plan``: for a model and a token budget, the best layout on each cluster, with
tokens/s per GPU, MFU, days, GPU-hours and cost (:mod:`engine.studies.plan`)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from .common import number_in, positive_int

__all__ = ["add_plan_parser", "cmd_plan"]


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="which GPUs: the best layout on each cluster, with days, GPU-hours and cost for N tokens",
        description="For a model and a token budget: every valid layout predicted on each cluster (selective "
                    "recomputation, ZeRO-1 and sequence parallelism as Megatron-LM trains large models; full "
                    "recomputation where that does not fit), and each cluster's fastest feasible layout with its "
                    "tokens/s per GPU, MFU, the days and GPU-hours the tokens take and, at --price, the cost.")
    p.add_argument("--model", required=True, help="sample model name or model file (a language model)")
    p.add_argument("--batch", type=positive_int, help="global batch in sequences (default: the model's)")
    p.add_argument("--clusters", required=True, metavar="PRESET:N1,N2",
                   help="clusters to compare, e.g. 'dgx-h100:8,16 dgx-h200:8 dgx-b200:8' (groups separated by "
                        "spaces in quotes)")
    p.add_argument("--tokens", type=number_in(1.0, 1e18), required=True, help="tokens the training run takes")
    p.add_argument("--price", nargs="+", metavar="GPU_TYPE=PRICE",
                   help="price per GPU-hour by GPU type (a preset's name), e.g. dgx-h100=2.49 dgx-b200=4.9; "
                        "none is assumed")
    p.add_argument("--backend", choices=["pool", "serial", "ray"], default="pool")
    p.add_argument("--workers", type=positive_int, help="processes (default: all cores)")
    p.add_argument("--json", action="store_true", help="print the plans as JSON instead of a table")
    p.add_argument("--figure", help="write the comparison as a Plotly HTML page here")
    p.add_argument("-o", "--output", help="also write every layout's row (.csv, .json or .parquet)")


def cmd_plan(args: argparse.Namespace) -> int:
    from ..studies.plan import best_per_cluster, parse_prices, plan_rows, plan_table, write_plan_figure
    from ..studies.sweep import parse_clusters
    from ..studies.sweep_files import check_output, write_rows

    if args.output:  # (before the layouts are predicted: a typo loses no work)
        check_output(args.output, (".csv", ".json", ".parquet"), "-o")
    if args.figure:
        check_output(args.figure, (".html", ".htm"), "--figure")
    prices = parse_prices(args.price)
    clusters = parse_clusters(args.clusters)
    t0 = time.perf_counter()
    rows = plan_rows(args.model, clusters, batch=args.batch, backend=args.backend, workers=args.workers)
    plans = best_per_cluster(args.model, rows, clusters, args.tokens, prices, batch=args.batch)
    if args.output:
        write_rows(rows, args.output)
    if args.figure:
        write_plan_figure(plans, args.figure, f"{args.model}: {args.tokens:,.3g} tokens")
    if args.json:
        print(json.dumps({"model": args.model, "tokens": args.tokens, "plans": plans}, indent=1))
    else:
        print(plan_table(plans, args.tokens))
        print(f"\n{len(rows):,} layouts predicted in {time.perf_counter() - t0:.1f} s"
              + (f"; figure {args.figure}" if args.figure else "") + (f"; rows {args.output}" if args.output else ""),
              file=sys.stderr)
    return 0
