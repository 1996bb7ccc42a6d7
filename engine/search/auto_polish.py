"""``auto``'s polish stage (:mod:`engine.search.auto`): greedy coordinate descent over single-op
configs (:mod:`engine.search.polish`) from the best start priced so far, its time allocated by
:class:`PolishSlices`, and which start comes first. The stage reads and
fills auto's state (its ``found``, notes, budget and pricing times)."""

from __future__ import annotations

import math
import time
from typing import Any

from ..errors import TooLargeError
from ..strategy import Strategy
from .api import Price, Progress
from .chains import delta_affordable
from .keys import strategy_key
from .polish import PolishResult, coordinate_descent

__all__ = ["polish", "polish_from", "best_start", "ms_text", "PolishSlices", "POLISH_SHARE", "POLISH_MAX_SHARE"]

#: with a time budget, the share of what is left after the seeds that the polish (greedy
#: coordinate descent, :mod:`engine.search.polish`) takes first; it stops earlier at a
#: local optimum. Measured at 15 s (issue 28): AlexNet reaches MCMC's 150 s answer within 1 s of
#: polish on p100-4x4; on NMT a polished candidate costs ~0.1 s and with half MCMC fell 0.5%
#: behind (72.04 ms against 71.66), with a quarter it reaches 71.66 again
POLISH_SHARE = 0.25

#: with a time budget, the most of what is left after the seeds that the polish takes while each
#: further slice as long as its first share makes the best faster (:class:`PolishSlices`); MCMC
#: gets the rest. On RNNTC / p100-4x4 (issue 28) the descent from FlexFlow's expert strategy finds
#: faster strategies 9-12 s in, where a quarter stopped it at 30.0 ms and MCMC found nothing more
POLISH_MAX_SHARE = 0.75


#: with a time budget, the fewest candidates a polish slice prices before it is judged (while
#: under the cap): a slice of slow candidates otherwise ended after a few dozen
MIN_SLICE_EVALS = 50


def polish(a: Any) -> None:
    """Greedy coordinate descent over single-op configs (:mod:`engine.search.polish`) from
    the best priced so far, where it fits; with a time budget it takes POLISH_SHARE of what
    is left and more slices while they pay (:class:`PolishSlices`), with a number budget
    that many candidates. Where a delta simulator of it is not affordable, the descent's
    global pass alone runs (ZeRO, the microbatches, recomputation... each priced whole):
    NMT / k80-16x4's expert strategy (3.95 M tasks) goes from 100.98 to 98.85 ms with
    ZeRO-2, the best known there (issue 43).

    With a time budget, when the descent from the best made nothing faster, the next best
    start that fits gets what is left on the same rule. On NMT / dgx-a100-40gb:8 the expert
    strategy (25.56 ms) prices in 2.4 s and its descent priced 2 candidates in 3.8 s; from
    data parallelism (41.35 ms, 0.5 s) the descent reaches 17.89 ms in 9 s (issue 43).

    When the best has no affordable delta simulator (its descent can only try the global
    kinds, each priced whole) and another start has one, the descent runs from that one
    first, and from the best only when it ends slower than the best. NMT / k80-16x4: the
    expert strategy (100.98 ms, 3.95 M tasks) took 8.8 s for 5 candidates (98.85 ms, ZeRO-2);
    from data parallelism the descent's class moves reach 70.02 ms (issue 43)."""
    first = best_start(a.found)
    key = strategy_key(first[1])  # (a seed may return a baseline's strategy: not a second start)
    rest = {n: v for n, v in a.found.items()
            if n not in (first[0], "polish") and v[1].feasible and strategy_key(v[0]) != key}
    graph, cluster = a.graph, a.cluster
    # (each start's task count estimated only where the best's descent could not edit op by op)
    editable = {} if delta_affordable(graph, first[1], cluster) else \
        {n: v for n, v in rest.items() if delta_affordable(graph, v[0], cluster)}
    if editable:
        # (from the best, the descent's global pass alone could run: first from the best it can edit op by op)
        pr = polish_from(a, *best_start(editable))
        if pr is not None and pr.cost_s < a.found[first[0]][1].cost_s:
            return
        polish_from(a, *first)
        return
    pr = polish_from(a, *first)
    if pr is None or a.budget.seconds is None or pr.improvements:
        return
    if rest:
        polish_from(a, *best_start(rest))


