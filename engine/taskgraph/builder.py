"""The task-graph builder: segments of compute, transfer and collective tasks for one training
iteration (see :mod:`engine.taskgraph`)."""

from __future__ import annotations

import gc
import math
from typing import Any

import numpy as np

from ..cluster import Cluster
from ..costs import CostModel, collective_time_s
from ..graph import Op, OpGraph
from ..ops import DTYPE_BYTES, FLOAT_DTYPES, REDUCTION, REPLICA
from ..strategy import Strategy, selective_recompute_reruns
from .regions import classes, coords, in_regions, out_regions, tile, transfer_plan
from .schedule import schedule_order
from .segments import ALL_ARRAYS, MASK, SHIFT, Segment, csr_from_handles
from .symmetry import Symmetry, find_symmetry
from .tasks import BARRIER, BWD, COLL, COLL_INDEX, FWD, UPDATE, XFER, TaskGraph

__all__ = ["TaskGraphBuilder", "build_task_graph"]


class TaskGraphBuilder:
    def __init__(self, graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel,
                 symmetry: Symmetry | None = None) -> None:
        self.g, self.s, self.c, self.cost = graph, strategy, cluster, cost
        self.sym = symmetry
        self.rep: dict[int, np.ndarray] = {}  # op -> [part] True for representative partitions
        self.image: dict[int, np.ndarray] = {}  # op -> [part] the representative it mirrors
        self.segments: dict[tuple, Segment] = {}
        self.slot_of: dict[tuple, int] = {}  # segment key -> slot (canonical order, kept on rebuild)
        self.refs: dict[tuple, set[int]] = {}  # segment key -> ops whose tables it reads
        self.readers: dict[int, set[tuple]] = {}  # op -> keys of the segments that read it
        self.buf: Segment | None = None  # the segment being built
        self._keys: list[tuple] = []  # segment keys in slot order (refreshed when keys are added)
        self._keys_len = -1
        self._asm: dict[str, Any] | None = None  # the last assembly's arrays, spliced by the next
        self.D = cluster.num_devices
        self.m = max(1, strategy.pipeline.microbatches)
        self.precision = graph.precision
        self.fwd: dict[int, np.ndarray] = {}  # op -> [mb, part] task ids
        self.bwd: dict[int, np.ndarray] = {}
        self.fwd_ready: dict[int, np.ndarray] = {}  # op -> [mb, part] task after which the output is readable
        self.grid: dict[int, tuple[list[str], np.ndarray]] = {}
        self.devs: dict[int, np.ndarray] = {}
        self._coll_cache: dict[tuple[int, ...], tuple[float, float, tuple[int, ...]]] = {}
        self.sent: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # transfers made (per tensor), see _per_mb
        self.grad_reduced: dict[tuple, np.ndarray] = {}  # input-gradient all-reduces (per tensor)
        self.plans: dict[tuple, tuple] = {}  # transfer plans of identical edges (repeated layers)
        self.class_cache: dict[tuple, np.ndarray] = {}  # partition classes of identical ops
        names = sorted({d.type for d in cluster.devices})
        self.types = [cluster.device_types[n] for n in names]
        self.type_index = np.array([names.index(d.type) for d in cluster.devices], np.int64)
        self._path_row = None  # device pair -> row of _path_links (see _paths)
        self.link_bw = cluster.arrays["link_bw_bytes_per_s"]
        self.link_lat = cluster.arrays["link_latency_s"]

    # -- helpers --------------------------------------------------------------------
    def group(self, devices) -> tuple[float, float, tuple[int, ...]]:
        key = tuple(sorted(set(int(d) for d in devices)))
        hit = self._coll_cache.get(key)
        if hit is None:
            hit = self._coll_cache[key] = self.c.collective_group(key)
        return hit

    def collective(self, kind: str, size_bytes: float, devices, preds, op: int = -1, mb: int = -1) -> int:
        """Add one collective task over ``devices`` after ``preds``; returns its id (or -1
        when the group is one device: the data is already in place)."""
        ids = self.collectives(kind, size_bytes, devices, np.asarray(preds, np.int64).reshape(1, -1), op,
                               np.asarray([mb]))
        return int(ids[0]) if ids is not None else -1

    def collectives(self, kind: str, size_bytes: float, devices, preds: np.ndarray, op: int,
                    mbs: np.ndarray) -> np.ndarray | None:
        """One collective per row of ``preds`` ([k, n_preds] task ids), all over the same
        ``devices`` and of the same size (e.g. one per microbatch); returns their ids, or
        None when the group is a single device."""
        devs = sorted(set(int(d) for d in devices))
        if len(devs) <= 1 or size_bytes <= 0:
            return None
        bw, lat, links = self.group(devs)
        n = len(devs)
        k = preds.shape[0]
        dur = collective_time_s(kind, size_bytes, n, bw, lat, self.cost.link_efficiency)
        ids = self.buf.add(k, COLL, op=op, mb=mbs, dur=dur, size=size_bytes, coll=COLL_INDEX[kind])
        res = np.asarray([self.D + lk for lk in links], np.int64)
        f = self.buf.flat
        f["coll_h"].append(ids)
        f["coll_nres"].append(np.full(k, res.size, np.int64))
        f["coll_res"].append(tile(res, k))
        f["coll_ndev"].append(np.full(k, n, np.int64))
        f["coll_dev"].append(tile(np.asarray(devs, np.int64), k))
        self.buf.edges(preds, np.repeat(ids, preds.shape[1]))
        factor = 2 * (n - 1) if kind == "all_reduce" else (n - 1)
        self.buf.comm_bytes += factor * size_bytes * k
        return ids

    def transfers(self, src_tasks: np.ndarray, dst_tasks: np.ndarray, src_dev: np.ndarray, dst_dev: np.ndarray,
                  size_bytes: np.ndarray, op: int, mb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Edges from ``src_tasks`` to ``dst_tasks`` through transfer hops where the devices
        differ (vectorised over pairs). Returns the first and last hop of every pair's
        transfer (-1 where no transfer was needed)."""
        first_hop = np.full(src_tasks.size, -1, np.int64)
        last_hop = np.full(src_tasks.size, -1, np.int64)
        same = (src_dev == dst_dev) | (size_bytes <= 0)
        self.buf.edges(src_tasks[same], dst_tasks[same])
        idx = np.nonzero(~same)[0]
        if idx.size == 0:
            return first_hop, last_hop
        # One path lookup per distinct device pair, then one block of hop tasks per path
        # length, vectorised over every transfer with that many hops.
        pair = src_dev[idx].astype(np.int64) * self.D + dst_dev[idx]
        upairs, inverse = np.unique(pair, return_inverse=True)
        table, hop_count = self._paths(upairs)  # [pair, hop] link ids (-1 padded), [pair]
        hops = hop_count
        link_bw = self.link_bw
        link_lat = self.link_lat
        for nh in np.unique(hops):
            mine = hops[inverse] == nh
            sel = idx[mine]
            links = table[inverse[mine], :nh]  # [transfer, hop]
            bottleneck = link_bw[links].min(axis=1) * self.cost.link_efficiency
            size = size_bytes[sel]
            stream = size / bottleneck
            prev = None
            for h in range(nh):
                lk = links[:, h]
                dur = stream + (link_lat[lk] if h == nh - 1 else 0.0)
                ids = self.buf.add(sel.size, XFER, op=op, mb=mb[sel], dur=dur, size=size, link=lk,
                                   res=self.D + lk)
                if prev is None:
                    self.buf.edges(src_tasks[sel], ids)
                    first_hop[sel] = ids
                else:
                    f = self.buf.flat
                    f["chain_from"].append(prev)
                    f["chain_to"].append(ids)
                    f["chain_lag"].append(link_lat[links[:, h - 1]])
                prev = ids
            self.buf.edges(prev, dst_tasks[sel])
            last_hop[sel] = prev
        self.buf.comm_bytes += float(size_bytes[idx].sum())
        return first_hop, last_hop

    def _paths(self, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Link ids ([pair, hop], -1 padded) and hop counts of device pairs
        (``src * D + dst``), from a table filled on first use."""
        if self._path_row is None:
            self._path_row = {} if self.D > 2048 else np.full(self.D * self.D, -1, np.int64)
            self._path_links = np.full((0, 4), -1, np.int64)
            self._path_hops = np.zeros(0, np.int64)
        if isinstance(self._path_row, dict):
            rows = np.array([self._path_row.get(int(k), -1) for k in pairs], np.int64)
        else:
            rows = self._path_row[pairs]
        missing = np.flatnonzero(rows < 0)
        if missing.size:
            found = [self.c.path(int(pairs[j] // self.D), int(pairs[j] % self.D)) for j in missing]
            width = max(self._path_links.shape[1], max(len(pth) for pth in found))
            block = np.full((missing.size, width), -1, np.int64)
            for r, pth in enumerate(found):
                block[r, :len(pth)] = pth
            if width > self._path_links.shape[1]:
                pad = np.full((self._path_links.shape[0], width - self._path_links.shape[1]), -1, np.int64)
                self._path_links = np.hstack([self._path_links, pad])
            first = self._path_links.shape[0]
            self._path_links = np.vstack([self._path_links, block])
            self._path_hops = np.concatenate([self._path_hops, [len(pth) for pth in found]])
            new_rows = np.arange(first, first + missing.size)
            if isinstance(self._path_row, dict):
                for j, r in zip(missing, new_rows):
                    self._path_row[int(pairs[j])] = int(r)
            else:
                self._path_row[pairs[missing]] = new_rows
            rows[missing] = new_rows
        return self._path_links[rows], self._path_hops[rows]

    # -- compute tasks --------------------------------------------------------------
    def _build_compute(self, oi: int) -> None:
        """Segment ("op", oi): the op's forward and backward tasks, its reductions, and its
        edges to the schedule's barriers and the devices' optimizer steps."""
        s, g = self.s, self.g
        recompute = s.recompute
        op = g.ops[oi]
        config = s.configs[op.name]
        devs = np.asarray(config.devices, np.int64)
        self.devs[oi] = devs
        P = devs.size
        sig = (self._signature(op), tuple(config.degrees.items()), self.sym.dims.get(op.name) if self.sym else None,
               recompute == "selective" and selective_recompute_reruns(g, op))
        hit = self.memo.get(sig)
        kinds = self.type_index[devs]
        uk = np.unique(kinds) if len(self.types) > 1 else np.zeros(1, np.int64)
        if hit is None or len(self.types) > 1:
            names, grid = coords(op, config)
            degrees = dict(config.degrees)
            if self.m > 1 and "sample" in op.dim_names:
                degrees["sample"] = degrees.get("sample", 1) * self.m
            fwd_t = np.empty(P)
            bwd_t = np.empty(P)
            for ti in uk:
                f_s, b_s = self.cost.partition_times_s(op, degrees, self.precision, self.types[ti])
                fwd_t[kinds == ti], bwd_t[kinds == ti] = f_s, b_s
            if recompute == "full" and op.kind != "input" or \
                    recompute == "selective" and selective_recompute_reruns(g, op):
                bwd_t = bwd_t + fwd_t
            fwd_f, bwd_f = op.partition_flops(degrees) if op.kind != "input" else (0.0, 0.0)
            rep, image = self._representatives(op, names, grid)
            hit = self.memo[sig] = (names, grid, fwd_t, bwd_t, fwd_f, bwd_f, rep, image)
        names, grid, fwd_t, bwd_t, fwd_f, bwd_f, rep, image = hit
        self.grid[oi] = (names, grid)
        self.rep[oi], self.image[oi] = rep, image
        keep = np.nonzero(rep)[0]
        R = keep.size
        mbs = np.repeat(np.arange(self.m), R)
        parts = tile(keep, self.m)
        dev = tile(devs[keep], self.m)
        f = self.buf.add(self.m * R, FWD, op=oi, part=parts, mb=mbs, device=dev,
                         dur=tile(fwd_t[keep], self.m), flops=fwd_f, res=dev).reshape(self.m, R)
        # every partition's entry points at its representative's task
        slot = np.searchsorted(keep, image)
        self.fwd[oi] = f[:, slot]
        self.fwd_ready[oi] = self.fwd[oi]
        self.bwd.pop(oi, None)
        if op.kind != "input":
            b = self.buf.add(self.m * R, BWD, op=oi, part=parts, mb=mbs, device=dev,
                             dur=tile(bwd_t[keep], self.m), flops=bwd_f, res=dev).reshape(self.m, R)
            self.bwd[oi] = b[:, slot]
            # a partition's backward follows its own forward
            self.buf.edges(f, b)
            # its last backward precedes its device's optimizer step
            self.buf.edges(b[-1], self.update_handles[devs[keep]])
        self._reduce(oi)
        self._barrier_edges(oi)

    @staticmethod
    def _signature(op: Op) -> tuple:
        """What an op's partitions depend on, apart from its name and neighbours."""
        return (op.kind, tuple(t.shape for t in op.in_tensors), tuple(t.shape for t in op.out_tensors),
                tuple(sorted((k, str(v)) for k, v in op.attrs.items())))

    def _representatives(self, op: Op, names: list[str], grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[part] mask of representative partitions and [part] index of each one's image."""
        P = grid.shape[0]
        if self.sym is None or not self.sym.dims.get(op.name):
            return np.ones(P, bool), np.arange(P)
        cols = [names.index(n) for n in self.sym.dims[op.name]]
        rep = np.all(grid[:, cols] == 0, axis=1)
        zeroed = grid.copy()
        zeroed[:, cols] = 0
        shape = [int(grid[:, j].max()) + 1 for j in range(grid.shape[1])]
        image = np.ravel_multi_index(zeroed.T, shape) if shape else np.zeros(P, np.int64)
        return rep, image.astype(np.int64)

    # -- forward reductions -----------------------------------------------------------
    def _reduce(self, oi: int) -> None:
        """All-reduce (or reduce-scatter) partial sums of an op split along a reduction dim."""
        op = self.g.ops[oi]
        names, grid = self.grid[oi]
        red = [n for n in names if op.dim(n).kind == REDUCTION]
        if not red:
            return
        keep = {n for n in names if n not in red}
        cls = classes(grid, names, keep)
        lo, hi = out_regions(op, self.s.configs[op.name], names, grid, 0)
        elems = np.prod(hi - lo, axis=1)
        kind = "reduce_scatter" if self._scatter_after(op) else "all_reduce"
        ready = self.fwd[oi].copy()
        for c in range(int(cls.max()) + 1):
            members = np.nonzero(cls == c)[0]
            if not self.rep[oi][members].any():
                continue  # mirrored by a representative group
            per_mb = self.m if "sample" in op.out_tensors[0].axes else 1
            nbytes = float(elems[members[0]]) * DTYPE_BYTES[op.out_tensors[0].dtype] / per_mb
            ids = self.collectives(kind, nbytes, self.devs[oi][members], self.fwd[oi][:, members], oi,
                                   np.arange(self.m))
            if ids is not None:
                ready[:, members] = ids[:, None]
        self.fwd_ready[oi] = ready

    def _scatter_after(self, op: Op) -> bool:
        """Sequence parallelism: a row-parallel output whose consumers split 'length' over the
        same devices is reduce-scattered (Korthikanti et al. 2022 §4.2.2)."""
        if not self.s.sequence_parallel:
            return False
        cfg = self.s.configs[op.name]
        for user in self.g.consumers(op.name):
            ucfg = self.s.configs[user]
            if ucfg.degree("length") <= 1 or set(ucfg.devices) != set(cfg.devices):
                return False
        return True

    # -- data edges ------------------------------------------------------------------
    def _build_tensor(self, p: int, o: int) -> None:
        """Segment ("tensor", p, o): transfers of output ``o`` of op ``p`` to every consumer,
        and the gradients back (deduplicated per tensor, so the segment stands alone)."""
        g = self.g
        self.sent, self.grad_reduced = {}, {}
        for (c, i) in self.users[(p, o)]:
            prod, cons = g.ops[p], g.ops[c]
            pcfg, ccfg = self.s.configs[prod.name], self.s.configs[cons.name]
            pnames, pgrid = self.grid[p]
            cnames, cgrid = self.grid[c]
            tensor = prod.out_tensors[o]
            # regions are of the whole batch; a microbatch carries 1/m of the sample axis
            nbytes = DTYPE_BYTES[tensor.dtype] / (self.m if "sample" in tensor.axes else 1)
            # forward: holders = producer partitions; identical data across reduction (after
            # the all-reduce) and replica dims
            base = int(min(self.devs[p].min(), self.devs[c].min()))
            pkey = (self._signature(prod), o, tuple(pcfg.degrees.items()), self._signature(cons), i,
                    tuple(ccfg.degrees.items()), (self.devs[p] - base).tobytes(), (self.devs[c] - base).tobytes())
            hit = self.plans.get(pkey)
            if hit is None:
                hkeep = {n for n in pnames if prod.dim(n).out_axis is not None}
                h_lo, h_hi = out_regions(prod, pcfg, pnames, pgrid, o)
                r_lo, r_hi = in_regions(cons, ccfg, cnames, cgrid, i)
                fwd_plan = transfer_plan(h_lo, h_hi, self.devs[p], classes(pgrid, pnames, hkeep), r_lo, r_hi, self.devs[c])
                hit = self.plans[pkey] = (h_lo, h_hi, r_lo, r_hi, fwd_plan, {})
            h_lo, h_hi, r_lo, r_hi, (holder, recv, elems), bwd_plans = hit
            shared = len(self.users[(p, o)]) > 1  # dedupe only matters with several consumers
            self._per_mb(self.fwd_ready[p], self.fwd[c], holder, recv, elems * nbytes, self.devs[p],
                         self.devs[c], c, p, c, key=(p, o) if shared else None)
            # backward: gradients flow back for float tensors into ops that have a backward
            if tensor.dtype not in FLOAT_DTYPES or p not in self.bwd:
                continue
            partial = {n for n in cnames if cons.dim(n).kind != REPLICA
                       and (i >= len(cons.dim(n).in_axes) or cons.dim(n).in_axes[i] is None)}
            ckeep = {n for n in cnames if n not in partial and cons.dim(n).kind != REPLICA}
            ready = self.bwd[c]
            if partial:
                ready = self._grad_reduce(c, cons, cnames, cgrid, r_lo, r_hi, partial, nbytes, (p, o))
            if "bwd" not in bwd_plans:
                bwd_plans["bwd"] = transfer_plan(r_lo, r_hi, self.devs[c], classes(cgrid, cnames, ckeep), h_lo, h_hi,
                                         self.devs[p])
            h2, r2, e2 = bwd_plans["bwd"]
            self._per_mb(ready, self.bwd[p], h2, r2, e2 * nbytes, self.devs[c], self.devs[p], p, c, p,
                         key=(p, o, "grad") if shared and not partial else None, backward=True)

    def _grad_reduce(self, c, cons, cnames, cgrid, r_lo, r_hi, partial, nbytes, tensor) -> np.ndarray:
        """All-reduce partial input gradients over partitions that differ only in dims that
        do not split the input; returns [mb, part] tasks after which each holds the sum.

        Consumers of one tensor on the same devices (Q, K and V reading one LayerNorm) add
        their partial gradients locally first and share one all-reduce, as autograd does."""
        keep = {n for n in cnames if n not in partial}
        ckey = (self._signature(cons), tuple(self.s.configs[cons.name].degrees.items()), tuple(sorted(keep)))
        cls = self.class_cache.get(ckey)
        if cls is None:
            cls = self.class_cache[ckey] = classes(cgrid, cnames, keep)
        ready = self.bwd[c].copy()
        elems = np.prod(r_hi - r_lo, axis=1)
        for k in range(int(cls.max()) + 1):
            members = np.nonzero(cls == k)[0]
            devs = self.devs[c][members]
            if np.unique(devs).size <= 1 or not self.rep[c][members].any():
                continue
            key = (tensor, tuple(sorted(int(d) for d in devs)), int(elems[members[0]]))
            ids = self.grad_reduced.get(key)
            if ids is not None:
                self.buf.edges(self.bwd[c][:, members], np.repeat(ids, members.size))
            else:
                ids = self.collectives("all_reduce", float(elems[members[0]]) * nbytes, devs,
                                       self.bwd[c][:, members], c, np.arange(self.m))
                if ids is not None:
                    self.grad_reduced[key] = ids
            if ids is not None:
                ready[:, members] = ids[:, None]
        return ready

    def _per_mb(self, src_tasks, dst_tasks, holder, recv, size_bytes, src_dev, dst_dev, op,
                src_op: int, dst_op: int, key: tuple | None = None, backward: bool = False) -> None:
        """Transfers for every (holder, receiver) pair, in every microbatch.

        A region is sent to a device once: in the forward pass a second consumer on the same
        device waits for the first one's transfer (``key`` names the tensor); in the backward
        pass gradients for the same producer partition from one device are summed there and
        sent once, after every contributing backward task.
        """
        if holder.size == 0:
            return
        keep = self.rep[dst_op][recv]
        if not keep.all():
            holder, recv, size_bytes = holder[keep], recv[keep], size_bytes[keep]
        if self.sym is not None:
            self.buf.cross_replica += int(np.count_nonzero(~self.rep[src_op][holder] & (size_bytes > 0)))
        if holder.size == 0:
            return
        m = self.m
        moving = (size_bytes > 0) & (src_dev[holder] != dst_dev[recv])
        if key is not None and moving.any():
            # forward: (holder partition, destination device) -> last hops [mb]
            # backward: (producer partition, source device) -> first hops [mb]
            code = (recv * self.D + src_dev[holder]) if backward else (holder * self.D + dst_dev[recv])
            known, rows = self.sent.get(key, (np.zeros(0, np.int64), np.zeros((0, m), np.int64)))
            at = np.minimum(np.searchsorted(known, code), max(known.size - 1, 0))
            old = moving & (known[at] == code) if known.size else np.zeros(holder.size, bool)
            reuse = np.nonzero(old)[0]
            if reuse.size:  # one edge per microbatch to (from) the hops already made
                hops = rows[at[reuse]].ravel()
                if backward:
                    self.buf.edges(src_tasks[:, holder[reuse]].T, hops)
                else:
                    self.buf.edges(hops, dst_tasks[:, recv[reuse]].T)
            fresh = np.nonzero(~old)[0]
            holder, recv, size_bytes, code = holder[fresh], recv[fresh], size_bytes[fresh], code[fresh]
            if holder.size == 0:
                return
        else:
            key = None
        local = (src_dev[holder] == dst_dev[recv]) | (size_bytes <= 0)
        if local.any():  # a dependency, no transfer
            self.buf.edges(src_tasks[:, holder[local]], dst_tasks[:, recv[local]])
            if local.all():
                return
            keep = ~local
            holder, recv, size_bytes = holder[keep], recv[keep], size_bytes[keep]
            if key is not None:
                code = code[keep]
        s = src_tasks[:, holder].ravel()
        d = dst_tasks[:, recv].ravel()
        first, last = self.transfers(s, d, tile(src_dev[holder], m), tile(dst_dev[recv], m),
                                     tile(size_bytes.astype(np.float64), m), op,
                                     np.repeat(np.arange(m), holder.size))
        if key is not None:
            hops = (first if backward else last).reshape(m, holder.size)
            made = hops[0] >= 0
            if made.any():  # remember them (a later pair with the same code wins, as in a dict)
                c_all = np.concatenate([known, code[made]])
                r_all = np.concatenate([rows, hops[:, made].T])
                last_of = c_all.size - 1 - np.unique(c_all[::-1], return_index=True)[1]
                self.sent[key] = (c_all[last_of], r_all[last_of])

    # -- gradient synchronisation and update --------------------------------------------
    def _build_sync(self, members: list[int]) -> None:
        """Segment ("sync", unit): gradient synchronisation of one parameter unit (ops of one
        ``param_group``, or an FSDP block), its ZeRO gathers, and its share of each device's
        optimizer step."""
        zero = self.s.zero_stage
        device_params = np.zeros(self.D)  # parameters each device's optimizer updates
        pbytes = DTYPE_BYTES[self.precision]
        # param region -> (devices, [part tasks per op], elements)
        regions: dict[tuple, list] = {}  # region -> [devices, parts, elements, tensors counted]
        for oi in members:
            op = self.g.ops[oi]
            names, grid = self.grid[oi]
            cfg = self.s.configs[op.name]
            split = [j for j, n in enumerate(names) if any(ax is not None for ax in op.dim(n).param_axes)]
            _, _, pshapes = op.partition_shapes(cfg.degrees)
            elems = float(sum(math.prod(sh) for sh in pshapes))
            tensor = op.param_group or op.name  # shared parameters are one tensor
            # partitions grouped by the parameter region they hold (vectorised)
            if split:
                codes = np.ravel_multi_index(grid[:, split].T, [cfg.degree(names[j]) for j in split])
            else:
                codes = np.zeros(grid.shape[0], np.int64)
            order = np.argsort(codes, kind="stable")
            bounds = np.flatnonzero(np.diff(codes[order])) + 1
            for part_ids in np.split(order, bounds):
                key = (tuple(names[j] for j in split), int(codes[part_ids[0]]))
                entry = regions.setdefault(key, [[], [], 0.0, set()])
                entry[0].append(self.devs[oi][part_ids])
                entry[1].append((oi, part_ids))
                if tensor not in entry[3]:
                    entry[3].add(tensor)
                    entry[2] += elems
        for devs, parts, elems, _ in regions.values():
            if not any(self.rep[oi][ks].any() for oi, ks in parts):
                continue  # mirrored by a representative region
            udevs = sorted(set(np.concatenate(devs).tolist()))
            share = elems / len(udevs) if zero >= 1 else elems
            device_params[udevs] += share
            kind = "reduce_scatter" if zero >= 2 else "all_reduce"
            # ZeRO-3 (FSDP) reduce-scatters every microbatch's gradients as they are made;
            # otherwise gradients accumulate locally and are synchronised once.
            rows = np.arange(self.m) if zero >= 3 else np.array([self.m - 1])
            preds = np.concatenate([self.bwd[oi][rows][:, ks] for oi, ks in parts], axis=1)
            ids = self.collectives(kind, elems * pbytes, udevs, preds, members[0],
                                   rows if zero >= 3 else np.array([-1]))
            if ids is not None:
                mine = np.array([d for d in udevs if d in self.rep_devices], np.int64)
                self.buf.edges(tile(ids, mine.size), np.repeat(self.update_handles[mine], ids.size))
            if zero in (1, 2):
                # ZeRO-1/2: parameters are all-gathered after the sharded update
                preds = [self.update_handles[d] for d in udevs if d in self.rep_devices]
                if preds:
                    self.collective("all_gather", elems * pbytes, udevs, preds, members[0], -1)
        self.buf.device_params = device_params
        if zero >= 3:
            self._fsdp_gathers(members)

    def _sync_unit(self, op: Op) -> str:
        """Parameters synchronised together: a shared ``param_group``; with ZeRO-3, the
        op's block (FSDP wraps whole transformer blocks, as llm-foundry and torchtitan do);
        otherwise the op itself."""
        if op.param_group:
            return op.param_group
        if self.s.zero_stage >= 3 and op.block:
            return f"block:{op.block}"
        return op.name

    def _fsdp_plan(self) -> None:
        """ZeRO-3 / FSDP units and, per pass, the unit each one prefetches after: forward in
        op order, backward in reverse (a tied embedding's unit is first used by the output
        layer)."""
        self.units: dict[str, list[int]] = {}
        for oi, op in enumerate(self.g.ops):
            if op.param_count and op.kind != "input":
                self.units.setdefault(self._sync_unit(op), []).append(oi)
        self.prefetch: dict[tuple[str, int], int | None] = {}  # (unit, phase) -> lead op before it
        for phase, pick, sign in ((FWD, min, 1), (BWD, max, -1)):
            order = sorted(self.units, key=lambda u: sign * pick(self.units[u]))
            prev = None
            for u in order:
                self.prefetch[(u, phase)] = prev
                prev = pick(self.units[u])

    def _fsdp_gathers(self, members: list[int]) -> None:
        """All-gather a unit's parameters before its forward and its backward, every
        microbatch, prefetched one unit ahead (FSDP's forward and backward prefetch)."""
        pbytes = DTYPE_BYTES[self.precision]
        devs = sorted({int(d) for oi in members for d in self.devs[oi]})
        nbytes = 0.0
        seen = set()
        for oi in members:
            op = self.g.ops[oi]
            if (op.param_group or op.name) in seen:
                continue
            seen.add(op.param_group or op.name)
            _, _, pshapes = op.partition_shapes(self.s.configs[op.name].degrees)
            nbytes += float(sum(math.prod(sh) for sh in pshapes)) * pbytes
        unit = self._sync_unit(self.g.ops[members[0]])
        for phase, table, pick in ((FWD, self.fwd, min), (BWD, self.bwd, max)):
            used = [oi for oi in members if oi in table]
            if not used:
                continue
            lead = pick(used)
            before = self.prefetch.get((unit, phase))
            preds = np.zeros((self.m, 0), np.int64) if before is None or before not in table \
                else table[before][:, :1]  # the next unit's gather starts when the one before starts
            ids = self.collectives("all_gather", nbytes, devs, preds, lead, np.arange(self.m))
            if ids is not None:
                for oi in used:
                    mine = table[oi][:, self.rep[oi]]
                    self.buf.edges(np.repeat(ids, mine.shape[1]), mine)

    # -- schedules ---------------------------------------------------------------------
    def _schedule_plan(self) -> None:
        """Fixed segment ("barriers",): for every device, a chain of U - 1 barrier tasks
        between its U schedule units; ops add their own edges to them (_barrier_edges)."""
        pipe = self.s.pipeline
        p, v, m = max(1, pipe.stages), max(1, pipe.virtual_stages), self.m
        self.U = 0
        if m == 1 and p == 1:
            return
        self.chunk_of = np.array([self.s.stage_of.get(op.name, 0) for op in self.g.ops], np.int64)
        # Only a unit's source ops (no producer in the same model chunk) wait for the barrier
        # before it, and only its sink ops (no consumer in the chunk) feed the barrier after
        # it: every other task of the unit is ordered through them by data dependencies. In
        # the backward pass the roles swap; it ends at ops whose producers have no backward.
        n = len(self.g.ops)
        has_prod, has_cons, has_bwd_prod = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
        for (pi, _, ci, _) in self.g.edges:
            if self.chunk_of[pi] == self.chunk_of[ci]:
                has_cons[pi] = True
                has_prod[ci] = True
                if self.g.ops[pi].kind != "input":
                    has_bwd_prod[ci] = True
        self.unit_roles = (has_prod, has_cons, has_bwd_prod)
        self.U = 2 * m * v
        self.rank = np.full((p, v, m, 2), -1, np.int64)
        for stage in range(p):
            order = schedule_order(pipe.schedule, p, v, m, stage) if p > 1 else \
                [(0, k, ph) for k in range(m) for ph in (FWD, BWD)]
            for r, (lc, k, ph) in enumerate(order):
                self.rank[stage, lc, k, ph] = r

    def _barriers_of(self, device: int) -> np.ndarray:
        """Handles of ``device``'s U - 1 barriers: segment ("barriers", device), made on first
        use (its slot is reserved, so the task order does not depend on when)."""
        key = ("barriers", device)
        seg = self.segments.get(key)
        if seg is None:
            seg = self.segments[key] = Segment(self.slot_of[key])
            self._set_refs(key, set())
            seg.barrier_ids = seg.add(self.U - 1, BARRIER)
            if self.U > 2:
                seg.edges(seg.barrier_ids[:-1], seg.barrier_ids[1:])
        return seg.barrier_ids

    def _barrier_edges(self, oi: int) -> None:
        """Edges between an op's source/sink tasks and its devices' schedule barriers."""
        if not self.U:
            return
        p = max(1, self.s.pipeline.stages)
        has_prod, has_cons, has_bwd_prod = self.unit_roles
        chunk = int(self.chunk_of[oi])
        stage, local = chunk % p, (chunk // p if p > 1 else 0)
        keep = np.nonzero(self.rep[oi])[0]
        devs = self.devs[oi][keep]
        for phase, table in ((FWD, self.fwd), (BWD, self.bwd)):
            if oi not in table:
                continue
            is_src = not (has_prod[oi] if phase == FWD else has_cons[oi])
            is_snk = not (has_cons[oi] if phase == FWD else has_bwd_prod[oi])
            if not (is_src or is_snk):
                continue
            r = self.rank[stage, local, :, phase]  # [mb]
            tasks = table[oi][:, keep]  # [mb, rep part]
            bars = np.stack([self._barriers_of(int(d)) for d in devs], axis=1)  # [U - 1, rep part]
            cols = np.arange(devs.size)[None, :]
            if is_snk:
                ok = r < self.U - 1
                self.buf.edges(tasks[ok], bars[r[ok][:, None], cols])
            if is_src:
                ok = r > 0
                self.buf.edges(bars[r[ok][:, None] - 1, cols], tasks[ok])

    def _device_image(self) -> np.ndarray:
        """[device] the representative device whose timeline each device mirrors (itself
        without symmetry; -1 for unused devices)."""
        image = np.full(self.D, -1, np.int64)
        if self.sym is None:  # every partition is a representative: used devices mirror themselves
            used = np.fromiter(self.rep_devices, np.int64, len(self.rep_devices))
            image[used] = used
            return image
        for oi in self.devs:
            image[self.devs[oi]] = self.devs[oi][self.image[oi]]
        return image

    # -- segments ----------------------------------------------------------------------
    def _begin(self, key: tuple, refs) -> None:
        slot = self.slot_of.setdefault(key, len(self.slot_of))
        self.buf = self.segments[key] = Segment(slot)
        self._set_refs(key, set(refs))

    def build(self) -> TaskGraph:
        self.memo: dict[tuple, tuple] = {}  # identical ops (repeated layers) under identical configs
        self.users: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for (p, o, c, i) in self.g.edges:
            self.users.setdefault((p, o), []).append((c, i))
        self._fsdp_plan()
        for d in range(self.D):  # reserved: made only for devices with tasks
            self.slot_of[("barriers", d)] = d
        self._schedule_plan()
        self._begin(("updates",), ())
        self.update_handles = self.buf.add(self.D, UPDATE, device=np.arange(self.D), res=np.arange(self.D))
        for oi in range(len(self.g.ops)):
            self._begin(("op", oi), (oi,))
            self._build_compute(oi)
        self.rep_devices = self._rep_devices()
        for (p, o), users in self.users.items():
            self._begin(("tensor", p, o), {p, *(c for c, _ in users)})
            self._build_tensor(p, o)
        for unit, members in self.units.items():
            self._begin(("sync", unit), self._sync_refs(unit, members))
            self._build_sync(members)
        self.buf = None
        return self.assemble()

    def _rep_devices(self) -> set[int]:
        """Devices that run a representative partition of some op (and, per device, how
        many ops do: kept up to date by :meth:`_count_rep_devices` on a rebuild)."""
        self._rep_count = np.zeros(self.D, np.int64)
        self._rep_devs_of = {}
        for oi in self.devs:
            self._count_rep_devices(oi)
        return set(np.flatnonzero(self._rep_count).tolist())

    def _count_rep_devices(self, oi: int) -> bool:
        """Recount op ``oi``'s devices with representative partitions; whether the set of
        such devices over all ops may have changed."""
        old = self._rep_devs_of.get(oi)
        new = np.unique(self.devs[oi][self.rep[oi]])
        if old is not None:
            if np.array_equal(old, new):
                return False
            self._rep_count[old] -= 1
        self._rep_count[new] += 1
        self._rep_devs_of[oi] = new
        return True

    def _sync_refs(self, unit: str, members: list[int]) -> set[int]:
        refs = set(members)
        if self.s.zero_stage >= 3:
            refs |= {self.prefetch[(unit, ph)] for ph in (FWD, BWD)} - {None}
        return refs

    def _set_refs(self, key: tuple, refs: set[int]) -> None:
        for o in self.refs.get(key, ()):
            self.readers[o].discard(key)
        self.refs[key] = refs
        for o in refs:
            self.readers.setdefault(o, set()).add(key)

    def _reading(self, oi: int) -> list[tuple]:
        """Keys of the segments that read op ``oi``, in slot (build) order."""
        return sorted(self.readers.get(oi, ()), key=self.slot_of.__getitem__)

    def rebuild(self, strategy: Strategy, op: str) -> TaskGraph:
        """Change ``op``'s config to ``strategy``'s and rebuild only the segments that read
        it (its compute, the tensors it makes or reads, its parameter unit and the units that
        prefetch after it). The result is identical, array for array, to a full build of
        ``strategy`` (segments keep their slots, so the task order is the same)."""
        oi = self.g.index[op]
        self.s = strategy
        affected = self._reading(oi)
        self._begin(("op", oi), (oi,))
        self._build_compute(oi)
        if self._count_rep_devices(oi):
            self.rep_devices = set(np.flatnonzero(self._rep_count).tolist())
        for key in affected:
            if key[0] == "tensor":
                self._begin(key, self.refs[key])
                self._build_tensor(key[1], key[2])
        for key in affected:
            if key[0] == "sync":
                members = self.units[key[1]]
                self._begin(key, self._sync_refs(key[1], members))
                self._build_sync(members)
        self.buf = None
        return self.assemble()

    def _spliced(self, segs: list[Segment], serials: np.ndarray) -> dict[str, Any]:
        """Every column and flat array of ``segs`` concatenated, with each segment's bounds.

        The first assembly concatenates everything; later ones (after :meth:`rebuild`) copy
        runs of segments unchanged since the previous assembly as slices of its arrays and
        insert only the new segments, so the Python work is per changed segment."""
        whole = Segment.freeze_all(segs)
        prev = self._asm
        if whole is not None or prev is None:
            if whole is None:  # no previous assembly to splice from (not reached by build())
                whole = {"arrays": {}, "bounds": {}}
                frozen = [sg.freeze() for sg in segs]
                for name in ALL_ARRAYS:
                    parts = [f["cols"][name] if name in Segment._DTYPES else f[name] for f in frozen]
                    whole["arrays"][name] = np.concatenate(parts)
                    whole["bounds"][name] = np.concatenate([[0], np.cumsum([x.size for x in parts])])
            whole["arrays"]["dur"] = whole["arrays"]["dur"].copy()  # optimizer steps are written in
            return whole
        # each segment's index in the previous assembly (by serial; -1 when new), then runs
        # of consecutive previous segments and the new segments between them
        p_ser, p_order = prev["serials"], prev["serial_order"]
        k = np.minimum(np.searchsorted(p_ser[p_order], serials), p_ser.size - 1)
        j = np.where(p_ser[p_order[k]] == serials, p_order[k], -1)
        kept = j >= 0
        run_start = kept & np.concatenate([[True], (j[1:] != j[:-1] + 1) | ~kept[:-1]])
        begin = np.flatnonzero(run_start | ~kept).tolist() + [len(segs)]
        pieces: list = []  # [first, end) runs of the previous assembly's segments, or new segments
        for b, e in zip(begin[:-1], begin[1:]):
            pieces.append([int(j[b]), int(j[b]) + e - b] if kept[b] else segs[b])
        frozen = {id(p): p.freeze() for p in pieces if type(p) is not list}
        arrays, bounds = {}, {}
        for name in ALL_ARRAYS:
            w, off = prev["arrays"][name], prev["bounds"][name]
            parts, ends = [], [np.zeros(1, np.int64)]
            at = 0  # elements so far
            for p in pieces:
                if type(p) is list:
                    a, b = off[p[0]], off[p[1]]
                    parts.append(w[a:b])
                    ends.append(off[p[0] + 1:p[1] + 1] + (at - a))
                    at += b - a
                else:
                    f = frozen[id(p)]
                    x = f["cols"][name] if name in Segment._DTYPES else f[name]
                    parts.append(x)
                    at += x.size
                    ends.append(np.array([at], np.int64))
            arrays[name] = np.concatenate(parts)
            bounds[name] = np.concatenate(ends)
        return {"arrays": arrays, "bounds": bounds}

    def assemble(self) -> TaskGraph:
        """Concatenate the segments in slot order and turn handles into task ids."""
        if self._keys_len != len(self.segments):
            self._keys = sorted(self.segments, key=self.slot_of.__getitem__)
            self._keys_len = len(self.segments)
        segs = [self.segments[k] for k in self._keys if k[0] != "barriers" or k[1] in self.rep_devices]
        serials = np.fromiter((sg.serial for sg in segs), np.int64, len(segs))
        asm = self._spliced(segs, serials)
        A = asm["arrays"]
        starts = asm["bounds"]["kind"]
        n = int(starts[-1])
        slots = np.array([sg.slot for sg in segs], np.int64)
        offset = np.zeros(int(slots.max()) + 1, np.int64)
        offset[slots] = starts[:-1]

        def gid(h: np.ndarray) -> np.ndarray:
            return offset[h >> SHIFT] + (h & MASK)

        cols = {k: A[k] for k in Segment._DTYPES}
        # optimizer steps: one per device that runs a representative partition
        params = np.zeros(self.D)
        comm_bytes, cross = 0.0, 0
        for sg in segs:
            if sg.device_params is not None:
                params += sg.device_params
            comm_bytes += sg.comm_bytes
            cross += sg.cross_replica
        upd = gid(self.update_handles)
        cols["dur"][upd] = [self.cost.optimizer_time_s(params[d], self.c.device_type(d))
                            if d in self.rep_devices else 0.0 for d in range(self.D)]
        # resources: one per task (its device or link), several for a collective
        single = cols["res"]
        counts = (single >= 0).astype(np.int64)
        coll = gid(A["coll_h"])
        counts[coll] = A["coll_nres"]
        res_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=res_ptr[1:])
        res_idx = np.empty(res_ptr[-1], np.int64)
        has = np.nonzero(single >= 0)[0]
        res_idx[res_ptr[has]] = single[has]
        if coll.size:
            m_len = A["coll_nres"]
            starts_m = np.repeat(res_ptr[coll], m_len)
            within = np.arange(m_len.sum()) - np.repeat(np.cumsum(m_len) - m_len, m_len)
            res_idx[starts_m + within] = A["coll_res"]
        # successors, CSR by source (a duplicate edge is harmless: npred counts it as often)
        succ_ptr, succ_idx, npred = csr_from_handles(A["src"], A["dst"], offset, n)
        chain_next = np.full(n, -1, np.int64)
        chain_lag = np.zeros(n)
        cf = A["chain_from"]
        if cf.size:
            chain_next[gid(cf)] = gid(A["chain_to"])
            chain_lag[gid(cf)] = A["chain_lag"]
        # collectives' devices
        ptr = np.zeros(coll.size + 1, np.int64)
        np.cumsum(A["coll_ndev"], out=ptr[1:])
        tg = TaskGraph(
            kind=cols["kind"], op=cols["op"], part=cols["part"], mb=cols["mb"], device=cols["device"],
            dur_s=cols["dur"], size_bytes=cols["size"], flops=cols["flops"], coll=cols["coll"], link=cols["link"],
            res_ptr=res_ptr, res_idx=res_idx, succ_ptr=succ_ptr, succ_idx=succ_idx, npred=npred,
            chain_next=chain_next, chain_lag_s=chain_lag, n_devices=self.D, n_links=len(self.c.links),
            comm_bytes=comm_bytes)
        tg.info = {"microbatches": self.m, "ops": len(self.g.ops), "coll_devices": (ptr, A["coll_dev"], coll),
                   "symmetry": self.sym, "cross_replica_transfers": cross,
                   "device_image": self._device_image(),
                   # per segment, in task order: slot, first task id, tasks, serial (identity of
                   # its contents): which tasks a delta simulation can reuse
                   "segments": (slots, starts[:-1].copy(), np.diff(starts), serials)}
        # the arrays are spliced from on the next assembly: TaskGraph arrays are never modified
        self._asm = {**asm, "serials": serials, "serial_order": np.argsort(serials)}
        return tg

    def snapshot(self, op: str) -> dict[str, Any]:
        """What :meth:`rebuild` of ``op`` replaces, so that :meth:`restore` can undo it."""
        oi = self.g.index[op]
        keys = self._reading(oi)
        tables = {name: getattr(self, name).get(oi) for name in ("fwd", "bwd", "fwd_ready", "devs", "grid", "rep",
                                                               "image")}
        return {"oi": oi, "segments": {k: (self.segments[k], self.refs[k]) for k in keys}, "tables": tables,
                "strategy": self.s, "rep_devices": set(self.rep_devices), "asm": self._asm,
                "rep_devs_of": self._rep_devs_of[oi]}

    def restore(self, snap: dict[str, Any]) -> None:
        oi = snap["oi"]
        for k, (seg, refs) in snap["segments"].items():
            self.segments[k] = seg
            self._set_refs(k, refs)
        for name, value in snap["tables"].items():
            table = getattr(self, name)
            if value is None:
                table.pop(oi, None)
            else:
                table[oi] = value
        self._rep_count[self._rep_devs_of[oi]] -= 1
        self._rep_count[snap["rep_devs_of"]] += 1
        self._rep_devs_of[oi] = snap["rep_devs_of"]
        self.s = snap["strategy"]
        self.rep_devices = snap["rep_devices"]
        self._asm = snap["asm"]


def build_task_graph(graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel | None = None,
                     symmetry: str = "auto") -> TaskGraph:
    """Build the task graph of one training iteration of ``graph`` under ``strategy``.

    Parameters
    ----------
    graph, strategy, cluster
        ``strategy`` must be valid for them (:func:`engine.strategy.validate_strategy`).
    cost : CostModel, optional
        Defaults to the calibrated roofline.
    symmetry : {"auto", "off"}
        ``auto`` simulates one representative per set of identical replicas when
        :func:`find_symmetry` finds an exact symmetry (and no transfer crosses replicas);
        the timeline then holds the representatives' tasks, and ``info["device_image"]``
        maps every device to the representative it mirrors.

    Returns
    -------
    TaskGraph
    """
    cost = cost or CostModel()
    # The builder makes few Python objects but many arrays; pausing the cyclic garbage
    # collector avoids its full passes over a large heap (no reference cycles are made).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        sym = find_symmetry(graph, strategy, cluster) if symmetry == "auto" else None
        if sym is not None:
            tg = TaskGraphBuilder(graph, strategy, cluster, cost, sym).build()
            if tg.info["cross_replica_transfers"] == 0:
                return tg
        return TaskGraphBuilder(graph, strategy, cluster, cost).build()
    finally:
        if was_enabled:
            gc.enable()
