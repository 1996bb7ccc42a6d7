"""The memory model: parameters, gradients and optimizer state per device under every ZeRO
stage, communication buffers, activations over the simulated timeline, and the feasibility
that every search's pricing reads."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cluster import preset
from engine.formats import resolve_model
from engine.report import simulate_strategy
from engine.memory import memory_report, optimizer_bytes_per_param
from engine.search.baselines import data_parallel, megatron
from engine.simulate import simulate
from engine.taskgraph import build_task_graph
from toys import IDEAL, mlp, toy_cluster


class TestMemory:
    def test_static_memory_of_data_parallel(self):
        g = mlp(bias=True)
        c = toy_cluster()
        r = simulate_strategy(g, data_parallel(g, c), c, IDEAL)
        params = 2 * (1000 * 1000 + 1000)
        assert r.memory.weights_bytes.tolist() == [params * 4] * 2
        assert r.memory.optimizer_bytes.tolist() == [params * 8] * 2  # fp32 Adam: two moments
        # each fc saves its input half-batch (2 x 1000 fp32) until its backward ends
        assert r.memory.activations_peak_bytes.tolist() == [2 * 2 * 1000 * 4] * 2

    def test_zero_shards(self):
        g = mlp(bias=True)
        c = toy_cluster()
        s = data_parallel(g, c)
        from dataclasses import replace

        r = simulate_strategy(g, replace(s, zero_stage=3), c, IDEAL)
        params = 2 * (1000 * 1000 + 1000)
        assert r.memory.weights_bytes.tolist() == [params * 4 / 2] * 2
        assert r.memory.grads_bytes.tolist() == [params * 4 / 2] * 2
        assert r.memory.optimizer_bytes.tolist() == [params * 8 / 2] * 2

    def test_infeasible_strategy_names_the_device(self):
        g = resolve_model("llama2-7b")
        c = preset("dgx-a100-40gb:1")
        r = simulate_strategy(g, data_parallel(g, c), c)
        assert not r.memory.feasible
        over = r.memory.over_capacity()
        assert len(over) == 8 and over[0][1] > 50e9  # 16 bytes/param of 6.7B params alone is 108 GB
        assert r.summary()["over_capacity"][0]["device"] == over[0][0]

    def test_one_f_one_b_holds_fewer_activations_than_gpipe(self):
        g = resolve_model("gpt2")
        c = preset("dgx-a100-80gb:1")
        a = simulate_strategy(g, megatron(g, c, tp=1, pp=4, micro_batch=1, schedule="1f1b"), c).memory
        b = simulate_strategy(g, megatron(g, c, tp=1, pp=4, micro_batch=1, schedule="gpipe"), c).memory
        assert a.activations_peak_bytes[4] < b.activations_peak_bytes[4]

    def test_full_recompute_saves_activations(self):
        g = resolve_model("gpt2")
        c = preset("dgx-a100-80gb:1")
        none = simulate_strategy(g, megatron(g, c, tp=2, micro_batch=1), c)
        full = simulate_strategy(g, megatron(g, c, tp=2, micro_batch=1, recompute="full"), c)
        assert full.memory.activations_peak_bytes.max() < none.memory.activations_peak_bytes.max() / 5
        assert full.iteration_time_s > none.iteration_time_s


class TestOptimizerState:
    @pytest.mark.parametrize("precision, want", [("fp32", 8), ("fp16", 12), ("bf16", 12)])
    def test_adam_bytes_per_parameter(self, precision, want):
        """Two fp32 moments, plus an fp32 master copy under mixed precision."""
        assert optimizer_bytes_per_param(precision) == want


@pytest.fixture(scope="module")
def symmetric_reports():
    """Memory of AlexNet data parallel on two DGX nodes, simulated with symmetry and without."""
    g, c = resolve_model("alexnet"), preset("dgx-a100-80gb:2")
    s = data_parallel(g, c)
    sym = build_task_graph(g, s, c)
    full = build_task_graph(g, s, c, symmetry="off")
    assert sym.info["symmetry"] is not None
    return (memory_report(g, s, c, simulate(sym)), memory_report(g, s, c, simulate(full)),
            sym.info["device_image"])


class TestSymmetricCurves:
    @pytest.fixture
    def reports(self, symmetric_reports):
        return symmetric_reports

    def test_a_mirrored_device_has_its_own_curve(self, reports):
        """Made on demand from its representative's: equal to simulating every device."""
        sym, full, image = reports
        mirrored = [d for d in range(len(image)) if image[d] != d]
        assert mirrored and len(sym.curves) == len(full.curves) == len(image)
        for d in mirrored[:3] + [-1]:
            (t_s, b_s), (t_f, b_f) = sym.curves[d], full.curves[d]
            np.testing.assert_allclose(t_s, t_f, rtol=1e-12)
            np.testing.assert_allclose(b_s, b_f, rtol=1e-12)
        assert [len(x[0]) for x in sym.curves[:2]] == [len(x[0]) for x in full.curves[:2]]
        np.testing.assert_allclose(sym.peak_bytes, full.peak_bytes, rtol=1e-12)
        with pytest.raises(IndexError):
            sym.curves[len(image)]


def test_the_per_graph_cache_lives_beside_the_graph_not_inside_it():
    """Regression (issue 11): the memory model kept its cache in the graph's __dict__."""
    import gc
    import weakref

    from engine import memory

    g = mlp()
    c = toy_cluster()
    simulate_strategy(g, data_parallel(g, c), c, IDEAL)
    assert "_memory_cache" not in vars(g) and g in memory._CACHES
    ref = weakref.ref(g)
    del g
    gc.collect()
    assert ref() is None  # the cache does not keep a graph alive


class TestKorthikantiActivations:
    """Activations one transformer layer keeps per microbatch, against Korthikanti et al.
    2022 (Table 2), in units of s*b*h bytes (fp16): no recomputation
    ``10 + 24/t + 5as/(ht)``; with sequence parallelism ``34/t + 5as/(ht)``; selective
    recomputation with sequence parallelism ``34/t``; full recomputation ``2``."""

    S, H, A = 2048, 12288, 96  # GPT-3 175B's layer

    def layer_bytes(self, tp, sp, recompute):
        from engine.memory import saved_activation_bytes
        from engine.models.transformer import GPTConfig, gpt

        g = gpt(GPTConfig(2, self.H, self.A, self.S, 51200, 1, precision="fp16", dropout=0.1, name="k"))
        c = preset("dgx-a100-80gb:1")
        s = megatron(g, c, tp=tp, pp=1, dp=1, micro_batch=1, recompute=recompute, sequence_parallel=sp)
        saved = saved_activation_bytes(g, s)
        return sum(saved[i] for i, op in enumerate(g.ops) if op.block == "layers.1") / (self.S * self.H)

    @pytest.mark.parametrize("tp", [1, 2, 8])
    def test_no_recomputation(self, tp):
        assert self.layer_bytes(tp, False, "none") == pytest.approx(10 + 24 / tp + 5 * self.A * self.S / (self.H * tp))

    @pytest.mark.parametrize("tp", [2, 8])
    def test_sequence_parallel(self, tp):
        assert self.layer_bytes(tp, True, "none") == pytest.approx(34 / tp + 5 * self.A * self.S / (self.H * tp))

    @pytest.mark.parametrize("tp", [2, 8])
    def test_selective_with_sequence_parallel(self, tp):
        assert self.layer_bytes(tp, True, "selective") == pytest.approx(34 / tp)

    def test_full_recomputation_keeps_the_layer_input(self):
        assert self.layer_bytes(8, False, "full") == pytest.approx(2)
