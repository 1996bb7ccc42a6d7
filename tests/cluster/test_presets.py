"""Hardware presets with cited specs (issue 25 item 6): the new device types and their pinned
peaks, the new presets, fabrics with oversubscribed pods, host memory and host bandwidth, and
the cluster file keys that carry them.

Figures are pinned to the documents cited beside each constant in
:mod:`engine.cluster.devices` and :mod:`engine.cluster.presets`; bandwidths are bytes/s per
direction.
"""

from __future__ import annotations

import json
from functools import cache

import pytest

from engine.cluster import (
    ARCHS,
    DEVICE_TYPES,
    MAX_DEVICES,
    Cluster,
    DeviceType,
    NodeSpec,
    preset,
)
from engine.errors import ValidationError
from engine.formats import load_cluster
from engine.formats.checking import schema_problems

GB = 10**9
GIB = 2**30


@cache
def cached(name: str) -> Cluster:
    return preset(name)


# --------------------------------------------------------------------------- device types


class TestDeviceTypes:
    @pytest.mark.parametrize("name, precision, flops", [
        ("B200-SXM-180GB", "bf16", 2.25e15),  # HGX B200 table: 4.5 PF sparse
        ("B200-SXM-180GB", "fp8", 4.5e15),  # DGX B200: 72 PF sparse / 8 GPUs / 2
        ("B200-SXM-180GB", "fp32", 75e12),
        ("B200-GB200-186GB", "bf16", 2.5e15),  # GB200 NVL72 table: 5 PF sparse
        ("B200-GB200-186GB", "fp8", 5e15),
        ("B200-GB200-186GB", "tf32", 1.25e15),
        ("B300-SXM-270GB", "bf16", 2.25e15),  # Verda's per-GPU table (dense)
        ("B300-SXM-270GB", "fp8", 4.5e15),
        ("B300-GB300-288GB", "bf16", 2.5e15),
        ("B300-GB300-288GB", "fp8", 5e15),
        ("B300-GB300-288GB", "tf32", 1.25e15),
        ("GH200-96GB", "bf16", 989.4e12),  # H100 SXM compute
        ("GH200-144GB", "fp8", 1978.9e12),
        ("H100-PCIe-80GB", "bf16", 756e12),
        ("H100-PCIe-80GB", "fp32", 51.2e12),
        ("H100-SXM5-96GB-HBM2e-500W", "bf16", 989.4e12),  # datasheet peak kept, capped by tdp_w
        ("RTX-2080-Ti-11GB", "fp16", 53.8e12),  # FP32 accumulate: half the fp16-accumulate rate
        ("TITAN-RTX-24GB", "fp16", 130e12),  # full-rate FP32 accumulate
        ("RTX-3090-24GB", "bf16", 71e12),
        ("RTX-3090-24GB", "fp32", 35.6e12),
        ("RTX-4090-24GB", "fp16", 165.2e12),
        ("RTX-4090-24GB", "fp8", 330.3e12),
    ])
    def test_pinned_peaks(self, name, precision, flops):
        assert DEVICE_TYPES[name].peak(precision) == flops

    @pytest.mark.parametrize("name, memory_bytes, bw", [
        ("B200-SXM-180GB", 180 * GB, 8000 * GB),  # DGX B200: 1,440 GB / 8, 64 TB/s / 8
        ("B200-GB200-186GB", 186 * GB, 8000 * GB),
        ("B300-SXM-270GB", 270 * GB, 8000 * GB),
        ("B300-GB300-288GB", 288 * GB, 8000 * GB),
        ("GH200-96GB", 96 * GIB, 4000 * GB),
        ("GH200-144GB", 144 * GIB, 4900 * GB),
        ("H100-PCIe-80GB", 80 * GIB, 2000 * GB),
        ("H100-SXM5-96GB-HBM2e-500W", 96 * GIB, 2400 * GB),  # torchtitan: 2.4 TB/s HBM2e
        ("RTX-2080-Ti-11GB", 11 * GIB, 616 * GB),
        ("TITAN-RTX-24GB", 24 * GIB, 672 * GB),
        ("RTX-3090-24GB", 24 * GIB, 936 * GB),
        ("RTX-4090-24GB", 24 * GIB, 1008 * GB),
    ])
    def test_memory(self, name, memory_bytes, bw):
        t = DEVICE_TYPES[name]
        assert (t.memory_bytes, t.mem_bw_bytes_per_s) == (memory_bytes, bw)
        assert isinstance(t.memory_bytes, int)

    def test_turing_has_no_bf16(self):
        with pytest.raises(ValueError, match="RTX-2080-Ti-11GB has no bf16 peak"):
            DEVICE_TYPES["RTX-2080-Ti-11GB"].peak("bf16")

    @pytest.mark.parametrize("name", sorted(DEVICE_TYPES))
    def test_every_type_has_the_new_fields(self, name):
        t = DEVICE_TYPES[name]
        assert t.arch in ARCHS
        assert t.sms > 0 and t.tdp_w > 0 and t.host_bw_bytes_per_s > 0
        assert set(t.to_dict()) >= {"arch", "sms", "clock_hz", "l2_bytes", "tdp_w", "host_bw_bytes_per_s"}

    @pytest.mark.parametrize("name", sorted(n for n, t in DEVICE_TYPES.items() if t.clock_hz))
    def test_clock_and_sms_explain_the_fp16_peak(self, name):
        # FLOP per clock per SM at the quoted clock is a whole number of 64-FLOP units
        # (A100 2048, H100 4096, V100 1024, GeForce 512, GK210 384): the clock and SM count
        # were copied consistently with the peak.
        t = DEVICE_TYPES[name]
        per_clock = t.peak("fp16") / (t.sms * t.clock_hz)
        assert per_clock == pytest.approx(64 * round(per_clock / 64), rel=0.01)

    def test_the_capped_h100_says_so(self):
        assert DEVICE_TYPES["H100-SXM5-96GB-HBM2e-500W"].tdp_w == 500
        assert DEVICE_TYPES["H100-SXM5-80GB"].tdp_w == 700

    def test_host_links(self):
        assert DEVICE_TYPES["GH200-96GB"].host_bw_bytes_per_s == 450 * GB  # NVLink-C2C, per direction
        assert DEVICE_TYPES["H100-SXM5-80GB"].host_bw_bytes_per_s == 63 * GB  # PCIe Gen5 x16
        assert DEVICE_TYPES["RTX-4090-24GB"].host_bw_bytes_per_s == 31.5 * GB  # Gen4
        assert DEVICE_TYPES["TITAN-RTX-24GB"].host_bw_bytes_per_s == 15.75 * GB  # Gen3

    def test_defaults_keep_old_constructors_working(self):
        t = DeviceType("X", {"fp32": 1e12}, 1e11, 2**30)
        assert (t.arch, t.sms, t.clock_hz, t.l2_bytes, t.tdp_w, t.host_bw_bytes_per_s) == ("", 0, 0.0, 0, 0.0, 0.0)


