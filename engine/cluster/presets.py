"""The preset clusters (FlexFlow's P100 and K80 clusters, DGX A100/H100/H200/B200 nodes, GB200
NVL72 racks, GH200 nodes as on CSCS Alps, Meta's Grand Teton, PCIe servers of H100 PCIe and
GeForce/TITAN cards, a mixed demo) and clusters from ``soapbox.cluster/1`` mappings. See
:mod:`engine.cluster`.

Host memory (``NodeSpec.host_memory_bytes``), per node: DGX A100 640GB 2 TB and 320GB 1 TB
(DGX A100 datasheet, not re-read); DGX H100/H200 2 TB (DGX BasePOD RA, "2 TB of DDR5 system
memory"); DGX B200 2 TB, "upgradable to 4 TB" (DGX B200 user guide); DGX-2H 1.5 TB (DGX-2
datasheet, not re-read); FlexFlow's P100 and K80 nodes 256 GB (Jia et al. SysML'19 §8, not
re-read). Where no figure is published the value is a labelled assumption in the preset's
docstring.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from ..errors import Problem, ValidationError, printable
from .devices import (A100_NVSWITCH_BW, DEVICE_TYPES, H100_NVSWITCH_BW, IB_EDR_BW, IB_FDR_BW, IB_HDR_BW, IB_LATENCY_S,
    IB_NDR_BW, IB_XDR_BW, MAX_DEVICES, GH200_NVLINK_PAIR_BW, NVLINK1_PAIR_BW, NVLINK2_PAIR_BW, NVLINK5_NVSWITCH_BW,
    NVLINK_LATENCY_S, PCIE3_BW, PCIE4_BW, PCIE5_BW, PCIE_LATENCY_S, SLINGSHOT11_BW, V100_DGX2_NVSWITCH_BW, DeviceType,
    NodeSpec)

from .topology import Cluster

TB = 10**12
GB_INT = 10**9

# --------------------------------------------------------------------------- presets


def _p100_4x4(_: int | None) -> Cluster:
    """FlexFlow's P100 cluster (Jia et al. SysML'19 §8): 4 nodes x 4 P100, NVLink within a
    node, 100 Gb/s EDR InfiniBand between nodes (one NIC per node, shared by its GPUs)."""
    spec = NodeSpec("node", 4, "P100-SXM2-16GB", "mesh", NVLINK1_PAIR_BW, nics=1, nic_bw_bytes_per_s=IB_EDR_BW,
                    attach_bw_bytes_per_s=PCIE3_BW, repeat=4, host_memory_bytes=256 * GB_INT)
    return Cluster("p100-4x4", [spec], DEVICE_TYPES, _p100_4x4.__doc__.split("\n")[0] + " ...")


def _k80_16x4(_: int | None) -> Cluster:
    """FlexFlow's K80 cluster (Jia et al. SysML'19 §8): 16 nodes x 4 K80 GPUs on a PCIe
    switch, 56 Gb/s FDR InfiniBand between nodes (one NIC per node)."""
    spec = NodeSpec("node", 4, "K80-GK210", "switch", PCIE3_BW, PCIE_LATENCY_S, "pcie", nics=1,
                    nic_bw_bytes_per_s=IB_FDR_BW, attach_bw_bytes_per_s=PCIE3_BW, repeat=16,
                    host_memory_bytes=256 * GB_INT)
    return Cluster("k80-16x4", [spec], DEVICE_TYPES, "FlexFlow's K80 cluster: 16 nodes x 4 K80 (PCIe), 56 Gb/s IB")


def _dgx(device: str, switch_bw: float, nic_bw: float, attach_bw: float, gpus: int, label: str, doc: str, *,
         nics: int = 8, host_memory_bytes: int = 0,
         intra: tuple[str, float, str] = ("switch", NVLINK_LATENCY_S, "nvlink"),
         pod_gpus: int = 0, oversubscription: float = 1.0, node: str = "dgx", source: str = ""):
    """A sized preset of identical nodes: ``gpus`` GPUs of ``device`` on one intra-node fabric
    (``intra``: topology, latency, link kind) and ``nics`` NICs; ``doc`` is its description,
    ``source`` where the figures come from (the factory's docstring)."""
    topology, latency, kind = intra

    def make(n: int | None) -> Cluster:
        n = 1 if n is None else n
        spec = NodeSpec(node, gpus, device, topology,
                        switch_bw, latency, kind, nics=nics, nic_bw_bytes_per_s=nic_bw,
                        attach_bw_bytes_per_s=attach_bw, repeat=n, host_memory_bytes=host_memory_bytes)
        return Cluster(f"{label}:{n}", [spec], DEVICE_TYPES, f"{n} x {doc}", pod_gpus=pod_gpus,
                       oversubscription=oversubscription)

    make.__doc__ = doc + (f"\n\n{source}" if source else "")
    make.gpus_per_node = gpus  # lets preset() check a size before building anything
    return make


def _hetero_demo(_: int | None) -> Cluster:
    """A mixed cluster for hardware-aware placement: one DGX-H100-like node (4 x H100,
    NVSwitch, 2 x NDR 400 Gb/s), one A100-40GB node (4 x A100, NVSwitch, 2 x HDR 200 Gb/s)
    and one V100 node (4 x V100, NVLink2 mesh, 1 x EDR 100 Gb/s)."""
    nodes = [
        NodeSpec("h100-node", 4, "H100-SXM5-80GB", "switch", H100_NVSWITCH_BW, nics=2,
                 nic_bw_bytes_per_s=IB_NDR_BW, attach_bw_bytes_per_s=PCIE5_BW),
        NodeSpec("a100-node", 4, "A100-SXM4-40GB", "switch", A100_NVSWITCH_BW, nics=2,
                 nic_bw_bytes_per_s=IB_HDR_BW, attach_bw_bytes_per_s=PCIE4_BW),
        NodeSpec("v100-node", 4, "V100-SXM2-32GB", "mesh", NVLINK2_PAIR_BW, nics=1,
                 nic_bw_bytes_per_s=IB_EDR_BW, attach_bw_bytes_per_s=PCIE3_BW),
    ]
    return Cluster("hetero-demo", nodes, DEVICE_TYPES,
                   "mixed: 4 x H100 (NDR), 4 x A100-40GB (HDR), 4 x V100 (EDR)")


_PCIE_SWITCH = ("switch", PCIE_LATENCY_S, "pcie")
_PCIE_NOTE = ("The GPUs share one PCIe switch at their x16 rate per direction (no NVLink bridges modelled). "
              "GeForce drivers do not enable PCIe peer-to-peer on the RTX 4090 (nor on the 3090 and "
              "2080 Ti in recent drivers): NCCL then stages through host memory, which can be slower "
              "than this model. Assumed: one 100 Gb/s NIC per node and 256 GB of host memory (no "
              "published reference server; set your own in a cluster file).")

_DGX_B200 = _dgx(
    "B200-SXM-180GB", NVLINK5_NVSWITCH_BW, IB_NDR_BW, PCIE5_BW, 8, "dgx-b200",
    "DGX B200: 8 x B200, NVSwitch 1.8 TB/s, 8 x NDR 400 Gb/s IB", host_memory_bytes=2 * TB,
    source="NVIDIA DGX B200 user guide: 8 x B200 with 1,440 GB in all; 2 x 5th-generation NVLink switches, "
           "14.4 TB/s aggregate (900 GB/s per GPU per direction); 4 OSFP ports for 8 x ConnectX-7, up to "
           "400 Gb/s each (PCIe Gen5 x16); 2 x Xeon 8570 (PCIe Gen5); 2 TB of DDR5, upgradable to 4 TB.")
_GB200_NVL72 = _dgx(
    "B200-GB200-186GB", NVLINK5_NVSWITCH_BW, IB_NDR_BW, PCIE5_BW, 72, "gb200-nvl72",
    "GB200 NVL72 rack: 72 x B200 in one NVLink5 domain (1.8 TB/s per GPU), 72 x 400 Gb/s NICs",
    nics=72, host_memory_bytes=36 * 480 * GB_INT, node="rack",
    source="A rack is one node: its 72 GPUs share one NVLink domain (9 NVLink switch trays, 130 TB/s), so "
           "collectives of up to 72 ranks stay on NVLink. NVIDIA multi-node NVLink tuning guide: 18 x 1RU "
           "compute trays of 4 GPUs + 2 Grace, ConnectX-7 in the tray; the GB200 NVL72 spec table: 1.8 TB/s "
           "NVLink per GPU, 186 GB HBM3e at 8 TB/s. Compute fabric: 4 x ConnectX-7 400 Gb/s per compute "
           "tray, one per GPU, rail-optimised (DGX SuperPOD GB200 reference architecture, not re-read; the "
           "GB300 NVL72 Enterprise RA, read, has 4 ConnectX-8 per tray). Host memory: 36 Grace x 480 GB "
           "LPDDR5X = 17.3 TB per rack (NVIDIA quotes 'up to 17 TB'; fibermall GB200 analysis: 480 GB per "
           "superchip). Largest: gb200-nvl72:227 (16,344 GPUs).")
_DGX_B300 = _dgx(
    "B300-SXM-270GB", NVLINK5_NVSWITCH_BW, IB_XDR_BW, PCIE5_BW, 8, "dgx-b300",
    "DGX B300: 8 x B300, NVSwitch 1.8 TB/s, 8 x 800 Gb/s ConnectX-8", host_memory_bytes=2 * TB,
    source="NVIDIA DGX B300: 8 x Blackwell Ultra on fifth-generation NVLink (1.8 TB/s per GPU), 8 x ConnectX-8 "
           "SuperNICs at 800 Gb/s (one per GPU); 2 TB of host memory (DGX B200's; the DGX B300 datasheet was "
           "not read). GPU figures: engine.cluster.devices (B300-SXM-270GB).")
_GB300_NVL72 = _dgx(
    "B300-GB300-288GB", NVLINK5_NVSWITCH_BW, IB_XDR_BW, PCIE5_BW, 72, "gb300-nvl72",
    "GB300 NVL72 rack: 72 x B300 in one NVLink5 domain (1.8 TB/s per GPU), 72 x 800 Gb/s NICs",
    nics=72, host_memory_bytes=36 * 480 * GB_INT, node="rack",
    source="As gb200-nvl72 (one rack a node, 72 GPUs on one NVLink domain, 130 TB/s) with Blackwell Ultra GPUs "
           "and ConnectX-8 800 Gb/s NICs, four per compute tray (the GB300 NVL72 Enterprise RA). Host memory as "
           "GB200's Grace (480 GB each, 36 per rack).")
#: What a job gets of NVL72 racks under Slurm's ``--segment``: NVIDIA's Megatron-Bridge
#: performance launcher (scripts/performance/utils/executors.py at v0.4.0 = 0fbfe7d3) asks for a
#: segment of the largest divisor of the job's trays up to 18: 16 trays (64 GPUs) for 16, 32 or 64
#: trays. Each segment is one NVLink domain of 64 GPUs; segments talk over the NICs.
_NVL72_SEGMENT_NOTE = ("A segment of 16 compute trays (64 of a rack's 72 GPUs) is one NVLink domain, as Slurm's "
                       "--segment 16 gives a job (Megatron-Bridge's performance launcher, executors.py at 0fbfe7d3); "
                       "segments talk over the NICs.")
_GB200_SEG16 = _dgx(
    "B200-GB200-186GB", NVLINK5_NVSWITCH_BW, IB_NDR_BW, PCIE5_BW, 64, "gb200-nvl72-seg16",
    "GB200 NVL72, 64-GPU segments: 16 trays of a rack in one NVLink5 domain, 64 x 400 Gb/s NICs",
    nics=64, host_memory_bytes=32 * 480 * GB_INT, node="segment", source=_NVL72_SEGMENT_NOTE)
_GB300_SEG16 = _dgx(
    "B300-GB300-288GB", NVLINK5_NVSWITCH_BW, IB_XDR_BW, PCIE5_BW, 64, "gb300-nvl72-seg16",
    "GB300 NVL72, 64-GPU segments: 16 trays of a rack in one NVLink5 domain, 64 x 800 Gb/s NICs",
    nics=64, host_memory_bytes=32 * 480 * GB_INT, node="segment", source=_NVL72_SEGMENT_NOTE)
_GH200 = _dgx(
    "GH200-96GB", GH200_NVLINK_PAIR_BW, SLINGSHOT11_BW, PCIE4_BW, 4, "gh200",
    "GH200 node (HPE Cray EX, CSCS Alps Clariden): 4 x GH200-96GB, NVLink all-to-all 150 GB/s per pair, "
    "4 x Slingshot-11 200 Gb/s", nics=4, host_memory_bytes=4 * 120 * GB_INT, node="nid",
    intra=("mesh", NVLINK_LATENCY_S, "nvlink"),
    source="CSCS Alps hardware page (docs.cscs.ch/alps/hardware): 'four Grace-Hopper modules and four "
           "corresponding network interface cards (NICs)'; its GH200 schematic: 150 GB/s NVLink between GPUs, "
           "200 Gb/s (25 GB/s) per NIC, 450 GB/s per direction NVLink-C2C, ~120 GB LPDDR5X per Grace (~477 GB "
           "usable per node). JSC JUPITER's quad-GH200 node agrees: '300 GB/s between pairs of GPUs (150 GB/s "
           "per direction)', 120 GB LPDDR5X per Grace. The NIC (HPE Cassini) is taken on PCIe Gen4 x16 (not "
           "re-read; the NIC's 25 GB/s is the bottleneck either way). The preset of published Sailor runs on "
           "'GH200-96GB (Alps Clariden)'.")
_H100_PCIE = _dgx(
    "H100-PCIe-80GB", PCIE5_BW, IB_NDR_BW, PCIE5_BW, 8, "h100-pcie",
    "H100 PCIe server: 8 x H100 PCIe on PCIe Gen5 switches, 4 x 400 Gb/s NICs", nics=4,
    host_memory_bytes=2 * TB, node="server", intra=_PCIE_SWITCH,
    source="Assumed: a typical 8-GPU PCIe Gen5 server (no NVLink bridges modelled; with bridges pairs would "
           "get 600 GB/s), one 400 Gb/s NIC per 2 GPUs sharing their PCIe switch, 2 TB of host memory (as DGX "
           "H100). The GPUs share one PCIe switch at Gen5 x16 (63 GB/s per direction); traffic between "
           "sockets over the CPUs' link is not modelled. H100 PCIe figures: hardware_specs.csv (hpctech table).")
_GRAND_TETON = _dgx(
    "H100-SXM5-96GB-HBM2e-500W", H100_NVSWITCH_BW, IB_NDR_BW, PCIE5_BW, 8, "grand-teton",
    "Meta Grand Teton: 8 x H100 96GB HBM2e @500 W, NVSwitch 900 GB/s, 8 x 400 Gb/s RoCE; 3,072-GPU pods, 1:7 "
    "between pods", host_memory_bytes=2 * TB, node="host", pod_gpus=3072, oversubscription=7.0,
    source="torchtitan docs/performance.md: 'Each host has 8 NVIDIA H100 GPUs fully connected with NVLink. "
           "Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec peak memory bandwidth. Hosts are "
           "inter-connected with backend RDMA network with 400 Gb/s per GPU. We used the default 500W power "
           "limit'. Llama 3 paper §3.3.1 (hardware_specs.csv): 400 Gbps RoCE per GPU, 3,072-GPU pods with "
           "full bisection, 1:7 oversubscription between pods (the 24K-GPU cluster is larger than this "
           "simulator's 16,384). Host memory is not published: 2 TB assumed (as DGX H100).")
def _pcie_server(device: str, pcie_bw: float, label: str, card: str, gen: int):
    """A server of 8 consumer GPUs on one PCIe switch with one 100 Gb/s NIC (:data:`_PCIE_NOTE`)."""
    return _dgx(device, pcie_bw, IB_EDR_BW, pcie_bw, 8, label,
                f"{card} server: 8 x {card} on PCIe Gen{gen}, 1 x 100 Gb/s NIC", nics=1,
                host_memory_bytes=256 * GB_INT, node="server", intra=_PCIE_SWITCH, source=_PCIE_NOTE)


_RTX4090 = _pcie_server("RTX-4090-24GB", PCIE4_BW, "rtx4090", "RTX 4090", 4)
_RTX3090 = _pcie_server("RTX-3090-24GB", PCIE4_BW, "rtx3090", "RTX 3090", 4)
_RTX2080TI = _pcie_server("RTX-2080-Ti-11GB", PCIE3_BW, "rtx2080ti", "RTX 2080 Ti", 3)
_TITAN_RTX = _pcie_server("TITAN-RTX-24GB", PCIE3_BW, "titan-rtx", "TITAN RTX", 3)

#: Preset name -> (factory taking the node count or None, takes_count, one-line description).
PRESETS: dict[str, tuple[Any, bool, str]] = {
    "p100-4x4": (_p100_4x4, False, "FlexFlow's P100 cluster: 4 nodes x 4 P100, NVLink, 100 Gb/s EDR IB"),
    "k80-16x4": (_k80_16x4, False, "FlexFlow's K80 cluster: 16 nodes x 4 K80, PCIe, 56 Gb/s FDR IB"),
    "dgx-a100-80gb": (_dgx("A100-SXM4-80GB", A100_NVSWITCH_BW, IB_HDR_BW, PCIE4_BW, 8, "dgx-a100-80gb",
                           "DGX A100 80GB: 8 x A100, NVSwitch 600 GB/s, 8 x HDR 200 Gb/s IB",
                           host_memory_bytes=2 * TB), True,
                      "N x DGX A100 80GB (8 GPUs, NVSwitch, 8 x 200 Gb/s IB)"),
    "dgx-a100-40gb": (_dgx("A100-SXM4-40GB", A100_NVSWITCH_BW, IB_HDR_BW, PCIE4_BW, 8, "dgx-a100-40gb",
                           "DGX A100 40GB: 8 x A100, NVSwitch 600 GB/s, 8 x HDR 200 Gb/s IB",
                           host_memory_bytes=1 * TB), True,
                      "N x DGX A100 40GB (8 GPUs, NVSwitch, 8 x 200 Gb/s IB)"),
    "dgx-h100": (_dgx("H100-SXM5-80GB", H100_NVSWITCH_BW, IB_NDR_BW, PCIE5_BW, 8, "dgx-h100",
                      "DGX H100: 8 x H100, NVSwitch 900 GB/s, 8 x NDR 400 Gb/s IB", host_memory_bytes=2 * TB), True,
                 "N x DGX H100 (8 GPUs, NVSwitch, 8 x 400 Gb/s IB)"),
    "dgx-h200": (_dgx("H200-SXM-141GB", H100_NVSWITCH_BW, IB_NDR_BW, PCIE5_BW, 8, "dgx-h200",
                      "DGX H200: 8 x H200, NVSwitch 900 GB/s, 8 x NDR 400 Gb/s IB", host_memory_bytes=2 * TB), True,
                 "N x DGX H200 (8 GPUs, 141 GB each, NVSwitch, 8 x 400 Gb/s IB)"),
    "v100-dgx2": (_dgx("V100-SXM3-32GB", V100_DGX2_NVSWITCH_BW, IB_EDR_BW, PCIE3_BW, 16, "v100-dgx2",
                       "DGX-2H: 16 x V100, NVSwitch 300 GB/s, 8 x EDR 100 Gb/s IB",
                       host_memory_bytes=1500 * GB_INT), True,
                  "N x DGX-2H (16 V100, NVSwitch, 8 x 100 Gb/s IB)"),
    "dgx-b200": (_DGX_B200, True, "N x DGX B200 (8 GPUs, 180 GB each, NVSwitch 1.8 TB/s, 8 x 400 Gb/s IB)"),
    "gb200-nvl72": (_GB200_NVL72, True, "N x GB200 NVL72 rack (72 GPUs in one NVLink domain, 72 x 400 Gb/s NICs)"),
    "dgx-b300": (_DGX_B300, True, "N x DGX B300 (8 GPUs, 270 GB each, NVSwitch 1.8 TB/s, 8 x 800 Gb/s)"),
    "gb300-nvl72": (_GB300_NVL72, True, "N x GB300 NVL72 rack (72 B300 in one NVLink domain, 72 x 800 Gb/s NICs)"),
    "gb200-nvl72-seg16": (_GB200_SEG16, True, "N x 64-GPU segment of GB200 NVL72 racks (16 trays, one NVLink domain)"),
    "gb300-nvl72-seg16": (_GB300_SEG16, True, "N x 64-GPU segment of GB300 NVL72 racks (16 trays, one NVLink domain)"),
    "gh200": (_GH200, True, "N x GH200 node as on CSCS Alps (4 GH200-96GB, NVLink mesh, 4 x 200 Gb/s Slingshot)"),
    "h100-pcie": (_H100_PCIE, True, "N x H100 PCIe server (8 GPUs on PCIe Gen5, no NVLink, 4 x 400 Gb/s)"),
    "grand-teton": (_GRAND_TETON, True, "N x Meta Grand Teton (8 H100 96GB @500 W, NVSwitch, 8 x 400 Gb/s RoCE, "
                                        "1:7 between 3,072-GPU pods)"),
    "rtx4090": (_RTX4090, True, "N x RTX 4090 server (8 GPUs on PCIe Gen4, 1 x 100 Gb/s)"),
    "rtx3090": (_RTX3090, True, "N x RTX 3090 server (8 GPUs on PCIe Gen4, 1 x 100 Gb/s)"),
    "rtx2080ti": (_RTX2080TI, True, "N x RTX 2080 Ti server (8 GPUs on PCIe Gen3, 1 x 100 Gb/s)"),
    "titan-rtx": (_TITAN_RTX, True, "N x TITAN RTX server (8 GPUs on PCIe Gen3, 1 x 100 Gb/s)"),
    "hetero-demo": (_hetero_demo, False, "mixed: 4 x H100 (NDR), 4 x A100-40GB (HDR), 4 x V100 (EDR)"),
}

_PRESET_RE = re.compile(r"^(?P<base>[a-z0-9-]+?)(?::(?P<n>-?\d+))?$")


def preset_names() -> list[str]:
    """Preset names as a user types them (``dgx-a100-80gb:N`` for sized ones)."""
    return [f"{k}:N" if takes else k for k, (_, takes, _) in PRESETS.items()]


def preset(name: str) -> Cluster:
    """Build a preset cluster by name, e.g. ``"p100-4x4"`` or ``"dgx-a100-80gb:16"``; with
    another network after a ``+`` (``"dgx-h100:16+nics=4+pod=64+oversub=2"``:
    :mod:`engine.cluster.network`).

    Raises
    ------
    ValueError
        For an unknown preset, a missing or zero node count, a size over
        :data:`MAX_DEVICES`, or a network the name cannot have (what and where).
    """
    if not isinstance(name, str):
        raise ValueError(f"a cluster name must be a string, got {type(name).__name__}")
    head, plus, suffix = name.partition("+")
    if plus:
        from .network import network_kwargs, parse_variant, variant_name, with_network
        if len(name) > 300:
            raise ValueError(f"cluster {printable(name, 100)!r}...: a name of at most 300 characters")
        net = parse_variant(suffix, f"cluster {printable(name, 100)!r}")
        base = preset(head)  # (named as the preset writes itself: "dgx-h100:02" is "dgx-h100:2")
        return with_network(base, name=variant_name(base.name, net), **network_kwargs(net))
    m = _PRESET_RE.match(name.strip()) if len(name) <= 100 else None
    base = m.group("base") if m else name
    if not m or base not in PRESETS:
        raise ValueError(f"unknown cluster {printable(name, 100)!r}; presets: {', '.join(preset_names())}")
    factory, takes_count, _ = PRESETS[base]
    n = m.group("n")
    if takes_count:
        if n is None:
            raise ValueError(f"cluster {base!r} needs a node count: {base}:N, e.g. {base}:2")
        if int(n) < 1:
            raise ValueError(f"cluster {name!r}: node count must be at least 1")
        gpus = int(n) * factory.gpus_per_node  # (n has at most 100 digits: checked above)
        if gpus > MAX_DEVICES:
            largest = MAX_DEVICES // factory.gpus_per_node
            raise ValidationError([Problem("nodes", f"{gpus:,} GPUs is over the limit of {MAX_DEVICES:,} "
                                                    f"({base}:{largest} is the largest)")], name)
        return factory(int(n))
    if n is not None:
        raise ValueError(f"cluster {base!r} has a fixed size; write {base!r} without ':{n}'")
    return factory(None)


def cluster_from_dict(data: Mapping[str, Any]) -> Cluster:
    """Build a :class:`Cluster` from a schema-valid ``soapbox.cluster/1`` mapping.

    Device types named in the file override the built-in ones of the same name; a node may
    use a built-in type without declaring it. The number of devices and links is checked
    before any is made.
    """
    types = dict(DEVICE_TYPES)
    for name, t in data.get("device_types", {}).items():
        mem = t["memory_bytes"]
        l2 = t.get("l2_bytes", 0)
        types[name] = DeviceType(name, dict(t["peak_flops_per_s"]), t["mem_bw_bytes_per_s"],
                                 int(mem) if isinstance(mem, float) and math.isfinite(mem) else mem,
                                 t.get("source", ""), arch=t.get("arch", ""), sms=t.get("sms", 0),
                                 clock_hz=t.get("clock_hz", 0.0),
                                 l2_bytes=int(l2) if isinstance(l2, float) and math.isfinite(l2) else l2,
                                 tdp_w=t.get("tdp_w", 0.0), host_bw_bytes_per_s=t.get("host_bw_bytes_per_s", 0.0))
    nodes = []
    for nd in data["nodes"]:
        intra = nd.get("intra", {})
        nics = nd.get("nics", {})
        nodes.append(NodeSpec(
            name=nd["name"], gpus=nd["gpus"], device_type=nd["device_type"],
            intra_topology=intra.get("topology", "switch"),
            intra_bw_bytes_per_s=intra.get("bw_bytes_per_s", A100_NVSWITCH_BW),
            intra_latency_s=intra.get("latency_s", NVLINK_LATENCY_S),
            intra_kind=intra.get("kind", "nvlink"),
            nics=nics.get("count", 1),
            nic_bw_bytes_per_s=nics.get("bw_bytes_per_s", IB_EDR_BW),
            nic_latency_s=nics.get("latency_s", IB_LATENCY_S),
            attach_bw_bytes_per_s=nics.get("attach_bw_bytes_per_s", PCIE3_BW),
            repeat=nd.get("repeat", 1),
            host_memory_bytes=_int(nd.get("host_memory_bytes", 0)),
        ))
    fabric = data.get("fabric", {})
    return Cluster(data["name"], nodes, types, data.get("description", ""), pod_gpus=fabric.get("pod_gpus", 0),
                   oversubscription=fabric.get("oversubscription", 1.0))


def _int(v: Any) -> Any:
    """A finite integral float (``2e12``, as JSON may write a byte count) as an int."""
    return int(v) if isinstance(v, float) and math.isfinite(v) and v == int(v) else v

