"""Pipeline schedules: the order of forward and backward units on each stage, and the barrier
edges that hold every device to it."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .context import BuildContext, OpTables
from .segments import Segment
from .tasks import BWD, FWD

__all__ = ["schedule_order", "unit_order", "SchedulePlan"]


def schedule_order(schedule: str, p: int, v: int, m: int, stage: int) -> list[tuple[int, int, int]]:
    """Order of (model chunk on this stage, microbatch, phase) units on pipeline ``stage``.

    GPipe: all forwards, then all backwards (Huang et al. 2019). 1F1B: ``p - stage - 1``
    warm-up forwards, then one forward and one backward alternately, then the remaining
    backwards (PipeDream-Flush; Narayanan et al. SC'21 §2.2.1). Interleaved: Megatron-LM's
    schedule over ``v`` chunks per stage (SC'21 §2.2.2), warm-up of
    ``(p - stage - 1) * 2 + (v - 1) * p`` forward units.

    >>> schedule_order("1f1b", 2, 1, 3, 0)
    [(0, 0, 0), (0, 1, 0), (0, 0, 1), (0, 2, 0), (0, 1, 1), (0, 2, 1)]
    """
    if schedule == "gpipe":
        return [(0, mb, FWD) for mb in range(m)] + [(0, mb, BWD) for mb in range(m)]
    if schedule == "1f1b" or v == 1:
        warm = min(p - stage - 1, m)
        out = [(0, mb, FWD) for mb in range(warm)]
        for i in range(m - warm):
            out += [(0, warm + i, FWD), (0, i, BWD)]
        out += [(0, mb, BWD) for mb in range(m - warm, m)]
        return out
    total = m * v

    def unit(k: int, forward: bool) -> tuple[int, int, int]:
        group = k // (p * v)
        chunk = (k % (p * v)) // p
        if not forward:
            chunk = v - 1 - chunk
        return (chunk, group * p + k % p, FWD if forward else BWD)

    warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
    out = [unit(k, True) for k in range(warm)]
    for i in range(total - warm):
        out += [unit(warm + i, True), unit(i, False)]
    out += [unit(k, False) for k in range(total - warm, total)]
    return out


def unit_order(schedule: str, p: int, v: int, m: int, stage: int) -> list[tuple[int, int, int]]:
    """The order a task graph runs ``stage``'s (model chunk, microbatch, phase) units in: the
    schedule's (:func:`schedule_order`) over several stages; with one stage, each microbatch's
    forward then its backward, whatever the schedule (nothing downstream to keep busy).

    >>> unit_order("gpipe", 1, 1, 2, 0)
    [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    """
    return schedule_order(schedule, p, v, m, stage) if p > 1 else [(0, k, ph) for k in range(m) for ph in (FWD, BWD)]


class SchedulePlan:
    """Where each (model chunk, microbatch, phase) unit falls in its stage's schedule.

    Every device gets a chain of ``units - 1`` zero-duration barrier tasks between its
    ``units`` schedule units (segment ("barriers", device)); an op's *source* tasks of a unit
    (no producer in the same model chunk) wait for the barrier before it, and its *sink*
    tasks (no consumer in the chunk) feed the barrier after it: every other task of the unit
    is ordered through them by data dependencies. In the backward pass the roles swap, and a
    unit ends at ops whose producers have no backward. With one stage and one microbatch
    there is nothing to order (``units == 0``)."""

    def __init__(self, ctx: BuildContext) -> None:
        pipe = ctx.strategy.pipeline
        p, v, m = max(1, pipe.stages), max(1, pipe.virtual_stages), ctx.microbatches
        self.stages = p
        self.units = 0
        if m == 1 and p == 1:
            return
        g = ctx.graph
        self.chunk_of = np.array([ctx.strategy.stage_of.get(op.name, 0) for op in g.ops], np.int64)  # [op]
        n = len(g.ops)
        self.has_prod, self.has_cons, self.has_bwd_prod = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
        for (pi, _, ci, _) in g.edges:
            if self.chunk_of[pi] == self.chunk_of[ci]:
                self.has_cons[pi] = True
                self.has_prod[ci] = True
                if g.ops[pi].kind != "input":
                    self.has_bwd_prod[ci] = True
        self.units = 2 * m * v
        self.rank = np.full((p, v, m, 2), -1, np.int64)  # [stage, chunk, mb, phase] position in the order
        for stage in range(p):
            for r, (lc, k, ph) in enumerate(unit_order(pipe.schedule, p, v, m, stage)):
                self.rank[stage, lc, k, ph] = r

    def meets_barriers(self, oi: int, tables: OpTables) -> bool:
        """Whether :meth:`edges` links op ``oi``'s tasks to its devices' barriers (it then
        asks for each device's barrier chain)."""
        if not self.units:
            return False
        return any(oi in table and any(self._roles(oi, phase))
                   for phase, table in ((FWD, tables.fwd), (BWD, tables.bwd)))

    def _roles(self, oi: int, phase: int) -> tuple[bool, bool]:
        """(source, sink): whether op ``oi``'s tasks of ``phase`` wait for the barrier before
        their unit (no producer in the chunk) and feed the one after it (no consumer)."""
        if phase == FWD:
            return not self.has_prod[oi], not self.has_cons[oi]
        return not self.has_cons[oi], not self.has_bwd_prod[oi]

    def edges(self, seg: Segment, oi: int, tables: OpTables, barriers_of: Callable[[int], np.ndarray]) -> None:
        """Edges between op ``oi``'s source/sink tasks and its devices' barriers
        (``barriers_of(device)``: the device's ``units - 1`` barrier handles)."""
        if not self.units:
            return
        p = self.stages
        chunk = int(self.chunk_of[oi])
        stage, local = chunk % p, (chunk // p if p > 1 else 0)
        keep = np.nonzero(tables.rep[oi])[0]
        devs = tables.devs[oi][keep]
        for phase, table in ((FWD, tables.fwd), (BWD, tables.bwd)):
            if oi not in table:
                continue
            is_src, is_snk = self._roles(oi, phase)
            if not (is_src or is_snk):
                continue
            r = self.rank[stage, local, :, phase]  # [mb]
            tasks = table[oi][:, keep]  # [mb, rep part]
            bars = np.stack([barriers_of(int(d)) for d in devs], axis=1)  # [units - 1, rep part]
            cols = np.arange(devs.size)[None, :]
            if is_snk:
                ok = r < self.units - 1
                seg.edges(tasks[ok], bars[r[ok][:, None], cols])
            if is_src:
                ok = r > 0
                seg.edges(bars[r[ok][:, None] - 1, cols], tasks[ok])
