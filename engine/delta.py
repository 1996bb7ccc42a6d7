"""Delta simulation: re-simulate after one op's config changes (FlexFlow's Algorithm 2).

FlexFlow (Jia et al. SysML'19 §5.3) replaces the changed op's tasks and propagates new start
and end times only through what they touch. soapbox does the same in two steps, and the
result is identical, task for task, to a full simulation of the new strategy:

1. **Task graph.** :meth:`engine.taskgraph._Builder.rebuild` regenerates only the segments
   that read the op (its compute, the tensors it makes or reads, its parameter unit);
   every other segment is reused, and the assembled arrays equal a full build's.
2. **Timeline.** The simulator is FIFO by ready time with a task-id tie-break, so the tasks
   that became ready strictly before the first moment a changed task can matter (``t_c``)
   are dispatched exactly as before. :func:`resume` keeps that prefix of the old timeline,
   rebuilds the event loop's state from it (resource free times, predecessors left, ready
   times) and runs the loop from there.

``t_c`` is the earliest of: the old ready time of every removed task and of every kept task
whose predecessors changed; and, for every new task whose predecessors are all kept, the
latest old end of those predecessors (a lower bound of its new ready time).
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np

from .cluster import Cluster
from .costs import CostModel
from .errors import ValidationError
from .graph import OpGraph
from .simulate import Timeline, _loop, _timeline, simulate
from .strategy import Config, Strategy, _check_config
from .taskgraph import TaskGraph, _Builder

__all__ = ["DeltaSimulator", "resume"]


@nb.njit(cache=True)
def _frontier(succ_ptr, succ_idx, fresh, end_old_in_new, chain_next):  # pragma: no cover
    """For every task: whether a fresh (rebuilt) task precedes it, and the latest old end of
    its kept predecessors."""
    n = fresh.shape[0]
    has_fresh_pred = np.zeros(n, np.bool_)
    bound = np.zeros(n)
    for t in range(n):
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            v = succ_idx[k]
            if fresh[t]:
                has_fresh_pred[v] = True
            elif end_old_in_new[t] > bound[v]:
                bound[v] = end_old_in_new[t]
        c = chain_next[t]
        if c >= 0 and fresh[t]:
            has_fresh_pred[c] = True
    return has_fresh_pred, bound


@nb.njit(cache=True)
def _restore(P, start, end, succ_ptr, succ_idx, chain_next, chain_lag, npred, res_ptr, res_idx, n_res):  # pragma: no cover
    """Event-loop state after the dispatched prefix ``P`` (in dispatch order): predecessors
    left, ready times, and each resource's free time and last task."""
    n = npred.shape[0]
    left = npred.copy()
    for t in range(n):
        if chain_next[t] >= 0:
            left[chain_next[t]] += 1
    ready = np.zeros(n)
    last = np.zeros(n_res)
    last_task = np.full(n_res, -1, np.int64)
    for i in range(P.shape[0]):
        t = P[i]
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            v = succ_idx[k]
            left[v] -= 1
            if end[t] > ready[v]:
                ready[v] = end[t]
        c = chain_next[t]
        if c >= 0:
            left[c] -= 1
            r = start[t] + chain_lag[t]
            if r > ready[c]:
                ready[c] = r
        for k in range(res_ptr[t], res_ptr[t + 1]):
            last[res_idx[k]] = end[t]
            last_task[res_idx[k]] = t
    return left, ready, last, last_task


def resume(old: TaskGraph, old_tl: Timeline, new: TaskGraph) -> Timeline:
    """Simulate ``new`` reusing the prefix of ``old_tl`` that ``new`` cannot change.

    ``new`` must come from the same builder as ``old`` (its ``info["slots"]`` says which
    segments are shared). The result equals :func:`engine.simulate.simulate` of ``new``.
    """
    o_slots, n_slots = old.info["slots"], new.info["slots"]
    old_to_new = np.full(old.num_tasks, -1, np.int64)
    kept_new = np.zeros(new.num_tasks, bool)
    for slot, (ns, nn, serial) in n_slots.items():
        hit = o_slots.get(slot)
        if hit is not None and hit[2] == serial:
            os_, on, _ = hit
            old_to_new[os_:os_ + on] = np.arange(ns, ns + nn)
            kept_new[ns:ns + nn] = True
    removed = old_to_new < 0
    ready_old = old_tl.extra["ready_s"]
    t_c = np.inf
    if removed.any():
        t_c = min(t_c, float(ready_old[removed].min()))
    # kept tasks whose predecessors changed, seen from the old graph ...
    o_src = old.edge_src
    o_dst = old.succ_idx
    hit = removed[o_src] & ~removed[o_dst]
    if hit.any():
        t_c = min(t_c, float(ready_old[o_dst[hit]].min()))
    # ... and from the new one; and kept tasks whose duration changed (optimizer steps)
    n_src = new.edge_src
    n_dst = new.succ_idx
    new_to_old = np.full(new.num_tasks, -1, np.int64)
    new_to_old[old_to_new[~removed]] = np.nonzero(~removed)[0]
    touched = kept_new[n_dst] & ~kept_new[n_src]
    if touched.any():
        old_ids = new_to_old[n_dst[touched]]
        t_c = min(t_c, float(ready_old[old_ids].min()))
    kept_old = np.nonzero(~removed)[0]
    changed_dur = new.dur_s[old_to_new[kept_old]] != old.dur_s[kept_old]
    if changed_dur.any():
        t_c = min(t_c, float(ready_old[kept_old[changed_dur]].min()))
    # new tasks whose predecessors are all kept: their ready time is at least the latest
    # old end of those predecessors
    end_old_in_new = np.zeros(new.num_tasks)
    end_old_in_new[old_to_new[kept_old]] = old_tl.end_s[kept_old]
    fresh = ~kept_new
    has_fresh_pred, bound = _frontier(new.succ_ptr, new.succ_idx, fresh, end_old_in_new, new.chain_next)
    frontier = fresh & ~has_fresh_pred
    if frontier.any():
        t_c = min(t_c, float(bound[frontier].min()))
    # the prefix: old tasks that became ready strictly before t_c (all kept, by construction)
    prefix_old = old_tl.order[ready_old[old_tl.order] < t_c]
    return _continue(new, old_tl, prefix_old, old_to_new)


