"""The preset clusters (FlexFlow's P100 and K80 clusters, DGX A100/H100 nodes, a mixed demo)
and clusters from ``soapbox.cluster/1`` mappings. See :mod:`engine.cluster`."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from ..errors import Problem, ValidationError, printable
from .devices import (
    A100_NVSWITCH_BW,
    DEVICE_TYPES,
    H100_NVSWITCH_BW,
    IB_EDR_BW,
    IB_FDR_BW,
    IB_HDR_BW,
    IB_LATENCY_S,
    IB_NDR_BW,
    MAX_DEVICES,
    NVLINK1_PAIR_BW,
    NVLINK2_PAIR_BW,
    NVLINK_LATENCY_S,
    PCIE3_BW,
    PCIE4_BW,
    PCIE5_BW,
    PCIE_LATENCY_S,
    V100_DGX2_NVSWITCH_BW,
    DeviceType,
    NodeSpec,
)

from .topology import Cluster


# --------------------------------------------------------------------------- presets


def _p100_4x4(_: int | None) -> Cluster:
    """FlexFlow's P100 cluster (Jia et al. SysML'19 §8): 4 nodes x 4 P100, NVLink within a
    node, 100 Gb/s EDR InfiniBand between nodes (one NIC per node, shared by its GPUs)."""
    spec = NodeSpec("node", 4, "P100-SXM2-16GB", "mesh", NVLINK1_PAIR_BW, nics=1, nic_bw_bytes_per_s=IB_EDR_BW,
                    attach_bw_bytes_per_s=PCIE3_BW, repeat=4)
    return Cluster("p100-4x4", [spec], DEVICE_TYPES, _p100_4x4.__doc__.split("\n")[0] + " ...")


def _k80_16x4(_: int | None) -> Cluster:
    """FlexFlow's K80 cluster (Jia et al. SysML'19 §8): 16 nodes x 4 K80 GPUs on a PCIe
    switch, 56 Gb/s FDR InfiniBand between nodes (one NIC per node)."""
    spec = NodeSpec("node", 4, "K80-GK210", "switch", PCIE3_BW, PCIE_LATENCY_S, "pcie", nics=1,
                    nic_bw_bytes_per_s=IB_FDR_BW, attach_bw_bytes_per_s=PCIE3_BW, repeat=16)
    return Cluster("k80-16x4", [spec], DEVICE_TYPES, "FlexFlow's K80 cluster: 16 nodes x 4 K80 (PCIe), 56 Gb/s IB")


def _dgx(device: str, switch_bw: float, nic_bw: float, attach_bw: float, gpus: int, label: str, doc: str):
    def make(n: int | None) -> Cluster:
        n = 1 if n is None else n
        spec = NodeSpec("dgx", gpus, device, "switch", switch_bw, NVLINK_LATENCY_S, "nvlink", nics=8,
                        nic_bw_bytes_per_s=nic_bw, attach_bw_bytes_per_s=attach_bw, repeat=n)
        return Cluster(f"{label}:{n}", [spec], DEVICE_TYPES, f"{n} x {doc}")

    make.__doc__ = doc
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


#: Preset name -> (factory taking the node count or None, takes_count, one-line description).
PRESETS: dict[str, tuple[Any, bool, str]] = {
    "p100-4x4": (_p100_4x4, False, "FlexFlow's P100 cluster: 4 nodes x 4 P100, NVLink, 100 Gb/s EDR IB"),
    "k80-16x4": (_k80_16x4, False, "FlexFlow's K80 cluster: 16 nodes x 4 K80, PCIe, 56 Gb/s FDR IB"),
    "dgx-a100-80gb": (_dgx("A100-SXM4-80GB", A100_NVSWITCH_BW, IB_HDR_BW, PCIE4_BW, 8, "dgx-a100-80gb",
                           "DGX A100 80GB: 8 x A100, NVSwitch 600 GB/s, 8 x HDR 200 Gb/s IB"), True,
                      "N x DGX A100 80GB (8 GPUs, NVSwitch, 8 x 200 Gb/s IB)"),
    "dgx-a100-40gb": (_dgx("A100-SXM4-40GB", A100_NVSWITCH_BW, IB_HDR_BW, PCIE4_BW, 8, "dgx-a100-40gb",
                           "DGX A100 40GB: 8 x A100, NVSwitch 600 GB/s, 8 x HDR 200 Gb/s IB"), True,
                      "N x DGX A100 40GB (8 GPUs, NVSwitch, 8 x 200 Gb/s IB)"),
    "dgx-h100": (_dgx("H100-SXM5-80GB", H100_NVSWITCH_BW, IB_NDR_BW, PCIE5_BW, 8, "dgx-h100",
                      "DGX H100: 8 x H100, NVSwitch 900 GB/s, 8 x NDR 400 Gb/s IB"), True,
                 "N x DGX H100 (8 GPUs, NVSwitch, 8 x 400 Gb/s IB)"),
    "dgx-h200": (_dgx("H200-SXM-141GB", H100_NVSWITCH_BW, IB_NDR_BW, PCIE5_BW, 8, "dgx-h200",
                      "DGX H200: 8 x H200, NVSwitch 900 GB/s, 8 x NDR 400 Gb/s IB"), True,
                 "N x DGX H200 (8 GPUs, 141 GB each, NVSwitch, 8 x 400 Gb/s IB)"),
    "v100-dgx2": (_dgx("V100-SXM3-32GB", V100_DGX2_NVSWITCH_BW, IB_EDR_BW, PCIE3_BW, 16, "v100-dgx2",
                       "DGX-2H: 16 x V100, NVSwitch 300 GB/s, 8 x EDR 100 Gb/s IB"), True,
                  "N x DGX-2H (16 V100, NVSwitch, 8 x 100 Gb/s IB)"),
    "hetero-demo": (_hetero_demo, False, "mixed: 4 x H100 (NDR), 4 x A100-40GB (HDR), 4 x V100 (EDR)"),
}

_PRESET_RE = re.compile(r"^(?P<base>[a-z0-9-]+?)(?::(?P<n>-?\d+))?$")


def preset_names() -> list[str]:
    """Preset names as a user types them (``dgx-a100-80gb:N`` for sized ones)."""
    return [f"{k}:N" if takes else k for k, (_, takes, _) in PRESETS.items()]


def preset(name: str) -> Cluster:
    """Build a preset cluster by name, e.g. ``"p100-4x4"`` or ``"dgx-a100-80gb:16"``.

    Raises
    ------
    ValueError
        For an unknown preset, a missing or zero node count, or a size over
        :data:`MAX_DEVICES`.
    """
    if not isinstance(name, str):
        raise ValueError(f"a cluster name must be a string, got {type(name).__name__}")
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
            raise ValidationError([Problem("nodes", f"{gpus:,} GPUs is over the limit of {MAX_DEVICES:,}")], name)
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
        types[name] = DeviceType(name, dict(t["peak_flops_per_s"]), t["mem_bw_bytes_per_s"],
                                 int(mem) if isinstance(mem, float) and math.isfinite(mem) else mem,
                                 t.get("source", ""))
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
        ))
    return Cluster(data["name"], nodes, types, data.get("description", ""))

