"""Clusters: presets, device specs, links and paths, validation errors, round trips.

Device and link figures are pinned against ``validation/hardware_specs.csv`` (the
row and column are cited beside each value); bandwidths are bytes/s per direction.
"""

from __future__ import annotations

import json
import math
from functools import cache
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cluster import (
    DEVICE_TYPES,
    MAX_DEVICES,
    PRESETS,
    Cluster,
    DeviceType,
    Link,
    NodeSpec,
    cluster_from_dict,
    preset,
    preset_names,
)
from engine.errors import ValidationError

GIB = 2**30
PRESET_LIST = ("p100-4x4, k80-16x4, dgx-a100-80gb:N, dgx-a100-40gb:N, dgx-h100:N, dgx-h200:N, v100-dgx2:N, "
               "dgx-b200:N, gb200-nvl72:N, dgx-b300:N, gb300-nvl72:N, gb200-nvl72-seg16:N, "
               "gb300-nvl72-seg16:N, gh200:N, h100-pcie:N, grand-teton:N, rtx4090:N, rtx3090:N, rtx2080ti:N, "
               "titan-rtx:N, hetero-demo")
#: One buildable name per preset (sized ones at two nodes, so they have a network).
EXAMPLES = ["p100-4x4", "k80-16x4", "dgx-a100-80gb:2", "dgx-a100-40gb:2", "dgx-h100:2", "dgx-h200:2", "v100-dgx2:2",
            "dgx-b200:2", "gb200-nvl72:2", "dgx-b300:2", "gb300-nvl72:2", "gb200-nvl72-seg16:2",
            "gb300-nvl72-seg16:2", "gh200:2", "h100-pcie:2", "grand-teton:2", "rtx4090:2", "rtx3090:2",
            "rtx2080ti:2", "titan-rtx:2", "hetero-demo"]


@cache
def cached(name: str) -> Cluster:
    """Presets are immutable (paths are memoised inside), so tests may share them."""
    return preset(name)


def kinds(c: Cluster, a: int, b: int) -> list[str]:
    return [c.links[i].kind for i in c.path(a, b)]


def endpoints(c: Cluster, a: int, b: int) -> list[tuple[str, str]]:
    return [(c.links[i].src, c.links[i].dst) for i in c.path(a, b)]


def node_spec(**kw) -> NodeSpec:
    base = {"name": "n", "gpus": 4, "device_type": "A100-SXM4-80GB", "intra_topology": "switch",
            "intra_bw_bytes_per_s": 300e9}
    base.update(kw)
    return NodeSpec(**base)


def problem_text(exc: pytest.ExceptionInfo) -> list[str]:
    return [str(p) for p in exc.value.problems]


# --------------------------------------------------------------------------- presets


