"""The memory model: parameters, gradients and optimizer state per device under every ZeRO
stage, communication buffers, activations over the simulated timeline, and the feasibility
that every search's pricing reads."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cluster import preset
from engine.formats import resolve_model
from engine.sim.report import simulate_strategy
from engine.sim.memory import memory_report
from engine.sim.memory_static import optimizer_bytes_per_param
from engine.search.baselines import data_parallel
from engine.sim.full import simulate
from engine.taskgraph import build_task_graph
from toys import IDEAL, mlp, toy_cluster
from engine.layout import Layout, build_layout
from engine.layout.build import fsdp
from dataclasses import replace


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
        a = simulate_strategy(g, build_layout(g, c, Layout(tp=1, pp=4, micro_batch=1, schedule="1f1b")), c).memory
        b = simulate_strategy(g, build_layout(g, c, Layout(tp=1, pp=4, micro_batch=1, schedule="gpipe")), c).memory
        assert a.activations_peak_bytes[4] < b.activations_peak_bytes[4]

    def test_full_recompute_saves_activations(self):
        g = resolve_model("gpt2")
        c = preset("dgx-a100-80gb:1")
        none = simulate_strategy(g, build_layout(g, c, Layout(tp=2, micro_batch=1)), c)
        full = simulate_strategy(g, build_layout(g, c, Layout(tp=2, micro_batch=1, recompute="full")), c)
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

    from engine.sim import memory_static as memory  # (the cache lives with the static memory model)

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

    def layer_bytes(self, tp, sp, recompute, dropout=0.1):
        from engine.sim.memory import saved_activation_bytes
        from engine.models.transformer import GPTConfig, gpt

        g = gpt(GPTConfig(2, self.H, self.A, self.S, 51200, 1, precision="fp16", dropout=dropout, name="k"))
        c = preset("dgx-a100-80gb:1")
        s = build_layout(g, c, Layout(tp=tp, pp=1, dp=1, micro_batch=1, recompute=recompute, sequence_parallel=sp))
        saved = saved_activation_bytes(g, s)
        return sum(saved[i] for i, op in enumerate(g.ops) if op.block == "layers.1") / (self.S * self.H)

    @pytest.mark.parametrize("tp", [1, 2, 8])
    def test_no_recomputation(self, tp):
        assert self.layer_bytes(tp, False, "none") == pytest.approx(10 + 24 / tp + 5 * self.A * self.S / (self.H * tp))

    @pytest.mark.parametrize("tp", [1, 2, 8])
    def test_no_dropout_keeps_the_probabilities_once(self, tp):
        """Without dropout the softmax's output is what the matmul with the values reads: one
        tensor (2as/(ht)), kept for both backwards; no masks (the two residual ones, 2)."""
        assert self.layer_bytes(tp, False, "none", dropout=0.0) == pytest.approx(
            8 + 24 / tp + 2 * self.A * self.S / (self.H * tp))

    @pytest.mark.parametrize("tp", [2, 8])
    def test_sequence_parallel(self, tp):
        assert self.layer_bytes(tp, True, "none") == pytest.approx(34 / tp + 5 * self.A * self.S / (self.H * tp))

    @pytest.mark.parametrize("tp", [2, 8])
    def test_selective_with_sequence_parallel(self, tp):
        assert self.layer_bytes(tp, True, "selective") == pytest.approx(34 / tp)

    def test_full_recomputation_keeps_the_layer_input(self):
        assert self.layer_bytes(8, False, "full") == pytest.approx(2)


# --------------------------------------------------------------------------- issue 25


def _gpt2_tp4_dp2_sp_zero1():
    g = resolve_model("gpt2")  # fp32, tied embeddings, vocab 50257 (not split by tp 4)
    c = preset("dgx-a100-80gb:1")
    s = build_layout(g, c, Layout(tp=4, dp=2, sequence_parallel=True, zero_stage=1))
    return g, c, s


class TestZeroShardsEachParameterOverItsOwnGroup:
    """Regression (issue 25): ZeRO's shard divisor was one per device, the largest replication
    of any parameter it held. Under tp + sequence parallelism the LayerNorms and the embedding
    are replicated over tp x dp, so every parameter's optimizer state was divided by 8."""

    def test_gpt2_tp4_dp2_sequence_parallel_zero1(self):
        g, c, s = _gpt2_tp4_dp2_sp_zero1()
        mem = simulate_strategy(g, s, c).memory
        # Per device, by hand (fp32: weights 4 B, Adam 8 B per parameter):
        #  tensor-split (tp 4), replicated over dp 2 only (sample): per layer the 7,077,888
        #  linear weights / 4, the qkv (2,304) and fc1 (3,072) biases / 4, the proj and fc2
        #  biases (768 + 768) whole:  12 x 1,772,352 = T = 21,268,224
        #  replicated over sample x length (2 x 4, sequence parallel): token embedding
        #  38,597,376 + positions 786,432 + 25 LayerNorms x 1,536 = R = 39,422,208
        T, R = 21_268_224, 39_422_208
        assert mem.weights_bytes.tolist() == [4 * (T + R)] * 8  # 242,761,728
        # ZeRO-1 shards each over its own data-parallel group: dp 2 for both. The replicated
        # ones are held by tp x dp ranks under sequence parallelism, but their length split is
        # the tensor-parallel ranks' (one shard per tp rank), as Megatron's distributed
        # optimizer and FSDP2's dp mesh dimension shard them: T / 2 + R / 2
        assert mem.optimizer_bytes.tolist() == [8 * (T + R) / 2] * 8  # 242,761,728 (issue 25's figure)
        # (before the fix: 8 (T + R) / 8 = 60,690,432: one divisor per device, tp x dp)

    def test_llama2_7b_tp8_pp2_sequence_parallel_zero1(self):
        """Issue 25's second case: 0.63 GB per device before the fix, 5.06 GB after (the
        6.74 B parameters x 12 bytes of bf16 Adam state over tp 8 x pp 2 ranks, one shard of
        dp 1: nothing to shard over)."""
        from engine.models.transformer import llama2_7b

        g, c = llama2_7b(batch=16), preset("dgx-a100-80gb:2")
        s = build_layout(g, c, Layout(tp=8, pp=2, sequence_parallel=True, zero_stage=1, micro_batch=1))
        mem = simulate_strategy(g, s, c).memory
        assert mem.optimizer_bytes.max() / 1e9 == pytest.approx(5.06, abs=0.005)

    def test_memory_agrees_with_the_optimizer_step(self):
        """The optimizer bytes per device are the update task's parameters x 8 (fp32 Adam):
        the step's duration is params x bytes / (bandwidth x efficiency) + overhead."""
        from engine.costs import CostModel
        from engine.taskgraph import UPDATE

        g, c, s = _gpt2_tp4_dp2_sp_zero1()
        cost = CostModel()
        tg = build_task_graph(g, s, c, cost, symmetry="off")
        mem = memory_report(g, s, c, simulate(tg))
        up = np.nonzero(tg.kind == UPDATE)[0]
        bw = c.device_type(0).mem_bw_bytes_per_s * cost.memory_efficiency
        params = (tg.dur_s[up] - cost.kernel_overhead_s) * bw / cost.optimizer_bytes_per_param
        np.testing.assert_allclose(mem.optimizer_bytes[tg.device[up]], params * 8, rtol=1e-9)


