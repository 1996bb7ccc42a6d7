"""The search protocol (engine.search.api and the registry): one way to call every search, one
way to price what they return and compare with, typed options."""

from __future__ import annotations

import math

import pytest

from engine.cluster import cluster_from_dict, preset
from engine.formats import resolve_model
from engine.search import ALGORITHMS, run_search
from engine.search.api import (
    AutoOptions,
    Budget,
    DifferentiableOptions,
    LayoutOptions,
    MCMCOptions,
    PaseOptions,
    PipelineOptions,
    Price,
    SearchResult,
    parse_options,
    price,
    price_baselines,
)
from engine.search.baselines import data_parallel, expert


@pytest.fixture(scope="module")
def alexnet():
    return resolve_model("alexnet"), preset("p100-4x4")


def tiny_memory(name: str, memory_bytes: int):
    """``name`` with every GPU's memory set to ``memory_bytes``."""
    d = preset(name).to_dict()
    for t in d["device_types"].values():
        t["memory_bytes"] = memory_bytes
    return cluster_from_dict(d)


# --------------------------------------------------------------------------- price


class TestPrice:
    def test_cost_is_the_time_when_it_fits_and_inf_when_not(self):
        assert Price(0.02, True).cost_s == 0.02
        assert Price(0.02, False).cost_s == math.inf

    def test_matches_the_simulator_and_memory_report(self, alexnet):
        from engine.sim.report import simulate_strategy

        g, c = alexnet
        s = data_parallel(g, c)
        r = simulate_strategy(g, s, c)
        p = price(g, s, c)
        assert p.time_s == r.iteration_time_s and p.feasible == r.memory.feasible is True

    def test_a_strategy_that_does_not_fit_costs_inf_but_keeps_its_time(self):
        g, c = resolve_model("alexnet"), tiny_memory("p100-4x4", 64 * 2**20)
        p = price(g, data_parallel(g, c), c)
        assert not p.feasible and p.cost_s == math.inf
        assert 0 < p.time_s < 1

    def test_baselines_priced_alike_with_notes_for_those_that_do_not_fit(self):
        g, c = resolve_model("alexnet"), tiny_memory("p100-4x4", 64 * 2**20)
        costs, notes = price_baselines(g, c)
        assert costs == {"data-parallel": math.inf, "expert": math.inf}
        assert notes == [f"baseline {n} does not fit in memory: no speedup over it is reported"
                         for n in ("data-parallel", "expert")]

    def test_known_prices_are_not_recomputed(self, alexnet):
        g, c = alexnet
        costs, _ = price_baselines(g, c, known={"data-parallel": Price(1.0, True), "expert": Price(2.0, False)})
        assert costs == {"data-parallel": 1.0, "expert": math.inf}


# --------------------------------------------------------------------------- result


class TestSpeedup:
    def make(self, best_cost_s: float, dp: float | None) -> SearchResult:
        g, c = resolve_model("alexnet"), preset("p100-4x4")
        baselines = {} if dp is None else {"data-parallel": dp}
        return SearchResult(data_parallel(g, c), best_cost_s, baselines, 1, 0.1)

    def test_ratio_when_both_fit(self):
        assert self.make(0.01, 0.02).speedup_vs_data_parallel == 2.0

    @pytest.mark.parametrize("best, dp", [(0.01, math.inf), (math.inf, 0.02), (math.inf, math.inf), (0.01, None),
                                          (0.0, 0.02)])
    def test_none_unless_both_fit(self, best, dp):
        """A speedup over a baseline that does not fit (or by a strategy that does not) means
        nothing: before the protocol, MCMC reported inf here."""
        assert self.make(best, dp).speedup_vs_data_parallel is None

    def test_best_time_defaults_to_the_cost(self):
        r = self.make(0.01, 0.02)
        assert r.best_time_s == 0.01 and r.feasible


# --------------------------------------------------------------------------- options


