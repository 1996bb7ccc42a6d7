"""Tensor-parallel collectives that a layer's backward repeats (issue 42), each checked on
Korthikanti et al. 2022's Table 4 (one 22B layer's forward and backward, tp 8) by
benchmarks/check_layer_times.py:

* full recomputation re-executes the layer's forward, its all-reduces (or, under sequence
  parallelism, its reduce-scatters) included: 7.6 ms more backward for a 7.7 ms forward;
* under sequence parallelism a column-parallel layer keeps its input's sequence shard and
  gathers it again for its weight gradient (§4.2.2): its backward saves 0.1 ms, where the
  sharded norms and dropouts alone save ~0.9."""
from __future__ import annotations

import numpy as np
import pytest

from engine.cluster import preset
from engine.costs import CostModel
from engine.layout import Layout, build_layout
from engine.models.transformer import GPTConfig, gpt
from engine.taskgraph import build_task_graph
from engine.taskgraph.tasks import COLL, COLL_INDEX

M = 2  # microbatches


def _graph(rc: str, sp: bool):
    g = gpt(GPTConfig(3, 1024, 16, 512, 51200, 2, precision="fp16"))
    c = preset("dgx-a100-80gb:1")
    s = build_layout(g, c, Layout(tp=8, micro_batch=1, recompute=rc, sequence_parallel=sp))
    assert s.pipeline.microbatches == M
    return g, build_task_graph(g, s, c, CostModel())


def _preds(tg, task: int) -> set[int]:
    ptr, idx = tg.pred_lists()
    return set(idx[ptr[task]:ptr[task + 1]].tolist())


def _colls(g, tg, name: str, kind: str) -> np.ndarray:
    op = [op.name for op in g.ops].index(name)
    return np.nonzero((tg.kind == COLL) & (tg.op == op) & (tg.coll == COLL_INDEX[kind]))[0]


@pytest.mark.parametrize("rc, per_mb", [("none", 1), ("selective", 1), ("full", 2)])
@pytest.mark.parametrize("name", ["layers.1.attn.out", "layers.1.mlp.fc2"])
def test_full_recomputation_redoes_the_row_parallel_all_reduce(rc, per_mb, name):
    g, tg = _graph(rc, False)
    ids = _colls(g, tg, name, "all_reduce")
    assert ids.size == per_mb * M
    assert np.unique(tg.size_bytes[ids]).size == 1  # the same bytes, forward and again


def test_the_repeated_all_reduce_gates_the_backward_after_the_forward_one():
    g, tg = _graph("full", False)
    op = [op.name for op in g.ops].index("layers.1.attn.out")
    fwd, again = np.sort(_colls(g, tg, "layers.1.attn.out", "all_reduce")).reshape(2, M)
    bwd = np.nonzero((tg.kind == 1) & (tg.op == op))[0]
    for mb in range(M):
        first, second = fwd[mb], again[mb]
        assert first in _preds(tg, second)
        assert any(second in _preds(tg, b) for b in bwd if tg.mb[b] == tg.mb[second])


@pytest.mark.parametrize("rc, factor", [("none", 1), ("selective", 1), ("full", 2)])
@pytest.mark.parametrize("name", ["layers.1.attn.q", "layers.1.mlp.fc1"])
def test_sequence_parallelism_gathers_the_input_again_in_the_backward(rc, factor, name):
    """Forward: one all-gather of the norm's output; backward: one more (two with the forward
    recomputed), then the input gradient's reduce-scatter, of the same bytes."""
    g, tg = _graph(rc, True)
    gathers = _colls(g, tg, name, "all_gather")
    scatters = _colls(g, tg, name, "reduce_scatter")
    assert gathers.size == 2 * M and scatters.size == M
    full = tg.size_bytes[scatters[0]]
    assert sorted(tg.size_bytes[gathers].tolist()) == [full] * M + [factor * full] * M
    for rs in scatters:  # each reduce-scatter waits for its microbatch's second gather
        assert any(p in gathers and tg.size_bytes[p] == factor * full for p in _preds(tg, rs))


def test_without_sequence_parallelism_nothing_is_gathered_again():
    g, tg = _graph("none", False)
    assert _colls(g, tg, "layers.1.attn.q", "all_gather").size == 0
