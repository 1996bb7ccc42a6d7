"""Recomputation policies beside Megatron's (issue 25): torchtitan's per-op selective
activation checkpointing (``selective-op``), what it keeps and what it reruns; the
Megatron-Core precision switches the NeMo / Megatron-Bridge performance recipes set
(``grad_reduce_in_fp32``, ``fp8_params``); and the out-of-memory rule (allocated + context,
not the reserved peak)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.cluster import preset
from engine.sim.memory import saved_activation_bytes
from engine.sim.memory_static import state_bytes_per_param
from engine.models.transformer import GPTConfig, gpt
from engine.sim.report import simulate_strategy
from engine.strategy.recompute import op_checkpoint_saved, recompute_reruns
from engine.search.baselines import data_parallel
from engine.strategy import RECOMPUTE, strategy_from_dict, validate_strategy
from engine.taskgraph import BWD
from engine.layout import Layout, build_layout


def _llama(batch=4, precision="bf16"):
    """2 layers, hidden 64, 4 heads of 16 (2 key/value heads), SwiGLU 128, 32 tokens."""
    return gpt(GPTConfig(layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, seq_len=32, vocab=128, batch=batch,
                         swiglu=True, norm="rmsnorm", positions="rotary", bias=False, tie_embeddings=False,
                         dropout=0.0, flash_attention=True, precision=precision))


class TestOpCheckpointSaved:
    def test_every_second_matmul_and_the_attention_are_saved(self):
        """torchtitan's _save_list: mm outputs but every second one, the fused attention's."""
        g = _llama()
        saved = {op.name.split(".", 2)[-1] for op in g.ops if op_checkpoint_saved(g, op)}
        assert {n for n in saved} == {"attn.q", "attn.v", "attn.core", "mlp.gate", "mlp.down"}
        recomputed = {op.name for op in g.ops if op_checkpoint_saved(g, op) is False and op.block == "layers.0"}
        assert {"layers.0.attn.k", "layers.0.attn.out", "layers.0.mlp.up", "layers.0.norm1",
                "layers.0.mlp.act", "layers.0.mlp.glu"} <= recomputed

    def test_outside_the_layers_nothing_is_checkpointed(self):
        g = _llama()
        for name in ("embed.tokens", "final_norm", "lm_head", "loss"):
            assert op_checkpoint_saved(g, g[name]) is None
            assert not recompute_reruns(g, g[name], "selective-op")

    def test_fp8_linears_are_scaled_mm_and_not_saved(self):
        """torchao's float8 GEMMs are aten._scaled_mm, which the save list does not name."""
        g = _llama()
        saved = {op.name for op in g.ops if op_checkpoint_saved(g, op, fp8=True)}
        assert saved == {"layers.0.attn.core", "layers.1.attn.core"}

    def test_reruns_per_policy(self):
        g = _llama()
        q, core, norm = g["layers.0.attn.q"], g["layers.0.attn.core"], g["layers.0.norm1"]
        assert [recompute_reruns(g, op, "selective-op") for op in (q, core, norm)] == [False, False, True]
        assert [recompute_reruns(g, op, "full") for op in (q, core, norm)] == [True, True, True]
        assert [recompute_reruns(g, op, "none") for op in (q, core, norm)] == [False, False, False]
        assert not recompute_reruns(g, g["tokens"], "full")
        assert "selective-op" in RECOMPUTE


class TestSelectiveOpMemory:
    def test_saved_bytes_per_op_by_hand(self):
        """128 tokens, bf16: the layer input (64), q (64), v (32), the attention output (64)
        and its fp32 log-sum-exp (4 heads), gate (128), down (64); the head keeps what it
        keeps without recomputation."""
        g = _llama()
        c = preset("dgx-a100-80gb:1")
        s = replace(data_parallel(g, c), recompute="selective-op")
        none = saved_activation_bytes(g, replace(s, recompute="none"))
        got = saved_activation_bytes(g, s)
        idx = {op.name: i for i, op in enumerate(g.ops)}
        per = 32 * 2  # tokens per device (batch 4 x 32 over the 4 GPUs the batch divides) x 2 bytes
        want = {"norm1": 64 * per, "attn.q": 64 * per, "attn.v": 32 * per, "attn.k": 0, "attn.out": 0,
                "attn.core": 64 * per + 4 * 4 * 32, "mlp.gate": 128 * per, "mlp.up": 0, "mlp.act": 0,
                "mlp.glu": 0, "mlp.down": 64 * per}
        for layer in ("layers.0", "layers.1"):
            assert {k: got[idx[f"{layer}.{k}"]] for k in want} == want
        for name in ("final_norm", "lm_head", "loss"):
            assert got[idx[name]] == none[idx[name]]

    def test_between_full_and_selective(self):
        g = _llama(batch=16)
        c = preset("dgx-a100-80gb:1")
        act = {rc: simulate_strategy(g, build_layout(g, c, Layout(tp=1, dp=8, recompute=rc)),
                                     c).memory.activations_peak_bytes[0]
               for rc in ("none", "full", "selective-op")}
        assert act["full"] < act["selective-op"] < act["none"]

    def test_sequence_parallel_keeps_the_reduce_scattered_outputs(self):
        g = _llama()
        c = preset("dgx-a100-80gb:1")
        s = build_layout(g, c, Layout(tp=2, dp=4, recompute="selective-op", sequence_parallel=True))
        got = saved_activation_bytes(g, s)
        idx = {op.name: i for i, op in enumerate(g.ops)}
        # attn.out is recomputed (the 4th mm) but its reduce-scattered output is saved: 1 x 32 x 64 / 2 x 2 bytes
        assert got[idx["layers.0.attn.out"]] == 1 * 32 * 64 / 2 * 2


