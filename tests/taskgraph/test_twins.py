"""Twin segments (engine.taskgraph.twins, issue 28: a stage's identical layers built once): a
first build that copies the segments whose inputs twin an earlier segment's equals, array for
array, a build that makes every segment, on every kind of layout (symmetric and full builds,
pipelines and their schedules, sequence and context parallelism, ZeRO 1-3 and FSDP's units,
DeepSpeed's per-op gathers, overlap switches, recomputation policies, mixture-of-experts
layers, FlexFlow-style per-op strategies), and delta simulation from a copied build stays equal
to a full one."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cluster import preset
from engine.costs import CostModel
from engine.sim.delta import DeltaSimulator
from engine.formats import resolve_model
from engine.models import build_sample
from engine.search.baselines import data_parallel, expert
from engine.layout.build import fsdp
from engine.search.chains import random_config
from engine.sim.full import simulate
from engine.taskgraph import TaskGraphBuilder, find_symmetry

from toys import assert_same_graph, assert_same_timeline, drawn_megatron  # tests/toys.py
from engine.layout import Layout, build_layout

MODELS: dict[str, object] = {}


def model(name: str):
    """A model by name; ``name@B``: the sample with a global batch of B."""
    if name not in MODELS:
        base, _, batch = name.partition("@")
        MODELS[name] = build_sample(base, batch=int(batch)) if batch else resolve_model(name)
    return MODELS[name]


def both(g, s, c, symmetric: bool):
    """(plain build, build with twins, the twins' builder) of one strategy."""
    sym = find_symmetry(g, s, c) if symmetric else None
    plain = TaskGraphBuilder(g, s, c, CostModel(), sym, twins=False).build()
    b = TaskGraphBuilder(g, s, c, CostModel(), sym, twins=True)
    return plain, b.build(), b


#: (id, model, cluster, strategy) -- layered models, where twins are many
LAYOUTS = [
    ("tp2-pp2", "gpt2", "dgx-a100-80gb:1", lambda g, c: build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1))),
    ("tp2-pp2-sp", "gpt2", "dgx-a100-80gb:1",
     lambda g, c: build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1, sequence_parallel=True))),
    ("tp2-cp2-sp", "gpt2", "dgx-a100-80gb:1",
     lambda g, c: build_layout(g, c, Layout(tp=2, cp=2, micro_batch=2, sequence_parallel=True))),
    ("interleaved", "gpt2", "dgx-a100-80gb:1",
     lambda g, c: build_layout(g, c, Layout(tp=2, pp=2, vpp=3, micro_batch=1, recompute="full"))),
    ("gpipe-selective", "gpt2", "dgx-a100-80gb:1",
     lambda g, c: build_layout(g, c, Layout(tp=2, pp=4, micro_batch=1, schedule="gpipe", recompute="selective"))),
    ("zero1-no-overlap", "gpt2", "dgx-a100-80gb:1",
     lambda g, c: build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1, zero_stage=1, overlap_grad_reduce=False,
                                            overlap_param_gather=True))),
    ("tp-comm-overlap", "gpt2", "dgx-a100-80gb:1",
     lambda g, c: build_layout(g, c, Layout(tp=4, micro_batch=2, sequence_parallel=True, tp_comm_overlap=True))),
    ("fsdp", "gpt2@32", "dgx-a100-80gb:1", lambda g, c: fsdp(g, c, Layout(zero_stage=3, micro_batch=2))),
    ("fsdp-per-op-hybrid", "gpt2@32", "dgx-a100-80gb:2",
     lambda g, c: fsdp(g, c, Layout(zero_stage=3, gather_unit="op", shard_group=8, recompute="selective-op"))),
    ("fsdp-tp2-pp2", "gpt2@32", "dgx-a100-80gb:2", lambda g, c: fsdp(g, c, Layout(zero_stage=2, tp=2, pp=2,
                                                                                  micro_batch=1))),
    ("bert-dp", "bert-large@64", "dgx-a100-80gb:1", lambda g, c: data_parallel(g, c, micro_batch=2)),
    ("inception-expert", "inception_v3", "p100-4x4", lambda g, c: expert(g, c)),
]


#: every layout built in full, and with symmetry where it has one (FlexFlow's expert strategy has none)
BUILDS = [(case, sym) for case in LAYOUTS for sym in (True, False) if not (sym and case[0] == "inception-expert")]


