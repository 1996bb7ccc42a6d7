"""Proposals at full speed (issue 28, item 1): the spliced assembly, the compiled re-linking of a
rebuild, the resumed event loop and the 4-ary ready heap give results identical, bit for bit,
to a full build and simulation, through chains of changes, reverts and commits."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cluster import preset
from engine.costs import CostModel
from engine.sim.delta import DeltaSimulator, resume
from engine.formats import resolve_model
from engine.search.baselines import data_parallel
from engine.search.chains import random_config
from engine.sim.full import run_reference, simulate
from engine.taskgraph import TaskGraph, TaskGraphBuilder
from toys import assert_same_graph, assert_same_timeline  # tests/toys.py
from engine.layout import Layout, build_layout


MODELS = {name: resolve_model(name) for name in ("alexnet", "inception_v3", "rnntc")}


def full(graph, strategy, cluster):
    tg = TaskGraphBuilder(graph, strategy, cluster, CostModel()).build()
    return tg, simulate(tg)




def random_move(sim: DeltaSimulator, rng: random.Random) -> tuple[str, object]:
    """A valid change of one op to a config it does not have."""
    names = [op.name for op in sim.graph.ops]
    while True:
        name = rng.choice(names)
        config = random_config(sim.graph[name], sim.cluster.num_devices, rng)
        if config != sim.strategy[name] and not sim.check(name, config):
            return name, config


def keep_or_revert(sim: DeltaSimulator, step: str, before: tuple) -> None:
    """Commit or revert (``step``) the change just made (``before``: the task graph and
    timeline before it), then check every array against a full build and simulation."""
    if step == "revert":
        sim.revert()
        assert sim.tasks is before[0] and sim.timeline is before[1]
    else:
        sim.commit()
    tg, tl = full(sim.graph, sim.strategy, sim.cluster)
    assert_same_graph(sim.tasks, tg)
    assert_same_timeline(sim.timeline, tl)


class TestChainsOfChanges:
    @settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(sorted(MODELS)), st.sampled_from(["p100-4x4", "dgx-a100-80gb:1"]),
           st.integers(0, 10**6), st.lists(st.sampled_from(["commit", "revert"]), min_size=3, max_size=8))
    def test_every_step_equals_a_full_build_and_simulation(self, model, cluster_name, seed, steps):
        """A chain of random changes, each kept or reverted: every array of the task graph and
        of the timeline (ready times and resource predecessors included) equals a full build
        and simulation of the strategy at that step."""
        g, c = MODELS[model], preset(cluster_name)
        sim = DeltaSimulator(g, data_parallel(g, c), c)
        rng = random.Random(seed)
        for step in steps:
            before = sim.tasks, sim.timeline
            sim.change(*random_move(sim, rng))
            keep_or_revert(sim, step, before)

    def test_changes_undone_by_changes_give_the_first_arrays_back(self):
        """Five committed changes, then five changes back to the old configs (new segments
        spliced each time, never a revert): the graph and timeline are the first ones again."""
        g, c = MODELS["inception_v3"], preset("p100-4x4")
        sim = DeltaSimulator(g, data_parallel(g, c), c)
        first_tasks, first_tl = sim.tasks, sim.timeline
        rng, undo = random.Random(5), []
        for _ in range(5):
            name, config = random_move(sim, rng)
            undo.append((name, sim.strategy[name]))
            sim.change(name, config)
            sim.commit()
        assert sim.timeline.makespan_s != first_tl.makespan_s
        for name, config in reversed(undo):
            sim.change(name, config)
            sim.commit()
        assert_same_graph(sim.tasks, first_tasks)
        assert_same_timeline(sim.timeline, first_tl)

    @pytest.mark.parametrize("model, cluster_name, strategy", [
        ("gpt2", "p100-4x4", lambda g, c: build_layout(g, c, Layout(tp=2))),  # all-reduces over tensor-parallel groups
        ("alexnet", "k80-16x4", data_parallel),  # multi-hop transfers (cut-through chains) after moves
    ])
    def test_collectives_and_chains(self, model, cluster_name, strategy):
        """Changes relink the collectives' resources and the cut-through chains as a full build
        does (on 64 GPUs the random moves make multi-hop transfers)."""
        g, c = resolve_model(model), preset(cluster_name)
        sim = DeltaSimulator(g, strategy(g, c), c)
        rng = random.Random(2)
        for _ in range(3):
            sim.change(*random_move(sim, rng))
            sim.commit()
            tg, tl = full(g, sim.strategy, c)
            assert_same_graph(sim.tasks, tg)
            assert_same_timeline(sim.timeline, tl)
        assert (sim.tasks.coll >= 0).any() and (sim.tasks.chain_next >= 0).any()


class TestSeveralOpsAtOnce:
    """:meth:`DeltaSimulator.change_configs`: several ops changed in one edit (a search's class
    move), each segment that reads any of them rebuilt once, the run resumed once."""

    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(sorted(MODELS)), st.integers(0, 10**6), st.integers(2, 6),
           st.lists(st.sampled_from(["commit", "revert"]), min_size=2, max_size=4))
    def test_every_step_equals_a_full_build_and_simulation(self, model, seed, k, steps):
        """Random sets of ops (neighbours in the graph among them: a tensor read by two changed
        ops is rebuilt once) each given a random config in one edit, kept or reverted: every
        array equals a full build and simulation of the strategy at that step."""
        g, c = MODELS[model], preset("p100-4x4")
        sim = DeltaSimulator(g, data_parallel(g, c), c)
        rng = random.Random(seed)
        for step in steps:
            before = sim.tasks, sim.timeline
            at = rng.randrange(len(g.ops) - k)
            names = [op.name for op in g.ops[at:at + k]]
            configs = {}
            for name in names:
                config = random_config(g[name], c.num_devices, rng)
                if config != sim.strategy[name] and not sim.check(name, config):
                    configs[name] = config
            if not configs:
                continue
            sim.change_configs(configs)
            assert all(sim.strategy[n] == x for n, x in configs.items())
            keep_or_revert(sim, step, before)

    def test_a_class_move_and_its_trial_against_a_bound(self):
        """RNNTC's forty time steps of one LSTM layer split by their output features in one edit:
        the full build's arrays and time; priced against a bound under that time it is inf
        (stopped), over it the exact time; reverted, the first arrays."""
        from engine.strategy import Config

        g, c = MODELS["rnntc"], preset("p100-4x4")
        sim = DeltaSimulator(g, data_parallel(g, c), c)
        first_tasks, first_tl = sim.tasks, sim.timeline
        steps = [op.name for op in g.ops if op.name.startswith("lstm.l1.")]
        assert len(steps) == 40
        configs = dict.fromkeys(steps, Config({"feature": 4}, (0, 1, 2, 3)))
        assert all(not sim.check(n, x) for n, x in configs.items())
        tg, tl = full(g, data_parallel(g, c).with_configs(steps, configs[steps[0]]), c)
        t = tl.makespan_s
        assert t != first_tl.makespan_s
        assert sim.trial_configs(configs, t * 0.999) == math.inf
        sim.revert()
        assert sim.trial_configs(configs, t * 1.001) == t
        assert_same_graph(sim.tasks, tg)
        assert_same_timeline(sim.timeline, tl)
        sim.revert()
        assert sim.tasks is first_tasks and sim.timeline is first_tl
        sim.change_configs(configs)
        sim.commit()
        assert_same_graph(sim.tasks, tg)
        assert_same_timeline(sim.timeline, tl)

    def test_configs_to_reads_the_op_configs_apart(self):
        """The op configs that take the simulator's strategy to another (none for itself), None
        where the other differs in more than op configs (a new build); an invalid config is
        refused with the op named and nothing changed."""
        from dataclasses import replace as dc_replace

        from engine.errors import ValidationError
        from engine.strategy import Config

        g, c = MODELS["alexnet"], preset("p100-4x4")
        s = data_parallel(g, c)
        sim = DeltaSimulator(g, s, c)
        assert sim.configs_to(s) == {}
        other = s.with_configs(["fc6", "fc7"], Config({"feature": 4}, (0, 1, 2, 3)))
        assert sim.configs_to(other) == {"fc6": other["fc6"], "fc7": other["fc7"]}
        assert sim.configs_to(dc_replace(other, zero_stage=2)) is None
        fewer = {n: x for n, x in other.configs.items() if n != "fc8"}
        assert sim.configs_to(dc_replace(other, configs=fewer)) is None  # (an op missing: not an edit)
        assert sim.configs_to(dc_replace(other, configs={**other.configs, "fc9": other["fc8"]})) is None
        tasks = sim.tasks
        with pytest.raises(ValidationError, match="fc7"):
            sim.change_configs({"fc6": other["fc6"], "fc7": Config({"feature": 4}, (0, 1, 2, 99))})
        assert sim.tasks is tasks and sim.strategy is s
        with pytest.raises(ValueError):
            sim.change_configs({})

    def test_ops_of_several_pipeline_stages_are_refused_in_one_edit(self):
        """Each op of an edit is checked against the other stages' devices as they are, so an
        edit over two stages is refused (a review found one that moved both stages onto GPU 1
        accepted), with nothing changed; one stage's ops at a time are edited."""
        from engine.strategy import Config

        g, c = resolve_model("gpt2"), preset("p100-4x4")
        sim = DeltaSimulator(g, build_layout(g, c, Layout(pp=2)), c)
        s = sim.strategy
        by_stage = {}
        for op in g.ops:
            by_stage.setdefault(s.stage_of.get(op.name), []).append(op.name)
        a, b = by_stage[0][-1], by_stage[1][-1]
        tasks = sim.tasks
        with pytest.raises(ValueError, match="several pipeline stages"):
            sim.change_configs({a: Config({}, (1,)), b: Config({}, (1,))})
        assert sim.tasks is tasks and sim.strategy is s
        own = [n for n in by_stage[1] if n != b][-1]
        moved = {own: Config({}, (s[b].devices[0],)), b: Config({}, (s[b].devices[0],))}
        sim.change_configs(moved)
        keep_or_revert(sim, "commit", (None, None))


