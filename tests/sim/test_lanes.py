"""engine/sim/lanes.py: a timeline's tasks on lanes, read in one pass over the dispatch order,
pinned on a hand-computed case and checked on random timelines against a plain sort by lane,
then start (ties by id; a collective's pairs in collective order)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from engine.sim.full import Timeline
from engine.sim.lanes import LANE_KINDS, lanes
from engine.taskgraph import BWD, COLL, FWD, UPDATE, XFER, TaskGraph


def _timeline(kind, device, link, start, end, order, colls=(), n_devices=4, n_links=3) -> Timeline:
    """A timeline of the given tasks (no edges: the lanes read none); ``colls``: each
    collective's (task, its devices)."""
    n = len(kind)
    i32, z = np.full(n, -1, np.int32), np.zeros(n)
    start, end = np.array(start, float), np.array(end, float)
    tg = TaskGraph(kind=np.array(kind, np.int8), op=i32, part=i32, mb=i32, device=np.array(device, np.int32),
                   dur_s=end - start, size_bytes=z, flops=z, coll=np.full(n, -1, np.int8),
                   link=np.array(link, np.int32), res_ptr=np.zeros(n + 1, np.int64), res_idx=np.zeros(0, np.int64),
                   succ_ptr=np.zeros(n + 1, np.int64), succ_idx=np.zeros(0, np.int64), npred=np.zeros(n, np.int64),
                   chain_next=np.full(n, -1, np.int64), chain_lag_s=z, n_devices=n_devices, n_links=n_links)
    if colls:
        ptr = np.cumsum([0] + [len(d) for _, d in colls]).astype(np.int64)
        idx = np.array([x for _, d in colls for x in d], np.int64)
        tg.info["coll_devices"] = (ptr, idx, np.array([t for t, _ in colls], np.int64))
    return Timeline(tg, start, end, np.array(order, np.int64), np.full(n, -1, np.int64))


def _reference(tl: Timeline, dev_row, link_row, t0, t1):
    """The lanes by a plain sort, walked in Python."""
    tg = tl.tasks
    s, e = tl.start_s, tl.end_s
    n = tg.num_tasks

    def lane(t):
        k = tg.kind[t]
        if k in (FWD, BWD) or (k == UPDATE and tg.dur_s[t] > 0):
            return int(dev_row[tg.device[t]])
        return int(link_row[tg.link[t]]) if k == XFER else -1

    def seen(t):
        return e[t] >= t0 and s[t] <= t1 and e[t] > s[t]

    row = [lane(t) for t in range(n)]
    by_kind = {}
    for k in LANE_KINDS:
        ts = sorted((t for t in range(n) if tg.kind[t] == k and row[t] >= 0 and seen(t)),
                    key=lambda t: (row[t], s[t], t))
        if ts:
            gaps = [np.inf if i == 0 or row[ts[i]] != row[ts[i - 1]] else s[ts[i]] - e[ts[i - 1]]
                    for i in range(len(ts))]
            by_kind[k] = (ts, [row[t] for t in ts], gaps)
    pairs, first = [], []
    got = tg.info.get("coll_devices")
    if got is not None:
        ptr, idx, tasks = got
        for i, t in enumerate(tasks.tolist()):
            lanes_i = [int(dev_row[d]) + 1 for d in idx[ptr[i]:ptr[i + 1]] if dev_row[d] >= 0] if seen(t) else []
            first.append(lanes_i[0] if lanes_i else -1)
            pairs += [(r, s[t], i, t) for r in lanes_i]
    pairs.sort(key=lambda x: x[:3])
    in_view = sum(len(v[0]) for v in by_kind.values()) + len(pairs)
    return row, in_view, by_kind, ([p[3] for p in pairs], [p[0] for p in pairs]), first


def _same(tl, dev_row, link_row, t0, t1):
    got = lanes(tl, np.array(dev_row, np.int64), np.array(link_row, np.int64), t0, t1)
    row, in_view, by_kind, coll, first = _reference(tl, dev_row, link_row, t0, t1)
    assert got.row.tolist() == row
    assert got.in_view == in_view
    assert sorted(got.by_kind) == sorted(by_kind)
    for k, (t, r, g) in by_kind.items():
        assert got.by_kind[k][0].tolist() == t and got.by_kind[k][1].tolist() == r
        assert got.by_kind[k][2].tolist() == g
    assert (got.coll[0].tolist(), got.coll[1].tolist()) == coll
    assert got.coll_first.tolist() == first
    return got


