"""Issue 44: how long the page's "Which GPUs" comparison takes (:func:`app.planjob.run_plan`, in
this process as a search worker runs it: one core), and how its thinned grid's answer compares
with ``soapbox plan``'s full grid on the same clusters.

    python benchmarks/bench_which_gpus.py [--model llama2-7b] [--gpus 64] [--types dgx-h100 dgx-h200 dgx-b200]
        [--full]

Prints, per cluster, the layouts priced and the best layout's tokens/s per GPU (thinned grid;
with ``--full`` also the full grid's, and the ratio), and the wall time.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from app import planjob, sources, store
from app import state as ST


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--gpus", default="64")
    ap.add_argument("--types", nargs="+", default=["dgx-h100", "dgx-h200", "dgx-b200"])
    ap.add_argument("--tokens", type=float, default=1e12)
    ap.add_argument("--full", action="store_true", help="also price the full grid (soapbox plan's) to compare")
    args = ap.parse_args()
    clusters, notes = planjob.plan_clusters(args.types, args.gpus)
    state = ST.new_state(args.model, clusters[0])
    with tempfile.TemporaryDirectory() as d:
        st = store.Store(Path(d) / store.DB_NAME)
        job = st.create_search(state["sid"], store.PLAN_JOB, "3600s", 3600.0, 0,
                               {**sources.refs(state), "options": {"clusters": clusters, "tokens": args.tokens,
                                                                   "prices": {}}}, None)
        t = time.perf_counter()
        status = planjob.run_plan(st, st.claim_next(0))
        took = time.perf_counter() - t
        res = st.search(job)["result"] or {}
        err = st.search(job)["error"]
    out = {"model": args.model, "clusters": clusters, "status": status, "error": err, "seconds": took,
           "priced": res.get("priced"), "grid": res.get("grid"),
           "best": {p["cluster"]: {"layout": p["layout"], "tokens_per_s_per_gpu": p["tokens_per_s_per_gpu"]}
                    for p in res.get("plans", [])}}
    if args.full:
        from engine.studies.plan import best_per_cluster, plan_rows

        t = time.perf_counter()
        g = sources.graph_of(state)
        rows = plan_rows(g, clusters, backend="serial")
        full = {p["cluster"]: p for p in best_per_cluster(g, rows, clusters, args.tokens)}
        out["full_seconds"], out["full_layouts"] = time.perf_counter() - t, len(rows)
        for c, b in out["best"].items():
            f = full[c]["tokens_per_s_per_gpu"]
            b["full_grid_tokens_per_s_per_gpu"] = f
            b["thinned_over_full"] = (b["tokens_per_s_per_gpu"] / f) if f and b["tokens_per_s_per_gpu"] else None
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
