"""Whole-process start-up of ``soapbox simulate`` (issue 11), against an older checkout.

Each round runs, in fresh processes and interleaved between the two trees (so that the
machine's load hits both alike):

* ``python -c "import app.cli"``: what importing the command costs;
* ``python -m app.cli simulate --model inception_v3 --cluster p100-4x4 --strategy data-parallel``;
* ``python -m app.cli simulate --model gpt3-175b --cluster dgx-a100-80gb:128 --strategy megatron
  --tp 8 --pp 16 --dp 8 --micro-batch 1`` (1,030,132 tasks; exits 3: it does not fit).

Warm: one untimed run of each first (numba's on-disk cache filled, files in the page cache).
Prints the median wall time of each, the import share of the Inception run, and the ratio
current / baseline. Goals (issue 11): Inception <= 1 s, GPT-3 <= 2 s.

Usage: python benchmarks/bench_startup.py --baseline /path/to/old/checkout [--rounds 5]
       (without --baseline, the current tree alone)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CASES = {
    "import": ["-c", "import app.cli"],
    "inception": ["-m", "app.cli", "simulate", "--model", "inception_v3", "--cluster", "p100-4x4",
                  "--strategy", "data-parallel"],
    "gpt3-1024": ["-m", "app.cli", "simulate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb:128",
                  "--strategy", "megatron", "--tp", "8", "--pp", "16", "--dp", "8", "--micro-batch", "1"],
}


def run(tree: Path, args: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, *args], cwd="/", env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t
    if p.returncode not in (0, 3):
        raise SystemExit(f"{tree}: {' '.join(args)} failed ({p.returncode}): {p.stderr[-500:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", type=Path, help="an older checkout to compare with (its engine/ and app/)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    trees = {"current": HERE} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    for tree in trees.values():  # warm: numba's cache, the page cache
        for case in CASES.values():
            run(tree, case)
    times: dict[tuple[str, str], list[float]] = {(t, c): [] for t in trees for c in CASES}
    for _ in range(args.rounds):
        for case, case_args in CASES.items():
            for name, tree in trees.items():
                times[(name, case)].append(run(tree, case_args))
    try:
        import scipy  # noqa: F401  (numba imports it on its first call when present: ~0.2 s)
        has_scipy = "yes"
    except ImportError:
        has_scipy = "no"
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, scipy installed: {has_scipy}, load {os.getloadavg()[0]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, median of {args.rounds} (interleaved)")
    print(f"{'case':<12}" + "".join(f"{n:>12}" for n in trees) + ("       ratio" if len(trees) > 1 else ""))
    med = {k: statistics.median(v) for k, v in times.items()}
    for case in CASES:
        row = f"{case:<12}" + "".join(f"{med[(n, case)]:>11.3f}s" for n in trees)
        if len(trees) > 1:
            row += f"{med[('current', case)] / med[('baseline', case)]:>12.2f}"
        print(row)
    for n in trees:
        print(f"import share of the Inception run ({n}): {med[(n, 'import')] / med[(n, 'inception')]:.0%}")


if __name__ == "__main__":
    main()
