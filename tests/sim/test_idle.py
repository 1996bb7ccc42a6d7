"""engine/sim/idle.py: each GPU's idle gaps read in one pass over the dispatch order, pinned on a
hand-computed case and checked on random graphs against a sort by device, then start."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from engine.sim.idle import device_gaps
from engine.sim.full import Timeline, simulate
from engine.taskgraph import BWD, FWD, TaskGraph, XFER


def _graph(kind, device, dur, edges, n_devices) -> TaskGraph:
    """Tasks holding their device (``device`` -1: a transfer on link 0), ``edges`` (u, v)."""
    n = len(kind)
    edges = sorted(edges)
    src = np.array([u for u, _ in edges], np.int64)
    dst = np.array([v for _, v in edges], np.int64)
    succ_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=succ_ptr[1:])
    dev = np.array(device, np.int64)
    res = np.where(dev >= 0, dev, n_devices)  # (link 0 is resource n_devices)
    i32, z = np.full(n, -1, np.int32), np.zeros(n)
    return TaskGraph(kind=np.array(kind, np.int8), op=i32, part=i32, mb=i32, device=dev.astype(np.int32),
                     dur_s=np.array(dur, float), size_bytes=z, flops=z, coll=np.full(n, -1, np.int8),
                     link=np.where(dev >= 0, -1, 0).astype(np.int32), res_ptr=np.arange(n + 1, dtype=np.int64),
                     res_idx=res, succ_ptr=succ_ptr, succ_idx=dst,
                     npred=np.bincount(dst, minlength=n).astype(np.int64), chain_next=np.full(n, -1, np.int64),
                     chain_lag_s=z, n_devices=n_devices, n_links=1)


def test_hand_computed():
    """GPU 0 runs a (0-1 s) then b (1-3 s); GPU 1 runs c (1-2 s) after a. The span is 3 s:
    GPU 1 idles 0-1 s and 2-3 s."""
    tl = simulate(_graph([FWD, BWD, FWD], [0, 0, 1], [1.0, 2.0, 1.0], [(0, 2)], 2))
    g = device_gaps(tl)
    assert g.span_s == 3.0
    assert g.devices.tolist() == [0, 1]
    assert g.idle_s.tolist() == [0.0, 2.0]
    assert g.busy_s.tolist() == [3.0, 1.0]
    assert g.last_end_s.tolist() == [3.0, 2.0]
    assert (g.gap_device.tolist(), g.gap_from_s.tolist(), g.gap_to_s.tolist()) == ([1], [0.0], [1.0])
    # a gap at most min_gap_share x span long is counted as idle, not listed
    assert device_gaps(tl, 1 / 3).gap_device.size == 0 and device_gaps(tl, 1 / 3).idle_s.tolist() == [0.0, 2.0]


def _reference(tl: Timeline, share: float):
    """Per device: its forward/backward tasks sorted by start (ties by id), walked in Python."""
    tg = tl.tasks
    comp = [t for t in range(tg.num_tasks) if tg.kind[t] in (FWD, BWD)]
    span = max((tl.end_s[t] for t in comp), default=0.0)
    out = {}
    gaps = []
    for d in sorted({int(tg.device[t]) for t in comp}):
        covered, idle, busy = 0.0, 0.0, 0.0
        for t in sorted((t for t in comp if tg.device[t] == d), key=lambda t: (tl.start_s[t], t)):
            s, e = tl.start_s[t], tl.end_s[t]
            if s > covered:
                idle += s - covered
                if s - covered > share * span:
                    gaps.append((d, covered, s))
            covered = max(covered, e)
            busy += e - s
        out[d] = (idle + max(span - covered, 0.0), busy, covered)
    return span, out, gaps


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 60), st.integers(1, 4), st.sampled_from([0.0, 0.005, 0.2]))
def test_matches_a_sort_by_device_and_start(seed, n, devices, share):
    """Random graphs (forward, backward and transfer tasks, durations 0-2 s with many ties):
    the pass over the dispatch order gives what sorting each GPU's tasks by start gives, and a
    timeline whose order is not the event loop's (shuffled, or missing tasks) gives it too."""
    rng = random.Random(seed)
    kind = [rng.choice((FWD, BWD, XFER)) for _ in range(n)]
    device = [rng.randrange(devices) if k != XFER else -1 for k in kind]
    dur = [float(rng.choice((0, 1, 2))) for _ in range(n)]
    edges = {(u, v) for v in range(1, n) for u in rng.sample(range(v), min(v, rng.randint(0, 2)))}
    tl = simulate(_graph(kind, device, dur, edges, devices))
    span, ref, gaps = _reference(tl, share)
    shuffled = Timeline(tl.tasks, tl.start_s, tl.end_s, np.array(rng.sample(range(n), n), np.int64), tl.resource_pred)
    partial = Timeline(tl.tasks, tl.start_s, tl.end_s, tl.order[:n // 2], tl.resource_pred)  # (not every task)
    for t in (tl, shuffled, partial):
        g = device_gaps(t, share)
        assert g.span_s == span
        assert g.devices.tolist() == sorted(ref)
        assert g.idle_s.tolist() == pytest.approx([ref[d][0] for d in sorted(ref)], abs=1e-12)
        assert g.busy_s.tolist() == [ref[d][1] for d in sorted(ref)]
        assert g.last_end_s.tolist() == [ref[d][2] for d in sorted(ref)]
        assert list(zip(g.gap_device.tolist(), g.gap_from_s.tolist(), g.gap_to_s.tolist())) == gaps


def test_no_compute():
    g = device_gaps(simulate(_graph([XFER], [-1], [1.0], [], 1)))
    assert g.span_s == 0.0 and g.devices.size == 0 and g.gap_device.size == 0
