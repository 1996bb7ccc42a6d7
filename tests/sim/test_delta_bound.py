"""Delta simulation priced against a bound (:meth:`DeltaSimulator.trial`): the same verdict as a
whole re-simulation, a loop stopped early, and the stopped loop run on to the very timeline a
full simulation gives."""

from __future__ import annotations

import math
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cluster import preset
from engine.costs import CostModel
from engine.formats import resolve_model
from engine.search.baselines import data_parallel, expert
from engine.sim.delta import DeltaSimulator, Paused
from engine.sim.full import simulate
from engine.strategy import Config
from engine.taskgraph import TaskGraphBuilder
from toys import assert_same_timeline, random_moves  # tests/toys.py

MODELS = {name: resolve_model(name) for name in ("alexnet", "inception_v3", "rnntc")}


def whole(graph, strategy, cluster):
    return simulate(TaskGraphBuilder(graph, strategy, cluster, CostModel()).build())


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(MODELS)), st.sampled_from(["p100-4x4", "dgx-a100-80gb:1"]), st.integers(0, 10**6),
       st.integers(3, 8))
def test_trial_gives_the_whole_runs_verdict(model, cluster_name, seed, steps):
    """Random single-op trials, each against a bound drawn around the current time: the time
    when the whole run ends under the bound, inf otherwise; then reverted, committed, or its
    timeline read (the stopped loop run on), each equal to a full simulation task for task."""
    g, c = MODELS[model], preset(cluster_name)
    sim = DeltaSimulator(g, data_parallel(g, c), c)
    rng = random.Random(seed)
    for name, config in random_moves(sim, rng, steps):
        below = sim.timeline.makespan_s * rng.uniform(0.7, 1.3)
        got = sim.trial(name, config, below)
        expected = whole(g, sim.strategy, c)  # (the changed strategy)
        assert got == (expected.makespan_s if expected.makespan_s < below else math.inf)
        then = rng.random()
        if then < 0.3:
            sim.revert()
            expected = whole(g, sim.strategy, c)
        elif then < 0.6:
            sim.commit()
        assert_same_timeline(sim.timeline, expected)


def test_a_bound_no_run_can_meet_stops_before_any_new_dispatch():
    """Below every resource's work still to run, the loop does not start: nothing is dispatched
    past the reused prefix; the timeline asked for afterwards is still the whole run's."""
    g, c = MODELS["inception_v3"], preset("p100-4x4")
    sim = DeltaSimulator(g, data_parallel(g, c), c)
    change = ("fc", Config({"feature": 4}, (0, 1, 2, 3)))
    assert sim.trial(*change, below_s=1e-9) == math.inf
    paused = sim._timeline
    assert isinstance(paused, Paused) and paused.done == paused.reused > 0
    assert_same_timeline(sim.timeline, whole(g, sim.strategy, c))


def test_trial_without_a_bound_is_a_change():
    g, c = MODELS["alexnet"], preset("p100-4x4")
    sim = DeltaSimulator(g, expert(g, c), c)
    config = Config({"sample": 4}, (0, 1, 2, 3))
    t = sim.trial("fc7", config, math.inf)
    sim.revert()
    assert t == sim.change("fc7", config).makespan_s


def test_a_bound_just_above_the_time_keeps_it():
    """A run that ends just under its bound (one part in 1e12) is priced, not stopped: the bound
    is tested with a margin above it (:data:`engine.sim.delta.BOUND_MARGIN`)."""
    g, c = MODELS["alexnet"], preset("p100-4x4")
    sim = DeltaSimulator(g, data_parallel(g, c), c)
    config = Config({"feature": 4}, (0, 1, 2, 3))
    t = sim.change("fc6", config).makespan_s
    sim.revert()
    assert sim.trial("fc6", config, t * (1 + 1e-12)) == t
    sim.revert()
    assert sim.trial("fc6", config, t) == math.inf  # (the time itself is not under it)
