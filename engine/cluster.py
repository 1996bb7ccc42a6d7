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
NIC→fabric, fabric→NIC, NIC→GPU.

Paths are shortest paths in the link graph weighted by the time to move 1 MB (latency +
size/bandwidth summed over the path); GPUs never forward traffic (each GPU is split into a
sending and a receiving endpoint).

Bandwidths are per direction, in bytes/s; latencies in seconds; memory in bytes. Specs and
their sources: ``shared/validation/hardware_specs.csv``, cited per constant below.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    import networkx as nx

from .errors import Problem, ValidationError, printable

__all__ = [
    "DeviceType",
    "Device",
    "Link",
    "NodeSpec",
    "Cluster",
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
]

GB = 1e9
GIB = 2**30
#: Largest cluster accepted (devices); beyond this the path tables and task graphs stop
#: being interactive. 16,384 is above every published run in ``published_runs_public.csv``.
MAX_DEVICES = 16384
#: Most links (one-directional queues) a cluster may have: a mesh node of n GPUs has n(n-1),
#: so this also bounds mesh nodes (512 GPUs); 2,048 DGX H100 nodes (16,384 GPUs) have 98,304.
MAX_LINKS = 2**18
# Physical ranges of rates and capacities: below them a file describes no real machine and
# times or utilisations stop being numbers (1e-300 bytes/s gives infinite transfer times).
# Files (the JSON Schema) are held to the whole range; a cluster built in code may go above a
# rate's maximum (1e18 bytes/s idealises a link that costs nothing) but not below its
# minimum, and must stay finite.
#: Link and memory bandwidth, bytes/s: 1 MB/s to 1 PB/s (NVLink4 is 4.5e11, HBM3 3.35e12).
BW_RANGE_BYTES_PER_S = (1e6, 1e15)
#: Peak FLOP/s of a device at any precision: 1 GFLOP/s to 1 EFLOP/s (an H100's fp8: 2e15).
FLOPS_RANGE_PER_S = (1e9, 1e18)
#: Memory of a device, bytes: 1 MiB to 1 PiB (an H100 has 80 GiB).
MEMORY_RANGE_BYTES = (2**20, 2**50)
#: Longest link latency, s (a round trip between continents is ~0.2 s).
MAX_LATENCY_S = 1.0

# Latencies are assumptions of the right order, to be calibrated against measurements
# (issue 3): NVLink/NVSwitch hop ~1 us, PCIe hop ~1 us, InfiniBand port-to-port plus
# host software ~2 us per direction. Small transfers are latency-bound; large ones are not.
NVLINK_LATENCY_S = 1e-6
PCIE_LATENCY_S = 1e-6
IB_LATENCY_S = 2e-6

# Per-direction bandwidths, bytes/s (hardware_specs.csv).
NVLINK1_PAIR_BW = 20 * GB  # one NVLink1 link per GPU pair, 20 GB/s per direction (P100)
NVLINK2_PAIR_BW = 25 * GB  # one NVLink2 link, 25 GB/s per direction (V100)
A100_NVSWITCH_BW = 300 * GB  # 600 GB/s bidirectional per GPU (NVLink3, DGX A100)
H100_NVSWITCH_BW = 450 * GB  # 900 GB/s bidirectional per GPU (NVLink4, DGX H100)
V100_DGX2_NVSWITCH_BW = 150 * GB  # Megatron-LM 2019 blog: 300 GB/s between GPUs, bidirectional
PCIE3_BW = 15.75 * GB  # PCIe Gen3 x16 per direction
PCIE4_BW = 31.5 * GB  # PCIe Gen4 x16 per direction
PCIE5_BW = 63 * GB  # PCIe Gen5 x16 per direction
IB_FDR_BW = 56e9 / 8  # 56 Gb/s FDR InfiniBand (FlexFlow's K80 cluster)
IB_EDR_BW = 100e9 / 8  # 100 Gb/s per port per direction (IBTA)
IB_HDR_BW = 200e9 / 8
IB_NDR_BW = 400e9 / 8


