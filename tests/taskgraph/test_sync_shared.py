"""A shared tensor (a ``param_group``): its regions are told apart by where they lie in the
tensor, not by the names of the dims that cut it, for the gradient reduction and the memory.

Where the ops sharing it cut it differently (an RNN's timesteps under different configs), every
piece is all-reduced over every device holding it, with every holder's gradient; before, a half
held by one op and the whole held by the other were reduced apart (the copies would drift), and
two ops cutting one dim 2 and 4 ways had their first half and first quarter taken as one region.
Where they cut it alike under different names (a tied embedding's ``vocab``, its output layer's
``feature``), it is one tensor: one copy a GPU and one reduction, where it was two of each.

Hand-worked cases on two linears sharing one weight [8, 8] and bias [8] (fp32), and on GPT's
tied embedding under tensor parallelism."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cluster import preset
from engine.sim.delta import DeltaSimulator
from engine.graph import GraphBuilder
from engine.search.baselines import data_parallel
from engine.sim.full import simulate
from engine.strategy import Config
from engine.taskgraph import COLL, build_task_graph
from engine.layout import Layout, build_layout


@pytest.fixture(scope="module")
def shared():
    b = GraphBuilder("shared")
    x = b.input("x", [4, 8])
    y = b.add("linear", "a", [x], out_features=8, param_group="g")
    b.add("linear", "b", [y], out_features=8, param_group="g")
    return b.build(), preset("dgx-a100-80gb:1")


def gradient_all_reduces(tg, op: int) -> list[tuple[tuple[int, ...], float]]:
    """(devices, bytes) of each per-iteration collective of ``op``'s parameter unit, sorted."""
    ptr, idx, tasks = tg.info["coll_devices"]
    return sorted((tuple(idx[ptr[k]:ptr[k + 1]].tolist()), float(tg.size_bytes[t])) for k, t in enumerate(tasks)
                  if tg.kind[t] == COLL and tg.op[t] == op and tg.mb[t] < 0)


def plan(graph, cluster, a: Config, b: Config):
    return data_parallel(graph, cluster).with_config("a", a).with_config("b", b)


def test_a_half_held_apart_is_reduced_with_the_whole(shared):
    g, c = shared
    # a: the whole tensor on GPUs 0 and 1 (data parallel); b: first half of the rows on GPU 2,
    # second half on GPU 3. Half = 4 x 8 weights + 4 biases = 36 elements = 144 bytes.
    s = plan(g, c, Config({"sample": 2}, (0, 1)), Config({"feature": 2}, (2, 3)))
    tg = build_task_graph(g, s, c)
    assert gradient_all_reduces(tg, g.index["a"]) == [((0, 1, 2), 144.0), ((0, 1, 3), 144.0)]


def test_pieces_of_different_cuts_of_one_dim(shared):
    g, c = shared
    # a cuts the rows in halves on GPUs 0, 1; b in quarters on 0-3. Quarter q is held by a's
    # partition q // 2 and b's partition q: GPUs {0}, {0, 1}, {1, 2}, {1, 3}; a quarter is
    # 2 x 8 + 2 = 18 elements = 72 bytes, and the first needs no collective.
    s = plan(g, c, Config({"feature": 2}, (0, 1)), Config({"feature": 4}, (0, 1, 2, 3)))
    tg = build_task_graph(g, s, c)
    assert gradient_all_reduces(tg, g.index["a"]) == [((0, 1), 72.0), ((1, 2), 72.0), ((1, 3), 72.0)]


def test_the_reduction_waits_for_every_holders_backward(shared):
    g, c = shared
    s = plan(g, c, Config({"sample": 2}, (0, 1)), Config({"feature": 2}, (2, 3)))
    tg = build_task_graph(g, s, c)
    pred_ptr, pred_idx = tg.pred_lists()
    ptr, idx, tasks = tg.info["coll_devices"]
    for k, t in enumerate(tasks):
        if tg.op[t] == g.index["a"] and tg.mb[t] < 0:
            preds = pred_idx[pred_ptr[t]:pred_ptr[t + 1]]
            got = sorted((int(tg.op[p]), int(tg.device[p])) for p in preds)
            holders = idx[ptr[k]:ptr[k + 1]].tolist()  # (0, 1, 2) or (0, 1, 3)
            assert got == [(g.index["a"], 0), (g.index["a"], 1), (g.index["b"], holders[2])]


