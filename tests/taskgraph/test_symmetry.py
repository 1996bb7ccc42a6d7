"""Exact symmetric reduction (engine.taskgraph.find_symmetry, build_task_graph's
``symmetry``): simulating one representative per set of identical replicas gives exactly the
full simulation's makespan and per-device results, with several times fewer tasks; it is not
used where replicas would contend for a shared link or differ in hardware, nor where
transfers cross replicas."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cluster import preset
from engine.formats import resolve_model
from engine.sim.trace import COMPUTE_TID, write_chrome_trace
from engine.sim.memory import memory_report
from engine.search.baselines import data_parallel, expert
from engine.layout.build import fsdp
from engine.sim.full import simulate
from engine.strategy import Config, Strategy
from engine.taskgraph import BWD, FWD, UPDATE, Symmetry, build_task_graph, find_symmetry
from engine.layout import Layout, build_layout

MODELS: dict[str, object] = {}


def model(name: str):
    if name not in MODELS:
        MODELS[name] = resolve_model(name)
    return MODELS[name]


#: (id, model, cluster, strategy builder, minimum task reduction factor)
SYMMETRIC = [
    ("gpt2-megatron-tp4", "gpt2", "dgx-a100-80gb:1", lambda g, c: build_layout(g, c, Layout(tp=4, micro_batch=1)), 3),
    ("gpt2-megatron-tp4-dp2", "gpt2", "dgx-a100-80gb:1", lambda g, c: build_layout(g, c, Layout(tp=4, dp=2)), 1.5),
    ("gpt2-megatron-tp2-pp4", "gpt2", "dgx-a100-80gb:2",
     lambda g, c: build_layout(g, c, Layout(tp=2, pp=4, micro_batch=1)), 3),
    ("inception-dp-microbatch", "inception_v3", "dgx-a100-80gb:2",
     lambda g, c: data_parallel(g, c, micro_batch=2), 3),
    ("gpt2-fsdp-zero3", "gpt2", "dgx-a100-80gb:1", lambda g, c: fsdp(g, c, Layout(zero_stage=3)), 3),
    # (issue 43: oversubscribed pods of two nodes, a stage a node: replicas stay in their pods)
    ("gpt2-pp4-pods", "gpt2", "dgx-a100-80gb:4+pod=16+oversub=4",
     lambda g, c: build_layout(g, c, Layout(tp=1, pp=4, micro_batch=1)), 3),
]
IDS = [case[0] for case in SYMMETRIC]

class Run:
    """Both simulations of one case, built once."""

    def __init__(self, model_name: str, cluster_name: str, build) -> None:
        self.graph = g = model(model_name)
        self.cluster = c = preset(cluster_name)
        self.strategy = s = build(g, c)
        self.sym = find_symmetry(g, s, c)
        self.reduced = build_task_graph(g, s, c, symmetry="auto")
        self.full = build_task_graph(g, s, c, symmetry="off")
        self.tl_reduced = simulate(self.reduced)
        self.tl_full = simulate(self.full)
        self.mem_reduced = memory_report(g, s, c, self.tl_reduced)
        self.mem_full = memory_report(g, s, c, self.tl_full)


@pytest.fixture(scope="module", params=SYMMETRIC, ids=IDS)
def case(request) -> tuple[Run, int]:
    _, m, c, build, factor = request.param
    return Run(m, c, build), factor


# --------------------------------------------------------------------------- exactness


class TestExactReduction:
    def test_symmetry_is_found_and_used(self, case):
        r, _ = case
        assert isinstance(r.sym, Symmetry)
        assert r.sym.replicas > 1
        assert r.reduced.info["symmetry"] == r.sym
        assert r.reduced.info["cross_replica_transfers"] == 0
        assert r.full.info["symmetry"] is None

    def test_makespan_is_exactly_the_full_one(self, case):
        r, _ = case
        assert r.tl_reduced.makespan_s == r.tl_full.makespan_s

    def test_several_times_fewer_tasks(self, case):
        r, factor = case
        assert r.reduced.num_tasks * factor <= r.full.num_tasks

    def test_device_busy_time_of_every_device(self, case):
        r, _ = case
        np.testing.assert_array_equal(r.tl_reduced.device_busy_s, r.tl_full.device_busy_s)
        np.testing.assert_array_equal(r.tl_reduced.utilization, r.tl_full.utilization)

    @pytest.mark.parametrize("field", ["weights_bytes", "grads_bytes", "optimizer_bytes", "activations_peak_bytes",
                                       "capacity_bytes"])
    def test_memory_components_of_every_device(self, case, field):
        r, _ = case
        np.testing.assert_array_equal(getattr(r.mem_reduced, field), getattr(r.mem_full, field))

    def test_comm_buffers_of_every_device(self, case):
        # regression: buffers of collectives with no representative member are mirrored
        r, _ = case
        np.testing.assert_array_equal(r.mem_reduced.comm_buffer_bytes, r.mem_full.comm_buffer_bytes)

    def test_memory_peak_of_every_device(self, case):
        r, _ = case
        np.testing.assert_array_equal(r.mem_reduced.peak_bytes, r.mem_full.peak_bytes)
        assert r.mem_reduced.feasible == r.mem_full.feasible

    def test_comm_bytes_of_every_replica(self, case):
        """Regression (issue 12): ``comm_bytes`` counted only the representatives' transfers
        and collectives (GPT-2 tp4 dp2: 6.00 GB printed, 10.14 GB real); a representative's
        task now stands for each of its mirror images."""
        r, _ = case
        assert r.reduced.comm_bytes == pytest.approx(r.full.comm_bytes, rel=1e-12)
        assert r.tl_reduced.comm_bytes == pytest.approx(r.tl_full.comm_bytes, rel=1e-12)


class TestDeviceImage:
    def test_representatives_map_to_themselves(self, case):
        r, _ = case
        image = r.reduced.info["device_image"]
        used = image >= 0
        assert image.shape == (r.cluster.num_devices,)
        np.testing.assert_array_equal(image[image[used]], image[used])
        assert np.unique(image[used]).size * r.sym.replicas == np.count_nonzero(used)

    def test_only_representatives_hold_compute_tasks(self, case):
        r, _ = case
        tg = r.reduced
        image = tg.info["device_image"]
        # every device has an optimizer-step slot; only representatives' slots do work
        on_dev = (tg.kind == FWD) | (tg.kind == BWD) | ((tg.kind == UPDATE) & (tg.dur_s > 0))
        reps = set(np.unique(image[image >= 0]).tolist())
        assert set(np.unique(tg.device[on_dev]).tolist()) == reps

    def test_full_image_is_the_identity(self, case):
        r, _ = case
        image = r.full.info["device_image"]
        used = np.nonzero(image >= 0)[0]
        np.testing.assert_array_equal(image[used], used)


# --------------------------------------------------------------------------- not used


@pytest.mark.parametrize("cluster_name, why", [
    ("p100-4x4", "4 GPUs share one NIC: replicas contend for it"),
    ("hetero-demo", "three node kinds with different GPUs"),
    ("dgx-a100-80gb:2+pod=8+oversub=4", "replicas in two pods: their groups cross pods where the representative's do not"),
])
def test_no_symmetry_on_shared_or_heterogeneous_hardware(cluster_name, why):
    g = model("alexnet")
    c = preset(cluster_name)
    s = data_parallel(g, c)
    assert find_symmetry(g, s, c) is None, why
    auto = build_task_graph(g, s, c, symmetry="auto")
    off = build_task_graph(g, s, c, symmetry="off")
    assert auto.info["symmetry"] is None
    assert auto.num_tasks == off.num_tasks
    assert simulate(auto).makespan_s == simulate(off).makespan_s


def test_same_strategy_is_reduced_on_a_dgx():
    """The contrast to the test above: the same data-parallel strategy on one NIC per GPU."""
    g = model("alexnet")
    c = preset("dgx-a100-80gb:2")
    s = data_parallel(g, c)
    sym = find_symmetry(g, s, c)
    assert sym is not None and sym.axes == ((16, 1),)
    assert build_task_graph(g, s, c).num_tasks * 8 <= build_task_graph(g, s, c, symmetry="off").num_tasks


def test_cross_replica_transfers_fall_back_to_the_full_graph():
    """FlexFlow's expert strategy: convs split by sample and FC layers by feature over the
    same 8 devices share the axis (8, 1), but the FC layers gather activations from every
    replica; the builder detects this and simulates everything."""
    g = model("alexnet")
    c = preset("dgx-a100-80gb:1")
    s = expert(g, c)
    assert find_symmetry(g, s, c) is not None
    auto = build_task_graph(g, s, c, symmetry="auto")
    off = build_task_graph(g, s, c, symmetry="off")
    assert auto.info["symmetry"] is None
    assert auto.num_tasks == off.num_tasks
    assert simulate(auto).makespan_s == simulate(off).makespan_s


def test_single_device_has_no_symmetry():
    g = model("alexnet")
    c = preset("dgx-a100-80gb:1")
    s = Strategy({op.name: Config({}, [0]) for op in g.ops})
    assert find_symmetry(g, s, c) is None
    tg = build_task_graph(g, s, c)
    assert tg.info["symmetry"] is None


# --------------------------------------------------------------------------- traces


class TestTraceOfAReducedRun:
    """build_task_graph: with symmetry "the timeline then holds the representatives' tasks";
    the trace draws each one's compute on every device it stands for (regression, issue 12:
    compute was drawn on the representatives only), collectives on every rank of a
    representative's group, and memory counters on every device (mirrored by memory_report)."""

    @pytest.fixture(scope="class")
    @staticmethod
    def events(tmp_path_factory):
        r = Run(*SYMMETRIC[0][1:4])
        path = tmp_path_factory.mktemp("sym") / "t.json"
        write_chrome_trace(path, r.graph, r.cluster, r.tl_reduced, r.mem_reduced)
        with open(path, encoding="utf-8") as f:
            return r, json.load(f)["traceEvents"]

    def test_compute_events_on_every_device_like_the_full_run(self, events):
        r, evs = events
        image = r.reduced.info["device_image"]
        used = set(np.flatnonzero(image >= 0).tolist())
        reps = set(np.unique(image[image >= 0]).tolist())
        assert len(reps) < len(used)
        compute = [e for e in evs if e["ph"] == "X" and e.get("tid") == COMPUTE_TID
                   and e["pid"] < r.cluster.num_devices]
        assert {e["pid"] for e in compute} == used
        full = {(int(d), round(float(s * 1e6), 3)) for d, s, k in
                zip(r.full.device, r.tl_full.start_s, r.full.kind) if k in (FWD, BWD)}
        drawn = {(e["pid"], e["ts"]) for e in compute if e["cat"] in ("fwd", "bwd")}
        assert drawn == full  # the same compute events, device by device, as simulating every device
        mirrored = [e for e in compute if "mirrors_device" in e.get("args", {})]
        assert mirrored and all(image[e["pid"]] == e["args"]["mirrors_device"] for e in mirrored)

    def test_every_device_is_declared_and_has_a_memory_track(self, events):
        r, evs = events
        D = r.cluster.num_devices
        assert {e["pid"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"} >= set(range(D))
        assert {e["pid"] for e in evs if e["ph"] == "C"} == set(range(D))

    def test_collectives_reach_mirrored_devices(self, events):
        r, evs = events
        image = r.reduced.info["device_image"]
        coll_pids = {e["pid"] for e in evs if e["ph"] == "X" and e.get("cat") == "collective"}
        assert any(image[d] != d for d in coll_pids)

    def test_mirrored_memory_tracks_peak_like_the_full_run(self, events):
        r, evs = events
        for d in range(r.cluster.num_devices):
            top = max(e["args"]["GB"] for e in evs if e["ph"] == "C" and e["pid"] == d)
            assert top == pytest.approx(r.mem_full.peak_bytes[d] / 1e9, abs=1e-6)


def test_sequence_parallel_keeps_every_axis():
    """Sequence parallelism's all-gathers are collectives over the tensor-parallel group (as
    Megatron-LM runs them), not transfers across replicas, so the tensor-parallel ranks mirror
    one another like the data-parallel ones: both axes kept (3,037 tasks against the full
    build's 11,131), with the full build's makespan and bytes."""
    g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
    s = build_layout(g, c, Layout(tp=2, pp=2, vpp=2, recompute="selective", sequence_parallel=True))
    sym = build_task_graph(g, s, c)
    full = build_task_graph(g, s, c, symmetry="off")
    assert sym.info["symmetry"] is not None and sym.info["symmetry"].axes == ((2, 1), (2, 2))
    assert sym.num_tasks < 0.3 * full.num_tasks
    a, b = simulate(sym), simulate(full)
    assert a.makespan_s == b.makespan_s and a.comm_bytes == b.comm_bytes


def test_tables_hold_one_column_per_representative():
    """Under symmetry an op's task tables ([microbatch, partition] handles) point every
    mirrored partition at its representative's tasks; where one representative stands for all
    they are read-only views of that one column (GPT-3 175B on 1,024 GPUs: 710 MB of copies
    before), equal to the copies, and a writer would fail loudly."""
    from engine.costs import CostModel
    from engine.taskgraph import TaskGraphBuilder

    g, c = model("gpt2"), preset("dgx-a100-80gb:2")
    s = build_layout(g, c, Layout(tp=4, pp=2, micro_batch=1))
    sym = find_symmetry(g, s, c)
    assert sym is not None
    b = TaskGraphBuilder(g, s, c, CostModel(), sym)
    b.build()
    t = b.tables
    viewed = 0
    for oi, fwd in t.fwd.items():
        reps = np.flatnonzero(t.rep[oi])
        for table in (t.fwd, t.bwd):
            if oi not in table:
                continue
            tab = table[oi]
            assert tab.shape == (s.pipeline.microbatches, t.devs[oi].size)
            # every partition's column is its representative's
            assert np.array_equal(tab, tab[:, t.image[oi]])
            if reps.size == 1:
                viewed += 1
                assert tab.strides[1] == 0 and not tab.flags.writeable
                with pytest.raises(ValueError):
                    tab[0, 0] = 0
    assert viewed > len(g.ops)


class TestFoundOnce:
    """find_symmetry remembers what it found by the identity of the graph, the strategy's
    configs and the cluster (a page's size check and its build ask for the same one); a
    different strategy, or the same configs with other axes, is looked at afresh."""

    def test_same_configs_same_answer_computed_once(self, monkeypatch):
        import dataclasses

        import engine.taskgraph.symmetry as S

        g, c = model("gpt2"), preset("dgx-a100-80gb:1")
        s = build_layout(g, c, Layout(tp=4, micro_batch=1))
        calls = []
        real = S._find
        monkeypatch.setattr(S, "_find", lambda *a: calls.append(a[3]) or real(*a))
        S.forget_found()
        first = find_symmetry(g, s, c)
        copy = dataclasses.replace(s, found_by={"source": "a copy with its own provenance"})
        assert find_symmetry(g, copy, c) is first  # (the same configs mapping)
        assert len(calls) == 1
        assert first is not None and first.axes
        # other axes: computed, and what the uncached search gives
        sub = find_symmetry(g, s, c, axes=first.axes[:1])
        assert len(calls) == 2 and sub == real(g, s, c, first.axes[:1])
        S.forget_found()  # (what a quiet server calls: the configs held are let go)
        assert not S._FOUND
        assert find_symmetry(g, s, c) == first and len(calls) == 3

    def test_other_configs_not_confused(self):
        import engine.taskgraph.symmetry as S

        g, c = model("gpt2"), preset("dgx-a100-80gb:1")
        tp4 = build_layout(g, c, Layout(tp=4, micro_batch=1))
        dp = data_parallel(g, c)
        S.forget_found()
        a, b = find_symmetry(g, tp4, c), find_symmetry(g, dp, c)
        assert a == S._find(g, tp4, c, None) and b == S._find(g, dp, c, None)
        assert a != b


@pytest.mark.parametrize("cluster_name, layout, axes", [
    ("dgx-a100-80gb:4+nics=2", dict(tp=8, pp=2), ((2, 8),)),  # (tp in a node: its axis dropped, dp moves nodes)
    ("dgx-a100-80gb:4+nics=1", dict(tp=8, pp=1), ((4, 8),)),
    ("dgx-a100-80gb:4+nics=4+pod=16+oversub=4", dict(tp=8, pp=2), ((2, 8),)),
    ("dgx-a100-80gb:2+nics=2", dict(tp=4, pp=1), ((4, 4),)),  # (dp moves a NIC's four GPUs to the other NIC's)
    ("dgx-a100-80gb:2+nics=1", dict(tp=4, pp=1), None),  # (dp moves half a node: both halves on one NIC)
    ("dgx-a100-80gb:4+nics=2", dict(tp=2, pp=2), None),  # (dp moves 2 GPUs: replicas on one NIC)
])
def test_shared_nics_keep_the_axes_that_move_whole_nodes(cluster_name, layout, axes):
    """Issue 43's network axis: where a node's GPUs share NICs, a replica on another NIC's GPUs
    meets the same contention there as its representative does on its own, so the axes that
    move whole groups of a NIC's GPUs stay exact (the simulation equals the one without
    symmetry, to the bit)."""
    from engine.models.transformer import GPTConfig, gpt

    g = gpt(GPTConfig(4, 512, 8, 256, 4096, 16, name="t"), source="test")
    c = preset(cluster_name)
    s = build_layout(g, c, Layout(micro_batch=1, **layout))
    sym = find_symmetry(g, s, c)
    assert (sym.axes if sym is not None else None) == axes
    auto, off = build_task_graph(g, s, c, symmetry="auto"), build_task_graph(g, s, c, symmetry="off")
    tl_auto, tl_off = simulate(auto), simulate(off)
    assert tl_auto.makespan_s == tl_off.makespan_s
    np.testing.assert_array_equal(memory_report(g, s, c, tl_auto).peak_bytes, memory_report(g, s, c, tl_off).peak_bytes)
    if axes:
        assert auto.num_tasks < off.num_tasks


def test_replicas_that_would_share_a_nic_keep_no_symmetry(monkeypatch):
    """Placed by hand so that a tensor-parallel pair straddles two NICs' GPUs (data-parallel
    replica j, tp rank r on GPU 2j + 3r; 2 GPUs a NIC): the data-parallel axis moves whole NIC
    groups, yet replica 1's GPU 2 shares a NIC with the representative's GPU 3. No symmetry is
    kept; forcing it would lose that contention (the reduced run differs from the full one).
    Its replicas' GPUs do not fill whole nodes either (GPUs 1 and 16 idle): ``_nodes_alike``
    refuses it too, and is forced here as well."""
    from engine.models.transformer import GPTConfig, gpt
    from engine.strategy import Strategy
    from engine.taskgraph import symmetry as SYM

    g = gpt(GPTConfig(2, 512, 8, 256, 4096, 16, name="t"), source="test")
    made = build_layout(g, preset("dgx-a100-80gb:2"), Layout(tp=2, micro_batch=1))
    moved = Strategy({n: Config(dict(cfg.degrees), [d + 2 * (d % 2) for d in cfg.devices])
                      for n, cfg in made.configs.items()})
    c = preset("dgx-a100-80gb:3+nics=4")
    assert find_symmetry(g, moved, c) is None
    off = simulate(build_task_graph(g, moved, c, symmetry="off")).makespan_s
    assert simulate(build_task_graph(g, moved, c, symmetry="auto")).makespan_s == off
    SYM.forget_found()
    assert not SYM._nodes_alike(g, moved, SYM._common_axes(g, moved, ((8, 2),), factors=False), 8)
    monkeypatch.setattr(SYM, "_nics_apart", lambda *a: True)
    monkeypatch.setattr(SYM, "_nodes_alike", lambda *a: True)
    forced = find_symmetry(g, moved, c)
    assert forced is not None and forced.axes == ((8, 2),)
    assert simulate(build_task_graph(g, moved, c, symmetry="auto")).makespan_s != off
    SYM.forget_found()


def _shifted(small: str, tp: int, pp: int, shift: int):
    """GPT-2 (batch 16) laid out on ``small`` (tp x pp, the rest data parallel), every device
    moved ``shift`` GPUs along: a hand placement a larger cluster takes as it is."""
    from dataclasses import replace

    from engine.models import build_sample

    g = build_sample("gpt2", batch=16)
    made = build_layout(g, preset(small), Layout(tp=tp, pp=pp, micro_batch=1))
    return g, replace(made, configs={n: Config(dict(cfg.degrees), [d + shift for d in cfg.devices])
                                     for n, cfg in made.configs.items()})


def test_a_replica_across_two_nodes_keeps_no_symmetry():
    """Issue 43's review: tp 4 x dp 4 moved 2 GPUs along three DGX H100 nodes puts replica 1's
    tensor-parallel group on GPUs 6-9, across two nodes, where the representative's (2-5) is
    in one. The reduction took 0.0471 s for 0.0558 s in full; no symmetry is kept now, and the
    run is the full one."""
    g, moved = _shifted("dgx-h100:2", 4, 1, 2)
    c = preset("dgx-h100:3")
    assert find_symmetry(g, moved, c) is None
    off = simulate(build_task_graph(g, moved, c, symmetry="off")).makespan_s
    assert simulate(build_task_graph(g, moved, c, symmetry="auto")).makespan_s == off


@pytest.mark.parametrize("cluster", ["dgx-h100:3", "h100-pcie:3", "dgx-h100:3+nics=2", "v100-dgx2:2"])
@pytest.mark.parametrize("small, tp, pp", [("dgx-h100:1", 4, 1), ("dgx-h100:1", 2, 2), ("dgx-h100:2", 4, 1),
                                           ("dgx-h100:2", 2, 1), ("dgx-h100:2", 4, 2)])
@pytest.mark.parametrize("shift", [0, 2, 4, 6, 8])
def test_shifted_placements_reduce_only_where_exact(cluster, small, tp, pp, shift):
    """A placement moved by part of a node: wherever a symmetry is kept, the reduced run gives
    the full run's time and peak memory to the bit (of 164 such placements the reduction
    accepted before, 47 were 0.02-8% off). Where the GPUs fill whole nodes, moved by none or a
    whole node, the symmetry stays."""
    from engine.sim.report import simulate_strategy

    g, moved = _shifted(small, tp, pp, shift)
    c = preset(cluster)
    assert max(max(cfg.devices) for cfg in moved.configs.values()) < c.num_devices
    sym = find_symmetry(g, moved, c)
    used = {d for cfg in moved.configs.values() for d in cfg.devices}
    if shift % c.gpus_per_node == 0 and len(used) % c.gpus_per_node == 0 and "nics" not in cluster:
        assert sym is not None
    if sym is None:
        return
    a = simulate_strategy(g, moved, c, check=False)
    b = simulate_strategy(g, moved, c, check=False, symmetry="off")
    assert a.tasks.num_tasks < b.tasks.num_tasks
    assert a.iteration_time_s == b.iteration_time_s
    assert max(a.memory.peak_bytes) == max(b.memory.peak_bytes)


_PLACED = {}  # (small cluster, tp, pp) -> (graph, strategy laid out there): built once a process
_KEPT: list[str] = []  # the property's examples that kept a symmetry (the next test reads it)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(cluster=st.sampled_from(["dgx-h100:3", "h100-pcie:3", "dgx-h100:3+nics=2", "v100-dgx2:2",
                                "dgx-h100:4+pod=16+oversub=2", "rtx4090:3"]),
       small=st.sampled_from(["dgx-h100:1", "dgx-h100:2"]), tp=st.sampled_from([1, 2, 4]),
       pp=st.sampled_from([1, 2]), nodes=st.integers(0, 2), part=st.sampled_from([0, 0, 0, 0, 0, 1, 2, 4, 6]))
