"""Full simulation of a task graph: FlexFlow's Algorithm 1 (Jia et al. SysML'19 §5.2).

Tasks are dispatched in order of their ready time (the latest end of their predecessors),
ties broken by task id so that a run is reproducible exactly; a task starts at
``max(ready, free time of each of its resources)`` and holds every resource until it ends
(a compute task its GPU, a transfer hop its link, a collective all its group's links); each
resource is therefore a FIFO queue by ready time. A transfer hop releases the next hop of the
same transfer ``latency`` after it *starts* (cut-through, see :mod:`engine.taskgraph`).

The event loop is compiled with numba (``cache=True``): ~8-10 million tasks per second on a
2-core machine (benchmarks/bench_simulate.py), against ~0.3 million for the same loop in
Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numba as nb
import numpy as np

from ..errors import check_cancel
from ..taskgraph import BWD, FWD, UPDATE, TaskGraph

__all__ = ["Timeline", "simulate", "run_schedule", "run_reference", "mirror", "POLICIES", "CANCEL_CHECK_EVENTS",
           "event_loop", "loop_state", "ready_heap", "dispatch", "timeline_from"]


#: children per node of the ready heap: a 4-ary heap is ~25% faster than a binary one on the
#: 474 k-task NMT / 64-GPU graph of an MCMC chain (fewer levels, siblings in one cache line;
#: benchmarks/bench_proposals.py). Any heap pops the same task: keys (ready, id) are unique.
HEAP_ARITY = 4


@nb.njit(cache=True, inline="always")
def _before(ka, ia, kb, ib):
    """Whether heap entry (key ``ka``, task ``ia``) goes before (``kb``, ``ib``): by ready time, ties by task id."""
    return ka < kb or (ka == kb and ia < ib)


@nb.njit(cache=True)
def _push(hk, hi, n, key, idx):
    """Insert (``key``, ``idx``) into the heap of ``n`` entries (the hole moves up; one write per level)."""
    i = n
    while i > 0:
        p = (i - 1) // HEAP_ARITY
        if _before(hk[p], hi[p], key, idx):
            break
        hk[i] = hk[p]
        hi[i] = hi[p]
        i = p
    hk[i] = key
    hi[i] = idx
    return n + 1


@nb.njit(cache=True)
def _pop(hk, hi, n):
    """Remove the first entry of the heap of ``n`` entries: (key, task, new size)."""
    key = hk[0]
    idx = hi[0]
    n -= 1
    k = hk[n]
    x = hi[n]
    i = 0
    while True:
        c = HEAP_ARITY * i + 1
        if c >= n:
            break
        best = c
        for j in range(c + 1, min(c + HEAP_ARITY, n)):
            if _before(hk[j], hi[j], hk[best], hi[best]):
                best = j
        if _before(k, x, hk[best], hi[best]):
            break
        hk[i] = hk[best]
        hi[i] = hi[best]
        i = best
    hk[i] = k
    hi[i] = x
    return key, idx, n


@nb.njit(cache=True, nogil=True)
def _run(dur, res_ptr, res_idx, succ_ptr, succ_idx, npred, chain_next, chain_lag, n_res, rank):  # pragma: no cover
    """List scheduling. ``rank`` empty: FIFO by ready time (FlexFlow's Algorithm 1); else
    tasks are dispatched in ``rank`` order (a fixed topological priority)."""
    n = dur.shape[0]
    start, end, ready, left, last, last_task, res_pred, order = loop_state(npred, n_res, n)
    initial = np.nonzero(left == 0)[0]
    return event_loop(dur, res_ptr, res_idx, succ_ptr, succ_idx, chain_next, chain_lag, rank, start, end, ready, left,
                 last, last_task, res_pred, order, 0, initial)


@nb.njit(cache=True, nogil=True)
def loop_state(npred, n_res, n):  # pragma: no cover
    """The event loop's arrays before any dispatch (allocated here, not by NumPy: NumPy asks
    for transparent huge pages on large arrays, which made a 9 M-task loop 5-30% slower on a
    busy 2-core machine, the more the busier: benchmarks/bench_cancel.py)."""
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    ready = np.zeros(n)
    left = npred.copy()
    last = np.zeros(n_res)
    last_task = np.full(n_res, -1, np.int64)  # task that last held each resource
    res_pred = np.full(n, -1, np.int64)  # the task whose release of a resource set our start
    order = np.empty(n, np.int64)
    return start, end, ready, left, last, last_task, res_pred, order


@nb.njit(cache=True, nogil=True)
def event_loop(dur, res_ptr, res_idx, succ_ptr, succ_idx, chain_next, chain_lag, rank, start, end, ready, left, last,
          last_task, res_pred, order, done, initial):  # pragma: no cover
    """The event loop from a given state: ``done`` tasks already dispatched (``order[:done]``),
    ``initial`` the tasks ready to go (all predecessors dispatched)."""
    n = dur.shape[0]
    hk, hi, h = ready_heap(rank, ready, initial, n)
    done, h = dispatch(dur, res_ptr, res_idx, succ_ptr, succ_idx, chain_next, chain_lag, rank, start, end, ready, left,
                       last, last_task, res_pred, order, done, hk, hi, h, n + 1, np.zeros(0), np.inf)
    return start, end, order[:done], res_pred, ready


@nb.njit(cache=True, nogil=True)
def ready_heap(rank, ready, initial, n):  # pragma: no cover
    """The heap of the ready tasks ``initial`` (keys, task ids, size), room for ``n``."""
    static = rank.shape[0] == n
    hk = np.empty(n + 1)
    hi = np.empty(n + 1, np.int64)
    h = 0
    for t in initial:
        h = _push(hk, hi, h, rank[t] if static else ready[t], t)
    return hk, hi, h


@nb.njit(cache=True, nogil=True)
def dispatch(dur, res_ptr, res_idx, succ_ptr, succ_idx, chain_next, chain_lag, rank, start, end, ready, left, last,
             last_task, res_pred, order, done, hk, hi, h, stop_at, rem, bound):  # pragma: no cover
    """Dispatch tasks from the heap (``hk``, ``hi``, ``h`` entries) until it is empty or
    ``stop_at`` tasks are dispatched in all; returns (tasks dispatched, heap size). Called
    once for a whole run, or in chunks with a cancel check between them (the interpreter
    lock is released meanwhile, so another thread can set the cancel).

    With ``rem`` (per resource, the seconds of work its tasks not yet dispatched hold; empty:
    no bound), it also stops after the first task from which the run's end is known to be at
    least ``bound``: that task's end, or a resource it held free at ``last`` with ``rem`` still
    to run (a resource runs one task at a time, so the run cannot end before). The state is then
    left as it stands, and a later call goes on from it to the same run."""
    n = dur.shape[0]
    static = rank.shape[0] == n
    bounded = rem.shape[0] > 0
    while h > 0 and done < stop_at:
        r, t, h = _pop(hk, hi, h)
        s = ready[t]
        rp = -1
        for k in range(res_ptr[t], res_ptr[t + 1]):
            q = res_idx[k]
            if last[q] > s:
                s = last[q]
                rp = last_task[q]
        e = s + dur[t]
        start[t] = s
        end[t] = e
        res_pred[t] = rp
        for k in range(res_ptr[t], res_ptr[t + 1]):
            q = res_idx[k]
            last[q] = e
            last_task[q] = t
        order[done] = t
        done += 1
        c = chain_next[t]
        if c >= 0:
            rc = s + chain_lag[t]
            if rc > ready[c]:
                ready[c] = rc
            left[c] -= 1
            if left[c] <= 0:
                h = _push(hk, hi, h, rank[c] if static else ready[c], c)
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            v = succ_idx[k]
            if e > ready[v]:
                ready[v] = e
            left[v] -= 1
            if left[v] == 0:
                h = _push(hk, hi, h, rank[v] if static else ready[v], v)
        if bounded:
            lb = e
            for k in range(res_ptr[t], res_ptr[t + 1]):
                q = res_idx[k]
                rem[q] -= dur[t]
                if e + rem[q] > lb:
                    lb = e + rem[q]
            if lb >= bound:
                break
    return done, h


@nb.njit(cache=True, nogil=True)  # (the explorer walks it beside the memory report)
def _critical_walk(t, start, end, pred_ptr, pred_idx, resource_pred, chain_prev):  # pragma: no cover
    """From task ``t`` back to a task with nothing before it: each step goes to the data
    predecessor that ended last if it ended when ``t`` started, else to the task that held the
    resource, else to the previous hop of a cut-through transfer. Returns the tasks, last first."""
    path = np.empty(start.shape[0], np.int64)
    n = 0
    path[n] = t
    n += 1
    while n < start.shape[0]:
        s = start[t]
        best = -1
        k_best = -1
        e_best = -np.inf
        for k in range(pred_ptr[t], pred_ptr[t + 1]):
            p = pred_idx[k]
            if end[p] > e_best:
                e_best = end[p]
                k_best = p
        if k_best >= 0 and abs(end[k_best] - s) <= 1e-12:
            best = k_best
        rp = resource_pred[t]
        if best < 0 and rp >= 0 and abs(end[rp] - s) <= 1e-12:
            best = rp
        if best < 0 and chain_prev[t] >= 0:
            best = chain_prev[t]
        if best < 0:
            break
        path[n] = best
        n += 1
        t = best
    return path[:n]


@nb.njit(cache=True, nogil=True)  # (the explorer walks it beside the memory report)
def _longest_path(order, dur, succ_ptr, succ_idx, chain_next, chain_lag):  # pragma: no cover
    """Earliest start of every task with unlimited resources (dependency critical path)."""
    n = dur.shape[0]
    est = np.zeros(n)
    for i in range(order.shape[0]):
        t = order[i]
        e = est[t] + dur[t]
        c = chain_next[t]
        if c >= 0 and est[t] + chain_lag[t] > est[c]:
            est[c] = est[t] + chain_lag[t]
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            v = succ_idx[k]
            if e > est[v]:
                est[v] = e
    return est


def mirror(per_device: np.ndarray, tg: TaskGraph) -> np.ndarray:
    """Copy each representative device's value to the devices that mirror it (a reduced,
    symmetric simulation holds tasks only for representatives)."""
    image = tg.info.get("device_image")
    if image is None:
        return per_device
    out = per_device.copy()
    has = image >= 0
    out[has] = per_device[image[has]]
    return out


def run_reference(tg: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
    """The FIFO event loop in plain Python (heapq): the oracle the compiled loop is tested
    against, and the baseline of ``benchmarks/bench_simulate.py``. Returns (start_s, end_s)."""
    import heapq

    n = tg.num_tasks
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    ready = np.zeros(n)
    left = tg.npred.copy()
    has_chain = tg.chain_next >= 0
    np.add.at(left, tg.chain_next[has_chain], 1)
    last = np.zeros(tg.n_devices + tg.n_links)
    dur, rp, ri, sp, si = tg.dur_s.tolist(), tg.res_ptr.tolist(), tg.res_idx.tolist(), tg.succ_ptr.tolist(), \
        tg.succ_idx.tolist()
    chain, lag = tg.chain_next.tolist(), tg.chain_lag_s.tolist()
    left_l, ready_l, last_l = left.tolist(), ready.tolist(), last.tolist()
    heap = [(0.0, t) for t in range(n) if left_l[t] == 0]
    heapq.heapify(heap)
    start_l, end_l = [0.0] * n, [0.0] * n
    while heap:
        r, t = heapq.heappop(heap)
        s = ready_l[t]
        for k in range(rp[t], rp[t + 1]):
            if last_l[ri[k]] > s:
                s = last_l[ri[k]]
        e = s + dur[t]
        start_l[t], end_l[t] = s, e
        for k in range(rp[t], rp[t + 1]):
            last_l[ri[k]] = e
        c = chain[t]
        if c >= 0:
            ready_l[c] = max(ready_l[c], s + lag[t])
            left_l[c] -= 1
            if left_l[c] <= 0:
                heapq.heappush(heap, (ready_l[c], c))
        for k in range(sp[t], sp[t + 1]):
            v = si[k]
            if e > ready_l[v]:
                ready_l[v] = e
            left_l[v] -= 1
            if left_l[v] == 0:
                heapq.heappush(heap, (ready_l[v], v))
    start[:] = start_l
    end[:] = end_l
    return start, end


POLICIES = ("fifo", "static")


def run_schedule(tg: TaskGraph, policy: str = "fifo", cancel: Any = None) -> tuple[np.ndarray, ...]:
    """Run the event loop: (start_s, end_s, dispatch order, resource predecessor, ready_s)
    per task. ``cancel`` (:func:`engine.errors.check_cancel`): asked every
    :data:`CANCEL_CHECK_EVENTS` tasks; :class:`~engine.errors.Cancelled` when set.

    ``fifo``: FlexFlow's Algorithm 1, tasks take their resources in order of ready time.
    ``static``: tasks take their resources in one fixed topological order (Kahn's, ties by
    task id) whatever the durations; start times are then a max-plus function of the
    durations, so a faster device or link never delays anything. FIFO is the realistic
    policy but, like any greedy list scheduler, can show Graham's anomalies (Graham 1969):
    speeding a task up reorders a queue and can lengthen the schedule slightly.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid: {', '.join(POLICIES)}")
    if tg.info.get("unfolded") is not None:
        raise ValueError("this task graph was unfolded from a steady short run (engine.sim.unfold): a drawing "
                         "without dependency edges, not a graph to simulate; simulate the strategy instead")
    check_cancel(cancel)
    has_chain = tg.chain_next >= 0  # a chained hop waits for its previous hop:
    npred = tg.npred + np.bincount(tg.chain_next[has_chain], minlength=tg.num_tasks)
    n_res = tg.n_devices + tg.n_links
    args = (tg.res_ptr, tg.res_idx, tg.succ_ptr, tg.succ_idx, npred, tg.chain_next, tg.chain_lag_s, n_res)
    run = _run if cancel is None else _run_cancellable
    extra = () if cancel is None else (cancel,)
    rank = np.zeros(0)
    if policy == "static":
        order = run(np.zeros(tg.num_tasks), *args, rank, *extra)[2]  # zero durations: Kahn's order by id
        rank = np.empty(tg.num_tasks)
        rank[order] = np.arange(order.size, dtype=np.float64)
    return run(tg.dur_s, *args, rank, *extra)


