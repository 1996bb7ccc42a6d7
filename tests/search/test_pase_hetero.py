"""PaSE's and the differentiable search's cost tables on mixed clusters (issue 28, item 5):
each op's compute is priced on the devices its config runs on (the slowest one gates a
synchronous split), not at device 0's speed; on one device type nothing changes."""

from __future__ import annotations

import math

import pytest

from engine.cluster import Cluster, DeviceType, NodeSpec, preset
from engine.costs.model import KERNEL_OVERHEAD_S, MEMORY_EFFICIENCY
from engine.costs import CostModel
from engine.formats import resolve_model
from engine.graph import GraphBuilder
from engine.search.api import Budget
from engine.search.differentiable import differentiable
from engine.search.pase import build_problem, compute_time_s, pase

#: memory bandwidths (bytes/s) of the two toy GPUs: the slow one has a quarter of the fast one's
FAST_BW, SLOW_BW = 1e11, 2.5e10
#: a peak (FLOP/s) so high that a pointwise op is memory-bound on both
PEAK = 1e16


def mixed_pair(slow_bw: float = SLOW_BW) -> Cluster:
    """Device 0 fast, device 1 slow, one GPU a node, joined by one NIC each."""
    types = {"fast": DeviceType("fast", {"fp32": PEAK}, FAST_BW, 10**11),
             "slow": DeviceType("slow", {"fp32": PEAK}, slow_bw, 10**11)}
    nodes = [NodeSpec(name, 1, name, "switch", 2e9, 1e-6, nics=1, nic_bw_bytes_per_s=1e10) for name in types]
    return Cluster("mixed-pair", nodes, types)


def relu_graph():
    b = GraphBuilder("relu")
    x = b.input("x", [64, 4096])
    b.add("relu", "act", [x])
    return b.build()


