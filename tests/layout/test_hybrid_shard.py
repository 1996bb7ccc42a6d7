"""Hybrid sharding (PyTorch FSDP's HYBRID_SHARD, MiCS): ZeRO-2/3 shards within groups of k
data-parallel ranks and replicates across the groups."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.cluster import preset
from engine.sim.memory import memory_report
from engine.models.transformer import gpt2
from engine.layout import Layout, fsdp
from engine.sim.full import simulate
from engine.strategy import strategy_from_dict, validate_strategy
from engine.taskgraph import build_task_graph
from engine.taskgraph.tasks import COLL, COLL_INDEX


@pytest.fixture(scope="module")
def case():
    return gpt2(batch=64, seq_len=512), preset("dgx-a100-80gb:4")


def group_sizes(tg, kind):
    ptr, _, tasks = tg.info["coll_devices"]
    sel = set(np.flatnonzero((tg.kind == COLL) & (tg.coll == COLL_INDEX[kind])).tolist())
    return {int(ptr[i + 1] - ptr[i]) for i, t in enumerate(tasks) if int(t) in sel}


@pytest.mark.parametrize("zero", [2, 3])
def test_shards_within_nodes_and_all_reduces_across(case, zero):
    g, c = case
    s = fsdp(g, c, Layout(zero_stage=zero, micro_batch=2, shard_group=8))
    tg = build_task_graph(g, s, c, symmetry="off")
    assert group_sizes(tg, "reduce_scatter") == {8}  # inside a node
    assert group_sizes(tg, "all_reduce") == {4}  # one rank of each of the 4 nodes
    gathers = group_sizes(tg, "all_gather")
    assert gathers == {8}
    sym = build_task_graph(g, s, c)
    a, b = simulate(sym), simulate(tg)
    assert a.makespan_s == pytest.approx(b.makespan_s, rel=1e-12) and a.comm_bytes == pytest.approx(b.comm_bytes)


def test_optimizer_state_is_sharded_over_the_group_only(case):
    g, c = case
    full = fsdp(g, c, Layout(zero_stage=3, micro_batch=2))
    hybrid = fsdp(g, c, Layout(zero_stage=3, micro_batch=2, shard_group=8))
    mf = memory_report(g, full, c, simulate(build_task_graph(g, full, c)))
    mh = memory_report(g, hybrid, c, simulate(build_task_graph(g, hybrid, c)))
    assert mh.optimizer_bytes[0] == pytest.approx(4 * mf.optimizer_bytes[0], rel=1e-9)  # 32 ranks -> 8
    assert mh.weights_bytes[0] == pytest.approx(4 * mf.weights_bytes[0], rel=1e-9)


def test_checked_and_round_tripped(case):
    g, c = case
    s = fsdp(g, c, Layout(zero_stage=3, micro_batch=2, shard_group=8))
    assert s.to_dict()["shard_group"] == 8 and strategy_from_dict(s.to_dict()).shard_group == 8
    assert "shard_group" not in fsdp(g, c, Layout(zero_stage=3, micro_batch=2)).to_dict()
    problems = validate_strategy(replace(s, shard_group=5), g, c)
    assert [p.path for p in problems] == ["shard_group"] and "5 does not divide the 32" in problems[0].message
    assert "needs ZeRO stage 2 or 3" in validate_strategy(replace(s, zero_stage=1), g, c)[0].message
    with pytest.raises(ValueError, match="needs ZeRO stage 2 or 3"):
        fsdp(g, c, Layout(zero_stage=1, shard_group=8))


def test_cli_shard_group(tmp_path, capsys):
    import json

    from engine.cli import main

    out = tmp_path / "s.json"
    assert main(["baseline", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--kind", "fsdp", "--shard-group", "4",
                 "-o", str(out)]) == 0
    assert json.loads(out.read_text())["shard_group"] == 4
    capsys.readouterr()
    assert main(["baseline", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--kind", "fsdp", "--zero-stage", "1",
                 "--shard-group", "4", "-o", str(tmp_path / "t.json")]) == 2
    assert "needs ZeRO stage 2 or 3" in capsys.readouterr().err