#: the event loop asks its ``cancel`` once every this many tasks (~40 ms of the loop on a busy
#: 2-core machine; one Python call per chunk, within the timing noise of a 9 M-task loop:
#: benchmarks/bench_cancel.py)
CANCEL_CHECK_EVENTS = 1 << 17


def _run_cancellable(dur, res_ptr, res_idx, succ_ptr, succ_idx, npred, chain_next, chain_lag, n_res, rank, cancel):
    """:func:`_run` in chunks of :data:`CANCEL_CHECK_EVENTS` tasks with
    :func:`~engine.errors.check_cancel` between them (the same dispatches in the same order:
    the result is identical)."""
    check_cancel(cancel)
    chunk = max(1, int(CANCEL_CHECK_EVENTS))
    n = dur.shape[0]
    start, end, ready, left, last, last_task, res_pred, order = loop_state(npred, n_res, n)
    initial = np.nonzero(left == 0)[0]
    check_cancel(cancel)
    hk, hi, h = ready_heap(rank, ready, initial, n)
    done = 0
    while h > 0:
        check_cancel(cancel)
        done, h = dispatch(dur, res_ptr, res_idx, succ_ptr, succ_idx, chain_next, chain_lag, rank, start, end, ready,
                           left, last, last_task, res_pred, order, done, hk, hi, h, done + chunk, np.zeros(0), np.inf)
    return start, end, order[:done], res_pred, ready