class TestPreset:
    def test_every_preset_has_an_example(self):
        assert sorted(n.split(":")[0] for n in EXAMPLES) == sorted(PRESETS)
        assert ", ".join(preset_names()) == PRESET_LIST

    def test_p100_4x4(self):
        c = cached("p100-4x4")
        assert (c.num_devices, c.num_nodes) == (16, 4)
        assert {d.type for d in c.devices} == {"P100-SXM2-16GB"}
        assert c.node_names == ("node0", "node1", "node2", "node3")
        assert [d.node for d in c.devices] == [i // 4 for i in range(16)]
        assert c.devices[5].name == "node1/gpu1"

    def test_k80_16x4(self):
        c = cached("k80-16x4")
        assert (c.num_devices, c.num_nodes) == (64, 16)
        assert {d.type for d in c.devices} == {"K80-GK210"}

    @pytest.mark.parametrize("base, per_node, dtype", [
        ("dgx-a100-80gb", 8, "A100-SXM4-80GB"),
        ("dgx-a100-40gb", 8, "A100-SXM4-40GB"),
        ("dgx-h100", 8, "H100-SXM5-80GB"),
        ("dgx-h200", 8, "H200-SXM-141GB"),
        ("v100-dgx2", 16, "V100-SXM3-32GB"),
    ])
    @pytest.mark.parametrize("n", [1, 3])
    def test_sized(self, base, per_node, dtype, n):
        c = preset(f"{base}:{n}")
        assert c.name == f"{base}:{n}"
        assert (c.num_devices, c.num_nodes) == (per_node * n, n)
        assert {d.type for d in c.devices} == {dtype}

    def test_single_node_has_no_network(self):
        c = cached("dgx-h100:1")
        assert {lk.kind for lk in c.links} == {"nvlink"}
        assert len(c.links) == 16  # 8 GPUs x (to switch, from switch)

    def test_hetero_demo(self):
        c = cached("hetero-demo")
        assert (c.num_devices, c.num_nodes) == (12, 3)
        assert [d.type for d in c.devices] == (["H100-SXM5-80GB"] * 4 + ["A100-SXM4-40GB"] * 4
                                               + ["V100-SXM2-32GB"] * 4)
        assert c.summary() == "3 node(s), 12 GPUs (4 x H100-SXM5-80GB, 4 x A100-SXM4-40GB, 4 x V100-SXM2-32GB)"

    def test_whitespace_is_ignored(self):
        assert preset("  dgx-h100:2 ").num_devices == 16

    def test_exactly_max_devices_builds(self):
        c = preset(f"dgx-a100-80gb:{MAX_DEVICES // 8}")
        assert c.num_devices == MAX_DEVICES == 16384


class TestPresetErrors:
    def test_unknown(self):
        with pytest.raises(ValueError) as exc:
            preset("tpu-v4")
        # (a preset name never opens a file; the CLI's resolver adds "(or a cluster file)")
        assert str(exc.value) == f"unknown cluster 'tpu-v4'; presets: {PRESET_LIST}"

    def test_empty_name(self):
        with pytest.raises(ValueError, match=r"^unknown cluster ''; presets: p100-4x4"):
            preset("")

    def test_missing_count(self):
        with pytest.raises(ValueError) as exc:
            preset("dgx-a100-80gb")
        assert str(exc.value) == "cluster 'dgx-a100-80gb' needs a node count: dgx-a100-80gb:N, e.g. dgx-a100-80gb:2"

    def test_zero_count(self):
        with pytest.raises(ValueError) as exc:
            preset("dgx-h100:0")
        assert str(exc.value) == "cluster 'dgx-h100:0': node count must be at least 1"

    def test_negative_count(self):
        # Regression: a negative count used to be reported as an unknown cluster.
        with pytest.raises(ValueError) as exc:
            preset("dgx-h100:-1")
        assert str(exc.value) == "cluster 'dgx-h100:-1': node count must be at least 1"

    def test_fixed_size_given_a_count(self):
        with pytest.raises(ValueError) as exc:
            preset("p100-4x4:4")
        assert str(exc.value) == "cluster 'p100-4x4' has a fixed size; write 'p100-4x4' without ':4'"

    def test_over_max_devices(self):
        with pytest.raises(ValidationError) as exc:
            preset("dgx-a100-80gb:2049")  # 2049 x 8 = 16,392
        assert str(exc.value) == ("dgx-a100-80gb:2049: 1 problem found:\n"
                                  "  - nodes: 16,392 GPUs is over the limit of 16,384 (dgx-a100-80gb:2048 is the "
                                  "largest)")
        assert isinstance(exc.value, ValueError)  # preset() documents ValueError


# --------------------------------------------------------------------------- device types


class TestDeviceTypes:
    # Every figure below is a row of validation/hardware_specs.csv (dense peaks, no
    # 2:4 sparsity). TFLOP/s -> FLOP/s: x 1e12; GB/s -> bytes/s: x 1e9.

    def test_a100_80gb(self):
        t = DEVICE_TYPES["A100-SXM4-80GB"]
        assert t.peak("fp16") == t.peak("bf16") == 312e12  # peak_fp16_bf16_tensor_dense,312
        assert t.peak("tf32") == 156e12  # peak_tf32_tensor_dense,156
        assert t.peak("fp32") == 19.5e12  # peak_fp32_simt,19.5
        assert t.mem_bw_bytes_per_s == 2039e9  # hbm_bandwidth,2039
        assert t.memory_bytes == 80 * GIB  # hbm_capacity,80 (HBM2e)

    def test_a100_40gb(self):
        t = DEVICE_TYPES["A100-SXM4-40GB"]
        assert t.peak("fp16") == 312e12  # peak_fp16_bf16_tensor_dense,312
        assert t.mem_bw_bytes_per_s == 1555e9  # hbm_bandwidth,1555
        assert t.memory_bytes == 40 * GIB  # hbm_capacity,40 (HBM2)

    def test_h100(self):
        t = DEVICE_TYPES["H100-SXM5-80GB"]
        assert t.peak("fp16") == t.peak("bf16") == 989.4e12  # peak_bf16_fp16_tensor_dense,989.4
        assert t.peak("fp8") == 1978.9e12  # peak_fp8_tensor_dense,1978.9
        assert t.peak("tf32") == 494.7e12  # peak_tf32_tensor_dense,494.7
        assert t.peak("fp32") == 66.9e12  # peak_fp32_simt,66.9
        assert t.mem_bw_bytes_per_s == 3350e9  # hbm_bandwidth,3350
        assert t.memory_bytes == 80 * GIB  # hbm_capacity,80

    def test_v100(self):
        sxm2 = DEVICE_TYPES["V100-SXM2-32GB"]
        assert sxm2.peak("fp16") == 125e12  # V100-SXM2 peak_fp16_tensor,125
        assert sxm2.peak("fp32") == 15.7e12  # peak_fp32_simt,15.7
        assert sxm2.mem_bw_bytes_per_s == 900e9  # hbm_bandwidth,900
        # V100-SXM3-32GB (DGX-2H) implied_peak_fp16_tensor,130 (derived from the Megatron blog)
        assert DEVICE_TYPES["V100-SXM3-32GB"].peak("fp16") == 130e12

    def test_p100(self):
        t = DEVICE_TYPES["P100-SXM2-16GB"]
        assert t.peak("fp16") == 21.2e12  # peak_fp16,21.2
        assert t.peak("fp32") == 10.6e12  # notes: FP32 10.6
        assert t.mem_bw_bytes_per_s == 732e9  # hbm_bandwidth,732

    def test_k80_is_half_a_board(self):
        t = DEVICE_TYPES["K80-GK210"]
        assert t.peak("fp32") == 8.73e12 / 2  # peak_fp32_board,8.73 (board = 2 x GK210)
        assert t.mem_bw_bytes_per_s == 240e9  # memory_per_gpu,"12 GB GDDR5, 240 GB/s"
        assert t.memory_bytes == 12 * GIB

    def test_missing_precision(self):
        with pytest.raises(ValueError) as exc:
            DEVICE_TYPES["V100-SXM2-32GB"].peak("bf16")
        assert str(exc.value) == "V100-SXM2-32GB has no bf16 peak (it has fp32, fp16)"

    def test_custom_type_missing_precision(self):
        t = DeviceType("toy", {"fp32": 1e12}, 1e9, GIB)
        with pytest.raises(ValueError) as exc:
            t.peak("fp8")
        assert str(exc.value) == "toy has no fp8 peak (it has fp32)"

    def test_cluster_peaks_per_device(self):
        c = cached("hetero-demo")
        assert list(c.peak_flops_per_s("fp16")) == [989.4e12] * 4 + [312e12] * 4 + [125e12] * 4
        with pytest.raises(ValueError, match="^V100-SXM2-32GB has no bf16 peak"):
            c.peak_flops_per_s("bf16")

    def test_memory_array(self):
        c = cached("hetero-demo")
        assert list(c.arrays["device_memory_bytes"]) == [80 * GIB] * 4 + [40 * GIB] * 4 + [32 * GIB] * 4
        assert not c.arrays["device_memory_bytes"].flags.writeable


# --------------------------------------------------------------------------- links and paths


class TestLink:
    def test_transfer_time(self):
        lk = Link(0, "a", "b", bw_bytes_per_s=12.5e9, latency_s=2e-6, kind="network")
        assert lk.transfer_time_s(1e9) == pytest.approx(2e-6 + 0.08, rel=1e-15)  # 1 GB over EDR
        assert lk.transfer_time_s(0) == 2e-6

    def test_preset_network_link(self):
        c = cached("p100-4x4")
        net = c.links[c.path(0, 4)[1]]
        assert (net.kind, net.bw_bytes_per_s, net.latency_s) == ("network", 12.5e9, 2e-6)
        assert net.transfer_time_s(1e9) == pytest.approx(0.080002, rel=1e-12)


class TestPath:
    def test_same_device(self):
        assert cached("p100-4x4").path(3, 3) == ()
        assert cached("p100-4x4").path_bandwidth(3, 3) == math.inf

    def test_dgx_within_node_two_nvlink_hops(self):
        c = cached("dgx-a100-80gb:2")
        assert endpoints(c, 0, 1) == [("gpu0:send", "dgx0/switch"), ("dgx0/switch", "gpu1:recv")]
        assert kinds(c, 0, 1) == ["nvlink", "nvlink"]
        # CSV nvlink3_total_bandwidth 600 GB/s bidirectional = 300 GB/s per direction
        assert c.path_bandwidth(0, 1) == 300e9

    def test_p100_mesh_one_direct_link(self):
        c = cached("p100-4x4")
        assert endpoints(c, 0, 1) == [("gpu0:send", "gpu1:recv")]
        assert kinds(c, 0, 1) == ["nvlink"]
        assert c.path_bandwidth(0, 1) == 20e9  # NVLink1: 20 GB/s per link per direction

    def test_k80_pcie_switch(self):
        c = cached("k80-16x4")
        assert kinds(c, 0, 1) == ["pcie", "pcie"]
        assert c.path_bandwidth(0, 1) == 15.75e9  # PCIe Gen3 x16 ~15.75 GB/s per direction

    @pytest.mark.parametrize("name, a, b", [("p100-4x4", 0, 4), ("k80-16x4", 3, 60), ("dgx-a100-80gb:2", 0, 8),
                                            ("v100-dgx2:2", 15, 16), ("hetero-demo", 8, 0)])
    def test_across_nodes_four_links(self, name, a, b):
        assert kinds(cached(name), a, b) == ["pcie", "network", "network", "pcie"]

    def test_across_nodes_endpoints(self):
        assert endpoints(cached("p100-4x4"), 0, 4) == [
            ("gpu0:send", "node0/nic0:tx"), ("node0/nic0:tx", "fabric"),
            ("fabric", "node1/nic0:rx"), ("node1/nic0:rx", "gpu4:recv")]

    @pytest.mark.parametrize("name, a, b, bw", [
        ("p100-4x4", 0, 4, 12.5e9),  # InfiniBand EDR 100 Gb/s per direction
        ("k80-16x4", 0, 4, 7e9),  # FDR 56 Gb/s
        ("dgx-a100-80gb:2", 0, 8, 25e9),  # HDR 200 Gb/s
        ("dgx-h100:2", 0, 8, 50e9),  # NDR 400 Gb/s
        ("v100-dgx2:2", 0, 16, 12.5e9),  # EDR
        ("hetero-demo", 0, 4, 25e9),  # H100 (NDR, 50 GB/s) -> A100 node (HDR, 25 GB/s)
        ("hetero-demo", 4, 8, 12.5e9),  # A100 node -> V100 node (EDR)
    ])
    def test_bandwidth_is_the_bottleneck(self, name, a, b, bw):
        c = cached(name)
        assert c.path_bandwidth(a, b) == bw == min(c.links[i].bw_bytes_per_s for i in c.path(a, b))

    def test_p100_nic_uplink_is_shared(self):
        c = cached("p100-4x4")  # one NIC per node
        p0, p1 = c.path(0, 4), c.path(1, 4)
        assert p0[0] != p1[0]  # each GPU's own PCIe link to the NIC
        assert p0[1] == p1[1]  # the same node0 uplink
        assert {c.path(g, 4)[1] for g in range(4)} == {p0[1]}

    def test_dgx_one_nic_per_gpu(self):
        c = cached("dgx-a100-80gb:2")  # 8 NICs for 8 GPUs
        uplinks = [c.path(g, 8)[1] for g in range(8)]
        assert len(set(uplinks)) == 8
        assert [c.links[i].src for i in uplinks] == [f"dgx0/nic{g}:tx" for g in range(8)]
        # the receiving side uses the NIC of the receiving GPU
        assert c.links[c.path(0, 13)[2]].dst == "dgx1/nic5:rx"

    def test_hetero_two_gpus_per_nic(self):
        c = cached("hetero-demo")  # H100 node: 2 NICs for 4 GPUs -> GPU g uses NIC g*2//4
        assert [c.links[c.path(g, 8)[1]].src for g in range(4)] == [
            "h100-node/nic0:tx", "h100-node/nic0:tx", "h100-node/nic1:tx", "h100-node/nic1:tx"]

    @pytest.mark.parametrize("name", EXAMPLES)
    def test_intra_node_never_through_a_nic(self, name):
        c = cached(name)
        for a in c.devices:
            for b in c.devices:
                if a.id != b.id and a.node == b.node:
                    assert all(k != "network" for k in kinds(c, a.id, b.id))
                    assert all("nic" not in s and "nic" not in d for s, d in endpoints(c, a.id, b.id))

    def test_slow_intra_node_link_still_stays_inside(self):
        # Regression: the same-node route out through the NIC and fabric and back (4 fast
        # links) used to win over a slow intra-node interconnect.
        c = Cluster("slow", [node_spec(intra_bw_bytes_per_s=1e9, intra_kind="pcie", repeat=2)], DEVICE_TYPES)
        assert kinds(c, 0, 1) == ["pcie", "pcie"]

    def test_path_is_memoised(self):
        c = preset("p100-4x4")
        assert c.path(0, 5) is c.path(0, 5)

    def test_unknown_device(self):
        c = cached("p100-4x4")
        with pytest.raises(ValueError) as exc:
            c.path(0, 16)
        assert str(exc.value) == "device 16 does not exist; p100-4x4 has devices 0..15"
        with pytest.raises(ValueError, match="^device -1 does not exist"):
            c.path(-1, 0)


class TestCheckDevice:
    def test_valid(self):
        c = cached("p100-4x4")
        c.check_device(0)
        c.check_device(15)

    @pytest.mark.parametrize("device", [16, -1, 1.0, "3"])
    def test_missing(self, device):
        with pytest.raises(ValueError) as exc:
            cached("p100-4x4").check_device(device)
        assert str(exc.value) == f"device {device!r} does not exist; p100-4x4 has devices 0..15"


@cache
def dgx(n: int) -> Cluster:
    return preset(f"dgx-a100-80gb:{n}")


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 8), data=st.data())
def test_paths_chain_from_sender_to_receiver(n, data):
    c = dgx(n)
    a = data.draw(st.integers(0, c.num_devices - 1), label="a")
    b = data.draw(st.integers(0, c.num_devices - 1).filter(lambda x: x != a), label="b")
    p = [c.links[i] for i in c.path(a, b)]
    assert p
    assert p[0].src == f"gpu{a}:send"
    assert p[-1].dst == f"gpu{b}:recv"
    assert all(x.dst == y.src for x, y in pairwise(p))
    same_node = c.devices[a].node == c.devices[b].node
    assert len(p) == (2 if same_node else 4)


