"""Dataflow segments: a tensor's regions sent from its producer's partitions to every consumer
partition that reads them, and the gradients sent back (FlexFlow §5.1: a transfer wherever a
consumer needs a region another device holds, sized by the overlap)."""

from __future__ import annotations

import itertools

import numpy as np

from ..ops import DTYPE_BYTES, FLOAT_DTYPES, REPLICA, REPLICA_DIM
from ..strategy.recompute import recompute_reruns
from .compute import op_signature
from .context import BuildContext, OpTables
from .emit import Emitter
from .regions import classes, in_regions, out_regions, tile, transfer_plan
from .segments import Segment

__all__ = ["DataflowBuilder", "split_gathers", "context_parallel"]


def _plan(h_lo, h_hi, h_dev, h_cls, r_lo, r_hi, r_dev, r_rep: np.ndarray):
    """:func:`transfer_plan` for the representative receivers only (all of them without
    symmetry): the others' transfers are mirror images, never built (a 1,024-way split
    under symmetry has one representative)."""
    if r_rep.all():
        return transfer_plan(h_lo, h_hi, h_dev, h_cls, r_lo, r_hi, r_dev)
    rr = np.flatnonzero(r_rep)
    holder, recv, elems = transfer_plan(h_lo, h_hi, h_dev, h_cls, r_lo[rr], r_hi[rr], r_dev[rr], r_ids=rr)
    return holder, rr[recv], elems


def _overlap(a_lo, a_hi, b_lo, b_hi) -> np.ndarray:
    """Elements in common between the boxes of rows ``a`` and the box ``b``."""
    return np.prod(np.clip(np.minimum(a_hi, b_hi) - np.maximum(a_lo, b_lo), 0, None), axis=1)


def context_parallel(cons, ccfg, i: int) -> bool:
    """Whether consumer ``cons`` splits the sequence (``length``) while reading input ``i``
    whole along it: attention under context parallelism, whose queries are split over the cp
    ranks while each needs every key and value (Megatron-Core gathers them over the cp group)."""
    if ccfg.degree("length") <= 1 or "length" not in cons.dim_names:
        return False
    axes = cons.dim("length").in_axes
    return i >= len(axes) or axes[i] is None


def gathered_loss(cons, ccfg) -> bool:
    """Whether ``cons`` is a loss replicated over the tensor-parallel group, which gathers the
    vocabulary-split logits to every rank (``loss_parallel`` off: DTensor's redistribution to
    ``Replicate`` is an all-gather)."""
    return cons.kind == "softmax_cross_entropy" and ccfg.degree(REPLICA_DIM) > 1


def split_gathers(plan, h_lo, h_hi, h_dev, h_cls, r_lo, r_hi, r_dev):
    """Take the all-gathers out of a transfer plan: ``(rest of the plan, gathers)``.

    A set of holders on distinct devices G, each holding an equal, disjoint part of a region
    that every receiver on G needs whole (one receiver per device of G, its own part
    local), is an all-gather over G, as frameworks run it: Megatron-LM's sequence
    parallelism gathers the sequence shards before a column-parallel layer and gathers the
    output gradient shards before a row-parallel layer's backward (Korthikanti et al. 2022
    §4.2.2), and context parallelism gathers keys and values over the cp group (Megatron-Core
    ``cp_comm_type="all_gather"``). One collective task over G replaces the |G| x (|G| - 1)
    point-to-point transfers; it crosses no replica, so a translation symmetry along G's axis
    stays exact (the members mirror one another as data-parallel replicas do).

    Used where the framework gathers (sequence parallelism, context parallelism); FlexFlow's
    runtime moves regions point to point, and its strategies keep the transfers.

    Returns ``gathers``: tuples (holder partitions, receivers in ``plan``, elements of a part).
    """
    holder, recv, elems = plan
    if holder.size < 2:
        return plan, ()
    order = np.argsort(recv, kind="stable")
    rs, starts = np.unique(recv[order], return_index=True)
    bounds = np.append(starts, order.size)
    hvol = np.prod(h_hi - h_lo, axis=1)
    taken = np.zeros(holder.size, bool)
    groups: dict[tuple, list] = {}
    for j, r in enumerate(rs.tolist()):
        idx = order[bounds[j]:bounds[j + 1]]
        hs = holder[idx]
        if idx.size < 2 or np.unique(h_dev[hs]).size != idx.size or not (h_dev[hs] == r_dev[r]).any():
            continue
        key = tuple(sorted(hs.tolist()))
        if key not in groups:
            groups[key] = [_closed(hs, h_lo, h_hi, h_dev, h_cls, hvol, r_lo, r_hi, r_dev, r), []]
        if groups[key][0] is not None and (r_lo[r] == r_lo[groups[key][0]]).all() \
                and (r_hi[r] == r_hi[groups[key][0]]).all():
            groups[key][1].append(r)
            taken[idx] = True
    if not taken.any():
        return plan, ()
    rest = ~taken
    gathers = tuple((np.asarray(k, np.int64), np.asarray(rcv, np.int64), int(hvol[k[0]]))
                    for k, (ok, rcv) in groups.items() if ok is not None and rcv)
    return (holder[rest], recv[rest], elems[rest]), gathers


