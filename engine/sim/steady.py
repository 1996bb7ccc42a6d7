"""A long pipeline's steady state, simulated once and extrapolated.

A 1F1B iteration of m microbatches is a warm-up, a steady state in which every stage runs one
forward and one backward per microbatch, and a cool-down (PipeDream-Flush; Narayanan et al.
SC'21 §2.2.1). In the steady state the simulated schedule repeats: every task of microbatch
j + q starts and ends a fixed time after the same task of microbatch j (q = 1, else q = p where
the schedule's steps alternate through the p microbatches in flight; q = p for the interleaved
schedule, whose units come in groups of p microbatches: :func:`steady_periods`). The simulation is
deterministic and a stage's future depends only on the microbatches in flight (at most p), so
once more than p microbatches in a row have each repeated exactly the one a period before,
every later one does, and the cool-down is the short run's shifted. This is checked on the
run, not assumed (ZeRO-3, whose parameter gathers wait for nothing and queue on the links
from the start, does not repeat, and is not tried). GPT-3 175B on
1,024 A100s (tp 8, pp 16, m = 192) repeats from microbatch 16 on, 158.207 ms a microbatch.

:func:`simulate_steady` gives tasks to the first ``microbatches_to_simulate`` microbatches only
(each still 1/m of the batch, :attr:`engine.taskgraph.context.BuildContext.split`), simulates
them, checks that the run repeats (every task's start, end and dependency-only earliest start,
for more than p microbatches in a row, to 1e-9 of the iteration) and extrapolates what is a sum or a time
over the iteration: the iteration time, each GPU's busy time, the bytes sent, the critical
path, the task count. The peak memory is the short run's: after the warm-up a stage holds the
same microbatches' activations in every period. Where the run does not repeat (or the plan is
one this does not apply to: GPipe, whose activations grow with m; mixture-of-experts layers,
whose all-to-all overlap is measured over the timeline; ZeRO-3; few microbatches) it returns None and
the caller simulates every microbatch.

The result's :class:`SteadyTimeline` holds the short run's per-task arrays (what the memory
report reads) and the whole iteration's totals; a timeline drawn task by task (the explorer's
Gantt chart, a trace) needs the full simulation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..costs import CostModel
from ..graph import OpGraph
from ..cluster import Cluster
from .full import Timeline, mirror, simulate
from ..strategy import Strategy
from ..taskgraph import BARRIER, BWD, FWD, UPDATE, TaskGraph, build_task_graph

__all__ = ["SteadyState", "SteadyTimeline", "microbatches_to_simulate", "short_runs", "runs_to_try", "steady_periods",
           "short_run", "why_not_extrapolated", "simulate_steady", "repeating", "TOLERANCE", "EXTRA_PERIODS"]

#: what a repeat may differ by, as a share of the simulated iteration's time (float rounding)
TOLERANCE = 1e-9
#: periods simulated beyond the warm-up, the cool-down and the p + 1 microbatches checked
EXTRA_PERIODS = 3


@dataclass(frozen=True)
class SteadyState:
    """How an iteration was extrapolated: ``simulated`` of ``microbatches`` given tasks; from
    microbatch ``first`` on, every ``period`` microbatches add ``period_s`` seconds to the
    iteration; ``checked`` microbatches were found to repeat, task for task, the one a period
    before."""

    simulated: int
    microbatches: int
    period: int
    period_s: float
    first: int
    checked: int

    def describe(self) -> str:
        per = "a microbatch" if self.period == 1 else f"every {self.period} microbatches"
        return (f"simulated {self.simulated} of {self.microbatches} microbatches; from microbatch {self.first} on "
                f"the schedule repeats ({self.checked} checked task for task), {self.period_s * 1e3:,.3f} ms {per}")


@dataclass
class SteadyTimeline(Timeline):
    """The short run's tasks (``start_s``, ``end_s``, ``order``: the simulated microbatches) and
    the whole iteration's totals: :attr:`makespan_s`, :attr:`device_busy_s` (so
    :attr:`utilization`), :attr:`comm_bytes`, :attr:`critical_path_s` and ``num_tasks``."""

    steady: SteadyState | None = None
    total_makespan_s: float = 0.0
    total_busy_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    total_comm_bytes: float = 0.0
    total_critical_path_s: float = 0.0
    num_tasks: int = 0

    @property
    def makespan_s(self) -> float:  # type: ignore[override]
        return self.total_makespan_s

    @property
    def device_busy_s(self) -> np.ndarray:  # type: ignore[override]
        return self.total_busy_s

    @property
    def comm_bytes(self) -> float:  # type: ignore[override]
        return self.total_comm_bytes

    @property
    def critical_path_s(self) -> float:  # type: ignore[override]
        return self.total_critical_path_s


def microbatches_to_simulate(graph: OpGraph, strategy: Strategy) -> tuple[int, int] | None:
    """(microbatches to simulate, microbatches a period) for ``strategy``'s first try (see
    :func:`short_runs`), or None where the steady state is not extrapolated."""
    runs = short_runs(graph, strategy)
    return runs[0] if runs else None


def short_runs(graph: OpGraph, strategy: Strategy) -> list[tuple[int, int]]:
    """The short runs to try, in order, as (microbatches to simulate, microbatches a period):
    none where the steady state is not extrapolated: GPipe over several stages (no period:
    :func:`steady_periods`), a mixture-of-experts model, ZeRO-3 (each microbatch's parameter
    gathers wait for nothing and queue on the links from the start: the run never repeats, and
    the short run would be simulated for nothing), or fewer than twice the microbatches it
    would simulate. The periods are :func:`steady_periods`'."""
    pipe = strategy.pipeline
    p, v, m = max(1, pipe.stages), max(1, pipe.virtual_stages), max(1, pipe.microbatches)
    if why_not_extrapolated(graph, strategy) is not None:  # (MoE, ZeRO-3, GPipe: in words there)
        return []
    return runs_to_try(p, v, pipe.schedule, m)


