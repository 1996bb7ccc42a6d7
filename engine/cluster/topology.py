"""The :class:`Cluster`: nodes expanded into devices and links, routes between devices, and the
groups collectives run over. See :mod:`engine.cluster`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    import networkx as nx

from ..errors import ValidationError
from .checks import check_fabric, check_nodes
from .devices import NVLS_DEVICE_TYPES, PCIE_LATENCY_S, Device, DeviceType, Link, NodeSpec


@dataclass(frozen=True)
class CollectiveGroup:
    """What a collective over a set of devices sees: ``ranks`` devices on ``nodes`` nodes, the
    ring's per-rank bandwidth (bytes/s), the slowest same-node and cross-node paths between
    ring neighbours (s; 0 when there are none), whether the ranks of a node talk over NVLink,
    and the links the collective occupies."""

    ranks: int
    nodes: int
    bw_bytes_per_s: float
    latency_s: float
    inter_latency_s: float
    nvlink: bool
    links: tuple[int, ...]
    #: the ranks share one NVSwitch that reduces in the switch (NCCL's NVLS all-reduce)
    nvls: bool = False
    #: per-rank bandwidth between ranks of one node (inf when no node holds two ranks), and
    #: per-rank bandwidth out of its node (the node's NICs shared by its ranks, over the
    #: fabric's oversubscription across pods; inf on one node): what an all-to-all's
    #: point-to-point sends see
    intra_bw_bytes_per_s: float = math.inf
    inter_bw_bytes_per_s: float = math.inf
    #: the same rates as their bottleneck candidates, (link kind, nominal bytes/s) each, so a
    #: cost model can take each kind of link at its own data-rate share
    #: (:func:`engine.costs.collectives.group_rates`): the ring's, inside a node, out of a node
    bw_parts: tuple[tuple[str, float], ...] = ()
    intra_parts: tuple[tuple[str, float], ...] = ()
    inter_parts: tuple[tuple[str, float], ...] = ()
    #: the ranks' GPU architecture (NVLS's share depends on it); "" when not stated
    arch: str = ""


class Cluster:
    """Devices and links built from node specs.

    Parameters
    ----------
    name : str
    nodes : sequence of NodeSpec
    device_types : mapping of name -> DeviceType
    description : str
    pod_gpus : int
        GPUs per full-bisection pod of the network fabric (device ``d`` is in pod
        ``d // pod_gpus``; a multiple of every node's GPU count, so no node straddles two
        pods); 0: the whole cluster is one pod.
    oversubscription : float
        Oversubscription of the links between pods (7.0: Llama 3's 1:7, §3.3.1); 1: none.

    Raises
    ------
    ValidationError
        For unknown device types, non-positive bandwidths or counts, negative latencies,
        several nodes without NICs, or a fabric whose pods split a node; every problem is listed.

    Notes
    -----
    The fabric: each NIC has an uplink and a downlink into one non-blocking switch (a full fat
    tree). With one NIC per GPU (``nics == gpus``), GPU ``i`` of every node uses NIC ``i``: the
    rail-optimised wiring of DGX SuperPODs and Grand Teton, where the rails meet in the
    non-blocking core (cross-rail traffic is not slower). Pods (``pod_gpus``) model the one
    oversubscribed tier above full-bisection pods: see :meth:`collective_group`.
    """

    def __init__(self, name: str, nodes: Sequence[NodeSpec], device_types: Mapping[str, DeviceType],
                 description: str = "", *, pod_gpus: int = 0, oversubscription: float = 1.0) -> None:
        self.name = name
        self.description = description
        self.node_specs = tuple(nodes)
        self._node_spec: list = []  # node index -> its NodeSpec
        self.device_types = dict(device_types)
        self.pod_gpus = pod_gpus
        self.oversubscription = oversubscription
        problems = check_nodes(self.node_specs, self.device_types) + check_fabric(self.node_specs, pod_gpus,
                                                                                   oversubscription)
        if problems:
            raise ValidationError(problems, name)
        self._build()

    # -- construction ---------------------------------------------------------------------
    def _build(self) -> None:
        """Expand the node specs into devices and links, and fill the routing tables.

        Each spec stands for ``repeat`` nodes (named ``name0``, ``name1``, ... when repeated).
        Node by node: its GPUs become devices, numbered in node order (:meth:`_add_devices`);
        its GPUs are linked inside the node (:meth:`_link_inside_node`: up and down links to
        one switch, or a link per ordered pair of a mesh); and, when the cluster has several
        nodes, its NICs are linked to the fabric and its GPUs to their NIC
        (:meth:`_link_nics`). Links are numbered in the order they are added.

        Notes
        -----
        Sets ``devices``, ``links`` and ``node_names`` (tuples), ``_node_spec`` (node ->
        spec), the routing tables of :meth:`_empty_routes` and the (empty) path and
        collective-group caches. The node specs were checked by
        :func:`~engine.cluster.checks.check_nodes` (sizes, bandwidths, device types).
        """
        devices: list[Device] = []
        links: list[Link] = []
        node_names: list[str] = []
        self._empty_routes(sum(sp.repeat * sp.gpus for sp in self.node_specs))
        multi_node = sum(s.repeat for s in self.node_specs) > 1
        n_nics = 0
        for spec in self.node_specs:
            for r in range(spec.repeat):
                nname = f"{spec.name}{r}" if spec.repeat > 1 else spec.name
                ids = self._add_devices(nname, spec, len(node_names), devices)
                node_names.append(nname)
                self._node_spec.append(spec)
                self._link_inside_node(nname, spec, ids, links)
                if multi_node:
                    n_nics = self._link_nics(nname, spec, ids, links, n_nics)
        self.devices = tuple(devices)
        self.links = tuple(links)
        self.node_names = tuple(node_names)
        self._paths: dict[tuple[int, int], tuple[int, ...]] = {}  # (src, dst) -> link ids
        # sorted devices -> (per-rank bandwidth, per-step latency, links): the one cache of
        # collective groups (the builder, PaSE and the pipeline planner all read it)
        self._groups: dict[tuple[int, ...], CollectiveGroup] = {}

    def _empty_routes(self, n_dev: int) -> None:
        """The structural routing tables, one entry per device (link ids, -1 when absent)."""
        self._up = [-1] * n_dev  # GPU -> switch
        self._down = [-1] * n_dev  # switch -> GPU
        self._mesh: dict[tuple[int, int], int] = {}  # (GPU, GPU) -> their mesh link
        self._nic_tx = [-1] * n_dev  # GPU -> its NIC (PCIe)
        self._nic_rx = [-1] * n_dev  # its NIC -> GPU
        self._uplink = [-1] * n_dev  # its NIC -> fabric (shared by the GPUs on that NIC)
        self._downlink = [-1] * n_dev  # fabric -> its NIC
        self._nic_of = [-1] * n_dev  # global NIC index

    @staticmethod
    def _add_link(links: list[Link], src: str, dst: str, bw_bytes_per_s: float, latency_s: float,
                  kind: str) -> int:
        """Append a link from ``src`` to ``dst`` (endpoint names); its id."""
        links.append(Link(len(links), src, dst, float(bw_bytes_per_s), float(latency_s), kind))
        return len(links) - 1

    @staticmethod
    def _add_devices(nname: str, spec: NodeSpec, node: int, devices: list[Device]) -> list[int]:
        """Append node ``node``'s GPUs (``nname/gpu0``, ...) to ``devices``; their ids."""
        ids = []
        for g in range(spec.gpus):
            d = Device(len(devices), f"{nname}/gpu{g}", spec.device_type, node)
            devices.append(d)
            ids.append(d.id)
        return ids

    def _link_inside_node(self, nname: str, spec: NodeSpec, ids: list[int], links: list[Link]) -> None:
        """A node's GPUs linked to its switch (an up and a down link each), or to each other
        (a mesh: one link per ordered pair); a one-GPU switch node has no links."""
        bw, lat, kind = spec.intra_bw_bytes_per_s, spec.intra_latency_s, spec.intra_kind
        if spec.intra_topology == "switch" and spec.gpus > 1:
            sw = f"{nname}/switch"
            for d in ids:
                self._up[d] = self._add_link(links, _out(d), sw, bw, lat, kind)
                self._down[d] = self._add_link(links, sw, _in(d), bw, lat, kind)
        elif spec.intra_topology == "mesh":
            for a in ids:
                for b in ids:
                    if a != b:
                        self._mesh[a, b] = self._add_link(links, _out(a), _in(b), bw, lat, kind)

    def _link_nics(self, nname: str, spec: NodeSpec, ids: list[int], links: list[Link], n_nics: int) -> int:
        """A node's NICs linked to the fabric and each GPU to its NIC (GPU ``g`` of ``G`` on
        NIC ``g * nics // G``); the cluster's NIC count after them.

        A NIC's send and receive sides are separate endpoints, so traffic between two GPUs of
        one node never hairpins through their NIC.
        """
        nic_links = []
        for n in range(spec.nics):
            nic = f"{nname}/nic{n}"
            up = self._add_link(links, f"{nic}:tx", "fabric", spec.nic_bw_bytes_per_s, spec.nic_latency_s, "network")
            down = self._add_link(links, "fabric", f"{nic}:rx", spec.nic_bw_bytes_per_s, spec.nic_latency_s,
                                  "network")
            nic_links.append((up, down))
        for g, d in enumerate(ids):
            k = g * spec.nics // spec.gpus
            nic = f"{nname}/nic{k}"
            self._nic_tx[d] = self._add_link(links, _out(d), f"{nic}:tx", spec.attach_bw_bytes_per_s, PCIE_LATENCY_S,
                                             "pcie")
            self._nic_rx[d] = self._add_link(links, f"{nic}:rx", _in(d), spec.attach_bw_bytes_per_s, PCIE_LATENCY_S,
                                             "pcie")
            self._uplink[d], self._downlink[d] = nic_links[k]
            self._nic_of[d] = n_nics + k
        return n_nics + spec.nics

    # -- queries ----------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    @property
    def gpus_per_node(self) -> int:
        """GPUs in a node: every node's GPU count on a cluster of equal nodes; where nodes
        differ, the largest count that divides every node's (their gcd), so that a group of
        ``gpus_per_node`` consecutive devices (a tensor-parallel group, a hybrid-sharding
        group) never spans two nodes. The one definition of a node's size for layouts
        (:func:`engine.layout.valid_layouts`).

        >>> from engine.cluster import preset
        >>> preset("dgx-a100-80gb:2").gpus_per_node, preset("hetero-demo").gpus_per_node
        (8, 4)
        """
        return math.gcd(*(spec.gpus for spec in self.node_specs))

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
        >>> from engine.cluster import preset
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

    def path_bandwidth(self, src: int, dst: int, share=None) -> float:
        """Bottleneck bandwidth (bytes/s) of the path from ``src`` to ``dst``; inf if equal.
        ``share``: a callable giving each link kind's data-rate share
        (:class:`engine.costs.collectives.LinkShares`), the bottleneck of the rates at their
        shares; None: nominal rates."""
        p = self.path(src, dst)
        return min((self.links[i].bw_bytes_per_s * (share(self.links[i].kind) if share else 1.0) for i in p),
                   default=math.inf)

    def collective_group(self, devices: Sequence[int]) -> CollectiveGroup:
        """The :class:`CollectiveGroup` of a collective over ``devices`` (cached).

        Inside one node the ring runs over the intra-node links at the GPU's link rate. Across
        nodes, NCCL runs one ring per NIC (channels), so the traffic that must leave each node
        (the whole buffer's ring share) is spread over the distinct NICs the group's GPUs on
        that node use: the bandwidth is the smaller of the intra-node rate (when a node holds
        several ranks) and, over nodes, NICs used x min(NIC rate, PCIe attach rate). The
        latencies are the slowest paths between ring neighbours (devices in id order) inside a
        node and across nodes.
        """
        key = tuple(sorted(set(devices)))
        hit = self._groups.get(key)
        if hit is None:
            if len(self._groups) >= 100_000:  # bounded: a long search meets many groups
                self._groups.clear()
            hit = self._groups[key] = self._collective_group(list(key))
        return hit

    def _collective_group(self, devs: list[int]) -> CollectiveGroup:
        if len(devs) <= 1:
            return CollectiveGroup(len(devs), len(devs), math.inf, 0.0, 0.0, True, ())
        for d in devs:
            self.check_device(d)
        by_node: dict[int, list[int]] = {}
        for d in devs:
            by_node.setdefault(self.devices[d].node, []).append(d)
        intra: dict[str, float] = {}  # link kind -> least nominal rate on a same-node ring hop
        latency = inter_latency = 0.0
        nvlink = True
        links: set[int] = set()
        ring = devs + devs[:1]
        for a, b in zip(ring, ring[1:]):
            p = self.path(a, b)
            links.update(p)
            lat = sum(self.links[i].latency_s for i in p)
            if self.devices[a].node == self.devices[b].node:
                latency = max(latency, lat)
                for i in p:
                    lk = self.links[i]
                    intra[lk.kind] = min(intra.get(lk.kind, math.inf), lk.bw_bytes_per_s)
                nvlink = nvlink and all(self.links[i].kind == "nvlink" for i in p)
            else:
                inter_latency = max(inter_latency, lat)
        ring_parts, inter_parts = dict(intra), {}
        if len(by_node) > 1:
            cross_pod = self.pod_gpus > 0 and len({d // self.pod_gpus for d in devs}) > 1
            over = self.oversubscription if cross_pod else 1.0
            for members in by_node.values():
                nics = len({self._nic_of[d] for d in members})
                for hop in (self._uplink, self._nic_tx):  # the NIC's port, and its PCIe attach
                    kind = self.links[hop[members[0]]].kind
                    rate = nics * min(self.links[hop[d]].bw_bytes_per_s for d in members) / over
                    ring_parts[kind] = min(ring_parts.get(kind, math.inf), rate)
                    inter_parts[kind] = min(inter_parts.get(kind, math.inf), rate / len(members))
                for d in members:  # every member's NIC carries a channel
                    links.update((self._nic_tx[d], self._uplink[d], self._downlink[d], self._nic_rx[d]))
        spec = self._node_spec[self.devices[devs[0]].node]
        nvls = (len(by_node) == 1 and nvlink and spec.intra_topology == "switch"
                and spec.device_type in NVLS_DEVICE_TYPES)
        return CollectiveGroup(len(devs), len(by_node), min(ring_parts.values(), default=math.inf), latency,
                               inter_latency, nvlink, tuple(sorted(links)), nvls,
                               min(intra.values(), default=math.inf), min(inter_parts.values(), default=math.inf),
                               tuple(sorted(ring_parts.items())), tuple(sorted(intra.items())),
                               tuple(sorted(inter_parts.items())), self.device_types[spec.device_type].arch)

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

    def pod(self, device: int) -> int:
        """The full-bisection pod of ``device`` (0 for every device when there are no pods)."""
        self.check_device(device)
        return device // self.pod_gpus if self.pod_gpus else 0

    def host_memory_bytes(self, device: int) -> int:
        """``device``'s share of its node's CPU memory: the node's ``host_memory_bytes`` over its
        GPUs (0: unknown). For ZeRO-Offload's optimizer state and parameters in host memory.

        >>> from engine.cluster import preset
        >>> preset("dgx-h100:1").host_memory_bytes(0) == 2 * 10**12 // 8
        True
        """
        self.check_device(device)
        spec = self._node_spec[self.devices[device].node]
        return spec.host_memory_bytes // spec.gpus

    def host_bw_bytes_per_s(self, device: int) -> float:
        """Per-direction bandwidth between ``device`` and its CPU's memory: the device type's
        ``host_bw_bytes_per_s`` (PCIe x16, NVLink-C2C), or, when that is 0 (unknown), the node's
        GPU-NIC attach rate (the PCIe link the GPU sits on)."""
        self.check_device(device)
        bw = self.device_type(device).host_bw_bytes_per_s
        return bw if bw > 0 else self._node_spec[self.devices[device].node].attach_bw_bytes_per_s

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
        out = {
            "format": "soapbox.cluster/1",
            "name": self.name,
            "description": self.description,
            "device_types": {n: t.to_dict() for n, t in self.device_types.items() if n in used},
            "nodes": [s.to_dict() for s in self.node_specs],
        }
        if self.pod_gpus or self.oversubscription != 1.0:
            out["fabric"] = {"pod_gpus": self.pod_gpus, "oversubscription": self.oversubscription}
        return out

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}: {self.summary()}, {len(self.links)} links)"


def _out(device: int) -> str:
    return f"gpu{device}:send"


def _in(device: int) -> str:
    return f"gpu{device}:recv"


