"""Transfers and collectives: how long moving bytes point to point or in an NCCL collective
takes (FlexFlow's assumption 2 per link; NCCL's own cost model for collectives)."""

from __future__ import annotations

import math

__all__ = ["transfer_time_s", "collective_time_s", "group_collective_time_s", "all_to_all_time_s", "COLLECTIVES",
           "LINK_EFFICIENCY", "LINK_SHARE", "LinkShares", "NVLS_EFFICIENCY",
           "NCCL_PROTOCOLS", "NCCL_BASE_LATENCY_US", "NCCL_STEP_LATENCY_US", "NCCL_NET_OVERHEAD_US",
           "NCCL_NVLS_LATENCY_US", "NCCL_PROTOCOL_BW_SHARE"]

# Fraction of a link's nominal bandwidth that NCCL's transfers reach, by link kind: a property
# of the link's protocol, checked on published nccl-tests bus bandwidths
# (validation/collectives/nccl_tests.csv; tests/costs/test_nccl_tests.py):
# * NVLink: NCCL's kernels move data with 128-byte payloads, so a 25 GB/s NVLink lane carries
#   ~20 GB/s of data (S. Jeaugey, NCCL, github.com/NVIDIA/nccl-tests/issues/149, 2023-07-05:
#   "240GB/s on A100, but some other bottlenecks on the GPUs limits it to ~230GB/s"; and
#   nccl-tests/issues/212, 2024-05-06: H100's 450 GB/s line rate gives "an effective NVLink
#   bandwidth of 370GB/s"): 0.80.
# * InfiniBand / RoCE NICs: 24 of HDR's 25 GB/s (Jeaugey, github.com/NVIDIA/nccl/issues/412),
#   48-49 of NDR's 50 GB/s (D. Addison, NCCL, nccl-tests/issues/267), 192 GB/s all-reduce bus
#   bandwidth from a DGX A100's 8 x 200 Gb/s (Addison, nccl/issues/812): 0.96.
# * Other kinds (PCIe, a user's own): LINK_EFFICIENCY, the middle of the 80-90% that
#   device-to-device copies reach over PCIe.
LINK_EFFICIENCY = 0.85
LINK_SHARE: dict[str, float] = {"nvlink": 0.80, "network": 0.96}
#: NVLS all-reduce's share of the NVLink data rate by architecture: NCCL's own tuner constant
#: (``nvlsEfficiency`` in NCCL's src/tuning/nvls.cc, 2.2x: Hopper 0.85, Blackwell 0.74; the
#: NVSwitch's reduction does not keep up with Blackwell's doubled links). Checked on H100's
#: published 480 GB/s NVLS bus bandwidth (nccl-tests/issues/212): 535 GB/s predicted, +11%.
NVLS_EFFICIENCY: dict[str, float] = {"hopper": 0.85, "blackwell": 0.74}


class LinkShares:
    """The share of its nominal rate each kind of link reaches (:data:`LINK_SHARE`), ``default``
    for kinds it does not name. Called with a link kind.

    >>> LinkShares({"nvlink": 0.8}, 0.85)("pcie")
    0.85
    """

    __slots__ = ("shares", "default")

    def __init__(self, shares=None, default: float = LINK_EFFICIENCY) -> None:
        self.shares = dict(LINK_SHARE if shares is None else shares)
        self.default = float(default)

    def __call__(self, kind: str) -> float:
        return self.shares.get(kind, self.default)

    @classmethod
    def of(cls, link_efficiency) -> "LinkShares":
        """``link_efficiency`` as shares: a :class:`LinkShares` as it is; a number, the same
        share for every kind of link (FlexFlow's toys, what-ifs)."""
        return link_efficiency if isinstance(link_efficiency, cls) else cls({}, float(link_efficiency))

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")

