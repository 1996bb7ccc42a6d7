"""The task-graph builder's parts, tested directly: partition geometry (regions and the conv/pool
halo, classes, who sends what to whom), segments and their CSR assembly, the emitter's
durations, the schedule's barriers, and the builder's snapshot/restore. Whole graphs are pinned
by tests/taskgraph/test_taskgraph_fingerprint.py and simulated in tests/sim/test_simulate.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.cluster import preset
from engine.costs import CostModel
from engine.formats import resolve_model
from engine.graph import GraphBuilder
from engine.search.baselines import data_parallel
from engine.strategy import Config, partition_grid
from engine.taskgraph import COLL, COLL_INDEX, TaskGraphBuilder, build_task_graph
from engine.taskgraph.context import BuildContext, OpTables
from engine.taskgraph.emit import Emitter
from engine.taskgraph.regions import classes, in_regions, out_regions, ranges, tile, transfer_plan
from engine.taskgraph.schedule import SchedulePlan
from engine.taskgraph.segments import SEGMENT_SHIFT, Segment, csr_from_handles
from engine.layout import Layout, build_layout


def conv_graph():
    b = GraphBuilder("conv")
    x = b.input("x", [2, 3, 8, 8])
    b.add("conv2d", "conv", [x], out_channels=4, kernel=3, padding=1)
    return b.build()


def linear_graph(batch=4, width=6, out=2):
    b = GraphBuilder("lin")
    x = b.input("x", [batch, width])
    b.add("linear", "fc", [x], out_features=out)
    return b.build()


# --------------------------------------------------------------------------- regions


class TestRegions:
    def test_tile_repeats_a_row(self):
        assert tile(np.array([1, 2, 3]), 2).tolist() == [1, 2, 3, 1, 2, 3]
        assert tile(np.array([7]), 3).tolist() == [7, 7, 7]
        assert tile(np.zeros(0, np.int64), 4).size == 0

    def test_ranges_cover_the_dim_without_overlap(self):
        lo, hi = ranges(np.arange(3), 3, 10)  # uneven: 10 over 3 parts
        assert lo.tolist() == [0, 3, 6] and hi.tolist() == [4, 7, 10]

    def test_output_regions_of_a_sample_and_feature_split(self):
        g = linear_graph()
        op, cfg = g["fc"], Config({"sample": 2, "feature": 2}, (0, 1, 2, 3))
        names, grid = partition_grid(op, cfg)
        lo, hi = out_regions(op, cfg, names, grid, 0)  # output [4, 2]
        assert lo.tolist() == [[0, 0], [0, 1], [2, 0], [2, 1]]
        assert hi.tolist() == [[2, 1], [2, 2], [4, 1], [4, 2]]

    def test_input_regions_ignore_dims_that_do_not_split_the_input(self):
        g = linear_graph()
        op, cfg = g["fc"], Config({"sample": 2, "feature": 2}, (0, 1, 2, 3))
        names, grid = partition_grid(op, cfg)
        lo, hi = in_regions(op, cfg, names, grid, 0)  # input [4, 6]: the feature split reads it all
        assert lo.tolist() == [[0, 0], [0, 0], [2, 0], [2, 0]]
        assert hi.tolist() == [[2, 6], [2, 6], [4, 6], [4, 6]]

    def test_conv_height_split_reads_a_halo(self):
        """3x3 kernel, padding 1, stride 1: output rows 0-3 need input rows 0-4, rows 4-7
        need rows 3-7 (one row of halo each side, clipped at the border)."""
        g = conv_graph()
        op, cfg = g["conv"], Config({"height": 2}, (0, 1))
        names, grid = partition_grid(op, cfg)
        lo, hi = in_regions(op, cfg, names, grid, 0)
        assert lo[:, 2].tolist() == [0, 3] and hi[:, 2].tolist() == [5, 8]
        olo, ohi = out_regions(op, cfg, names, grid, 0)
        assert olo[:, 2].tolist() == [0, 4] and ohi[:, 2].tolist() == [4, 8]

    def test_classes_group_equal_coordinates(self):
        grid = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
        assert classes(grid, ["a", "b"], {"a"}).tolist() == [0, 0, 1, 1]
        assert classes(grid, ["a", "b"], {"b"}).tolist() == [0, 1, 0, 1]
        assert classes(grid, ["a", "b"], set()).tolist() == [0, 0, 0, 0]


class TestTransferPlan:
    def test_a_local_holder_sends_nothing(self):
        """Two holders of the same rows (one class) on devices 0 and 1; receivers on 1 and 2:
        the receiver on device 1 reads locally (0 elements), the one on 2 from holder
        ``receiver mod 2``."""
        h_lo = np.array([[0, 0], [0, 0]])
        h_hi = np.array([[4, 6], [4, 6]])
        holder, recv, elems = transfer_plan(h_lo, h_hi, np.array([0, 1]), np.array([0, 0]),
                                            np.array([[0, 0], [2, 0]]), np.array([[2, 6], [4, 6]]), np.array([1, 2]))
        assert holder.tolist() == [1, 1] and recv.tolist() == [0, 1] and elems.tolist() == [0, 12]

    def test_disjoint_regions_make_no_pair(self):
        holder, recv, elems = transfer_plan(np.array([[0]]), np.array([[2]]), np.array([0]), np.array([0]),
                                            np.array([[2]]), np.array([[4]]), np.array([1]))
        assert holder.size == recv.size == elems.size == 0


# --------------------------------------------------------------------------- segments


class TestSegments:
    def test_handles_carry_the_slot(self):
        seg = Segment(3)
        ids = seg.add(2, 0, dur=1.0)
        more = seg.add(1, 0, dur=np.array([2.0]))
        assert (ids >> SEGMENT_SHIFT).tolist() == [3, 3] and (ids & ((1 << SEGMENT_SHIFT) - 1)).tolist() == [0, 1]
        assert (more & ((1 << SEGMENT_SHIFT) - 1)).tolist() == [2]
        assert seg.freeze()["cols"]["dur"].tolist() == [1.0, 1.0, 2.0]

    def test_freeze_all_shares_one_array_per_column(self):
        a, b = Segment(0), Segment(1)
        a.add(2, 1, op=5)
        b.add(1, 2, op=np.array([7]))
        b.edges([b.slot << SEGMENT_SHIFT], [a.slot << SEGMENT_SHIFT])
        whole = Segment.freeze_all([a, b])
        assert whole["arrays"]["kind"].tolist() == [1, 1, 2] and whole["arrays"]["op"].tolist() == [5, 5, 7]
        assert whole["bounds"]["kind"].tolist() == [0, 2, 3]
        assert b.freeze()["cols"]["op"].tolist() == [7]
        assert Segment.freeze_all([a, b]) is None  # already frozen

    def test_csr_keeps_each_sources_edges_in_order(self):
        # slot 0 holds tasks 0-1, slot 1 tasks 2-3; edges given as handles
        offset = np.array([0, 2], np.int64)
        h = lambda slot, i: (slot << SEGMENT_SHIFT) + i  # noqa: E731
        src = np.array([h(1, 0), h(0, 0), h(1, 0), h(0, 1)], np.int64)
        dst = np.array([h(0, 1), h(1, 1), h(1, 1), h(1, 0)], np.int64)
        ptr, idx, npred = csr_from_handles(src, dst, offset, 4)
        assert ptr.tolist() == [0, 1, 2, 4, 4]
        assert idx.tolist() == [3, 2, 1, 3]  # task 2's successors in edge order: 1, then 3
        assert npred.tolist() == [0, 1, 1, 2]


# --------------------------------------------------------------------------- emitter


class TestEmitter:
    def make(self, cluster="dgx-a100-80gb:2", eff=0.5):
        g = linear_graph()
        c = preset(cluster)
        return Emitter(BuildContext(g, data_parallel(g, c), c, CostModel(link_efficiency=eff, link_shares=()), None)), c

    def test_a_transfer_is_one_task_per_hop_cut_through(self):
        """Across nodes: four hops, each streaming for bytes / (bottleneck x efficiency);
        the last adds its latency, and each hop may start the previous hop's latency after it."""
        emit, c = self.make()
        seg = Segment(0)
        src, dst = seg.add(1, 0), seg.add(1, 0)
        first, last = emit.transfers(seg, src, dst, np.array([0]), np.array([8]), np.array([1e6]), 0, np.array([0]))
        path = c.path(0, 8)
        f = seg.freeze()
        dur = f["cols"]["dur"][2:]
        bottleneck = min(c.links[k].bw_bytes_per_s for k in path)
        stream = 1e6 / (bottleneck * 0.5)
        assert dur.tolist() == [stream] * 3 + [stream + c.links[path[-1]].latency_s]
        assert f["chain_lag"].tolist() == [c.links[k].latency_s for k in path[:-1]]
        assert seg.comm_bytes == 1e6
        assert (first & 0xFFFFFFFF).tolist() == [2] and (last & 0xFFFFFFFF).tolist() == [5]

    def test_same_device_is_an_edge_not_a_transfer(self):
        emit, _ = self.make()
        seg = Segment(0)
        src, dst = seg.add(1, 0), seg.add(1, 0)
        first, last = emit.transfers(seg, src, dst, np.array([3]), np.array([3]), np.array([1e6]), 0, np.array([0]))
        assert first.tolist() == last.tolist() == [-1] and seg.n == 2 and seg.comm_bytes == 0

    def test_a_one_device_collective_is_skipped(self):
        emit, _ = self.make()
        seg = Segment(0)
        assert emit.collective(seg, "all_reduce", 1e6, [2], [], 0) == -1 and seg.n == 0

    def test_collective_bytes_count_each_ranks_sends(self):
        emit, _ = self.make()
        seg = Segment(0)
        ids = emit.collectives(seg, "all_reduce", 1e6, range(4), np.zeros((2, 0), np.int64), 0, np.arange(2))
        assert ids.size == 2 and seg.comm_bytes == 2 * 3 * 1e6 * 2  # ring: 2(n-1) buffers, twice
        cols = seg.freeze()["cols"]
        assert cols["kind"].tolist() == [COLL] * 2 and cols["coll"].tolist() == [COLL_INDEX["all_reduce"]] * 2