@dataclass(frozen=True)
class DeviceType:
    """A kind of accelerator.

    Attributes
    ----------
    name : str
    peak_flops_per_s : mapping of precision -> FLOP/s
        Dense peak per dtype (``fp32``, ``tf32``, ``fp16``, ``bf16``, ``fp8``); a precision
        missing here is not supported by the device.
    mem_bw_bytes_per_s : float
    memory_bytes : int
    source : str
    """

    name: str
    peak_flops_per_s: Mapping[str, float]
    mem_bw_bytes_per_s: float
    memory_bytes: int
    source: str = ""

    def peak(self, precision: str) -> float:
        """Peak FLOP/s at ``precision``; ``ValueError`` when the device lacks it."""
        try:
            return self.peak_flops_per_s[precision]
        except KeyError:
            have = ", ".join(self.peak_flops_per_s)
            raise ValueError(f"{self.name} has no {precision} peak (it has {have})") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_flops_per_s": dict(self.peak_flops_per_s),
            "mem_bw_bytes_per_s": self.mem_bw_bytes_per_s,
            "memory_bytes": self.memory_bytes,
            "source": self.source,
        }


_CSV = "shared/validation/hardware_specs.csv"
#: Device types of the presets, dense peaks (no 2:4 sparsity).
DEVICE_TYPES: dict[str, DeviceType] = {
    d.name: d
    for d in [
        DeviceType("A100-SXM4-40GB", {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12},
                   1555 * GB, 40 * GIB, f"NVIDIA A100 datasheet ({_CSV})"),
        DeviceType("A100-SXM4-80GB", {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12},
                   2039 * GB, 80 * GIB, f"NVIDIA A100 datasheet ({_CSV})"),
        DeviceType("H100-SXM5-80GB",
                   {"fp32": 66.9e12, "tf32": 494.7e12, "fp16": 989.4e12, "bf16": 989.4e12, "fp8": 1978.9e12},
                   3350 * GB, 80 * GIB, f"NVIDIA H100 page, glennklockwood ({_CSV})"),
        DeviceType("V100-SXM2-32GB", {"fp32": 15.7e12, "fp16": 125e12}, 900 * GB, 32 * GIB,
                   f"NVIDIA V100 datasheet, AWS P3 post ({_CSV})"),
        # DGX-2H runs V100s at higher clocks: 130 TFLOP/s fp16 implied by the Megatron-LM
        # blog's "39 TF = 30% of peak" (derivation in the CSV); fp32 kept at the SXM2 figure.
        DeviceType("V100-SXM3-32GB", {"fp32": 15.7e12, "fp16": 130e12}, 900 * GB, 32 * GIB,
                   f"Megatron-LM 2019 blog, derived ({_CSV})"),
        DeviceType("P100-SXM2-16GB", {"fp32": 10.6e12, "fp16": 21.2e12}, 732 * GB, 16 * GIB,
                   f"NVIDIA P100 launch specs ({_CSV})"),
        # One GK210 die (half a K80 board): 8.73 TFLOP/s fp32 per board with boost / 2;
        # no fast fp16 path, so fp16 runs at the fp32 rate.
        DeviceType("K80-GK210", {"fp32": 8.73e12 / 2, "fp16": 8.73e12 / 2}, 240 * GB, 12 * GIB,
                   f"NVIDIA Tesla K80 board spec ({_CSV})"),
    ]
}


@dataclass(frozen=True)
class Device:
    """One accelerator: ``id`` is its index in the cluster (0..n-1), used in configs."""

    id: int
    name: str
    type: str
    node: int


@dataclass(frozen=True)
class Link:
    """A one-directional link (a queue in the simulator)."""

    id: int
    src: str
    dst: str
    bw_bytes_per_s: float
    latency_s: float
    kind: str

    def transfer_time_s(self, size_bytes: float) -> float:
        """FlexFlow's assumption 2: latency + size / bandwidth."""
        return self.latency_s + size_bytes / self.bw_bytes_per_s