# NCCL's latency model, from its tuner (NCCL src/graph/tuning.cc, ``baseLat`` and ``hwLat`` in
# ncclTopoTuneModel, NCCL 2.2x; microseconds, measured by NVIDIA per algorithm and protocol):
# a fixed launch cost per collective, plus a cost per ring or tree step over NVLink, PCIe or the
# network. These, not a link's 1-2 us, are what a collective over thousands of ranks pays.
NCCL_PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_BASE_LATENCY_US: dict[tuple[str, str], float] = {
    ("tree", "LL"): 6.8, ("tree", "LL128"): 14.0, ("tree", "Simple"): 8.4,
    ("ring", "LL"): 6.6, ("ring", "LL128"): 14.0, ("ring", "Simple"): 8.4,
}
NCCL_STEP_LATENCY_US: dict[tuple[str, str, str], float] = {
    ("nvlink", "tree", "LL"): 0.6, ("nvlink", "tree", "LL128"): 1.25, ("nvlink", "tree", "Simple"): 4.0,
    ("nvlink", "ring", "LL"): 0.6, ("nvlink", "ring", "LL128"): 1.9, ("nvlink", "ring", "Simple"): 3.4,
    ("pcie", "tree", "LL"): 1.0, ("pcie", "tree", "LL128"): 1.9, ("pcie", "tree", "Simple"): 4.0,
    ("pcie", "ring", "LL"): 1.0, ("pcie", "ring", "LL128"): 2.5, ("pcie", "ring", "Simple"): 5.7,
    ("net", "tree", "LL"): 5.0, ("net", "tree", "LL128"): 8.5, ("net", "tree", "Simple"): 14.0,
    ("net", "ring", "LL"): 2.7, ("net", "ring", "LL128"): 4.0, ("net", "ring", "Simple"): 14.0,
}
# Each network step also waits for a post to the NIC (NCCL's NET_OVERHEAD default on x86,
# tripled for the Simple protocol), us.
NCCL_NET_OVERHEAD_US = 1.0
# NVLS (NVLink SHARP in the third-generation NVSwitch): NCCL's tuner gives the all-reduce the
# latency of one NVLink NVLS step (hwLat, Simple protocol; same source); its bandwidth share is
# NVLS_EFFICIENCY above.
NCCL_NVLS_LATENCY_US = 25.0
# Share of the bus bandwidth each protocol reaches (same source): LL sends 8-byte lines of 4
# data bytes + 4 flag bytes (0.5), LL128 128-byte lines with 8 flag bytes (120/128 ~ 0.92);
# Simple moves data at full rate but has the highest per-step latency.
NCCL_PROTOCOL_BW_SHARE: dict[str, float] = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}


def transfer_time_s(size_bytes, bw_bytes_per_s, latency_s, link_efficiency: float = LINK_EFFICIENCY):
    """Seconds to move ``size_bytes`` point to point over a path whose bottleneck bandwidth
    is ``bw_bytes_per_s`` and whose latency is ``latency_s``, uncontended: latency plus
    streaming at the achievable share of the bottleneck (cut-through: hops overlap, so the
    bottleneck sets the rate). Works elementwise on NumPy arrays.

    >>> transfer_time_s(1e9, 100e9, 1e-6, 0.5)
    0.020001
    """
    return size_bytes / (bw_bytes_per_s * link_efficiency) + latency_s