def runs_to_try(p: int, v: int, schedule: str, m: int) -> list[tuple[int, int]]:
    """(microbatches to simulate, period to check) in the order tried, for a pipeline of ``p``
    stages, ``v`` chunks each, ``m`` microbatches: each of :func:`steady_periods`' periods
    with its :func:`short_run`. Where the first run, lengthened by at most p + 1 microbatches,
    holds p + 2 periods of p (enough to check a period of p, and to unfold it:
    :mod:`engine.sim.unfold` pairs three periods around its cut), it is lengthened and tried
    for both (two entries with the same microbatches: one run, simulated once). In practice
    that is p = 2: 12 microbatches instead of 9, then 14. LLaMA-2 7B with tp 8, pp 2 on 64
    A100s repeats every 2 microbatches, not every one; before, it was simulated twice."""
    periods = steady_periods(p, v, schedule)
    runs = [(n, q) for q in periods if (n := short_run(p, q, m)) is not None]
    if periods == (1, p) and runs and runs[0][1] == 1:
        lo = 2 * p + (p + 2) * p  # (warm-up, p + 2 periods of p, cool-down)
        n = lo + (m - lo) % p  # (m - n: whole periods)
        if n - runs[0][0] <= p + 1 and m >= 2 * n:
            runs[:1] = [(n, 1), (n, p)]
    return runs


def why_not_extrapolated(graph: OpGraph, strategy: Strategy) -> str | None:
    """Why :func:`short_runs` tries no short run for ``strategy`` whatever its microbatches, in
    words (what it reads to say none: a mixture-of-experts model, ZeRO-3, GPipe over several
    stages); None where it tries one, or where only the microbatches are too few for a short
    run to save anything (nothing worth saying)."""
    pipe = strategy.pipeline
    if any(op.attrs.get("num_experts") for op in graph.ops):
        return "a mixture-of-experts model: its all-to-alls' overlap is measured over the whole timeline"
    if strategy.zero_stage >= 3:
        return "ZeRO-3: each microbatch's parameter gathers wait for nothing and never repeat"
    if pipe.stages > 1 and pipe.schedule == "gpipe":
        return "GPipe: every forward runs before the first backward, so no period repeats"
    return None