def test_symmetry_is_exact_wherever_kept(cluster, small, tp, pp, nodes, part):
    """Property: whatever a placement's shift along the cluster (part of a node, whole nodes,
    onto NICs shared or pods), a symmetry kept gives the full run's time and peak memory to the
    bit (issue 43's review found 47 of 164 such runs off before ``_nodes_alike``)."""
    from dataclasses import replace

    from engine.models import build_sample
    from engine.sim.report import simulate_strategy

    key = (small, tp, pp)
    if key not in _PLACED:
        g = build_sample("gpt2", batch=16)
        _PLACED[key] = (g, build_layout(g, preset(small), Layout(tp=tp, pp=pp, micro_batch=1)))
    g, made = _PLACED[key]
    c = preset(cluster)
    # (moved by whole nodes and part of one, within the cluster)
    shift = (nodes * c.gpus_per_node + part) % (c.num_devices - max(max(cfg.devices) for cfg in made.configs.values()))
    moved = replace(made, configs={n: Config(dict(cfg.degrees), [d + shift for d in cfg.devices])
                                   for n, cfg in made.configs.items()})
    if find_symmetry(g, moved, c) is None:
        return
    _KEPT.append(cluster)
    a = simulate_strategy(g, moved, c, check=False)
    b = simulate_strategy(g, moved, c, check=False, symmetry="off")
    assert a.iteration_time_s == b.iteration_time_s
    assert max(a.memory.peak_bytes) == max(b.memory.peak_bytes)


def test_the_property_above_kept_symmetries():
    """The property is not vacuous: some of its examples keep a symmetry (16 of 60 on
    2026-12-01, on four of its six clusters; derandomized, its examples are fixed for one
    hypothesis version)."""
    if not _KEPT:
        test_symmetry_is_exact_wherever_kept()
    assert len(_KEPT) >= 5, _KEPT