def collective_time_s(kind: str, size_bytes: float, n: int, bw_bytes_per_s: float, latency_s: float,
                      link_efficiency: float = LINK_EFFICIENCY, *, nodes: int = 1, inter_latency_s: float = 0.0,
                      nvlink: bool = True, nvls: bool = False, nvls_share: float = NVLS_EFFICIENCY["hopper"]) -> float:
    """Time of a collective over ``n`` ranks on ``nodes`` nodes whose ring has per-rank
    bandwidth ``bw_bytes_per_s``; ``size_bytes`` is the full buffer; ``latency_s`` and
    ``inter_latency_s`` are the slowest same-node and cross-node neighbour paths (a floor on
    each step's latency); ``nvlink``: the ranks of a node talk over NVLink (else PCIe).

    NCCL's own cost model (``ncclTopoTuneModel`` in NCCL's src/graph/tuning.cc, 2.2x), the
    model NCCL picks its algorithm and protocol by: time = base latency + steps x per-step
    latency + bytes / (bus bandwidth x the protocol's share of it), the least over the ring
    and (all-reduce only) the double binary tree, and over the LL, LL128 and Simple protocols.
    Ring steps (Patarasuk & Yuan 2009): all-reduce 2(n-1), of which 2(nodes-1) cross nodes;
    reduce-scatter and all-gather n-1, of which nodes-1 cross nodes; broadcast pipelines over
    n-1. The tree (Sanders et al. 2009; NCCL 2.4) all-reduce chains the ranks of a node and
    crosses nodes in log2(nodes) steps up and down, at half the ring's bus bandwidth. A step
    costs NCCL's measured per-step latency (``NCCL_STEP_LATENCY_US``), not the 1-2 us of a
    link: at 2,048 ranks a ring all-gather pays ~7 ms however small the buffer. ``nvls``: the
    ranks share an NVSwitch that reduces in the switch (H100, H200): an all-reduce inside the
    node may use NCCL's NVLS algorithm, each rank sending its buffer once and reading the sum
    once, at ``nvls_share`` of the link rate (NCCL's ``nvlsEfficiency``, :data:`NVLS_EFFICIENCY`)
    and its per-call latency. ``link_efficiency`` is one share for every link here
    (:func:`group_collective_time_s` takes a share per kind of link).

    >>> round(collective_time_s("all_reduce", 1e9, 8, 100e9, 0.0, 1.0), 4)
    0.0176
    """
    if n <= 1 or size_bytes <= 0:
        return 0.0
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}")
    if kind == "all_to_all":
        return all_to_all_time_s(size_bytes, n, bw_bytes_per_s, bw_bytes_per_s, latency_s, link_efficiency,
                                 nodes=nodes, inter_latency_s=inter_latency_s)
    bw = bw_bytes_per_s * link_efficiency
    k = max(1, min(int(nodes), n))
    intra_hw = "nvlink" if nvlink else "pcie"
    if kind == "all_reduce":
        steps, inter_steps, share = 2 * (n - 1), 2 * (k - 1), 2 * (n - 1) / n
    elif kind == "broadcast":
        steps, inter_steps, share = n - 1, k - 1, 1.0
    else:
        steps, inter_steps, share = n - 1, k - 1, (n - 1) / n
    best = math.inf
    for proto in NCCL_PROTOCOLS:
        if proto == "LL128" and not nvlink:  # NCCL enables LL128 by default on NVLink only
            continue
        pbw = bw * NCCL_PROTOCOL_BW_SHARE[proto]
        base = NCCL_BASE_LATENCY_US[("ring", proto)] * 1e-6
        intra = max(NCCL_STEP_LATENCY_US[(intra_hw, "ring", proto)] * 1e-6, latency_s)
        if k > 1:  # a multi-node ring's every step waits for a network post as well
            intra = max(intra, NCCL_NET_OVERHEAD_US * (3 if proto == "Simple" else 1) * 1e-6)
            # one rank per node: every step is a network step, at the tree's network latency
            net_algo = "tree" if k == n else "ring"
        else:
            net_algo = "ring"
        inter = max(NCCL_STEP_LATENCY_US[("net", net_algo, proto)] * 1e-6, inter_latency_s)
        best = min(best, base + (steps - inter_steps) * intra + inter_steps * inter + share * size_bytes / pbw)
        if kind == "all_reduce" and n > 2:
            base = NCCL_BASE_LATENCY_US[("tree", proto)] * 1e-6
            t_intra = max(NCCL_STEP_LATENCY_US[(intra_hw, "tree", proto)] * 1e-6, latency_s)
            t_inter = max(NCCL_STEP_LATENCY_US[("net", "tree", proto)] * 1e-6, inter_latency_s)
            hops = (n // k - 1) * t_intra + (k - 1).bit_length() * t_inter
            best = min(best, base + 2 * hops + 2 * size_bytes / pbw)
    if nvls and kind == "all_reduce" and k == 1:
        best = min(best, max(NCCL_NVLS_LATENCY_US * 1e-6, latency_s) + size_bytes / (bw * nvls_share))
    return best


def all_to_all_time_s(size_bytes: float, n: int, intra_bw_bytes_per_s: float, inter_bw_bytes_per_s: float,
                      latency_s: float, link_efficiency: float = LINK_EFFICIENCY, *, nodes: int = 1,
                      inter_latency_s: float = 0.0) -> float:
    """Time of an all-to-all over ``n`` ranks spread evenly over ``nodes`` nodes, each rank
    holding ``size_bytes`` to share out (1/n of it to every rank, itself included: a
    mixture-of-experts dispatch of balanced tokens).

    NCCL runs an all-to-all as n-1 concurrent point-to-point sends (``ncclGroupStart``;
    Megatron-Core's dispatcher calls ``torch.distributed.all_to_all_single``): each rank sends
    (g-1)/n of its buffer to the g-1 other ranks of its node over NVLink and (n-g)/n across
    the network through its share of the node's NICs, both at once; the slower of the two
    sets the time, plus NCCL's launch cost and one path latency (Simple protocol; the sends
    run in parallel, so their latencies overlap). Per-rank rates are the group's
    (:class:`~engine.cluster.CollectiveGroup`: ``intra_bw_bytes_per_s``,
    ``inter_bw_bytes_per_s``).

    >>> round(all_to_all_time_s(8e6, 8, 100e9, 1e9, 0.0, 1.0) * 1e6, 1)  # one node: 7 MB over NVLink
    81.8
    """
    if n <= 1 or size_bytes <= 0:
        return 0.0
    k = max(1, min(int(nodes), n))
    g = n / k  # ranks per node
    intra = size_bytes * (g - 1) / n / (intra_bw_bytes_per_s * link_efficiency) if g > 1 else 0.0
    inter = size_bytes * (n - g) / n / (inter_bw_bytes_per_s * link_efficiency) if k > 1 else 0.0
    lat = max(latency_s, inter_latency_s if k > 1 else 0.0,
              NCCL_STEP_LATENCY_US[("net" if k > 1 else "nvlink", "ring", "Simple")] * 1e-6)
    return NCCL_BASE_LATENCY_US[("ring", "Simple")] * 1e-6 + lat + max(intra, inter)


def group_collective_time_s(kind: str, size_bytes: float, group, link_efficiency=LINK_EFFICIENCY) -> float:
    """:func:`collective_time_s` over a :class:`~engine.cluster.CollectiveGroup` (the ranks,
    their nodes, bandwidth and path latencies, as :meth:`Cluster.collective_group` gives them).
    ``link_efficiency``: a :class:`LinkShares` (each bottleneck at its own kind's share: the
    ring's NVLink hops, its NICs, their PCIe attach) or one number for every link."""
    shares = LinkShares.of(link_efficiency)
    bw, intra_bw, inter_bw = group_rates(group, shares)
    if kind == "all_to_all":
        return all_to_all_time_s(size_bytes, group.ranks, intra_bw, inter_bw, group.latency_s, 1.0,
                                 nodes=group.nodes, inter_latency_s=group.inter_latency_s)
    nvls_share = NVLS_EFFICIENCY.get(getattr(group, "arch", ""), NVLS_EFFICIENCY["hopper"])
    return collective_time_s(kind, size_bytes, group.ranks, bw, group.latency_s, 1.0,
                             nodes=group.nodes, inter_latency_s=group.inter_latency_s, nvlink=group.nvlink,
                             nvls=group.nvls, nvls_share=nvls_share)


def group_rates(group, shares: LinkShares) -> tuple[float, float, float]:
    """(ring rate, per-rank rate inside a node, per-rank rate out of a node), bytes/s, of
    ``group`` at the data rates ``shares`` gives each kind of link: each of the group's
    bottleneck candidates (``bw_parts``, ``intra_parts``, ``inter_parts``: (link kind, nominal
    bytes/s)) at its own share, the least of them; a group without parts takes its nominal
    rates at the share of its intra-node kind."""
    parts = getattr(group, "bw_parts", ())
    if not parts:
        s = shares("nvlink" if group.nvlink else "pcie")
        return group.bw_bytes_per_s * s, group.intra_bw_bytes_per_s * s, group.inter_bw_bytes_per_s * s

    def least(ps, default):
        return min((b * shares(k) for k, b in ps), default=default)
    return least(parts, math.inf), least(group.intra_parts, math.inf), least(group.inter_parts, math.inf)
