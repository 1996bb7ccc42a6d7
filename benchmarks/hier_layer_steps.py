"""How a composed prediction's unit blocks grow with the layers a stage holds (issue 43: the
groundwork for a reference with fewer layers than the run).

``engine.sim.hier`` reads each schedule unit of its reference run (one stage's forward or
backward of one microbatch) as a max-plus block: ``coef[e, x]``, the seconds from entry ``e``
to exit ``x`` (``engine.sim.units``). This script builds the same layout's reference with
k = 1, 2, 3, 4 layers a stage (the model cut to ``pp x vpp x k`` layers,
``engine.sim.hier.reference_graph``), reads its units, and says for each unit whether every
coefficient grows by the same step from one k to the next (``coef(k) = a + k x step``: the
layers of a unit then act as one block repeated) and by how much, and how many exits a unit
gains per layer (the per-layer gradient collectives a last backward feeds).

    PYTHONPATH=. python benchmarks/hier_layer_steps.py --model gpt3-175b --cluster dgx-a100-80gb:128 \\
        --layout tp=8,pp=16,dp=8,micro_batch=1,recompute=full [--layout-flag sequence_parallel] [--check-at 6]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from engine.cluster import preset
from engine.formats import resolve_model
from engine.layout import Layout, resolved
from engine.sim import hier as H

KS = (1, 2, 3, 4)


def _value(v: str):
    if v in ("true", "false"):
        return v == "true"
    try:
        return int(v)
    except ValueError:
        return v


def units_at(graph, cluster, lay0: Layout, k: int) -> tuple[dict, int]:
    """(units by template, reference tasks) of the layout's reference with ``k`` layers a stage."""
    r = reference(graph, cluster, lay0, k)
    return r["units"], r["tg"].num_tasks


def reference(graph, cluster, lay0: Layout, k: int) -> dict:
    """The layout's reference run with ``k`` layers a stage (``engine.sim.hier.reference_run``
    on the model cut to ``pp x vpp x k`` layers) and its units: ``g`` (its graph), ``tg``,
    ``tl``, ``unit`` (each task's unit), ``units`` (their blocks), ``k``."""
    probe = resolved(lay0, graph, cluster)
    g = H.reference_graph(graph, probe.pp * probe.vpp * k)
    _, mr, g_ref, _, s_ref, tg, tl = H.reference_run(g, cluster, resolved(lay0, g, cluster))
    _, unit, units = H.reference_units(g_ref, s_ref, tg, tl, mr)
    return dict(g=g_ref, tg=tg, tl=tl, unit=unit, units=units, k=k)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--cluster", default="dgx-a100-80gb:128")
    ap.add_argument("--layout", default="tp=8,pp=16,dp=8,micro_batch=1,recompute=full",
                    help="Layout options, NAME=VALUE comma-separated")
    ap.add_argument("--layout-flag", action="append", default=[], help="a Layout flag set true (repeatable)")
    ap.add_argument("--check-at", type=int, metavar="K",
                    help="also build the reference with K layers a stage and compare each unit that grows by one "
                         "step with its block extrapolated from k = 1 (coef(1) + (K - 1) x step)")
    a = ap.parse_args(argv)
    opts = {k: _value(v) for k, v in (kv.split("=") for kv in a.layout.split(",") if kv)}
    opts.update({f: True for f in a.layout_flag})
    graph = resolve_model(a.model, batch=a.batch) if a.batch else resolve_model(a.model)
    cluster = preset(a.cluster)
    lay0 = Layout.from_options(opts)
    print(f"# {platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}; {a.model} on {a.cluster}, {opts}")
    got = {}
    for k in KS:
        got[k], n = units_at(graph, cluster, lay0, k)
        print(f"k = {k} layers a stage: reference of {n:,} tasks, {len(got[k])} units")
    same = grow = other = 0
    steps: set = set()
    for t in sorted(got[KS[0]]):
        cs = [got[k][t].coef for k in KS if t in got[k]]
        if len(cs) != len(KS):
            other += 1
            continue
        if any(c.shape != cs[0].shape for c in cs):  # entries and exits added per layer
            grow += 1
            print(f"unit {t}: entries {[c.shape[0] for c in cs]}, exits {[c.shape[1] for c in cs]} for k = {KS}")
            continue
        fin = np.isfinite(cs[0])
        with np.errstate(invalid="ignore"):
            ds = [cs[i + 1][fin] - cs[i][fin] for i in range(len(cs) - 1)]
        if all(np.allclose(d, ds[0], rtol=0, atol=1e-12) for d in ds[1:]):
            same += 1
            steps.update(np.round(ds[0] * 1e3, 6).tolist())
        else:
            print(f"unit {t}: not one step from k to k + 1: {[np.round(d * 1e3, 6).tolist()[:4] for d in ds]}")
    print(f"{same} units grow by one step a layer from k = 1 (steps, ms: {sorted(steps)}); {grow} gain entries "
          f"and exits with each layer (per-layer gradient collectives); {other} missing at some k")
    if a.check_at:
        return check_at(graph, cluster, lay0, a.check_at, got)
    return 0


def check_at(graph, cluster, lay0: Layout, k: int, got: dict) -> int:
    """Each unit of the reference with ``k`` layers a stage against its block extrapolated from
    k = 1 and 2; 1 when one differs by more than 1e-12 s."""
    t0 = time.process_time()
    far, n = units_at(graph, cluster, lay0, k)
    built = time.process_time() - t0
    worst, compared, bad = 0.0, 0, 0
    for t, u in far.items():
        a, b = got[1].get(t), got[2].get(t)
        if a is None or b is None or a.coef.shape != u.coef.shape or b.coef.shape != u.coef.shape:
            continue
        fin = np.isfinite(a.coef)
        if not np.array_equal(fin, np.isfinite(u.coef)):
            bad += 1
            continue
        with np.errstate(invalid="ignore"):
            want = a.coef[fin] + (k - 1) * (b.coef[fin] - a.coef[fin])
        err = float(np.abs(u.coef[fin] - want).max()) if fin.any() else 0.0
        worst = max(worst, err)
        compared += 1
        bad += err > 1e-12
    print(f"k = {k}: reference of {n:,} tasks built and read in {built:.2f} s CPU; {compared} units compared with "
          f"their extrapolation from k = 1, 2: {bad} differ (worst {worst:.3g} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
