"""NCCL's collective cost model (engine.costs.collective_time_s) and ZeRO-3's gather unit.

The expected times are worked by hand from NCCL's tuner constants (src/graph/tuning.cc,
quoted in engine/costs/model.py): base latency + intra-node steps x per-step latency + cross-node
steps x network step latency + the bus share of the buffer at the protocol's share of the
bandwidth, the least over protocols (and the tree for all-reduce)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cluster import preset
from engine.costs import collective_time_s
from engine.formats import resolve_model
from engine.models.transformer import gpt2
from engine.layout.build import fsdp
from engine.search.baselines import make_baseline
from engine.sim.full import simulate
from engine.strategy import Strategy, strategy_from_dict, validate_strategy
from engine.taskgraph import build_task_graph
from engine.taskgraph.sync import sync_unit
from engine.taskgraph.tasks import COLL
from engine.layout import Layout, build_layout

US = 1e-6


class TestNcclModel:
    def test_small_all_gather_over_two_nodes_takes_ll(self):
        # n = 16 on 2 nodes: 15 steps, 1 across nodes; bus share 15/16 of 1 MB at 100 GB/s.
        # Simple: 8.4 + 14 x 3.4 + 14.0 us + 9.375 us = 79.375 us
        # LL128:  14 + 14 x 1.9 + 4.0 us + 9.375 / 0.92 us = 54.790 us
        # LL:     6.6 + 14 x 1.0 (the network post floor) + 2.7 us + 9.375 / 0.5 us = 42.05 us
        t = collective_time_s("all_gather", 1e6, 16, 100e9, 0.0, 1.0, nodes=2)
        assert t == pytest.approx(42.05 * US, rel=1e-12)

    def test_large_all_gather_takes_simple(self):
        # 1 GB: Simple 70 us + 9.375 ms beats LL128's 44.6 us + 10.190 ms and LL's 18.75 ms
        t = collective_time_s("all_gather", 1e9, 16, 100e9, 0.0, 1.0, nodes=2)
        assert t == pytest.approx(70 * US + 9.375e-3, rel=1e-12)

    def test_small_all_reduce_takes_the_tree(self):
        # 1 kB over 16 ranks on 2 nodes. Ring LL: 6.6 + 28 x 1.0 + 2 x 2.7 us = 40.0 us (+ data).
        # Tree LL: 6.8 + 2 x (7 x 0.6 + 1 x 5.0) us = 25.2 us + 2 x 1 kB / 50 GB/s = 25.24 us.
        t = collective_time_s("all_reduce", 1e3, 16, 100e9, 0.0, 1.0, nodes=2)
        assert t == pytest.approx(25.24 * US, rel=1e-12)

    def test_pcie_has_no_ll128(self):
        # one node of 4 over PCIe, 1 MB: Simple 8.4 + 3 x 5.7 us + 7.5 us = 33.0 us;
        # LL 6.6 + 3 x 1.0 us + 15 us = 24.6 us; LL128 (NVLink only) would be 14 + 3 x 2.5 + 8.15
        t = collective_time_s("all_gather", 1e6, 4, 100e9, 0.0, 1.0, nvlink=False)
        assert t == pytest.approx(24.6 * US, rel=1e-12)

    def test_a_slow_link_sets_the_step_floor(self):
        # a 1 ms link latency (a WAN) dominates NCCL's microsecond steps
        t = collective_time_s("all_gather", 8.0, 4, 100e9, 1e-3, 1.0)
        assert t >= 3 * 1e-3

    def test_latency_grows_with_ranks_not_bytes(self):
        """At thousands of ranks a ring all-gather of a small buffer costs milliseconds: the
        ZeRO-3 physics the per-link 1-2 us latency missed."""
        small = [collective_time_s("all_gather", 1e6, n, 200e9, 0.0, 0.85, nodes=n // 8) for n in (64, 512, 2048)]
        assert small == sorted(small) and small[-1] > 2e-3 and small[-1] / small[0] > 20

    @pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather", "broadcast"])
    def test_never_faster_than_the_bandwidth_bound(self, kind):
        n, size, bw = 64, 1e8, 100e9
        share = {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(kind, (n - 1) / n)
        assert collective_time_s(kind, size, n, bw, 0.0, 1.0, nodes=8) >= share * size / bw

    def test_one_rank_or_nothing_is_free(self):
        assert collective_time_s("all_reduce", 1e6, 1, 1e9, 1e-6) == 0.0
        assert collective_time_s("all_gather", 0.0, 8, 1e9, 1e-6) == 0.0
        with pytest.raises(ValueError, match="unknown collective"):
            collective_time_s("gossip", 1.0, 2, 1e9, 0.0)

    def test_cluster_groups_report_their_nodes_and_links(self):
        c = preset("dgx-a100-80gb:2")
        one = c.collective_group(range(8))
        two = c.collective_group(range(16))
        assert (one.ranks, one.nodes, one.nvlink, one.inter_latency_s) == (8, 1, True, 0.0)
        assert (two.ranks, two.nodes) == (16, 2) and two.inter_latency_s > two.latency_s > 0
        k80 = preset("k80-16x4").collective_group(range(4))
        assert k80.nvlink is False


class TestGatherUnit:
    def setup_method(self):
        self.g = gpt2(batch=16, seq_len=256)
        self.c = preset("dgx-a100-80gb:2")

    def gathers(self, s: Strategy) -> int:
        tg = build_task_graph(self.g, s, self.c)
        return int(np.count_nonzero((tg.kind == COLL) & (tg.coll == 2)))  # COLL_INDEX["all_gather"]

    def test_deepspeed_gathers_each_op(self):
        block = fsdp(self.g, self.c, Layout(zero_stage=3, micro_batch=1))
        op = fsdp(self.g, self.c, Layout(zero_stage=3, micro_batch=1, gather_unit="op"))
        assert op.gather_unit == "op" and validate_strategy(op, self.g, self.c) == []
        units: dict[str, int] = {}  # sync unit (a block; the tied embedding's group) -> ops in it
        for o in self.g.ops:
            if o.param_count and o.kind != "input":
                units[sync_unit(o, 3)] = units.get(sync_unit(o, 3), 0) + 1
        assert units["block:layers.0"] == 8  # two norms, QKV, projection, two MLP linears (+ biases)
        # each unit's forward and backward gather becomes one per op with parameters (one
        # microbatch: batch 16 on 16 GPUs)
        assert op.pipeline.microbatches == 1
        assert self.gathers(op) - self.gathers(block) == 2 * sum(k - 1 for k in units.values())
        t_block = simulate(build_task_graph(self.g, block, self.c)).makespan_s
        t_op = simulate(build_task_graph(self.g, op, self.c)).makespan_s
        assert t_op >= t_block * (1 - 1e-9)

    def test_round_trips_and_is_checked(self):
        op = fsdp(self.g, self.c, Layout(zero_stage=3, micro_batch=1, gather_unit="op"))
        d = op.to_dict()
        assert d["gather_unit"] == "op"
        assert strategy_from_dict(d).gather_unit == "op"
        assert "gather_unit" not in fsdp(self.g, self.c, Layout(zero_stage=3,
                                                                micro_batch=1)).to_dict()  # the default is not written
        from dataclasses import replace
        bad = replace(op, gather_unit="param")
        assert any(p.path == "gather_unit" for p in validate_strategy(bad, self.g, self.c))
        with pytest.raises(ValueError, match="gather_unit"):
            fsdp(self.g, self.c, Layout(zero_stage=3, gather_unit="param"))

    def test_the_cli_option_reaches_the_baseline(self):
        s = make_baseline("fsdp", resolve_model("gpt2"), preset("dgx-a100-80gb:1"), gather_unit="op")
        assert s.gather_unit == "op" and s.found_by["options"]["gather_unit"] == "op"
        with pytest.raises(ValueError, match="does not take --gather-unit"):
            make_baseline("megatron", resolve_model("gpt2"), preset("dgx-a100-80gb:1"), gather_unit="op")


class TestNvls:
    def test_all_reduce_inside_an_h100_node_uses_the_switch(self):
        # 1 GB over 8 ranks at 100 GB/s: NVLS 25 us + 1 GB / (0.85 x 100 GB/s) = 11.790 ms (Hopper,
        # NCCL's nvlsEfficiency), against the ring's 8.4 + 14 x 3.4 us + 1.75 x 10 ms = 17.556 ms
        t = collective_time_s("all_reduce", 1e9, 8, 100e9, 0.0, 1.0, nvls=True)
        assert t == pytest.approx(25 * US + 1e9 / 85e9, rel=1e-12)
        # Blackwell's switch reduces at 0.74 of the link rate
        assert collective_time_s("all_reduce", 1e9, 8, 100e9, 0.0, 1.0, nvls=True, nvls_share=0.74) == \
            pytest.approx(25 * US + 1e9 / 74e9, rel=1e-12)
        assert collective_time_s("all_reduce", 1e9, 8, 100e9, 0.0, 1.0) == pytest.approx(17.556e-3, rel=1e-12)
        # not across nodes, not for all-gather
        assert collective_time_s("all_reduce", 1e9, 16, 100e9, 0.0, 1.0, nodes=2, nvls=True) == \
            collective_time_s("all_reduce", 1e9, 16, 100e9, 0.0, 1.0, nodes=2)
        assert collective_time_s("all_gather", 1e9, 8, 100e9, 0.0, 1.0, nvls=True) == \
            collective_time_s("all_gather", 1e9, 8, 100e9, 0.0, 1.0)

    def test_which_groups_have_it(self):
        assert preset("dgx-h100:2").collective_group(range(8)).nvls
        assert preset("dgx-h200:1").collective_group(range(4)).nvls
        assert not preset("dgx-h100:2").collective_group(range(16)).nvls  # two nodes
        assert not preset("dgx-a100-80gb:1").collective_group(range(8)).nvls  # NVSwitch gen2: no SHARP


class TestTpCommOverlap:
    def test_reductions_hide_under_their_gemms(self):
        from engine.taskgraph.tasks import FWD

        g, c = gpt2(batch=8, seq_len=512), preset("dgx-h100:1")
        plain = build_layout(g, c, Layout(tp=4, micro_batch=1, sequence_parallel=True))
        over = build_layout(g, c, Layout(tp=4, micro_batch=1, sequence_parallel=True, tp_comm_overlap=True))
        assert over.tp_comm_overlap and validate_strategy(over, g, c) == []
        a, b = build_task_graph(g, plain, c), build_task_graph(g, over, c)
        assert a.num_tasks == b.num_tasks and (a.kind == b.kind).all()
        coll = np.flatnonzero(a.kind == COLL)
        # the forward reduce-scatter after the attention projection: c/n + (n-1)/n max(0, c - g)
        proj = g.index["layers.0.attn.out"]
        rs = [t for t in coll if a.op[t] == proj and a.mb[t] == 0][0]
        gemm = [t for t in np.flatnonzero((a.kind == FWD) & (a.op == proj)) if a.mb[t] == 0][0]
        c_s, g_s = a.dur_s[rs], a.dur_s[gemm]
        assert b.dur_s[rs] == pytest.approx(c_s / 4 + 3 / 4 * max(0.0, c_s - g_s), rel=1e-12)
        assert (b.dur_s[coll] <= a.dur_s[coll]).all() and (b.dur_s[coll] < a.dur_s[coll]).any()
        assert simulate(b).makespan_s < simulate(a).makespan_s
        full = build_task_graph(g, over, c, symmetry="off")
        assert simulate(full).makespan_s == pytest.approx(simulate(b).makespan_s, rel=1e-12)

    def test_needs_sequence_parallelism(self):
        from dataclasses import replace


        g, c = gpt2(batch=8, seq_len=512), preset("dgx-h100:1")
        s = replace(build_layout(g, c, Layout(tp=4, micro_batch=1)), tp_comm_overlap=True)
        assert [p.path for p in validate_strategy(s, g, c)] == ["tp_comm_overlap"]
        d = build_layout(g, c, Layout(tp=4, micro_batch=1, sequence_parallel=True, tp_comm_overlap=True)).to_dict()
        assert d["tp_comm_overlap"] is True and strategy_from_dict(d).tp_comm_overlap
