"""Clusters: device types, devices, nodes, links and the path between any two devices.

A cluster is a list of node groups. Each node holds GPUs of one device type joined by an
intra-node interconnect, and NICs that join it to a non-blocking network fabric:

* ``switch``: every GPU has a link to and from a switch (NVSwitch; PCIe switch), at the
  GPU's per-direction bandwidth; GPU-to-GPU traffic crosses two links.
* ``mesh``: a direct link between every ordered pair of GPUs (NVLink all-to-all).

Links are one-directional queues: a full-duplex cable is two links. A NIC's uplink is one
link shared by every GPU attached to that NIC (GPU ``g`` of a node with ``n`` NICs and ``k``
GPUs uses NIC ``g * n // k``). The fabric is non-blocking (a full fat tree, as on Selene,
``hardware_specs.csv``), so a transfer between nodes crosses four links: GPU→NIC (PCIe),
NIC→fabric, fabric→NIC, NIC→GPU. A cluster may split the fabric into full-bisection pods
with an oversubscribed tier between them (``pod_gpus``, ``oversubscription``: Llama 3's 1:7);
collectives that span pods then get the oversubscribed share (:meth:`Cluster.collective_group`).

Paths are shortest paths in the link graph weighted by the time to move 1 MB (latency +
size/bandwidth summed over the path); GPUs never forward traffic (each GPU is split into a
sending and a receiving endpoint).

Bandwidths are per direction, in bytes/s; latencies in seconds; memory in bytes. Specs and
their sources: ``validation/hardware_specs.csv``, cited per constant in :mod:`engine.cluster.devices`.
"""

from __future__ import annotations

from .devices import (A100_NVSWITCH_BW, ARCHS, BW_RANGE_BYTES_PER_S, DEVICE_TYPES, FLOPS_RANGE_PER_S, GB,
    GH200_NVLINK_PAIR_BW, GIB, H100_NVSWITCH_BW, IB_EDR_BW, IB_FDR_BW, IB_HDR_BW, IB_LATENCY_S, IB_NDR_BW, MAX_DEVICES,
    MAX_LATENCY_S, MAX_LINKS, MEMORY_RANGE_BYTES, NVLINK1_PAIR_BW, NVLINK2_PAIR_BW, NVLINK5_NVSWITCH_BW, NVLINK_C2C_BW,
    NVLINK_LATENCY_S, PCIE3_BW, PCIE4_BW, PCIE5_BW, PCIE_LATENCY_S, SLINGSHOT11_BW, V100_DGX2_NVSWITCH_BW, Device,
    DeviceType, Link, NodeSpec)
from .presets import PRESETS, cluster_from_dict, preset, preset_names
from .topology import Cluster, CollectiveGroup

__all__ = [
    "DeviceType",
    "Device",
    "Link",
    "NodeSpec",
    "Cluster",
    "CollectiveGroup",
    "DEVICE_TYPES",
    "PRESETS",
    "preset",
    "preset_names",
    "cluster_from_dict",
    "MAX_DEVICES",
    "MAX_LINKS",
    "BW_RANGE_BYTES_PER_S",
    "FLOPS_RANGE_PER_S",
    "MEMORY_RANGE_BYTES",
    "MAX_LATENCY_S",
    "ARCHS",
    # hardware constants, with their sources in engine/cluster/devices.py
    "GB",
    "GIB",
    "NVLINK_LATENCY_S",
    "PCIE_LATENCY_S",
    "IB_LATENCY_S",
    "NVLINK1_PAIR_BW",
    "NVLINK2_PAIR_BW",
    "A100_NVSWITCH_BW",
    "H100_NVSWITCH_BW",
    "V100_DGX2_NVSWITCH_BW",
    "NVLINK5_NVSWITCH_BW",
    "GH200_NVLINK_PAIR_BW",
    "NVLINK_C2C_BW",
    "SLINGSHOT11_BW",
    "PCIE3_BW",
    "PCIE4_BW",
    "PCIE5_BW",
    "IB_FDR_BW",
    "IB_EDR_BW",
    "IB_HDR_BW",
    "IB_NDR_BW",
]
