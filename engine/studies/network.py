"""The network axis of a co-design sweep (``soapbox sweep --network``, issue 43): every point
of the sweep on each network asked (NICs a node, their rate, a fabric of oversubscribed pods),
each a preset named with its network (:mod:`engine.cluster.network`: ``dgx-h100:64+nics=4``).

>>> net = parse_network(["nics=4,8", "oversub=1,2", "pod=256"])
>>> [p["cluster"] for p in network_points([{"cluster": "dgx-h100:64", "tp": 8}], net)]
['dgx-h100:64+nics=4+pod=256+oversub=1', 'dgx-h100:64+nics=4+pod=256+oversub=2', \
'dgx-h100:64+nics=8+pod=256+oversub=1', 'dgx-h100:64+nics=8+pod=256+oversub=2']
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

from ..cluster.network import NETWORK_KEYS, check_network_value, check_pods, parse_variant, variant_name

__all__ = ["MAX_VARIANTS", "parse_network", "check_sweep_pods", "network_points"]

#: most network variants one sweep takes
MAX_VARIANTS = 256


def parse_network(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["nics=4,8", "oversub=1,2", "pod=256"]`` -> {key: values} (each value checked against
    its range, :data:`engine.cluster.network.NETWORK_KEYS`; a ``ValueError`` names the key and
    the value). ``oversub`` above 1 needs pods, ``pod`` or the cluster's own:
    :func:`check_sweep_pods`."""
    out: dict[str, list[Any]] = {}
    for item in items:
        key, sep, vals = str(item).partition("=")
        key = key.strip()
        if not sep or key not in NETWORK_KEYS:
            raise ValueError(f"--network {str(item)[:60]!r}: write KEY=V1,V2 with KEY one of {', '.join(NETWORK_KEYS)}")
        if key in out:
            raise ValueError(f"--network {key}: given twice")
        out[key] = list(dict.fromkeys(check_network_value(key, v, "--network") for v in vals.split(",")))
    n = math.prod(len(v) for v in out.values())
    if n > MAX_VARIANTS:
        raise ValueError(f"--network: {n:,} networks, more than the {MAX_VARIANTS} a sweep takes")
    return out


def check_sweep_pods(network: dict[str, list[Any]], pod_sizes: Sequence[int]) -> None:
    """A ``ValueError`` naming ``--network`` when it asks for an oversubscription above 1 with
    no pods: no ``pod`` value and none of the sweep's clusters has pods of its own (``pod_sizes``:
    each cluster's ``pod_gpus``; Grand Teton's 3,072-GPU pods take ``oversub=2`` as they are).
    Where some have pods, the others' rows say why instead."""
    if not any(network.get("pod", ())) and not any(pod_sizes):
        check_pods(network.get("oversub", ()), (), "--network")


def network_points(pts: list[dict[str, Any]], network: dict[str, list[Any]],
                   max_points: int = 100_000) -> list[dict[str, Any]]:
    """Every point on every network of ``network`` (:func:`parse_network`): its cluster named
    with the network (a value its name already sets is replaced), points outermost, then the
    networks in the keys' order; the points themselves when ``network`` is empty."""
    if not network:
        return pts
    keys = list(network)
    combos = list(itertools.product(*(network[k] for k in keys)))
    if len(pts) * len(combos) > max_points:
        raise ValueError(f"{len(pts) * len(combos):,} points, more than the {max_points:,} a sweep runs")
    names: dict[str, tuple[str, dict[str, Any]]] = {}
    out = []
    for p in pts:
        if p["cluster"] not in names:
            head, plus, suffix = str(p["cluster"]).partition("+")
            names[p["cluster"]] = (head, parse_variant(suffix, f"cluster {head!r}") if plus else {})
        head, own = names[p["cluster"]]
        out += [{**p, "cluster": variant_name(head, {**own, **dict(zip(keys, c))})} for c in combos]
    return out