# --------------------------------------------------------------------------- schedule


class TestSchedulePlan:
    def test_no_barriers_without_stages_or_microbatches(self):
        g = resolve_model("alexnet")
        c = preset("p100-4x4")
        assert SchedulePlan(BuildContext(g, data_parallel(g, c), c, CostModel(), None)).units == 0

    def test_ranks_follow_the_1f1b_order(self):
        g = resolve_model("gpt2")
        c = preset("dgx-a100-80gb:1")
        s = build_layout(g, c, Layout(tp=2, pp=2, dp=2, micro_batch=2))
        plan = SchedulePlan(BuildContext(g, s, c, CostModel(), None))
        m = s.pipeline.microbatches
        assert plan.units == 2 * m
        # the last stage alternates forward, backward from its first microbatch
        assert plan.rank[1, 0, :2].tolist() == [[0, 1], [2, 3]]
        # the first stage runs one warm-up forward before its first backward
        assert plan.rank[0, 0, 0].tolist() == [0, 2]


# --------------------------------------------------------------------------- tables and the builder


class TestOpTables:
    def test_snapshot_restore_round_trip(self):
        t = OpTables(4)
        t.devs[0], t.rep[0] = np.array([0, 1]), np.array([True, True])
        t.devs[1], t.rep[1] = np.array([2]), np.array([True])
        t.count_all_rep_devices()
        assert t.rep_devices == {0, 1, 2}
        saved = t.snapshot(1)
        t.devs[1] = np.array([3])
        t.count_rep_devices(1)
        assert t.rep_devices == {0, 1, 3}
        t.restore(1, saved)
        assert t.rep_devices == {0, 1, 2} and t.devs[1].tolist() == [2]