@dataclass(frozen=True)
class NodeSpec:
    """A group of ``repeat`` identical nodes (sizes in elements, rates per direction)."""

    name: str
    gpus: int
    device_type: str
    intra_topology: str  # "switch" | "mesh"
    intra_bw_bytes_per_s: float
    intra_latency_s: float = NVLINK_LATENCY_S
    intra_kind: str = "nvlink"
    nics: int = 1
    nic_bw_bytes_per_s: float = IB_EDR_BW
    nic_latency_s: float = IB_LATENCY_S
    attach_bw_bytes_per_s: float = PCIE3_BW  # GPU <-> NIC (PCIe)
    repeat: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "repeat": self.repeat,
            "gpus": self.gpus,
            "device_type": self.device_type,
            "intra": {"topology": self.intra_topology, "kind": self.intra_kind,
                      "bw_bytes_per_s": self.intra_bw_bytes_per_s, "latency_s": self.intra_latency_s},
            "nics": {"count": self.nics, "bw_bytes_per_s": self.nic_bw_bytes_per_s,
                     "latency_s": self.nic_latency_s, "attach_bw_bytes_per_s": self.attach_bw_bytes_per_s},
        }


class Cluster:
    """Devices and links built from node specs.

    Parameters
    ----------
    name : str
    nodes : sequence of NodeSpec
    device_types : mapping of name -> DeviceType
    description : str

    Raises
    ------
    ValidationError
        For unknown device types, non-positive bandwidths or counts, negative latencies, or
        several nodes without NICs; every problem is listed.
    """

    def __init__(self, name: str, nodes: Sequence[NodeSpec], device_types: Mapping[str, DeviceType],
                 description: str = "") -> None:
        self.name = name
        self.description = description
        self.node_specs = tuple(nodes)
        self.device_types = dict(device_types)
        problems = _check_nodes(self.node_specs, self.device_types)
        if problems:
            raise ValidationError(problems, name)
        self._build()

    # -- construction ---------------------------------------------------------------------
    def _build(self) -> None:
        devices: list[Device] = []
        links: list[Link] = []
        node_names: list[str] = []

        # Structural routing tables, one entry per device (link ids, -1 when absent).
        n_dev = sum(sp.repeat * sp.gpus for sp in self.node_specs)
        self._up = [-1] * n_dev  # GPU -> switch
        self._down = [-1] * n_dev  # switch -> GPU
        self._mesh: dict[tuple[int, int], int] = {}
        self._nic_tx = [-1] * n_dev  # GPU -> its NIC (PCIe)
        self._nic_rx = [-1] * n_dev  # its NIC -> GPU
        self._uplink = [-1] * n_dev  # its NIC -> fabric (shared by the GPUs on that NIC)
        self._downlink = [-1] * n_dev  # fabric -> its NIC
        self._nic_of = [-1] * n_dev  # global NIC index

        def add_link(src: str, dst: str, bw: float, lat: float, kind: str) -> int:
            links.append(Link(len(links), src, dst, float(bw), float(lat), kind))
            return len(links) - 1

        multi_node = sum(s.repeat for s in self.node_specs) > 1
        n_nics = 0
        for spec in self.node_specs:
            for r in range(spec.repeat):
                node = len(node_names)
                nname = f"{spec.name}{r}" if spec.repeat > 1 else spec.name
                node_names.append(nname)
                ids = []
                for g in range(spec.gpus):
                    d = Device(len(devices), f"{nname}/gpu{g}", spec.device_type, node)
                    devices.append(d)
                    ids.append(d.id)
                if spec.intra_topology == "switch" and spec.gpus > 1:
                    sw = f"{nname}/switch"
                    for d in ids:
                        self._up[d] = add_link(_out(d), sw, spec.intra_bw_bytes_per_s, spec.intra_latency_s,
                                               spec.intra_kind)
                        self._down[d] = add_link(sw, _in(d), spec.intra_bw_bytes_per_s, spec.intra_latency_s,
                                                 spec.intra_kind)
                elif spec.intra_topology == "mesh":
                    for a in ids:
                        for b in ids:
                            if a != b:
                                self._mesh[a, b] = add_link(_out(a), _in(b), spec.intra_bw_bytes_per_s,
                                                            spec.intra_latency_s, spec.intra_kind)
                if multi_node:
                    # A NIC's send and receive sides are separate endpoints, so traffic
                    # between two GPUs of one node never hairpins through their NIC.
                    first_nic = n_nics
                    nic_links = []
                    for n in range(spec.nics):
                        nic = f"{nname}/nic{n}"
                        up = add_link(f"{nic}:tx", "fabric", spec.nic_bw_bytes_per_s, spec.nic_latency_s, "network")
                        down = add_link("fabric", f"{nic}:rx", spec.nic_bw_bytes_per_s, spec.nic_latency_s, "network")
                        nic_links.append((up, down))
                        n_nics += 1
                    for g, d in enumerate(ids):
                        k = g * spec.nics // spec.gpus
                        nic = f"{nname}/nic{k}"
                        self._nic_tx[d] = add_link(_out(d), f"{nic}:tx", spec.attach_bw_bytes_per_s, PCIE_LATENCY_S,
                                                   "pcie")
                        self._nic_rx[d] = add_link(f"{nic}:rx", _in(d), spec.attach_bw_bytes_per_s, PCIE_LATENCY_S,
                                                   "pcie")
                        self._uplink[d], self._downlink[d] = nic_links[k]
                        self._nic_of[d] = first_nic + k
        self.devices = tuple(devices)
        self.links = tuple(links)
        self.node_names = tuple(node_names)
        self._paths: dict[tuple[int, int], tuple[int, ...]] = {}  # (src, dst) -> link ids
        # sorted devices -> (per-rank bandwidth, per-step latency, links): the one cache of
        # collective groups (the builder, PaSE and the pipeline planner all read it)
        self._groups: dict[tuple[int, ...], tuple[float, float, tuple[int, ...]]] = {}

    # -- queries ----------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    def device_type(self, device: int) -> DeviceType:
        return self.device_types[self.devices[device].type]

    def check_device(self, device: int) -> None:
        if not isinstance(device, int) or not 0 <= device < self.num_devices:
            raise ValueError(f"device {device!r} does not exist; {self.name} has devices 0..{self.num_devices - 1}")

    def path(self, src: int, dst: int) -> tuple[int, ...]:
        """Link ids, in order, that a transfer from device ``src`` to ``dst`` crosses.

        Returns ``()`` when ``src == dst``. Raises ``ValueError`` for unknown devices or when
        no path exists.

        Examples
        --------
        >>> c = preset("dgx-a100-80gb:2")
        >>> [c.links[i].kind for i in c.path(0, 1)]
        ['nvlink', 'nvlink']
        >>> [c.links[i].kind for i in c.path(0, 8)]
        ['pcie', 'network', 'network', 'pcie']
        """
        key = (src, dst)
        found = self._paths.get(key)
        if found is None:
            found = self._paths[key] = self._route(src, dst)
        return found

    def _route(self, src: int, dst: int) -> tuple[int, ...]:
        """Structural route: O(1) from the node specs (the topology family is fixed)."""
        self.check_device(src)
        self.check_device(dst)
        if src == dst:
            return ()
        if self.devices[src].node == self.devices[dst].node:
            if (src, dst) in self._mesh:
                return (self._mesh[src, dst],)
            if self._up[src] >= 0:
                return (self._up[src], self._down[dst])
        elif self._nic_tx[src] >= 0 and self._nic_rx[dst] >= 0:
            return (self._nic_tx[src], self._uplink[src], self._downlink[dst], self._nic_rx[dst])
        return self.shortest_path(src, dst)

    def shortest_path(self, src: int, dst: int) -> tuple[int, ...]:
        """Route by Dijkstra over the link graph (weights: time to move 1 MB); the reference
        the structural route is tested against."""
        self.check_device(src)
        self.check_device(dst)
        if src == dst:
            return ()
        # Two GPUs of one node talk over the node's interconnect, never out through the
        # network and back, even where that detour would be faster.
        same_node = self.devices[src].node == self.devices[dst].node
        weight = (lambda u, v, e: None if e["kind"] == "network" else e["weight"]) if same_node else "weight"
        import networkx as nx

        graph = self._link_graph
        try:
            nodes = nx.dijkstra_path(graph, _out(src), _in(dst), weight=weight)
        except (nx.NetworkXNoPath, nx.NodeNotFound):
            raise ValueError(f"no path from {self.devices[src].name} to {self.devices[dst].name}") from None
        return tuple(graph.edges[u, v]["id"] for u, v in zip(nodes, nodes[1:]))

    @cached_property
    def _link_graph(self) -> "nx.DiGraph":
        """Endpoints joined by links (weight: seconds to move 1 MB), made on first use:
        structural routes need no graph (networkx loads only for a route search)."""
        import networkx as nx

        graph = nx.DiGraph()
        for lk in self.links:
            graph.add_edge(lk.src, lk.dst, id=lk.id, kind=lk.kind, weight=lk.latency_s + 1e6 / lk.bw_bytes_per_s)
        return graph

    def path_bandwidth(self, src: int, dst: int) -> float:
        """Bottleneck bandwidth (bytes/s) of the path from ``src`` to ``dst``; inf if equal."""
        p = self.path(src, dst)
        return min((self.links[i].bw_bytes_per_s for i in p), default=math.inf)

    def collective_group(self, devices: Sequence[int]) -> tuple[float, float, tuple[int, ...]]:
        """Effective per-rank bandwidth (bytes/s), per-step latency (s) and the links a
        collective over ``devices`` occupies.

        Inside one node the ring runs over the intra-node links at the GPU's link rate. Across
        nodes, NCCL runs one ring per NIC (channels), so the traffic that must leave each node
        (the whole buffer's ring share) is spread over the distinct NICs the group's GPUs on
        that node use: the bandwidth is the smaller of the intra-node rate (when a node holds
        several ranks) and, over nodes, NICs used x min(NIC rate, PCIe attach rate). The
        latency is the slowest path between ring neighbours (devices in id order).
        """
        key = tuple(sorted(set(devices)))
        hit = self._groups.get(key)
        if hit is None:
            if len(self._groups) >= 100_000:  # bounded: a long search meets many groups
                self._groups.clear()
            hit = self._groups[key] = self._collective_group(list(key))
        return hit

    def _collective_group(self, devs: list[int]) -> tuple[float, float, tuple[int, ...]]:
        if len(devs) <= 1:
            return math.inf, 0.0, ()
        for d in devs:
            self.check_device(d)
        by_node: dict[int, list[int]] = {}
        for d in devs:
            by_node.setdefault(self.devices[d].node, []).append(d)
        bw = math.inf
        latency = 0.0
        links: set[int] = set()
        ring = devs + devs[:1]
        for a, b in zip(ring, ring[1:]):
            p = self.path(a, b)
            links.update(p)
            latency = max(latency, sum(self.links[i].latency_s for i in p))
            if self.devices[a].node == self.devices[b].node:
                bw = min(bw, min(self.links[i].bw_bytes_per_s for i in p))
        if len(by_node) > 1:
            for members in by_node.values():
                nics = {self._nic_of[d] for d in members}
                rate = min(min(self.links[self._uplink[d]].bw_bytes_per_s for d in members),
                           min(self.links[self._nic_tx[d]].bw_bytes_per_s for d in members))
                bw = min(bw, len(nics) * rate)
                for d in members:  # every member's NIC carries a channel
                    links.update((self._nic_tx[d], self._uplink[d], self._downlink[d], self._nic_rx[d]))
        return bw, latency, tuple(sorted(links))

    @cached_property
    def arrays(self) -> dict[str, np.ndarray]:
        """NumPy views: ``device_node`` [device], ``device_memory_bytes`` [device],
        ``device_mem_bw_bytes_per_s`` [device], ``link_bw_bytes_per_s`` [link],
        ``link_latency_s`` [link]."""
        arr = {
            "device_node": np.array([d.node for d in self.devices], dtype=np.int64),
            "device_memory_bytes": np.array([self.device_type(d.id).memory_bytes for d in self.devices],
                                            dtype=np.int64),
            "device_mem_bw_bytes_per_s": np.array([self.device_type(d.id).mem_bw_bytes_per_s
                                                   for d in self.devices]),
            "link_bw_bytes_per_s": np.array([lk.bw_bytes_per_s for lk in self.links]),
            "link_latency_s": np.array([lk.latency_s for lk in self.links]),
        }
        for a in arr.values():
            a.setflags(write=False)
        return arr

    def peak_flops_per_s(self, precision: str) -> np.ndarray:
        """[device] peak FLOP/s at ``precision`` (``ValueError`` if a device lacks it)."""
        return np.array([self.device_type(d.id).peak(precision) for d in self.devices])

    def to_networkx(self) -> "nx.DiGraph":
        """Endpoints (GPU send/receive sides, switches, NICs, fabric) joined by links."""
        return self._link_graph.copy()

    def summary(self) -> str:
        types: dict[str, int] = {}
        for d in self.devices:
            types[d.type] = types.get(d.type, 0) + 1
        kinds = ", ".join(f"{n} x {t}" for t, n in types.items())
        return f"{self.num_nodes} node(s), {self.num_devices} GPUs ({kinds})"

    def to_dict(self) -> dict[str, Any]:
        used = {s.device_type for s in self.node_specs}
        return {
            "format": "soapbox.cluster/1",
            "name": self.name,
            "description": self.description,
            "device_types": {n: t.to_dict() for n, t in self.device_types.items() if n in used},
            "nodes": [s.to_dict() for s in self.node_specs],
        }

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}: {self.summary()}, {len(self.links)} links)"