class TestOptions:
    def test_parse_converts_to_the_field_types(self):
        assert parse_options(MCMCOptions, ["chains=2", "beta=50", "polish=false"]) == \
            MCMCOptions(chains=2, beta=50.0, polish=False)
        assert parse_options(MCMCOptions, ["beta=none"]) == MCMCOptions(beta=None)
        assert parse_options(PaseOptions, None) == PaseOptions()

    @pytest.mark.parametrize("pairs, words", [
        (["steps=3"], "NAME one of chains, beta, check_memory, polish"),
        (["chains"], "expected NAME=VALUE"),
        (["chains=two"], "option chains='two'"),
        (["polish=maybe"], "expected true or false"),
        (["beta=inf"], "not a finite number"),
    ])
    def test_bad_options_are_named(self, pairs, words):
        with pytest.raises(ValueError, match=words):
            parse_options(MCMCOptions, pairs)

    def test_registry_names_each_algorithms_options(self):
        assert {n: a.options for n, a in ALGORITHMS.items()} == {
            "auto": AutoOptions, "mcmc": MCMCOptions, "pase": PaseOptions, "pipeline": PipelineOptions,
            "differentiable": DifferentiableOptions, "layouts": LayoutOptions}

    def test_another_algorithms_options_are_refused(self, alexnet):
        g, c = alexnet
        with pytest.raises(TypeError, match="pase takes PaseOptions, not MCMCOptions"):
            ALGORITHMS["pase"].run(g, c, None, options=MCMCOptions())

    def test_unknown_keyword_is_an_error_not_swallowed(self, alexnet):
        g, c = alexnet
        with pytest.raises(TypeError):
            ALGORITHMS["pase"].run(g, c, None, chains=4)

    def test_unknown_algorithm(self, alexnet):
        with pytest.raises(ValueError, match="unknown search algorithm 'anneal'; available: auto, mcmc, pase"):
            run_search("anneal", *alexnet)


# --------------------------------------------------------------------------- every search alike


@pytest.fixture(scope="module")
def results(alexnet):
    g, c = alexnet
    return {name: ALGORITHMS[name].run(g, c, Budget(iterations=20), seed=0)
            for name in ("mcmc", "pase", "differentiable")}


class TestOneProtocol:
    def test_baselines_are_the_same_quantity_for_every_search(self, alexnet, results):
        g, c = alexnet
        dp = price(g, data_parallel(g, c), c).cost_s
        ex = price(g, expert(g, c), c).cost_s
        for name, r in results.items():
            assert r.baselines == {"data-parallel": dp, "expert": ex}, name
            assert r.speedup_vs_data_parallel == dp / r.best_cost_s, name
            assert r.algorithm == name and r.best.found_by["algorithm"] == name

    def test_each_result_is_priced_by_the_shared_function(self, alexnet, results):
        g, c = alexnet
        for name, r in results.items():
            p = price(g, r.best, c)
            assert (r.best_cost_s, r.best_time_s) == (p.cost_s, p.time_s), name
            assert r.best.cost == {"iteration_time_s": p.time_s}
            assert r.best.model_fingerprint == g.fingerprint and r.best.cluster_name == c.name

    def test_a_search_whose_answer_does_not_fit_says_so(self):
        """PaSE's cost has no memory term: on GPUs of 64 MiB its optimum does not fit, and the
        result says so (before the protocol it reported a finite cost and a speedup)."""
        g, c = resolve_model("alexnet"), tiny_memory("p100-4x4", 64 * 2**20)
        r = ALGORITHMS["pase"].run(g, c)
        assert r.best_cost_s == math.inf and math.isfinite(r.best_time_s) and not r.feasible
        assert r.speedup_vs_data_parallel is None
        assert r.notes[0] == "the strategy found does not fit in memory (pase's cost has no memory term)"
        assert r.best.cost == {"iteration_time_s": r.best_time_s, "fits_in_memory": False}

    def test_pipeline_compares_with_data_parallel_only(self):
        g, c = resolve_model("resnet101"), preset("p100-4x4")
        r = ALGORITHMS["pipeline"].run(g, c, None, options=PipelineOptions(simulate_top=1))
        # one plan simulated, priced as it is and with ZeRO-2 (it has data parallelism)
        assert list(r.baselines) == ["data-parallel"] and r.iterations == 2 == len(r.trace)


# --------------------------------------------------------------------------- budget


class TestBudget:
    @pytest.mark.parametrize("text, want", [("5000", Budget(iterations=5000)), ("30s", Budget(seconds=30.0)),
                                            ("2m", Budget(seconds=120.0)), ("1h", Budget(seconds=3600.0))])
    def test_parse(self, text, want):
        assert Budget.parse(text) == want

    @pytest.mark.parametrize("text, message", [("fast", "is not a number of proposals"), ("0", "must be positive"),
                                               ("2.5", "must be a whole number")])
    def test_errors(self, text, message):
        with pytest.raises(ValueError, match=message):
            Budget.parse(text)
