"""Delta simulation (FlexFlow Algorithm 2): a changed op's segments rebuilt and the unchanged
prefix of the schedule reused, identical to a full simulation."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cluster import preset
from engine.costs import CostModel
from engine.sim.delta import DeltaSimulator
from engine.errors import ValidationError
from engine.formats import resolve_model
from engine.search.baselines import data_parallel
from engine.search.chains import random_config
from engine.sim.full import simulate
from engine.strategy import Config
from engine.taskgraph import TaskGraphBuilder
from engine.layout import Layout, build_layout
from toys import random_moves  # tests/toys.py


ARRAYS = ("kind", "op", "part", "mb", "device", "dur_s", "size_bytes", "res_ptr", "res_idx", "succ_ptr", "succ_idx",
          "npred", "chain_next", "chain_lag_s")

MODELS = {name: resolve_model(name) for name in ("alexnet", "inception_v3", "rnntc")}


def full(graph, strategy, cluster):
    tg = TaskGraphBuilder(graph, strategy, cluster, CostModel()).build()
    return tg, simulate(tg)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(MODELS)), st.sampled_from(["p100-4x4", "dgx-a100-80gb:1"]), st.integers(0, 10**6),
       st.integers(3, 8))
def test_delta_equals_full_simulation(model, cluster_name, seed, steps):
    """Random sequences of single-op changes (and reverts) on several sample models: the task
    graph equals a full build array for array and the timeline a full simulation task for task."""
    g, c = MODELS[model], preset(cluster_name)
    sim = DeltaSimulator(g, data_parallel(g, c), c)
    rng = random.Random(seed)
    for name, config in random_moves(sim, rng, steps):
        sim.change(name, config)
        if rng.random() < 0.25:
            sim.revert()
        tg, tl = full(g, sim.strategy, c)
        for key in ARRAYS:
            assert np.array_equal(getattr(sim.tasks, key), getattr(tg, key)), key
        assert np.array_equal(sim.timeline.start_s, tl.start_s)
        assert np.array_equal(sim.timeline.end_s, tl.end_s)
        assert np.array_equal(sim.timeline.order, tl.order)


class TestDeltaSimulator:
    def test_reuses_the_unchanged_prefix(self):
        g, c = MODELS["inception_v3"], preset("p100-4x4")
        sim = DeltaSimulator(g, data_parallel(g, c), c)
        tl = sim.change("fc", Config({"feature": 4}, (0, 1, 2, 3)))  # the last layer: most of the timeline stays
        assert tl.extra["reused_tasks"] > sim.tasks.num_tasks // 4

    def test_invalid_config_is_refused_and_changes_nothing(self):
        g, c = MODELS["alexnet"], preset("p100-4x4")
        sim = DeltaSimulator(g, data_parallel(g, c), c)
        before = sim.timeline.makespan_s
        with pytest.raises(ValidationError, match=r"ops.fc6.degrees.feature: 3 does not divide feature \(4096\)"):
            sim.change("fc6", Config({"feature": 3}, (0, 1, 2)))
        assert sim.timeline.makespan_s == before

    def test_revert_only_the_last_change(self):
        g, c = MODELS["alexnet"], preset("p100-4x4")
        sim = DeltaSimulator(g, data_parallel(g, c), c)
        with pytest.raises(ValueError, match="nothing to revert"):
            sim.revert()


def test_checks_agree_with_the_loader_on_random_moves_of_a_pipeline():
    """Issue 13: the delta check (used by MCMC and the app's edits) validated one op at a time,
    so a move could put two pipeline stages on one GPU and the exported file then failed to
    load. It now gives the loader's verdict on the whole changed strategy."""
    import random

    from engine.search.chains import random_config
    from engine.strategy import validate_strategy

    g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
    s = build_layout(g, c, Layout(pp=2, micro_batch=1))
    sim = DeltaSimulator(g, s, c)
    rng = random.Random(1)
    stage_refusals = 0
    for _ in range(300):
        op = rng.choice(g.ops)
        cfg = random_config(op, c.num_devices, rng, s.pipeline.microbatches)
        problems = sim.check(op.name, cfg)
        loader = validate_strategy(sim.strategy.with_config(op.name, cfg), g, c)
        assert (problems == []) == (loader == []), (op.name, cfg, problems, loader)
        stage_refusals += any("pipeline stage" in p.message for p in problems)
        if not problems and rng.random() < 0.3:
            sim.change(op.name, cfg)
    assert stage_refusals > 10
    # the regression itself: a stage-1 op moved onto stage 0's devices is refused
    late = next(op for op in g.ops if sim.strategy.stage_of.get(op.name) == 1 and op.kind == "linear")
    early_dev = next(iter(sim.strategy.configs[g.ops[1].name].devices))
    with pytest.raises(ValidationError, match="another pipeline stage"):
        sim.change(late.name, Config.single(early_dev))


def test_event_loops_release_the_interpreter_lock():
    """The compiled passes a server's request thread calls from Python (a full simulation's
    event loop, and a delta simulation's task map, first change, restored prefix and event
    loop) run without the interpreter lock (numba's ``nogil``): the server's other request
    threads go on meanwhile. A kernel compiled with the lock held blocks them for its whole run
    (a profile of the loaded server: 6% of the samples holding the lock were these loops)."""
    from engine.sim import delta, full

    kernels = {"full._run": full._run, "full.event_loop": full.event_loop, "delta._first_change": delta._first_change,
               "delta._restore": delta._restore, "delta._map_tasks": delta._map_tasks}
    assert {name: k.targetoptions.get("nogil", False) for name, k in kernels.items()} == dict.fromkeys(kernels, True)
    # and they still compute: a delta change equals a full simulation of its strategy
    g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
    s = build_layout(g, c, Layout(pp=2, micro_batch=1))
    sim = DeltaSimulator(g, s, c)
    op = next(o for o in g.ops if o.kind == "linear")
    cfg = sim.strategy.configs[op.name]
    tl = sim.change(op.name, Config.single(next(iter(cfg.devices))))
    assert "reused_tasks" in tl.extra  # (the delta's own path: rebuilt in place and resumed)
    full_tl = simulate(TaskGraphBuilder(g, sim.strategy, c, CostModel()).build())
    assert tl.makespan_s == full_tl.makespan_s