class TestBytesPerParameter:
    @pytest.mark.parametrize("precision, zero, want", [
        ("bf16", 0, 18), ("fp16", 0, 20), ("fp32", 0, 16), ("bf16", 3, 16), ("fp16", 3, 16)])
    def test_megatron_and_fsdp2_totals(self, precision, zero, want):
        """Megatron-Core's distributed-optimizer table (18 / 20 / 16 bytes unsharded) and
        FSDP2's fp32 sharded parameters, gradients and moments (16)."""
        from engine.sim.memory_static import state_bytes_per_param

        assert sum(state_bytes_per_param(precision, zero)) == want

    def test_bf16_gradients_are_fp32(self):
        from engine.models.transformer import GPTConfig, gpt

        g = gpt(GPTConfig(layers=2, hidden=64, heads=4, seq_len=32, vocab=128, batch=8, precision="bf16"))
        c = preset("dgx-a100-80gb:1")
        mem = simulate_strategy(g, build_layout(g, c, Layout(tp=1, dp=8)), c).memory
        np.testing.assert_array_equal(mem.grads_bytes, 2 * mem.weights_bytes)


class TestOptimizerStateDtypes:
    """What the optimizer keeps per parameter (issue 42): fp32 master and moments (18 bytes with
    Megatron-Core's fp32 gradient buffer), the moments in bf16 (14), or no master copy at all
    (8: parameter, gradient and two moments in bf16, KempnerForge's model cast to bf16)."""

    @pytest.mark.parametrize("state, zero, want", [
        ("fp32", 0, (2, 4, 0, 12)), ("bf16-moments", 0, (2, 4, 0, 8)), ("bf16", 0, (2, 2, 0, 4)),
        ("fp32", 3, (4, 4, 0, 8)), ("bf16-moments", 3, (4, 4, 0, 4)), ("bf16", 3, (2, 2, 0, 4))])
    def test_bytes_per_parameter(self, state, zero, want):
        from engine.sim.memory_static import state_bytes_per_param

        assert state_bytes_per_param("bf16", zero, optimizer_state=state) == want

    @pytest.mark.parametrize("zero", [0, 1, 3])
    def test_each_device_holds_what_its_parameters_need(self, zero):
        g = _small_gpt()
        c = preset("dgx-a100-80gb:1")
        lay = Layout(zero_stage=zero) if zero == 3 else Layout(dp=8, zero_stage=zero)
        base = simulate_strategy(g, fsdp(g, c, lay) if zero == 3 else build_layout(g, c, lay), c).memory
        for state, (w, gr, o) in {"bf16-moments": (None, None, 8 if zero < 3 else 4), "bf16": (2, 2, 4)}.items():
            lay2 = replace(lay, optimizer_state=state)
            mem = simulate_strategy(g, fsdp(g, c, lay2) if zero == 3 else build_layout(g, c, lay2), c).memory
            held = base.optimizer_bytes / (12 if zero < 3 else 8)  # the parameters whose state a device keeps
            np.testing.assert_allclose(mem.optimizer_bytes, held * o, rtol=1e-12)
            if state == "bf16":
                shard = base.weights_bytes / (2 if zero < 3 else 4)  # the parameters a device holds
                np.testing.assert_allclose(mem.weights_bytes, shard * w, rtol=1e-12)
                grads = base.grads_bytes / 4  # fp32 gradients (sharded from ZeRO-2 on)
                np.testing.assert_allclose(mem.grads_bytes, grads * gr, rtol=1e-12)

    def test_the_step_reads_and_writes_fewer_bytes(self):
        from engine.cluster import DEVICE_TYPES
        from engine.costs import CostModel

        cost, a100 = CostModel(kernel_overhead_s=0.0), DEVICE_TYPES["A100-SXM4-80GB"]
        t = {s: cost.optimizer_time_s(1e9, a100, s) for s in ("fp32", "bf16-moments", "bf16")}
        assert t["fp32"] / t["bf16-moments"] == pytest.approx(30 / 22) and t["fp32"] / t["bf16"] == pytest.approx(30 / 14)

    def test_refused_where_it_does_not_apply(self):
        from engine.strategy import validate_strategy

        g32, c = _small_gpt("fp32"), preset("dgx-a100-80gb:1")
        problems = validate_strategy(replace(build_layout(g32, c, Layout(dp=8)), optimizer_state="bf16"), g32, c)
        assert any(p.path == "optimizer_state" and "half-precision model" in p.message for p in problems)
        g16 = _small_gpt("fp16")
        problems = validate_strategy(replace(build_layout(g16, c, Layout(dp=8)), optimizer_state="bf16"), g16, c)
        assert any(p.path == "optimizer_state" and "needs a bf16 model" in p.message for p in problems)
        with pytest.raises(ValueError, match="offloaded optimizer keeps fp32 state"):
            Layout(zero_stage=1, offload_optimizer="cpu", optimizer_state="bf16")


