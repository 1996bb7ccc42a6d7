"""``auto``'s budget (issue 28): the seeds' slices, a seed family that pays nothing gives its
time to MCMC, MCMC is stopped before it would run past a time budget, and the best priced is always
kept. Fake seeds and a fake MCMC: nothing here depends on the machine's speed."""

from __future__ import annotations

import math
import time
import types

import pytest

from engine.cluster import preset
from engine.errors import TooLargeError
from engine.formats import resolve_model
from engine.search import ALGORITHMS, AutoOptions, Budget
from engine.search.api import Progress, price
from engine.search.auto import HARD_SHARE
from engine.search.seed_runs import seed_slice
from engine.search.seed_layouts import moe_seed_layouts
from engine.search.baselines import data_parallel, expert


@pytest.fixture(scope="module")
def alexnet():
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    best = min(price(g, s, c).cost_s for s in (data_parallel(g, c), expert(g, c)))
    return g, c, best


def _fake(result_of, calls, name):
    def run(graph, cluster, budget=None, **kw):
        calls.append(name)
        return result_of(graph, cluster, budget, **kw)
    return types.SimpleNamespace(run=run)


def _result(strategy, time_s, iterations=1):
    return types.SimpleNamespace(best=strategy, best_time_s=time_s, best_cost_s=time_s, iterations=iterations,
                                 cancelled=False)


def test_seed_slices():
    assert seed_slice("pipeline", 9.0, ["differentiable", "pase"]) == 4.5
    assert seed_slice("differentiable", 10.0, ["pase"]) == 5.0
    assert seed_slice("pase", 4.0, []) == 4.0
    assert seed_slice("pipeline", 6.0, []) == 6.0  # alone (an LLM too large for PaSE): all of it


def test_a_seed_that_beats_nothing_skips_its_family(monkeypatch, alexnet):
    """PaSE returns something slower than the baselines: the differentiable search (which
    solves PaSE's problem, approximately) is not run and MCMC runs at once."""
    g, c, best = alexnet
    calls = []
    slow = _fake(lambda graph, cluster, budget, **kw: _result(data_parallel(graph, cluster), 10 * best), calls,
                 "pase")
    monkeypatch.setitem(ALGORITHMS, "pase", slow)
    monkeypatch.setitem(ALGORITHMS, "differentiable", _fake(lambda *a, **k: pytest.fail("differentiable ran"),
                                                            calls, "differentiable"))
    r = ALGORITHMS["auto"].run(g, c, Budget(iterations=20), seed=1)
    assert calls == ["pase"]
    text = "\n".join(r.notes)
    assert "differentiable: not run as a seed (the pase seed before it beat nothing" in text and "mcmc from " in text
    assert r.best_cost_s <= best and r.best.found_by["source"] != "pase"


def test_a_seed_that_pays_lets_the_next_run(monkeypatch, alexnet):
    g, c, best = alexnet
    calls = []
    fast = _fake(lambda graph, cluster, budget, **kw: _result(expert(graph, cluster), best / 2), calls, "pase")
    monkeypatch.setitem(ALGORITHMS, "pase", fast)
    monkeypatch.setitem(ALGORITHMS, "differentiable", _fake(lambda graph, cluster, budget, **kw: _result(
        data_parallel(graph, cluster), best), calls, "differentiable"))
    r = ALGORITHMS["auto"].run(g, c, Budget(iterations=20), options=AutoOptions(refine=False))
    assert calls == ["pase", "differentiable"]
    # never slower than its best seed; the notes say where the answer came from
    assert r.best_cost_s == best / 2 and r.best.found_by["source"] == "pase"
    assert any(n.startswith("best: pase, ") and "the best priced before the searches: " in n
               for n in r.notes), r.notes


def test_mcmc_without_an_answer_keeps_the_best_priced(monkeypatch, alexnet):
    g, c, best = alexnet

    def broken(*a, **k):
        raise TooLargeError("no starting strategy can be simulated: (test)")

    monkeypatch.setitem(ALGORITHMS, "mcmc", types.SimpleNamespace(run=broken))
    r = ALGORITHMS["auto"].run(g, c, Budget(iterations=10), options=AutoOptions(seeds=False))
    # the best priced before MCMC: the baselines' and the polish's (engine.search.polish)
    assert r.best_cost_s == pytest.approx(_best_before_mcmc(r), rel=1e-12) and math.isfinite(r.best_cost_s)
    assert r.best_cost_s <= best and "mcmc" not in r.best.found_by["contributions"]
    assert any(n.startswith("mcmc: stopped without an answer") for n in r.notes)


def _best_before_mcmc(r) -> float:
    return min(v for k, v in r.best.found_by["contributions"].items() if k != "mcmc" and v is not None)


def test_a_slower_mcmc_answer_is_not_returned(monkeypatch, alexnet):
    g, c, best = alexnet
    monkeypatch.setitem(ALGORITHMS, "mcmc", types.SimpleNamespace(
        run=lambda graph, cluster, budget, **kw: _result(data_parallel(graph, cluster), 3 * best)))
    r = ALGORITHMS["auto"].run(g, c, Budget(iterations=10), options=AutoOptions(seeds=False))
    assert r.best_cost_s == pytest.approx(_best_before_mcmc(r), rel=1e-12) and r.best.found_by["source"] != "mcmc"
    assert r.best_cost_s <= best
    assert r.best.found_by["contributions"]["mcmc"] == 3 * best


def test_mcmc_is_stopped_past_its_share_of_a_time_budget(monkeypatch, alexnet):
    """A fake MCMC that would run on forever is stopped at its first progress row from which
    a move would end past HARD_SHARE x the budget, and its best so far is kept; it is not reported as cancelled."""
    g, c, best = alexnet
    rows = []

    def endless(graph, cluster, budget, progress=None, **kw):
        for i in range(100000):
            time.sleep(0.01)
            rows.append(i)
            if progress(Progress(i, 0.0, best / 2, best / 2, 0.0)) is False:
                return types.SimpleNamespace(best=expert(graph, cluster), best_time_s=best / 2, best_cost_s=best / 2,
                                             iterations=i, cancelled=True)
        pytest.fail("not stopped")

    monkeypatch.setitem(ALGORITHMS, "mcmc", types.SimpleNamespace(run=endless))
    # no polish before it (where it ends depends on the machine's speed, and on a loaded one it
    # could leave MCMC less than its set-up): MCMC gets the budget whatever the speed. (Patching
    # engine.search.chains.delta_affordable stopped doing this once the polish moved to
    # engine.search.auto_polish, which holds its own name for it: a loaded CI machine's polish then
    # took the whole budget and MCMC was not run.)
    import engine.search.auto as A

    monkeypatch.setattr(A, "polish", lambda a: None)
    r = ALGORITHMS["auto"].run(g, c, Budget(seconds=3.0), options=AutoOptions(seeds=False))
    assert not r.cancelled and r.best_cost_s == best / 2 and r.best.found_by["source"] == "mcmc"
    assert f"mcmc: stopped before {HARD_SHARE:g} times the budget" in r.notes


def test_dense_megatron_seeds():
    g, c = resolve_model("gpt2", batch=16), preset("dgx-a100-80gb:2")
    assert moe_seed_layouts(g, c) == []  # (a dense model has none unless asked)
    seeds = moe_seed_layouts(g, c, dense=True)
    # tp the node's 8 GPUs or half of them: GPT-2's 12 heads take 4 only
    assert seeds and [e[0].tp for e in seeds] == [4] and all(lay.ep == 1 for entry in seeds for lay in entry)
    assert seeds[0][-1].recompute == "full"