# --------------------------------------------------------------------------- validation


class TestClusterErrors:
    def test_zero_bandwidth(self):
        with pytest.raises(ValidationError) as exc:
            Cluster("t", [node_spec(intra_bw_bytes_per_s=0)], DEVICE_TYPES)
        assert str(exc.value) == ("t: 1 problem found:\n  - nodes[0] (n).intra.bw_bytes_per_s: bandwidth must be "
                                  "a finite number of bytes/s of at least 1e6 (1 MB/s), got 0")

    @pytest.mark.parametrize("bw", [-1.0, math.nan, math.inf])
    def test_bad_nic_bandwidth(self, bw):
        with pytest.raises(ValidationError) as exc:
            Cluster("t", [node_spec(nic_bw_bytes_per_s=bw, repeat=2)], DEVICE_TYPES)
        assert problem_text(exc) == [
            f"nodes[0] (n).nics.bw_bytes_per_s: bandwidth must be a finite number of bytes/s of at least 1e6 "
            f"(1 MB/s), got {bw!r}"]

    def test_negative_latency(self):
        with pytest.raises(ValidationError) as exc:
            Cluster("t", [node_spec(intra_latency_s=-1e-6)], DEVICE_TYPES)
        assert problem_text(exc) == [
            "nodes[0] (n).intra.latency_s: latency must be a number of seconds from 0 to 1, got -1e-06"]

    def test_unknown_device_type(self):
        with pytest.raises(ValidationError) as exc:
            Cluster("t", [node_spec(device_type="B200")], DEVICE_TYPES)
        assert problem_text(exc) == [
            ("nodes[0] (n).device_type: unknown device type 'B200'; known: A100-SXM4-40GB, A100-SXM4-80GB, "
             "B200-GB200-186GB, B200-SXM-180GB, B300-GB300-288GB, B300-SXM-270GB, GH200-144GB, GH200-96GB, H100-PCIe-80GB, H100-SXM5-80GB, "
             "H100-SXM5-96GB-HBM2e-500W, H200-SXM-141GB, K80-GK210, P100-SXM2-16GB, RTX-2080-Ti-11GB, RTX-3090-24GB, "
             "RTX-4090-24GB, TITAN-RTX-24GB, V100-SXM2-32GB, V100-SXM3-32GB")]

    def test_two_nodes_without_nics(self):
        with pytest.raises(ValidationError) as exc:
            Cluster("t", [node_spec(nics=0, repeat=2)], DEVICE_TYPES)
        assert problem_text(exc) == [
            "nodes[0] (n).nics.count: a cluster of 2 nodes needs at least one NIC per node, got 0"]

    def test_one_node_without_nics_is_fine(self):
        c = Cluster("t", [node_spec(nics=0)], DEVICE_TYPES)
        assert c.num_devices == 4 and {lk.kind for lk in c.links} == {"nvlink"}

    def test_more_nics_than_gpus(self):
        with pytest.raises(ValidationError) as exc:
            Cluster("t", [node_spec(gpus=2, nics=4, repeat=2)], DEVICE_TYPES)
        assert problem_text(exc) == ["nodes[0] (n).nics.count: 4 NICs for 2 GPUs: at most one NIC per GPU"]

    def test_no_nodes(self):
        with pytest.raises(ValidationError) as exc:
            Cluster("t", [], DEVICE_TYPES)
        assert problem_text(exc) == ["nodes: a cluster needs at least one node"]

    def test_every_problem_listed(self):
        with pytest.raises(ValidationError) as exc:
            Cluster("t", [node_spec(gpus=0, intra_topology="ring", intra_latency_s=-1),
                          node_spec(name="m", device_type="B200", attach_bw_bytes_per_s=0, nics=0)],
                    DEVICE_TYPES)
        assert [p.path for p in exc.value.problems] == [
            "nodes[0] (n).gpus", "nodes[0] (n).intra.topology", "nodes[0] (n).intra.latency_s",
            "nodes[1] (m).device_type", "nodes[1] (m).nics.attach_bw_bytes_per_s", "nodes[1] (m).nics.count"]
        assert "nodes[0] (n).intra.topology: must be 'switch' or 'mesh', got 'ring'" in problem_text(exc)

    def test_device_type_without_peaks(self):
        types = {"toy": DeviceType("toy", {}, 1e9, GIB)}
        with pytest.raises(ValidationError) as exc:
            Cluster("t", [node_spec(device_type="toy")], types)
        assert problem_text(exc) == ["device_types.toy.peak_flops_per_s: needs at least one precision"]

    def test_duplicate_node_names(self):
        # Regression: two groups named alike used to share one switch and one set of NICs,
        # so traffic between the two nodes crossed a single NVSwitch.
        with pytest.raises(ValidationError) as exc:
            Cluster("t", [node_spec(), node_spec()], DEVICE_TYPES)
        assert problem_text(exc) == [
            "nodes[1] (n).name: node name 'n' is already used by nodes[0]; node names must be unique"]

    def test_generated_node_name_collides(self):
        # a group "n" of 2 nodes makes n0 and n1; a later group "n1" collides with the second
        with pytest.raises(ValidationError) as exc:
            Cluster("t", [node_spec(repeat=2), node_spec(name="n1")], DEVICE_TYPES)
        assert problem_text(exc) == [
            "nodes[1] (n1).name: node name 'n1' is already used by nodes[0]; node names must be unique"]


