"""The whole iteration's timeline, task by task, unfolded from a steady short run.

:func:`engine.sim.steady.simulate_steady` simulates the first n of a pipeline's m microbatches
and checks that the schedule repeats: from microbatch ``first`` on, every task of microbatch
j + q starts and ends one period (``period_s``) after the same task of microbatch j. The
iteration's timeline is then the short run's with its steady part repeated: cut the short run
at a time T inside the part that repeats; the tasks that start in the period before T, W =
[T - period_s, T), are the pattern. The whole iteration is

* the short run's tasks that start before T, as they are;
* W's tasks ``(m - n) / q`` more times, the k-th copy ``k * period_s`` later and ``k * q``
  microbatches on;
* the short run's tasks that start at or after T (the rest of the steady part and the
  cool-down), ``(m - n) / q`` periods later and as many microbatches on.

The simulation is deterministic and what happens after T depends only on the work in flight
at T, which the copies leave as they found it (the argument of :mod:`engine.sim.steady`). That
the cut is inside the part that repeats is checked on the run, not assumed: the tasks of the
two periods after the one before W, [T - 2 period_s, T + period_s), must each be the task one
period before, q microbatches on, in op, kind, partition, device, link, collective and
duration, and start, end and dependency-only earliest start (``earliest_starts_s``) one
period later (to :data:`engine.sim.steady.TOLERANCE` of the iteration); the critical chain's
part in the period before W must be its part in W, a period earlier. Where no cut passes,
:func:`unfold` returns None and the caller simulates every microbatch.

The critical chain walked back from the iteration's end (:attr:`Timeline.critical_tasks`)
steps to the task whose end set each start: in the part that repeats, each step is the step a
period earlier, shifted, so the whole chain is the short run's with its part in W repeated.
The dependency-only earliest starts repeat with their own period (the critical path's, at most
``period_s``) and are unfolded the same way.

The unfolded :class:`~engine.taskgraph.TaskGraph` is a drawing, not a graph to simulate: it
holds every task's arrays (kind, op, partition, microbatch, device, duration, bytes, FLOPs,
collective, link, each collective's devices) but no dependency edges, cut-through chains nor
resource lists (empty), and its timeline no resource predecessors (-1) nor ready times; its
critical chain and earliest starts are set from the short run's (the simulator refuses it:
:func:`engine.sim.full.run_schedule`). ``tasks.info["unfolded"]`` holds the
:class:`~engine.sim.steady.SteadyState` it came from, ``tasks.info["unfolded_from"]`` (the short
run's timeline, each task's short-run task, the seconds it was moved by): what a reader of the
edges (a trace's flows: :mod:`engine.sim.trace`) reads instead. What it is for: the explorer's Gantt
chart, its op details and memory curves, and a trace, drawn at every microbatch without
building or simulating the whole iteration (GPT-3 175B on 1,024 GPUs: 51 of 192 microbatches
simulated).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property
from typing import Any

import numpy as np

from ..cluster import Cluster
from ..costs import CostModel
from ..graph import OpGraph
from ..strategy import Strategy
from ..taskgraph import TaskGraph
from .full import Timeline
from .report import SimulationResult, simulate_strategy
from .steady import TOLERANCE, SteadyState, SteadyTimeline, short_runs, why_not_extrapolated

__all__ = ["unfold", "simulate_drawn", "UnfoldedTimeline", "CUT_TRIES"]

#: cuts tried, from the middle of the microbatches found to repeat outwards
CUT_TRIES = 6
_COLS = ("kind", "op", "part", "device", "link", "coll")


def unfold(tl: SteadyTimeline) -> Timeline | None:
    """The whole iteration's :class:`Timeline` drawn from the short run ``tl`` (see the module),
    or None when ``tl`` was not extrapolated (``tl.steady`` is None) or no cut inside its part
    that repeats passes the checks."""
    st = getattr(tl, "steady", None)
    if st is None:
        return None
    more = (st.microbatches - st.simulated) // st.period
    if more <= 0:
        return None
    tg = tl.tasks
    start, end = tl.start_s, tl.end_s
    tol = TOLERANCE * float(np.max(end))
    for cut in _cuts(tg, start, st, tol):
        found = _checked(tl, cut, st.period_s, st.period, tol)
        if found is not None:
            return _unfolded(tl, st, cut, more, *found)
    return None


def simulate_drawn(graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel | None = None, *,
                   symmetry: str = "auto", cancel: Any = None,
                   account_memory: bool = True) -> tuple[SimulationResult, Timeline]:
    """(the result, the timeline to draw every task from): ``strategy`` simulated as
    :func:`engine.sim.report.simulate_strategy` with ``steady=True`` does (the totals; not
    validated again: the caller has), and the whole iteration's timeline, its short run unfolded
    (:func:`unfold`) where the steady state was extrapolated. Where it was not, the result's own
    timeline, whose ``extra["every_microbatch"]`` says why every microbatch was simulated where
    there were several and a reason is worth a line (:func:`engine.sim.steady.why_not_extrapolated`;
    a short run that did not repeat; no cut that passed the checks, when the result is then the
    full simulation's). ``symmetry``, ``cancel``, ``account_memory``: :func:`simulate_strategy`'s."""
    kw = dict(check=False, symmetry=symmetry, cancel=cancel, account_memory=account_memory)
    r = simulate_strategy(graph, strategy, cluster, cost, steady=True, **kw)
    if r.steady is not None:
        drawn = unfold(r.timeline)
        if drawn is not None:
            return r, drawn
        r = simulate_strategy(graph, strategy, cluster, cost, **kw)
        r.timeline.extra["every_microbatch"] = "no cut inside its repeat passed the checks"
    elif strategy.pipeline.microbatches > 1:
        why = why_not_extrapolated(graph, strategy)
        if why is None and short_runs(graph, strategy):
            why = "its short run was checked and does not repeat"
        if why is not None:
            r.timeline.extra["every_microbatch"] = why
    return r, r.timeline


def _cuts(tg: TaskGraph, start: np.ndarray, st: SteadyState, tol: float) -> Iterator[float]:
    """Times to try as the cut, one per microbatch around the middle of those found to repeat
    (from ``st.first``, ``st.checked`` of them), the middle first: the middle of the widest gap
    between task starts in the period before the microbatch's first start (a cut, and so the
    windows' bounds a period apart, far from any start: float rounding cannot move a task
    across). Made one at a time (the first passes, as a rule)."""
    mid = st.first + st.checked // 2
    js = [mid]
    for d in range(1, CUT_TRIES):
        js += [mid + d, mid - d]
    for j in [j for j in js if st.first <= j < st.first + st.checked][:CUT_TRIES]:
        c = float(start[tg.mb == j].min())
        s = np.unique(start[(start >= c - st.period_s) & (start <= c)])
        if s.size < 2:
            continue
        gaps = np.diff(s)
        i = int(np.argmax(gaps))
        if gaps[i] > 1e3 * tol:
            yield float(s[i] + gaps[i] / 2)


def _moved(mb: np.ndarray, by: np.ndarray | int) -> np.ndarray:
    """Microbatch ids ``by`` microbatches on (-1, a per-iteration task's, stays)."""
    return np.where(mb >= 0, mb + by, mb).astype(mb.dtype)


def _window(start: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.flatnonzero((start >= lo) & (start < hi))


def _key_order(tg: TaskGraph, ids: np.ndarray, mb: np.ndarray, start: np.ndarray) -> np.ndarray:
    """``ids`` ordered by what pairs a task with its copy a period later: every column of
    :data:`_COLS`, the microbatch ``mb`` (given, already moved on for the earlier period), the
    start (``start``, given, already shifted)."""
    keys = [start] + [mb] + [getattr(tg, c)[ids] for c in reversed(_COLS)]
    return ids[np.lexsort(keys)]


def _pairs(tl: Timeline, a: np.ndarray, b: np.ndarray, shift: float, q: int, tol: float) -> np.ndarray | None:
    """``b``'s tasks in the order of their counterparts in ``a`` (each ``b`` task the ``a`` one a
    period on: same columns, microbatch + q, start and end ``shift`` later), or None."""
    tg = tl.tasks
    if a.size != b.size or a.size == 0:
        return None
    oa = _key_order(tg, a, _moved(tg.mb[a], q), tl.start_s[a] + shift)
    ob = _key_order(tg, b, tg.mb[b], tl.start_s[b])
    for c in _COLS + ("dur_s",):
        col = getattr(tg, c)
        if not np.array_equal(col[oa], col[ob]):
            return None
    if not np.array_equal(_moved(tg.mb[oa], q), tg.mb[ob]):
        return None
    for t in (tl.start_s, tl.end_s):
        if np.max(np.abs(t[oa] + shift - t[ob])) > tol:
            return None
    return np.stack([oa, ob])


def _checked(tl: Timeline, cut: float, shift: float, q: int, tol: float) -> tuple[np.ndarray, float] | None:
    """(the tasks of the pattern W, the earliest starts' period) when the cut at ``cut`` passes
    the module's checks, else None."""
    start = tl.start_s
    before = _window(start, cut - 2 * shift, cut - shift)
    w = _window(start, cut - shift, cut)
    after = _window(start, cut, cut + shift)
    p1, p2 = _pairs(tl, before, w, shift, q, tol), _pairs(tl, w, after, shift, q, tol)
    if p1 is None or p2 is None:
        return None
    est = tl.earliest_starts_s
    d = np.concatenate([est[p1[1]] - est[p1[0]], est[p2[1]] - est[p2[0]]])
    if d.size == 0 or float(d.max() - d.min()) > tol:
        return None
    chain = tl.critical_tasks
    cs = start[chain]
    c_before, c_w = chain[(cs >= cut - 2 * shift) & (cs < cut - shift)], chain[(cs >= cut - shift) & (cs < cut)]
    if c_before.size != c_w.size or np.max(np.abs(start[c_before] + shift - start[c_w]), initial=0.0) > tol:
        return None
    for c in _COLS:
        col = getattr(tl.tasks, c)
        if not np.array_equal(col[c_before], col[c_w]):
            return None
    return w, float(np.median(d))


class UnfoldedTimeline(Timeline):
    """A :class:`Timeline` unfolded from a short run: its critical chain and critical path set
    from the short run's, its earliest starts made from the short run's when first read
    (``short_est``: the short run's earliest starts, each task's short-run task, periods moved,
    the earliest starts' period); what reads edges finds none (see the module)."""

    short_est: tuple = ()

    @cached_property
    def earliest_starts_s(self) -> np.ndarray:  # type: ignore[override]
        est, src, k, period = self.short_est
        return est[src] + k * period


def _unfolded(tl: SteadyTimeline, st: SteadyState, cut: float, more: int, w: np.ndarray,
              est_shift: float) -> Timeline:
    """The whole iteration's timeline: see the module. ``w``: the pattern's tasks (short-run
    ids, increasing); ``est_shift``: the earliest starts' period. What is moved on (microbatch
    ids, times) is made part by part, the tasks before the cut, W's copies and the rest
    (:func:`_by_part`), each value as ``x + k x step`` would make it."""
    tg = tl.tasks
    n = tg.num_tasks
    start = tl.start_s
    pre = np.flatnonzero(start < cut)
    post = np.flatnonzero(start >= cut)
    parts = (pre, w, post, more)
    src = np.concatenate([pre, np.tile(w, more), post])  # [task] its short-run task
    k = np.concatenate([np.zeros(pre.size, np.int64), np.repeat(np.arange(1, more + 1), w.size),
                        np.full(post.size, more, np.int64)])  # [task] periods it is moved on
    shift, q = st.period_s, st.period
    # where each short-run task lands: its own place (pre, post), and the copies of W's
    at = np.empty(n, np.int64)
    at[pre] = np.arange(pre.size)
    at[post] = pre.size + more * w.size + np.arange(post.size)
    copies = pre.size + np.arange(more)[:, None] * w.size + np.arange(w.size)[None, :]  # [copy, W task]
    mb = _by_part(tg.mb, parts, q, ids=True)
    N = src.size
    out = TaskGraph(
        kind=tg.kind[src], op=tg.op[src], part=tg.part[src], mb=mb, device=tg.device[src], dur_s=tg.dur_s[src],
        size_bytes=tg.size_bytes[src], flops=tg.flops[src], coll=tg.coll[src], link=tg.link[src],
        res_ptr=np.zeros(N + 1, np.int64), res_idx=np.zeros(0, np.int64), succ_ptr=np.zeros(N + 1, np.int64),
        succ_idx=np.zeros(0, np.int64),
        npred=np.zeros(N, np.int64), chain_next=np.full(N, -1, np.int64), chain_lag_s=np.zeros(N),
        n_devices=tg.n_devices, n_links=tg.n_links, comm_bytes=float(tl.comm_bytes))
    out.info = {key: v for key, v in tg.info.items()
                if key in ("symmetry", "cross_replica_transfers", "device_image", "ops")}
    moved = np.concatenate([np.zeros(pre.size), np.repeat(np.arange(1, more + 1) * shift, w.size),
                            np.full(post.size, more * shift)])  # [task] seconds moved on (k x shift)
    out.info.update(microbatches=st.microbatches, unfolded=st, unfolded_from=(tl, src, moved))
    coll = tg.info.get("coll_devices")
    if coll is not None:
        out.info["coll_devices"] = _coll_devices(coll, at, copies, np.searchsorted(w, coll[2]), w, more)
    order = _order(tl.order, start, cut, w, at, copies)
    extra = {key: v for key, v in tl.extra.items() if key != "ready_s"}  # (what the delta simulator reads)
    timeline = UnfoldedTimeline(out, _by_part(start, parts, shift), _by_part(tl.end_s, parts, shift), order,
                                np.full(N, -1, np.int64), extra)
    chain = tl.critical_tasks
    cs = start[chain]
    in_w = chain[(cs >= cut - shift) & (cs < cut)]
    timeline.short_est = (tl.earliest_starts_s, src, k, est_shift)
    timeline.__dict__["critical_path_s"] = float(tl.critical_path_s)  # (the short run's, extrapolated: the same)
    timeline.__dict__["critical_tasks"] = np.concatenate([
        at[chain[cs < cut]], copies[:, np.searchsorted(w, in_w)].reshape(-1), at[chain[cs >= cut]]])
    return timeline


def _by_part(col: np.ndarray, parts: tuple, step: float | int, ids: bool = False) -> np.ndarray:
    """``col``'s values of the unfolded tasks, moved on by k x ``step`` (k: the periods each is
    moved on): the tasks before the cut as they are, W's j-th copy by j x ``step``, the rest by
    ``more`` x ``step``. ``ids``: microbatch ids, of which -1 (a per-iteration task's) stays.
    Made on W's and the rest's values, not on a [task] array of k (a 1.1 M-task timeline
    made three of them)."""
    pre, w, post, more = parts
    cw, cp = col[w], col[post]
    steps = (np.arange(1, more + 1) * step)[:, None]  # (j x step, as k x step makes it)
    if ids:
        copies, cp = _moved(cw[None, :], steps), _moved(cp, more * step)
    else:
        copies, cp = cw[None, :] + steps, cp + more * step
    return np.concatenate([col[pre], copies.reshape(-1), cp]).astype(col.dtype, copy=False)


def _rows(ptr: np.ndarray, idx: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR rows ``src`` of (``ptr``, ``idx``), in that order."""
    counts = np.diff(ptr)[src]
    out_ptr = np.zeros(src.size + 1, np.int64)
    np.cumsum(counts, out=out_ptr[1:])
    first = np.repeat(ptr[:-1][src] - out_ptr[:-1], counts)
    return out_ptr, idx[first + np.arange(out_ptr[-1])]


def _coll_devices(coll: tuple, at: np.ndarray, copies: np.ndarray, in_w: np.ndarray, w: np.ndarray,
                  more: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The collectives' devices (``tasks.info["coll_devices"]``: CSR ptr, devices, task ids) of
    the unfolded tasks: each collective's own place (its devices as they are), then W's
    collectives' copies (their devices tiled ``more`` times)."""
    ptr, idx, tasks = coll
    in_w = np.minimum(in_w, max(w.size - 1, 0))
    is_w = (w.size > 0) & (w[in_w] == tasks) if tasks.size else np.zeros(0, bool)
    w_ptr, w_idx = _rows(ptr, idx, np.flatnonzero(is_w))
    steps = (np.arange(more) * w_ptr[-1])[:, None]
    own_ptr, own_idx = ptr - ptr[0], idx[ptr[0]:ptr[-1]]  # (every row in order: a slice)
    new_ptr = np.concatenate([own_ptr, own_ptr[-1] + (w_ptr[1:][None, :] + steps).reshape(-1)])
    ids = np.concatenate([at[tasks], copies[:, in_w[is_w]].reshape(-1)])
    return new_ptr, np.concatenate([own_idx, np.tile(w_idx, more)]), ids


def _order(order: np.ndarray, start: np.ndarray, cut: float, w: np.ndarray, at: np.ndarray,
           copies: np.ndarray) -> np.ndarray:
    """A dispatch order of the unfolded tasks: the short run's before the cut, each copy of W
    in the short run's order of W, then the short run's from the cut."""
    s = start[order]
    in_w = np.zeros(start.size, bool)
    in_w[w] = True
    w_in_order = order[in_w[order]]
    pos = np.searchsorted(w, w_in_order)
    return np.concatenate([at[order[s < cut]], copies[:, pos].reshape(-1), at[order[s >= cut]]])
