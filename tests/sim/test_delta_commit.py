"""``DeltaSimulator``'s undo path (issue 24 part 9): change, revert, commit, on both of its
paths (an op's segments rebuilt in place, or, with sequence parallelism, a new builder), each
step equal to a full build and simulation task for task."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.cluster import preset
from engine.costs import CostModel
from engine.sim.delta import DeltaSimulator
from engine.formats import resolve_model
from engine.search.chains import random_config
from engine.sim.full import simulate
from engine.taskgraph import TaskGraphBuilder
from engine.layout import Layout, build_layout

ARRAYS = ("kind", "op", "part", "mb", "device", "dur_s", "size_bytes", "res_ptr", "res_idx", "succ_ptr", "succ_idx",
          "npred", "chain_next", "chain_lag_s")


def assert_equals_full_simulation(sim: DeltaSimulator) -> None:
    """The simulator's task graph equals a full build of its strategy, array for array, and its
    timeline a full simulation, task for task."""
    tg = TaskGraphBuilder(sim.graph, sim.strategy, sim.cluster, CostModel()).build()
    tl = simulate(tg)
    for key in ARRAYS:
        assert np.array_equal(getattr(sim.tasks, key), getattr(tg, key)), key
    assert np.array_equal(sim.timeline.start_s, tl.start_s)
    assert np.array_equal(sim.timeline.end_s, tl.end_s)
    assert np.array_equal(sim.timeline.order, tl.order)


def valid_moves(sim: DeltaSimulator, n: int, seed: int) -> list:
    """``n`` (op, config) changes the simulator accepts, each one to a different op."""
    rng, moves, ops = random.Random(seed), [], [op for op in sim.graph.ops if op.kind != "input"]
    while len(moves) < n:
        op = rng.choice(ops)
        config = random_config(op, sim.cluster.num_devices, rng)
        if op.name not in {m[0] for m in moves} and config != sim.strategy[op.name] and not sim.check(op.name, config):
            moves.append((op.name, config))
    return moves


@pytest.mark.parametrize("sequence_parallel, cp", [(False, 1), (True, 1), (False, 2), (True, 2)],
                         ids=["in-place", "sequence-parallel", "context-parallel", "sp-and-cp"])
def test_change_revert_commit_equal_a_full_simulation(sequence_parallel, cp):
    """(with context or sequence parallelism, the gathers are collectives: a change that breaks
    their pattern turns them back into transfers, and back)"""
    g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
    sim = DeltaSimulator(g, build_layout(g, c, Layout(tp=2, cp=cp, sequence_parallel=sequence_parallel)), c)
    assert sim.strategy.sequence_parallel is sequence_parallel
    start = sim.strategy
    (a, ca), (b, cb), (d, cd) = valid_moves(sim, 3, seed=4)

    sim.change(a, ca)  # a change ...
    assert sim.strategy[a] == ca
    assert_equals_full_simulation(sim)
    sim.revert()  # ... undone: the strategy, task graph and timeline from before it
    assert sim.strategy == start
    assert_equals_full_simulation(sim)

    sim.change(b, cb)  # a change kept
    sim.commit()
    with pytest.raises(ValueError, match="nothing to revert"):
        sim.revert()
    kept = sim.strategy
    assert kept[b] == cb and kept[a] == start[a]
    assert_equals_full_simulation(sim)

    sim.change(d, cd)  # on top of the kept one, then undone back to it
    assert_equals_full_simulation(sim)
    sim.revert()
    assert sim.strategy == kept
    assert_equals_full_simulation(sim)

    sim.change(a, ca)  # the builder a revert left behind keeps working
    assert sim.strategy[a] == ca and sim.strategy[b] == cb
    assert_equals_full_simulation(sim)


@pytest.mark.parametrize("model, cluster", [("alexnet", "p100-4x4"), ("rnntc", "p100-4x4")])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_segments_made_again_for_the_same_configs_are_put_back(model, cluster, seed):
    """A random walk over two neighbouring ops and three configs each, changes kept or undone
    at random: the same (op, config) comes back many times, with its neighbour's config the same
    (the kept segment is put back) or not (made again). Every step equals a full build and
    simulation, array for array."""
    g, c = resolve_model(model), preset(cluster)
    from engine.search.baselines import data_parallel
    sim = DeltaSimulator(g, data_parallel(g, c), c)
    rng = random.Random(seed)
    ops = [op for op in g.ops if op.kind != "input" and op.inputs]
    b = rng.choice(ops)
    a = g.ops[g.index[b.inputs[0].op]]  # b reads a's output: their tensor's segment reads both
    pool = {}
    for op in (a, b):
        pool[op.name] = [sim.strategy[op.name]]
        while len(pool[op.name]) < 3:
            config = random_config(op, c.num_devices, rng)
            if config not in pool[op.name] and not sim.check(op.name, config):
                pool[op.name].append(config)
    for _ in range(14):
        name = rng.choice([a.name, b.name])
        config = rng.choice([x for x in pool[name] if x != sim.strategy[name]])
        sim.change(name, config)
        assert_equals_full_simulation(sim)
        if rng.random() < 0.5:
            sim.commit()
        else:
            sim.revert()
            assert_equals_full_simulation(sim)
    assert sim._builder.reused > 0, "the walk never met a kept segment"