# --------------------------------------------------------------------------- round trip


class TestRoundTrip:
    @pytest.mark.parametrize("name", EXAMPLES)
    def test_to_dict_and_back(self, name):
        c = cached(name)
        back = cluster_from_dict(json.loads(json.dumps(c.to_dict())))
        assert back.name == c.name and back.description == c.description
        assert back.devices == c.devices
        assert back.links == c.links
        assert back.node_names == c.node_names
        assert back.to_dict() == c.to_dict()

    def test_to_dict_lists_only_used_types(self):
        d = cached("p100-4x4").to_dict()
        assert list(d["device_types"]) == ["P100-SXM2-16GB"]
        assert d["format"] == "soapbox.cluster/1"

    def test_file_type_overrides_builtin(self):
        d = cached("p100-4x4").to_dict()
        d["device_types"]["P100-SXM2-16GB"]["peak_flops_per_s"] = {"fp32": 1e9}  # (the least accepted)
        c = cluster_from_dict(d)
        assert c.device_type(0).peak("fp32") == 1e9
        assert DEVICE_TYPES["P100-SXM2-16GB"].peak("fp32") == 10.6e12  # the built-in is untouched

    def test_defaults(self):
        c = cluster_from_dict({"format": "soapbox.cluster/1", "name": "tiny",
                               "nodes": [{"name": "n", "gpus": 2, "device_type": "H100-SXM5-80GB"}]})
        assert c.num_devices == 2 and kinds(c, 0, 1) == ["nvlink", "nvlink"]
