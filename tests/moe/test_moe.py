"""Mixture-of-experts in the engine: the router and experts ops' FLOPs and parameters, the
all-to-all's volume and time, the layouts' folding, symmetry, the routing what-if and the
sample models' parameter counts (issue 26)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cluster import preset
from engine.costs.collectives import all_to_all_time_s, group_collective_time_s
from engine.costs import CostModel
from engine.graph import GraphBuilder
from engine.layout import Layout, layout_problem, resolved
from engine.models import build_sample
from engine.models.moe import MoEConfig, moe_gpt
from engine.moe import active_parameters, expert_loads, expert_split, gate_factor, rank_loads
from engine.sim.report import simulate_strategy
from engine.layout.build import build_layout
from engine.strategy import strategy_from_dict, validate_strategy
from engine.taskgraph import COLL, COLL_NAMES, XFER, TaskGraphBuilder

H, F, E, K = 16, 24, 4, 2  # hidden, expert FFN width, experts, top-k of the hand-computed layer


def small_moe(batch=16, seq=512, layers=4, experts=8, top_k=2):
    return moe_gpt(MoEConfig(layers=layers, hidden=256, heads=8, seq_len=seq, vocab=1000, batch=batch,
                             experts=experts, top_k=top_k, expert_ffn=512))


def one_layer(**attrs):
    b = GraphBuilder("m", "bf16")
    x = b.input("x", [2, 8, H], axes=["sample", "length", "feature"])
    p = b.add("router", "r", [x], num_experts=E, top_k=K)
    b.add("experts", "e", [x, p], num_experts=E, top_k=K, ffn_hidden=F, **attrs)
    return b.build()


class TestOps:
    def test_experts_flops_by_hand(self):
        g = one_layer()
        # 16 tokens x 2 copies through (16 x 48) and (24 x 16) GEMMs, 2 FLOPs a multiply-add,
        # and SwiGLU's 5 FLOPs on each of the 24 intermediate elements
        tokens = 2 * 8 * K
        assert g["e"].fwd_flops == tokens * (2 * H * 2 * F + 2 * F * H + 5 * F) == 77_568
        assert g["e"].bwd_flops == 2 * g["e"].fwd_flops

    def test_router_flops_by_hand(self):
        g = one_layer()
        assert g["r"].fwd_flops == 2 * 16 * H * E + 5 * 16 * E == 2_368
        assert g["r"].out_tensors[0].shape == (2, 8, E) and g["r"].out_tensors[0].dtype == "fp32"

    def test_parameters(self):
        g = one_layer()
        assert [p.shape for p in g["e"].params] == [(E, H, 2 * F), (E, F, H)]
        assert [p.shape for p in g["r"].params] == [(E, H)]
        biased = one_layer(bias=True)
        assert [p.shape for p in biased["e"].params][2:] == [(E, 2 * F), (E, H)]

    def test_capacity_factor_drops_compute(self):
        full, drop = one_layer(), one_layer(capacity_factor=0.5)
        assert drop["e"].fwd_flops == pytest.approx(0.5 * full["e"].fwd_flops)
        assert one_layer(capacity_factor=1.25)["e"].fwd_flops == full["e"].fwd_flops  # padding not modelled

    @pytest.mark.parametrize("degrees", [{"expert": 2}, {"expert": 2, "expert_seq": 2}, {"ffn": 2, "sample": 2},
                                         {"expert": 2, "ffn": 3, "length": 2}])
    def test_partition_flops_add_up(self, degrees):
        op = one_layer()["e"]
        parts = math.prod(degrees.values())
        assert op.partition_flops(degrees)[0] * parts == pytest.approx(op.fwd_flops)

    def test_refusals(self):
        b = GraphBuilder("m")
        x = b.input("x", [2, 8, H], axes=["sample", "length", "feature"])
        with pytest.raises(ValueError, match="top_k 5 exceeds the 4 experts"):
            b.add("router", "r", [x], num_experts=4, top_k=5)
        p = b.add("router", "r2", [x], num_experts=4, top_k=2)
        with pytest.raises(ValueError, match="router scores .* must be the tokens"):
            b.add("experts", "e", [x, p], num_experts=8, top_k=2, ffn_hidden=4)
        with pytest.raises(ValueError, match="dispatcher must be one of alltoall, allgather"):
            b.add("experts", "e", [x, p], num_experts=4, top_k=2, ffn_hidden=4, dispatcher="deepep")


class TestAllToAll:
    def test_time_by_hand(self):
        # one node of 8: 7/8 of 8 MB over 100 GB/s, NCCL's launch (8.4 us) and one NVLink step (3.4 us)
        assert all_to_all_time_s(8e6, 8, 100e9, 1e9, 0.0, 1.0) == pytest.approx(70e-6 + 8.4e-6 + 3.4e-6)
        # two nodes of 8: 8/16 of the buffer leaves the node at 1 GB/s per rank (the network step: 14 us)
        assert all_to_all_time_s(8e6, 16, 100e9, 1e9, 0.0, 1.0, nodes=2) == pytest.approx(4e-3 + 8.4e-6 + 14e-6)

    def test_group_rates_on_dgx(self):
        c = preset("dgx-h100:2")
        inside, across = c.collective_group(list(range(8))), c.collective_group(list(range(16)))
        assert across.inter_bw_bytes_per_s == pytest.approx(c.collective_group([0, 8]).inter_bw_bytes_per_s)
        assert inside.inter_bw_bytes_per_s == math.inf
        assert group_collective_time_s("all_to_all", 1e8, across) > group_collective_time_s("all_to_all", 1e8, inside)

    def test_dispatch_volume_by_hand(self):
        """Each experts op sends, per microbatch and EP rank, its tokens x top_k rows of the hidden
        size (bf16) in each of the four all-to-alls."""
        g, c = small_moe(), preset("dgx-h100:2")
        s = build_layout(g, c, Layout(ep=8))
        tg = TaskGraphBuilder(g, s, c, CostModel()).build()
        a2a = (tg.kind == COLL) & (tg.coll == COLL_NAMES.index("all_to_all"))
        # 16 samples x 512 tokens on 16 GPUs: 512 tokens a GPU, x top-2, x 256 hidden x 2 bytes
        assert set(tg.size_bytes[a2a].tolist()) == {512 * 2 * 256 * 2.0}
        # 4 layers x 4 exchanges x 2 EP groups (the builder without symmetry)
        assert a2a.sum() == 32
        names = {g.ops[o].name for o in tg.op[a2a]}
        assert names == {f"layers.{i}.mlp.experts" for i in range(4)}

    def test_no_token_moves_outside_the_dispatch(self):
        """The experts keep the tokens their device holds (ep folded onto dp, and onto the sequence
        shards under sequence parallelism): no transfers into or out of the MoE layer (sequence
        parallelism's own gathers before the attention's column-parallel GEMMs remain)."""
        g, c = small_moe(), preset("dgx-h100:2")
        for lay in (Layout(ep=8), Layout(ep=8, tp=2, sequence_parallel=True, dp=8)):
            tg = TaskGraphBuilder(g, build_layout(g, c, lay), c, CostModel()).build()
            moved = {g.ops[o].kind for o in tg.op[tg.kind == XFER]}
            assert not moved & {"router", "experts", "rmsnorm", "add"}, lay.describe()

    def test_allgather_dispatcher(self):
        b = MoEConfig(layers=2, hidden=256, heads=8, seq_len=512, vocab=1000, batch=16, experts=8, top_k=2,
                      expert_ffn=512, dispatcher="allgather")
        g, c = moe_gpt(b), preset("dgx-h100:2")
        tg = TaskGraphBuilder(g, build_layout(g, c, Layout(ep=8)), c, CostModel()).build()
        kinds = {COLL_NAMES[k] for k, o in zip(tg.coll[tg.kind == COLL], tg.op[tg.kind == COLL])
                 if g.ops[o].kind == "experts"}
        assert {"all_gather", "reduce_scatter"} <= kinds and "all_to_all" not in kinds


class TestLayouts:
    @pytest.mark.parametrize("args, want", [((2, 1, 64, 64, 1), (32, 2)), ((2, 1, 16, 32, 1), (16, 2)),
                                            ((8, 1, 8, 4, 2), (1, 4)), ((1, 1, 16, 8, 1), (8, 1)),
                                            ((1, 2, 4, 8, 1), (4, 2))])
    def test_expert_split(self, args, want):
        assert expert_split(*args) == want

    def test_expert_split_refuses(self):
        with pytest.raises(ValueError, match="does not fold onto dp 3"):
            expert_split(1, 1, 3, 2, 1)

    @pytest.mark.parametrize("lay, msg", [
        (Layout(ep=3), "ep 3 does not divide the 8 experts"),
        (Layout(tp=2, ep=2), "needs sequence parallelism"),
        (Layout(tp=2, sequence_parallel=True, ep=2, etp=4), "etp 4 must divide tp 2"),
        (Layout(dp=4, pp=4, ep=8), "ep 8 does not fold onto dp 4"),
    ])
    def test_layout_problems(self, lay, msg):
        assert msg in layout_problem(small_moe(), preset("dgx-h100:2"), lay)

    def test_expert_weights_shard_over_ep(self):
        g, c = small_moe(), preset("dgx-h100:2")
        r1 = simulate_strategy(g, build_layout(g, c, Layout()), c)
        r8 = simulate_strategy(g, build_layout(g, c, Layout(ep=8)), c)
        experts = sum(p.numel for op in g.ops if op.kind == "experts" for p in op.params)
        # bf16 weights: the experts' 2 bytes a parameter shrink to 1/8
        assert r1.memory.weights_bytes[0] - r8.memory.weights_bytes[0] == pytest.approx(2 * experts * 7 / 8)

    @pytest.mark.parametrize("lay", [Layout(ep=8), Layout(tp=2, sequence_parallel=True, ep=8),
                                     Layout(tp=2, sequence_parallel=True, ep=4, etp=2),
                                     Layout(ep=8, dp=8, pp=2, micro_batch=1),
                                     Layout(ep=4, tp=2, sequence_parallel=True, dp=4, pp=2, micro_batch=1,
                                            zero_stage=1)])
    def test_symmetry_is_exact(self, lay):
        g, c = small_moe(), preset("dgx-h100:2")
        s = build_layout(g, c, lay)
        a, b = simulate_strategy(g, s, c), simulate_strategy(g, s, c, symmetry="off")
        assert a.iteration_time_s == b.iteration_time_s
        assert np.array_equal(a.memory.peak_bytes, b.memory.peak_bytes)


class TestRouting:
    def test_loads(self):
        assert expert_loads(4).tolist() == [0.25] * 4
        assert rank_loads(expert_loads(4, 1.0), 2).tolist() == pytest.approx([0.72, 0.28])
        assert gate_factor(None, 8) == 1.0 and gate_factor(expert_loads(8), 8) == 1.0
        assert gate_factor(np.array([1.0, 0, 0, 0]), 4) == 4.0

    @pytest.mark.parametrize("bad, msg", [(dict(histogram=[1, 2]), "lists 2 experts"),
                                          (dict(histogram=[1, -1, 1, 1]), "non-negative"),
                                          (dict(histogram=[0, 0, 0, 0]), "all zero"), (dict(skew=9), "from 0")])
    def test_load_refusals(self, bad, msg):
        with pytest.raises(ValueError, match=msg):
            expert_loads(4, **bad)

    @settings(max_examples=12, deadline=None)
    @given(st.lists(st.floats(0.0, 2.0), min_size=2, max_size=2))
    def test_more_skew_is_never_faster(self, skews):
        lo, hi = sorted(skews)
        g, c = small_moe(layers=2), preset("dgx-h100:2")
        s = build_layout(g, c, Layout(ep=8))
        times = [simulate_strategy(g, replace(s, expert_loads=tuple(expert_loads(8, k))),
                                   c).iteration_time_s for k in (lo, hi)]
        assert times[1] >= times[0]

    def test_what_if_round_trips_and_is_checked(self):
        g, c = small_moe(), preset("dgx-h100:2")
        s = build_layout(g, c, Layout(ep=8))
        w = replace(s, expert_loads=tuple(expert_loads(8, 1.0).tolist()))
        assert strategy_from_dict(w.to_dict()).expert_loads == w.expert_loads
        bad = replace(s, expert_loads=(0.5, 0.5))
        assert any("2 expert shares for a model with 8 experts" in p.message
                   for p in validate_strategy(bad, g, c))


class TestSamples:
    """Parameter counts against the model cards (total, active without the token embedding
    where the card counts so)."""

    @pytest.mark.parametrize("name, total, active", [
        ("mixtral-8x7b", 46_702_792_704, 12.9e9),  # Jiang et al. 2024: 46.7 B, 12.9 B active
        ("deepseek-v3", 671_026_404_352, 37.5e9),  # DeepSeek-V3 report: 671 B, 37 B active
        ("qwen3-30b-a3b", 30_532_122_624, 3.35e9),  # Qwen3 report: 30.5 B, 3.3 B active
        ("qwen3-235b-a22b", 235_093_634_560, 22.2e9),  # 235 B, 22 B active
    ])
    def test_counts(self, name, total, active):
        g = build_sample(name, 8, seq_len=256)
        assert g.param_count == total
        assert active_parameters(g) == pytest.approx(active, rel=0.02)

    def test_gpt_oss(self):
        g = build_sample("gpt-oss-120b", 8, seq_len=256)
        # model card: 116.8 B total (less the 64 x 36 attention sinks not modelled), 5.13 B active
        # without the input embedding (201,088 x 2,880)
        assert g.param_count == pytest.approx(116.83e9, rel=1e-3)
        assert active_parameters(g) - 201_088 * 2_880 == pytest.approx(5.13e9, rel=0.01)


class TestRecomputeModules:
    """Megatron-Core's --recompute-modules (selective granularity)."""

    def run(self, **kw):
        g, c = small_moe(), preset("dgx-h100:2")
        r = simulate_strategy(g, build_layout(g, c, Layout(ep=8, **kw)), c)
        return r.memory.breakdown(0)["activations"], r.iteration_time_s

    def test_moe_drops_the_moe_layer_and_reruns_it(self):
        act0, t0 = self.run()
        assert self.run(recompute="selective", recompute_modules=("mlp",)) == (act0, t0)  # (dense MLPs only)
        act, t = self.run(recompute="selective", recompute_modules=("moe",))
        # 512 tokens a GPU x top-2 copies x (256 + 1024 + 512) bf16 elements, 4 layers: 14.7 MB no longer kept
        assert act0 - act >= 4 * 512 * 2 * (256 + 1024 + 512) * 2
        assert t > t0  # the experts (and their all-to-alls) run twice

    def test_moe_act_drops_only_the_activation(self):
        act0, t0 = self.run()
        act, t = self.run(recompute="selective", recompute_modules=("moe_act",))
        assert act0 - act == 4 * 512 * 2 * 512 * 2  # f = 512 elements per copy, bf16, 4 layers
        assert t == t0  # (the pointwise rerun is not timed)

    def test_layernorm_drops_the_norms_outputs(self):
        act0, _ = self.run()
        act, _ = self.run(recompute="selective", recompute_modules=("layernorm",))
        assert act < act0

    def test_refusals(self):
        with pytest.raises(ValueError, match="needs recompute selective"):
            Layout(recompute_modules=("mlp",))
        with pytest.raises(ValueError, match="is not a list of core_attn"):
            Layout(recompute="selective", recompute_modules=("attention",))
        g, c = small_moe(), preset("dgx-h100:2")
        s = build_layout(g, c, Layout(ep=8))
        bad = replace(s, recompute_modules=("mlp",))
        assert any("need recompute 'selective'" in p.message for p in validate_strategy(bad, g, c))

    def test_megatron_flags_round_trip(self):
        from engine.export import export, layout_from_megatron
        from engine.export.megatron import megatron_flags
        g, c = small_moe(), preset("dgx-h100:2")
        lay = Layout(ep=8, recompute="selective", recompute_modules=("moe_act", "layernorm"), moe_comm_overlap=True,
                     micro_batch=1)
        s = build_layout(g, c, lay)
        text = export("megatron", g, s, c)
        assert "--recompute-modules moe_act layernorm" in text and "--overlap-moe-expert-parallel-comm" in text
        back = layout_from_megatron(megatron_flags(text), resolved(lay, g, c))
        assert back.recompute_modules == ("moe_act", "layernorm") and back.moe_comm_overlap


def test_moe_comm_overlap_hides_all_to_alls():
    """With four microbatches each all-to-all runs under the partner's compute (cross-node ep 16)."""
    g, c = small_moe(batch=64, experts=16), preset("dgx-h100:2")
    plain = simulate_strategy(g, build_layout(g, c, Layout(ep=16, micro_batch=1)), c).iteration_time_s
    merged = simulate_strategy(g, build_layout(g, c, Layout(ep=16, micro_batch=1, moe_comm_overlap=True)),
                               c).iteration_time_s
    assert merged < plain
    one = small_moe(batch=16, experts=16)  # one microbatch: no partner, nothing hidden
    assert simulate_strategy(one, build_layout(one, c, Layout(ep=16, moe_comm_overlap=True)), c).iteration_time_s == \
        simulate_strategy(one, build_layout(one, c, Layout(ep=16)), c).iteration_time_s
