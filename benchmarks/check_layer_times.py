"""One transformer layer's forward and backward in soapbox's simulated timeline against
Korthikanti et al. 2022, Table 4 (arXiv 2205.05198: the 22B model's layer, hidden 6,144, 64
heads, tensor parallel 8 on a DGX A100, micro-batch 4, sequence 2,048; milliseconds), issue 42:
the layer-level measurement the end-to-end rows of bench_calculon.py rest on.

The layer's forward is the time from layer 20's first forward task to layer 21's on GPU 0; its
backward from layer 21's first backward task to layer 20's (a steady layer in the middle of
the stack: its collectives, its recomputation and its gradients' reductions included).

    python benchmarks/check_layer_times.py [--json]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: Korthikanti et al. 2022, Table 4: (recompute, sequence parallel) -> (forward ms, backward ms)
TABLE4_MS = {("none", False): (7.7, 11.9), ("none", True): (7.2, 11.8), ("full", False): (7.7, 19.5),
             ("selective", False): (7.7, 13.2), ("selective", True): (7.2, 13.1)}
LAYER = 20


def rows() -> list[dict]:
    """One dict per Table 4 row: recompute, sp, published and simulated forward and backward."""
    import numpy as np

    from bench_calculon import RUNS, soapbox_model
    from engine.cluster import preset
    from engine.costs import CostModel
    from engine.layout import Layout, build_layout, resolved
    from engine.sim.full import simulate
    from engine.taskgraph import build_task_graph

    run = next(r for r in RUNS if r.name == "Korthikanti T5 megatron-22B seqsel")
    g, c = soapbox_model(run), preset(run.cluster)
    names = [op.name for op in g.ops]
    ops = {k: [i for i, n in enumerate(names) if n.startswith(f"layers.{k}.")] for k in (LAYER, LAYER + 1)}
    out = []
    for (rc, sp), (pf, pb) in TABLE4_MS.items():
        lay = Layout.from_options(dict(run.layout, recompute=rc, sequence_parallel=sp))
        s = build_layout(g, c, resolved(lay, g, c))
        tg = build_task_graph(g, s, c, CostModel())
        tl = simulate(tg)

        def first(k: int, kind: int) -> float:
            sel = np.isin(tg.op, ops[k]) & (tg.kind == kind) & (tg.device == 0)
            return float(tl.start_s[sel].min())
        f = (first(LAYER + 1, 0) - first(LAYER, 0)) * 1e3
        b = (first(LAYER, 1) - first(LAYER + 1, 1)) * 1e3
        out.append(dict(recompute=rc, sequence_parallel=sp, published_fwd_ms=pf, fwd_ms=round(f, 3),
                        fwd_error_pct=round((f / pf - 1) * 100, 1), published_bwd_ms=pb, bwd_ms=round(b, 3),
                        bwd_error_pct=round((b / pb - 1) * 100, 1)))
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    res = rows()
    if "--json" in argv:
        print(json.dumps(res, indent=1))
        return
    print("| recompute | sp | published fwd ms | soapbox fwd ms | error | published bwd ms | soapbox bwd ms | error |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in res:
        print(f"| {r['recompute']} | {'yes' if r['sequence_parallel'] else 'no'} | {r['published_fwd_ms']} | "
              f"{r['fwd_ms']:.2f} | {r['fwd_error_pct']:+.1f}% | {r['published_bwd_ms']} | {r['bwd_ms']:.2f} | "
              f"{r['bwd_error_pct']:+.1f}% |")


if __name__ == "__main__":
    main()