def steady_periods(p: int, v: int, schedule: str) -> tuple[int, ...]:
    """The periods, in microbatches, a pipeline of ``p`` stages (``v`` chunks each) is checked
    to repeat with, in order: p for the interleaved schedule (its units come in groups of p
    microbatches); else 1, then p. A schedule can repeat every p microbatches and not every
    one (LLaMA-2 7B, tp 8 on 64 A100s: at pp 2 each microbatch's tasks run 90.215 ms after the
    one before, then 91.257 ms, in turn; pp 4 repeats every 4); every task is checked either
    way. None for GPipe over several stages: its activations grow with
    the microbatches, and its forwards all run before its backwards."""
    if p > 1 and schedule == "gpipe":
        return ()
    if p > 1 and v > 1 and schedule == "interleaved":
        return (p,)
    return (1, p) if p > 1 else (1,)


def short_run(p: int, q: int, m: int) -> int | None:
    """Microbatches a short run of a ``p``-stage pipeline simulates to check a period of ``q``
    (the warm-up, up to p; p + 1 periods to check; the cool-down, up to p; a few periods to
    spare), or None when the iteration's ``m`` microbatches are fewer than twice that or do not
    end on a whole period."""
    n = 2 * p + (p + EXTRA_PERIODS) * q
    return n if m >= 2 * n and (m - n) % q == 0 else None