# --------------------------------------------------------------------------- presets


NEW = [
    ("dgx-b200", 8, "B200-SXM-180GB"),
    ("gb200-nvl72", 72, "B200-GB200-186GB"),
    ("dgx-b300", 8, "B300-SXM-270GB"),
    ("gb300-nvl72", 72, "B300-GB300-288GB"),
    ("gb200-nvl72-seg16", 64, "B200-GB200-186GB"),  # Slurm --segment 16: 16 trays of 4 GPUs
    ("gb300-nvl72-seg16", 64, "B300-GB300-288GB"),
    ("gh200", 4, "GH200-96GB"),
    ("h100-pcie", 8, "H100-PCIe-80GB"),
    ("grand-teton", 8, "H100-SXM5-96GB-HBM2e-500W"),
    ("rtx4090", 8, "RTX-4090-24GB"),
    ("rtx3090", 8, "RTX-3090-24GB"),
    ("rtx2080ti", 8, "RTX-2080-Ti-11GB"),
    ("titan-rtx", 8, "TITAN-RTX-24GB"),
]


class TestNewPresets:
    @pytest.mark.parametrize("base, per_node, dtype", NEW)
    @pytest.mark.parametrize("n", [1, 2])
    def test_builds(self, base, per_node, dtype, n):
        c = cached(f"{base}:{n}")
        assert c.name == f"{base}:{n}"
        assert (c.num_devices, c.num_nodes, c.gpus_per_node) == (per_node * n, n, per_node)
        assert {d.type for d in c.devices} == {dtype}

    @pytest.mark.parametrize("base, per_node, dtype", NEW)
    def test_round_trip_through_a_file(self, base, per_node, dtype):
        c = cached(f"{base}:2")
        d = json.loads(json.dumps(c.to_dict()))
        assert schema_problems(d, "soapbox.cluster/1") == []
        back = load_cluster(d)
        assert back.to_dict() == c.to_dict() and back.links == c.links
        assert back.device_type(0) == c.device_type(0)

    def test_dgx_b200_links(self):
        c = cached("dgx-b200:2")
        assert c.path_bandwidth(0, 1) == 900 * GB  # NVLink5 via NVSwitch
        assert c.path_bandwidth(0, 8) == 50 * GB  # one 400 Gb/s NIC per GPU
        assert c.collective_group(list(range(8))).nvls

    def test_nvl72_collective_stays_in_the_nvlink_domain(self):
        c = cached("gb200-nvl72:2")
        g = c.collective_group(list(range(72)))
        assert (g.ranks, g.nodes, g.nvlink, g.nvls) == (72, 1, True, True)
        assert g.bw_bytes_per_s == 900 * GB
        assert {c.links[i].kind for i in g.links} == {"nvlink"}
        # GPU 0 of each rack: one 400 Gb/s NIC each (rail 0)
        assert c.collective_group([0, 72]).bw_bytes_per_s == 50 * GB

    def test_gh200_node_is_an_nvlink_mesh(self):
        c = cached("gh200:2")
        assert [c.links[i].kind for i in c.path(0, 3)] == ["nvlink"]
        assert c.path_bandwidth(0, 3) == 150 * GB
        assert c.path_bandwidth(0, 4) == 25 * GB  # Slingshot-11, 200 Gb/s
        assert c.collective_group([0, 1, 2, 3]).bw_bytes_per_s == 150 * GB
        assert c.node_specs[0].nics == 4

    def test_pcie_servers(self):
        h = cached("h100-pcie:2")
        assert [h.links[i].kind for i in h.path(0, 1)] == ["pcie", "pcie"]
        assert h.path_bandwidth(0, 1) == 63 * GB
        assert h.node_specs[0].nics == 4  # one 400 Gb/s NIC per 2 GPUs (assumption)
        for base, bw in (("rtx4090", 31.5), ("rtx3090", 31.5), ("rtx2080ti", 15.75), ("titan-rtx", 15.75)):
            c = cached(f"{base}:2")
            assert c.path_bandwidth(0, 1) == bw * GB
            assert c.path_bandwidth(0, 8) == 12.5 * GB  # one 100 Gb/s NIC per node
            assert not c.collective_group(list(range(8))).nvlink

    def test_grand_teton_fabric(self):
        c = cached("grand-teton:2")
        assert (c.pod_gpus, c.oversubscription) == (3072, 7.0)
        assert c.to_dict()["fabric"] == {"pod_gpus": 3072, "oversubscription": 7.0}

    def test_grand_teton_across_pods(self):
        c = preset("grand-teton:385")  # 3,080 GPUs: two pods
        assert (c.pod(3071), c.pod(3072)) == (0, 1)
        inside = c.collective_group([0, 8]).bw_bytes_per_s
        across = c.collective_group([0, 3072]).bw_bytes_per_s
        assert inside == 50 * GB and inside / across == pytest.approx(7.0, rel=1e-12)

    def test_old_presets_have_no_fabric_key(self):
        assert "fabric" not in cached("dgx-h100:2").to_dict()