class TestBuilder:
    @pytest.mark.parametrize("model, cluster", [("alexnet", "p100-4x4"), ("rnntc", "p100-4x4")])
    def test_rebuild_then_restore_gives_the_first_graph_back(self, model, cluster):
        g, c = resolve_model(model), preset(cluster)
        s = data_parallel(g, c)
        b = TaskGraphBuilder(g, s, c, CostModel())
        first = b.build()
        op = g.ops[len(g.ops) // 2].name
        snap = b.snapshot(op)
        moved = b.rebuild(replace(s, configs={**s.configs, op: Config({}, (5,))}), op)
        assert b.strategy.configs[op] == Config({}, (5,)) and not np.array_equal(moved.device, first.device)
        b.restore(snap)
        assert b.strategy is s
        again = b.rebuild(s, op)  # from the restored state: the first graph, array for array
        for name in ("kind", "op", "device", "dur_s", "succ_ptr", "succ_idx", "res_idx", "chain_next"):
            assert np.array_equal(getattr(first, name), getattr(again, name)), name

    def test_several_ops_rebuilt_then_restored_give_the_first_graph_back(self):
        """Three neighbouring ops (a tensor between two of them) rebuilt in one call: the full
        build's arrays; restored, then rebuilt with the first configs: the first graph."""
        g, c = resolve_model("inception_v3"), preset("p100-4x4")
        s = data_parallel(g, c)
        b = TaskGraphBuilder(g, s, c, CostModel())
        first = b.build()
        at = len(g.ops) // 2
        ops = [op.name for op in g.ops[at:at + 3]]
        moved_s = replace(s, configs={**s.configs, **dict.fromkeys(ops, Config({}, (5,)))})
        snap = b.snapshot(ops)
        moved = b.rebuild(moved_s, ops)
        whole = TaskGraphBuilder(g, moved_s, c, CostModel()).build()
        for name in ("kind", "op", "device", "dur_s", "succ_ptr", "succ_idx", "res_idx", "chain_next"):
            assert np.array_equal(getattr(moved, name), getattr(whole, name)), name
        b.restore(snap)
        assert b.strategy is s
        again = b.rebuild(s, ops)
        for name in ("kind", "op", "device", "dur_s", "succ_ptr", "succ_idx", "res_idx", "chain_next"):
            assert np.array_equal(getattr(first, name), getattr(again, name)), name

    def test_symmetry_simulates_one_replica(self):
        g, c = resolve_model("alexnet"), preset("dgx-a100-80gb:2")
        s = data_parallel(g, c)
        sym, full = build_task_graph(g, s, c), build_task_graph(g, s, c, symmetry="off")
        assert sym.info["symmetry"] is not None and full.info["symmetry"] is None
        assert sym.num_tasks < full.num_tasks
        image = sym.info["device_image"]
        assert (image[image >= 0] <= np.arange(c.num_devices)[image >= 0]).all()
