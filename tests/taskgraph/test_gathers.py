"""``split_gathers``: which transfer patterns become one all-gather collective (sequence and context
parallelism's gathers), on hand-made plans with exact answers."""

from __future__ import annotations

import numpy as np

from engine.taskgraph.dataflow import split_gathers
from engine.taskgraph.regions import transfer_plan


def _split(h_bounds, h_dev, r_bounds, r_dev):
    """Plan and split for one axis: holders [lo, hi) on ``h_dev``, receivers likewise."""
    h_lo = np.array([[a] for a, _ in h_bounds])
    h_hi = np.array([[b] for _, b in h_bounds])
    r_lo = np.array([[a] for a, _ in r_bounds])
    r_hi = np.array([[b] for _, b in r_bounds])
    h_dev, r_dev = np.asarray(h_dev), np.asarray(r_dev)
    h_cls = np.arange(len(h_bounds))
    plan = transfer_plan(h_lo, h_hi, h_dev, h_cls, r_lo, r_hi, r_dev)
    return plan, split_gathers(plan, h_lo, h_hi, h_dev, h_cls, r_lo, r_hi, r_dev)


QUARTERS = [(0, 2), (2, 4), (4, 6), (6, 8)]


def test_every_rank_needing_every_quarter_is_one_gather():
    plan, (rest, gathers) = _split(QUARTERS, [0, 1, 2, 3], [(0, 8)] * 4, [0, 1, 2, 3])
    assert plan[0].size == 16  # 12 transfers of 2 elements and 4 local reads
    assert rest[0].size == 0
    assert len(gathers) == 1
    holders, receivers, part = gathers[0]
    assert holders.tolist() == [0, 1, 2, 3] and receivers.tolist() == [0, 1, 2, 3] and part == 2


def test_a_group_without_a_receiver_on_every_holder_stays_transfers():
    """Device 3 holds a quarter but reads nothing: no collective over the four, the twelve
    elements each receiver lacks move point to point."""
    plan, (rest, gathers) = _split(QUARTERS, [0, 1, 2, 3], [(0, 8)] * 3, [0, 1, 2])
    assert gathers == ()
    assert rest[0].size == plan[0].size and int(rest[2].sum()) == 3 * 6


def test_unequal_parts_stay_transfers():
    _, (rest, gathers) = _split([(0, 1), (1, 4), (4, 6), (6, 8)], [0, 1, 2, 3], [(0, 8)] * 4, [0, 1, 2, 3])
    assert gathers == () and rest[0].size == 16


def test_a_receiver_without_its_own_part_stays_transfers():
    """The receivers are on other devices than the holders: nothing to gather among them."""
    _, (rest, gathers) = _split(QUARTERS, [0, 1, 2, 3], [(0, 8)] * 4, [4, 5, 6, 7])
    assert gathers == () and rest[0].size == 16


def test_two_groups_split_by_sample_are_two_gathers():
    """Two data-parallel groups (devices 0-1 and 2-3), each gathering its own halves."""
    h = [(0, 2), (2, 4), (4, 6), (6, 8)]  # (sample, length) flattened: group 0 is [0, 4), group 1 [4, 8)
    _, (rest, gathers) = _split(h, [0, 1, 2, 3], [(0, 4), (0, 4), (4, 8), (4, 8)], [0, 1, 2, 3])
    assert rest[0].size == 0
    assert sorted((g[0].tolist(), g[1].tolist(), g[2]) for g in gathers) == [([0, 1], [0, 1], 2), ([2, 3], [2, 3], 2)]
