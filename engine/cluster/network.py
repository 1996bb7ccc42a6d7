"""A cluster with another network (issue 43's co-design sweep): the same nodes and GPUs with
another number of NICs a node, another NIC rate, or a fabric of oversubscribed pods.

What changes is what :class:`~engine.cluster.topology.Cluster` models of the network, nothing
more: each NIC's uplink and downlink into the fabric's switch (``nics`` of them a node, GPU
``g`` of ``G`` on NIC ``g * nics // G``), their rate, and the one oversubscribed tier above
full-bisection pods, which slows the collectives whose members sit in several pods
(:meth:`Cluster.collective_group <engine.cluster.topology.Cluster.collective_group>`; a
point-to-point transfer between pods is not slowed: the fabric model has no spine links).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from .topology import Cluster

__all__ = ["with_network", "network_of", "network_label"]

#: bits in a byte: a NIC's rate is sold in Gb/s, links carry bytes per second
_BITS = 8


def with_network(cluster: Cluster, *, nics: int | None = None, nic_gbps: float | None = None,
                 pod_gpus: int | None = None, oversubscription: float | None = None) -> Cluster:
    """``cluster`` with every node's NIC count (``nics``) and NIC rate (``nic_gbps``, Gb/s per
    direction) and the fabric's pods (``pod_gpus`` GPUs each, 0: one pod) and their
    ``oversubscription`` as given; None keeps the cluster's own. The cluster's checks apply:
    :class:`~engine.errors.ValidationError` (a ``ValueError``) names what does not hold (more
    NICs than a node has GPUs, pods that split a node, ...)."""
    specs = []
    for s in cluster.node_specs:
        changes: dict[str, Any] = {}
        if nics is not None:
            changes["nics"] = nics
        if nic_gbps is not None:
            changes["nic_bw_bytes_per_s"] = float(nic_gbps) * 1e9 / _BITS
        specs.append(replace(s, **changes) if changes else s)
    pods = cluster.pod_gpus if pod_gpus is None else pod_gpus
    over = cluster.oversubscription if oversubscription is None else oversubscription
    asked = network_label(dict(nics=nics, nic_gbps=nic_gbps, pod_gpus=pod_gpus, oversub=oversubscription))
    name = f"{cluster.name} ({asked})" if asked else cluster.name
    return Cluster(name, specs, cluster.device_types, cluster.description, pod_gpus=pods, oversubscription=over)


def network_of(cluster: Cluster) -> dict[str, Any]:
    """The network a sweep row shows: ``nics`` a node and ``nic_gbps`` (None where the nodes
    differ; on one node they are the node's, though no transfer uses them), ``pod_gpus`` (0:
    one pod) and ``oversub``."""
    nics = {s.nics for s in cluster.node_specs}
    rate = {s.nic_bw_bytes_per_s for s in cluster.node_specs}
    return {"nics": nics.pop() if len(nics) == 1 else None,
            "nic_gbps": round(rate.pop() * _BITS / 1e9, 6) if len(rate) == 1 else None,
            "pod_gpus": cluster.pod_gpus, "oversub": cluster.oversubscription}


def network_label(net: dict[str, Any]) -> str:
    """A short text of the network values set in ``net`` (keys of :func:`network_of`; None or
    missing: not shown), e.g. ``"4 NICs, 200 Gb/s, pods of 256 GPUs 1:2"``.

    >>> network_label({"nics": 4, "nic_gbps": 200.0, "pod_gpus": 256, "oversub": 2.0})
    '4 NICs, 200 Gb/s, pods of 256 GPUs 1:2'
    """
    parts = []
    if net.get("nics") is not None:
        parts.append(f"{net['nics']} NIC{'s' if net['nics'] != 1 else ''}")
    if net.get("nic_gbps") is not None:
        parts.append(f"{_num(net['nic_gbps'])} Gb/s")
    pods, over = net.get("pod_gpus"), net.get("oversub")
    if pods:
        parts.append(f"pods of {pods:,} GPUs" + (f" 1:{_num(over)}" if over is not None and over != 1 else ""))
    elif over is not None and over != 1 and pods is None:
        parts.append(f"1:{_num(over)} between pods")
    return ", ".join(parts)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and math.isfinite(x) else f"{x:g}"