def polish_from(a: Any, start_name: str, start: Strategy) -> PolishResult | None:
    """One descent of :func:`polish` from ``start`` (None when it did not run or stopped
    without an answer)."""
    graph, cluster, budget = a.graph, a.cluster, a.budget
    left = None if budget.seconds is None else budget.seconds - (time.perf_counter() - a.t0)
    took = a.price_s.get(id(start), a.slowest_price)
    # (a delta simulator costs about two pricings to set up; without one each global candidate
    # is one pricing: room for one, and for MCMC's set-up after it)
    room = left is None or (POLISH_SHARE * left > 2 * took if delta_affordable(graph, start, cluster)
                            else left > 2 * took)
    if a.cancelled or not a.opts.refine or not a.found[start_name][1].feasible or not room:
        return None
    a.stage = "polish"
    t = time.perf_counter()
    # (where MCMC's set-up from the baselines alone would not fit in what the polish leaves it, no
    # time is kept for it: the slices may run to the end of the budget, and go on once the descent
    # has made its start faster at all)
    baselines = [a.found[n][0] for n in ("data-parallel", "expert") if n in a.found]
    most = POLISH_MAX_SHARE if left is None or (1 - POLISH_MAX_SHARE) * left >= a.mcmc_setup_s(baselines) else 1.0
    slices = None if left is None else PolishSlices(t, left, a.found[start_name][1].cost_s, POLISH_SHARE, most,
                                                    keep_going=most == 1.0)
    # (asked before every candidate: a slice that made nothing faster ends the polish, MCMC gets the rest)
    until = None if slices is None else \
        lambda r: slices.go_on(time.perf_counter(), r.cost_s, r.first_round, r.pending_s, r.evals)

    def tick(r: PolishResult) -> bool:
        if r.cost_s < a.best_cost:
            a.consider("polish", r.strategy, Price(r.cost_s, True))
        return a.report(Progress(r.evals, 0.0, a.best_cost, a.best_cost, 0.0))

    try:
        pr = coordinate_descent(graph, cluster, start, a.cost_model, max_evals=budget.iterations,
                                deadline=None if slices is None else slices.cap, tick=tick, until=until)
    except (TooLargeError, ValueError, MemoryError) as e:  # (what was priced before it is kept)
        a.notes.append(f"polish: stopped without an answer: {str(e)[:200]}")
        return None
    if "polish" not in a.found or pr.cost_s < a.found["polish"][1].cost_s:
        a.consider("polish", pr.strategy, Price(pr.cost_s, True))
    a.proposals += pr.evals
    a.notes.append(f"polish (coordinate descent) from {start_name}: {ms_text(Price(pr.cost_s, True))}, "
                      f"{pr.evals} candidates in {pr.rounds} rounds in {time.perf_counter() - t:.1f} s"
                      + (" (a local optimum)" if pr.finished else ""))
    return pr


def best_start(found: dict[str, tuple[Strategy, Price]]) -> tuple[str, Strategy]:
    """The fastest that fits; when none fits, the fastest (the least bad)."""
    name = min(found, key=lambda n: (not found[n][1].feasible, found[n][1].time_s))
    return name, found[name][0]


def ms_text(p: Price) -> str:
    """``12.3 ms``, with ``(does not fit)`` when over memory."""
    return f"{p.time_s * 1e3:.1f} ms" + ("" if p.feasible else " (does not fit)")