class TestBarrierChains:
    def test_a_chain_an_earlier_config_made_stays_out(self):
        """Two microbatches (gradient accumulation): moving the labels (a source of the
        schedule's units) to GPU 12 makes GPU 12's barrier chain; after a revert, ``conv2``
        (producer and consumer in its chunk: it meets no barrier) moved there alone must not
        bring the chain back: a full build has none there (found by a review, issue 43)."""
        from engine.strategy import Config, PipelineSettings, Strategy

        g, c = MODELS["alexnet"], preset("p100-4x4")
        base = Strategy({op.name: Config({"sample": 8}, tuple(range(8))) if "sample" in op.dim_names
                         else Config({}, (0,)) for op in g.ops}, pipeline=PipelineSettings(microbatches=2))
        sim = DeltaSimulator(g, base, c)
        sim.change("labels", Config({}, (12,)))
        keep_or_revert(sim, "revert", (sim._undo.tasks, sim._undo.timeline))
        sim.change("conv2", Config({}, (12,)))
        keep_or_revert(sim, "commit", (None, None))
        sim.change("labels", Config({}, (12,)))  # (a source there again: the chain is back, as in a full build)
        keep_or_revert(sim, "commit", (None, None))


class TestResumeFromTheFirstChange:
    def test_a_kept_task_that_lost_its_feeders_is_ready_earlier(self):
        """RNNLM, FlexFlow's expert strategy with 2 microbatches, the 40 loss ops moved to GPU
        15: a kept task whose only predecessors moved away is ready at 0, before its old ready
        time; the resumed run must dispatch it where the full simulation does (a review found
        it 484th instead of first: ``order`` alone differed, issue 43)."""
        from dataclasses import replace as dc_replace

        from engine.search.baselines import expert
        from engine.strategy import Config, PipelineSettings

        g, c = resolve_model("rnnlm"), preset("p100-4x4")
        s = dc_replace(expert(g, c), pipeline=PipelineSettings(microbatches=2))
        sim = DeltaSimulator(g, s, c)
        losses = [op.name for op in g.ops if op.name.endswith(".loss")]
        assert len(losses) == 40
        sim.change_configs(dict.fromkeys(losses, Config({}, (15,))))
        keep_or_revert(sim, "commit", (None, None))


