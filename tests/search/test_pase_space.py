"""PaSE's space includes a fully-connected layer's input (reduction) splits, as PaSE's own code
does (issue 13): their partial outputs are all-reduced, priced in the vertex cost."""

from __future__ import annotations

import math

import pytest

from engine.cluster import preset
from engine.costs import CostModel, group_collective_time_s
from engine.formats import resolve_model
from engine.ops import DTYPE_BYTES
from engine.search import ALGORITHMS, Budget
from engine.search.pase import build_problem, pase_configs


def test_linear_input_splits_are_priced_with_their_all_reduce():
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    problem = build_problem(g, c)
    v = next(i for i, op in enumerate(g.ops) if op.kind == "linear")
    fc = g.ops[v]
    configs = pase_configs(fc, c.num_devices)
    assert configs == problem.configs[v]
    k = next(i for i, cfg in enumerate(configs) if dict(cfg.degrees) == {"in_feature": 4})
    cfg = configs[k]
    f, b = CostModel().partition_times_s(fc, cfg.degrees, g.precision, c.device_type(0))
    _, outs, _ = fc.partition_shapes(cfg.degrees)
    reduce = group_collective_time_s("all_reduce", math.prod(outs[0]) * DTYPE_BYTES[fc.out_tensors[0].dtype],
                                     c.collective_group(range(4)), CostModel().links)
    # the weight is split along its input dim: no gradient all-reduce, only the outputs' sum
    assert problem.vertex_cost[v][k] == pytest.approx(f + b + reduce, rel=1e-12)


def test_pase_uses_them_on_alexnet():
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    r = ALGORITHMS["pase"].run(g, c, Budget(iterations=1))
    assert any(r.best.configs[op.name].degree("in_feature") > 1 for op in g.ops if op.kind == "linear")
    assert r.best_cost_s < r.baselines["expert"] and r.best_cost_s < r.baselines["data-parallel"]


def test_refuses_before_starting_when_the_estimate_exceeds_the_budget(monkeypatch):
    """NMT on 64 K80s: PaSE's dynamic program ran for minutes (issue 13); it now estimates its
    time from the config counts and the elimination order, and refuses before it builds its
    problem or runs its dynamic program (the refusal's time: ``benchmarks/bench_refusals.py``)."""
    import engine.search.pase as P
    from engine.search.api import PaseOptions
    from engine.search.pase import estimate_seconds

    g, c = resolve_model("nmt"), preset("k80-16x4")
    est = estimate_seconds(g, c)
    assert est > 60
    started = []
    monkeypatch.setattr(P, "build_problem", lambda *a, **kw: started.append("build_problem"))
    monkeypatch.setattr(P, "solve", lambda *a, **kw: started.append("solve"))
    with pytest.raises(ValueError, match=r"PaSE would take about \d+ s here .* more than the budget \(30 s\)"):
        ALGORITHMS["pase"].run(g, c, Budget(seconds=30))
    with pytest.raises(ValueError, match=r"more than max_seconds \(60 s\)"):
        ALGORITHMS["pase"].run(g, c, None, options=PaseOptions(max_seconds=60))
    assert started == []  # refused, not run
    assert estimate_seconds(resolve_model("alexnet"), preset("p100-4x4")) < 1
