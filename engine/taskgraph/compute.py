"""Compute segments: an op's forward and backward tasks on every partition and microbatch, and
the collectives that sum partial outputs of an op split along a reduction dim."""

from __future__ import annotations

import math

import numpy as np

from ..graph import Op
from ..moe import expert_loads, gate_factor
from ..ops import DTYPE_BYTES, EXPERT, REDUCTION, experts_capacity_share
from ..strategy.recompute import recompute_reruns
from ..strategy import partition_grid
from .context import BuildContext, OpTables
from .emit import Emitter
from .regions import classes, in_regions, out_regions, tile
from .segments import Segment
from .tasks import BWD, FWD

__all__ = ["ComputeBuilder", "op_signature", "spread"]


def op_signature(op: Op) -> tuple:
    """What an op's partitions depend on, apart from its name and neighbours (identical
    layers of a deep model share it, and so share their tables): :attr:`Op.signature`."""
    return op.signature


def spread(tasks: np.ndarray, slot: np.ndarray) -> np.ndarray:
    """[mb, part] task handles of every partition from the representatives' ``tasks`` [mb, rep]
    (``slot``: [part] each partition's representative column). Where one representative stands
    for every partition (symmetry's common case) a read-only broadcast view: on GPT-3 175B on
    1,024 GPUs the op tables held 710 MB of copies of one column (64 partitions x 192
    microbatches x 3 tables x 2,410 ops) for a 25 MB graph. Readers index them; none writes."""
    if tasks.shape[1] != 1:
        return tasks[:, slot]
    if not tasks.flags.c_contiguous:
        return np.broadcast_to(tasks, (tasks.shape[0], slot.size))
    # (what np.broadcast_to makes, at a third of its cost: it is called once per op and pass)
    out = np.ndarray((tasks.shape[0], slot.size), tasks.dtype, buffer=tasks, strides=(tasks.strides[0], 0))
    out.flags.writeable = False
    return out


