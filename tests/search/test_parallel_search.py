"""Issue 28, item 4: MCMC chains and ``auto``'s seeds as tasks on the sweep's backends (one
process, a process pool, Ray's local mode), sharing a cache of priced strategies and the best so
far between rounds; the same answer for a seed and a proposal budget on every backend."""

from __future__ import annotations

import json
import random

import pytest

from engine.cluster import preset
from engine.costs import CostModel
from engine.formats import resolve_model
from engine.search.api import AutoOptions, Budget, MCMCOptions
from engine.search.auto import auto
from engine.search.baselines import data_parallel, expert
from engine.search.mcmc import mcmc
from engine.search.parallel_chains import _run_round, _state
from engine.search.keys import op_key, strategy_key
from engine.search.processes import Backend, check_backend
from engine.strategy import Config, strategy_from_dict
from toys import run_cli, tiny  # tests/toys.py

ALEXNET = resolve_model("alexnet")




def answer(r):
    """What must not depend on the backend: the best strategy, its time, the proposals made and
    the cache's counts."""
    return r.best_cost_s, r.best_time_s, r.best.to_dict()["ops"], r.iterations, r.best.found_by.get("cache")


class TestStrategyKey:
    def test_equal_strategies_equal_keys_and_a_change_changes_it(self):
        g, c = ALEXNET, preset("p100-4x4")
        s = data_parallel(g, c)
        assert strategy_key(s) == strategy_key(strategy_from_dict(json.loads(json.dumps(s.to_dict()))))
        assert strategy_key(s) != strategy_key(expert(g, c))
        t = s.with_config("fc8", Config({"feature": 4}, (0, 1, 2, 3)))
        assert strategy_key(t) != strategy_key(s)
        # the O(1) update of a single-op change gives the key of the changed strategy
        inc = (strategy_key(s) - op_key("fc8", s["fc8"]) + op_key("fc8", t["fc8"])) & ((1 << 64) - 1)
        assert inc == strategy_key(t)
        # settings that span ops are part of the key; labels (found_by, cost) are not
        from dataclasses import replace
        assert strategy_key(replace(s, zero_stage=1)) != strategy_key(s)
        assert strategy_key(replace(s, found_by={"algorithm": "x"}, cost={"iteration_time_s": 1.0})) == \
            strategy_key(s)

    def test_the_same_config_on_another_op_is_another_key(self):
        cfg = Config({"sample": 2}, (0, 1))
        assert op_key("fc1", cfg) != op_key("fc2", cfg)
        assert op_key("fc1", cfg) == op_key("fc1", Config({"sample": 2}, [0, 1]))


class TestSameAnswerOnEveryBackend:
    def test_serial_and_a_pool_of_two_agree(self):
        g, c = ALEXNET, preset("p100-4x4")
        opts = dict(polish=False, chains=4, workers=2)
        a = mcmc(g, c, Budget(iterations=120), seed=5, options=MCMCOptions(backend="serial", **opts))
        b = mcmc(g, c, Budget(iterations=120), seed=5, options=MCMCOptions(backend="pool", **opts))
        assert answer(a) == answer(b)
        assert a.iterations == 120 or a.iterations >= 60  # (the budget, or half of it without improvement)
        assert a.best_cost_s <= min(a.baselines.values())
        assert any("parallel chains on serial" in n for n in a.notes)
        assert any("parallel chains on pool of 2 processes" in n for n in b.notes)

    def test_local_is_serial_and_one_pool_worker_runs_here(self):
        assert check_backend("local") == "serial" and check_backend(" Pool ") == "pool"
        with Backend("pool", context=3, workers=1) as b:
            assert not b.parallel and b.map(pow, [2, 3]) == [9, 27]

    def test_ray_local_mode_agrees_with_serial(self):
        pytest.importorskip("ray")
        g, c = tiny()
        opts = dict(polish=False, chains=3, workers=2, round_proposals=10)
        a = mcmc(g, c, Budget(iterations=60), seed=2, options=MCMCOptions(backend="serial", **opts))
        b = mcmc(g, c, Budget(iterations=60), seed=2, options=MCMCOptions(backend="ray", **opts))
        assert answer(a) == answer(b)

    def test_auto_seeds_and_chains_on_a_pool_agree_with_serial(self):
        g, c = tiny()
        a = auto(g, c, Budget(iterations=40), seed=1, options=AutoOptions(backend="serial", workers=2))
        b = auto(g, c, Budget(iterations=40), seed=1, options=AutoOptions(backend="pool", workers=2))
        assert (a.best_cost_s, a.best.to_dict()["ops"], a.best.found_by["source"]) == \
            (b.best_cost_s, b.best.to_dict()["ops"], b.best.found_by["source"])
        assert [n for n in a.notes if " in " not in n] == [n for n in b.notes if " in " not in n]

    def test_cancelled_after_a_round_keeps_the_best_so_far(self):
        g, c = tiny()
        rows = []

        def stop(p):
            rows.append(p)
            return len(rows) < 2  # the first row (the best start), then one round

        r = mcmc(g, c, Budget(iterations=10_000), seed=0, progress=stop,
                 options=MCMCOptions(backend="pool", workers=2, round_proposals=5))
        assert r.cancelled and r.iterations == 5 * 4 and rows[0].iteration == 0 and rows[0].best is not None
        assert r.best_cost_s == rows[1].best_cost_s <= rows[0].best_cost_s <= min(r.baselines.values())


