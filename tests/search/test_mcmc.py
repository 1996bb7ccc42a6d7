"""MCMC search (FlexFlow §6): proposals, chains, successive halving, the final polish, and
`soapbox search`."""

from __future__ import annotations

import json
import math

from engine.cli import main
from engine.cluster import preset
from engine.costs import CostModel
from engine.sim.delta import DeltaSimulator
from engine.formats import load_strategy, resolve_model
from engine.search.api import Budget, MCMCOptions
from engine.search.baselines import data_parallel, expert
from engine.search.chains import candidate_configs
from engine.search.polish import local_polish
from engine.search.mcmc import mcmc
from engine.sim.full import simulate
from engine.taskgraph import TaskGraphBuilder
from toys import tiny  # tests/toys.py


MODELS = {name: resolve_model(name) for name in ("alexnet", "inception_v3", "rnntc")}


def full(graph, strategy, cluster):
    """A strategy simulated from scratch (no delta simulation): what MCMC's costs must equal."""
    tg = TaskGraphBuilder(graph, strategy, cluster, CostModel()).build()
    return tg, simulate(tg)




class TestMcmc:
    def test_never_worse_than_the_best_baseline_and_beats_data_parallel(self):
        g, c = MODELS["alexnet"], preset("p100-4x4")
        r = mcmc(g, c, Budget(iterations=150), seed=0, options=MCMCOptions(polish=False))
        assert r.best_cost_s <= min(r.baselines.values())
        assert r.speedup_vs_data_parallel > 1.5  # AlexNet's large FC layers favour model parallelism
        assert r.best.found_by["algorithm"] == "mcmc" and r.best.found_by["seed"] == 0
        assert r.best.cost["iteration_time_s"] == r.best_cost_s
        assert r.best.model_fingerprint == g.fingerprint
        # the best strategy's reported cost is what a fresh simulation gives
        assert simulate(TaskGraphBuilder(g, r.best, c, CostModel()).build()).makespan_s == r.best_cost_s

    def test_reproducible_with_a_seed(self):
        g, c = MODELS["alexnet"], preset("p100-4x4")
        a = mcmc(g, c, Budget(iterations=60), seed=3, options=MCMCOptions(polish=False))
        b = mcmc(g, c, Budget(iterations=60), seed=3, options=MCMCOptions(polish=False))
        assert a.best_cost_s == b.best_cost_s and a.best.to_dict()["ops"] == b.best.to_dict()["ops"]

    def test_cancel_returns_the_best_so_far(self):
        g, c = MODELS["alexnet"], preset("p100-4x4")
        seen = []

        def stop(p):
            seen.append(p)
            return len(seen) < 3

        r = mcmc(g, c, Budget(iterations=10_000), seed=0, progress=stop)
        assert r.cancelled and r.iterations < 100
        assert r.best_cost_s <= min(r.baselines.values())
        assert all(p.best_cost_s >= r.best_cost_s for p in seen)

    def test_progress_rows(self):
        g, c = MODELS["alexnet"], preset("p100-4x4")
        rows = []
        r = mcmc(g, c, Budget(iterations=40), seed=0, progress=rows.append, options=MCMCOptions(polish=False))
        # stops at the budget, or earlier when the best has not improved for half of it
        assert rows and rows[-1].iteration == r.iterations <= 40
        assert all(0 <= p.acceptance_rate <= 1 and p.best_cost_s <= p.current_cost_s + 1e-12 for p in rows[:-1])
        assert [p.best_cost_s for p in rows] == sorted((p.best_cost_s for p in rows), reverse=True)

    def test_result_is_locally_optimal(self):
        """FlexFlow's check: after the search, no single-op change improves the best strategy
        (verified here by full simulation of every candidate change)."""
        g, c = tiny()
        r = mcmc(g, c, Budget(iterations=200), seed=0)
        assert r.locally_optimal
        for op in g.ops:
            for config in candidate_configs(op, c.num_devices):
                if config == r.best[op.name]:
                    continue
                s = r.best.with_config(op.name, config)
                _, tl = full(g, s, c)
                assert tl.makespan_s >= r.best_cost_s * (1 - 1e-9), (op.name, config)