@pytest.mark.parametrize("case, symmetric", BUILDS,
                         ids=[f"{case[0]}-{'symmetric' if sym else 'full'}" for case, sym in BUILDS])
def test_a_build_with_twins_equals_one_without(case, symmetric):
    _, name, cluster, make = case
    g, c = model(name), preset(cluster)
    s = make(g, c)
    assert not symmetric or find_symmetry(g, s, c) is not None
    plain, twinned, b = both(g, s, c, symmetric)
    assert_same_graph(plain, twinned)
    assert_same_timeline(simulate(plain), simulate(twinned))


def test_a_deep_model_copies_most_of_its_segments():
    """GPT-2's twelve layers on two pipeline stages: all but the first two layers of a stage are
    copies (their inputs and neighbours are alike), and the result is the same."""
    g, c = model("gpt2"), preset("dgx-a100-80gb:1")
    s = build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1, sequence_parallel=True))
    plain, twinned, b = both(g, s, c, True)
    segments = len(b.store.segments)
    assert b.copied > segments / 2
    assert_same_graph(plain, twinned)


def test_mixture_of_experts_layers():
    g = build_sample("mixtral-8x7b", batch=16, seq_len=256)
    c = preset("dgx-h100:2")
    s = build_layout(g, c, Layout(tp=2, pp=2, ep=4, micro_batch=1, sequence_parallel=True))
    plain, twinned, _ = both(g, s, c, find_symmetry(g, s, c) is not None)
    assert_same_graph(plain, twinned)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["alexnet", "rnntc", "gpt2"]), st.integers(0, 10**6), st.integers(1, 12))
def test_random_per_op_strategies(name, seed, changed):
    """FlexFlow-style strategies: ``changed`` random ops get random configs (identical layers
    then differ here and there; a twin must not be taken across a difference)."""
    g, c = model(name), preset("dgx-a100-80gb:1")
    rng = random.Random(seed)
    s = data_parallel(g, c)
    for op in rng.sample(g.ops, min(changed, len(g.ops))):
        if op.kind != "input":
            s = s.with_config(op.name, random_config(op, c.num_devices, rng))
    plain, twinned, _ = both(g, s, c, False)
    assert_same_graph(plain, twinned)


def test_delta_simulation_from_a_copied_build():
    """A delta simulator whose first build copied twins: changes to ops of copied segments (and
    of their sources) and reverts equal full builds without twins."""
    g, c = model("gpt2"), preset("dgx-a100-80gb:1")
    s = build_layout(g, c, Layout(tp=2, micro_batch=2))
    sim = DeltaSimulator(g, s, c)
    assert sim._builder.copied > 0
    rng = random.Random(3)
    for name in ("layers.1.mlp.fc1", "layers.7.attn.q", "layers.11.mlp.fc2"):
        config = random_config(g[name], c.num_devices, rng)
        while sim.check(name, config) or config == sim.strategy[name]:
            config = random_config(g[name], c.num_devices, rng)
        sim.change(name, config)
        full = TaskGraphBuilder(g, sim.strategy, c, CostModel(), twins=False).build()
        assert_same_graph(sim.tasks, full)
        assert np.array_equal(sim.timeline.end_s, simulate(full).end_s)
        if name.startswith("layers.7"):
            kept = sim.strategy
            sim.revert()
            assert sim.strategy != kept
            assert_same_graph(sim.tasks, TaskGraphBuilder(g, sim.strategy, c, CostModel(), twins=False).build())
        else:
            sim.commit()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]), vpp=st.sampled_from([1, 3]),
       mb=st.sampled_from([1, 2]), sp=st.booleans(), zero=st.sampled_from([0, 1, 2]),
       recompute=st.sampled_from(["none", "selective", "full"]), overlap=st.booleans(), symmetric=st.booleans())
def test_random_megatron_layouts(tp, pp, vpp, mb, sp, zero, recompute, overlap, symmetric):
    """Megatron layouts of GPT-2 (batch 32) on 16 GPUs drawn at random, built with and without
    twins: the same arrays (layouts the builder refuses are skipped by hypothesis)."""
    g, c = model("gpt2@32"), preset("dgx-a100-80gb:2")
    s = drawn_megatron(g, c, tp, pp, vpp, mb, sp, zero, recompute, overlap)
    plain, twinned, _ = both(g, s, c, symmetric and find_symmetry(g, s, c) is not None)
    assert_same_graph(plain, twinned)