class TestResume:
    def test_nothing_shared_is_a_full_simulation(self):
        """A graph from another builder shares no segment: nothing is reused, and the result
        is the full simulation."""
        g, c = MODELS["alexnet"], preset("p100-4x4")
        old, old_tl = full(g, data_parallel(g, c), c)
        new, new_tl = full(g, data_parallel(g, c), c)
        tl = resume(old, old_tl, new)
        assert tl.extra["reused_tasks"] == 0
        assert_same_timeline(tl, new_tl)

    def test_the_same_graph_reuses_every_task(self):
        """Nothing changed: the whole old timeline is the prefix and the loop dispatches nothing."""
        g, c = MODELS["alexnet"], preset("p100-4x4")
        tg, tl = full(g, data_parallel(g, c), c)
        again = resume(tg, tl, tg)
        assert again.extra["reused_tasks"] == tg.num_tasks
        assert_same_timeline(again, tl)


def _random_dag(rng: random.Random, n: int, devices: int) -> TaskGraph:
    """``n`` tasks on ``devices`` devices, edges from lower to higher ids, durations of 0, 1
    or 2 s (many ties in ready time, the heap's tie-break by task id decides)."""
    edges = sorted({(u, v) for v in range(1, n) for u in rng.sample(range(v), min(v, rng.randint(0, 3)))})
    src = np.array([u for u, _ in edges], np.int64)
    dst = np.array([v for _, v in edges], np.int64)
    order = np.argsort(src, kind="stable")
    succ_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=succ_ptr[1:])
    res = np.array([rng.randrange(devices) for _ in range(n)], np.int64)
    i32, z = np.full(n, -1, np.int32), np.zeros(n)
    return TaskGraph(kind=np.zeros(n, np.int8), op=i32, part=i32, mb=i32, device=res.astype(np.int32),
                     dur_s=np.array([float(rng.choice((0, 1, 2))) for _ in range(n)]), size_bytes=z, flops=z,
                     coll=np.full(n, -1, np.int8), link=i32, res_ptr=np.arange(n + 1, dtype=np.int64), res_idx=res,
                     succ_ptr=succ_ptr, succ_idx=dst[order], npred=np.bincount(dst, minlength=n).astype(np.int64),
                     chain_next=np.full(n, -1, np.int64), chain_lag_s=z, n_devices=devices, n_links=0)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 300), st.integers(1, 5))
def test_ready_heap_matches_the_python_reference(seed, n, devices):
    """The 4-ary heap pops what Python's heapq pops (ready time, ties by task id): the compiled
    loop's start and end times equal the reference loop's, on random graphs full of ties."""
    tg = _random_dag(random.Random(seed), n, devices)
    tl = simulate(tg)
    start, end = run_reference(tg)
    assert np.array_equal(tl.start_s, start) and np.array_equal(tl.end_s, end)
    assert np.array_equal(np.sort(tl.order), np.arange(n))


@pytest.mark.parametrize("model", ["inception_v3"])
def test_a_cancellable_build_links_the_same_arrays(model):
    """The first build with a cancel relinks in NumPy blocks, without one in one compiled pass:
    the same arrays."""
    g, c = MODELS[model], preset("p100-4x4")
    s = data_parallel(g, c)
    a = TaskGraphBuilder(g, s, c, CostModel()).build()
    b = TaskGraphBuilder(g, s, c, CostModel()).build(cancel=lambda: False)
    assert_same_graph(a, b)
