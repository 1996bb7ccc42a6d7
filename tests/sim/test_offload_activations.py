"""Activation offloading (Megatron-Core's --cpu-offloading-num-layers; issue 42: runs that ran
were called out of memory) and fused against eager kernels: what each keeps on the device, what
goes to the host, and what the copies cost."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from engine.cluster import Cluster, preset
from engine.costs import CostModel
from engine.errors import ValidationError
from engine.layout import Layout, build_layout
from engine.models.transformer import GPTConfig, gpt
from engine.search.chains import random_config
from engine.sim.delta import DeltaSimulator
from engine.sim.full import simulate
from engine.sim.memory import saved_activation_bytes
from engine.sim.report import simulate_strategy
from engine.strategy import check_strategy
from engine.taskgraph import OFFLOAD, TaskGraphBuilder

LAYERS = 6
CFG = GPTConfig(LAYERS, 1024, 8, 2048, 4096, 8, kv_heads=8, swiglu=True, norm="rmsnorm", positions="rotary",
                bias=False, dropout=0.0, flash_attention=True, precision="bf16")
G = gpt(CFG)


def cluster(host_bw: float) -> Cluster:
    c = preset("dgx-h100:1")
    types = {n: replace(t, host_bw_bytes_per_s=host_bw) for n, t in c.device_types.items()}
    return Cluster(c.name, c.node_specs, types)


def layer_bytes(s) -> float:
    """Saved bytes of one layer on one device, per microbatch (every layer alike)."""
    saved = saved_activation_bytes(G, s)
    return float(sum(saved[i] for i, op in enumerate(G.ops) if op.block == "layers.1"))


def run(n: int, host_bw: float, micro_batch: int = 1):
    c = cluster(host_bw)
    s = build_layout(G, c, Layout(dp=8, micro_batch=micro_batch, offload_activations=n))
    return s, simulate_strategy(G, s, c)


def test_the_offloaded_layers_leave_the_device_and_fill_the_host():
    s0, r0 = run(0, 1e15)
    s4, r4 = run(4, 1e15)
    per = layer_bytes(s0)
    # with a link this fast each copy is done as its layer's forward ends: four layers fewer
    assert r0.memory.activations_peak_bytes[0] - r4.memory.activations_peak_bytes[0] == pytest.approx(4 * per, rel=1e-9)
    assert r4.memory.host_bytes[0] - r0.memory.host_bytes[0] == pytest.approx(4 * per, rel=1e-9)
    assert int(np.count_nonzero(r4.tasks.kind == OFFLOAD)) == 8 * 2 * 4 // 8  # (one representative device)


def test_a_fast_host_link_hides_the_copies_and_a_slow_one_does_not():
    base = run(0, 1e15)[1].iteration_time_s
    assert run(3, 1e15)[1].iteration_time_s == pytest.approx(base, rel=1e-9)
    slow = [run(n, 1e9)[1].iteration_time_s for n in (1, 3, 5)]
    assert base < slow[0] < slow[1] < slow[2]
    s, r = run(5, 1e9)
    # five copies out and five back, one after another on their side stream, each of one
    # layer's bytes at the link's data rate: the iteration cannot be shorter than them
    copy = layer_bytes(s) / (1e9 * CostModel().links("pcie"))
    assert r.iteration_time_s >= 10 * copy


def test_every_microbatch_offloads_and_the_host_holds_one_at_a_time():
    s, r = run(2, 1e15, micro_batch=1)
    assert s.pipeline.microbatches == 1
    s2, r2 = run(2, 1e15, micro_batch=1)
    c = cluster(1e15)
    s4 = build_layout(G, c, Layout(dp=2, micro_batch=1, offload_activations=2))
    r4 = simulate_strategy(G, s4, c)
    m = s4.pipeline.microbatches
    assert m == 4
    assert int(np.count_nonzero((r4.tasks.kind == OFFLOAD) & (r4.tasks.device == 0))) == 2 * 2 * m
    assert r4.memory.host_bytes[0] == pytest.approx(2 * layer_bytes(s4), rel=1e-9)


def test_megatron_cores_rules():
    c = cluster(1e11)
    with pytest.raises(ValueError, match="without pipeline parallelism"):
        Layout(pp=2, offload_activations=1)
    with pytest.raises(ValueError, match="without recomputation"):
        Layout(recompute="full", offload_activations=1)
    s = build_layout(G, c, Layout(dp=8, micro_batch=1))
    with pytest.raises(ValidationError, match="fewer layers than the model's 6"):
        check_strategy(replace(s, offload_activations=LAYERS), G, c)
    with pytest.raises(ValidationError, match="pipeline stages"):
        check_strategy(replace(build_layout(G, c, Layout(pp=2, micro_batch=1)), offload_activations=1), G, c)


def test_delta_simulation_rebuilds_the_copies_with_the_ops_they_read():
    c = cluster(2e9)
    s = build_layout(G, c, Layout(dp=8, micro_batch=1, offload_activations=3))
    sim = DeltaSimulator(G, s, c)
    rng = random.Random(7)
    names = [op.name for op in G.ops if op.block in ("layers.0", "layers.2", "layers.3")]
    changed = 0
    for _ in range(12):
        name = rng.choice(names)
        config = random_config(G[name], c.num_devices, rng)
        if sim.check(name, config):
            continue
        sim.change(name, config)
        changed += 1
        tg = TaskGraphBuilder(G, sim.strategy, c, CostModel()).build()
        tl = simulate(tg)
        for key in ("kind", "op", "mb", "device", "dur_s", "size_bytes", "succ_ptr", "succ_idx", "npred"):
            assert np.array_equal(getattr(sim.tasks, key), getattr(tg, key)), key
        assert np.array_equal(sim.timeline.end_s, tl.end_s)
    assert changed >= 3


def test_fused_kernels_keep_the_gate_and_up_outputs_eager_the_activation_too():
    c = preset("dgx-h100:1")
    fused = build_layout(G, c, Layout(dp=8, micro_batch=1))
    eager = build_layout(G, c, Layout(dp=8, micro_batch=1, kernels="eager"))
    act = next(op for op in G.ops if op.block == "layers.1" and op.kind == "silu")
    # one sample of 2048 tokens per rank: the SiLU's output, ffn wide, in bf16
    want = 2048 * act.out_tensors[0].shape[-1] * 2
    assert layer_bytes(eager) - layer_bytes(fused) == want
    glu = next(op for op in G.ops if op.block == "layers.1" and op.kind == "mul")
    saved = saved_activation_bytes(G, fused)
    assert saved[G.index[glu.name]] == want  # the up projection's output only
