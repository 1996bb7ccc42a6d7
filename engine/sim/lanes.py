"""A timeline's tasks laid out on lanes (a row per GPU, per link: what a Gantt chart draws), read
in one pass over the simulation's dispatch order.

Each task that takes a lane gets one: a compute task (forward, backward, an optimizer step that
takes time) its GPU's, a transfer its link's (the caller numbers the lanes it shows; -1: not
shown); a collective takes the lane after its GPU's on each GPU it runs on. The tasks of each
kind in a time window are grouped by lane (a counting sort over the dispatch order), each
lane's by start. A GPU or a link is held by one task at a time and the event loop serves it
first come, first served (:mod:`engine.sim.full`), so on such a lane dispatch order is start
order already, and only a lane whose starts do not rise strictly is sorted: by start, ties by
task id (a collective's: in collective order), as a stable sort of all of them by (lane, start)
would order them. The collectives' lanes are such lanes at times: on GPT-3 175B with sequence
parallelism, 288 of 223,492 pairs come out of order, the iteration's gradient all-reduces
dispatched before a last microbatch's collective that starts earlier on another link.
``tests/sim/test_lanes.py`` checks the result against the stable sort on random timelines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from .full import Timeline
from ..taskgraph import BWD, FWD, UPDATE, XFER

__all__ = ["Lanes", "LANE_KINDS", "lanes"]

#: the kinds laid out on lanes, in the order :attr:`Lanes.by_kind` holds them
LANE_KINDS = (FWD, BWD, UPDATE, XFER)


@dataclass(frozen=True)
class Lanes:
    """``row`` [task]: the lane of each task but the collectives (-1: none); ``in_view``: tasks
    on a lane in the window (not empty) and collectives' (task, lane) pairs there; ``by_kind``:
    per kind of :data:`LANE_KINDS` with any in view, its tasks ordered by lane, then start (ties
    by task id), their lanes and the gap before each; ``coll``: the collectives' pairs in the
    window, (tasks, lanes) ordered by lane, then start; ``coll_first`` [collective of
    ``tasks.info["coll_devices"]``]: the lane of its first GPU that has one (-1: none, or out of
    the window)."""

    row: np.ndarray
    in_view: int
    by_kind: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]
    coll: tuple[np.ndarray, np.ndarray]
    coll_first: np.ndarray


@nb.njit(cache=True, nogil=True)
def _lay_out(order, kind, device, link, dur, start, end, dev_row, link_row, t0, t1, n_rows):  # pragma: no cover
    """(row [task], tasks grouped by (kind, lane), each group by start (dispatch order where
    that is it; ties by task id), each group's bounds, the gap before each)."""
    n = kind.shape[0]
    nk = 4
    row = np.full(n, -1, np.int64)
    code = np.full(n, -1, np.int64)
    count = np.zeros(nk * n_rows + 1, np.int64)
    for t in range(n):
        k = kind[t]
        if k == FWD or k == BWD or (k == UPDATE and dur[t] > 0):
            r = dev_row[device[t]]
        elif k == XFER:
            r = link_row[link[t]]
        else:
            continue
        row[t] = r
        if r < 0 or end[t] < t0 or start[t] > t1 or not end[t] > start[t]:
            continue
        c = 0 if k == FWD else 1 if k == BWD else 2 if k == UPDATE else 3
        code[t] = c * n_rows + r
        count[code[t] + 1] += 1
    ptr = np.cumsum(count)
    at = ptr[:-1].copy()
    out = np.empty(ptr[-1], np.int64)
    for i in range(order.shape[0]):
        t = order[i]
        g = code[t]
        if g >= 0:
            out[at[g]] = t
            at[g] += 1
    gap = np.empty(out.shape[0])
    for g in range(nk * n_rows):
        lo, hi = ptr[g], ptr[g + 1]
        if not _rising(out, lo, hi, start):
            _sort_span(out, lo, hi, start, np.zeros(0, np.int64))
        for j in range(lo, hi):
            gap[j] = np.inf if j == lo else start[out[j]] - end[out[j - 1]]
    return row, out, ptr, gap


@nb.njit(cache=True, nogil=True)
def _rising(out, lo, hi, start):  # pragma: no cover
    """Whether the starts of tasks ``out[lo:hi]`` rise strictly."""
    for j in range(lo + 1, hi):
        if not start[out[j]] > start[out[j - 1]]:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def _sort_span(out, lo, hi, start, tie_of):  # pragma: no cover
    """``out[lo:hi]`` sorted by start, ties by ``tie_of[task]`` (by the task id where
    ``tie_of`` is empty). An insertion sort: a lane out of start order has a few tasks out of
    place (GPT-3 175B: 288 of 223,492 collective pairs); past 8 moves a task on average, a
    merge sort instead."""
    budget = 8 * (hi - lo)
    moves = 0
    for j in range(lo + 1, hi):
        x = out[j]
        sx = start[x]
        tx = x if tie_of.shape[0] == 0 else tie_of[x]
        k = j - 1
        while k >= lo:
            y = out[k]
            sy = start[y]
            if sy < sx or (sy == sx and (y if tie_of.shape[0] == 0 else tie_of[y]) <= tx):
                break
            out[k + 1] = y
            k -= 1
            moves += 1
        out[k + 1] = x
        if moves > budget:
            span = out[lo:hi].copy()
            tie = span.copy() if tie_of.shape[0] == 0 else tie_of[span]
            span = span[np.argsort(tie, kind="mergesort")]
            out[lo:hi] = span[np.argsort(start[span], kind="mergesort")]
            return


@nb.njit(cache=True, nogil=True)
def _lay_out_collectives(order, tasks, ptr, idx, start, end, dev_row, t0, t1, n_rows):  # pragma: no cover
    """The collectives' (task, lane) pairs in the window grouped by lane, each lane's by start
    (dispatch order where that is it; ties in collective order), and each collective's first
    lane (-1: none)."""
    n = start.shape[0]
    which = np.full(n, -1, np.int64)  # [task] its collective (-1: none)
    # [task] its one lane in the window; -1: none; -2 - i: collective i's several, ``lane[own[i]:own[i + 1]]``
    # (the pass over the dispatch order then reads one value where a collective has one lane, as
    # a GPU row of a tp group's collectives does: reading the lanes by collective was 2x slower)
    code = np.full(n, -1, np.int64)
    first = np.full(tasks.shape[0], -1, np.int64)
    own = np.zeros(tasks.shape[0] + 1, np.int64)
    lane = np.empty(idx.shape[0], np.int64)
    count = np.zeros(n_rows + 1, np.int64)
    m = 0
    for i in range(tasks.shape[0]):
        t = tasks[i]
        which[t] = i
        if not (end[t] < t0 or start[t] > t1 or not end[t] > start[t]):
            for j in range(ptr[i], ptr[i + 1]):
                r = dev_row[idx[j]]
                if r >= 0:
                    if first[i] < 0:
                        first[i] = r + 1
                    lane[m] = r + 1
                    m += 1
                    count[r + 2] += 1
        own[i + 1] = m
        k = m - own[i]
        if k == 1:
            code[t] = lane[own[i]]
        elif k > 1:
            code[t] = -2 - i
    at = np.cumsum(count)
    bounds = at.copy()
    out_t = np.empty(m, np.int64)
    out_r = np.empty(m, np.int64)
    for k in range(order.shape[0]):
        t = order[k]
        c = code[t]
        if c >= 0:
            out_t[at[c]] = t
            out_r[at[c]] = c
            at[c] += 1
        elif c < -1:
            i = -2 - c
            for j in range(own[i], own[i + 1]):
                r = lane[j]
                out_t[at[r]] = t
                out_r[at[r]] = r
                at[r] += 1
    for g in range(n_rows):
        lo, hi = bounds[g], bounds[g + 1]
        if not _rising(out_t, lo, hi, start):
            _sort_span(out_t, lo, hi, start, which)
    return out_t, out_r, first


def lanes(timeline: Timeline, dev_row: np.ndarray, link_row: np.ndarray, t0: float, t1: float) -> Lanes:
    """The tasks of ``timeline`` on lanes (see the module): ``dev_row`` [device] and
    ``link_row`` [link] the lane of each GPU's compute tasks and each link's transfers (-1: not
    shown); the window ``t0``..``t1`` (seconds) keeps the tasks that end at or after ``t0`` and
    start at or before ``t1`` and take time."""
    tg = timeline.tasks
    start, end = timeline.start_s, timeline.end_s
    order = timeline.order if timeline.order.size == tg.num_tasks else np.arange(tg.num_tasks)
    n_rows = int(max(dev_row.max(initial=-1), link_row.max(initial=-1))) + 1
    link_row = link_row if link_row.size else np.full(1, -1, np.int64)
    row, out, ptr, gap = _lay_out(
        np.ascontiguousarray(order, np.int64), np.ascontiguousarray(tg.kind), np.ascontiguousarray(tg.device),
        np.ascontiguousarray(tg.link), np.ascontiguousarray(tg.dur_s), np.ascontiguousarray(start),
        np.ascontiguousarray(end), np.ascontiguousarray(dev_row, np.int64), np.ascontiguousarray(link_row, np.int64),
        float(t0), float(t1), max(n_rows, 1))
    by_kind: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for c, k in enumerate(LANE_KINDS):
        lo, hi = ptr[c * max(n_rows, 1)], ptr[(c + 1) * max(n_rows, 1)]
        if hi == lo:
            continue
        t = out[lo:hi]
        by_kind[k] = (t, row[t], gap[lo:hi])
    coll, first = _collectives(timeline, order, dev_row, t0, t1)
    return Lanes(row, int(ptr[-1]) + coll[0].size, by_kind, coll, first)


def _collectives(timeline: Timeline, order: np.ndarray, dev_row: np.ndarray, t0: float,
                 t1: float) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """(:attr:`Lanes.coll`, :attr:`Lanes.coll_first`)."""
    tg = timeline.tasks
    got = tg.info.get("coll_devices")
    none = np.zeros(0, np.int64)
    if got is None or not got[2].size:
        return (none, none), none
    ptr, idx, tasks = (np.ascontiguousarray(a, np.int64) for a in got)
    start, end = timeline.start_s, timeline.end_s
    t, r, first = _lay_out_collectives(
        np.ascontiguousarray(order, np.int64), tasks, ptr, idx, np.ascontiguousarray(start), np.ascontiguousarray(end),
        np.ascontiguousarray(dev_row, np.int64), float(t0), float(t1), int(dev_row.max(initial=-1)) + 2)
    return (t, r), first
