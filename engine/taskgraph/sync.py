"""Synchronisation segments: gradients of replicated parameters reduced over the partitions that
hold the same region (of the tensor: ops sharing one, a ``param_group``, reduce together, and
where they cut it differently every piece is reduced over all its holders), ZeRO's sharded
update and gathers (Rajbhandari et al. SC'20), and FSDP's per-microbatch parameter gathers with
one unit of prefetch."""

from __future__ import annotations

import numpy as np

from ..graph import Op
from ..ops import DTYPE_BYTES
from ..strategy import zero_shares
from .context import BuildContext, OpTables
from .emit import Emitter
from .regions import param_keys, param_regions, param_split, pieces, tile, unique_rows
from .segments import Segment
from .tasks import BWD, FWD

__all__ = ["FsdpPlan", "SyncBuilder", "sync_unit", "prefetch_buckets", "DEEPSPEED_PREFETCH_ELEMENTS"]


def sync_unit(op: Op, zero_stage: int) -> str:
    """Parameters synchronised together: a shared ``param_group``; with any ZeRO stage, the
    op's block (FSDP wraps whole transformer blocks for FULL_SHARD and SHARD_GRAD_OP alike, as
    llm-foundry and torchtitan do; DeepSpeed's ZeRO-1/2 and Megatron's distributed optimizer
    reduce gradients in buckets of hundreds of MB, not per tensor); otherwise the op itself.
    The granularity sets how many collectives an iteration pays the per-step latency of (a
    ring over n ranks takes n - 1 steps: at 512 GPUs a per-tensor reduce-scatter is
    latency-bound)."""
    if op.param_group:
        return op.param_group
    if zero_stage >= 1 and op.block:
        return f"block:{op.block}"
    return op.name


#: DeepSpeed ZeRO-3's default ``stage3_prefetch_bucket_size`` (parameters fetched ahead of use;
#: deepspeed/runtime/zero/config.py, 5e7).
DEEPSPEED_PREFETCH_ELEMENTS = 5e7


def prefetch_buckets(pieces: list[tuple[float, int, list[int]]],
                     per_op: bool) -> list[tuple[float, int, list[int], int | None]]:
    """(elements, op, waiting ops, op after whose start it is issued or None) per gather: the
    pieces of one pass in use order, the op pieces cut into DeepSpeed's prefetch buckets."""
    if not per_op:
        return [(*p, None) for p in pieces]
    out, bucket_first, prev_first, filled = [], None, None, 0.0
    for size, at, waiting in pieces:
        if bucket_first is None or filled + size > DEEPSPEED_PREFETCH_ELEMENTS:
            prev_first, bucket_first, filled = bucket_first, at, 0.0
        filled += size
        out.append((size, at, waiting, prev_first))
    return out


class FsdpPlan:
    """The parameter units of a build (unit -> member ops) and, per pass, the op after whose
    start each unit's ZeRO-3 gather is issued: forward in op order, backward in reverse (a tied
    embedding's unit is first used by the output layer)."""

    def __init__(self, ctx: BuildContext) -> None:
        zero = ctx.strategy.zero_stage
        self.zero_stage = zero
        self.units: dict[str, list[int]] = {}
        for oi, op in enumerate(ctx.graph.ops):
            if op.param_count and op.kind != "input":
                self.units.setdefault(sync_unit(op, zero), []).append(oi)
        self.prefetch: dict[tuple[str, int], int | None] = {}  # (unit, phase) -> lead op of the unit before
        for phase, pick, sign in ((FWD, min, 1), (BWD, max, -1)):
            prev = None
            for u in sorted(self.units, key=lambda u: sign * pick(self.units[u])):
                self.prefetch[(u, phase)] = prev
                prev = pick(self.units[u])
        s = ctx.strategy
        #: op name -> its sequence-parallel share of the length split (ZeRO does not shard over it)
        self.zero_shares = zero_shares(ctx.graph, s) if zero >= 1 else {}
        #: ZeRO-1/2's overlapped parameter gathers chained unit by unit behind the forward (each
        #: issued when the unit before starts); with a pipeline they are issued together at the
        #: iteration's start instead (Megatron-LM's --align-param-gather: :meth:`SyncBuilder._param_gather`)
        self.chained_param_gather = zero in (1, 2) and s.overlap_param_gather and s.pipeline.stages == 1
        #: gathers issued after the unit before starts (so their segment reads its tables):
        #: ZeRO-3's every microbatch, ZeRO-1/2's chained ones
        self.gather_ahead = zero >= 3 or self.chained_param_gather
        #: without --overlap-grad-reduce, the ops whose backwards end each pipeline stage's pass
        #: (its sources: no producer on the stage but inputs; the backward runs in reverse):
        #: every gradient collective of the stage waits for them
        self.tail: dict[str, tuple[int, ...]] = {}  # unit -> those ops
        if not s.overlap_grad_reduce:
            p, ops, idx = max(1, s.pipeline.stages), ctx.graph.ops, ctx.graph.index
            stage = [s.stage_of.get(op.name, 0) % p for op in ops]
            sources: dict[int, list[int]] = {}
            for oi, op in enumerate(ops):
                if op.kind == "input" or op.is_view:
                    continue
                if all(ops[idx[r.op]].kind == "input" or stage[idx[r.op]] != stage[oi] for r in op.inputs):
                    sources.setdefault(stage[oi], []).append(oi)
            for u, members in self.units.items():
                self.tail[u] = tuple(sources.get(stage[members[0]], [members[0]]))

    def stage_tail(self, unit: str) -> tuple[int, ...]:
        """The ops whose last backwards a unit's gradient collectives wait for when gradient
        reduction is not overlapped (none when it is)."""
        return self.tail.get(unit, ())

    def refs(self, unit: str) -> set[int]:
        """The ops whose tables segment ("sync", unit) reads."""
        refs = set(self.units[unit])
        if self.gather_ahead:
            refs |= {self.prefetch[(unit, ph)] for ph in (FWD, BWD)} - {None}
        refs.update(self.stage_tail(unit))
        return refs


