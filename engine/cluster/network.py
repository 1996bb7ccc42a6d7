"""A cluster with another network (issue 43's co-design sweep): the same nodes and GPUs with
another number of NICs a node, another NIC rate, or a fabric of oversubscribed pods.

What changes is what :class:`~engine.cluster.topology.Cluster` models of the network, nothing
more: each NIC's uplink and downlink into the fabric's switch (``nics`` of them a node, GPU
``g`` of ``G`` on NIC ``g * nics // G``), their rate, and the one oversubscribed tier above
full-bisection pods, which slows the collectives whose members sit in several pods
(:meth:`Cluster.collective_group <engine.cluster.topology.Cluster.collective_group>`; a
point-to-point transfer between pods is not slowed: the fabric model has no spine links).

A preset's name takes the change after it, ``+KEY=VALUE`` each (:func:`variant_name`), so a
variant is named wherever a preset is (``soapbox simulate --cluster dgx-h100:16+nics=4``, a
strategy file, a sweep's rows):

>>> from engine.cluster import preset
>>> c = preset("dgx-a100-80gb:2+nics=2+nic_gbps=400")
>>> c.name, network_of(c)
('dgx-a100-80gb:2+nics=2+nic_gbps=400', {'nics': 2, 'nic_gbps': 400.0, 'pod_gpus': 0, 'oversub': 1.0})
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from .topology import Cluster

__all__ = ["NETWORK_KEYS", "with_network", "network_of", "network_label", "parse_variant", "variant_name",
           "network_kwargs", "check_network_value", "check_pods"]

#: the network keys a variant sets: the keyword of :func:`with_network`, the type of a value,
#: its range and what it is
NETWORK_KEYS = {
    "nics": ("nics", int, 1, 1024, "NICs a node"),
    "nic_gbps": ("nic_gbps", float, 8e-3, 1e7, "each NIC's rate, Gb/s per direction (a link takes at least 1 MB/s)"),
    "pod": ("pod_gpus", int, 0, 10**6, "GPUs a full-bisection pod (0: the whole fabric is one pod)"),
    "oversub": ("oversubscription", float, 1.0, 1000.0, "oversubscription between pods (2: 1:2)"),
}
#: bits in a byte: a NIC's rate is sold in Gb/s, links carry bytes per second
_BITS = 8


def with_network(cluster: Cluster, *, nics: int | None = None, nic_gbps: float | None = None,
                 pod_gpus: int | None = None, oversubscription: float | None = None,
                 name: str | None = None) -> Cluster:
    """``cluster`` with every node's NIC count (``nics``) and NIC rate (``nic_gbps``, Gb/s per
    direction) and the fabric's pods (``pod_gpus`` GPUs each, 0: one pod) and their
    ``oversubscription`` as given; None keeps the cluster's own. Named ``name`` (default: the
    cluster's, with the changes, :func:`variant_name`). The cluster's checks apply:
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
    # (no pods: nothing between them; the preset's own oversubscription goes with its pods)
    over = (1.0 if not pods else cluster.oversubscription) if oversubscription is None else oversubscription
    asked = {"nics": nics, "nic_gbps": nic_gbps, "pod": pod_gpus, "oversub": oversubscription}
    check_pods([over], [pods], f"cluster {variant_name(cluster.name, asked)!r}")
    return Cluster(name or variant_name(cluster.name, asked), specs, cluster.device_types, cluster.description,
                   pod_gpus=pods, oversubscription=over)


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


def check_network_value(key: str, text: str, where: str) -> int | float:
    """``text`` read as a value of network key ``key`` (:data:`NETWORK_KEYS`); a ``ValueError``
    that names ``where``, the key, the text and the range."""
    if key not in NETWORK_KEYS:
        raise ValueError(f"{where}: {key[:30]!r} is not a network key ({', '.join(NETWORK_KEYS)})")
    _, kind, lo, hi, what = NETWORK_KEYS[key]
    v = str(text).strip()
    try:
        x = kind(v) if len(v) <= 30 else None
    except ValueError:
        x = None
    if x is None or not math.isfinite(x) or not lo <= x <= hi:
        raise ValueError(f"{where}: {key}={v[:30]!r}: {what} must be {'a whole number' if kind is int else 'a number'} "
                         f"from {lo:g} to {hi:g}")
    return x


def parse_variant(suffix: str, where: str) -> dict[str, Any]:
    """``"nics=4+oversub=2+pod=256"`` (a preset name's part after its first ``+``) -> {key of
    :data:`NETWORK_KEYS`: value}; a ``ValueError`` naming ``where`` and the part."""
    out: dict[str, Any] = {}
    for part in suffix.split("+"):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"{where}: {part[:30]!r} is not KEY=VALUE (keys: {', '.join(NETWORK_KEYS)})")
        key = key.strip()
        x = check_network_value(key, value, where)
        if key in out:
            raise ValueError(f"{where}: {key} given twice")
        out[key] = x
    return out  # (oversub without pods: refused with the cluster, whose own pods count: with_network)


def check_pods(oversubs: Any, pods: Any, where: str) -> None:
    """A ``ValueError`` naming ``where`` when an oversubscription above 1 is asked with no pods
    (none of ``pods`` above 0: the values asked, or the cluster's own): without pods nothing is
    between them."""
    if any(o != 1 for o in oversubs) and not any(pods):
        raise ValueError(f"{where}: oversub needs pod=GPUS (the size of a full-bisection pod); without pods nothing "
                         "is between them")


def network_kwargs(net: dict[str, Any]) -> dict[str, Any]:
    """{key of :data:`NETWORK_KEYS`: value} -> the keywords of :func:`with_network`."""
    return {NETWORK_KEYS[k][0]: v for k, v in net.items() if v is not None}


def variant_name(base: str, net: dict[str, Any]) -> str:
    """``base`` with the network values of ``net`` (keys of :data:`NETWORK_KEYS`; None: not
    set) after it, in the keys' order: ``variant_name("dgx-h100:16", {"nics": 4})`` is
    ``"dgx-h100:16+nics=4"``."""
    return base + "".join(f"+{k}={_num(net[k])}" for k in NETWORK_KEYS if net.get(k) is not None)


def _num(x: float) -> str:
    """``x`` as a name writes it: a whole number without a point, else the shortest digits that
    read back as the same float, never in exponent form (a ``+`` would end the value:
    ``1e+06``), so a variant's name rebuilds the same cluster.

    >>> [_num(400.0), _num(123.4567), _num(1000000.5), _num(0.008), _num(1.0000001)]
    ['400', '123.4567', '1000000.5', '0.008', '1.0000001']
    """
    if math.isfinite(x) and float(x).is_integer():
        return str(int(x))
    text = repr(float(x))
    if "e" in text or "E" in text:  # (outside the keys' ranges; written out all the same)
        text = f"{x:.20f}".rstrip("0").rstrip(".")
    return text
