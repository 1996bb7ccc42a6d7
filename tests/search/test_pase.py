"""PaSE's dynamic programming (engine/search/pase.py): exact against brute force, ordering,
refusal of instances too large, and the search interface."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from engine.cluster import Cluster, DeviceType, NodeSpec, preset
from engine.formats import resolve_model
from engine.graph import GraphBuilder
from engine.search import ALGORITHMS
from engine.search.api import DifferentiableOptions
from engine.search.baselines import data_parallel
from engine.search.pase import build_problem, generate_seq, pase_configs, solve
from engine.strategy import validate_strategy


def toy_cluster(gpus: int = 4) -> Cluster:
    t = DeviceType("toy", {"fp32": 1e12}, 1e11, 10**11)
    return Cluster("toy", [NodeSpec("n", gpus, "toy", "switch", 2e9, 1e-6, nics=1, nic_bw_bytes_per_s=1e9, repeat=1)],
                   {"toy": t})


def small_graphs():
    """A chain, a diamond (a fork and a join) and a wider fork: every DP step is checked."""
    b = GraphBuilder("chain")
    x = b.input("x", [8, 32])
    h = b.add("linear", "fc1", [x], out_features=64)
    h = b.add("relu", "act", [h])
    b.add("linear", "fc2", [h], out_features=16)
    yield b.build()
    b = GraphBuilder("diamond")
    x = b.input("x", [8, 32])
    a = b.add("linear", "left", [x], out_features=32)
    c = b.add("linear", "right", [x], out_features=32)
    s = b.add("add", "join", [a, c])
    b.add("linear", "head", [s], out_features=8)
    yield b.build()
    b = GraphBuilder("fork")
    x = b.input("x", [4, 16])
    outs = [b.add("linear", f"branch{k}", [x], out_features=16) for k in range(3)]
    s = b.add("add", "sum01", [outs[0], outs[1]])
    b.add("add", "sum", [s, outs[2]])
    yield b.build()


def brute_force(problem) -> float:
    ranges = [range(len(c)) for c in problem.configs]
    return min(problem.cost(list(choice)) for choice in itertools.product(*ranges))


class TestSolve:
    @pytest.mark.parametrize("graph", list(small_graphs()), ids=lambda g: g.name)
    def test_equals_brute_force(self, graph):
        problem = build_problem(graph, toy_cluster())
        assert math.prod(len(c) for c in problem.configs) <= 300_000  # small enough to enumerate
        r = solve(problem)
        best = brute_force(problem)
        assert r.cost_s == pytest.approx(best, rel=1e-12)
        assert problem.cost(r.choice) == pytest.approx(r.cost_s, rel=1e-12)  # the choice has that cost

    def test_random_costs_equal_brute_force(self):
        """The DP is exact for any vertex and edge costs, not only the cost model's."""
        rng = np.random.default_rng(0)
        graph = list(small_graphs())[1]
        problem = build_problem(graph, toy_cluster())
        for _ in range(5):
            problem.vertex_cost = [rng.random(len(c)) for c in problem.configs]
            problem.edges = {e: rng.random(m.shape) for e, m in problem.edges.items()}
            r = solve(problem)
            assert r.cost_s == pytest.approx(brute_force(problem), rel=1e-12)

    def test_refuses_a_table_too_large_naming_the_dependent_set(self):
        problem = build_problem(list(small_graphs())[1], toy_cluster())
        with pytest.raises(ValueError, match="dependent set has"):
            solve(problem, max_table_bytes=64)


class TestGenerateSeq:
    def test_chain_has_dependent_sets_of_one(self):
        order, sets = generate_seq(5, [(0, 1), (1, 2), (2, 3), (3, 4)])
        assert sorted(order) == list(range(5))
        assert max(len(s) for s in sets) == 1 and sets[-1] == []

    def test_dependent_sets_are_unprocessed_and_grow_by_fill(self):
        # a 4-cycle: eliminating any vertex joins its two neighbours (fill), so D has 2
        order, sets = generate_seq(4, [(0, 1), (1, 2), (2, 3), (3, 0)])
        assert len(sets[0]) == 2 and max(len(s) for s in sets) == 2
        for k, (v, d) in enumerate(zip(order, sets)):
            assert set(d) <= set(order[k + 1:])  # only later vertices


