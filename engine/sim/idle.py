"""When each GPU idles in a simulated iteration: gaps between its compute tasks, read in one
pass over the simulation's dispatch order.

A compute task holds its GPU alone and the event loop dispatches a GPU's tasks first come,
first served (:mod:`engine.sim.full`), so a GPU's tasks in dispatch order start in time order:
one pass needs no sort (a sort by device, then start, over GPT-3's ~1 M compute tasks took
~0.18 s of the timeline's ~0.4 s). A timeline whose order does not have that property (one
not made by the event loop) is read in order of start instead, with the same result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from .full import Timeline
from ..taskgraph import BWD, FWD

__all__ = ["DeviceGaps", "device_gaps"]


@dataclass(frozen=True)
class DeviceGaps:
    """The forward/backward work of each simulated GPU (arrays over the GPUs that have any,
    ascending) and its idle gaps.

    Attributes
    ----------
    devices : int64 [gpu]
    idle_s : float64 [gpu]
        Seconds idle between 0 and ``span_s`` (before the first task, between tasks, after
        the last one).
    busy_s : float64 [gpu]
        Seconds of forward and backward tasks (overlapping ones counted each).
    last_end_s : float64 [gpu]
        When the GPU's last forward/backward task ends.
    span_s : float
        When the iteration's last forward/backward task ends (any GPU).
    gap_device, gap_from_s, gap_to_s : [gap]
        The gaps longer than ``min_gap_share`` x ``span_s`` (those after a GPU's last task not
        included: see ``last_end_s``), by GPU, then time.
    """

    devices: np.ndarray
    idle_s: np.ndarray
    busy_s: np.ndarray
    last_end_s: np.ndarray
    span_s: float
    gap_device: np.ndarray
    gap_from_s: np.ndarray
    gap_to_s: np.ndarray


@nb.njit(cache=True)
def _gaps(order, kind, device, start, end, n_devices, min_gap, room):  # pragma: no cover
    """One pass over ``order``: per device (covered until, idle, busy, has work), the gaps
    longer than ``min_gap`` (device, from, to; ``room`` of them at most) and whether every
    device's starts came in order (else the results are void and the caller passes tasks
    sorted by start)."""
    covered = np.zeros(n_devices)
    idle = np.zeros(n_devices)
    busy = np.zeros(n_devices)
    has = np.zeros(n_devices, np.bool_)
    last_start = np.full(n_devices, -np.inf)
    gd = np.empty(room, np.int64)  # (allocated once: growing them in the loop made it 2x slower)
    gf = np.empty(room)
    gt = np.empty(room)
    ng = 0
    ok = True
    for i in range(order.shape[0]):
        t = order[i]
        k = kind[t]
        if k != FWD and k != BWD:
            continue
        d = device[t]
        s = start[t]
        e = end[t]
        ok &= s >= last_start[d]
        last_start[d] = s
        c = covered[d]
        if s > c:
            idle[d] += s - c
            if s - c > min_gap and ng < room:
                gd[ng] = d
                gf[ng] = c
                gt[ng] = s
                ng += 1
        if e > c:
            covered[d] = e
        busy[d] += e - s
        has[d] = True
    return covered, idle, busy, has, gd[:ng], gf[:ng], gt[:ng], ok


def device_gaps(timeline: Timeline, min_gap_share: float = 0.005) -> DeviceGaps:
    """Idle time of every simulated GPU up to the end of the iteration's last forward/backward
    task, and its gaps longer than ``min_gap_share`` of that span (tests/sim/test_idle.py pins a
    hand-computed case and checks random graphs against a sort by device and start).
    """
    tg = timeline.tasks
    kind, device = np.ascontiguousarray(tg.kind), np.ascontiguousarray(tg.device)
    comp = (kind == FWD) | (kind == BWD)
    span = float(timeline.end_s[comp].max()) if comp.any() else 0.0
    min_gap = min_gap_share * span
    # a GPU's long gaps are disjoint spans within the span: fewer than span / min_gap each
    room = tg.num_tasks if min_gap <= 0 else min(tg.num_tasks, tg.n_devices * (int(1 / min_gap_share) + 1))
    args = (kind, device, timeline.start_s, timeline.end_s, tg.n_devices, min_gap, room)
    ok = timeline.order.size == tg.num_tasks
    if ok:
        covered, idle, busy, has, gd, gf, gt, ok = _gaps(np.ascontiguousarray(timeline.order, np.int64), *args)
    if not ok:  # (not the event loop's order: read by start; ties by task id)
        covered, idle, busy, has, gd, gf, gt, ok = _gaps(np.argsort(timeline.start_s, kind="stable"), *args)
    devs = np.flatnonzero(has)
    by = np.argsort(gd, kind="stable")  # by device; each device's gaps are in time order already
    return DeviceGaps(devices=devs, idle_s=idle[devs] + np.maximum(span - covered[devs], 0.0), busy_s=busy[devs],
                      last_end_s=covered[devs], span_s=span, gap_device=gd[by], gap_from_s=gf[by], gap_to_s=gt[by])
