"""Checks of node specs before a cluster is built: counts, ranges and names, every problem
listed with where it is. See :mod:`engine.cluster`."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from ..errors import Problem
from .devices import (ARCHS, BW_RANGE_BYTES_PER_S, DEVICE_TYPES, FLOPS_RANGE_PER_S, MAX_DEVICES, MAX_LATENCY_S,
    MAX_LINKS, MEMORY_RANGE_BYTES, DeviceType, NodeSpec)


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


def check_nodes(nodes: Sequence[NodeSpec], types: Mapping[str, DeviceType]) -> list[Problem]:
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
        problems += _spec_problems(at, t)
    for i, s in enumerate(nodes):
        if not _in_range(s.host_memory_bytes, 0, MEMORY_RANGE_BYTES[1]):
            problems.append(Problem(f"nodes[{i}] ({s.name}).host_memory_bytes",
                                    f"must be from 0 (unknown) to {MEMORY_RANGE_BYTES[1]:,} bytes, "
                                    f"got {s.host_memory_bytes!r}"))
    return problems


#: Largest accepted value of each descriptive device-type field (0 means unknown).
_SPEC_MAX = {"sms": 100_000, "clock_hz": 1e11, "l2_bytes": MEMORY_RANGE_BYTES[1], "tdp_w": 1e5,
             "host_bw_bytes_per_s": BW_RANGE_BYTES_PER_S[1]}


def _spec_problems(at: str, t: DeviceType) -> list[Problem]:
    """The descriptive fields of a device type (architecture, SMs, clock, L2, power, host link):
    each 0 (unknown) or a finite number in its range; ``arch`` one of :data:`ARCHS` or empty."""
    problems = []
    if t.arch not in ("", *ARCHS):
        problems.append(Problem(f"{at}.arch", f"must be one of {', '.join(ARCHS)} (or empty), got {t.arch!r}"))
    for fld, hi in _SPEC_MAX.items():
        v = getattr(t, fld)
        if not _in_range(v, 0, hi) or (fld in ("sms", "l2_bytes") and not isinstance(v, int)):
            kind = "an integer" if fld in ("sms", "l2_bytes") else "a number"
            problems.append(Problem(f"{at}.{fld}", f"must be {kind} from 0 (unknown) to {_e(hi)}, got {v!r}"))
    return problems


def check_fabric(nodes: Sequence[NodeSpec], pod_gpus: Any, oversubscription: Any) -> list[Problem]:
    """A fabric of pods: ``pod_gpus`` 0 (one pod) or a GPU count at which every pod boundary
    falls between nodes; ``oversubscription`` from 1 (none) to 1,000."""
    if not (isinstance(pod_gpus, int) and not isinstance(pod_gpus, bool) and 0 <= pod_gpus <= MAX_DEVICES):
        return [Problem("fabric.pod_gpus", f"must be an integer from 0 (one pod) to {MAX_DEVICES:,}, got {pod_gpus!r}")]
    problems = []
    if not _in_range(oversubscription, 1.0, 1000.0):
        problems.append(Problem("fabric.oversubscription",
                                f"must be a number from 1 (none) to 1000, got {oversubscription!r}"))
    sized = all(_is_count(s.gpus) and _is_count(s.repeat) for s in nodes)
    # (an oversized cluster is reported by check_nodes; within the limit there are at most
    # MAX_DEVICES nodes to walk)
    if pod_gpus and sized and sum(s.gpus * s.repeat for s in nodes) <= MAX_DEVICES:
        first = 0
        for i, s in enumerate(nodes):
            for _ in range(s.repeat):
                if first // pod_gpus != (first + s.gpus - 1) // pod_gpus:
                    return problems + [Problem("fabric.pod_gpus",
                                               f"pods of {pod_gpus:,} GPUs split a node of nodes[{i}] ({s.name}, "
                                               f"{s.gpus} GPUs, devices {first}..{first + s.gpus - 1}); use a "
                                               f"multiple of the node size")]
                first += s.gpus
    return problems