class TestComputeTime:
    def test_hand_computed_split_gated_by_the_slow_device(self):
        """A memory-bound relu: one partition's roofline time is its bytes / (bandwidth x
        MEMORY_EFFICIENCY) + one kernel's overhead, forward and backward. Split two ways, its
        half runs on the fast and on the slow GPU at once: the slow one's time is the op's."""
        g, c = relu_graph(), mixed_pair()
        problem = build_problem(g, c)
        op = g["act"]
        v = [o.name for o in g.ops].index("act")
        fwd_b, bwd_b = op.fwd_bytes_read + op.fwd_bytes_written, op.bwd_bytes_read + op.bwd_bytes_written
        assert fwd_b > 0 and bwd_b > 0

        def by_hand(parts: int, bw: float) -> float:
            return (fwd_b + bwd_b) / parts / (bw * MEMORY_EFFICIENCY) + 2 * KERNEL_OVERHEAD_S

        costs = {cfg.num_partitions: float(t) for cfg, t in zip(problem.configs[v], problem.vertex_cost[v])}
        assert costs[1] == pytest.approx(by_hand(1, FAST_BW), rel=1e-12)  # on device 0 alone: the fast GPU
        assert costs[2] == pytest.approx(by_hand(2, SLOW_BW), rel=1e-12)  # gated by the slow GPU
        # device-0 pricing (the old cost) would have priced the split at the fast GPU's speed:
        # the difference is exactly the half's bytes at the slow rate less at the fast one
        device0 = by_hand(2, FAST_BW)
        assert costs[2] - device0 == pytest.approx(
            (fwd_b + bwd_b) / 2 / MEMORY_EFFICIENCY * (1 / SLOW_BW - 1 / FAST_BW), rel=1e-9)
        assert costs[2] > costs[1]  # with a 4x slower partner, splitting a pointwise op loses

    def test_linear_layer_keeps_its_gradient_all_reduce(self):
        """A data-parallel linear layer: the slow GPU's partition time plus the same gradient
        all-reduce as before; the difference from device-0 pricing is the compute alone."""
        b = GraphBuilder("fc")
        x = b.input("x", [64, 256])
        b.add("linear", "fc", [x], out_features=256)
        g, c = b.build(), mixed_pair()
        problem = build_problem(g, c)
        v = [o.name for o in g.ops].index("fc")
        op, cm = g["fc"], CostModel()
        for cfg, t in zip(problem.configs[v], problem.vertex_cost[v]):
            times = [sum(cm.partition_times_s(op, cfg.degrees, g.precision, c.device_type(d))) for d in cfg.devices]
            assert compute_time_s(op, cfg, g.precision, c, cm) == max(times)
            if cfg.num_partitions == 2 and set(cfg.degrees) == {"sample"}:
                fast = sum(cm.partition_times_s(op, cfg.degrees, g.precision, c.device_type(0)))
                slow = sum(cm.partition_times_s(op, cfg.degrees, g.precision, c.device_type(1)))
                assert slow > fast
                allreduce = float(t) - slow
                assert allreduce > 0  # the gradient all-reduce over the two GPUs
                # on a pair of fast GPUs with the same links, only the compute term changes
                same = build_problem(g, mixed_pair(slow_bw=FAST_BW))
                k = same.configs[v].index(cfg)
                assert float(same.vertex_cost[v][k]) == pytest.approx(fast + allreduce, rel=1e-12)

    @pytest.mark.parametrize("model,cluster", [("alexnet", "p100-4x4"), ("inception_v3", "dgx-a100-80gb:16"),
                                               ("rnnlm", "k80-16x4")])
    def test_homogeneous_costs_identical_to_device0_pricing(self, model, cluster):
        """Property: on one device type every config's compute time is exactly device 0's."""
        g, c = resolve_model(model), preset(cluster)
        assert len({d.type for d in c.devices}) == 1
        problem = build_problem(g, c, max_table_bytes=None)
        cm = CostModel()
        for op, cs in zip(g.ops, problem.configs):
            if op.kind == "input":
                continue
            for cfg in cs[:: max(1, len(cs) // 7)]:
                f, b = cm.partition_times_s(op, cfg.degrees, g.precision, c.device_type(0))
                assert compute_time_s(op, cfg, g.precision, c, cm) == f + b  # bit for bit

    def test_mixed_demo_prices_a_split_over_the_v100s_at_their_speed(self):
        g, c = resolve_model("alexnet"), preset("hetero-demo")
        problem = build_problem(g, c, max_table_bytes=None)
        cm = CostModel()
        # AlexNet's 384-channel convolutions split 12 ways: over the H100s, the A100s and the V100s
        v, cfg = max(((v, cfg) for v, cs in enumerate(problem.configs) for cfg in cs
                      if g.ops[v].kind == "conv2d"),
                     key=lambda vc: vc[1].num_partitions)
        op = g.ops[v]
        assert cfg.num_partitions == 12
        per_type = {c.device_type(d).name: sum(cm.partition_times_s(op, cfg.degrees, g.precision, c.device_type(d)))
                    for d in cfg.devices}
        assert len(per_type) == 3
        # the slowest of the three gates the split; device 0 (an H100) is the fastest
        assert compute_time_s(op, cfg, g.precision, c, cm) == max(per_type.values())
        assert max(per_type.values()) > 3 * per_type[c.device_type(0).name]


def big_linear_graph():
    """One large, compute-heavy linear layer on a big batch: splitting it pays between equals."""
    b = GraphBuilder("big")
    x = b.input("x", [4096, 1024])
    b.add("linear", "fc", [x], out_features=1024)
    return b.build()


class TestSearchesAvoidTheSlowDevice:
    def test_pase_splits_between_equals_and_not_onto_a_much_slower_gpu(self):
        g = big_linear_graph()
        even = pase(g, mixed_pair(slow_bw=FAST_BW))
        slow = pase(g, mixed_pair(slow_bw=FAST_BW / 1000))
        assert even.best["fc"].num_partitions == 2
        assert slow.best["fc"].num_partitions == 1 and slow.best["fc"].devices == (0,)
        assert math.isfinite(slow.best_cost_s)

    def test_differentiable_uses_the_same_tables(self):
        g = big_linear_graph()
        r = differentiable(g, mixed_pair(slow_bw=FAST_BW / 1000), Budget(iterations=60), seed=0)
        assert r.best["fc"].devices == (0,)
        problem = build_problem(g, mixed_pair(slow_bw=FAST_BW / 1000))
        choice = [cs.index(r.best[op.name]) for op, cs in zip(g.ops, problem.configs)]
        assert r.best.found_by["model_cost_s"] == pytest.approx(problem.cost(choice), rel=1e-12)


def test_alexnet_on_h100s_and_v100s_plan_is_no_longer_priced_at_h100_speed():
    """Regression (issue 28): on 4 H100s + 4 V100s, pricing every op at device 0's speed made
    PaSE's AlexNet plan look 5.7 ms (F) while it simulated at 29.6 ms, slower than the expert
    baseline, which was returned instead. Priced on each config's own devices, F is close to
    the simulated time and the plan is PaSE's own, faster than every baseline."""
    demo = preset("hetero-demo")
    c = Cluster("mixed-8", [demo.node_specs[0], demo.node_specs[2]], demo.device_types)
    r = pase(resolve_model("alexnet"), c)
    assert r.baseline_returned is None
    assert r.best_cost_s < min(r.baselines.values())
    assert r.best.found_by["pase_cost_s"] == pytest.approx(r.best_time_s, rel=0.25)