class ComputeBuilder:
    """Builds segment ("op", oi) and publishes the op's rows of :class:`OpTables`."""

    def __init__(self, ctx: BuildContext, tables: OpTables, emit: Emitter) -> None:
        self.ctx, self.tables, self.emit = ctx, tables, emit
        #: op signature, degrees, symmetric dims, recomputed? -> the partition tables of that
        #: op (identical ops of repeated layers under identical configs compute them once)
        self._memo: dict[tuple, tuple] = {}
        #: id of a config's device tuple -> (the tuple, it as an array): ops of repeated layers
        #: share tuples of up to 16,384 ids. The entry holds the tuple, so its id cannot be
        #: reused by another tuple while cached (a rebuild brings new configs).
        self._devices: dict[int, tuple[tuple, np.ndarray]] = {}

    def build(self, seg: Segment, oi: int) -> None:
        """The op's forward and backward tasks, the backward's edge to the optimizer steps,
        and its forward reductions."""
        ctx, t = self.ctx, self.tables
        s, g, m = ctx.strategy, ctx.graph, ctx.microbatches
        op = g.ops[oi]
        config = s.configs[op.name]
        hit = self._devices.get(id(config.devices))
        if hit is None or hit[0] is not config.devices:
            if len(self._devices) >= 4096:  # bounded: a long search meets many configs
                self._devices.clear()
            hit = self._devices[id(config.devices)] = (config.devices, np.asarray(config.devices, np.int64))
        devs = hit[1]
        t.devs[oi] = devs
        # forward again before backward: the recomputed forward's time is added to the backward
        # task (full: every op; selective: the attention core; selective-op: the checkpointed
        # layers' ops whose outputs torchtitan's policy does not save)
        reruns = recompute_reruns(g, op, s.recompute, s.fp8, s.recompute_modules)
        sig = (op_signature(op), tuple(config.degrees.items()), ctx.sym.dims.get(op.name) if ctx.sym else None,
               reruns)
        hit = self._memo.get(sig)
        if hit is None or self.emit.heterogeneous:
            names, grid = partition_grid(op, config)
            degrees = dict(config.degrees)
            if ctx.split > 1 and "sample" in op.dim_names:
                degrees["sample"] = degrees.get("sample", 1) * ctx.split
            fwd_t, bwd_t = self.emit.partition_times_s(op, degrees, devs)
            if reruns:
                bwd_t = bwd_t + fwd_t
            fwd_f, bwd_f = op.partition_flops(degrees) if op.kind != "input" else (0.0, 0.0)
            rep, image = self._representatives(op, names, grid)
            hit = self._memo[sig] = (names, grid, fwd_t, bwd_t, fwd_f, bwd_f, rep, image)
        names, grid, fwd_t, bwd_t, fwd_f, bwd_f, rep, image = hit
        t.grid[oi] = (names, grid)
        t.rep[oi], t.image[oi] = rep, image
        t.fwd_s[oi] = fwd_t
        self.emit.mirror(devs, devs[image])
        keep = np.nonzero(rep)[0]
        R = keep.size
        mbs = np.repeat(np.arange(m), R)
        parts = tile(keep, m)
        dev = tile(devs[keep], m)
        f = seg.add(m * R, FWD, op=oi, part=parts, mb=mbs, device=dev, dur=tile(fwd_t[keep], m), flops=fwd_f,
                    res=dev).reshape(m, R)
        # every partition's entry points at its representative's task
        slot = np.searchsorted(keep, image)
        t.fwd[oi] = spread(f, slot)
        t.fwd_ready[oi] = t.fwd[oi]
        t.bwd.pop(oi, None)
        if op.kind != "input":
            b = seg.add(m * R, BWD, op=oi, part=parts, mb=mbs, device=dev, dur=tile(bwd_t[keep], m), flops=bwd_f,
                        res=dev).reshape(m, R)
            t.bwd[oi] = spread(b, slot)
            seg.edges(f, b)  # a partition's backward follows its own forward
            seg.edges(b[-1], t.updates[devs[keep]])  # its last backward precedes the optimizer step
        redo = self._reduce(seg, oi, bool(reruns) and op.kind != "experts")
        for table in (t.fwd_in, t.bwd_in, t.bwd_out):
            table.pop(oi, None)
        if redo is not None:
            t.bwd_in[oi] = redo
        if op.kind == "experts":
            self._dispatch(seg, oi, bool(reruns), bwd_t)

    def _representatives(self, op: Op, names: list[str], grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[part] mask of representative partitions and [part] index of each one's image."""
        P = grid.shape[0]
        sym = self.ctx.sym
        if sym is None or not sym.dims.get(op.name):
            return np.ones(P, bool), np.arange(P)
        cols = [names.index(n) for n in sym.dims[op.name]]
        rep = np.all(grid[:, cols] == 0, axis=1)
        zeroed = grid.copy()
        zeroed[:, cols] = 0
        shape = [int(grid[:, j].max()) + 1 for j in range(grid.shape[1])]
        image = np.ravel_multi_index(zeroed.T, shape) if shape else np.zeros(P, np.int64)
        return rep, image.astype(np.int64)

    def _reduce(self, seg: Segment, oi: int, rerun: bool = False) -> np.ndarray | None:
        """All-reduce (or reduce-scatter) partial sums of an op split along a reduction dim;
        consumers then read after the collective (``fwd_ready``).

        ``rerun``: the op's forward runs again before its backward (full recomputation), and
        so does this collective: Megatron-LM's checkpointed layer re-executes its forward,
        tensor-parallel all-reduces included (Korthikanti et al. 2022, Table 4: full
        recomputation adds 7.6 ms to the 22B layer's backward, its whole 7.7 ms forward). The
        second collective waits for the op's output gradient and gates its backward; returns
        those [mb, part] tasks (the op's ``bwd_in``), or None."""
        t, m = self.tables, self.ctx.microbatches
        op = self.ctx.graph.ops[oi]
        names, grid = t.grid[oi]
        red = [n for n in names if op.dim(n).kind == REDUCTION]
        if not red:
            return None
        keep = {n for n in names if n not in red}
        cls = classes(grid, names, keep)
        lo, hi = out_regions(op, self.ctx.strategy.configs[op.name], names, grid, 0)
        elems = np.prod(hi - lo, axis=1)
        kind = "reduce_scatter" if self.scatter_after(op) else "all_reduce"
        ready = t.fwd[oi].copy()
        redo = t.bwd[oi].copy() if rerun and oi in t.bwd else None
        for c in np.unique(cls[t.rep[oi]]).tolist():  # groups with a representative (the rest mirror them)
            members = np.nonzero(cls == c)[0]
            per_mb = self.ctx.split if "sample" in op.out_tensors[0].axes else 1
            nbytes = float(elems[members[0]]) * DTYPE_BYTES[op.out_tensors[0].dtype] / per_mb
            # Megatron-Core's --tp-comm-overlap pipelines this collective with the GEMM before it
            hide = float(t.fwd_s[oi][members[0]]) if self.ctx.strategy.tp_comm_overlap else 0.0
            ids = self.emit.collectives(seg, kind, nbytes, t.devs[oi][members], t.fwd[oi][:, members], oi,
                                        np.arange(m), overlap_s=hide)
            if ids is not None:
                ready[:, members] = ids[:, None]
                if redo is not None:  # after the forward's, and the output gradient (from the dataflow)
                    again = self.emit.collectives(seg, kind, nbytes, t.devs[oi][members], ids[:, None], oi,
                                                  np.arange(m), overlap_s=hide)
                    cols = members[np.unique(t.bwd[oi][0, members], return_index=True)[1]]  # distinct tasks
                    seg.edges(np.repeat(again[:, None], cols.size, axis=1), t.bwd[oi][:, cols])
                    redo[:, members] = again[:, None]
        t.fwd_ready[oi] = ready
        return redo

    def _dispatch(self, seg: Segment, oi: int, recomputed: bool, bwd_s: np.ndarray) -> None:
        """A mixture-of-experts layer's token exchange over each expert-parallel group (the
        partitions that differ only in their expert dims): before the experts run, every
        token copy goes to the rank holding its expert (dispatch), and comes back after
        (combine); in the backward pass the output gradients go out the same way and the
        input gradients come back (Lepikhin et al., GShard 2020 §2.2; Megatron-Core's
        ``MoEAlltoAllTokenDispatcher``: four all-to-alls per layer and microbatch).

        ``alltoall``: each rank shares out its tokens x top_k x capacity share rows of the
        hidden size, priced at the busiest rank's load under the routing what-if
        (:func:`engine.moe.gate_factor`). ``allgather``: every rank gathers the group's
        tokens and reduce-scatters the outputs (``MoEAllGatherTokenDispatcher``). A recomputed
        layer re-runs its dispatch and combine before the backward's (three exchanges' bytes
        in the backward's first). ``bwd_s``: [part] the experts' backward seconds (the merged
        1F1B's hiding budget for the forward exchanges)."""
        t, m, s = self.tables, self.ctx.microbatches, self.ctx.strategy
        op = self.ctx.graph.ops[oi]
        names, grid = t.grid[oi]
        cfg = s.configs[op.name]
        experts = [n for n in names if op.dim(n).kind == EXPERT]
        if not experts:
            return
        ep = math.prod(cfg.degree(n) for n in experts)
        cls = classes(grid, names, {n for n in names if n not in experts})
        x = op.in_tensors[0]
        lo, hi = in_regions(op, cfg, names, grid, 0)
        tokens = np.prod(hi[:, :-1] - lo[:, :-1], axis=1) / (self.ctx.split if "sample" in x.axes else 1)
        row_bytes = x.shape[-1] * DTYPE_BYTES[x.dtype]
        if op.attrs.get("dispatcher", "alltoall") == "alltoall":
            kinds = ("all_to_all", "all_to_all")
            loads = expert_loads(op.attrs["num_experts"], histogram=s.expert_loads) if s.expert_loads else None
            size = tokens * op.attrs["top_k"] * experts_capacity_share(op.attrs) * row_bytes * gate_factor(loads, ep)
        else:
            kinds = ("all_gather", "reduce_scatter")
            size = tokens * ep * row_bytes
        fwd_in, fwd_ready = t.fwd[oi].copy(), t.fwd_ready[oi].copy()
        bwd_in, bwd_out = t.bwd[oi].copy(), t.bwd[oi].copy()
        none, mbs = np.zeros((m, 0), np.int64), np.arange(m)
        # the merged 1F1B schedule (--overlap-moe-expert-parallel-comm) hides each exchange under
        # the partner microbatch's compute of this layer: half the experts' backward for a forward
        # one, half their forward for a backward one; it needs a partner (two microbatches)
        merged = s.moe_comm_overlap and m > 1
        for c in np.unique(cls[t.rep[oi]]).tolist():  # groups with a representative (the rest mirror them)
            members = np.nonzero(cls == c)[0]
            devs = t.devs[oi][members]
            nbytes = float(size[members[0]])
            cols = members[np.unique(t.fwd[oi][0, members], return_index=True)[1]]  # distinct tasks
            f_hide = float(bwd_s[members[0]]) / 2 if merged else 0.0
            b_hide = float(t.fwd_s[oi][members[0]]) / 2 if merged else 0.0
            d = self.emit.collectives(seg, kinds[0], nbytes, devs, none, oi, mbs, hide_s=f_hide)
            if d is None:
                continue
            seg.edges(np.repeat(d[:, None], cols.size, axis=1), t.fwd[oi][:, cols])
            fwd_in[:, members] = d[:, None]
            r = self.emit.collectives(seg, kinds[1], nbytes, devs, t.fwd_ready[oi][:, cols], oi, mbs, hide_s=f_hide)
            fwd_ready[:, members] = r[:, None]
            bi = self.emit.collectives(seg, kinds[0], nbytes * (3 if recomputed else 1), devs, none, oi, mbs,
                                       hide_s=b_hide)
            seg.edges(np.repeat(bi[:, None], cols.size, axis=1), t.bwd[oi][:, cols])
            bwd_in[:, members] = bi[:, None]
            bo = self.emit.collectives(seg, kinds[1], nbytes, devs, t.bwd[oi][:, cols], oi, mbs, hide_s=b_hide)
            bwd_out[:, members] = bo[:, None]
        t.fwd_in[oi], t.fwd_ready[oi], t.bwd_in[oi], t.bwd_out[oi] = fwd_in, fwd_ready, bwd_in, bwd_out

    def scatter_after(self, op: Op) -> bool:
        """Sequence parallelism: a row-parallel output whose consumers split 'length' over the
        same devices is reduce-scattered (Korthikanti et al. 2022 §4.2.2)."""
        s = self.ctx.strategy
        if not s.sequence_parallel:
            return False
        cfg = s.configs[op.name]
        for user in self.ctx.graph.consumers(op.name):
            ucfg = s.configs[user]
            if ucfg.degree("length") <= 1 or set(ucfg.devices) != set(cfg.devices):
                return False
        return True
