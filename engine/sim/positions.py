"""Which reference unit stands for each unit of a composed pipeline: position classes (issue 43).

A unit (one stage's forward or backward of one microbatch, of one model chunk) is composed from
the block of a reference unit in the same *position class*. Two rules, the first that the
reference bears out:

* **coarse**: the first, a middle or the last microbatch; the first, a middle (by its place in
  a node and its layer count: :class:`engine.sim.composed.StagePlan`) or the last stage; the
  chunk; the phase. Every middle microbatch is composed from the reference's second.
* **fine**, where the coarse classes do not hold alike blocks or a block names another
  microbatch's transfer (the coarse rule names transfers by microbatch): the coarse class less the
  middle microbatches, plus the phases of the units just before and after it in its stage's
  schedule (a forward in the warm-up follows a forward; in the steady state, a backward).
  A transfer a block names is then named by the unit of its own stage it comes from or goes
  into, as a step in that stage's schedule (a backward that waits, on the links it shares,
  for the forward transfer of the microbatch p - 1 later meets "the transfer out of the unit
  before me", which is that transfer in every pipeline). A unit whose class the reference
  does not hold is not composed from it (:class:`NoCounterpart`): :func:`engine.sim.hier.predict_layout`
  then tries a reference of two more stages, whose middle stages hold more of a warm-up.

Either way every reference unit in one class must have the same block, entry for entry
(:meth:`Positions._check_classes`): else a unit of the whole run would meet what its template
never met (e.g. gradient collectives of an interleaved schedule's earlier chunk under a later
unit). The mixin reads the reference's naming made by :class:`engine.sim.unroll._Unroll`.
"""

from __future__ import annotations

import numpy as np

from ..taskgraph import FWD
from .composed import mb_type, ranks

__all__ = ["Positions", "PositionProblem", "NoCounterpart", "RULES"]

#: the rules tried, in order: coarse (False), then fine (True)
RULES = (False, True)


class PositionProblem(Exception):
    """No position-class rule the reference bears out (the message says where it fails)."""


class NoCounterpart(PositionProblem):
    """A unit's position class (fine rule) is not among the reference's: a reference of more
    stages holds more of a stage's warm-up (:func:`engine.sim.hier.predict_layout` tries one)."""