def _out(device: int) -> str:
    return f"gpu{device}:send"


def _in(device: int) -> str:
    return f"gpu{device}:recv"


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_DEVICES


def _in_range(v: Any, lo: float, hi: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi


def _rate_ok(v: Any, lo: float) -> bool:
    return _in_range(v, lo, math.inf) and math.isfinite(v)


def _size_problems(nodes: Sequence[NodeSpec]) -> list[Problem]:
    """Devices and links the nodes would make, counted before anything is built (a
    ``repeat`` of 10**8 must be refused, not enumerated)."""
    total_devices = total_links = 0
    sized = [s for s in nodes if _is_count(s.repeat) and _is_count(s.gpus)]  # (others are reported per node)
    multi_node = sum(s.repeat for s in sized) > 1
    for s in sized:
        nics = s.nics if _is_count(s.nics) else 0
        intra = s.gpus * (s.gpus - 1) if s.intra_topology == "mesh" else 2 * s.gpus if s.gpus > 1 else 0
        total_devices += s.repeat * s.gpus
        total_links += s.repeat * (intra + (2 * nics + 2 * s.gpus if multi_node else 0))
    if total_devices > MAX_DEVICES:
        return [Problem("nodes", f"{total_devices:,} GPUs is over the limit of {MAX_DEVICES:,}")]
    if total_links > MAX_LINKS:
        return [Problem("nodes", f"{total_links:,} links is over the limit of {MAX_LINKS:,} "
                                 f"(a mesh node of n GPUs has n(n-1) links; use a switch)")]
    return []


def _e(x: float) -> str:
    """``1e6`` for 1000000.0 (as a schema or a person writes it)."""
    mantissa, exponent = f"{x:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"




def _check_nodes(nodes: Sequence[NodeSpec], types: Mapping[str, DeviceType]) -> list[Problem]:
    problems: list[Problem] = []
    if not nodes:
        problems.append(Problem("nodes", "a cluster needs at least one node"))
    if len(nodes) > MAX_DEVICES:
        return [Problem("nodes", f"{len(nodes):,} node groups is over the limit of {MAX_DEVICES:,}")]
    size = _size_problems(nodes)
    if size:
        return size
    total_nodes = sum(s.repeat for s in nodes if _is_count(s.repeat))
    used: dict[str, int] = {}
    bw_lo = BW_RANGE_BYTES_PER_S[0]
    for i, s in enumerate(nodes):
        at = f"nodes[{i}] ({s.name})"
        repeat = s.repeat if _is_count(s.repeat) else 1
        for name in ([f"{s.name}{r}" for r in range(repeat)] if repeat > 1 else [s.name]):
            if name in used:
                problems.append(Problem(f"{at}.name", f"node name {name!r} is already used by nodes[{used[name]}]; "
                                                      "node names must be unique"))
                break
            used[name] = i
        if s.device_type not in types:
            problems.append(Problem(f"{at}.device_type",
                                    f"unknown device type {s.device_type!r}; known: {', '.join(sorted(types))}"))
        for fld, v in (("repeat", s.repeat), ("gpus", s.gpus)):
            if not _is_count(v):
                problems.append(Problem(f"{at}.{fld}", f"must be an integer from 1 to {MAX_DEVICES:,}, got {v!r}"))
        if s.intra_topology not in ("switch", "mesh"):
            problems.append(Problem(f"{at}.intra.topology", f"must be 'switch' or 'mesh', got {s.intra_topology!r}"))
        for fld, v in (("intra.bw_bytes_per_s", s.intra_bw_bytes_per_s),
                       ("nics.bw_bytes_per_s", s.nic_bw_bytes_per_s),
                       ("nics.attach_bw_bytes_per_s", s.attach_bw_bytes_per_s)):
            if not _rate_ok(v, bw_lo):
                problems.append(Problem(f"{at}.{fld}", f"bandwidth must be a finite number of bytes/s of at least "
                                                       f"{_e(bw_lo)} (1 MB/s), got {v!r}"))
        for fld, v in (("intra.latency_s", s.intra_latency_s), ("nics.latency_s", s.nic_latency_s)):
            if not _in_range(v, 0.0, MAX_LATENCY_S):
                problems.append(Problem(f"{at}.{fld}", f"latency must be a number of seconds from 0 to "
                                                       f"{MAX_LATENCY_S:g}, got {v!r}"))
        if total_nodes > 1 and (not isinstance(s.nics, int) or s.nics < 1):
            problems.append(Problem(f"{at}.nics.count",
                                    f"a cluster of {total_nodes} nodes needs at least one NIC per node, got {s.nics!r}"))
        elif isinstance(s.nics, int) and isinstance(s.gpus, int) and s.nics > s.gpus >= 1:
            problems.append(Problem(f"{at}.nics.count", f"{s.nics} NICs for {s.gpus} GPUs: at most one NIC per GPU"))
    used_types = {s.device_type for s in nodes}
    f_lo = FLOPS_RANGE_PER_S[0]
    m_lo, m_hi = MEMORY_RANGE_BYTES
    for name, t in types.items():
        if name not in used_types and name in DEVICE_TYPES and t is DEVICE_TYPES[name]:
            continue  # a built-in nobody uses
        at = f"device_types.{name}"
        if not t.peak_flops_per_s:
            problems.append(Problem(f"{at}.peak_flops_per_s", "needs at least one precision"))
        elif "fp32" not in t.peak_flops_per_s:
            problems.append(Problem(f"{at}.peak_flops_per_s", "needs an fp32 peak: ops other than matrix "
                                                              "multiplies run at the fp32 rate"))
        for prec, v in t.peak_flops_per_s.items():
            if not _rate_ok(v, f_lo):
                problems.append(Problem(f"{at}.peak_flops_per_s.{prec}",
                                        f"must be a finite number of FLOP/s of at least {_e(f_lo)} (1 GFLOP/s), "
                                        f"got {v!r}"))
        if not _rate_ok(t.mem_bw_bytes_per_s, bw_lo):
            problems.append(Problem(f"{at}.mem_bw_bytes_per_s",
                                    f"must be a finite number of bytes/s of at least {_e(bw_lo)} (1 MB/s), "
                                    f"got {t.mem_bw_bytes_per_s!r}"))
        if not _in_range(t.memory_bytes, m_lo, m_hi):
            problems.append(Problem(f"{at}.memory_bytes",
                                    f"must be from {m_lo:,} to {m_hi:,} bytes (1 MiB to 1 PiB), got {t.memory_bytes!r}"))
    return problems


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
