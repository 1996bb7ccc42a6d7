"""The explorer's layout-change timings before and after a change, side by side in one run:
``benchmarks/bench_explorer.py --only layout --repeat 1`` (this tree's script, so both trees
run the same cases) run alternately on the code of the base commit (a git worktree) and of this tree, ``--rounds`` times each, on the same machine at
the same load; medians per case and the ratio after / before.

Usage: python benchmarks/bench_explorer_ab.py [--base fd0d60c] [--rounds 5] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"layout panel -> figures, (?P<case>[^:]+): median (?P<s>[\d.]+) s")


def _run(tree: Path, repeat: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    # (this tree's script in both: the cases as they are now, on each tree's code)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_explorer.py"), "--only", "layout",
                          "--repeat", str(repeat)], cwd=tree, env=env, capture_output=True, text=True,
                         check=True).stdout
    return {m["case"]: float(m["s"]) for m in LINE.finditer(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="fd0d60c")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=1,
                    help="layout changes per process (1: every one cold, the data-parallel baseline it is "
                         "compared with simulated too; 3: the median is a change with that baseline known)")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="soapbox-base-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True,
                   capture_output=True)
    try:
        print(f"# {os.uname().nodename}, {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}; "
              f"base {args.base} vs {subprocess.check_output(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, text=True).strip()}"
              f" (working tree), {args.rounds} rounds of --repeat {args.repeat}, alternating", flush=True)
        before: dict[str, list[float]] = {}
        after: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for tree, into in ((base, before), (ROOT, after)) if r % 2 == 0 else ((ROOT, after), (base, before)):
                for case, s in _run(tree, args.repeat).items():
                    into.setdefault(case, []).append(s)
            print(f"round {r + 1}: load {os.getloadavg()[0]:.2f}; "
                  + "; ".join(f"{c[:12]}… {before[c][-1]:.2f} -> {after[c][-1]:.2f} s" for c in after), flush=True)
        for case in after:
            b, a = statistics.median(before[case]), statistics.median(after[case])
            print(f"{case}: before median {b:.2f} s (max {max(before[case]):.2f}), after median {a:.2f} s "
                  f"(max {max(after[case]):.2f}); after/before {a / b:.2f}x", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)


if __name__ == "__main__":
    main()
