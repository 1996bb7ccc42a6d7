"""``soapbox search``: one algorithm with a progress bar, or all of them side by side. See
:mod:`engine.cli`."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from typing import Any, Sequence

from ..errors import SoapboxError, printable
from ..formats import save_json
from ..sim.report import json_text
from ..search import ALGORITHMS
from ..search.baselines import BASELINES, make_baseline
from ..search.processes import check_backend
from .common import (EXIT_DOES_NOT_FIT, EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, baseline_strategy,
    model_and_cluster, strategy_options)

__all__ = ["cmd_search", "compare_searches", "option_names"]


def _progress_bar(budget):
    def show(p) -> None:
        if budget.iterations:
            frac = min(1.0, p.iteration / budget.iterations)
        elif budget.seconds:
            frac = min(1.0, p.elapsed_s / budget.seconds)
        else:
            frac = 0.0
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\r[{bar:<30}] {p.iteration:6d} proposals {p.elapsed_s:6.1f} s  "
                         f"current {p.current_cost_s * 1e3:9.3f} ms  best {p.best_cost_s * 1e3:9.3f} ms  "
                         f"accepted {p.acceptance_rate * 100:4.1f}%  chains {p.chains}")
        sys.stderr.flush()
    return show


class _BestSoFar:
    """A search's progress consumer that keeps the best feasible strategy its rows carry (and
    draws the progress bar, when there is one), so that an interrupted search can still write
    what it had found. Rows reference the strategy (frozen: :class:`engine.strategy.Strategy`),
    so keeping one costs nothing."""

    def __init__(self, show) -> None:
        self.show = show
        self.row = None  # the last row that carried a feasible best

    def __call__(self, p) -> None:
        if p.best is not None and math.isfinite(p.best_cost_s) and \
                (self.row is None or p.best_cost_s <= self.row.best_cost_s):
            self.row = p
        if self.show is not None:
            self.show(p)

    def write(self, args: argparse.Namespace, g, c, how: str) -> int:
        """After ``how`` (``interrupted``, ``terminated``): write the best so far to ``-o``
        atomically, print one line saying what was written, and return the exit status
        (130 or 143)."""
        from ..search.api import Price, stamp

        status = EXIT_INTERRUPTED if how == "interrupted" else EXIT_TERMINATED
        p = self.row
        if p is None:
            print(f"soapbox: {how}: nothing written to {printable(args.output)} (no strategy found so far "
                  f"fits in memory)", file=sys.stderr)
            return status
        found_by = {"algorithm": args.algo, "interrupted": True, "proposals": p.iteration,
                    "elapsed_s": p.elapsed_s,
                    "notes": [f"the best found before the search was {how}, not its final answer"]}
        try:
            save_json(stamp(p.best, g, c, found_by, Price(p.best_cost_s, True)).to_dict(), args.output)
        except (SoapboxError, OSError) as exc:
            print(f"soapbox: {how}: the best so far could not be written: {printable(str(exc))}", file=sys.stderr)
            return status
        print(f"soapbox: {how}: wrote the best strategy found so far ({p.best_cost_s * 1e3:.3f} ms per iteration, "
              f"after {p.iteration} proposals in {p.elapsed_s:.1f} s) to {printable(args.output)}", file=sys.stderr)
        return status


#: What a user can do when no strategy the search found fits in memory.
NOTHING_FITS_HINT = ("no strategy in the space searched fits in memory; try more or larger GPUs, a longer budget, "
                     "--algo pipeline (stages, micro-batches and recomputation), or a starting point that shards "
                     "state and recomputes: --strategy fsdp --recompute full, or --strategy megatron --tp 8 "
                     "--zero-stage 1 --recompute full")


def option_names(algorithm: str) -> str:
    return "(" + ", ".join(f.name for f in dataclasses.fields(ALGORITHMS[algorithm].options)) + ")"


def _search_options(args: argparse.Namespace):
    """The typed options of ``--algo`` from ``--option`` and ``--chains`` (an option another
    algorithm takes is an error, not silently dropped)."""
    pairs = list(args.option or [])
    if args.chains is not None:
        if args.algo not in ("mcmc", "auto"):
            raise ValueError(f"--chains applies to mcmc and auto, not {args.algo}")
        pairs.append(f"chains={args.chains}")
    given = [f for f in ("backend", "workers", "address") if getattr(args, f, None) is not None]
    if given:
        if args.algo not in ("mcmc", "auto"):
            raise ValueError(f"--{given[0]} applies to mcmc and auto, not {args.algo}")
        if args.backend is None:
            raise ValueError(f"--{given[0]} needs --backend (serial, pool or ray)")
        if args.address is not None and check_backend(args.backend) != "ray":
            raise ValueError("--address applies to --backend ray")
        pairs.append(f"backend={check_backend(args.backend)}")
        pairs += [f"{f}={getattr(args, f)}" for f in ("workers", "address") if getattr(args, f) is not None]
    if args.algo == "all":
        if pairs:
            raise ValueError("--option, --chains and --backend apply to one algorithm, not to --algo all")
        return None
    return ALGORITHMS[args.algo].parse_options(pairs)


def cmd_search(args: argparse.Namespace) -> int:
    from ..formats import load_strategy
    from ..search import Budget

    if args.algo not in ALGORITHMS and args.algo != "all":
        raise ValueError(f"unknown search algorithm {args.algo!r}; available: {', '.join(ALGORITHMS)}, all")
    options = _search_options(args)
    budget = Budget.parse(args.budget)
    g, c = model_and_cluster(args)
    if args.algo == "all":
        return _search_all(args, g, c, budget)
    initial = None
    if args.strategy:
        initial = baseline_strategy(args.strategy, g, c, strategy_options(args), make_baseline) \
            if args.strategy in BASELINES \
            else load_strategy(args.strategy, g, c)
    show = None if args.quiet or args.json or not sys.stderr.isatty() and not os.environ.get("SOAPBOX_PROGRESS") \
        else _progress_bar(budget)
    best_so_far = _BestSoFar(show)
    try:
        result = ALGORITHMS[args.algo].run(g, c, budget, seed=args.seed, progress=best_so_far, initial=initial,
                                           options=options)
    except (KeyboardInterrupt, Terminated) as exc:
        if show is not None:  # (end the bar's line before the one that says what happened)
            sys.stderr.write("\n")
            show = None
        if not args.output:
            raise
        return best_so_far.write(args, g, c, "interrupted" if isinstance(exc, KeyboardInterrupt) else "terminated")
    finally:
        if show is not None:
            sys.stderr.write("\n")
    if args.output:
        save_json(result.best.to_dict(), args.output)
    best = result.best_cost_s
    fits = math.isfinite(best)
    fitting = [v for v in result.baselines.values() if math.isfinite(v)]
    notes = [] if fits else ["no strategy found fits in memory: best_cost_s is null", NOTHING_FITS_HINT]
    notes += result.notes
    summary = {"model": g.name, "cluster": c.name, "algorithm": args.algo, "budget": str(budget),
               "seed": args.seed, "best_cost_s": best if fits else None,
               "baselines": {k: (v if math.isfinite(v) else None) for k, v in result.baselines.items()},
               "speedup_vs_data_parallel": result.speedup_vs_data_parallel if fits else None,
               "speedup_vs_best_baseline": min(fitting) / best if fits and fitting and best > 0 else None,
               "iterations": result.iterations, "elapsed_s": result.elapsed_s,
               "locally_optimal": result.locally_optimal, "cancelled": result.cancelled, "output": args.output,
               "baseline_returned": result.baseline_returned,
               "notes": notes}
    status = 0 if fits else EXIT_DOES_NOT_FIT
    if args.json:
        print(json_text(summary))
        return status
    print(f"{printable(g.name)} on {printable(c.name)}: {args.algo}, {result.iterations} proposals in "
          f"{result.elapsed_s:.1f} s (seed {args.seed})")
    if fits:
        print(f"  best            {best * 1e3:.3f} ms per iteration"
              f"{' (locally optimal)' if result.locally_optimal else ''}")
    else:
        print("  best            none found fits in memory")
        print(f"  what to try:    {NOTHING_FITS_HINT}")
    for name, cost in result.baselines.items():
        if not math.isfinite(cost):
            print(f"  {name:<15} does not fit in memory")
        elif fits and best > 0:
            print(f"  {name:<15} {cost * 1e3:.3f} ms  ({cost / best:.2f}x slower than best)")
        else:
            print(f"  {name:<15} {cost * 1e3:.3f} ms")
    if result.speedup_vs_data_parallel and fits:
        print(f"  speedup over data parallel: {result.speedup_vs_data_parallel:.2f}x")
    for note in result.notes:
        if not note.startswith("baseline "):  # (the baselines' lines above say it)
            print(f"  note: {printable(note)}")
    if args.output:
        print(f"wrote {args.output}")
    return status


def compare_searches(g, c, budget, seed: int = 0, algorithms: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run each search on ``g`` / ``c`` and return one row per algorithm: best simulated cost,
    speedup over data parallel, search time, and the time it first came within 1% of the best
    cost any of them found (from its progress trace), or an error message."""
    rows = []
    results = {}
    for name in algorithms or list(ALGORITHMS):
        t = time.perf_counter()
        try:
            results[name] = ALGORITHMS[name].run(g, c, budget, seed=seed)
        except (ValueError, SoapboxError) as exc:
            rows.append({"algorithm": name, "error": str(exc), "search_s": time.perf_counter() - t})
    if results:
        best = min(r.best_cost_s for r in results.values())
        for name, r in results.items():
            within = None
            if math.isfinite(best):  # (when nothing fits, no search comes within 1% of anything)
                within = next((p.elapsed_s for p in r.trace if p.best_cost_s <= best * 1.01), None)
                if within is None and r.best_cost_s <= best * 1.01:
                    within = r.elapsed_s
            rows.append({"algorithm": name, "best_cost_s": r.best_cost_s,
                         "speedup_vs_data_parallel": r.speedup_vs_data_parallel, "search_s": r.elapsed_s,
                         "time_to_within_1pct_s": within, "iterations": r.iterations,
                         "strategy": r.best.found_by.get("plan", "")})
    order = {n: k for k, n in enumerate(algorithms or list(ALGORITHMS))}
    return sorted(rows, key=lambda r: order[r["algorithm"]])


def _search_all(args: argparse.Namespace, g, c, budget) -> int:
    rows = compare_searches(g, c, budget, args.seed)
    if args.json:
        print(json_text({"model": g.name, "cluster": c.name, "budget": str(budget), "seed": args.seed,
                         "algorithms": rows}))
        return 0
    print(f"{printable(g.name)} on {printable(c.name)}, budget {budget}, seed {args.seed}")
    print(f"  {'algorithm':15} {'best ms':>10} {'vs data parallel':>16} {'search s':>9} {'to within 1% s':>15}")
    for r in rows:
        if "error" in r:
            print(f"  {r['algorithm']:15} refused: {r['error']}")
            continue
        sp = f"{r['speedup_vs_data_parallel']:.2f}x" if r["speedup_vs_data_parallel"] else "-"
        w = f"{r['time_to_within_1pct_s']:.1f}" if r["time_to_within_1pct_s"] is not None else "never"
        cost = f"{r['best_cost_s'] * 1e3:10.3f}" if math.isfinite(r["best_cost_s"]) else f"{'no fit':>10}"
        print(f"  {r['algorithm']:15} {cost} {sp:>16} {r['search_s']:9.1f} {w:>15}")
    return 0


