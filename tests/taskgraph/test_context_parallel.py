"""Context parallelism (cp): Megatron-Core's --context-parallel-size and torchtitan's cp, in the
megatron and fsdp baselines: the sequence split over cp ranks, keys and values exchanged,
weights replicated (and ZeRO-sharded) over dp x cp."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from engine.cluster import preset
from engine.sim.memory import memory_report
from engine.models.transformer import GPTConfig, gpt
from engine.layout.build import fsdp
from engine.sim.full import simulate
from engine.taskgraph import build_task_graph
from engine.taskgraph.tasks import COLL, COLL_INDEX
from engine.layout import Layout, build_layout


@cache
def model(flash: bool = True):
    return gpt(GPTConfig(layers=2, hidden=1024, heads=16, kv_heads=4, swiglu=True, seq_len=4096, vocab=32000,
                         batch=16, flash_attention=flash, precision="bf16", positions="rotary", bias=False,
                         norm="rmsnorm", dropout=0.0))


CLUSTER = "dgx-h100:2"


def test_ranks_are_laid_out_tp_cp_dp():
    g, c = model(), preset(CLUSTER)
    s = build_layout(g, c, Layout(tp=2, cp=2, micro_batch=1))  # dp = 16 / (2 x 2) = 4
    assert s.found_by["options"]["cp"] == 2 and s.found_by["options"]["dp"] == 4
    core = next(op for op in g.ops if op.kind == "attention")
    cfg = s.configs[core.name]
    assert dict(cfg.degrees) == {"sample": 4, "head": 2, "length": 2}
    names = [d.name for d in core.dims if cfg.degree(d.name) > 1]
    grid = np.asarray(cfg.devices).reshape([cfg.degree(n) for n in names])
    for idx in np.ndindex(grid.shape):
        c_ = dict(zip(names, idx))
        assert grid[idx] == c_["sample"] * 4 + c_["length"] * 2 + c_["head"]


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("flash", [True, False])
def test_symmetric_build_is_exact(flash, sp):
    """Context-parallel ranks gather keys and values over the cp group (a collective, as
    Megatron-Core's all-gather), so they mirror one another like tensor- and data-parallel
    ranks: every axis is kept (the norms, which split the sequence over cp x tp ranks under
    sequence parallelism, run along both the tp and the cp axis), exactly."""
    g, c = model(flash), preset(CLUSTER)
    s = build_layout(g, c, Layout(tp=2, cp=2, zero_stage=1, micro_batch=1, sequence_parallel=sp))
    tg = build_task_graph(g, s, c)
    full = build_task_graph(g, s, c, symmetry="off")
    assert tg.info["symmetry"] is not None and tg.info["symmetry"].axes == ((2, 1), (2, 2), (4, 4))
    assert tg.num_tasks < full.num_tasks / 10
    a, b = simulate(tg), simulate(full)
    assert a.makespan_s == b.makespan_s
    assert a.comm_bytes == pytest.approx(b.comm_bytes, rel=1e-12)


def test_keys_and_values_are_gathered():
    """Each cp rank's attention gets the other ranks' keys and values from one all-gather per
    tensor and microbatch over its cp group (2 ranks here), not from point-to-point transfers."""
    g, c = model(), preset(CLUSTER)
    s = build_layout(g, c, Layout(tp=2, cp=2, micro_batch=1))
    tg = build_task_graph(g, s, c, symmetry="off")
    attn = {g.index[op.name] for op in g.ops if op.kind == "attention"}
    gathers = np.flatnonzero((tg.kind == COLL) & (tg.coll == COLL_INDEX["all_gather"]) & np.isin(tg.op, list(attn)))
    ptr, idx, tasks = tg.info["coll_devices"]
    ranks = {int(t): int(ptr[i + 1] - ptr[i]) for i, t in enumerate(tasks)}
    assert gathers.size > 0 and {ranks[t] for t in gathers} == {2}


def test_activations_split_and_keys_values_move():
    g, c = model(), preset(CLUSTER)
    one = build_layout(g, c, Layout(tp=2, cp=1, dp=4, micro_batch=1))  # 8 of the 16 GPUs
    two = build_layout(g, c, Layout(tp=2, cp=2, dp=4, micro_batch=1))
    t1, t2 = simulate(build_task_graph(g, one, c)), simulate(build_task_graph(g, two, c))
    m1, m2 = memory_report(g, one, c, t1), memory_report(g, two, c, t2)
    a1, a2 = m1.activations_peak_bytes.max(), m2.activations_peak_bytes.max()
    assert 0.45 * a1 <= a2 <= 0.55 * a1  # each rank keeps half the sequence
    assert t2.comm_bytes > t1.comm_bytes  # plus the key/value exchange and wider gradient groups
    assert t2.makespan_s < t1.makespan_s  # twice the GPUs on the same batch


def test_zero_shards_over_dp_times_cp():
    g, c = model(), preset(CLUSTER)
    s = build_layout(g, c, Layout(tp=2, cp=2, zero_stage=2, micro_batch=1))
    tg = build_task_graph(g, s, c, symmetry="off")
    rs = np.flatnonzero((tg.kind == COLL) & (tg.coll == COLL_INDEX["reduce_scatter"]))
    ptr, idx, tasks = tg.info["coll_devices"]
    ranks = {int(t): int(ptr[i + 1] - ptr[i]) for i, t in enumerate(tasks)}
    # every group is a tensor-parallel rank's dp 4 x cp 2 (the norms' too: their tp replicas
    # compute the same gradients and shard over their own tp rank's group)
    assert {ranks[t] for t in rs} == {8}


def test_fsdp_takes_cp_and_errors_name_the_sequence():
    g, c = model(), preset(CLUSTER)
    s = fsdp(g, c, Layout(zero_stage=3, tp=2, cp=4, micro_batch=1))
    assert s.found_by["options"]["cp"] == 4 and s.zero_stage == 3
    with pytest.raises(ValueError, match="does not divide the sequence length 4096"):
        build_layout(g, c, Layout(tp=1, cp=3, dp=1))
    with pytest.raises(ValueError, match=r"tp x cp x pp x dp = 2 x 4 x 1 x 4 = 32 devices"):
        build_layout(g, c, Layout(tp=2, cp=4, dp=4))
