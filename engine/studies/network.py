"""The network axis of a co-design sweep (``soapbox sweep --network``, issue 43): every point
of the sweep on each network asked (NICs a node, their rate, a fabric of oversubscribed pods),
the clusters made by :func:`engine.cluster.network.with_network`.

>>> net = parse_network(["nics=4,8", "oversub=1,2", "pod=256"])
>>> [p for p in network_points([{"cluster": "dgx-h100:64", "tp": 8}], net)][:2]
[{'cluster': 'dgx-h100:64', 'tp': 8, 'nics': 4, 'oversub': 1.0, 'pod': 256}, \
{'cluster': 'dgx-h100:64', 'tp': 8, 'nics': 4, 'oversub': 2.0, 'pod': 256}]
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

__all__ = ["NETWORK_KEYS", "parse_network", "network_points", "point_network"]

#: ``--network`` keys: what each sets (a keyword of :func:`engine.cluster.network.with_network`),
#: the type of its values and their range
NETWORK_KEYS = {
    "nics": ("nics", int, 1, 1024, "NICs a node"),
    "nic_gbps": ("nic_gbps", float, 1e-3, 1e7, "each NIC's rate, Gb/s per direction"),
    "pod": ("pod_gpus", int, 0, 10**6, "GPUs a full-bisection pod (0: the whole fabric is one pod)"),
    "oversub": ("oversubscription", float, 1.0, 1000.0, "oversubscription between pods (2: 1:2)"),
}
#: most network variants one sweep takes
MAX_VARIANTS = 256


def parse_network(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["nics=4,8", "oversub=1,2", "pod=256"]`` -> {key: values} (each value checked against
    its range; a ``ValueError`` names the key and the value). ``oversub`` above 1 needs
    ``pod``: without pods nothing is between them."""
    out: dict[str, list[Any]] = {}
    for item in items:
        key, sep, vals = str(item).partition("=")
        key = key.strip()
        if not sep or key not in NETWORK_KEYS:
            raise ValueError(f"--network {str(item)[:60]!r}: write KEY=V1,V2 with KEY one of {', '.join(NETWORK_KEYS)}")
        if key in out:
            raise ValueError(f"--network {key}: given twice")
        _, kind, lo, hi, what = NETWORK_KEYS[key]
        values = []
        for v in vals.split(","):
            v = v.strip()
            try:
                x = kind(v) if len(v) <= 30 else None
            except ValueError:
                x = None
            if x is None or not math.isfinite(x) or not lo <= x <= hi:
                kind_text = "a whole number" if kind is int else "a number"
                raise ValueError(f"--network {key}={v[:30]!r}: {what} must be {kind_text} from {lo:g} to {hi:g}")
            values.append(x)
        out[key] = list(dict.fromkeys(values))
    if any(o != 1 for o in out.get("oversub", ())) and not any(out.get("pod", ())):
        raise ValueError("--network oversub: give pod=GPUS too (the size of a full-bisection pod); without pods "
                         "nothing is between them")
    n = math.prod(len(v) for v in out.values())
    if n > MAX_VARIANTS:
        raise ValueError(f"--network: {n:,} networks, more than the {MAX_VARIANTS} a sweep takes")
    return out


def network_points(pts: list[dict[str, Any]], network: dict[str, list[Any]],
                   max_points: int = 100_000) -> list[dict[str, Any]]:
    """Every point on every network of ``network`` (:func:`parse_network`), points outermost,
    then the networks' keys in their order; the points themselves when it is empty."""
    if not network:
        return pts
    keys = list(network)
    combos = list(itertools.product(*(network[k] for k in keys)))
    if len(pts) * len(combos) > max_points:
        raise ValueError(f"{len(pts) * len(combos):,} points, more than the {max_points:,} a sweep runs")
    return [{**p, **dict(zip(keys, c))} for p in pts for c in combos]


def point_network(point: dict[str, Any]) -> dict[str, Any]:
    """The keywords of :func:`engine.cluster.network.with_network` a point sets (empty: the
    cluster's own network)."""
    return {NETWORK_KEYS[k][0]: point[k] for k in NETWORK_KEYS if point.get(k) is not None}
