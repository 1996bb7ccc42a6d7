"""A whole pipeline's iteration composed from a short reference run (issue 43).

The reference simulates the same layout with fewer stages (the first, a middle one for each place
a stage takes in a node, the last) and the first few microbatches, each still 1/m of the batch
(:attr:`engine.taskgraph.context.BuildContext.split`). Its units are read as max-plus blocks
(:mod:`engine.sim.units`); this module lays out the full iteration's explicit tasks (each
stage's barrier chain in its schedule order, every point-to-point transfer, each stage's
gradient collectives and optimizer steps) by copying the reference's, moved to the stage's
devices and links, and puts in each unit's block, taken from the reference unit in the same
position class (first, middle or last microbatch; first, middle or last stage; the same model
chunk and phase; where the reference's middle microbatches differ, also the phases of the
units before and after it in its stage's schedule: :mod:`engine.sim.positions`). The event
loop of :mod:`engine.sim.full` then simulates it: links are still FIFO queues, so the
transfers and collectives meet as they do in the full simulation.

Every entry and exit of a block is named relative to its unit (the barrier before or after a
unit, the transfer into a unit, a per-iteration task of the unit's stage, the iteration's
start), so one block serves every unit in its position. :class:`UnrollProblem` when the
reference cannot stand for the whole (a link that several stages share; a per-iteration task
over several middle stages; a name with no counterpart).
"""

from __future__ import annotations

import numpy as np

from ..taskgraph import BARRIER, BWD, FWD, TaskGraph
from ..taskgraph.regions import within
from .composed import GraphBuilder, Reference, ranks
from .positions import PositionProblem, Positions

__all__ = ["UnrollProblem", "unroll"]


class UnrollProblem(Exception):
    """The reference run cannot be unrolled to the whole pipeline (the message says why)."""


def unroll(ref: Reference, stages: int, microbatches: int, n_devices: int, n_links: int) -> TaskGraph:
    """The composed graph of the whole iteration (``stages`` x ``microbatches``) on a cluster
    of ``n_devices`` and ``n_links``, from ``ref`` (see the module's docstring)."""
    return _Unroll(ref, stages, microbatches, n_devices, n_links).run()