class Positions:
    """Position classes of an unrolling (mixed into :class:`engine.sim.unroll._Unroll`)."""

    fine = False

    def _stage_key(self, st: np.ndarray, p: int, cls: np.ndarray) -> np.ndarray:
        return np.where(st == 0, 0, np.where(st == p - 1, -1, cls[np.clip(st, 0, cls.size - 1)]))

    def _class_keys(self, st, stage_key, lc, j, ph, p: int, m: int) -> np.ndarray:
        """[unit] one integer per position class (see the module) of units (stage ``st``, its
        class ``stage_key``, local chunk, microbatch, phase) of a (p, v, m) schedule."""
        rank, orders = ranks(self.ref.schedule, p, self.v, m)
        r = rank[st, lc, j, ph]
        U = orders.shape[1]
        prev = np.where(r > 0, orders[st, np.maximum(r - 1, 0), 2], -1) if self.fine else 0
        nxt = np.where(r < U - 1, orders[st, np.minimum(r + 1, U - 1), 2], -1) if self.fine else 0
        where = (j == 0) * 1 + (j == m - 1) * 2
        k = ((stage_key + 2) * self.v + lc) * 2 + ph
        return ((k * 3 + prev + 1) * 3 + nxt + 1) * 4 + where

    def _ref_keys(self) -> tuple[list[int], np.ndarray, np.ndarray]:
        ts = sorted(self.ref.units)
        c, j, ph = (np.asarray(a) for a in self._decode(np.asarray(ts), self.mr))
        st = c % self.pr
        keys = self._class_keys(st, self._stage_key(st, self.pr, self.cls), c // self.pr, j, ph, self.pr, self.mr)
        return ts, keys, j

    def _check_classes(self) -> None:
        """Choose the coarse rule, else the fine one (see the module); raise
        :class:`PositionProblem` when neither holds."""
        first: tuple = ()
        for fine in (RULES if self.ref.fine_classes else (False,)):
            self.fine = fine
            ts, keys, js = self._ref_keys()
            seen: dict[int, tuple] = {}
            bad = None
            for t, key, j in zip(ts, keys.tolist(), js.tolist()):
                u = self.ref.units[t]
                sig = (tuple(self._role(int(e), t) for e in u.entries), tuple(self._role(int(x), t) for x in u.exits))
                got = seen.setdefault(key, (sig, u.coef, t))
                if not fine and any(r[0] == "transfer" and r[2] for r in sig[0] + sig[1]):
                    bad = (t, j)  # (another microbatch's transfer: the coarse rule names it by microbatch)
                    break
                if got[0] != sig or got[1].shape != u.coef.shape or not np.allclose(
                        got[1], u.coef, rtol=1e-12, atol=1e-15, equal_nan=False):
                    bad = (t, j)
                    break
            if bad is None:
                self.template_of = {key: v[2] for key, v in seen.items()}
                return
            first = bad  # (the fine rule's: the last tried)
        t, j = first
        c, _, ph = (int(a) for a in self._decode(t, self.mr))
        st = c % self.pr
        raise PositionProblem("units of one position class differ in the reference (stage "
                              f"{'first' if st == 0 else 'last' if st == self.pr - 1 else 'middle'}, chunk "
                              f"{c // self.pr}, {'forward backward'.split()[ph]}, microbatch {j})")

    def _templates(self, c: np.ndarray, j: np.ndarray, ph: np.ndarray) -> np.ndarray:
        """[unit] the reference unit standing for each real unit (chunk ``c``, microbatch, phase)."""
        p, pr, mr, m = self.p, self.pr, self.mr, self.m
        s, lc = c % p, c // p
        if not self.fine:
            return ((lc * pr + self.rep[s]) * mr + mb_type(j, m, mr)) * 2 + ph
        keys = self._class_keys(s, self._stage_key(s, p, self.cls[self.rep]), lc, j, ph, p, m)
        uniq, inv = np.unique(keys, return_inverse=True)
        got = np.array([self.template_of.get(int(k), -1) for k in uniq], np.int64)[inv]
        if (got < 0).any():
            raise NoCounterpart("a unit's place in its stage's schedule has no counterpart in the reference")
        return got

    def _role(self, y: int, t: int) -> tuple:
        """What reference task ``y`` is to template unit ``t``, in relative terms."""
        if y < 0:
            return ("start",)
        ct, jt, pht = self._decode(t, self.mr)
        st, lt = ct % self.pr, ct // self.pr
        if self.bar_unit[y] >= 0:
            cx, jx, phx = self._decode(int(self.bar_unit[y]), self.mr)
            rx = self.rank_r[cx % self.pr, cx // self.pr, jx, phx] - 1
            own, fwd = self.rank_r[st, lt, jt, pht], self.rank_r[st, lt, jt, FWD]
            which = "in" if rx == own - 1 else "out" if rx == own else "fwd-in" if rx == fwd - 1 else f"other{rx - own}"
            return ("barrier", which, int(cx % self.pr == st))
        if self.is_p2p[y]:
            cx, jx, phx = self._decode(self.cons[int(self.chain_first[y])], self.mr)
            if self.fine:
                return ("transfer", *self._step(ct, jt, pht, cx, jx, phx), int(self.slot_of[y]), int(self.hop_of[y]))
            return ("transfer", int(cx - ct), int(jx - jt), int(phx), int(self.slot_of[y]), int(self.hop_of[y]))
        rt = self.ref.tg
        return ("iteration", int(rt.kind[y]), round(float(rt.dur_s[y]), 15), int(rt.res_ptr[y + 1] - rt.res_ptr[y]))

    def _step(self, ct: int, jt: int, pht: int, cx: int, jx: int, phx: int) -> tuple:
        """A transfer into reference unit (cx, jx, phx) as seen from unit (ct, jt, pht): ("in" or
        "out", the steps from the unit to the one of its stage the transfer goes into or comes
        out of, that unit's phase); ("far",) when it is neither."""
        pr = self.pr
        st = ct % pr
        own = self.rank_r[st, ct // pr, jt, pht]
        if cx % pr == st:
            return ("in", int(self.rank_r[st, cx // pr, jx, phx] - own), int(phx))
        src = cx - 1 if phx == FWD else cx + 1  # (the unit the transfer comes out of)
        if 0 <= src < pr * self.v and src % pr == st:
            return ("out", int(self.rank_r[st, src // pr, jx, phx] - own), int(phx))
        return ("far",)