def test_hand_computed():
    """GPU 0 (lane 0) runs a forward 0-1 s and a backward 2-3 s; GPU 1 (lane 2) a forward 1-2 s;
    a transfer on link 1 (lane 4) 1-1.5 s; an optimizer step of no time; a collective on GPUs 0
    and 1 at 3-4 s (lanes 1 and 3); GPU 2 is not shown. Window 0.5-3.5 s."""
    kind = [FWD, FWD, XFER, BWD, UPDATE, COLL, FWD]
    device = [0, 1, -1, 0, 0, -1, 2]
    link = [-1, -1, 1, -1, -1, -1, -1]
    start = [0.0, 1.0, 1.0, 2.0, 3.0, 3.0, 0.0]
    end = [1.0, 2.0, 1.5, 3.0, 3.0, 4.0, 5.0]
    tl = _timeline(kind, device, link, start, end, [0, 6, 1, 2, 3, 4, 5], colls=[(5, (1, 2, 0))])
    got = _same(tl, [0, 2, -1, -1], [-1, 4, -1], 0.5, 3.5)
    assert got.row.tolist() == [0, 2, 4, 0, -1, -1, -1]
    assert got.by_kind[FWD][0].tolist() == [0, 1] and got.by_kind[FWD][2].tolist() == [np.inf, np.inf]
    assert (got.coll[0].tolist(), got.coll[1].tolist()) == ([5, 5], [1, 3])  # (by lane)
    assert got.coll_first.tolist() == [3]  # (GPU 1 comes first among its devices)
    assert got.in_view == 2 + 1 + 1 + 2


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 50), st.booleans(), st.sampled_from(["all", "part", "none"]))
def test_matches_a_plain_sort(seed, n, exclusive, window):
    """Random timelines: forward, backward, optimizer, transfer and collective tasks on 4 GPUs and
    3 links, some lanes hidden. ``exclusive``: each lane's tasks one after another, dispatched in
    time order (the event loop's case); else starts with ties, in any order, and collectives
    that start together on a GPU."""
    rng = np.random.default_rng(seed)
    kind = rng.choice([FWD, BWD, UPDATE, XFER, COLL], n)
    device = np.where(np.isin(kind, (XFER, COLL)), -1, rng.integers(0, 4, n))
    link = np.where(kind == XFER, rng.integers(0, 3, n), -1)
    colls = [(int(t), tuple(rng.choice(4, rng.integers(1, 5), replace=False).tolist()))
             for t in rng.permutation(np.flatnonzero(kind == COLL))]
    if exclusive:  # per GPU (compute), per link and per collective GPU: back to back
        start = np.zeros(n)
        busy: dict = {}
        for t in range(n):
            keys = [("d", int(device[t]))] if device[t] >= 0 else [("l", int(link[t]))] if kind[t] == XFER else \
                [("c", d) for c, ds in colls if c == t for d in ds]
            start[t] = max((busy.get(k, 0.0) for k in keys), default=0.0) + float(rng.integers(0, 2))
            for k in keys:
                busy[k] = start[t] + 1.0
        end = start + rng.integers(0, 2, n)  # (some empty)
        order = np.lexsort((rng.random(n), start))
    else:
        start = rng.integers(0, 4, n).astype(float)
        end = start + rng.integers(0, 3, n)
        order = rng.permutation(n)
    span = float(end.max()) if n else 1.0
    t0, t1 = {"all": (0.0, span), "part": (0.3 * span, 0.7 * span), "none": (span + 1, span + 2)}[window]
    tl = _timeline(kind.tolist(), device.tolist(), link.tolist(), start, end, order, colls)
    dev_row = rng.permutation([0, 2, 4, -1]) if rng.random() < 0.5 else np.array([0, 2, 4, 6])
    link_row = np.array([8, -1, 9]) if rng.random() < 0.5 else np.array([-1, -1, -1])
    _same(tl, dev_row.tolist(), link_row.tolist(), t0, t1)


def test_a_lane_far_out_of_order_is_sorted():
    """A lane given in reverse start order (more moves than the insertion sort's budget: the
    merge sort) comes out by start, ties by id."""
    n = 200
    start = np.repeat(np.arange(n // 2, dtype=float)[::-1], 2)
    tl = _timeline([FWD] * n, [0] * n, [-1] * n, start, start + 0.5, np.arange(n))
    got = _same(tl, [0, -1, -1, -1], [-1, -1, -1], 0.0, 1e9)
    assert got.by_kind[FWD][0][:4].tolist() == [n - 2, n - 1, n - 4, n - 3]