class TestSelectiveOpTime:
    def test_the_recomputed_forward_lands_in_the_backward(self):
        """Rerunning part of each block costs less than rerunning all of it."""
        g = _llama(batch=16)
        c = preset("dgx-a100-80gb:1")
        t = {}
        for rc in ("none", "selective-op", "full"):
            tl = simulate_strategy(g, build_layout(g, c, Layout(tp=1, dp=8, recompute=rc)), c).timeline
            bwd = tl.tasks.kind == BWD
            t[rc] = float((tl.end_s[bwd] - tl.start_s[bwd]).sum())  # backward compute, every device
        assert t["none"] < t["selective-op"] < t["full"]


class TestMegatronPrecisionSwitches:
    def test_bf16_gradient_buffer(self):
        """grad_reduce_in_fp32 off: 2 + 4/d bytes of gradients per parameter (Megatron-Core's
        distributed-optimizer table: as fp16, 4 + 16/d in all)."""
        assert state_bytes_per_param("bf16", 1, grad_reduce_in_fp32=False) == (2, 2, 4, 12)
        assert state_bytes_per_param("bf16", 3, grad_reduce_in_fp32=False) == (4, 4, 0, 8)  # FSDP2: unaffected
        g = _llama(batch=16)
        c = preset("dgx-a100-80gb:1")
        on = simulate_strategy(g, build_layout(g, c, Layout(tp=1, dp=8, zero_stage=1)), c).memory
        off = simulate_strategy(g, build_layout(g, c, Layout(tp=1, dp=8, zero_stage=1, grad_reduce_in_fp32=False)),
                                c).memory
        assert off.grads_bytes[0] == pytest.approx(on.grads_bytes[0] * (2 + 4 / 8) / 4)

    def test_fp8_parameters_replace_the_bf16_copy(self):
        g = _llama(batch=16)
        c = preset("dgx-h100:1")
        plain = simulate_strategy(g, build_layout(g, c, Layout(tp=1, dp=8)), c).memory.weights_bytes[0]
        cached = simulate_strategy(g, build_layout(g, c, Layout(tp=1, dp=8, fp8=True)), c).memory.weights_bytes[0]
        params8 = simulate_strategy(g, build_layout(g, c, Layout(tp=1, dp=8, fp8=True, fp8_params=True)),
                                    c).memory.weights_bytes[0]
        linear = sum(op.param_count for op in g.ops if op.kind == "linear")
        assert cached == plain + 2 * linear  # the fp8 copy and its transpose beside the bf16 weight
        assert params8 == plain  # fp8 weight + transpose in place of the bf16 weight

    def test_round_trip_and_validation(self):
        g = _llama(batch=16)
        c = preset("dgx-h100:1")
        s = build_layout(g, c, Layout(tp=1, dp=8, fp8=True, fp8_params=True, grad_reduce_in_fp32=False,
                                      recompute="selective-op"))
        d = s.to_dict()
        assert (d["fp8_params"], d["grad_reduce_in_fp32"], d["recompute"]) == (True, False, "selective-op")
        back = strategy_from_dict(d)
        assert (back.fp8_params, back.grad_reduce_in_fp32, back.recompute) == (True, False, "selective-op")
        assert "fp8_params" not in build_layout(g, c, Layout(tp=1, dp=8)).to_dict()
        problems = validate_strategy(replace(s, fp8=False), g, c)
        assert [p.path for p in problems] == ["fp8_params"]


class TestOutOfMemoryRule:
    def test_required_is_allocated_plus_context(self):
        g = _llama(batch=16)
        c = preset("dgx-a100-80gb:1")
        mem = simulate_strategy(g, build_layout(g, c, Layout(tp=2)), c).memory
        assert (mem.required_bytes == mem.allocated_peak_bytes + mem.context_bytes).all()
        assert (mem.required_bytes < mem.peak_bytes).all()

    def test_fragmentation_alone_does_not_make_it_out_of_memory(self):
        """Regression (issue 25): a run whose reserved peak exceeds capacity but whose
        allocated memory fits is feasible: the caching allocator frees its unused cached
        blocks and retries before raising OutOfMemoryError."""
        g = _llama(batch=16)
        c = preset("dgx-a100-80gb:1")
        mem = simulate_strategy(g, build_layout(g, c, Layout(tp=2)), c).memory
        mem.capacity_bytes[:] = (mem.required_bytes + mem.peak_bytes) / 2  # between the two
        assert mem.feasible and mem.over_capacity() == []
        mem.capacity_bytes[:] = mem.required_bytes * 0.99
        assert not mem.feasible and len(mem.over_capacity()) == c.num_devices
