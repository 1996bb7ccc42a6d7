"""``soapbox init-sweep``: parallel random initialisation against N runs and one run, at equal
compute (:mod:`engine.experiments.init_sweep`)."""

from __future__ import annotations

import argparse
import json
import os
import re

from ..errors import printable
from .common import int_in, number_in

__all__ = ["add_init_sweep_parser", "cmd_init_sweep", "parse_seeds"]

#: any whole number a user may type; the engine's config says which are valid, in one line
_ANY_INT = int_in(-(2**31), 2**31 - 1)


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or a range ``"0-4"`` (both ends included) -> seeds, at most 1,000.

    >>> parse_seeds("0-2"), parse_seeds("7, 3")
    ([0, 1, 2], [7, 3])
    """
    m = re.fullmatch(r"\s*(\d{1,19})\s*-\s*(\d{1,19})\s*", text)
    if m:
        lo, hi = int(m[1]), int(m[2])
        seeds = list(range(lo, min(hi, lo + 1000) + 1))
    elif re.fullmatch(r"\s*\d{1,19}\s*(,\s*\d{1,19}\s*)*", text):
        seeds = [int(t) for t in text.split(",")]
    else:
        raise ValueError(f"--seeds: {printable(text, 40)!r} is not a list of whole numbers (e.g. 0,1,2 or 0-4)")
    if not seeds or len(seeds) > 1000 or max(seeds) >= 2**63:
        raise ValueError(f"--seeds: give 1 to 1,000 seeds from 0 to 2**63-1, got {printable(text, 40)!r}")
    return seeds


def add_init_sweep_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "init-sweep", help="test parallel random initialisation against N runs and one run, at equal compute",
        description="Train a small MLP on a 2-D spiral (PyTorch, CPU; on a process pool or Ray) three ways with the "
                    "same total compute: "
                    "(a) sample N random initialisations, keep low loss and large gradients, perturb the "
                    "survivors, successive halving, then train the few best; (b) N independent runs; (c) one run. "
                    "Prints compute and steps to the target loss and the final loss, over the seeds.")
    p.add_argument("--inits", type=_ANY_INT, default=16, metavar="N", help="initialisations / runs (default 16)")
    p.add_argument("--seeds", default="0-4", help="seeds: 0,1,2 or 0-4 (default 0-4)")
    p.add_argument("--backend", choices=["pool", "ray"], default="pool",
                   help="a local process pool (default) or Ray (--address for a cluster; a local Ray without); "
                        "the same numbers per seed on each")
    p.add_argument("--address", help="Ray cluster address (ray://host:10001, or auto); with --backend ray")
    p.add_argument("--workers", type=int_in(1, 1024), default=None,
                   help="processes of the pool, or CPUs of a local Ray (default: all cores; 1: pool in this process)")
    p.add_argument("--target-loss", type=number_in(-1e300, 1e300), default=0.02,
                   help="cross-entropy (nats) to reach (default 0.02)")
    p.add_argument("--budget-steps", type=_ANY_INT, default=2000,
                   help="full-batch steps per arm (default 2000; compute = steps x 300 examples)")
    p.add_argument("--eta", type=_ANY_INT, default=2, help="halving factor (default 2)")
    p.add_argument("--keep", type=_ANY_INT, default=2, help="survivors trained at the end (default 2)")
    p.add_argument("--no-narrow", action="store_true", help="skip perturbing the survivors (pure halving)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("-o", "--output", help="write the JSON object (rows and summary) to this file")


def _fmt(stat: dict | None, scale: float = 1.0, spec: str = ",.0f") -> str:
    if stat is None:
        return "-"
    return f"{stat['median'] / scale:{spec}} [{stat['min'] / scale:{spec}}, {stat['max'] / scale:{spec}}]"


def cmd_init_sweep(args: argparse.Namespace) -> int:
    from ..experiments.init_sweep import InitSweepConfig, config_dict, run_experiment, summarise

    cfg = InitSweepConfig(inits=args.inits, budget_steps=args.budget_steps, target_loss=args.target_loss,
                          eta=args.eta, keep=args.keep, narrow=not args.no_narrow)
    seeds = parse_seeds(args.seeds)
    if args.address and args.backend != "ray":
        raise ValueError("--address is a Ray cluster's: give --backend ray with it")
    workers = args.workers or os.cpu_count() or 1
    rows = run_experiment(cfg, seeds, workers=workers, backend=args.backend, address=args.address)
    summary = summarise(rows)
    doc = {"format": "soapbox.init-sweep/1", "config": config_dict(cfg), "seeds": seeds, "summary": summary,
           "rows": rows}
    if args.output:
        from ..formats import save_json

        save_json(doc, args.output)
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"init-sweep: {cfg.inits} inits, {cfg.budget_steps:,} steps x {cfg.examples} examples per arm, target "
          f"loss {cfg.target_loss:g}, {len(seeds)} seed(s); median [min, max] over the seeds that reached it")
    print(f"{'arm':<12} {'reached':>7}  {'compute to target (k examples)':<32} {'steps to target':<20} "
          f"final loss")
    for s in summary:
        print(f"{s['arm']:<12} {s['reached']:>3}/{s['seeds']:<3}  {_fmt(s['compute_to_target_examples'], 1e3):<32} "
              f"{_fmt(s['steps_to_target']):<20} {_fmt(s['final_loss'], 1, '.4f')}")
    if args.output:
        print(f"wrote {args.output}")
    return 0