def test_candidate_configs_are_valid():
    g, c = MODELS["inception_v3"], preset("p100-4x4")
    sim = DeltaSimulator(g, data_parallel(g, c), c)
    for op in g.ops[:40]:
        for config in candidate_configs(op, c.num_devices):
            assert sim.check(op.name, config) == [], (op.name, config)


def test_local_polish_never_makes_it_worse():
    g, c = tiny()
    s = data_parallel(g, c)
    _, tl = full(g, s, c)
    best, cost, done = local_polish(g, c, s)
    assert done and cost <= tl.makespan_s


class TestCli:
    def test_search_json_and_output(self, capsys, tmp_path):
        out = tmp_path / "best.json"
        assert main(["search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "mcmc", "--budget", "40",
                     "--seed", "0", "-o", str(out), "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
        for key in ("best_cost_s", "baselines", "speedup_vs_data_parallel", "iterations"):
            assert key in summary
        assert 0 < summary["iterations"] <= 40  # early stop: no improvement for half the budget
        assert math.isclose(summary["speedup_vs_data_parallel"],
                            summary["baselines"]["data-parallel"] / summary["best_cost_s"])
        s = load_strategy(out, MODELS["alexnet"], preset("p100-4x4"))
        assert s.found_by["algorithm"] == "mcmc" and s.found_by["budget"] == "40 proposals"
        assert s.cost["iteration_time_s"] == summary["best_cost_s"]

    def test_bad_budget_and_algorithm(self, capsys):
        assert main(["search", "--model", "alexnet", "--cluster", "p100-4x4", "--budget", "soon"]) == 2
        assert "budget 'soon' is not a number of proposals" in capsys.readouterr().err
        assert main(["search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "annealing"]) == 2
        assert "unknown search algorithm 'annealing'; available: auto, mcmc, pase, pipeline, differentiable, layouts, all" \
            in capsys.readouterr().err

    def test_all_algorithms_side_by_side(self, capsys):
        assert main(["search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "all", "--budget", "20",
                     "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        rows = {r["algorithm"]: r for r in out["algorithms"]}
        assert list(rows) == ["auto", "mcmc", "pase", "pipeline", "differentiable", "layouts"]
        assert "no numbered layer blocks" in rows["pipeline"]["error"]  # AlexNet has no layers to pipeline
        best = min(r["best_cost_s"] for r in rows.values() if "error" not in r)
        for r in rows.values():
            if "error" not in r:
                assert r["best_cost_s"] >= best and r["search_s"] > 0
                within = r["time_to_within_1pct_s"]
                assert (within is not None) == (r["best_cost_s"] <= best * 1.01)


def test_expert_start_is_a_chain():
    g, c = MODELS["alexnet"], preset("p100-4x4")
    r = mcmc(g, c, Budget(iterations=20), seed=0, options=MCMCOptions(polish=False))
    _, tl = full(g, expert(g, c), c)
    assert r.baselines["expert"] == tl.makespan_s


def test_random_starts_are_skipped_when_setup_eats_the_time_budget():
    """Building the data-parallel and expert chains takes far more than a tenth of 1 ms, so
    no random start is made; with a proposal budget all four chains start."""
    g, c = MODELS["alexnet"], preset("p100-4x4")
    quick = mcmc(g, c, Budget(seconds=0.001), seed=0, options=MCMCOptions(polish=False))
    assert quick.trace[-1].chains <= 2
    full_start = mcmc(g, c, Budget(iterations=40), seed=0, options=MCMCOptions(polish=False))  # rung 1: 4 x 5 proposals
    assert full_start.trace[0].chains == 4
