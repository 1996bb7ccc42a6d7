"""Which devices a PaSE config runs on, and the device groups its collectives run over.

PaSE (Elango, IPDPS'21, §III) places a k-way config on the first k devices, which is all a
cluster of one device type needs: any k devices of one node are alike. On a mixed cluster the
choice matters — the k fastest devices compute faster (the slowest device gates a synchronous
split: :func:`engine.search.pase.compute_time_s`), and a group inside one node or one device
type keeps its all-reduce off the slow links between nodes — so the device set becomes part of
the config space there (:func:`placements`):

* partition counts: those dividing the device count (PaSE's rule) and, on a mixed cluster,
  those dividing the size of each prefix of the device types ranked fastest first (4 H100 +
  4 A100 + 4 V100: 4, 8 and 12 devices, so an 8-way config on the H100s and A100s is a
  candidate on 12 GPUs);
* device sets of a k-way config (k < n), duplicates dropped, in this order: the first k devices
  (PaSE's own, so the old space is a subset of the new one), the k fastest, the first k of the
  fastest node that holds k, and the first k of the fastest device type that has k. At most
  :data:`MAX_SETS_PER_DEGREE` sets per partition count, so a mixed cluster multiplies an op's
  config count by at most 4 (and adds the degree vectors of at most one partition count per
  device type).

On one device type the space is exactly PaSE's (one set per count: the first k devices), and
:func:`sync_groups_time_s` prices a collective over the first ``group size`` devices as before,
so homogeneous clusters' tables are bit-for-bit unchanged. On a mixed cluster a collective is
priced over the real groups of the config's devices (the partitions that differ only in the
synchronised dims, :func:`engine.strategy.config.partition_grid`'s order), the slowest group gating.

Speed: a device type's dense peak FLOP/s at the graph's precision, then its memory bandwidth
(:class:`engine.cluster.DeviceType`); ties go to the lower device id.
"""

from __future__ import annotations

from typing import Iterable

from ..cluster import Cluster
from ..strategy.config import Config, divisors, partition_grid
from ..costs import group_collective_time_s
from ..graph import Op

__all__ = ["MAX_SETS_PER_DEGREE", "is_mixed", "device_ranking", "partition_totals", "placements", "sync_groups",
           "sync_groups_time_s"]

#: device sets a k-way config may take on a mixed cluster (first k, k fastest, fastest node, fastest type)
MAX_SETS_PER_DEGREE = 4


def is_mixed(cluster: Cluster) -> bool:
    """Whether ``cluster`` holds more than one device type."""
    return len({d.type for d in cluster.devices}) > 1


def _speed(cluster: Cluster, device: int, precision: str) -> tuple[float, float]:
    """(peak FLOP/s at ``precision``, memory bytes/s) of ``device``: larger is faster."""
    t = cluster.device_type(device)
    return t.peak_flops_per_s.get(precision, 0.0), t.mem_bw_bytes_per_s


def device_ranking(cluster: Cluster, precision: str) -> list[int]:
    """Device ids, fastest first (ties: lower id first)."""
    return sorted(range(cluster.num_devices), key=lambda d: (tuple(-x for x in _speed(cluster, d, precision)), d))


def partition_totals(cluster: Cluster, precision: str) -> list[int]:
    """The device counts a config's partition count must divide: ``[n]`` on one device type;
    on a mixed cluster also the size of each prefix of the device types ranked fastest first
    (ascending, ``n`` last)."""
    n = cluster.num_devices
    if not is_mixed(cluster):
        return [n]
    rank = device_ranking(cluster, precision)
    sizes = {n}
    for i in range(1, n):
        if _speed(cluster, rank[i], precision) != _speed(cluster, rank[i - 1], precision):
            sizes.add(i)
    return sorted(sizes)


def _first_k_of_fastest(cluster: Cluster, groups: Iterable[list[int]], k: int, precision: str) -> tuple[int, ...]:
    """The first ``k`` devices of the fastest group (of one device type) holding ``k``; () if none."""
    fits = [g for g in groups if len(g) >= k]
    if not fits:
        return ()
    best = min(fits, key=lambda g: (tuple(-x for x in _speed(cluster, g[0], precision)), g[0]))
    return tuple(best[:k])


def placements(cluster: Cluster, precision: str) -> dict[int, list[tuple[int, ...]]]:
    """Partition count k -> the device tuples (ascending ids; partition p on the p-th) a
    k-way config may run on, first k devices first (see the module docstring).

    >>> from engine.cluster import preset
    >>> placements(preset("p100-4x4"), "fp32")[4]
    [(0, 1, 2, 3)]
    """
    n = cluster.num_devices
    ks = sorted({k for total in partition_totals(cluster, precision) for k in divisors(total, total)})
    if not is_mixed(cluster):
        return {k: [tuple(range(k))] for k in ks}
    rank = device_ranking(cluster, precision)
    nodes: dict[int, list[int]] = {}
    types: dict[str, list[int]] = {}
    for d in cluster.devices:
        nodes.setdefault(d.node, []).append(d.id)
        types.setdefault(d.type, []).append(d.id)
    # a node of mixed types is ranked by its first device; PaSE's configs then see its slowest
    out = {}
    for k in ks:
        sets = [tuple(range(k))]
        if k < n:
            sets += [tuple(sorted(rank[:k])), _first_k_of_fastest(cluster, nodes.values(), k, precision),
                     _first_k_of_fastest(cluster, types.values(), k, precision)]
        out[k] = [s for s in dict.fromkeys(sets) if s]
    return out


def sync_groups(op: Op, cfg: Config, dims: Iterable[str]) -> list[tuple[int, ...]]:
    """The device groups of ``cfg``'s partitions that differ only in their coordinates along
    ``dims`` (those that hold copies of one parameter shard when ``dims`` are the dims that
    replicate it, or partial sums of one output block when they are reduction dims)."""
    names, grid = partition_grid(op, cfg)
    keep = [j for j, name in enumerate(names) if name not in set(dims)]
    groups: dict[tuple[int, ...], list[int]] = {}
    for p, row in enumerate(grid.tolist()):
        groups.setdefault(tuple(row[j] for j in keep), []).append(cfg.devices[p])
    return [tuple(g) for g in groups.values()]


def sync_groups_time_s(op: Op, cfg: Config, dims: Iterable[str], size_bytes: float, cluster: Cluster,
                       link_efficiency) -> float:
    """Seconds of an all-reduce of ``size_bytes`` per partition over the groups of
    :func:`sync_groups` (all run at once; the slowest gates), priced by
    :func:`engine.costs.group_collective_time_s`. On one device type: over the first
    ``group size`` devices (PaSE's approximation, kept so homogeneous tables do not change)."""
    dims = list(dims)
    if not is_mixed(cluster):
        size = 1
        for name in dims:
            size *= cfg.degree(name)
        return group_collective_time_s("all_reduce", size_bytes, cluster.collective_group(tuple(range(size))),
                                       link_efficiency)
    return max(group_collective_time_s("all_reduce", size_bytes, cluster.collective_group(g), link_efficiency)
               for g in sync_groups(op, cfg, dims))