class SyncBuilder:
    """Builds segment ("sync", unit): one parameter unit's gradient synchronisation, its ZeRO
    gathers, and its share of each device's optimizer step (``seg.device_params``)."""

    def __init__(self, ctx: BuildContext, tables: OpTables, emit: Emitter, plan: FsdpPlan) -> None:
        self.ctx, self.tables, self.emit, self.plan = ctx, tables, emit, plan
        #: (id of an op's [part] devices, id of its grid, split columns, ZeRO share, ZeRO?) ->
        #: (devices, grid, [(region key, partitions)]): ops of repeated layers share both
        #: arrays (a 16,384-way op's grouping is an argsort and a sort per group). An entry
        #: holds its arrays, so their ids cannot name others while cached.
        self._groups: dict[tuple, tuple[np.ndarray, np.ndarray, list]] = {}

    def _region_groups(self, oi: int, names: list[str], grid: np.ndarray, split: list[int], share: int,
                       zero: int) -> list[tuple[tuple, np.ndarray]]:
        """[(region key, partition ids)] of op ``oi``'s partitions grouped by the parameter
        region they hold, in ascending code order (vectorised)."""
        t, cfg = self.tables, self.ctx.strategy.configs[self.ctx.graph.ops[oi].name]
        devs = t.devs[oi]
        key = (id(devs), id(grid), tuple(split), share, zero >= 1, self.ctx.graph.ops[oi].signature)
        hit = self._groups.get(key)
        if hit is not None and hit[0] is devs and hit[1] is grid:
            return hit[2]
        if split:
            codes = np.ravel_multi_index(grid[:, split].T, [cfg.degree(names[j]) for j in split])
        else:
            codes = np.zeros(grid.shape[0], np.int64)
        if share > 1:  # a sequence-parallel op: one ZeRO group per tp rank (tp fastest in length)
            codes = codes * share + grid[:, names.index("length")] % share
        order = np.argsort(codes, kind="stable")
        bounds = np.flatnonzero(np.diff(codes[order])) + 1
        parts = np.split(order, bounds)
        if zero >= 1:
            groups = [((np.sort(devs[part_ids]).tobytes(),), part_ids) for part_ids in parts]
        else:  # labelled by the region of the tensor they hold, equal across ops sharing it
            labels = param_keys(self.ctx.graph.ops[oi], cfg, names, grid[[p[0] for p in parts]])
            groups = list(zip(labels, parts))
        if len(self._groups) >= 4096:  # bounded: a long search meets many configs
            self._groups.clear()
        self._groups[key] = (devs, grid, groups)
        return groups

    def build(self, seg: Segment, unit: str) -> None:
        ctx, t, m = self.ctx, self.tables, self.ctx.microbatches
        members = self.plan.units[unit]
        zero = ctx.strategy.zero_stage
        device_params = np.zeros(ctx.n_devices)  # parameters each device's optimizer updates
        pbytes = DTYPE_BYTES[ctx.graph.precision]
        # region -> [devices, (op, parts), elements, tensors counted(, holders)]; a shared tensor its ops
        # cut differently is cut into pieces first
        ops = ctx.graph.ops
        mixed = not zero and len({param_split(ops[oi], ctx.strategy.configs[ops[oi].name]) for oi in members}) > 1
        regions: dict[tuple, list] = self._shared_regions(members) if mixed else {}
        for oi in () if mixed else members:
            op = ctx.graph.ops[oi]
            names, grid = t.grid[oi]
            cfg = ctx.strategy.configs[op.name]
            if zero >= 1:
                # ZeRO shards over data parallelism: a group is the partitions equal on every
                # dim but the data dims, the sample's and the sequence's (a tensor-parallel
                # rank's data x context-parallel group; FSDP and Megatron's distributed
                # optimizer shard over dp x cp), keyed by its devices so that a block's ops on
                # the same group share its collectives
                split = [j for j, n in enumerate(names) if n not in ("sample", "length")]
            else:  # all-reduce over every partition holding the same parameter region
                split = [j for j, n in enumerate(names) if any(ax is not None for ax in op.dim(n).param_axes)]
            elems = op.partition_param_elements(cfg.degrees)
            tensor = op.param_group or op.name  # shared parameters are one tensor
            # partitions grouped by the parameter region they hold
            share = self.plan.zero_shares.get(op.name, 1)
            for key, part_ids in self._region_groups(oi, names, grid, split, share, zero):
                entry = regions.setdefault(key, [[], [], 0.0, set()])
                entry[0].append(t.devs[oi][part_ids])
                entry[1].append((oi, part_ids))
                if tensor not in entry[3]:
                    entry[3].add(tensor)
                    entry[2] += elems
        # (devices, elements, {op: its elements}) of each ZeRO-3 gather group
        gathers: list[tuple[list[int], float, dict[int, float]]] = []
        k = ctx.strategy.shard_group if zero >= 2 else 0
        # ZeRO-3 (FSDP) reduce-scatters every microbatch's gradients as they are made (unless
        # they accumulate unsharded: FSDP's no_sync, once on the last microbatch); otherwise
        # gradients accumulate locally and are synchronised once.
        each = zero >= 3 and not ctx.strategy.accumulate_unsharded
        rows = np.arange(m) if each else np.array([m - 1])
        mbs = rows if each else np.array([-1])
        kind = "reduce_scatter" if zero >= 2 else "all_reduce"
        if mixed:  # [holder] (every partition of every member, in members' order) its backward, device, mirror flag
            h_bwd = np.concatenate([t.bwd[oi][rows] for oi in members], axis=1)
            h_dev = np.concatenate([t.devs[oi] for oi in members])
            h_rep = np.concatenate([t.rep[oi] for oi in members])
        for devs, parts, elems, _, *holders in regions.values():
            if holders:  # (a shared tensor's piece: its holders, ascending)
                if not h_rep[holders[0]].any():
                    continue  # mirrored by a representative region
                preds, pdevs = h_bwd[:, holders[0]], h_dev[holders[0]]
            else:
                if not any(t.rep[oi][ks].any() for oi, ks in parts):
                    continue
                preds = np.concatenate([t.bwd[oi][rows][:, ks] for oi, ks in parts], axis=1)
                pdevs = np.concatenate([t.devs[oi][ks] for oi, ks in parts])
            udevs = np.unique(np.concatenate(devs)).tolist()
            per_op = {} if zero < 3 or ctx.strategy.gather_unit != "op" else {  # (only per-op gathers read it)
                oi: ctx.graph.ops[oi].partition_param_elements(ctx.strategy.configs[ctx.graph.ops[oi].name].degrees)
                for oi, _ in parts}
            for tail in self.plan.stage_tail(unit):
                if tail not in t.bwd:
                    continue
                # gradient reduction not overlapped: it waits for the pass's last backwards on
                # its devices (Megatron-LM without --overlap-grad-reduce reduces the whole grad
                # buffer after the backward)
                at = np.nonzero(t.rep[tail] & np.isin(t.devs[tail], udevs))[0]
                preds = np.concatenate([preds, t.bwd[tail][rows][:, at]], axis=1)
                pdevs = np.concatenate([pdevs, t.devs[tail][at]])
            # hybrid sharding (HSDP, MiCS): shards within groups of k consecutive ranks, the
            # groups replicas of each other; otherwise one group
            subs = [udevs] if not k or k >= len(udevs) else [udevs[i:i + k] for i in range(0, len(udevs), k)]
            done = []  # (sub, reduce ids) of the shard groups a representative is in
            for sub in subs:
                if len(subs) > 1 and not any(d in t.rep_devices for d in sub):
                    continue  # a replica group mirrored by a representative one
                gathers.append((sub, elems, per_op))
                device_params[sub] += elems / len(sub) if zero >= 1 else elems
                on = np.isin(pdevs, sub) if len(subs) > 1 else slice(None)
                ids = self.emit.collectives(seg, kind, elems * pbytes, sub, preds[:, on], members[0], mbs)
                if ids is not None:
                    done.append((sub, ids))
                    if len(subs) == 1:
                        mine = np.array([d for d in sub if d in t.rep_devices], np.int64)
                        seg.edges(tile(ids, mine.size), np.repeat(t.updates[mine], ids.size))
                if zero == 2:
                    # ZeRO-2: parameters are all-gathered (within the shard group) after the
                    # sharded update
                    self._param_gather(seg, unit, members, sub, elems * pbytes)
            if len(subs) > 1 and done:
                # ... then each shard is all-reduced across the replica groups (rank j of every
                # group holds the same shard)
                rs = np.stack([ids for _, ids in done], axis=1)  # [row, group]
                for j in range(len(subs[0])):
                    cross = [s[j] for s in subs]
                    mine = np.array([d for d in cross if d in t.rep_devices], np.int64)
                    if not mine.size:
                        continue
                    ids = self.emit.collectives(seg, "all_reduce", elems / len(subs[0]) * pbytes, cross, rs,
                                                members[0], mbs)
                    if ids is not None:
                        seg.edges(tile(ids, mine.size), np.repeat(t.updates[mine], ids.size))
            if zero == 1:
                # ZeRO-1: parameters are all-gathered after the sharded update
                self._param_gather(seg, unit, members, udevs, elems * pbytes)
        seg.device_params = device_params
        if zero >= 3:
            self._fsdp_gathers(seg, unit, members, gathers)

    def _shared_regions(self, members: list[int]) -> dict[tuple, list]:
        """The all-reduces of a shared tensor (a ``param_group``) whose ops cut it differently
        (an RNN's timesteps under different configs): keyed by their region codes, a half
        held by one timestep and the whole held by the others would be reduced apart, and
        the copies would drift. The tensor is cut at every boundary of every op's regions;
        each piece is reduced over every device holding it, with the contributions of every
        partition holding it, and pieces held by the same devices are reduced together (one
        collective, as a framework buckets them). Entries as ``build``'s ``regions``, with no
        (op, partitions) list (no ZeRO here, so none of ZeRO-3's per-op gathers reads one) and the
        piece's holders after them: indices into every member's partitions, in members' order."""
        ctx, t = self.ctx, self.tables
        dev_of = np.concatenate([t.devs[oi] for oi in members])  # [holder] its device
        groups: dict[bytes, list] = {}  # [device] holds it -> [devices, [holders], elements]
        for i in range(len(ctx.graph.ops[members[0]].params)):
            b_lo, b_hi = (np.concatenate(x) for x in zip(*(self._boxes(oi, i) for oi in members)))
            volume, held, box, on = pieces(b_lo, b_hi, dev_of, ctx.n_devices)
            rows, first, which = unique_rows(on)
            pick = np.zeros((volume.size, rows.shape[0]), np.int64)  # [piece, holder set] one-hot
            pick[np.arange(volume.size), which] = 1
            has = ((held.astype(np.int64) @ pick) > 0)[box]  # [holder, holder set]
            for r in np.argsort(first):  # in order of their first pieces
                entry = groups.setdefault(rows[r].tobytes(), [np.flatnonzero(rows[r]), [], 0.0])
                entry[1].append(np.flatnonzero(has[:, r]))
                entry[2] += float(volume[which == r].sum())
        out = {}
        for key, (devs, holders, elems) in groups.items():
            hs = np.unique(np.concatenate(holders))  # (ascending: by op in members' order, then partition)
            out[("shared", key)] = [[devs], [], elems, set(), hs]
        return out

    def _boxes(self, oi: int, i: int) -> tuple[np.ndarray, np.ndarray]:
        """[part, axis] lo/hi of parameter tensor ``i``'s region each partition of op ``oi``
        holds (ops of one layer under one config share their grid: computed once for them)."""
        op = self.ctx.graph.ops[oi]
        names, grid = self.tables.grid[oi]
        key = ("boxes", op.signature, i, id(grid))
        hit = self._groups.get(key)
        if hit is None or hit[0] is not grid:
            hit = self._groups[key] = (grid, *param_regions(op, self.ctx.strategy.configs[op.name], names, grid, i))
        return hit[1], hit[2]

    def _param_gather(self, seg: Segment, unit: str, members: list[int], devs: list[int], size_bytes: float) -> None:
        """ZeRO-1/2's all-gather of a unit's updated parameters over ``devs``: after the
        devices' optimizer steps; with --overlap-param-gather (Megatron-Core's distributed
        optimizer) instead ahead of the next iteration's forward, bucket by bucket: issued when
        the unit before starts its first forward, the unit's first forward waiting for it
        (the steady state of one iteration: the gather of iteration i's update overlaps
        iteration i+1's forward). With a pipeline, Megatron-LM's default
        ``--align-param-gather`` (on unless ``--no-align-param-gather``) has the pipeline schedule
        dispatch every bucket of a model chunk at once, at the same moment on every stage
        (``schedules.py`` ``param_sync_func`` = the chunk's ``start_param_sync``, which starts
        all its bucket groups; the forward pre-hook then only waits): every gather is issued at
        the iteration's start, and the gathers of one stage queue on its data-parallel links.
        (Chaining them behind the forward instead would pace each stage's first microbatch by
        its gathers and lengthen the pipeline fill by that on every stage: slower than not
        overlapping, which Megatron avoids by aligning.)"""
        t = self.tables
        if not self.ctx.strategy.overlap_param_gather:
            after = [t.updates[d] for d in devs if d in t.rep_devices]
            if after:
                self.emit.collective(seg, "all_gather", size_bytes, devs, after, members[0], -1)
            return
        used = [oi for oi in members if oi in t.fwd]
        if not used:
            return
        before = self.plan.prefetch.get((unit, FWD))
        chained = self.plan.chained_param_gather and before is not None and before in t.fwd
        preds = t.fwd[before][0, :1] if chained else []
        gid = self.emit.collective(seg, "all_gather", size_bytes, devs, preds, min(used), 0)
        if gid < 0:
            return
        for oi in used:
            first = t.fwd[oi][0, t.rep[oi] & np.isin(t.devs[oi], devs)]
            seg.edges(np.full(first.size, gid, np.int64), first)

    def _fsdp_gathers(self, seg: Segment, unit: str, members: list[int],
                      gathers: list[tuple[list[int], float, dict[int, float]]]) -> None:
        """All-gather a unit's parameters before its forward and its backward, every
        microbatch, prefetched one unit ahead (FSDP's forward and backward prefetch): one
        gather per data-parallel group of the unit (``gathers``: devices, elements, elements
        per op), as FSDP with tensor parallelism gathers each rank's shards within its
        data-parallel group. With ``gather_unit`` "op" (DeepSpeed ZeRO-3) each op's parameters
        are gathered on their own, in the order the pass uses them, as many collectives, each
        paying its ring's latency, as there are ops; DeepSpeed prefetches only
        ``stage3_prefetch_bucket_size`` elements ahead (:data:`DEEPSPEED_PREFETCH_ELEMENTS`),
        so the ops are cut into buckets of at most that many parameters (an op larger than it
        is a bucket of its own) and a bucket's gathers are issued when the previous bucket's
        first op starts (the first bucket's at the unit's prefetch point): at scale, where a
        layer's GEMM weights exceed the bucket, one module is fetched ahead of use, not a
        block."""
        ctx, t, m = self.ctx, self.tables, self.ctx.microbatches
        pbytes = DTYPE_BYTES[ctx.graph.precision]
        per_op = ctx.strategy.gather_unit == "op"
        for phase, table, pick in ((FWD, t.fwd, min), (BWD, t.bwd, max)):
            used = [oi for oi in members if oi in table]
            if not used:
                continue
            lead = pick(used)
            before = self.plan.prefetch.get((unit, phase))
            preds = np.zeros((m, 0), np.int64) if before is None or before not in table \
                else table[before][:, :1]  # the next unit's gather starts when the one before starts
            for devs, elems, op_elems in gathers:
                if per_op:
                    order = sorted((oi for oi in used if oi in op_elems), reverse=phase == BWD)
                    pieces = [(op_elems[oi], oi, [oi]) for oi in order]
                else:
                    pieces = [(elems, lead, used)]
                for size, at, waiting, after in prefetch_buckets(pieces, per_op):
                    ahead = preds if after is None else table[after][:, :1]
                    ids = self.emit.collectives(seg, "all_gather", size * pbytes, devs, ahead, at, np.arange(m))
                    if ids is None:
                        continue
                    for oi in waiting:  # the group's own partitions wait for it
                        on_group = t.rep[oi] if len(gathers) == 1 else t.rep[oi] & np.isin(t.devs[oi], devs)
                        mine = table[oi][:, on_group]
                        seg.edges(np.repeat(ids, mine.shape[1]), mine)