def _continue(new: TaskGraph, old_tl: Timeline, prefix_old: np.ndarray, old_to_new: np.ndarray) -> Timeline:
    n = new.num_tasks
    P = old_to_new[prefix_old]  # dispatched tasks, in dispatch order (new ids)
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    start[P] = old_tl.start_s[prefix_old]
    end[P] = old_tl.end_s[prefix_old]
    left, ready, last, last_task = _restore(P, start, end, new.succ_ptr, new.succ_idx, new.chain_next,
                                            new.chain_lag_s, new.npred, new.res_ptr, new.res_idx,
                                            new.n_devices + new.n_links)
    ready[P] = old_tl.extra["ready_s"][prefix_old]
    done_mask = np.zeros(n, bool)
    done_mask[P] = True
    res_pred = np.full(n, -1, np.int64)
    rp_old = old_tl.resource_pred[prefix_old]
    res_pred[P] = np.where(rp_old >= 0, old_to_new[np.maximum(rp_old, 0)], -1)
    order = np.empty(n, np.int64)
    order[:P.size] = P
    initial = np.nonzero((left == 0) & ~done_mask)[0]
    start, end, order, res_pred, ready = _loop(
        new.dur_s, new.res_ptr, new.res_idx, new.succ_ptr, new.succ_idx, new.chain_next, new.chain_lag_s,
        np.zeros(0), start, end, ready, left, last, last_task, res_pred, order, P.size, initial)
    tl = _timeline(new, start, end, order, res_pred, ready)
    tl.extra["reused_tasks"] = int(P.size)
    return tl


class DeltaSimulator:
    """A strategy's task graph and timeline, edited one op's config at a time.

    Examples
    --------
    >>> from engine.formats import resolve_model
    >>> from engine.cluster import preset
    >>> from engine.search.baselines import data_parallel
    >>> g, c = resolve_model("alexnet"), preset("p100-4x4")
    >>> sim = DeltaSimulator(g, data_parallel(g, c), c)
    >>> before = sim.timeline.makespan_s
    >>> _ = sim.change("fc8", Config({"feature": 4}, (0, 1, 2, 3)))
    >>> sim.timeline.makespan_s != before
    True
    >>> sim.revert(); sim.timeline.makespan_s == before
    True
    """

    def __init__(self, graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel | None = None) -> None:
        self.graph, self.cluster = graph, cluster
        self.cost = cost or CostModel()
        self._builder = _Builder(graph, strategy, cluster, self.cost)  # no symmetry: edits break it
        self.tasks = self._builder.build()
        self.timeline = simulate(self.tasks)
        self._undo: tuple[Any, TaskGraph, Timeline] | None = None

    @property
    def strategy(self) -> Strategy:
        return self._builder.s

    def check(self, op: str, config: Config) -> list:
        """Problems with giving ``op`` ``config`` (empty when valid)."""
        return _check_config(self.graph[op], config, self.cluster, f"ops.{op}",
                             max(1, self.strategy.pipeline.microbatches))

    def change(self, op: str, config: Config) -> Timeline:
        """Give ``op`` a new config and re-simulate; :meth:`revert` undoes the last change.

        Raises
        ------
        ValidationError
            When the config is not valid for the op (nothing changes then).
        """
        problems = self.check(op, config)
        if problems:
            raise ValidationError(problems, f"config for {op}")
        snap = self._builder.snapshot(op)
        old_tasks, old_tl = self.tasks, self.timeline
        new_strategy = self.strategy.with_config(op, config)
        if new_strategy.sequence_parallel:  # reductions then depend on consumers: rebuild all
            self._builder = _Builder(self.graph, new_strategy, self.cluster, self.cost)
            self.tasks = self._builder.build()
            self.timeline = simulate(self.tasks)
        else:
            self.tasks = self._builder.rebuild(new_strategy, op)
            self.timeline = resume(old_tasks, old_tl, self.tasks)
        self._undo = (snap, old_tasks, old_tl)
        return self.timeline

    def revert(self) -> None:
        """Undo the last :meth:`change` (only the last one)."""
        if self._undo is None:
            raise ValueError("nothing to revert")
        snap, self.tasks, self.timeline = self._undo
        self._builder.restore(snap)
        self._undo = None
