"""Delta simulation: re-simulate after one op's config changes (FlexFlow's Algorithm 2).

FlexFlow (Jia et al. SysML'19 §5.3) replaces the changed op's tasks and propagates new start
and end times only through what they touch. soapbox does the same in two steps, and the
result is identical, task for task, to a full simulation of the new strategy:

1. **Task graph.** :meth:`engine.taskgraph.TaskGraphBuilder.rebuild` regenerates only the segments
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

3. **A bound** (:meth:`DeltaSimulator.trial`, the polish's candidates): a search that keeps a
   change only when it is faster than its best needs the new time only below that best. The
   loop stops as soon as the run is known to end at the bound or later: a task ended there, or
   a resource's free time plus the work still queued for it reaches it (a resource runs one
   task at a time). Nothing is approximated: the stopped loop's state is kept, and the whole
   timeline, when asked for, is the one a full run gives. On NMT / ``p100-4x4`` from FlexFlow's
   expert strategy (217 k tasks, candidates 16-28% slower than the best) the loop stops after
   65-75% of the tasks (issue 43).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numba as nb
import numpy as np

from ..cluster import Cluster
from ..costs import CostModel
from ..errors import Problem, ValidationError
from ..graph import OpGraph
from .full import Timeline, dispatch, ready_heap, timeline_from, simulate
from ..strategy import Config, Strategy, check_config
from ..taskgraph import TaskGraph, TaskGraphBuilder

__all__ = ["DeltaSimulator", "resume", "Paused", "BOUND_MARGIN"]


@nb.njit(cache=True, nogil=True)
def _first_change(o_ptr, o_idx, n_ptr, n_idx, n_chain, old_to_new, ready_old, end_old, dur_old,
                  dur_new):  # pragma: no cover
    """``t_c``: the earliest moment a change can act (see the module docstring), in one pass
    over the old and the new successor lists."""
    n_old = old_to_new.shape[0]
    n_new = n_ptr.shape[0] - 1
    new_to_old = np.full(n_new, -1, np.int64)
    for t in range(n_old):
        if old_to_new[t] >= 0:
            new_to_old[old_to_new[t]] = t
    t_c = np.inf
    lost = np.zeros(n_new, np.bool_)  # kept tasks that lost a predecessor
    for u in range(n_old):
        if old_to_new[u] < 0:  # removed, and kept tasks it preceded
            if ready_old[u] < t_c:
                t_c = ready_old[u]
            for k in range(o_ptr[u], o_ptr[u + 1]):
                v = o_idx[k]
                if old_to_new[v] >= 0:
                    lost[old_to_new[v]] = True
                    if ready_old[v] < t_c:
                        t_c = ready_old[v]
        elif dur_new[old_to_new[u]] != dur_old[u] and ready_old[u] < t_c:  # kept, duration changed
            t_c = ready_old[u]
    has_fresh_pred = np.zeros(n_new, np.bool_)
    bound = np.zeros(n_new)  # latest old end of a task's kept predecessors
    for u in range(n_new):
        fresh = new_to_old[u] < 0
        for k in range(n_ptr[u], n_ptr[u + 1]):
            v = n_idx[k]
            if fresh:
                has_fresh_pred[v] = True
                if new_to_old[v] >= 0 and ready_old[new_to_old[v]] < t_c:  # kept, new predecessor
                    t_c = ready_old[new_to_old[v]]
            elif end_old[new_to_old[u]] > bound[v]:
                bound[v] = end_old[new_to_old[u]]
        if fresh and n_chain[u] >= 0:
            has_fresh_pred[n_chain[u]] = True
    for v in range(n_new):  # new tasks, and kept ones that lost a predecessor, whose predecessors are all kept
        if (new_to_old[v] < 0 or lost[v]) and not has_fresh_pred[v] and bound[v] < t_c:
            t_c = bound[v]  # (a lower bound of its new ready time: it may be ready earlier than before)
    return t_c


@nb.njit(cache=True, nogil=True)
def _restore(old_order, ready_old, start_old, end_old, rp_old, old_to_new, t_c, succ_ptr, succ_idx, chain_next,
             chain_lag, npred, res_ptr, res_idx, n_res):  # pragma: no cover
    """The event loop's state after the kept prefix (the old tasks that became ready strictly
    before ``t_c``, in their old dispatch order, renumbered by ``old_to_new``), in one
    compiled pass: start, end, ready, predecessors left, each resource's free time and last
    task, resource predecessors, the dispatch order so far and its length, and the tasks
    ready to go (the arrays :func:`engine.sim.full.event_loop` goes on from).

    (Checkpoints of the old run's state would not pay here: task ids shift between the old
    and the new graph, so a restored checkpoint costs an O(tasks) renumbering, as much as
    this pass, and saving them costs every run.)"""
    n = npred.shape[0]
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    ready = np.zeros(n)
    left = npred.copy()
    for t in range(n):
        if chain_next[t] >= 0:
            left[chain_next[t]] += 1
    last = np.zeros(n_res)
    last_task = np.full(n_res, -1, np.int64)
    res_pred = np.full(n, -1, np.int64)
    order = np.empty(n, np.int64)
    done = 0
    for i in range(old_order.shape[0]):
        u = old_order[i]
        if not ready_old[u] < t_c:
            continue
        t = old_to_new[u]
        order[done] = t
        done += 1
        start[t] = start_old[u]
        end[t] = end_old[u]
        ready[t] = ready_old[u]  # (final: its predecessors all came before it in the prefix)
        if rp_old[u] >= 0:
            res_pred[t] = old_to_new[rp_old[u]]
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
    initial = np.empty(n, np.int64)  # tasks ready to go: predecessors all dispatched, not dispatched
    k = 0
    for t in range(n):
        if left[t] == 0 and np.isnan(start[t]):
            initial[k] = t
            k += 1
    return start, end, ready, left, last, last_task, res_pred, order, done, initial[:k]


def _task_map(old_segs, new_segs, n_old: int) -> np.ndarray:
    """Old task id -> new task id for tasks of segments both graphs share (same slot and
    serial), -1 for the others. ``*_segs``: (slot, first task, tasks, serial) per segment,
    in task order."""
    o_slot, o_start, o_n, o_serial = old_segs
    n_slot, n_start, _, n_serial = new_segs
    return _map_tasks(o_slot, o_start, o_n, o_serial, n_slot, n_start, n_serial, n_old)


@nb.njit(cache=True, nogil=True)
def _map_tasks(o_slot, o_start, o_n, o_serial, n_slot, n_start, n_serial, n_old):  # pragma: no cover
    """:func:`_task_map` in one compiled pass."""
    size = 1
    for x in o_slot:
        size = max(size, x + 1)
    for x in n_slot:
        size = max(size, x + 1)
    where = np.full(size, -1, np.int64)  # [slot] the segment's index in the new graph
    for i in range(n_slot.shape[0]):
        where[n_slot[i]] = i
    out = np.full(n_old, -1, np.int64)
    for s in range(o_slot.shape[0]):
        j = where[o_slot[s]]
        if j >= 0 and n_serial[j] == o_serial[s]:
            shift = n_start[j] - o_start[s]
            for t in range(o_start[s], o_start[s] + o_n[s]):
                out[t] = t + shift
    return out


def resume(old: TaskGraph, old_tl: Timeline, new: TaskGraph, below_s: float = math.inf) -> Timeline | Paused:
    """Simulate ``new`` reusing the prefix of ``old_tl`` that ``new`` cannot change.

    ``new`` must come from the same builder as ``old`` (its ``info["segments"]`` says which
    segments are shared). The result equals :func:`engine.sim.full.simulate` of ``new``.

    With ``below_s``, the loop stops as soon as the run is known to end at ``below_s`` or
    later (:data:`BOUND_MARGIN` above it): a task ended there, or a resource's work still to
    run ends there at the earliest (:func:`engine.sim.full.dispatch`); the :class:`Paused`
    state it returns then runs to the same timeline when asked (:meth:`Paused.finish`).
    """
    old_to_new = _task_map(old.info["segments"], new.info["segments"], old.num_tasks)
    ready_old = old_tl.extra["ready_s"]
    t_c = _first_change(old.succ_ptr, old.succ_idx, new.succ_ptr, new.succ_idx, new.chain_next, old_to_new,
                        ready_old, old_tl.end_s, old.dur_s, new.dur_s)
    # the prefix: old tasks that became ready strictly before t_c (all kept, by construction)
    n_res = new.n_devices + new.n_links
    start, end, ready, left, last, last_task, res_pred, order, done, initial = _restore(
        old_tl.order, ready_old, old_tl.start_s, old_tl.end_s, old_tl.resource_pred, old_to_new, t_c,
        new.succ_ptr, new.succ_idx, new.chain_next, new.chain_lag_s, new.npred, new.res_ptr, new.res_idx, n_res)
    state = Paused(new, start, end, ready, left, last, last_task, res_pred, order, done, int(done),
                   *ready_heap(_NO_RANK, ready, initial, new.num_tasks))
    if below_s < math.inf:
        bound = below_s * (1 + BOUND_MARGIN)
        rem, lb = _remaining(new.dur_s, new.res_ptr, new.res_idx, start, last)
        if lb >= bound:
            return state
        state.run(rem, bound)
        if state.h > 0:
            return state
    return state.finish()


#: :func:`resume` stops at ``below_s`` x (1 + this): the bound is a sum of the durations still to
#: run, added in another order than the loop adds them, so a run that ends just under
#: ``below_s`` is never stopped by its rounding (relative rounding of a sum of n terms is at most
#: n x 1.1e-16: 1e-10 at a million tasks)
BOUND_MARGIN = 1e-9

_NO_RANK = np.zeros(0)  # (FIFO by ready time: no static rank)


@nb.njit(cache=True, nogil=True)
def _remaining(dur, res_ptr, res_idx, start, last):  # pragma: no cover
    """Per resource, the seconds of work of its tasks not yet dispatched (``start`` NaN), and
    the earliest the run can end by them: max over resources of free time + that work."""
    rem = np.zeros(last.shape[0])
    for t in range(dur.shape[0]):
        if np.isnan(start[t]):
            for k in range(res_ptr[t], res_ptr[t + 1]):
                rem[res_idx[k]] += dur[t]
    lb = 0.0
    for q in range(last.shape[0]):
        if last[q] + rem[q] > lb:
            lb = last[q] + rem[q]
    return rem, lb


@dataclass
class Paused:
    """An event loop's state part way (:func:`resume` stopped at its bound): the task graph,
    the loop's arrays, the tasks dispatched (``done``; ``reused`` of them kept from the old
    timeline) and the ready heap (``hk``, ``hi``, ``h`` entries). :meth:`finish` runs it to
    the end: the timeline a whole run gives."""

    tasks: TaskGraph
    start: np.ndarray
    end: np.ndarray
    ready: np.ndarray
    left: np.ndarray
    last: np.ndarray
    last_task: np.ndarray
    res_pred: np.ndarray
    order: np.ndarray
    done: int
    reused: int
    hk: np.ndarray
    hi: np.ndarray
    h: int

    def run(self, rem: np.ndarray, bound: float) -> None:
        g = self.tasks
        self.done, self.h = dispatch(
            g.dur_s, g.res_ptr, g.res_idx, g.succ_ptr, g.succ_idx, g.chain_next, g.chain_lag_s, _NO_RANK, self.start,
            self.end, self.ready, self.left, self.last, self.last_task, self.res_pred, self.order, self.done, self.hk,
            self.hi, self.h, g.num_tasks + 1, rem, bound)

    def finish(self) -> Timeline:
        if self.h > 0:
            self.run(np.zeros(0), math.inf)
        tl = timeline_from(self.tasks, self.start, self.end, self.order[:self.done], self.res_pred, self.ready)
        tl.extra["reused_tasks"] = self.reused
        return tl


@dataclass(frozen=True)
class _Undo:
    """What :meth:`DeltaSimulator.change` replaced: the builder that made the task graph before
    it, that builder's state for the op (None when the change built a new builder, which
    leaves the old one untouched), the task graph and the timeline."""

    builder: TaskGraphBuilder
    snapshot: dict[str, Any] | None
    tasks: TaskGraph
    timeline: Timeline


class DeltaSimulator:
    """A strategy's task graph and timeline, edited one op's config at a time.

    A :meth:`change` can be undone by :meth:`revert` until the next change or a
    :meth:`commit`, which keeps it. Either way the task graph and timeline equal a full build
    and simulation of :attr:`strategy`, task for task.

    Two paths, one undo record: an ordinary change rebuilds the op's segments in place
    (FlexFlow's delta) and the undo record holds the builder's snapshot of them; with
    sequence parallelism a change builds a new builder from scratch (reductions then depend
    on their consumers) and the undo record holds the old builder itself, untouched.

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
    >>> _ = sim.change("fc8", Config({"feature": 2}, (0, 1))); sim.commit()
    >>> sim.strategy["fc8"].devices
    (0, 1)
    """

    def __init__(self, graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel | None = None,
                 cancel: Any = None) -> None:
        """``cancel`` (:func:`engine.errors.check_cancel`) stops the first build and simulation
        with :class:`~engine.errors.Cancelled`; later edits do not ask it."""
        self.graph, self.cluster = graph, cluster
        self.cost = cost or CostModel()
        self._builder = TaskGraphBuilder(graph, strategy, cluster, self.cost)  # no symmetry: edits break it
        self.tasks = self._builder.build(cancel=cancel)
        self._timeline: Timeline | Paused = simulate(self.tasks, cancel=cancel)
        self._undo: _Undo | None = None
        self._others: tuple = (None, set(), None)  # see _stage_problems

    @property
    def strategy(self) -> Strategy:
        return self._builder.strategy

    def check(self, op: str, config: Config) -> list:
        """Problems with giving ``op`` ``config`` (empty when valid): the op's own checks and,
        in a pipeline, the whole strategy's rule that stages own disjoint devices (the
        loader's verdict on the changed strategy, without re-checking every op)."""
        problems = check_config(self.graph[op], config, self.cluster, f"ops.{op}",
                                max(1, self.strategy.pipeline.microbatches))
        if not problems and self.strategy.pipeline.stages > 1:
            problems = self._stage_problems(op, config)
        return problems

    def _stage_problems(self, op: str, config: Config) -> list:
        s = self.strategy
        stage = s.stage_of.get(op)
        if stage is None:
            return []
        n = s.pipeline.stages
        key = (id(s), op)
        if self._others[0] != key:  # devices of the chunks on other stages (cached per strategy and op)
            others: set[int] = set()
            for name, cfg in s.configs.items():
                o = s.stage_of.get(name)
                if name != op and o is not None and o % n != stage % n:
                    others.update(cfg.devices)
            self._others = (key, others, s)  # (holding ``s`` keeps its id from being reused)
        shared = self._others[1].intersection(config.devices)
        if not shared:
            return []
        return [Problem(f"ops.{op}.devices", f"stage {stage} would share device(s) {sorted(shared)[:8]} with "
                                             "another pipeline stage (stages own disjoint devices)")]

    @property
    def timeline(self) -> Timeline:
        """The current strategy's timeline (a :meth:`trial` stopped at its bound is run to the end
        first)."""
        if isinstance(self._timeline, Paused):
            self._timeline = self._timeline.finish()
        return self._timeline

    def change(self, op: str, config: Config) -> Timeline:
        """Give ``op`` a new config and re-simulate; :meth:`revert` undoes the last change.

        Raises
        ------
        ValidationError
            When the config is not valid for the op (nothing changes then).
        """
        self._change({op: config}, math.inf)
        return self.timeline

    def trial(self, op: str, config: Config, below_s: float) -> float:
        """:meth:`change`, priced against a bound: the new iteration time (s) when it is under
        ``below_s``, else inf, the simulation stopped as soon as it is known to end at
        ``below_s`` or later (:func:`resume`; a search that keeps only a faster strategy needs no
        more). The change is made as by :meth:`change` (:meth:`revert` or :meth:`commit` it);
        :attr:`timeline`, when asked, is the whole run's."""
        return self.trial_configs({op: config}, below_s)

    def change_configs(self, configs: Mapping[str, Config]) -> Timeline:
        """:meth:`change` of several ops at once (``configs``: op -> its new config), one
        rebuild of the segments that read any of them and one resumed simulation: a search's
        class move (the forty time steps of an RNN layer given one config) is one edit, not
        forty. :meth:`revert` undoes all of it."""
        self._change(configs, math.inf)
        return self.timeline

    def trial_configs(self, configs: Mapping[str, Config], below_s: float) -> float:
        """:meth:`trial` of several ops at once (:meth:`change_configs`)."""
        self._change(configs, below_s)
        if isinstance(self._timeline, Paused):
            return math.inf
        t = self._timeline.makespan_s
        return t if t < below_s else math.inf

    def configs_to(self, strategy: Strategy) -> dict[str, Config] | None:
        """The op configs that take :attr:`strategy` to ``strategy`` (what
        :meth:`change_configs` needs), or None where ``strategy`` differs in more than op
        configs (its pipeline, stages, ZeRO, recomputation...: a new build)."""
        cur = self.strategy
        theirs = strategy.configs
        if theirs.keys() != cur.configs.keys():
            return None  # (another op set: not this graph's strategy to edit)
        if replace(strategy, configs=cur.configs, cost={}) != replace(cur, cost={}):
            return None
        return {name: c for name, c in theirs.items() if c != cur.configs[name]}

    def _change(self, configs: Mapping[str, Config], below_s: float) -> None:
        if not configs:
            raise ValueError("no op config to change")
        if len(configs) > 1 and self.strategy.pipeline.stages > 1 and \
                len({self.strategy.stage_of.get(op) for op in configs}) > 1:
            raise ValueError("ops of several pipeline stages in one edit: each is checked against the other "
                             "stages' devices as they are; change one stage's ops at a time")
        for op, config in configs.items():
            problems = self.check(op, config)
            if problems:
                raise ValidationError(problems, f"config for {op}")
        ops = list(configs)
        new_strategy = replace(self.strategy, configs={**self.strategy.configs, **configs}, cost={})
        if new_strategy.sequence_parallel:  # reductions then depend on consumers: a new builder
            undo = _Undo(self._builder, None, self.tasks, self.timeline)
            self._builder = TaskGraphBuilder(self.graph, new_strategy, self.cluster, self.cost)
            self.tasks = self._builder.build()
            self._timeline = simulate(self.tasks)
        else:  # the ops' segments rebuilt in place, the schedule resumed from the unchanged prefix
            undo = _Undo(self._builder, self._builder.snapshot(ops), self.tasks, self.timeline)
            self.tasks = self._builder.rebuild(new_strategy, ops)
            self._timeline = resume(undo.tasks, undo.timeline, self.tasks, below_s)
        self._undo = undo

    def commit(self) -> None:
        """Keep the last :meth:`change`: it can no longer be reverted (the state it replaced is
        let go)."""
        self._undo = None

    def revert(self) -> None:
        """Undo the last :meth:`change` (only the last one, and not after :meth:`commit`): the
        builder, task graph and timeline are again those from before it.

        Raises
        ------
        ValueError
            When there is no change to undo.
        """
        undo = self._undo
        if undo is None:
            raise ValueError("nothing to revert")
        if undo.snapshot is not None:  # the same builder: put the op's segments back
            undo.builder.restore(undo.snapshot)
        self._builder, self.tasks, self._timeline = undo.builder, undo.tasks, undo.timeline
        self._undo = None
