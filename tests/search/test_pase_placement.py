"""PaSE on mixed clusters chooses its configs' devices (issue 28, item 5): the device set of a
k-way config is part of the search (first k, k fastest, fastest node, fastest type), its
collectives run over the real groups of those devices, and one device type keeps PaSE's own
space and tables."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from engine.cluster import DEVICE_TYPES, Cluster, DeviceType, NodeSpec, preset
from engine.strategy.config import Config
from engine.costs.collectives import group_rates
from engine.costs import CostModel, group_collective_time_s, transfer_time_s
from engine.formats import resolve_model
from engine.graph import GraphBuilder
from engine.search import pase_placement
from engine.search.api import Budget
from engine.search.differentiable import differentiable
from engine.search.pase import (build_problem, compute_time_s, estimate_seconds, pase, pase_configs,
                                solve)
from engine.search.pase_placement import (MAX_SETS_PER_DEGREE, partition_totals, placements, sync_groups,
                                          sync_groups_time_s)


def mixed8(v100_first: bool = False) -> Cluster:
    """hetero-demo's H100 node and V100 node (benchmarks/bench_hetero_search.py's mixed-8)."""
    demo = preset("hetero-demo")
    nodes = [demo.node_specs[0], demo.node_specs[2]]
    return Cluster("mixed-8", nodes[::-1] if v100_first else nodes, DEVICE_TYPES)


def slow_first_pair() -> Cluster:
    """Device 0 slow (a quarter of the fast one's memory bandwidth), device 1 fast, one GPU a node."""
    types = {"slow": DeviceType("slow", {"fp32": 1e16}, 2.5e10, 10**11),
             "fast": DeviceType("fast", {"fp32": 1e16}, 1e11, 10**11)}
    nodes = [NodeSpec(name, 1, name, "switch", 2e9, 1e-6, nics=1, nic_bw_bytes_per_s=1e10) for name in types]
    return Cluster("slow-first", nodes, types)


def two_relus():
    b = GraphBuilder("relus")
    x = b.input("x", [64, 4096])
    y = b.add("relu", "a", [x])
    b.add("relu", "b", [y])
    return b.build()


class TestPlacements:
    @pytest.mark.parametrize("name", ["p100-4x4", "k80-16x4", "dgx-a100-80gb:2"])
    def test_one_device_type_keeps_the_first_k_devices(self, name):
        c = preset(name)
        n = c.num_devices
        assert partition_totals(c, "fp32") == [n]
        assert placements(c, "fp32") == {k: [tuple(range(k))] for k in range(1, n + 1) if n % k == 0}

    def test_hetero_demo_adds_the_h100_and_a100_prefix(self):
        c = preset("hetero-demo")
        assert partition_totals(c, "fp32") == [4, 8, 12]
        sets = placements(c, "fp32")
        assert sorted(sets) == [1, 2, 3, 4, 6, 8, 12]
        assert sets[8] == [tuple(range(8))]  # the H100s and the A100s: already the first eight
        assert sets[12] == [tuple(range(12))]

    def test_slow_node_first_offers_the_fast_node(self):
        c = mixed8(v100_first=True)  # devices 0-3 V100, 4-7 H100
        assert {c.devices[d].type for d in range(4)} == {"V100-SXM2-32GB"}
        sets = placements(c, "fp32")
        assert sets[1] == [(0,), (4,)]
        assert sets[2] == [(0, 1), (4, 5)]
        assert sets[4] == [(0, 1, 2, 3), (4, 5, 6, 7)]
        assert sets[8] == [tuple(range(8))]

    def test_k_fastest_spans_the_fast_nodes(self):
        """V100 node, then two H100 nodes: eight H100s are the 8 fastest (not PaSE's first
        eight); four fit in one H100 node (the first, by id)."""
        demo = preset("hetero-demo")
        c = Cluster("v-h-h", [demo.node_specs[2], replace(demo.node_specs[0], repeat=2)], DEVICE_TYPES)
        assert [c.devices[d].type[:4] for d in (0, 4, 8)] == ["V100", "H100", "H100"]
        assert partition_totals(c, "fp32") == [8, 12]
        sets = placements(c, "fp32")
        assert sets[8] == [tuple(range(8)), tuple(range(4, 12))]
        assert sets[4] == [(0, 1, 2, 3), (4, 5, 6, 7)]
        assert sets[6] == [tuple(range(6)), tuple(range(4, 10))]  # no node holds six: the fastest six
        assert sets[12] == [tuple(range(12))]

    @pytest.mark.parametrize("cluster", [preset("hetero-demo"), mixed8(), mixed8(v100_first=True)])
    def test_bounded_and_a_superset_of_pases_space(self, cluster):
        g = resolve_model("alexnet")
        sets = placements(cluster, g.precision)
        assert all(1 <= len(s) <= MAX_SETS_PER_DEGREE for s in sets.values())
        for op in g.ops:
            new = pase_configs(op, cluster.num_devices, 1, sets)
            assert len(new) == len(set(new))
            assert set(pase_configs(op, cluster.num_devices)) <= set(new)
            degrees = {tuple(sorted(c.degrees.items())) for c in new}
            assert len(new) <= MAX_SETS_PER_DEGREE * len(degrees)
            assert new[0] == Config.single(0)


    def test_the_time_estimate_and_the_refusal_count_the_placed_configs(self):
        """PaSE refuses before any work from the config counts: they must be the placed ones."""
        g = resolve_model("alexnet")
        fast_first, slow_first = mixed8(), mixed8(v100_first=True)
        assert estimate_seconds(g, slow_first) > estimate_seconds(g, fast_first)
        largest = solve(build_problem(g, slow_first)).largest_table_entries  # entries of 8 bytes
        assert largest > solve(build_problem(g, fast_first)).largest_table_entries
        build_problem(g, slow_first, max_table_bytes=8 * largest)
        with pytest.raises(ValueError, match="PaSE's table for op"):
            build_problem(g, slow_first, max_table_bytes=8 * largest - 1)


class TestSyncGroups:
    def test_hand_computed_replica_groups(self):
        """{sample: 2, feature: 2} on devices 4-7: partition p = 2 s + f (row-major); the
        weight shard of feature block f is replicated over the sample split."""
        b = GraphBuilder("fc")
        x = b.input("x", [8, 16])
        b.add("linear", "fc", [x], out_features=8)
        op = b.build()["fc"]
        cfg = Config({"sample": 2, "feature": 2}, (4, 5, 6, 7))
        assert sync_groups(op, cfg, ["sample"]) == [(4, 6), (5, 7)]
        assert sync_groups(op, cfg, ["sample", "feature"]) == [(4, 5, 6, 7)]
        assert sync_groups(op, cfg, []) == [(4,), (5,), (6,), (7,)]

    def test_mixed_cluster_prices_the_slowest_real_group(self):
        """Two nodes: groups {0, 4} and {1, 5} cross the NICs, the first two devices do not."""
        c = mixed8()
        b = GraphBuilder("fc")
        x = b.input("x", [64, 1024])
        b.add("linear", "fc", [x], out_features=1024)
        op = b.build()["fc"]
        cfg = Config({"sample": 2, "feature": 4}, tuple(range(8)))  # replicas: partitions f and 4 + f
        eff = CostModel().links
        t = sync_groups_time_s(op, cfg, ["sample"], 1e6, c, eff)
        across = max(group_collective_time_s("all_reduce", 1e6, c.collective_group((f, f + 4)), eff) for f in range(4))
        inside = group_collective_time_s("all_reduce", 1e6, c.collective_group((0, 1)), eff)
        assert t == across
        assert t > inside  # PaSE's first-devices approximation would have priced the NVSwitch


class TestCosts:
    def test_unsplit_op_on_the_fast_device_costs_the_fast_time(self):
        g, c = two_relus(), slow_first_pair()
        problem = build_problem(g, c)
        v = [o.name for o in g.ops].index("a")
        cm = CostModel()
        costs = {cfg: float(t) for cfg, t in zip(problem.configs[v], problem.vertex_cost[v])}
        fast = sum(cm.partition_times_s(g["a"], {}, g.precision, c.device_type(1)))
        slow = sum(cm.partition_times_s(g["a"], {}, g.precision, c.device_type(0)))
        assert costs[Config.single(1)] == fast
        assert costs[Config.single(0)] == slow > fast

    def test_hand_computed_edge_between_devices(self):
        """Producer whole on device 0, consumer whole on device 1: the full tensor moves,
        forward and back, over the path between them; on the same device nothing moves."""
        g, c = two_relus(), slow_first_pair()
        problem = build_problem(g, c)
        names = [o.name for o in g.ops]
        u, v = names.index("a"), names.index("b")
        m = problem.edges[(u, v)]
        cu, cv = problem.configs[u].index(Config.single(0)), problem.configs[v].index(Config.single(1))
        grp = c.collective_group((0, 1))
        nbytes = 2 * 64 * 4096 * 4  # activations and their gradients, fp32
        assert g.precision == "fp32"
        want = transfer_time_s(nbytes, group_rates(grp, CostModel().links)[0],
                               max(grp.latency_s, grp.inter_latency_s), 1.0)
        assert m[cu, cv] == pytest.approx(want, rel=1e-12)
        same = problem.configs[v].index(Config.single(0))
        assert m[cu, same] == 0.0

    def test_pase_puts_the_chain_on_the_fast_device(self):
        r = pase(two_relus(), slow_first_pair())
        assert r.best["a"].devices == (1,) and r.best["b"].devices == (1,)

    @pytest.mark.parametrize("model,cluster", [("alexnet", "p100-4x4"), ("rnnlm", "k80-16x4")])
    def test_homogeneous_tables_are_pases_first_k_devices(self, model, cluster):
        """Regression guard: on one device type the configs are PaSE's own and a parameter's
        all-reduce is priced over the first ``replicas`` devices, as before this change."""
        g, c = resolve_model(model), preset(cluster)
        problem = build_problem(g, c, max_table_bytes=None)
        cm, eff = CostModel(), CostModel().links
        for op, cs, costs in zip(g.ops, problem.configs, problem.vertex_cost):
            assert cs == pase_configs(op, c.num_devices)
            if op.kind == "input" or not op.param_count or any(d.kind == "R" for d in op.dims):
                continue
            for cfg, t in zip(cs, costs):
                repl = math.prod(cfg.degree(d.name) for d in op.dims if all(a is None for a in d.param_axes))
                want = compute_time_s(op, cfg, g.precision, c, cm)
                elems = op.partition_param_elements(cfg.degrees)
                if repl > 1 and elems > 0:
                    want += group_collective_time_s("all_reduce", elems * 4, c.collective_group(tuple(range(repl))),
                                                    eff)
                assert float(t) == want


def test_alexnet_with_the_v100_node_listed_first_runs_on_the_h100s(monkeypatch):
    """Regression (issue 28): PaSE put k-way configs on devices 0..k-1; with the V100 node
    listed first its AlexNet plan simulated at 15.3 ms. Choosing the devices, it runs on the
    H100s and simulates as fast as with the H100 node listed first."""
    g = resolve_model("alexnet")
    after = pase(g, mixed8(v100_first=True))
    h100s = set(range(4, 8))
    assert all(set(after.best[op.name].devices) <= h100s for op in g.ops if op.kind != "input")
    assert after.baseline_returned is None
    assert after.best_time_s == pytest.approx(pase(g, mixed8()).best_time_s, rel=1e-9)
    monkeypatch.setattr(pase_placement, "is_mixed", lambda cluster: False)  # PaSE's first-k placement
    before = pase(g, mixed8(v100_first=True))
    before_s = before.best.found_by.get("plan_time_s", before.best_time_s)
    assert after.best_time_s < 0.5 * before_s


def test_differentiable_search_reads_the_placed_configs():
    """It shares PaSE's tables: its configs come from the placed space (device 1 alone is
    one) and its F is the tables' cost of its choice. (It is a local search from data
    parallel: on this pair it may keep the split, so only consistency is asserted.)"""
    g, c = two_relus(), slow_first_pair()
    problem = build_problem(g, c)
    assert all(Config.single(1) in cs for op, cs in zip(g.ops, problem.configs) if op.kind != "input")
    r = differentiable(g, c, Budget(iterations=40), seed=0)
    choice = [cs.index(r.best[op.name]) for op, cs in zip(g.ops, problem.configs)]
    assert r.best.found_by["model_cost_s"] == pytest.approx(problem.cost(choice), rel=1e-12)