def _small_gpt(precision="bf16"):
    from engine.models.transformer import GPTConfig, gpt

    return gpt(GPTConfig(layers=2, hidden=64, heads=4, seq_len=32, vocab=128, batch=16, precision=precision))


class TestBreakdown:
    """Issue 25: the parts of a device's memory sum to its peak, whatever the layout."""

    from hypothesis import given, settings, strategies as st

    @settings(max_examples=12, deadline=None, derandomize=True)
    @given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.sampled_from([0, 1, 2, 3]), st.booleans(),
           st.sampled_from(["none", "selective", "full", "selective-op"]), st.sampled_from(["fp32", "bf16"]), st.booleans())
    def test_parts_sum_to_the_peak(self, tp, pp, zero, sp, recompute, precision, two_nodes):
        from engine.layout.build import fsdp

        g = _small_gpt(precision)
        c = preset("dgx-a100-80gb:2" if two_nodes else "dgx-a100-80gb:1")
        if zero == 3:
            s = fsdp(g, c, Layout(zero_stage=3, tp=tp, recompute=recompute))
        else:
            s = build_layout(g, c, Layout(tp=tp, pp=pp, micro_batch=1 if pp > 1 else None, zero_stage=zero,
                                          sequence_parallel=sp and tp > 1, recompute=recompute))
        mem = simulate_strategy(g, s, c).memory
        for d in range(c.num_devices):
            parts = mem.breakdown(d)
            assert list(parts)[:5] == ["weights", "gradients", "optimizer state", "communication buffers",
                                       "activations"]
            assert sum(parts.values()) == mem.peak_bytes[d]  # exactly
            assert mem.allocated_peak_bytes[d] <= mem.reserved_peak_bytes[d] <= mem.peak_bytes[d]
        assert mem.reserved_peak_bytes + mem.context_bytes == pytest.approx(mem.peak_bytes, rel=1e-12)

    def test_reserved_is_allocated_plus_the_stated_fragmentation(self):
        from engine.sim.memory_static import FRAGMENTATION_FRACTION

        g = _small_gpt()
        c = preset("dgx-a100-80gb:1")
        mem = simulate_strategy(g, build_layout(g, c, Layout(tp=2)), c).memory
        np.testing.assert_allclose(mem.reserved_peak_bytes, mem.allocated_peak_bytes * (1 + FRAGMENTATION_FRACTION),
                                   rtol=1e-12)

    def test_logits_in_fp32_on_the_loss_devices(self):
        """batch x seq x vocab x 4 bytes per microbatch, split like the loss."""
        g = _small_gpt()
        c = preset("dgx-a100-80gb:1")
        mem = simulate_strategy(g, build_layout(g, c, Layout(tp=1, dp=8)), c).memory
        assert mem.logits_bytes.tolist() == [16 // 8 * 32 * 128 * 4] * 8

    def test_zero3_counts_the_unit_in_use_and_the_prefetched_one(self):
        from engine.layout.build import fsdp

        g = _small_gpt()
        c = preset("dgx-a100-80gb:1")
        mem = simulate_strategy(g, fsdp(g, c, Layout(zero_stage=3)), c).memory
        # the largest unit is the embedding (128 x 64 tied + 32 x 64 positions, one block)
        # or a layer: 12 x 64^2 + 13 x 64 (biases, LayerNorms) = 49,984 parameters
        layer = 12 * 64 * 64 + 13 * 64
        assert mem.gathered_bytes.tolist() == [2 * max(layer, 128 * 64 + 32 * 64) * 2] * 8

    def test_the_cli_prints_every_part(self):
        from engine.sim.report import format_summary

        g = _small_gpt()
        c = preset("dgx-a100-80gb:1")
        r = simulate_strategy(g, build_layout(g, c, Layout(tp=2, zero_stage=1)), c)
        text = format_summary(r)
        line = next(ln for ln in text.splitlines() if "peak memory" in ln)
        for name in ("weights", "gradients", "optimizer state", "communication buffers", "activations",
                     "allocator fragmentation", "CUDA context and NCCL"):
            assert name in line
        assert "max_memory_allocated" in text and "max_memory_reserved" in text


@pytest.mark.parametrize("zero", [0, 3])
def test_static_memory_kept_per_op_follows_each_change(zero):
    """``static_memory`` keeps each op's arrays for its config object: after random one-op
    changes (as a search makes them) it equals the same computation on a fresh copy of the
    graph, which has nothing kept."""
    import random
    from dataclasses import replace

    from engine.sim.memory_static import static_memory
    from engine.search.chains import random_config
    from engine.strategy import validate_strategy

    g, c = resolve_model("gpt2", batch=8, seq_len=128), preset("dgx-a100-80gb:1")
    s = build_layout(g, c, Layout(tp=2, zero_stage=zero)) if zero < 3 else data_parallel(g, c)
    if zero == 3:
        s = replace(s, zero_stage=3)
    rng = random.Random(7)
    ops = [op for op in g.ops if op.param_count]
    changed = 0
    for _ in range(12):
        op = rng.choice(ops)
        cand = replace(s, configs={**s.configs, op.name: random_config(op, c.num_devices, rng)})
        if validate_strategy(cand, g, c):
            continue
        s, changed = cand, changed + 1
        tg = build_task_graph(g, s, c)
        kept = static_memory(g, s, c, tg)
        fresh = static_memory(resolve_model("gpt2", batch=8, seq_len=128), s, c, tg)
        for part in ("weights", "grads", "optim", "gathered"):
            assert np.array_equal(getattr(kept, part), getattr(fresh, part)), part
    assert changed >= 3


class TestUnshardedAccumulation:
    """FSDP's no_sync (issue 42): the microbatches before the last keep whole gradients, upcast
    to FSDP2's reduce dtype (torch's ``FSDPParam.to_accumulated_grad_if_needed``): 4 bytes a
    parameter with ``grad_reduce_in_fp32``, the model's 2 without; ZeRO-2 (torchtitan's
    pipelines) as well as ZeRO-3."""

    @pytest.mark.parametrize("zero, fp32, per", [(3, True, 4), (3, False, 2), (2, True, 4), (2, False, 2)])
    def test_a_whole_gradient_buffer_in_the_reduce_dtype(self, zero, fp32, per):
        g = _small_gpt()
        c = preset("dgx-a100-80gb:1")
        lay = Layout(zero_stage=zero, micro_batch=1)
        s = replace(fsdp(g, c, lay), grad_reduce_in_fp32=fp32)
        base = simulate_strategy(g, s, c).memory
        mem = simulate_strategy(g, replace(s, accumulate_unsharded=True), c).memory
        params = g.param_count  # one GPU-sized model on every device: dp 8, nothing split
        np.testing.assert_allclose(mem.grads_bytes - base.grads_bytes, params * per, rtol=1e-12)

    def test_one_microbatch_accumulates_nothing(self):
        g = _small_gpt()
        c = preset("dgx-a100-80gb:1")
        lay = Layout(zero_stage=2, micro_batch=2)
        base = simulate_strategy(g, fsdp(g, c, lay), c).memory
        mem = simulate_strategy(g, fsdp(g, c, replace(lay, accumulate_unsharded=True)), c).memory
        np.testing.assert_array_equal(mem.grads_bytes, base.grads_bytes)

    def test_refused_below_zero_2(self):
        with pytest.raises(ValueError, match="applies to ZeRO-2 and ZeRO-3, got zero_stage 1"):
            Layout(zero_stage=1, accumulate_unsharded=True)


class TestFp8Libraries:
    """What an fp8 linear layer keeps (issue 42): Transformer Engine its input in fp8 (1 byte an
    element) and its weights' fp8 copies and transposes between microbatches; torchao's
    Float8Linear the high-precision input (``save_for_backward(input_hp, weight_hp_t)``) and no
    fp8 weight: a bf16 run's activations and weights."""

    def _mem(self, **kw):
        from engine.models.transformer import GPTConfig, gpt

        g = gpt(GPTConfig(2, 1024, 16, 512, 8192, 8, precision="bf16", dropout=0.0, swiglu=True, norm="rmsnorm",
                          positions="rotary", bias=False, tie_embeddings=False, flash_attention=True))
        c = preset("dgx-h100:1")
        from engine.sim.memory import saved_activation_bytes
        s = build_layout(g, c, Layout(tp=1, dp=8, micro_batch=1, **kw))
        return g, saved_activation_bytes(g, s), simulate_strategy(g, s, c).memory

    def test_torchao_keeps_what_a_bf16_run_keeps(self):
        g, bf16, mem16 = self._mem()
        _, te, mem_te = self._mem(fp8=True)
        _, tao, mem_tao = self._mem(fp8=True, fp8_library="torchao")
        lin = [i for i, op in enumerate(g.ops) if op.kind == "linear" and op.block == "layers.1"]
        assert all(te[i] == bf16[i] / 2 for i in lin if bf16[i])  # fp8 inputs: half the bf16 bytes
        np.testing.assert_array_equal(tao, bf16)
        np.testing.assert_array_equal(mem_tao.weights_bytes, mem16.weights_bytes)
        assert (mem_te.weights_bytes > mem16.weights_bytes).all()  # Transformer Engine's fp8 weight cache

    def test_refused_without_fp8(self):
        from engine.strategy import validate_strategy

        g, _, _ = self._mem()
        c = preset("dgx-h100:1")
        s = replace(build_layout(g, c, Layout(tp=1, dp=8, micro_batch=1)), fp8_library="torchao")
        assert any(p.path == "fp8_library" and "set fp8 too" in p.message for p in validate_strategy(s, g, c))


@pytest.mark.parametrize("model, cluster, options, symmetry", [
    ("gpt2", "dgx-a100-80gb:2", dict(tp=2, pp=2), "auto"),
    ("gpt2", "dgx-a100-80gb:2", dict(tp=2, pp=2), "off"),
    ("gpt2", "dgx-a100-80gb:2", dict(tp=4, sequence_parallel=True), "off"),
    ("mixtral-8x7b", "dgx-h100:4", dict(tp=2, ep=8, zero_stage=1, sequence_parallel=True), "auto"),
])
def test_each_gpu_holds_one_nccl_communicator_per_distinct_group_it_joins(model, cluster, options, symmetry):
    """The context memory's communicators, against a count made by hand from the task graph:
    every collective's members as a set, each distinct set once, one more for the pipeline's
    send and receive; a mirrored GPU counts as the one it mirrors (a symmetric build)."""
    from engine.sim.memory_static import (CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, NCCL_BYTES_PER_COMMUNICATOR,
                                          static_memory)

    g, c = resolve_model(model), preset(cluster)
    s = build_layout(g, c, Layout(**options))
    tg = build_task_graph(g, s, c, symmetry=symmetry)
    ptr, idx, _ = tg.info["coll_devices"]
    groups = {frozenset(idx[ptr[k]:ptr[k + 1]].tolist()) for k in range(ptr.size - 1) if ptr[k + 1] > ptr[k]}
    D = c.num_devices
    want = np.array([sum(d in grp for grp in groups) for d in range(D)], np.float64)
    want += 1.0 if s.pipeline.stages > 1 else 0.0
    image = tg.info.get("device_image")
    if image is not None:
        has = image >= 0
        want[has] = want[image[has]]
    st = static_memory(g, s, c, tg)
    used = np.zeros(D, bool)
    used[sorted(s.devices_used())] = True
    expect = np.where(used, CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES + want * NCCL_BYTES_PER_COMMUNICATOR, 0.0)
    assert len(groups) > 1 and want.max() >= 2
    np.testing.assert_array_equal(st.context[used], expect[used])