class TestLimits:
    def test_largest_nvl72_builds(self):
        c = preset("gb200-nvl72:227")
        assert c.num_devices == 16344 <= MAX_DEVICES

    def test_one_rack_more_is_refused(self):
        with pytest.raises(ValidationError) as exc:
            preset("gb200-nvl72:228")
        assert str(exc.value) == ("gb200-nvl72:228: 1 problem found:\n"
                                  "  - nodes: 16,416 GPUs is over the limit of 16,384 (gb200-nvl72:227 is the largest)")


# --------------------------------------------------------------------------- oversubscription


def pods(pod_gpus: int = 16, oversubscription: float = 7.0, intra_bw: float = 450e9) -> Cluster:
    """4 nodes x 8 GPUs, one 400 Gb/s NIC per GPU on PCIe Gen5: two nodes per pod."""
    spec = NodeSpec("n", 8, "H100-SXM5-80GB", "switch", intra_bw, nics=8, nic_bw_bytes_per_s=50e9,
                    attach_bw_bytes_per_s=63e9, repeat=4)
    return Cluster("pods", [spec], DEVICE_TYPES, pod_gpus=pod_gpus, oversubscription=oversubscription)


class TestOversubscription:
    def test_one_gpu_per_node(self):
        c = pods()
        inside = c.collective_group([0, 8])  # nodes 0 and 1: pod 0
        across = c.collective_group([0, 16])  # nodes 0 and 2: pods 0 and 1
        assert inside.bw_bytes_per_s == 50e9  # min(NIC 50, PCIe 63)
        assert across.bw_bytes_per_s == 50e9 / 7
        assert inside.links == tuple(sorted(inside.links)) and len(across.links) == len(inside.links)

    def test_whole_nodes(self):
        c = pods()
        inside = c.collective_group(list(range(16)))
        across = c.collective_group(list(range(8)) + list(range(16, 24)))
        assert inside.bw_bytes_per_s == 400e9  # 8 NICs x 50 (below the 450 NVSwitch rate)
        assert inside.bw_bytes_per_s / across.bw_bytes_per_s == pytest.approx(7.0, rel=1e-12)

    def test_no_effect_where_the_pod_tier_is_not_the_bottleneck(self):
        c = pods(intra_bw=10e9)  # a slow node interconnect: 10 < 400 / 7
        assert c.collective_group(list(range(16))).bw_bytes_per_s == 10e9
        assert c.collective_group(list(range(8)) + list(range(16, 24))).bw_bytes_per_s == 10e9

    def test_inside_a_node_is_untouched(self):
        assert pods().collective_group(list(range(8))).bw_bytes_per_s == 450e9

    def test_no_pods_no_change(self):
        plain, one_pod = pods(pod_gpus=0, oversubscription=1.0), pods(pod_gpus=32)
        for devs in ([0, 16], list(range(32))):
            assert plain.collective_group(devs) == one_pod.collective_group(devs)

    def test_pods_must_not_split_a_node(self):
        with pytest.raises(ValidationError) as exc:
            pods(pod_gpus=12)
        assert [str(p) for p in exc.value.problems] == [
            "fabric.pod_gpus: pods of 12 GPUs split a node of nodes[0] (n, 8 GPUs, devices 8..15); use a multiple "
            "of the node size"]

    @pytest.mark.parametrize("value", [0.5, float("nan"), float("inf"), True])
    def test_oversubscription_range(self, value):
        with pytest.raises(ValidationError, match="fabric.oversubscription: must be a number from 1"):
            pods(oversubscription=value)

    def test_pod_gpus_must_be_a_count(self):
        with pytest.raises(ValidationError, match="fabric.pod_gpus: must be an integer from 0"):
            pods(pod_gpus=-8)