class TestSharedCache:
    def test_a_round_replayed_from_the_cache_simulates_nothing(self):
        """A chain whose every proposal another chain priced in an earlier round walks the same
        walk without one simulation (the regression this pins: a cached price that differs
        from a fresh one would change the walk)."""
        g, c = tiny()
        s = data_parallel(g, c)
        names = [op.name for op in g.ops]
        neighbours = {n: [] for n in names}
        ctx = {"token": "test-replay", "graph": g, "cluster": c, "cost": CostModel(), "check_memory": True,
               "share": 0.1, "kinds": False, "timed": False, "names": names, "neighbours": neighbours,
               "share_cache": True, "keep": 4}
        _state(ctx)
        item = {"name": "a", "index": 0, "strategy": s.to_dict(), "key": strategy_key(s),
                "rng": random.Random(7).getstate(), "beta": 1e3, "cost": 1.0, "best_cost": 1.0, "proposals": 0,
                "accepted": 0, "delta_ok": True, "seconds": {"op": 0.0, "global": 0.0},
                "counts": {"op": 0, "global": 0}, "n": 40, "cache": {}}
        first = _run_round(ctx, item)
        assert first["priced"] > 0 and first["hits_other"] == 0
        again = _run_round(ctx, {**item, "index": 1, "cache": first["new"]})
        assert again["priced"] == 0 and again["hits_other"] > 0 and again["new"] == {}
        for k in ("key", "cost", "best_cost", "rng", "accepted", "strategy"):
            assert again[k] == first[k], k

    def test_the_cache_changes_no_answer_and_saves_simulations(self):
        g, c = tiny()
        opts = dict(polish=False, chains=4, round_proposals=15)
        on = mcmc(g, c, Budget(iterations=240), seed=0, options=MCMCOptions(backend="serial", **opts))
        off = mcmc(g, c, Budget(iterations=240), seed=0,
                   options=MCMCOptions(backend="serial", share_cache=False, **opts))
        assert answer(on)[:4] == answer(off)[:4]
        hit, miss = on.best.found_by["cache"], off.best.found_by["cache"]
        assert miss["hits_other"] == miss["hits_own"] == 0
        assert hit["hits_other"] > 0  # chains met strategies other chains had priced
        assert hit["simulated"] + hit["hits_other"] + hit["hits_own"] == miss["simulated"]
        assert hit["entries"] <= hit["simulated"] < miss["simulated"]
        assert any("priced by another chain" in n for n in on.notes)


class TestBadInput:
    def test_unknown_backend_one_line(self):
        g, c = tiny()
        with pytest.raises(ValueError, match=r"^backend 'gpu': expected serial") as e:
            mcmc(g, c, Budget(iterations=10), options=MCMCOptions(backend="gpu"))
        assert "\n" not in str(e.value)
        with pytest.raises(ValueError, match="backend 'threads'"):
            auto(g, c, Budget(iterations=10), options=AutoOptions(backend="threads"))

    @pytest.mark.parametrize("argv, says", [
        (["--algo", "mcmc", "--backend", "gpu"], "backend 'gpu': expected serial"),
        (["--algo", "pase", "--backend", "pool"], "--backend applies to mcmc and auto, not pase"),
        (["--algo", "mcmc", "--workers", "2"], "--workers needs --backend"),
        (["--algo", "mcmc", "--backend", "pool", "--address", "auto"], "--address applies to --backend ray"),
        (["--algo", "mcmc", "--option", "backend=x"], "backend 'x': expected serial"),
    ])
    def test_cli_refusals_are_one_line(self, capsys, argv, says):
        rc, out, err = run_cli(capsys, "search", "--model", "alexnet", "--cluster", "p100-4x4", "--budget", "10",
                               *argv)
        assert rc == 2 and says in err and err.count("\n") == 1, err

    def test_cli_runs_on_the_pool(self, capsys):
        rc, out, err = run_cli(capsys, "search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "mcmc",
                               "--budget", "40", "--backend", "pool", "--workers", "2", "--json",
                               "--option", "polish=false", "--seed", "4")
        assert rc == 0, err
        pool = json.loads(out)
        rc, out, err = run_cli(capsys, "search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "mcmc",
                               "--budget", "40", "--backend", "local", "--json", "--option", "polish=false",
                               "--seed", "4")
        assert rc == 0, err
        here = json.loads(out)
        assert pool["best_cost_s"] == here["best_cost_s"] and pool["iterations"] == here["iterations"]
        assert any("parallel chains on pool of 2 processes" in n for n in pool["notes"])

