"""The one place tasks get their durations: compute partitions by device type, transfer hops
along network paths, collectives over their groups, and optimizer steps."""

from __future__ import annotations

import math

import numpy as np

from ..costs.offload import HOST_BW_BYTES_PER_S, NVME_BW_BYTES_PER_S, host_optimizer_time_s
from ..costs import group_collective_time_s, transfer_time_s
from ..graph import Op
from ..moe import expert_loads, gate_factor
from ..ops import DTYPE_BYTES, EXPERT
from .context import BuildContext
from .regions import tile
from .segments import Segment
from .tasks import COLL, COLL_INDEX, XFER

__all__ = ["Emitter"]


class Emitter:
    """Adds transfer and collective tasks to a segment, and prices compute partitions and
    optimizer steps, with the cluster's paths looked up once per build.

    Transfers over several links are one task per link, pipelined (cut-through): hop k+1 may
    start ``latency_k`` after hop k starts (the segment's chain arrays), and every hop streams
    for ``bytes / min(bandwidth x its kind's data-rate share)``; the last hop adds its own latency, so an
    uncontended transfer takes ``sum(latency) + bytes / bottleneck``."""

    def __init__(self, ctx: BuildContext) -> None:
        self.ctx = ctx
        cluster = ctx.cluster
        names = sorted({d.type for d in cluster.devices})
        self.device_types = [cluster.device_types[n] for n in names]
        self.type_of = np.array([names.index(d.type) for d in cluster.devices], np.int64)  # [device]
        self.link_bw = cluster.arrays["link_bw_bytes_per_s"]  # [link]
        share = ctx.cost.links
        #: [link] the rate data moves at: nominal x its kind's share (engine.costs.LinkShares)
        self.link_rate = self.link_bw * np.array([share(lk.kind) for lk in cluster.links])
        self.link_lat = cluster.arrays["link_latency_s"]  # [link]
        self._paths = _PathTable(cluster)
        # Under symmetry a representative's transfers and collectives stand for their mirror
        # images: [device] the representative each device mirrors (-1: not known yet), filled
        # op by op as compute segments are made, and the number of replicas.
        self._image = np.full(cluster.num_devices, -1, np.int64) if ctx.sym is not None else None
        self._replicas = ctx.sym.replicas if ctx.sym is not None else 1

    @property
    def heterogeneous(self) -> bool:
        """Whether the cluster has several device types (partition times depend on where)."""
        return len(self.device_types) > 1

    # -- compute ---------------------------------------------------------------------
    def partition_times_s(self, op: Op, degrees: dict[str, int], devs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[part] forward and backward seconds of ``op``'s partitions on ``devs`` (one cost
        per device type present)."""
        kinds = self.type_of[devs]
        fwd_s = np.empty(devs.size)
        bwd_s = np.empty(devs.size)
        for ti in (np.unique(kinds) if self.heterogeneous else np.zeros(1, np.int64)):
            f_s, b_s = self.ctx.cost.partition_times_s(op, degrees, self.ctx.graph.precision, self.device_types[ti],
                                                       self.ctx.strategy.fp8)
            fwd_s[kinds == ti], bwd_s[kinds == ti] = f_s, b_s
        loads = self.ctx.strategy.expert_loads
        if op.kind == "experts" and loads is not None:
            # the routing what-if: every expert-parallel rank waits for the busiest one's experts
            ep = math.prod(v for k, v in degrees.items() if op.dim(k).kind == EXPERT)
            gate = gate_factor(expert_loads(op.attrs["num_experts"], histogram=loads), ep)
            fwd_s, bwd_s = fwd_s * gate, bwd_s * gate
        return fwd_s, bwd_s

    def optimizer_times_s(self, params: np.ndarray, active: set[int]) -> list[float]:
        """[device] seconds of each device's optimizer step over ``params`` [device]
        parameters (0 on devices not in ``active``).

        With the optimizer offloaded (ZeRO-Offload, ``cpu``; ZeRO-Infinity, ``nvme``) the step
        is :func:`engine.costs.host_optimizer_time_s`: gradients to the host, CPU-Adam at the
        GPU's share of its node's cores (and NVMe), parameters back. With the parameters
        offloaded (ZeRO-3) every gather first copies the device's shard from the host (and
        from NVMe): 2 gathers per microbatch (forward and backward) x shard bytes over the
        host link. That fetch is added here, to the step, not to the gathers (the simplest
        honest model: the time is paid once per iteration on the device, not overlapped), as
        the gathers' emitters are priced on the links."""
        ctx = self.ctx
        c, s = ctx.cluster, ctx.strategy
        off_opt = getattr(s, "offload_optimizer", "none")
        off_par = getattr(s, "offload_params", "none") if s.zero_stage >= 3 else "none"
        state = getattr(s, "optimizer_state", "fp32")
        if off_opt == "none" and off_par == "none":
            return [ctx.cost.optimizer_time_s(params[d], c.device_type(d), state) if d in active else 0.0
                    for d in range(c.num_devices)]
        pbytes = DTYPE_BYTES[ctx.graph.precision]
        node = np.array([dv.node for dv in c.devices], np.int64)
        node_gpus = np.bincount(node)[node]  # [device] GPUs sharing its host
        host_bw = getattr(c, "host_bw_bytes_per_s", None)
        out = []
        for d in range(c.num_devices):
            if d not in active:
                out.append(0.0)
                continue
            bw = (host_bw(d) if host_bw is not None else 0.0) or HOST_BW_BYTES_PER_S  # (a stated default)
            if off_opt != "none":
                t = host_optimizer_time_s(params[d], bw, nvme=off_opt == "nvme", grad_bytes=pbytes,
                                          param_bytes=pbytes, gpus_sharing_host=int(node_gpus[d]))
            else:
                t = ctx.cost.optimizer_time_s(params[d], c.device_type(d), state)
            if off_par != "none":
                fetch_bytes = 2 * ctx.split * params[d] * pbytes
                t += fetch_bytes / bw
                if off_par == "nvme":
                    t += fetch_bytes * int(node_gpus[d]) / NVME_BW_BYTES_PER_S
            out.append(t)
        return out

    def mirror(self, devices: np.ndarray, representatives: np.ndarray) -> None:
        """Record that ``devices`` [part] mirror ``representatives`` [part] (symmetry)."""
        if self._image is not None:
            self._image[devices] = representatives

    def copies(self, devices) -> int:
        """How many identical copies a task over ``devices`` stands for under symmetry: the
        replicas over those that map the group onto itself (a group holding several devices
        of one representative's orbit, such as a data-parallel all-reduce across replicas,
        is its own image along those axes). 1 without symmetry."""
        if self._image is None:
            return 1
        reps = self._image[np.asarray(devices, np.int64)]
        most = np.bincount(reps).max() if reps.min() >= 0 else np.unique(reps, return_counts=True)[1].max()
        return self._replicas // int(most)  # (the most group members that mirror one representative)

    # -- collectives -----------------------------------------------------------------
    def collective(self, seg: Segment, kind: str, size_bytes: float, devices, preds, op: int = -1,
                   mb: int = -1) -> int:
        """Add one collective task over ``devices`` after ``preds``; returns its handle (or -1
        when the group is one device: the data is already in place)."""
        ids = self.collectives(seg, kind, size_bytes, devices, np.asarray(preds, np.int64).reshape(1, -1), op,
                               np.asarray([mb]))
        return int(ids[0]) if ids is not None else -1

    def collectives(self, seg: Segment, kind: str, size_bytes: float, devices, preds: np.ndarray, op: int,
                    mbs: np.ndarray, overlap_s: float = 0.0, hide_s: float = 0.0) -> np.ndarray | None:
        """One collective per row of ``preds`` ([k, n_preds] handles), all over the same
        ``devices`` and of the same size (e.g. one per microbatch); returns their handles, or
        None when the group is a single device.

        ``overlap_s`` > 0: the collective is pipelined with a GEMM of that many seconds that
        precedes it (Transformer Engine's userbuffers, Megatron-Core's --tp-comm-overlap: both
        split into n chunks over the n ranks, chunk i's communication running under chunk i+1's
        GEMM; Wang et al. ASPLOS'23): of its time c, what shows beyond the GEMM is
        c/n + (n-1)/n x max(0, c - overlap_s).

        ``hide_s`` > 0: the collective runs under that many seconds of other compute that the
        task graph does not order against it (Megatron-Core's merged 1F1B for MoE all-to-alls):
        only max(0, c - hide_s) shows."""
        devs = np.unique(np.asarray(devices, np.int64)).tolist()  # sorted, distinct
        if len(devs) <= 1 or size_bytes <= 0:
            return None
        group = self.ctx.cluster.collective_group(devs)
        links = group.links
        n = len(devs)
        k = preds.shape[0]
        if self._image is not None and preds.shape[1] > 1:
            # under symmetry mirrored partitions point at their representative's task: one
            # edge per distinct predecessor (a column repeats in every row or in none)
            _, first = np.unique(preds[0], return_index=True)
            if first.size < preds.shape[1]:
                preds = preds[:, np.sort(first)]
        dur = group_collective_time_s(kind, size_bytes, group, self.ctx.cost.links)
        if overlap_s > 0:
            dur = dur / n + (n - 1) / n * max(0.0, dur - overlap_s)
        if hide_s > 0:
            dur = max(0.0, dur - hide_s)
        ids = seg.add(k, COLL, op=op, mb=mbs, dur=dur, size=size_bytes, coll=COLL_INDEX[kind])
        res = self.ctx.n_devices + np.asarray(links, np.int64)  # [link] resources after the devices
        seg.put("coll_h", ids)
        seg.put("coll_nres", np.full(k, res.size, np.int64))
        seg.put("coll_res", tile(res, k))
        seg.put("coll_ndev", np.full(k, n, np.int64))
        seg.put("coll_dev", tile(np.asarray(devs, np.int64), k))
        seg.edges(preds, np.repeat(ids, preds.shape[1]))
        factor = 2 * (n - 1) if kind == "all_reduce" else (n - 1)  # bytes each rank sends, in buffers
        copies = self.copies(devs)
        seg.comm_bytes += factor * size_bytes * k * copies
        if self.ctx.simulated is not None:
            self._per_mb(seg, np.broadcast_to(mbs, (k,)), np.full(k, factor * size_bytes * copies))
        return ids

    def _per_mb(self, seg: Segment, mbs: np.ndarray, sent: np.ndarray) -> None:
        """Add ``sent`` [task] bytes to ``seg.comm_mb`` by the tasks' microbatches (a build of
        some microbatches keeps them: :mod:`engine.sim.steady` extrapolates one microbatch's)."""
        mbs = np.asarray(mbs)
        own = mbs >= 0
        add = np.bincount(mbs[own], weights=sent[own], minlength=self.ctx.microbatches)
        seg.comm_mb = add if seg.comm_mb is None else seg.comm_mb + add

    # -- transfers -------------------------------------------------------------------
    def transfers(self, seg: Segment, src_tasks: np.ndarray, dst_tasks: np.ndarray, src_dev: np.ndarray,
                  dst_dev: np.ndarray, size_bytes: np.ndarray, op: int,
                  mb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Edges from ``src_tasks`` to ``dst_tasks`` through transfer hops where the devices
        differ (vectorised over pairs). Returns the first and last hop of every pair's
        transfer (-1 where no transfer was needed)."""
        D = self.ctx.n_devices
        first_hop = np.full(src_tasks.size, -1, np.int64)
        last_hop = np.full(src_tasks.size, -1, np.int64)
        same = (src_dev == dst_dev) | (size_bytes <= 0)
        seg.edges(src_tasks[same], dst_tasks[same])
        idx = np.nonzero(~same)[0]
        if idx.size == 0:
            return first_hop, last_hop
        # One path lookup per distinct device pair, then one block of hop tasks per path
        # length, vectorised over every transfer with that many hops.
        pair = src_dev[idx].astype(np.int64) * D + dst_dev[idx]
        upairs, inverse = np.unique(pair, return_inverse=True)
        table, hops = self._paths.lookup(upairs)  # [pair, hop] link ids (-1 padded), [pair]
        for nh in np.unique(hops):
            mine = hops[inverse] == nh
            sel = idx[mine]
            links = table[inverse[mine], :nh]  # [transfer, hop]
            size = size_bytes[sel]
            stream = transfer_time_s(size, self.link_rate[links].min(axis=1), 0.0, 1.0)
            prev = None
            for h in range(nh):
                lk = links[:, h]
                dur = stream + (self.link_lat[lk] if h == nh - 1 else 0.0)
                ids = seg.add(sel.size, XFER, op=op, mb=mb[sel], dur=dur, size=size, link=lk, res=D + lk)
                if prev is None:
                    seg.edges(src_tasks[sel], ids)
                    first_hop[sel] = ids
                else:
                    seg.put("chain_from", prev)
                    seg.put("chain_to", ids)
                    seg.put("chain_lag", self.link_lat[links[:, h - 1]])
                prev = ids
            seg.edges(prev, dst_tasks[sel])
            last_hop[sel] = prev
        # (transfers never cross replicas under symmetry: the builder drops it when one would)
        seg.comm_bytes += float(size_bytes[idx].sum()) * self._replicas
        if self.ctx.simulated is not None:
            self._per_mb(seg, mb[idx], size_bytes[idx] * self._replicas)
        return first_hop, last_hop


class _PathTable:
    """Link ids of the paths between device pairs (``src * D + dst``), filled on first use:
    a dense row index for up to 2,048 devices, a dict beyond (D^2 entries would not fit)."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.D = cluster.num_devices
        self.row = {} if self.D > 2048 else np.full(self.D * self.D, -1, np.int64)
        self.links = np.full((0, 4), -1, np.int64)  # [row, hop], -1 padded
        self.hops = np.zeros(0, np.int64)  # [row]

    def lookup(self, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[pair, hop] link ids (-1 padded) and [pair] hop counts."""
        dense = not isinstance(self.row, dict)
        rows = self.row[pairs] if dense else np.array([self.row.get(int(k), -1) for k in pairs], np.int64)
        missing = np.flatnonzero(rows < 0)
        if missing.size:
            found = [self.cluster.path(int(pairs[j] // self.D), int(pairs[j] % self.D)) for j in missing]
            width = max(self.links.shape[1], max(len(pth) for pth in found))
            block = np.full((missing.size, width), -1, np.int64)
            for r, pth in enumerate(found):
                block[r, :len(pth)] = pth
            if width > self.links.shape[1]:
                pad = np.full((self.links.shape[0], width - self.links.shape[1]), -1, np.int64)
                self.links = np.hstack([self.links, pad])
            first = self.links.shape[0]
            self.links = np.vstack([self.links, block])
            self.hops = np.concatenate([self.hops, [len(pth) for pth in found]])
            new_rows = np.arange(first, first + missing.size)
            if dense:
                self.row[pairs[missing]] = new_rows
            else:
                for j, r in zip(missing, new_rows):
                    self.row[int(pairs[j])] = int(r)
            rows[missing] = new_rows
        return self.links[rows], self.hops[rows]