# --------------------------------------------------------------------------- host memory


class TestHostMemory:
    @pytest.mark.parametrize("name, per_gpu_bytes", [
        ("dgx-h100:1", 2 * 10**12 // 8),  # DGX BasePOD RA: 2 TB DDR5
        ("dgx-b200:1", 2 * 10**12 // 8),  # DGX B200 user guide: 2 TB (upgradable to 4)
        ("dgx-a100-40gb:1", 10**12 // 8),
        ("dgx-a100-80gb:1", 2 * 10**12 // 8),
        ("gh200:1", 120 * GB),  # one Grace's LPDDR5X per GPU
        ("gb200-nvl72:1", 36 * 480 * GB // 72),  # 240 GB: one Grace feeds two GPUs
        ("hetero-demo", 0),  # unknown
    ])
    def test_per_gpu_share(self, name, per_gpu_bytes):
        c = cached(name)
        assert c.host_memory_bytes(0) == per_gpu_bytes
        assert c.host_memory_bytes(c.num_devices - 1) == per_gpu_bytes

    def test_host_bandwidth(self):
        assert cached("gh200:1").host_bw_bytes_per_s(0) == 450 * GB
        assert cached("dgx-h100:1").host_bw_bytes_per_s(0) == 63 * GB
        assert cached("gb200-nvl72:1").host_bw_bytes_per_s(71) == 450 * GB

    def test_host_bandwidth_falls_back_to_the_attach_rate(self):
        types = {"X": DeviceType("X", {"fp32": 1e12}, 1e11, 2**30)}
        c = Cluster("c", [NodeSpec("n", 2, "X", "switch", 1e10, attach_bw_bytes_per_s=7e9)], types)
        assert c.host_bw_bytes_per_s(1) == 7e9
        assert c.host_memory_bytes(1) == 0

    def test_unknown_device(self):
        with pytest.raises(ValueError, match="device 8 does not exist"):
            cached("dgx-h100:1").host_memory_bytes(8)

    def test_negative_host_memory_refused(self):
        with pytest.raises(ValidationError, match=r"nodes\[0\] \(n\).host_memory_bytes: must be from 0"):
            Cluster("c", [NodeSpec("n", 2, "H100-SXM5-80GB", "switch", 1e10, host_memory_bytes=-1)], DEVICE_TYPES)


# --------------------------------------------------------------------------- cluster files


def cluster_file(**extra) -> dict:
    """A minimal ``soapbox.cluster/1`` mapping with one declared device type."""
    d = {"format": "soapbox.cluster/1", "name": "f",
         "device_types": {"T": {"peak_flops_per_s": {"fp32": 1e13, "bf16": 1e14}, "mem_bw_bytes_per_s": 1e12,
                                "memory_bytes": 2**34}},
         "nodes": [{"name": "n", "gpus": 4, "device_type": "T", "repeat": 2, "nics": {"count": 4}}]}
    for path, value in extra.items():
        *outer, key = path.split(".")
        at = d
        for k in outer:
            at = at[int(k)] if isinstance(at, list) else at[k]
        at[key] = value
    return d


class TestClusterFiles:
    def test_without_the_new_keys(self):
        c = load_cluster(cluster_file())
        t = c.device_type(0)
        assert (t.arch, t.sms, t.clock_hz, t.l2_bytes, t.tdp_w, t.host_bw_bytes_per_s) == ("", 0, 0.0, 0, 0.0, 0.0)
        assert (c.pod_gpus, c.oversubscription, c.host_memory_bytes(0)) == (0, 1.0, 0)

    def test_with_the_new_keys(self):
        d = cluster_file(**{"device_types.T.arch": "hopper", "device_types.T.sms": 132,
                            "device_types.T.clock_hz": 1.83e9, "device_types.T.l2_bytes": 5.0 * 2**20,
                            "device_types.T.tdp_w": 500, "device_types.T.host_bw_bytes_per_s": 63e9,
                            "nodes.0.host_memory_bytes": 1e12,
                            "fabric": {"pod_gpus": 4, "oversubscription": 3.0}})
        c = load_cluster(d)
        t = c.device_type(0)
        assert (t.arch, t.sms, t.clock_hz, t.l2_bytes, t.tdp_w) == ("hopper", 132, 1.83e9, 5 * 2**20, 500)
        assert isinstance(t.l2_bytes, int) and isinstance(c.node_specs[0].host_memory_bytes, int)
        assert c.host_bw_bytes_per_s(0) == 63e9 and c.host_memory_bytes(0) == 250 * GB
        assert c.collective_group([0, 4]).bw_bytes_per_s == pytest.approx(12.5e9 / 3)  # 1 NIC at 100 Gb/s / 3
        assert load_cluster(c.to_dict()).to_dict() == c.to_dict()

    @pytest.mark.parametrize("path, value, where", [
        ("device_types.T.cores", 5, "device_types.T"),
        ("device_types.T.arch", "maxwell", "device_types.T.arch"),
        ("device_types.T.sms", -1, "device_types.T.sms"),
        ("nodes.0.host_memory", 5, "nodes[0] (n)"),
        ("fabric", {"pods": 2}, "fabric"),
        ("fabric", {"oversubscription": 0.5}, "fabric.oversubscription"),
        ("fabric", {"pod_gpus": 2.5}, "fabric.pod_gpus"),
        ("network", {}, "(top level)"),
    ])
    def test_bad_keys_are_refused(self, path, value, where):
        with pytest.raises(ValidationError) as exc:
            load_cluster(cluster_file(**{path: value}))
        assert any(p.path == where for p in exc.value.problems), exc.value.problems

    def test_pods_splitting_a_node_in_a_file(self):
        with pytest.raises(ValidationError, match="fabric.pod_gpus: pods of 6 GPUs split a node"):
            load_cluster(cluster_file(fabric={"pod_gpus": 6}))