class _Unroll(Positions):
    """One unrolling: the reference's explicit tasks named, then laid out for the whole (each
    unit from the reference unit in its position class: :mod:`engine.sim.positions`)."""

    def __init__(self, ref: Reference, p: int, m: int, n_devices: int, n_links: int) -> None:
        self.ref, self.p, self.m, self.D, self.NL = ref, p, m, n_devices, n_links
        self.pr, self.v, self.mr = ref.stages, ref.chunks, ref.microbatches
        if p < self.pr or m < self.mr:
            raise UnrollProblem("the reference is larger than the run")
        if p != self.pr and self.pr < 3:
            raise UnrollProblem("a reference of fewer than 3 stages cannot stand for more")
        if m != self.mr and self.mr < 3:
            raise UnrollProblem("a reference of fewer than 3 microbatches cannot stand for more")
        self.rank_r = ranks(ref.schedule, self.pr, self.v, self.mr)[0]
        self.rank = ranks(ref.schedule, p, self.v, m)[0]
        self.b = GraphBuilder()
        g = self.geo = ref.geometry
        self.stage_gpus, self.q = g.stage_gpus, g.period
        rt = ref.tg
        # [real stage] the reference stage standing for it; [reference stage] its position class
        self.rep, self.cls = (np.arange(p), np.arange(p)) if p == self.pr else (ref.stage_rep, ref.ref_class)
        if self.rep is None or self.cls is None or self.rep.size != p or self.cls.size != self.pr:
            raise UnrollProblem("the reference's stage plan is not this run's")
        off_node = ((np.arange(p) - self.rep) * g.stage_gpus % g.gpus_per_node).any()  # (a move not by whole nodes)
        if p != self.pr and (rt.n_links % g.links_per_node or off_node or self.pr < self.q + 2
                             or (g.stage_gpus % g.gpus_per_node and g.gpus_per_node % g.stage_gpus)):
            raise UnrollProblem("the reference's stages do not sit in their nodes as the whole run's do")

    # -- the reference's explicit tasks, named -----------------------------------------------
    def _name(self) -> None:
        rt, unit = self.ref.tg, self.ref.unit
        n = rt.num_tasks
        src, dst = rt.edge_src, rt.succ_idx
        ex = unit < 0
        # a barrier of a stage's chain: the unit right after it
        self.bar_unit = np.full(n, -1, np.int64)
        e = ex[src] & (rt.kind[src] == BARRIER) & ~ex[dst]
        self.bar_unit[src[e]] = unit[dst[e]]
        is_bar = self.bar_unit >= 0
        # point-to-point transfers: chains of hops into a unit
        x = ex & (rt.mb >= 0) & ~is_bar
        prev = np.full(n, -1, np.int64)
        has = rt.chain_next >= 0
        prev[rt.chain_next[has]] = np.nonzero(has)[0]
        first = np.nonzero(x & (prev < 0))[0]
        self.hop_of = np.full(n, -1, np.int64)  # hop index in its chain
        self.chain_first = np.full(n, -1, np.int64)
        chains = []
        for f in first:
            hops = [f]
            while rt.chain_next[hops[-1]] >= 0:
                hops.append(int(rt.chain_next[hops[-1]]))
            self.hop_of[hops] = np.arange(len(hops))
            self.chain_first[hops] = f
            chains.append(hops)
        self.cons = {}  # first hop -> consumer unit
        e = x[src] & ~ex[dst]
        for a, b in zip(src[e], dst[e]):
            self.cons[int(self.chain_first[a])] = int(unit[b])
        by_unit: dict[int, list[list[int]]] = {}
        for hops in chains:
            if hops[0] not in self.cons:
                raise UnrollProblem("a point-to-point transfer feeds no unit")
            by_unit.setdefault(self.cons[hops[0]], []).append(hops)
        self.inputs = by_unit  # consumer unit -> its chains (slot order)
        self.slot_of = np.full(n, -1, np.int64)
        for hops_list in by_unit.values():
            for k, hops in enumerate(hops_list):
                self.slot_of[hops] = k
        self.is_p2p = self.hop_of >= 0
        self.is_it = ex & ~is_bar & ~self.is_p2p
        # the full build numbers its tasks in groups (barriers, optimizer steps, transfers,
        # collectives...), each in op order one way or the other: the tie-break key of a copy
        ids = np.nonzero(ex)[0]
        cat = np.where(is_bar[ids], 0, np.where(self.is_p2p[ids], 1, 2 + rt.kind[ids].astype(np.int64)))
        brk = np.r_[0, np.cumsum(cat[1:] != cat[:-1])]
        self.group = np.full(n, -1, np.int64)
        self.group[ids] = brk
        self.direction_of = np.ones(int(brk.max()) + 2 if brk.size else 1, np.int64)  # [group] +1 / -1
        for gi in np.unique(brk):
            o = rt.op[ids[brk == gi]]
            o = o[o >= 0]
            self.direction_of[gi] = -1 if o.size > 1 and np.all(np.diff(o) <= 0) and o[0] != o[-1] else 1
        if (x & ~self.is_p2p).any():
            raise UnrollProblem("a task of a microbatch is neither in a unit nor a transfer between units")

    def _decode(self, u: np.ndarray | int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        u = np.asarray(u)
        return (u // 2) // m, (u // 2) % m, u % 2

    # -- moving a task to other stages ---------------------------------------------------------
    def _res_stage(self, q: np.ndarray) -> np.ndarray:
        """Reference stage of each resource (device or link; -1: a link of several stages)."""
        Dr = self.ref.tg.n_devices
        return np.where(q < Dr, q // self.stage_gpus, self.geo.link_stage[np.maximum(q - Dr, 0)])

    def _move(self, q: np.ndarray, qs: np.ndarray, to: np.ndarray) -> np.ndarray:
        """Reference resources ``q`` (of stages ``qs``) moved to stages ``to``, as real resources."""
        dd, dl = self.geo.moves(qs, to)
        Dr = self.ref.tg.n_devices
        return np.where(q < Dr, q + dd, self.D + (q - Dr) + dl)

    # -- per-iteration tasks: one copy per stage they stand for ----------------------------------
    def _copies(self, ts: np.ndarray, stage_from: np.ndarray, stage_to: np.ndarray) -> np.ndarray:
        """Copies of reference tasks ``ts`` (one per element), every resource of stage
        ``stage_from`` moved to ``stage_to`` (the end stages' tasks: several pairs, see
        :meth:`_shift_of`); their new ids."""
        rt = self.ref.tg
        o = rt.op[ts].astype(np.int64)
        c_ref = np.where(o >= 0, self.ref.op_chunk[np.maximum(o, 0)] if self.ref.op_chunk is not None else 0, 0)
        st_ref = c_ref % self.pr
        c_real = np.where(o >= 0, (c_ref // self.pr) * self.p + self._shift_of(st_ref, stage_from, stage_to), 0)
        dev = rt.device[ts].astype(np.int64)
        ds = np.maximum(dev, 0) // self.stage_gpus
        dev = np.where(dev >= 0, dev + self.geo.moves(ds, self._shift_of(ds, stage_from, stage_to))[0], dev)
        ids = self.b.add(rt.dur_s[ts], rt.kind[ts], self._keys(ts, c_real, rt.mb[ts], dev))
        cnt = rt.res_ptr[ts + 1] - rt.res_ptr[ts]
        if cnt.sum():
            owner = np.repeat(np.arange(ts.size), cnt)
            starts = np.repeat(rt.res_ptr[ts], cnt)
            q = rt.res_idx[starts + within(cnt)]
            if self.p == self.pr:
                moved = np.where(q < rt.n_devices, q, self.D + q - rt.n_devices)
            else:
                qs = self._res_stage(q)
                to = self._shift_of(qs, stage_from[owner], stage_to[owner])
                if ((to < 0) | (qs < 0)).any():
                    raise UnrollProblem("a per-iteration task holds resources of a stage its copy does not move")
                moved = self._move(q, qs, to)
            self.b.res.append((ids[owner], moved))
        return ids

    def _shift_of(self, st: np.ndarray, stage_from: np.ndarray, stage_to: np.ndarray) -> np.ndarray:
        """Real stage of reference stage ``st`` for a copy moving ``stage_from`` to ``stage_to``
        (-1: an end-stage copy, whose first stage stays and last goes to the last)."""
        st = np.asarray(st)
        end = np.where(st == self.pr - 1, self.p - 1, st) if self.p != self.pr else st
        mid = np.where(st == stage_from, stage_to, -1)
        return np.where(np.asarray(stage_from) < 0, end, mid)

    def _keys(self, ts: np.ndarray, c_real: np.ndarray, mb: np.ndarray, last: np.ndarray) -> np.ndarray:
        """[n, 5] tie-break keys of copies of reference tasks ``ts`` (see :meth:`_key`)."""
        rt, ref = self.ref.tg, self.ref
        key = np.empty((ts.size, 5), np.int64)
        key[:, 0] = self.group[ts]
        o = rt.op[ts].astype(np.int64)
        real = o.copy()
        if ref.op_place is not None:
            place = np.where(o >= 0, ref.op_place[np.maximum(o, 0)], 0)
            shift = ref.first_layer[c_real] - ref.first_layer_ref[ref.op_chunk[np.maximum(o, 0)]]
            lay = o + shift * ref.ops_per_layer
            real = np.where(place == 1, lay, np.where(place == 2, o + (ref.layers - ref.ref_layers) * ref.ops_per_layer, o))
            real = np.where(o >= 0, real, o)
        key[:, 1] = self.direction_of[key[:, 0]] * real
        key[:, 2] = ts
        key[:, 3] = mb
        key[:, 4] = last
        return key

    def _iteration_tasks(self) -> None:
        rt = self.ref.tg
        p, pr = self.p, self.pr
        ts = np.nonzero(self.is_it)[0]
        # the reference stages each task touches: its device's and its resources'
        cnt = rt.res_ptr[ts + 1] - rt.res_ptr[ts]
        owner = np.repeat(np.arange(ts.size), cnt)
        q = rt.res_idx[np.repeat(rt.res_ptr[ts], cnt) + within(cnt)]
        qs = self._res_stage(q)
        lo = np.full(ts.size, 1 << 30)
        hi = np.full(ts.size, -1)
        np.minimum.at(lo, owner, qs)
        np.maximum.at(hi, owner, qs)
        dev = rt.device[ts].astype(np.int64)
        ds = np.where(dev >= 0, dev // self.stage_gpus, -1)
        lo = np.where(ds >= 0, np.minimum(lo, ds), lo)
        hi = np.maximum(hi, ds)
        other = np.zeros(ts.size, bool)  # touches a stage other than the first and the last
        np.logical_or.at(other, owner, (qs != 0) & (qs != pr - 1))
        other |= (ds >= 0) & (ds != 0) & (ds != pr - 1)
        # family: 0 one copy (the end stages'); t a copy per middle stage that reference stage t
        # stands for; -2 skipped (middle stages of the reference that stand for none)
        fam = np.full(ts.size, -1)
        shared = np.zeros(ts.size, bool)
        np.logical_or.at(shared, owner, qs < 0)
        if p == pr:
            fam[:] = 0
        else:
            is_rep = np.zeros(pr + 1, bool)  # (index pr: no stage)
            is_rep[np.unique(self.rep[1:p - 1])] = True
            touch = is_rep[np.where(ds >= 0, ds, pr)]
            np.logical_or.at(touch, owner, is_rep[np.where(qs >= 0, qs, pr)])
            fam[~other & (hi >= 0)] = 0
            one_mid = other & (lo == hi) & (lo >= 1) & (lo <= pr - 2)
            one_mid &= is_rep[np.minimum(lo, pr)]
            fam[one_mid] = lo[one_mid]
            fam[other & ~touch & (lo >= 1) & (hi <= pr - 2)] = -2
            fam[shared] = -1
        if (fam == -1).any():
            raise UnrollProblem("a per-iteration task spans stages of the reference that the whole run does not repeat")
        self.family = dict(zip(ts.tolist(), fam.tolist()))
        one = ts[fam == 0]
        frm = np.full(one.size, -1)
        self.it_one = dict(zip(one.tolist(), self._copies(one, frm, frm).tolist()))
        self.it_mid: dict[int, np.ndarray] = {}  # reference id -> [real stage] its copy there (-1: none)
        middles = np.arange(1, p - 1)
        kinds = self.rep[middles]
        for t_ref in np.unique(kinds).tolist():
            mid = ts[fam == t_ref]
            stages = middles[kinds == t_ref]
            if not (mid.size and stages.size):
                continue
            rep_t = np.repeat(mid, stages.size)
            rep_s = np.tile(stages, mid.size)
            ids = self._copies(rep_t, np.full(rep_t.size, t_ref), rep_s).reshape(mid.size, stages.size)
            for row, t in enumerate(mid.tolist()):
                table = np.full(p, -1, np.int64)
                table[stages] = ids[row]
                self.it_mid[t] = table
        src, dst = rt.edge_src, rt.succ_idx
        ex = self.ref.unit < 0
        e = ex[src] & ex[dst] & ~((self.bar_unit[src] >= 0) & (self.bar_unit[dst] >= 0))
        a, b = src[e], dst[e]
        if not (self.is_it[a] & self.is_it[b]).all():
            raise UnrollProblem("an edge between a transfer or barrier and another outside task")
        fa = np.array([self.family[int(x)] for x in a], np.int64)
        fb = np.array([self.family[int(x)] for x in b], np.int64)
        if (fa != fb).any():
            raise UnrollProblem("per-iteration tasks of different stages wait for each other")
        for x, y, f in zip(a.tolist(), b.tolist(), fa.tolist()):
            if f == 0:
                self.b.edges(self.it_one[x], self.it_one[y])
            elif f > 0 and x in self.it_mid:
                self.b.edges(self.it_mid[x], self.it_mid[y])

    def _it(self, t: int, s: np.ndarray) -> np.ndarray:
        """Real copies of per-iteration task ``t`` for units on real stages ``s``."""
        fam = self.family.get(t)
        if fam == 0:
            return np.full(s.shape, self.it_one[t], np.int64)
        if fam is not None and fam > 0:
            out = self.it_mid[t][s] if t in self.it_mid else np.full(s.shape, -1)
            if (out < 0).any():
                raise UnrollProblem("a unit waits for a per-iteration task of a stage it does not stand with")
            return out
        raise UnrollProblem("a unit waits for a per-iteration task of a skipped stage")

    # -- the whole iteration -----------------------------------------------------------------
    def run(self) -> TaskGraph:
        ref, p, v, m = self.ref, self.p, self.v, self.m
        self._name()
        C = p * v
        c = np.repeat(np.arange(C), m * 2)
        j = np.tile(np.repeat(np.arange(m), 2), C)
        ph = np.tile(np.array([FWD, BWD]), C * m)
        s, lc = c % p, c // p
        try:
            self._check_classes()
            tmpl = self._templates(c, j, ph)
        except PositionProblem as e:
            raise UnrollProblem(str(e)) from e
        self._iteration_tasks()
        self.c, self.j, self.ph, self.s, self.lc, self.tmpl = c, j, ph, s, lc, tmpl
        # each stage's barrier chain
        U = 2 * v * m
        gb = int(self.group[np.nonzero(self.bar_unit >= 0)[0][0]]) if (self.bar_unit >= 0).any() else 0
        self.bar_base = np.array([self.b.add(np.zeros(U - 1), BARRIER, np.c_[np.full((U - 1, 2), [gb, -1]),
                                                                          np.full(U - 1, st), np.zeros(U - 1),
                                                                          np.arange(U - 1)])[0]
                                  if U > 1 else -1 for st in range(p)])
        if U > 2:
            for st in range(p):
                ids = self.bar_base[st] + np.arange(U - 1)
                self.b.edges(ids[:-1], ids[1:])
        groups = np.unique(tmpl)
        missing = [int(t) for t in groups if int(t) not in ref.units]
        if missing:
            raise UnrollProblem(f"{len(missing)} units have no counterpart in the reference")
        self.p2p: dict[tuple[int, int], np.ndarray] = {}
        for t in groups:
            self._transfers(int(t), np.nonzero(tmpl == t)[0])
        self.orders: list[tuple] = []
        self.feeds: list[tuple] = []
        self.with_orders = any(ref.units[int(t)].other.size for t in groups)
        for t in groups:
            self._blocks(int(t), np.nonzero(tmpl == t)[0])
        tg = self.b.graph(self.D, self.NL)
        # (composed.order_problem reads them)
        tg.info["orders"] = (self.orders, self.feeds, self.b.new, self.b.n_held) if self.orders else None
        return tg

    def _index(self, c: np.ndarray, j: np.ndarray, ph: np.ndarray) -> np.ndarray:
        """Position of real units (chunk, mb, phase) in the unit arrays."""
        return (c * self.m + j) * 2 + ph

    def _transfers(self, t: int, rows: np.ndarray) -> None:
        """The transfers into the real units ``rows`` (all of template ``t``)."""
        rt = self.ref.tg
        chains = self.inputs.get(t, [])
        if not chains:
            return
        c, ph = self.c[rows], self.ph[rows]
        pc = np.where(ph == FWD, c - 1, c + 1)
        if ((pc < 0) | (pc >= self.p * self.v)).any():
            raise UnrollProblem("a first or last chunk's unit receives a transfer")
        cs, ps = self.s[rows], pc % self.p
        ct, _, pht = self._decode(t, self.mr)
        ref_cs, ref_ps = int(ct % self.pr), int((ct - 1 if pht == FWD else ct + 1) % self.pr)
        for k, hops in enumerate(chains):
            ids_prev = None
            for h, hop in enumerate(hops):
                ids = self.b.add(np.full(rows.size, rt.dur_s[hop]), int(rt.kind[hop]),
                                 self._keys(np.full(rows.size, hop), c, self.j[rows], np.zeros(rows.size, np.int64)),
                                 self.j[rows])
                q = rt.res_idx[rt.res_ptr[hop]:rt.res_ptr[hop + 1]]
                if q.size and self.p == self.pr:  # (the reference is the whole pipeline: nothing moves)
                    self.b.res.append((np.repeat(ids, q.size), np.where(q < rt.n_devices, q, q - rt.n_devices + self.D)
                                       [None, :].repeat(rows.size, 0).ravel()))
                elif q.size:
                    st = self._res_stage(q)
                    if not np.isin(st, [ref_cs, ref_ps]).all():
                        raise UnrollProblem("a transfer crosses a stage other than its two ends")
                    to = np.where(st[None, :] == ref_cs, cs[:, None], ps[:, None])  # [unit, resource]
                    moved = self._move(np.broadcast_to(q, to.shape), np.broadcast_to(st, to.shape), to)
                    self.b.res.append((np.repeat(ids, q.size), moved.ravel()))
                if ids_prev is not None:
                    self.b.chain.append((ids_prev, ids, np.full(rows.size, rt.chain_lag_s[hops[h - 1]])))
                arr = self.p2p.setdefault((k, h), np.full(self.c.size, -1, np.int64))
                arr[rows] = ids
                ids_prev = ids

    def _resolve(self, y: int, t: int, rows: np.ndarray) -> np.ndarray:
        """Real task ids (one per unit of ``rows``) that reference task ``y`` names for template
        unit ``t``: -1 for the iteration's start."""
        if y < 0:
            return np.full(rows.size, -1, np.int64)
        ct, jt, pht = self._decode(t, self.mr)
        c, j, ph, s, lc = self.c[rows], self.j[rows], self.ph[rows], self.s[rows], self.lc[rows]
        if self.bar_unit[y] >= 0:
            cx, jx, phx = self._decode(int(self.bar_unit[y]), self.mr)
            if cx % self.pr != ct % self.pr:
                raise UnrollProblem("a unit waits for another stage's barrier")
            rx = self.rank_r[cx % self.pr, cx // self.pr, jx, phx] - 1  # the barrier's index
            st, lt = ct % self.pr, ct // self.pr
            own = self.rank_r[st, lt, jt, pht]
            fwd = self.rank_r[st, lt, jt, FWD]
            if rx == own - 1:
                r = self.rank[s, lc, j, ph] - 1
            elif rx == own:
                r = self.rank[s, lc, j, ph]
            elif rx == fwd - 1:
                r = self.rank[s, lc, j, FWD] - 1
            else:
                raise UnrollProblem("a unit waits for a barrier other than its own or its forward unit's")
            if ((r < 0) | (r >= 2 * self.v * self.m - 1)).any():
                raise UnrollProblem("a barrier a unit names does not exist in the whole schedule")
            return self.bar_base[s] + r
        if self.is_p2p[y]:
            cx, jx, phx = self._decode(self.cons[int(self.chain_first[y])], self.mr)
            if self.fine:
                return self._by_step(y, self._step(int(ct), int(jt), int(pht), int(cx), int(jx), int(phx)), rows)
            if jx != jt:
                raise UnrollProblem("a unit meets another microbatch's transfer")
            dc = int(cx - ct)
            arr = self.p2p.get((int(self.slot_of[y]), int(self.hop_of[y])))
            if arr is None or dc not in (-1, 0, 1):
                raise UnrollProblem("a transfer with no counterpart in the whole schedule")
            cr = c + dc
            if ((cr < 0) | (cr >= self.p * self.v)).any():
                raise UnrollProblem("a transfer to a chunk outside the pipeline")
            out = arr[self._index(cr, j, np.full(rows.size, phx))]
            if (out < 0).any():
                raise UnrollProblem("a transfer with no counterpart in the whole schedule")
            return out
        if self.is_it[y]:
            return self._it(int(y), s)
        raise UnrollProblem("a unit names a task the unrolling does not know")

    def _by_step(self, y: int, step: tuple, rows: np.ndarray) -> np.ndarray:
        """Real copies of transfer hop ``y`` for ``rows``, named (fine classes) by the unit of
        each row's stage it goes into or comes out of, ``step`` units away in the schedule."""
        if step[0] == "far":
            raise UnrollProblem("a unit meets a transfer of other stages' units")
        kind, d, ph_u = step
        s = self.s[rows]
        rank, orders = ranks(self.ref.schedule, self.p, self.v, self.m)
        r = rank[s, self.lc[rows], self.j[rows], self.ph[rows]] + d
        if ((r < 0) | (r >= orders.shape[1])).any():
            raise UnrollProblem("a unit meets the transfer of a unit its stage's schedule does not have")
        u = orders[s, r]  # [row] (local chunk, microbatch, phase) of the unit it goes into or comes out of
        if (u[:, 2] != ph_u).any():
            raise UnrollProblem("a unit meets the transfer of a unit in another phase than its template's")
        cons = u[:, 0] * self.p + s + (0 if kind == "in" else 1 if ph_u == FWD else -1)
        arr = self.p2p.get((int(self.slot_of[y]), int(self.hop_of[y])))
        if arr is None or ((cons < 0) | (cons >= self.p * self.v)).any():
            raise UnrollProblem("a transfer with no counterpart in the whole schedule")
        out = arr[self._index(cons, u[:, 1], np.full(rows.size, ph_u))]
        if (out < 0).any():
            raise UnrollProblem("a transfer with no counterpart in the whole schedule")
        return out

    def _blocks(self, t: int, rows: np.ndarray) -> None:
        """Each unit of ``rows`` (template ``t``) as its block: one delay task per (finite
        entry, exit), a join per exit when several entries lead to it. Made for every
        (entry, exit) pair of the template at once: delays and joins hold nothing, so their
        numbers do not matter to the event loop (a task that holds nothing starts when it is
        ready, whatever else is ready with it)."""
        u = self.ref.units[t]
        fin_e, fin_x = np.nonzero(np.isfinite(u.coef))  # (entry, exit) pairs, by entry
        if not fin_e.size:
            return
        o = np.lexsort((fin_e, fin_x))  # by exit, then entry (as the blocks are read)
        fin_e, fin_x = fin_e[o], fin_x[o]
        R = rows.size
        mb = self.j[rows]
        used_e, used_x = np.unique(fin_e), np.unique(fin_x)
        ents = np.full((u.coef.shape[0], R), -1, np.int64)
        for e in used_e.tolist():
            ents[e] = self._resolve(int(u.entries[e]), t, rows)
        outs = np.full((u.coef.shape[1], R), -1, np.int64)
        for x in used_x.tolist():
            outs[x] = self._resolve(int(u.exits[x]), t, rows)
        if u.other.size:  # (the queue orders its block assumes: checked on the composed run, order_problem)
            for e in np.nonzero(np.isfinite(u.ready).any(axis=0))[0].tolist():
                if ents[e, 0] < 0 and u.entries[e] >= 0:
                    ents[e] = self._resolve(int(u.entries[e]), t, rows)
            for c in range(u.other.size):
                k = int(u.other[c])
                if u.first[c] and ents[k, 0] < 0 and u.entries[k] >= 0:
                    ents[k] = self._resolve(int(u.entries[k]), t, rows)
                elif not u.first[c] and outs[k, 0] < 0:
                    outs[k] = self._resolve(int(u.exits[k]), t, rows)
            other = np.empty((u.other.size, R), np.int64)  # [order, unit] its explicit task
            other[u.first] = ents[u.other[u.first]]
            other[~u.first] = outs[u.other[~u.first]]
            self.orders.append((ents.copy(), u.ready, other, u.first, u.tied))
        if self.with_orders:  # (each exit's readiness by data alone, for the explicit tasks' side of the orders)
            data = u.data if u.data.size else u.coef
            xs = np.nonzero(np.isfinite(data).any(axis=0))[0]
            if xs.size:
                self.feeds.append((ents.copy(), outs[xs], data[:, xs]))
        per_exit = np.bincount(fin_x, minlength=u.coef.shape[1])
        delays = self.b.add(np.repeat(u.coef[fin_e, fin_x], R), BARRIER, mb=np.tile(mb, fin_e.size)).reshape(-1, R)
        self.b.edges(ents[fin_e], delays)
        multi = np.nonzero(per_exit > 1)[0]
        target = outs[fin_x]
        if multi.size:
            joins = self.b.add(np.zeros(multi.size * R), BARRIER, mb=np.tile(mb, multi.size)).reshape(-1, R)
            join_of = np.full(u.coef.shape[1], -1, np.int64)
            join_of[multi] = np.arange(multi.size)
            joined = per_exit[fin_x] > 1
            target[joined] = joins[join_of[fin_x[joined]]]
            self.b.edges(joins, outs[multi])
        self.b.edges(delays, target)