def test_one_cut_everywhere_keeps_one_reduction_per_region(shared):
    g, c = shared
    # both ops cut the rows in halves, on different GPUs: each half over its two holders
    s = plan(g, c, Config({"feature": 2}, (0, 1)), Config({"feature": 2}, (2, 3)))
    tg = build_task_graph(g, s, c)
    assert gradient_all_reduces(tg, g.index["a"]) == [((0, 2), 144.0), ((1, 3), 144.0)]


@pytest.mark.parametrize("a, b, held", [
    # the whole on GPUs 0, 1 and a half on each of 2, 3
    (Config({"sample": 2}, (0, 1)), Config({"feature": 2}, (2, 3)), [72, 72, 36, 36]),
    # a half and the whole on GPUs 0 and 1: the whole, once (not 1.5 times)
    (Config({"feature": 2}, (0, 1)), Config({"sample": 2}, (0, 1)), [72, 72, 0, 0]),
    # halves and quarters: GPU 0 holds quarter 0 twice over, GPU 1 the second half and quarter 1
    (Config({"feature": 2}, (0, 1)), Config({"feature": 4}, (0, 1, 2, 3)), [36, 54, 18, 18]),
])
def test_a_gpu_holds_the_union_of_its_regions(shared, a, b, held):
    from engine.sim.memory import memory_report
    from engine.sim.memory_static import state_bytes_per_param

    g, c = shared
    s = plan(g, c, a, b)
    m = memory_report(g, s, c, simulate(build_task_graph(g, s, c)))
    w_b = state_bytes_per_param("fp32")[0]
    assert m.weights_bytes[:4].tolist() == [w_b * e for e in held]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mixed_cuts_under_delta_simulation_equal_a_full_build(seed):
    from engine.formats import resolve_model
    from engine.search.chains import random_config

    g, c = resolve_model("rnntc"), preset("p100-4x4")
    sim = DeltaSimulator(g, data_parallel(g, c), c)
    rng = __import__("random").Random(seed)
    cells = [op.name for op in g.ops if op.param_group]
    for _ in range(4):
        name = rng.choice(cells)
        cfg = random_config(g[name], c.num_devices, rng)
        if sim.check(name, cfg):
            continue
        tl = sim.change(name, cfg)
        full = simulate(build_task_graph(g, sim.strategy, c))
        assert tl.makespan_s == full.makespan_s
        np.testing.assert_array_equal(tl.start_s, full.start_s)
        sim.commit()


class TestTiedEmbedding:
    """GPT's output layer shares the token embedding's weight; under tensor parallelism both
    cut its vocabulary rows four ways (the embedding's ``vocab`` dim, the output layer's
    ``feature``: different names, one cut). With one pipeline stage, Megatron-LM's tied
    output layer reads the embedding's tensor: one copy per GPU and one gradient reduction."""

    @pytest.fixture(scope="class")
    def case(self):
        from engine.models.transformer import GPTConfig, gpt

        g = gpt(GPTConfig(layers=2, hidden=4096, heads=32, seq_len=2048, vocab=32000, batch=8,
                          precision="bf16", flash_attention=True, dropout=0.0))
        c = preset("dgx-h100:1")
        s = build_layout(g, c, Layout(tp=4, micro_batch=1))
        assert dict(s["embed.tokens"].degrees) == {"sample": 2, "vocab": 4}
        assert dict(s["lm_head"].degrees) == {"feature": 4, "sample": 2}
        return g, c, s

    def test_one_copy_a_gpu(self, case):
        from engine.sim.memory import memory_report
        from engine.sim.memory_static import state_bytes_per_param

        g, c, s = case
        m = memory_report(g, s, c, simulate(build_task_graph(g, s, c)))
        w_b = state_bytes_per_param("bf16")[0]
        held = sum(op.partition_param_elements(s[op.name].degrees) for op in g.ops
                   if op.param_count and op.name != "lm_head")  # the tied rows once: the embedding's
        assert m.weights_bytes[0] == pytest.approx(w_b * held, rel=1e-12)

    def test_one_reduction_a_slice(self, case):
        g, c, s = case
        # 32,000 / 4 rows x 4,096 bf16 = 65,536,000 bytes a slice, over its two data-parallel
        # GPUs; the tensor-parallel ranks mirror rank 0 (symmetry), so one reduction is built
        tg = build_task_graph(g, s, c)
        assert tg.info["symmetry"] is not None
        assert gradient_all_reduces(tg, g.index["embed.tokens"]) == [((0, 4), 65_536_000.0)]
