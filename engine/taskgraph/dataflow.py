"""Dataflow segments: a tensor's regions sent from its producer's partitions to every consumer
partition that reads them, and the gradients sent back (FlexFlow §5.1: a transfer wherever a
consumer needs a region another device holds, sized by the overlap)."""

from __future__ import annotations

import itertools

import numpy as np

from ..ops import DTYPE_BYTES, FLOAT_DTYPES, REPLICA
from .compute import op_signature
from .context import BuildContext, OpTables
from .emit import Emitter
from .regions import classes, in_regions, out_regions, tile, transfer_plan
from .segments import Segment

__all__ = ["DataflowBuilder"]


def _plan(h_lo, h_hi, h_dev, h_cls, r_lo, r_hi, r_dev, r_rep: np.ndarray):
    """:func:`transfer_plan` for the representative receivers only (all of them without
    symmetry): the others' transfers are mirror images, never built (a 1,024-way split
    under symmetry has one representative)."""
    if r_rep.all():
        return transfer_plan(h_lo, h_hi, h_dev, h_cls, r_lo, r_hi, r_dev)
    rr = np.flatnonzero(r_rep)
    holder, recv, elems = transfer_plan(h_lo, h_hi, h_dev, h_cls, r_lo[rr], r_hi[rr], r_dev[rr], r_ids=rr)
    return holder, rr[recv], elems


class _Sent:
    """Transfers already made for one tensor, so that a region goes to a device once.

    ``hops[key]``: (sorted codes, [code, mb] hop handles) per direction; ``reduced``: the
    input-gradient all-reduces made, by (tensor, devices, elements)."""

    def __init__(self) -> None:
        self.hops: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.reduced: dict[tuple, np.ndarray] = {}