class PolishSlices:
    """The polish's time under a time budget, allocated by measured improvement: a first slice of
    ``share`` x ``left_s`` from ``start``, then further slices of that length while the slice
    before made the best strictly faster, never past ``max_share`` x ``left_s``. The first round
    is not judged before it has visited every op, when at its pace it ends under that cap: an op
    not yet visited has not been tried at all (on RNNTC / ``p100-4x4``, from FlexFlow's expert
    strategy, the round's last two ops take 30.0 to 29.8 ms, at 6.9 s of its 7.4 s). Nor is a
    slice that has priced fewer than :data:`MIN_SLICE_EVALS` candidates (``evals``, counted
    from the slice's start; under the cap), once the descent has made its start faster: where a
    candidate costs 0.1 s (NMT and RNNLM on 16 and 64 GPUs) a slice of 2-3 s held 20-30 of them,
    and the polish gave MCMC the rest of the budget, where MCMC found nothing (issue 43). A
    start never made faster is judged at its slice's end as before (the next start, or MCMC,
    gets the time: on NMT / ``dgx-a100-40gb:8`` the expert strategy's descent, whole pricings
    only, then gives way to the one from data parallelism).

    >>> c = PolishSlices(start=0.0, left_s=12.0, cost_s=10.0, share=0.25, max_share=0.75)
    >>> c.slice_s, c.cap
    (3.0, 9.0)
    >>> c.go_on(2.9, 9.0), c.go_on(3.0, 9.0), c.end     # improved in the first slice: a second
    (True, True, 6.0)
    >>> c.go_on(6.2, 9.0)                                 # nothing better in the second: stop
    False
    >>> c = PolishSlices(start=0.0, left_s=12.0, cost_s=10.0, share=0.25, max_share=0.75)
    >>> c.go_on(3.0, 10.0, first_round=0.5)               # round 1 half done: it would end at 6 s
    True
    >>> c.go_on(3.0, 10.0, first_round=0.25)              # ... at 12 s, past the cap: judged
    False
    >>> c = PolishSlices(start=0.0, left_s=12.0, cost_s=10.0, share=0.25, max_share=0.75)
    >>> c.go_on(3.0, 9.0, evals=60), c.end               # faster in the first slice: a second, from 60
    (True, 6.0)
    >>> c.go_on(6.0, 9.0, evals=80), c.go_on(6.5, 9.0, evals=110)  # judged at its 50th candidate
    (True, False)
    >>> c = PolishSlices(start=0.0, left_s=12.0, cost_s=10.0, share=0.25, max_share=0.75)
    >>> c.go_on(3.0, 10.0, evals=20)                      # never faster: judged, few candidates or not
    False

    ``keep_going`` (where nothing after the polish would use the time): a slice that made
    nothing faster is followed by another, up to the cap, once the descent has made its start
    faster at all; one that never has still ends at its first slice (the next start gets the
    time). On NMT / ``dgx-a100-40gb:8`` the descent from data parallelism spent a slice on the
    embeddings' candidates (0.4 s each, after the output layer's class move) and stopped at
    15.4 ms with 2.9 s of the budget left and MCMC's set-up 5.3 s (issue 43).

    >>> c = PolishSlices(start=0.0, left_s=12.0, cost_s=10.0, share=0.25, max_share=1.0, keep_going=True)
    >>> c.go_on(3.0, 10.0)                                # nothing faster yet: ends
    False
    >>> c = PolishSlices(start=0.0, left_s=12.0, cost_s=10.0, share=0.25, max_share=1.0, keep_going=True)
    >>> c.go_on(3.0, 9.0), c.go_on(6.0, 9.0), c.go_on(9.0, 9.0), c.end  # faster once: on to the cap
    (True, True, True, 12.0)
    """

    def __init__(self, start: float, left_s: float, cost_s: float, share: float, max_share: float,
                 keep_going: bool = False) -> None:
        self.start = start
        self.slice_s = share * left_s
        self.end = start + self.slice_s
        self.cap = start + max(share, max_share) * left_s
        self.mark = cost_s  # the best when the current slice began
        self.first = cost_s  # the start's
        self.keep_going = keep_going
        self.evals_mark = 0

    def go_on(self, now: float, cost_s: float, first_round: float | None = None,
              pending_s: float = math.inf, evals: int | None = None) -> bool:
        """Whether the polish goes on at ``now`` with its best at ``cost_s``; ``first_round``:
        the share of the first round's ops visited so far (None: past the first round);
        ``pending_s``: a faster time the op visit under way has priced and not taken yet
        (:attr:`PolishResult.pending_s`), counted as the slice's improvement (on RNNLM /
        ``dgx-a100-40gb:8`` the first slice ended inside the first op's visit, before its class
        move, 12.08 -> 7.34 ms in 4.9 s: auto kept 10.56 ms)."""
        if now < self.end:
            return True
        if first_round is not None and 0 < first_round < 1 and \
                self.start + (now - self.start) / first_round <= self.cap:
            return True  # (the first round, at its pace, ends under the cap)
        best = min(cost_s, pending_s)
        if evals is not None and evals - self.evals_mark < MIN_SLICE_EVALS and now < self.cap and \
                best < self.first * (1 - 1e-12):
            return True  # (too few candidates priced in this slice to judge it; a start never made faster is judged)
        paid = best < self.mark * (1 - 1e-12) or (self.keep_going and best < self.first * (1 - 1e-12))
        if paid and self.end < self.cap:
            self.mark, self.end = best, min(max(self.end, now) + self.slice_s, self.cap)
            self.evals_mark = self.evals_mark if evals is None else evals
            return now < self.end
        return False
