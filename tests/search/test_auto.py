"""``--algo auto``: the fast searches as seeds, MCMC from the best; never slower than a
feasible baseline or seed it knows of; its notes say who contributed what."""

from __future__ import annotations

import math

import pytest

from engine.cluster import preset
from engine.formats import resolve_model
from engine.search import ALGORITHMS, AutoOptions, Budget
from engine.search.api import price
from engine.search.baselines import data_parallel, expert
from engine.strategy import validate_strategy
from engine.layout import Layout, build_layout


@pytest.fixture(scope="module")
def alexnet_run():
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    return g, c, ALGORITHMS["auto"].run(g, c, Budget(iterations=150), seed=3)


def test_never_slower_than_what_it_knows(alexnet_run):
    g, c, r = alexnet_run
    contributions = r.best.found_by["contributions"]
    assert {"data-parallel", "expert", "pase", "differentiable", "mcmc"} <= set(contributions)
    known = [v for v in contributions.values() if v is not None]
    assert r.best_cost_s == pytest.approx(min(known), rel=1e-12)
    assert r.best_cost_s <= min(r.baselines.values())
    assert validate_strategy(r.best, g, c) == []
    # the price it reports is the one memory-checked price of its strategy
    assert price(g, r.best, c).cost_s == pytest.approx(r.best_cost_s, rel=1e-12)
    assert r.algorithm == "auto" and r.best.found_by["source"] in contributions


def test_notes_say_who_contributed(alexnet_run):
    _, _, r = alexnet_run
    text = "\n".join(r.notes)
    assert "pase: " in text and "differentiable: " in text and "mcmc from " in text and "best: " in text
    assert "pipeline: not run as a seed" in text  # AlexNet has no repeated layers


def test_reproducible_with_a_proposal_budget(alexnet_run):
    g, c, r = alexnet_run
    again = ALGORITHMS["auto"].run(g, c, Budget(iterations=150), seed=3)
    assert again.best_cost_s == r.best_cost_s and again.best.to_dict()["ops"] == r.best.to_dict()["ops"]


def test_cancel_stops_it():
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    calls = []

    def stop(p):
        calls.append(p)
        return False

    r = ALGORITHMS["auto"].run(g, c, Budget(seconds=60), progress=stop)
    # the first False stops it: nothing runs on to report again (MCMC's closing row aside,
    # when the seeds happened to end before their first report and MCMC was the one stopped)
    assert r.cancelled and 1 <= len(calls) <= 2, len(calls)
    assert sum(n.endswith(": cancelled") for n in r.notes) + any(n.startswith("mcmc from") for n in r.notes) == 1
    assert math.isfinite(r.best_cost_s)  # it still returns the best it had (a baseline at least)


def test_without_seeds_or_refinement_it_returns_the_best_baseline():
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    r = ALGORITHMS["auto"].run(g, c, Budget(iterations=10), options=AutoOptions(seeds=False, refine=False))
    best = min(price(g, s, c).cost_s for s in (data_parallel(g, c), expert(g, c)))
    assert r.best_cost_s == pytest.approx(best, rel=1e-12)
    assert r.best.found_by["source"] in ("data-parallel", "expert")


def test_progress_rows_carry_the_best_strategy_so_far():
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    rows = []
    r = ALGORITHMS["auto"].run(g, c, Budget(iterations=60), progress=lambda p: rows.append(p) or True)
    costs = [p.best_cost_s for p in rows]
    assert costs == sorted(costs, reverse=True)  # never worse than an earlier row
    for p in rows:
        if p.best is not None and math.isfinite(p.best_cost_s):
            assert price(g, p.best, c).cost_s == pytest.approx(p.best_cost_s, rel=1e-9)
    assert r.best_cost_s <= costs[-1]