class DataflowBuilder:
    """Builds segment ("tensor", p, o): output ``o`` of op ``p`` to all its consumers, and the
    gradients back. Deduplication is per tensor, so the segment stands alone."""

    def __init__(self, ctx: BuildContext, tables: OpTables, emit: Emitter) -> None:
        self.ctx, self.tables, self.emit = ctx, tables, emit
        #: the transfer plans of identical edges (repeated layers on shifted devices)
        self._plans: dict[tuple, tuple] = {}
        #: partition classes of identical consumers (input-gradient groups)
        self._classes: dict[tuple, np.ndarray] = {}
        #: a [part] array's contents (devices less their minimum; representative masks) -> a
        #: small id, and id(array) -> (the array, its minimum, that id): the plans' keys hold
        #: ids, not the arrays' bytes (16,384 devices: 128 kB hashed four times per edge).
        #: An entry holds its array, so its id cannot name another array while cached; a
        #: pattern id is never reused (the plans made before the bound cleared keep theirs).
        self._pattern_ids: dict[tuple, int] = {}
        self._patterns: dict[int, tuple[np.ndarray, int, int]] = {}
        self._next_pattern = itertools.count()

    def _pattern(self, a: np.ndarray) -> tuple[int, int]:
        """(minimum, pattern id) of a [part] devices array or mask: equal ids, equal
        ``a - a.min()``."""
        hit = self._patterns.get(id(a))
        if hit is None or hit[0] is not a:
            if len(self._patterns) >= 4096:  # bounded: a long search meets many configs
                self._patterns.clear()
                self._pattern_ids.clear()
            lo = int(a.min()) if a.size else 0
            code = (a.dtype.str, (a - lo if a.dtype != bool else a).tobytes())
            pat = self._pattern_ids.get(code)
            if pat is None:
                pat = self._pattern_ids[code] = next(self._next_pattern)
            hit = self._patterns[id(a)] = (a, lo, pat)
        return hit[1], hit[2]

    def build(self, seg: Segment, p: int, o: int) -> None:
        ctx, t = self.ctx, self.tables
        g, s, m = ctx.graph, ctx.strategy, ctx.microbatches
        sent = _Sent()
        users = ctx.users[(p, o)]
        for (c, i) in users:
            prod, cons = g.ops[p], g.ops[c]
            pcfg, ccfg = s.configs[prod.name], s.configs[cons.name]
            pnames, pgrid = t.grid[p]
            cnames, cgrid = t.grid[c]
            tensor = prod.out_tensors[o]
            # regions are of the whole batch; a microbatch carries 1/m of the sample axis
            nbytes = DTYPE_BYTES[tensor.dtype] / (m if "sample" in tensor.axes else 1)
            # forward: holders = producer partitions; identical data across reduction (after
            # the all-reduce) and replica dims
            # (the two device arrays less their common minimum: each less its own, and the offset)
            (p_lo, p_pat), (c_lo, c_pat) = self._pattern(t.devs[p]), self._pattern(t.devs[c])
            pkey = (op_signature(prod), o, tuple(pcfg.degrees.items()), op_signature(cons), i,
                    tuple(ccfg.degrees.items()), p_pat, c_pat, p_lo - c_lo,
                    self._pattern(t.rep[p])[1], self._pattern(t.rep[c])[1])
            hit = self._plans.get(pkey)
            if hit is None:
                hkeep = {n for n in pnames if prod.dim(n).out_axis is not None}
                h_lo, h_hi = out_regions(prod, pcfg, pnames, pgrid, o)
                r_lo, r_hi = in_regions(cons, ccfg, cnames, cgrid, i)
                fwd_plan = _plan(h_lo, h_hi, t.devs[p], classes(pgrid, pnames, hkeep), r_lo, r_hi, t.devs[c], t.rep[c])
                hit = self._plans[pkey] = (h_lo, h_hi, r_lo, r_hi, fwd_plan, {})
            h_lo, h_hi, r_lo, r_hi, (holder, recv, elems), bwd_plans = hit
            shared = len(users) > 1  # dedupe only matters with several consumers
            self._per_mb(seg, sent, t.fwd_ready[p], t.fwd_in.get(c, t.fwd[c]), holder, recv, elems * nbytes,
                         t.devs[p], t.devs[c],
                         c, p, c, key=(p, o) if shared else None)
            # backward: gradients flow back for float tensors into ops that have a backward
            if tensor.dtype not in FLOAT_DTYPES or p not in t.bwd:
                continue
            partial = {n for n in cnames if cons.dim(n).kind != REPLICA
                       and (i >= len(cons.dim(n).in_axes) or cons.dim(n).in_axes[i] is None)}
            ckeep = {n for n in cnames if n not in partial and cons.dim(n).kind != REPLICA}
            ready = t.bwd_out.get(c, t.bwd[c])
            if partial:
                ready = self._grad_reduce(seg, sent, c, cnames, cgrid, r_lo, r_hi, partial, nbytes, (p, o))
            if "bwd" not in bwd_plans:
                bwd_plans["bwd"] = _plan(r_lo, r_hi, t.devs[c], classes(cgrid, cnames, ckeep), h_lo, h_hi, t.devs[p],
                                         t.rep[p])
            h2, r2, e2 = bwd_plans["bwd"]
            self._per_mb(seg, sent, ready, t.bwd_in.get(p, t.bwd[p]), h2, r2, e2 * nbytes, t.devs[c], t.devs[p], p, c, p,
                         key=(p, o, "grad") if shared and not partial else None, backward=True)

    def _grad_reduce(self, seg: Segment, sent: _Sent, c: int, cnames, cgrid, r_lo, r_hi, partial, nbytes,
                     tensor) -> np.ndarray:
        """All-reduce partial input gradients over partitions that differ only in dims that
        do not split the input; returns [mb, part] tasks after which each holds the sum.

        Consumers of one tensor on the same devices (Q, K and V reading one LayerNorm) add
        their partial gradients locally first and share one all-reduce, as autograd does.
        Under sequence parallelism, when the producer holds the tensor split along the
        sequence over the same ranks, the sum is reduce-scattered to those shards instead
        (Korthikanti et al. 2022 §4.2.2: the backward of the all-gather before a
        column-parallel layer)."""
        t, m = self.tables, self.ctx.microbatches
        cons = self.ctx.graph.ops[c]
        keep = {n for n in cnames if n not in partial}
        ckey = (op_signature(cons), tuple(self.ctx.strategy.configs[cons.name].degrees.items()), tuple(sorted(keep)))
        cls = self._classes.get(ckey)
        if cls is None:
            cls = self._classes[ckey] = classes(cgrid, cnames, keep)
        out = t.bwd_out.get(c, t.bwd[c])
        ready = out.copy()
        elems = np.prod(r_hi - r_lo, axis=1)
        s = self.ctx.strategy
        pshards = s.configs[self.ctx.graph.ops[tensor[0]].name].degree("length") if s.sequence_parallel else 1
        for k in np.unique(cls[t.rep[c]]).tolist():  # classes with a representative (the rest mirror them)
            members = np.nonzero(cls == k)[0]
            devs = t.devs[c][members]
            if np.unique(devs).size <= 1:
                continue
            key = (tensor, tuple(sorted(int(d) for d in devs)), int(elems[members[0]]))
            ids = sent.reduced.get(key)
            if ids is not None:
                seg.edges(out[:, members], np.repeat(ids, members.size))
            else:
                # with --tp-comm-overlap, pipelined with the input-gradient GEMM (the consumer's
                # backward half that has its forward's FLOPs)
                hide = float(t.fwd_s[c][members[0]]) if self.ctx.strategy.tp_comm_overlap else 0.0
                scatter = pshards > 1 and pshards == np.unique(devs).size and \
                    bool(np.isin(devs, t.devs[tensor[0]]).all())
                ids = self.emit.collectives(seg, "reduce_scatter" if scatter else "all_reduce",
                                            float(elems[members[0]]) * nbytes, devs, out[:, members], c,
                                            np.arange(m), overlap_s=hide)
                if ids is not None:
                    sent.reduced[key] = ids
            if ids is not None:
                ready[:, members] = ids[:, None]
        return ready

    def _per_mb(self, seg: Segment, sent: _Sent, src_tasks, dst_tasks, holder, recv, size_bytes, src_dev, dst_dev,
                op, src_op: int, dst_op: int, key: tuple | None = None, backward: bool = False) -> None:
        """Transfers for every (holder, receiver) pair, in every microbatch.

        A region is sent to a device once: in the forward pass a second consumer on the same
        device waits for the first one's transfer (``key`` names the tensor); in the backward
        pass gradients for the same producer partition from one device are summed there and
        sent once, after every contributing backward task.
        """
        if holder.size == 0:
            return
        t, D, m = self.tables, self.ctx.n_devices, self.ctx.microbatches
        keep = t.rep[dst_op][recv]
        if not keep.all():
            holder, recv, size_bytes = holder[keep], recv[keep], size_bytes[keep]
        if self.ctx.sym is not None:
            seg.cross_replica += int(np.count_nonzero(~t.rep[src_op][holder] & (size_bytes > 0)))
        if holder.size == 0:
            return
        moving = (size_bytes > 0) & (src_dev[holder] != dst_dev[recv])
        if key is not None and moving.any():
            # forward: (holder partition, destination device) -> last hops [mb]
            # backward: (producer partition, source device) -> first hops [mb]
            code = (recv * D + src_dev[holder]) if backward else (holder * D + dst_dev[recv])
            known, rows = sent.hops.get(key, (np.zeros(0, np.int64), np.zeros((0, m), np.int64)))
            at = np.minimum(np.searchsorted(known, code), max(known.size - 1, 0))
            old = moving & (known[at] == code) if known.size else np.zeros(holder.size, bool)
            reuse = np.nonzero(old)[0]
            if reuse.size:  # one edge per microbatch to (from) the hops already made
                hops = rows[at[reuse]].ravel()
                if backward:
                    seg.edges(src_tasks[:, holder[reuse]].T, hops)
                else:
                    seg.edges(hops, dst_tasks[:, recv[reuse]].T)
            fresh = np.nonzero(~old)[0]
            holder, recv, size_bytes, code = holder[fresh], recv[fresh], size_bytes[fresh], code[fresh]
            if holder.size == 0:
                return
        else:
            key = None
        local = (src_dev[holder] == dst_dev[recv]) | (size_bytes <= 0)
        if local.any():  # a dependency, no transfer
            seg.edges(src_tasks[:, holder[local]], dst_tasks[:, recv[local]])
            if local.all():
                return
            keep = ~local
            holder, recv, size_bytes = holder[keep], recv[keep], size_bytes[keep]
            if key is not None:
                code = code[keep]
        first, last = self.emit.transfers(seg, src_tasks[:, holder].ravel(), dst_tasks[:, recv].ravel(),
                                          tile(src_dev[holder], m), tile(dst_dev[recv], m),
                                          tile(size_bytes.astype(np.float64), m), op,
                                          np.repeat(np.arange(m), holder.size))
        if key is not None:
            hops = (first if backward else last).reshape(m, holder.size)
            made = hops[0] >= 0
            if made.any():  # remember them (a later pair with the same code wins, as in a dict)
                c_all = np.concatenate([known, code[made]])
                r_all = np.concatenate([rows, hops[:, made].T])
                last_of = c_all.size - 1 - np.unique(c_all[::-1], return_index=True)[1]
                sent.hops[key] = (c_all[last_of], r_all[last_of])