def _closed(hs, h_lo, h_hi, h_dev, h_cls, hvol, r_lo, r_hi, r_dev, r) -> int | None:
    """``r`` when holders ``hs`` hold equal, disjoint parts tiling receiver ``r``'s region
    and every device of theirs has exactly one receiver of that region, whose holders are
    ``hs`` (so one all-gather over those devices serves them all); else None."""
    part = hvol[hs]
    if np.unique(part).size != 1 or (_overlap(h_lo[hs], h_hi[hs], r_lo[r], r_hi[r]) != part).any() \
            or int(part.sum()) != int(np.prod(r_hi[r] - r_lo[r])):
        return None
    devs = h_dev[hs]
    same = np.flatnonzero(np.isin(r_dev, devs) & (r_lo == r_lo[r]).all(axis=1) & (r_hi == r_hi[r]).all(axis=1))
    if same.size != devs.size or np.unique(r_dev[same]).size != devs.size:
        return None
    h2, r2, _ = transfer_plan(h_lo, h_hi, h_dev, h_cls, r_lo[same], r_hi[same], r_dev[same], r_ids=same)
    want = np.sort(hs)
    for k in range(same.size):
        if not np.array_equal(np.sort(h2[r2 == k]), want):
            return None
    return r


class _Sent:
    """Transfers already made for one tensor, so that a region goes to a device once.

    ``hops[key]``: (sorted codes, [code, mb] hop handles) per direction; ``reduced``: the
    input-gradient all-reduces made, by (tensor, devices, elements); ``gathered``: the
    forward all-gathers made, by (tensor, devices)."""

    def __init__(self) -> None:
        self.hops: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.reduced: dict[tuple, np.ndarray] = {}
        self.gathered: dict[tuple, np.ndarray] = {}
        #: the backward's all-gathers of a sequence-split input before its reduce-scatter, by
        #: the reduce-scatter's key: the consumers' gradients wait for it
        self.regathered: dict[tuple, np.ndarray] = {}


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
        g, s = ctx.graph, ctx.strategy
        sent = _Sent()
        users = ctx.users[(p, o)]
        for (c, i) in users:
            prod, cons = g.ops[p], g.ops[c]
            pcfg, ccfg = s.configs[prod.name], s.configs[cons.name]
            pnames, pgrid = t.grid[p]
            cnames, cgrid = t.grid[c]
            tensor = prod.out_tensors[o]
            # regions are of the whole batch; a microbatch carries 1/m of the sample axis
            nbytes = DTYPE_BYTES[tensor.dtype] / (ctx.split if "sample" in tensor.axes else 1)
            # forward: holders = producer partitions; identical data across reduction (after
            # the all-reduce) and replica dims
            # (the two device arrays less their common minimum: each less its own, and the offset)
            (p_lo, p_pat), (c_lo, c_pat) = self._pattern(t.devs[p]), self._pattern(t.devs[c])
            pkey = (op_signature(prod), o, tuple(pcfg.degrees.items()), op_signature(cons), i,
                    tuple(ccfg.degrees.items()), p_pat, c_pat, p_lo - c_lo,
                    self._pattern(t.rep[p])[1], self._pattern(t.rep[c])[1], s.sequence_parallel)
            hit = self._plans.get(pkey)
            if hit is None:
                hkeep = {n for n in pnames if prod.dim(n).out_axis is not None}
                h_lo, h_hi = out_regions(prod, pcfg, pnames, pgrid, o)
                r_lo, r_hi = in_regions(cons, ccfg, cnames, cgrid, i)
                hcls = classes(pgrid, pnames, hkeep)
                fwd_plan = _plan(h_lo, h_hi, t.devs[p], hcls, r_lo, r_hi, t.devs[c], t.rep[c])
                gathers: tuple = ()
                if s.sequence_parallel or context_parallel(cons, ccfg, i) or gathered_loss(cons, ccfg):
                    fwd_plan, gathers = split_gathers(fwd_plan, h_lo, h_hi, t.devs[p], hcls, r_lo, r_hi, t.devs[c])
                hit = self._plans[pkey] = (h_lo, h_hi, r_lo, r_hi, fwd_plan, gathers, {})
            h_lo, h_hi, r_lo, r_hi, (holder, recv, elems), gathers, bwd_plans = hit
            shared = len(users) > 1  # dedupe only matters with several consumers
            if gathers:
                self._gathers(seg, sent, gathers, t.fwd_ready[p], t.fwd_in.get(c, t.fwd[c]), nbytes, t.devs[p], c,
                              key=(p, o))
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
                ccls = classes(cgrid, cnames, ckeep)
                plan = _plan(r_lo, r_hi, t.devs[c], ccls, h_lo, h_hi, t.devs[p], t.rep[p])
                bwd_plans["bwd"] = split_gathers(plan, r_lo, r_hi, t.devs[c], ccls, h_lo, h_hi, t.devs[p]) \
                    if s.sequence_parallel else (plan, ())
            (h2, r2, e2), bgathers = bwd_plans["bwd"]
            if bgathers:
                self._gathers(seg, sent, bgathers, ready, t.bwd_in.get(p, t.bwd[p]), nbytes, t.devs[c], p)
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
                seg.edges(out[:, members], np.repeat(sent.regathered.get(key, ids), members.size))
            else:
                # with --tp-comm-overlap, pipelined with the input-gradient GEMM (the consumer's
                # backward half that has its forward's FLOPs)
                hide = float(t.fwd_s[c][members[0]]) if self.ctx.strategy.tp_comm_overlap else 0.0
                scatter = pshards > 1 and pshards == np.unique(devs).size and \
                    bool(np.isin(devs, t.devs[tensor[0]]).all())
                size = float(elems[members[0]]) * nbytes
                preds = out[:, members]
                if scatter:
                    # the column-parallel layer kept only its input's sequence shard: its
                    # weight gradient gathers the input again (Korthikanti et al. 2022 §4.2.2;
                    # their Table 4: sequence parallelism saves 0.1 ms of the 22B layer's
                    # backward where its sharded norms and dropouts alone save ~0.9), and a
                    # recomputed forward gathered it once more before
                    again = 2 if recompute_reruns(self.ctx.graph, cons, s.recompute, s.fp8,
                                                  s.recompute_modules) else 1
                    gather = self.emit.collectives(seg, "all_gather", size * again, devs, preds, c, np.arange(m),
                                                   overlap_s=hide)
                    if gather is not None:
                        sent.regathered[key] = gather
                        preds = gather[:, None]
                ids = self.emit.collectives(seg, "reduce_scatter" if scatter else "all_reduce", size, devs, preds, c,
                                            np.arange(m), overlap_s=hide)
                if ids is not None:
                    sent.reduced[key] = ids
            if ids is not None:
                ready[:, members] = ids[:, None]
        return ready

    def _gathers(self, seg: Segment, sent: _Sent, gathers, src_tasks, dst_tasks, nbytes: float, src_dev, op: int,
                 key: tuple | None = None) -> None:
        """One all-gather per group and microbatch (:func:`split_gathers`), after the holders'
        tasks and before the receivers'; forward ones (``key``: the tensor) are shared by the
        consumers that read the same parts on the same devices (Q, K and V after one norm)."""
        m = self.ctx.microbatches
        for hs, rcv, part in gathers:
            devs = src_dev[hs]
            gkey = None if key is None else (key, tuple(sorted(devs.tolist())), part)
            ids = sent.gathered.get(gkey) if gkey is not None else None
            if ids is None:
                ids = self.emit.collectives(seg, "all_gather", part * nbytes * hs.size, devs, src_tasks[:, hs], op,
                                            np.arange(m))
                if gkey is not None:
                    sent.gathered[gkey] = ids
            seg.edges(np.repeat(ids, rcv.size), dst_tasks[:, rcv])

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