def test_configs_follow_pase_restrictions():
    g = resolve_model("alexnet")
    op = g["conv1"]
    for c in pase_configs(op, 16):
        assert 16 % c.num_partitions == 0
        assert all(op.dim(d).kind in ("S", "A", "P") for d in c.degrees)
        assert c.devices == tuple(range(c.num_partitions))
    assert all(all(op.dim(d).size // k >= 8 for d, k in c.degrees.items()) for c in pase_configs(op, 16, min_part=8))


def test_search_interface_and_valid_strategy():
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    r = ALGORITHMS["pase"].run(g, c, None, seed=0)
    assert validate_strategy(r.best, g, c) == []
    assert r.best.found_by["algorithm"] == "pase" and r.best.found_by["largest_dependent_set"] >= 1
    assert r.best.cost["iteration_time_s"] == r.best_cost_s
    assert set(r.baselines) == {"data-parallel", "expert"}
    # PaSE's optimum of its own cost is no worse (by that cost) than data parallel's configs
    problem = build_problem(g, c)
    dp = data_parallel(g, c)
    dp_choice = [cs.index(dp[op.name]) for op, cs in zip(g.ops, problem.configs)]
    assert r.best.found_by["pase_cost_s"] <= problem.cost(dp_choice)


class TestDifferentiable:
    def test_gradient_matches_finite_differences(self):
        from engine.search.differentiable import _memory_terms, relaxed_cost

        problem = build_problem(list(small_graphs())[1], toy_cluster())
        rng = np.random.default_rng(1)
        probs = [rng.dirichlet(np.ones(len(c))) for c in problem.configs]
        mem, cap = _memory_terms(problem)
        used = sum(p @ m for p, m in zip(probs, mem))
        cap = np.full_like(cap, 0.5 * used.max())  # the penalty active on the busiest devices
        e, grads = relaxed_cost(problem, probs, mem, cap)
        for v in range(len(probs)):
            for k in range(len(probs[v])):
                h = 1e-5
                up = [p.copy() for p in probs]
                down = [p.copy() for p in probs]
                up[v][k] += h
                down[v][k] -= h
                slope = (relaxed_cost(problem, up, mem, cap)[0] - relaxed_cost(problem, down, mem, cap)[0]) / (2 * h)
                assert slope == pytest.approx(grads[v][k], rel=1e-4, abs=1e-12)  # central differences

    @pytest.mark.parametrize("graph", list(small_graphs()), ids=lambda g: g.name)
    def test_reaches_within_5_percent_of_the_dp_optimum(self, graph):
        from engine.search.differentiable import optimise

        cluster = toy_cluster()
        problem = build_problem(graph, cluster)
        exact = solve(problem).cost_s
        dp = data_parallel(graph, cluster)
        start = [cs.index(dp[op.name]) for op, cs in zip(graph.ops, problem.configs)]
        # warm start, as the search does; 400 steps (the default): under NCCL's collective
        # latencies the toy's optimum is one device, which 300 steps do not reach on the chain
        r = optimise(problem, steps=400, seed=0, start=start)
        assert problem.cost(r.choice) == pytest.approx(r.cost_s)
        assert r.cost_s <= exact * 1.05

    def test_search_interface(self):
        g, c = resolve_model("alexnet"), preset("p100-4x4")
        r = ALGORITHMS["differentiable"].run(g, c, None, seed=0, options=DifferentiableOptions(steps=100))
        assert validate_strategy(r.best, g, c) == [] and r.best.found_by["algorithm"] == "differentiable"
        exact = solve(build_problem(g, c)).cost_s
        assert r.best.found_by["model_cost_s"] <= exact * 1.05
        assert r.trace and r.trace[-1].best_cost_s == r.best_cost_s

    def test_a_time_budget_bounds_the_descent_and_its_polish(self, monkeypatch):
        """On a clock that reads a quarter second later at every look (no wall-clock
        dependence): with 10 s the descent stops at its share and ends cold (the temperature
        annealed by the time's progress), and the polish ends by the 10 s; without, the steps
        decide."""
        import types

        import engine.search.differentiable as D

        g, c = resolve_model("alexnet"), preset("p100-4x4")
        problem = build_problem(g, c)
        taus = []
        real = D.relaxed_cost

        def spy(problem, probs, *a):
            taus.append(max(float(p.max()) for p in probs))
            return real(problem, probs, *a)

        monkeypatch.setattr(D, "relaxed_cost", spy)
        clock = itertools.count(0.0, 0.25)
        monkeypatch.setattr(D, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
        r = D.optimise(problem, steps=400, seed=0, seconds=10.0)
        assert 2 <= r.steps < 400 and r.seconds <= 10.0 + 0.5
        assert taus[-1] > 0.9  # (cold: each op's distribution nearly one config, as at the 400th step)
        untimed = D.optimise(problem, steps=400, seed=0)
        assert untimed.steps == 400