def _repeat(times: np.ndarray, rows: np.ndarray, q: int, tol: float) -> tuple[int, int, float] | None:
    """(first microbatch, how many, shift) of the longest run of microbatches j whose every
    task's ``times`` is microbatch j + q's less one shift (``rows``: [microbatch, task] ids
    paired across microbatches), or None."""
    t = times[rows]
    d = t[q:] - t[:-q]  # [j, task]
    lo, hi = d.min(axis=1), d.max(axis=1)
    ok = (hi - lo) <= tol
    best: tuple[int, int, float] | None = None
    j = 0
    while j < ok.size:
        if not ok[j]:
            j += 1
            continue
        k = j
        while k + 1 < ok.size and ok[k + 1] and abs(lo[k + 1] - lo[j]) <= tol:
            k += 1
        if best is None or k - j + 1 > best[1]:
            best = (j, k - j + 1, float(lo[(j + k) // 2]))
        j = k + 1
    return best


def _paired_rows(tg: TaskGraph, n: int) -> tuple[int, np.ndarray] | None:
    """(first microbatch, [microbatch, task] ids) of the microbatches around the middle whose
    tasks are alike: row i the tasks of microbatch first + i in task order, which pairs the
    same task of every microbatch (each segment emits its microbatches' tasks alike). The
    first and last microbatches may hold more (a ZeRO parameter gather before the first); None
    when fewer than half are alike in number, op, kind, partition, place and duration."""
    ids = np.flatnonzero(tg.mb >= 0)
    counts = np.bincount(tg.mb[ids], minlength=n)
    if counts.size != n:
        return None
    mid = n // 2
    same = counts == counts[mid]
    lo = mid + 1 - int(np.argmin(np.append(same[mid::-1], False)))  # the run of equal counts around mid
    hi = mid + int(np.argmin(np.append(same[mid:], False)))
    if counts[mid] == 0 or 2 * (hi - lo) < n:
        return None
    keep = ids[(tg.mb[ids] >= lo) & (tg.mb[ids] < hi)]
    rows = keep[np.argsort(tg.mb[keep], kind="stable")].reshape(hi - lo, -1)
    for col in (tg.op, tg.kind, tg.part, tg.device, tg.link, tg.coll, tg.dur_s):
        a = col[rows]
        if not np.array_equal(a, np.broadcast_to(a[0], a.shape)):
            return None
    return lo, rows


def repeating(tg: TaskGraph, tl: Timeline, n: int, p: int, q: int) -> tuple[int, int, float, float, np.ndarray] | None:
    """Whether a run of ``n`` microbatches repeats (see the module): (first microbatch from which
    it does, microbatches checked, seconds a period, the critical path's seconds a period,
    [microbatch, task] paired rows), or None. More than ``p`` microbatches in a row must repeat
    the one ``q`` before, in every task's start, end and dependency-only earliest start."""
    paired = _paired_rows(tg, n)
    if paired is None:
        return None
    lo, rows = paired
    tol = TOLERANCE * tl.makespan_s
    found = []
    for times in (tl.start_s, tl.end_s, tl.earliest_starts_s):
        r = _repeat(times, rows, q, tol)
        if r is None or r[1] < p + 1:
            return None
        found.append(r)
    (first, checked, shift), ends, (_, _, cp_shift) = found
    if ends[0] != first or ends[1] != checked or abs(ends[2] - shift) > tol:
        return None
    return first + lo, checked, shift, cp_shift, rows


def simulate_steady(graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel | None = None, *,
                    symmetry: str = "auto", max_tasks: int | None = None,
                    cancel: Any = None) -> tuple[TaskGraph, SteadyTimeline] | None:
    """The short run's task graph and its timeline with the whole iteration's totals (see the
    module), or None where the steady state is not extrapolated or the run does not repeat.
    ``symmetry``, ``max_tasks``, ``cancel``: as :func:`engine.taskgraph.build_task_graph`'s."""
    pipe = strategy.pipeline
    m, p, v = pipe.microbatches, max(1, pipe.stages), max(1, pipe.virtual_stages)
    tg, tl, built = None, None, 0
    for n, q in short_runs(graph, strategy):
        if n != built:  # (a run checked for two periods is built once)
            built = n
            tg = build_task_graph(graph, strategy, cluster, cost, symmetry=symmetry, max_tasks=max_tasks,
                                  cancel=cancel, microbatches=n)
            tl = simulate(tg, cancel=cancel)
        found = repeating(tg, tl, n, p, q)
        if found is not None:
            return _extrapolated(tg, tl, found, n, q, m, v)
    return None


def _extrapolated(tg: TaskGraph, tl: Timeline, found: tuple, n: int, q: int, m: int,
                  v: int) -> tuple[TaskGraph, SteadyTimeline]:
    """The short run ``tg`` / ``tl`` of ``n`` microbatches, found to repeat every ``q``
    (:func:`repeating`'s ``found``), with the totals of all ``m``."""
    first, checked, shift, cp_shift, rows = found
    span, est = tl.makespan_s, tl.earliest_starts_s
    sent = tg.info["comm_by_microbatch"]  # [microbatch] bytes; one alike microbatch's, extrapolated
    more = (m - n) // q  # periods the whole iteration has beyond the short run
    on_dev = (tg.kind == FWD) | (tg.kind == BWD) | (tg.kind == UPDATE)
    one = on_dev & (tg.mb == first)  # one microbatch's compute (all alike)
    busy_mb = mirror(np.bincount(tg.device[one], weights=tg.dur_s[one], minlength=tg.n_devices), tg)
    bars = int(np.count_nonzero(tg.kind == BARRIER))
    units = 2 * n * v  # each device's barriers: units - 1
    bar_devices = bars // (units - 1) if bars else 0
    steady = SteadyState(n, m, q, shift, first, checked)
    out = SteadyTimeline(
        tasks=tg, start_s=tl.start_s, end_s=tl.end_s, order=tl.order, resource_pred=tl.resource_pred,
        extra={**tl.extra, "steady": steady}, steady=steady,
        total_makespan_s=span + more * shift,
        total_busy_s=tl.device_busy_s + (m - n) * busy_mb,
        total_comm_bytes=tg.comm_bytes + (m - n) * float(sent[first]),
        total_critical_path_s=(float(np.max(est + tg.dur_s)) + more * cp_shift),
        num_tasks=tg.num_tasks + (m - n) * rows.shape[1] + bar_devices * 2 * (m - n) * v)
    return tg, out