@dataclass
class Timeline:
    """The simulated iteration: when every task ran, and what that adds up to.

    Attributes
    ----------
    tasks : TaskGraph
    start_s, end_s : float64 [task]
    order : int64 [task]
        Dispatch order (a topological order of the task graph).
    resource_pred : int64 [task]
        The task whose release of a resource delayed this one (-1 if none).
    """

    tasks: TaskGraph
    start_s: np.ndarray
    end_s: np.ndarray
    order: np.ndarray
    resource_pred: np.ndarray
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def makespan_s(self) -> float:
        """Per-iteration time in seconds."""
        return float(np.nanmax(self.end_s)) if self.end_s.size else 0.0

    @cached_property
    def device_busy_s(self) -> np.ndarray:
        """[device] seconds each GPU spends on compute and optimizer tasks."""
        tg = self.tasks
        on_dev = (tg.kind == FWD) | (tg.kind == BWD) | (tg.kind == UPDATE)
        busy = np.bincount(tg.device[on_dev], weights=tg.dur_s[on_dev], minlength=tg.n_devices)
        return mirror(busy, tg)

    @property
    def utilization(self) -> np.ndarray:
        """[device] busy fraction of the iteration."""
        return self.device_busy_s / self.makespan_s if self.makespan_s > 0 else np.zeros(self.tasks.n_devices)

    @property
    def comm_bytes(self) -> float:
        """Bytes sent between devices in one iteration: every transfer once (not per hop)
        plus collectives' ring traffic (2(n-1) x buffer for an all-reduce over n ranks)."""
        return float(self.tasks.comm_bytes)

    @cached_property
    def critical_path_s(self) -> float:
        """Length of the longest dependency chain with unlimited resources (a lower bound of
        the makespan)."""
        tg = self.tasks
        return float(np.max(self.earliest_starts_s + tg.dur_s)) if tg.num_tasks else 0.0

    @cached_property
    def earliest_starts_s(self) -> np.ndarray:
        """[task] when each task could start with unlimited resources (dependencies only)."""
        tg = self.tasks
        return _longest_path(self.order, tg.dur_s, tg.succ_ptr, tg.succ_idx, tg.chain_next, tg.chain_lag_s)

    @cached_property
    def critical_tasks(self) -> np.ndarray:
        """Task ids of the chain that sets the makespan, first to last: from the last task
        to end, step back to the predecessor (data or resource) whose end set its start."""
        tg = self.tasks
        if tg.num_tasks == 0:
            return np.zeros(0, np.int64)
        pred_ptr, pred_idx = tg.pred_lists()
        chain_prev = np.full(tg.num_tasks, -1, np.int64)
        has = tg.chain_next >= 0
        chain_prev[tg.chain_next[has]] = np.nonzero(has)[0]
        path = _critical_walk(int(np.nanargmax(self.end_s)), self.start_s, self.end_s, pred_ptr, pred_idx,
                              self.resource_pred, chain_prev)
        return path[::-1].copy()

    def busiest_device_work_s(self) -> float:
        return float(self.device_busy_s.max()) if self.device_busy_s.size else 0.0


def simulate(tg: TaskGraph, policy: str = "fifo", cancel: Any = None) -> Timeline:
    """Simulate one iteration of ``tg`` (``policy``, ``cancel``: see :func:`run_schedule`).

    Raises
    ------
    Cancelled
        When ``cancel`` is set before the loop ends.
    ValueError
        When some task never becomes ready (a dependency cycle, which a valid strategy's
        task graph never has).
    """
    start, end, order, res_pred, ready = run_schedule(tg, policy, cancel)
    return timeline_from(tg, start, end, order, res_pred, ready)


def timeline_from(tg, start, end, order, res_pred, ready) -> Timeline:
    if order.size != tg.num_tasks:
        stuck = np.nonzero(np.isnan(start))[0][:5]
        raise ValueError(f"{tg.num_tasks - order.size} task(s) never became ready (first: {stuck.tolist()}); "
                         "the task graph has a cycle")
    return Timeline(tg, start, end, order, res_pred, {"ready_s": ready})



