"""The composed prediction (``engine.sim.hier.predict_layout``) against the full simulation on
generated layouts, more of them than the test runs (issue 43).

The layouts are ``tests/sim/test_hier.py``'s generator (dense and mixture-of-experts GPTs; tp,
cp, pp, vpp, dp, ep, micro-batches, recomputation, sequence parallelism, ZeRO 0-3, gradient
reduction overlap, optimizer offload; DGX A100 / H100 / B200), case ``i`` drawn from
``random.Random(1000 + i)``: the test takes the first 220 buildable from ``i = 0``; ``--start``
takes them from elsewhere. Each is simulated whole (``simulate_strategy``) and composed; the
script counts the layouts composed, those whose iteration time or any GPU's peak memory differs
by more than 1e-9 (the test's bar), the refusals by reason, and the reference sizes used.

Run in another tree (``cd OTHER && PYTHONPATH=. python /path/to/this/script``) it measures that
tree's rule on the same layouts: the generator is read from the tree it runs in.

    PYTHONPATH=. python benchmarks/hier_equality.py [--start 5000] [--layouts 500] [--json F] [--uneven]

``--uneven`` takes ``tests/sim/test_hier_uneven.py``'s generator instead (pipelines of 4-16
stages whose layers do not split evenly, or a layout's own ``layers_per_stage``; case ``i``
from ``random.Random(5000 + i)``, the test takes the first 48).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "sim"))

import test_hier as T  # noqa: E402  (the generator of the tree this runs in)

try:  # (uneven splits: a tree from before they were composed has no such generator)
    import test_hier_uneven as TU  # noqa: E402
except ImportError:
    TU = None


def run(start: int, layouts: int, gen=T) -> dict:
    """Counts over the first ``layouts`` buildable generated layouts from case ``start`` of
    the generator module ``gen`` (its ``_compare``)."""
    import engine.sim.hier as H

    stages: collections.Counter = collections.Counter()
    orig = H.predict_layout

    def spy(*a, **k):  # (the reference's size, as the result says it)
        r = orig(*a, **k)
        stages[f"{r.reference_stages} stages x {r.reference_microbatches} microbatches"] += 1
        return r

    T.predict_layout = spy  # (test_hier.compare_case calls it for both generators)
    out = {"exact": 0, "refused": 0, "differ": [], "reasons": collections.Counter(), "built": 0}
    t0 = time.perf_counter()
    i = start
    while out["built"] < layouts and i < start + 4 * layouts:
        status, detail = gen._compare(i)
        if status != "invalid":
            out["built"] += 1
            if status == "refused":
                out["refused"] += 1
                out["reasons"][detail.split(":")[0][:60] if "composed from its blocks" not in detail
                               else "the reference composed from its blocks differs from its simulation"] += 1
            else:
                out["exact"] += 1
                if detail[0] > 1e-9 or detail[1] > 1e-9:
                    out["differ"].append({"case": i, "time_rel": detail[0], "memory_rel": detail[1]})
        i += 1
    T.predict_layout = orig
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["reference"] = dict(stages.most_common())
    out["reasons"] = dict(out["reasons"].most_common())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", type=int, default=0, help="first generated case (the test's: 0)")
    ap.add_argument("--layouts", type=int, default=T.LAYOUTS, help="buildable layouts to compare")
    ap.add_argument("--json", help="write the counts here")
    ap.add_argument("--uneven", action="store_true",
                    help="tests/sim/test_hier_uneven.py's generator (stages of different layer counts)")
    a = ap.parse_args(argv)
    gen = T
    if a.uneven:
        if TU is None:
            print("this tree has no tests/sim/test_hier_uneven.py")
            return 1
        gen = TU
    print(f"# {platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}, tree {Path.cwd()}; cases from {a.start}")
    r = run(a.start, a.layouts, gen)
    print(f"{r['built']} layouts: {r['exact']} composed, {len(r['differ'])} of them differ from the full simulation "
          f"by more than 1e-9; {r['refused']} refused; {r['seconds']} s")
    print("references:", r["reference"])
    print("refusals:", r["reasons"])
    for d in r["differ"][:10]:
        print("  differs:", d)
    if a.json:
        Path(a.json).write_text(json.dumps({"start": a.start, **r}, indent=1))
    return 1 if r["differ"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
