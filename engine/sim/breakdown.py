"""What an iteration's time is made of: the critical chain (the tasks that set the iteration
time, :attr:`engine.sim.full.Timeline.critical_tasks`) split by what each task is (issue 44).

Each share is the chain's summed task time of that kind over the iteration (the simulated
part's makespan where a steady state was extrapolated), so a share is time the iteration
waits on that kind of work: communication hidden under compute is not on the chain and counts
nowhere. The kinds, from the task graph alone:

* ``compute``: forward and backward kernels;
* ``tensor / sequence / context-parallel collectives``: collectives inside a layer, per
  microbatch (ZeRO-3's weight gathers too), other than all-to-alls;
* ``expert all-to-alls``: the mixture-of-experts dispatch and combine;
* ``gradient synchronisation``: per-iteration collectives (data-parallel all-reduces, ZeRO's
  reduce-scatters and all-gathers);
* ``transfers``: point-to-point sends (pipeline stages, and moves between ops whose split or
  devices differ);
* ``optimizer step``; and ``other``: what is left (gaps, a transfer's hops overlapping, offload).
"""

from __future__ import annotations

import numpy as np

from ..taskgraph import BWD, COLL, COLL_INDEX, FWD, UPDATE, XFER

__all__ = ["critical_breakdown", "chain_seconds", "BREAKDOWN_KINDS"]

#: the kinds of :func:`critical_breakdown`, in the order they are shown
BREAKDOWN_KINDS = ("compute", "tensor / sequence / context-parallel collectives", "expert all-to-alls",
                   "gradient synchronisation", "transfers", "optimizer step", "other")


def chain_seconds(timeline) -> dict[str, float]:
    """Seconds of each kind's tasks on the critical chain (:data:`BREAKDOWN_KINDS` but ``other``)."""
    tg, crit = timeline.tasks, timeline.critical_tasks
    dur, kind, mb = tg.dur_s[crit], tg.kind[crit], tg.mb[crit]
    a2a = tg.coll[crit] == COLL_INDEX["all_to_all"]
    masks = {"compute": (kind == FWD) | (kind == BWD),
             "tensor / sequence / context-parallel collectives": (kind == COLL) & (mb >= 0) & ~a2a,
             "expert all-to-alls": (kind == COLL) & (mb >= 0) & a2a,
             "gradient synchronisation": (kind == COLL) & (mb < 0),
             "transfers": kind == XFER,
             "optimizer step": kind == UPDATE}
    return {name: float(np.sum(dur[m])) for name, m in masks.items()}


def critical_breakdown(timeline) -> dict[str, float]:
    """Each kind's share of the iteration on the critical chain (:data:`BREAKDOWN_KINDS`; the
    shares sum to 1, ``other`` taking what the kinds leave, never below 0)."""
    out = dict.fromkeys(BREAKDOWN_KINDS, 0.0)
    crit = timeline.critical_tasks
    if crit.size == 0:
        return out
    # the simulated tasks' own span (a steady-state report's timeline holds the simulated
    # microbatches only; its iteration time is extrapolated)
    span = float(timeline.end_s[crit[-1]])
    if span <= 0:
        return out
    out.update({k: v / span for k, v in chain_seconds(timeline).items()})
    total = sum(out.values())
    if total > 1.0:  # (a transfer's hops overlap on the chain: scale to the iteration)
        out = {k: v / total for k, v in out.items()}
    out["other"] = max(0.0, 1.0 - sum(out.values()))
    return out