def test_cli_default_is_auto(capsys):
    from engine.cli import main

    assert main(["search", "--model", "alexnet", "--cluster", "p100-4x4", "--budget", "40", "--chains", "2",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert ": auto, " in out and "note: best: " in out
    import json

    assert main(["search", "--model", "alexnet", "--cluster", "p100-4x4", "--budget", "30", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["algorithm"] == "auto" and summary["best_cost_s"] <= min(summary["baselines"].values())


def test_mcmc_starts_from_a_pipelined_strategy_with_random_chains():
    """Regression (issue 13): MCMC's random starts copied the first start's pipeline settings,
    so a pipelined starting point (several microbatches) made them invalid and crashed the
    search ("labels: degree 1024 does not divide sample (64)")."""
    from engine.search.api import MCMCOptions

    g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
    start = build_layout(g, c, Layout(pp=2, micro_batch=1))
    assert start.pipeline.microbatches > 1
    r = ALGORITHMS["mcmc"].run(g, c, Budget(iterations=30), initial=start, options=MCMCOptions(chains=4))
    assert math.isfinite(r.best_cost_s) and validate_strategy(r.best, g, c) == []


def test_a_time_budget_holds_with_seeds_in_child_processes(monkeypatch):
    """With a time budget the seeds run in forked children stopped at their share (PaSE's
    dynamic program cannot be stopped midway), so auto ends near its budget: each seed is
    given at most the seeds' share of the budget, and MCMC what is left (how near it ends:
    ``benchmarks/bench_refusals.py``)."""
    import engine.search.seed_runs as A

    shares, real = [], A.bounded

    def bounded(algorithm, graph, cluster, budget, seed, cost, seconds, tick):
        shares.append((seconds, budget.seconds))
        return real(algorithm, graph, cluster, budget, seed, cost, seconds, tick)

    monkeypatch.setattr(A, "bounded", bounded)
    g, c = resolve_model("resnet101"), preset("p100-4x4")
    r = ALGORITHMS["auto"].run(g, c, Budget(seconds=6))
    # which stages run depends on the machine's speed (on a loaded machine the baselines' pricing
    # leaves the seeds, or MCMC, less than they need), so what is asserted holds at any speed:
    # every seed that ran went through a child process within the seeds' share, and every stage
    # says what it did or why it did not run
    assert all(0 < s == b <= AutoOptions().seed_share * 6 for s, b in shares), shares
    text = "\n".join(r.notes)
    for name in ("pipeline", "differentiable", "pase"):
        assert sum(n.startswith(f"{name}: ") for n in r.notes) == 1, text
    ran = [n for n in r.notes if n.startswith(("pipeline: ", "differentiable: ", "pase: ")) and " ms in " in n]
    assert len(shares) >= len(ran), (shares, text)  # (a seed stopped at its share ran there too)
    mcmc = [n for n in r.notes if n.startswith(("mcmc from ", "mcmc: not run ("))]
    assert len(mcmc) == 1, text
    if mcmc[0].startswith("mcmc: not run"):  # (then only for want of time, and it says how much)
        assert "s left of the budget; its set-up and a move take about" in mcmc[0]
    assert r.best_cost_s <= min(r.baselines.values())


def test_the_seeds_get_their_shares_of_a_time_budget_on_a_fake_clock(monkeypatch):
    """auto's wiring of the seeds into their child processes, on a clock that moves only as
    the test says (every reading 5 ms later; PaSE takes 1 s, the differentiable search its whole
    share), so at any speed of the machine: each seed goes through ``seed_runs.bounded``, PaSE
    first, the two together within :data:`~engine.search.auto.PASE_FAMILY_SHARE` of the budget
    (PaSE its whole window, as another seed follows and half the seeds' share is more; the
    differentiable search what PaSE left of it), and MCMC runs after."""
    import time

    import engine.search.seed_runs as A
    from engine.search.auto import PASE_FAMILY_SHARE

    clock = [1000.0]

    def now() -> float:
        clock[0] += 0.005
        return clock[0]

    calls = []

    def bounded(algorithm, graph, cluster, budget, seed, cost, seconds, tick):
        calls.append((algorithm.name, seconds, budget.seconds, clock[0]))
        clock[0] += 1.0 if algorithm.name == "pase" else seconds  # (then stopped at its share)
        return f"stopped at its share of the budget ({seconds:.1f} s)"

    monkeypatch.setattr(time, "perf_counter", now)
    monkeypatch.setattr(A, "bounded", bounded)
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    budget_s = 60.0
    r = ALGORITHMS["auto"].run(g, c, Budget(seconds=budget_s))
    window = PASE_FAMILY_SHARE * budget_s
    assert window < AutoOptions().seed_share * budget_s / 2  # (so the family's window decides)
    names = [n for n, *_ in calls]
    assert names == ["pase", "differentiable"], r.notes  # (AlexNet has no repeated layers to stage)
    (_, first, b1, t1), (_, second, b2, t2) = calls
    assert (b1, b2) == (first, second)
    assert first == pytest.approx(window, abs=0.02)
    assert second == pytest.approx(window - (t2 - t1), abs=0.02) and t2 - t1 >= 1.0
    assert 0 < second < first and t2 + second <= t1 + window + 0.02
    for name, _, _, _ in calls:
        assert f"{name}: stopped at its share of the budget" in "\n".join(r.notes)
    assert sum(n.startswith("mcmc from ") for n in r.notes) == 1, r.notes
    assert r.best_cost_s <= min(r.baselines.values())


def test_a_seed_that_outlives_its_share_is_stopped():
    """The other end of the time budget: a seed still running at its share is stopped (its
    process killed), and auto is told why."""
    import multiprocessing
    import time
    import types

    from engine.search.seed_runs import bounded as _bounded

    g, c = resolve_model("alexnet"), preset("p100-4x4")
    endless = types.SimpleNamespace(run=lambda *a, **k: time.sleep(3600))
    before = set(multiprocessing.active_children())
    out = _bounded(endless, g, c, Budget(seconds=0.5), 0, None, 0.5, lambda: True)
    assert out == "stopped at its share of the budget (0.5 s)"
    assert set(multiprocessing.active_children()) <= before  # killed and reaped


def test_a_layered_model_is_also_compared_with_fsdp():
    g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
    r = ALGORITHMS["auto"].run(g, c, Budget(iterations=20), options=AutoOptions(seeds=False))
    contributions = r.best.found_by["contributions"]
    assert "fsdp" in contributions and contributions["fsdp"] is not None
    assert any(n.startswith("fsdp (ZeRO-3, full recomputation") for n in r.notes)
    assert r.best_cost_s <= contributions["fsdp"]


def test_a_seed_process_that_dies_is_reported_not_waited_for():
    import os
    import types

    from engine.search.seed_runs import bounded as _bounded

    g, c = resolve_model("alexnet"), preset("p100-4x4")
    dying = types.SimpleNamespace(run=lambda *a, **k: os._exit(3))
    # (waited for, it would be "stopped at its share of the budget (30.0 s)")
    out = _bounded(dying, g, c, Budget(seconds=30), 0, None, 30.0, lambda: True)
    assert out == "its process ended without an answer (exit code 3)"
    assert _bounded(dying, g, c, Budget(seconds=30), 0, None, 30.0, lambda: False) in (
        "cancelled", "its process ended without an answer (exit code 3)")


def test_a_seed_is_not_started_in_a_slice_shorter_than_the_pricings_it_needs(monkeypatch):
    """The differentiable search prices its plan at the end: its slice must hold that many of
    auto's slowest pricings (``seed_runs.SEED_PRICINGS``); here a need no slice can meet."""
    from engine.search import seed_runs

    monkeypatch.setitem(seed_runs.SEED_PRICINGS, "differentiable", 10 ** 6)
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    r = ALGORITHMS["auto"].run(g, c, Budget(seconds=4), seed=0)
    note = next(n for n in r.notes if n.startswith("differentiable:"))
    assert note.startswith("differentiable: not run as a seed") and "it needs 1000000 times that" in note
    assert r.best_cost_s <= min(r.baselines.values())
