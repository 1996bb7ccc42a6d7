"""Task counts without building: how many tasks a full (not symmetric) build of a strategy makes,
asked before building a candidate that could take gigabytes, and the count of its symmetric build.

:func:`estimate_tasks` follows the builder's rules at the level of partitions, never of tasks:
compute (:mod:`.compute`), the dataflow transfers between every pair of partitions whose tensor
regions overlap on different devices (:mod:`.dataflow`, :func:`.regions.transfer_plan`, enumerated
sparsely here: a receiver meets only the holders its region overlaps, not all of them), the
collectives of reductions, mixture-of-experts exchanges and parameter synchronisation
(:mod:`.sync`), the optimizer steps and the pipeline barriers, with the builder's sharing of a
region sent to several consumers on one device."""

from __future__ import annotations

import math

import numpy as np

from ..cluster import Cluster
from ..strategy.config import Config, partition_grid, zero_shares
from ..graph import Op, OpGraph
from ..ops import EXPERT, FLOAT_DTYPES, REDUCTION, REPLICA, sliding_window
from ..strategy import Strategy
from .compute import op_signature
from .dataflow import context_parallel, split_gathers
from .regions import classes, in_regions, out_regions, transfer_plan, within
from .symmetry import find_symmetry
from .sync import sync_unit

__all__ = ["estimate_tasks", "estimate_symmetric_tasks", "symmetric_task_bound", "overlap_pairs", "TooManyPairs", "quick_task_bound",
           "count_text", "STOP_FACTOR",
           "tasks_within"]

#: the most (holder class, receiver) pairs one edge enumerates (~100 MB of index arrays); past it
#: every pair is counted as a transfer of :data:`_HOPS_BEYOND` links, unenumerated (a consumer
#: reading all of a 16,384-way split from 16,384 partitions: 268 M pairs)
_MAX_PAIRS = 1 << 22
#: links of the longest structural route: NIC, uplink, downlink, NIC (:meth:`Cluster.path`)
_HOPS_BEYOND = 4

#: hops per transfer when no cluster is given: the longest structural route's, so that the
#: estimate stays high (a transfer inside an NVSwitch node is 2 link tasks, a P100 mesh link 1)
_HOPS_WITHOUT_CLUSTER = _HOPS_BEYOND


class TooManyPairs(Exception):
    """:func:`overlap_pairs` met more pairs than its ``max_pairs``; ``pairs`` says how many."""

    def __init__(self, pairs: int) -> None:
        super().__init__(f"{pairs:,} overlapping pairs")
        self.pairs = pairs


def overlap_pairs(h_lo: np.ndarray, h_hi: np.ndarray, h_dev: np.ndarray, h_cls: np.ndarray,
                  r_lo: np.ndarray, r_hi: np.ndarray, r_dev: np.ndarray,
                  max_pairs: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(holder, receiver) of every transfer :func:`.regions.transfer_plan` makes (the pairs
    on different devices), found sparsely: per axis the holders' distinct intervals are sorted, each receiver
    meets the run of them its region overlaps (for uniform splits of an axis into a and b pieces,
    a + b - gcd(a, b) pairs in all), and the product over axes names the holder classes it reads.
    A class with a member on the receiver's device sends nothing (a dependency); otherwise member
    ``receiver mod class size`` sends, as in the builder.

    Parameters
    ----------
    h_lo, h_hi : [holder, axis] region bounds; h_dev, h_cls : [holder] device and class (holders
        of one class hold the same region).
    r_lo, r_hi : [receiver, axis] region bounds; r_dev : [receiver] device.
    max_pairs : int, optional
        Raise :class:`TooManyPairs` rather than enumerate more overlapping pairs than this.

    Examples
    --------
    Four holders split an axis of 12 in four, three receivers in three (4 + 3 - 1 = 6 pairs),
    receiver 0 on holder 0's device:

    >>> lo, hi = np.array([[0], [3], [6], [9]]), np.array([[3], [6], [9], [12]])
    >>> holder, receiver = overlap_pairs(lo, hi, np.arange(4), np.arange(4), np.array([[0], [4], [8]]),
    ...                                  np.array([[4], [8], [12]]), np.array([0, 5, 6]))
    >>> holder.tolist(), receiver.tolist()
    ([1, 1, 2, 2, 3], [0, 1, 1, 2, 2])
    """
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    n_cls = int(h_cls.max()) + 1
    order = np.argsort(h_cls, kind="stable")
    counts = np.bincount(h_cls, minlength=n_cls)
    first = np.zeros(n_cls, np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    rep = order[first]  # [class] a holder of each class
    c_lo, c_hi = h_lo[rep], h_hi[rep]  # [class, axis]
    R, A = r_lo.shape
    r_ids = np.arange(R)
    start, cnt, sizes, idx_of_cls = [], [], [], []
    for ax in range(A):
        span = int(c_hi[:, ax].max()) + 1
        code = c_lo[:, ax] * span + c_hi[:, ax]  # [class] its interval, ordered as (lo, hi)
        iv = np.unique(code)  # [interval] sorted (a split's pieces are ordered in lo and in hi)
        iv_lo, iv_hi = iv // span, iv % span
        s = np.searchsorted(iv_hi, r_lo[:, ax], side="right")  # first interval ending after lo
        e = np.searchsorted(iv_lo, r_hi[:, ax], side="left")  # past the last starting before hi
        s = np.where(r_hi[:, ax] > r_lo[:, ax], s, e)  # an empty region reads nothing
        start.append(s)
        cnt.append(np.maximum(e - s, 0))
        sizes.append(iv.size)
        idx_of_cls.append(np.searchsorted(iv, code))
    table = np.full(math.prod(sizes) if A else 1, -1, np.int64)  # interval tuple -> class
    table[np.ravel_multi_index(idx_of_cls, sizes) if A else 0] = np.arange(n_cls)
    per_recv = np.prod(np.stack(cnt), axis=0) if A else np.ones(R, np.int64)  # [receiver] classes met
    total = int(per_recv.sum())
    if total == 0:
        return empty
    if max_pairs is not None and total > max_pairs:
        raise TooManyPairs(total)
    r = np.repeat(r_ids, per_recv)  # [pair]
    q = within(per_recv)
    flat = np.zeros(total, np.int64)
    for ax in range(A):  # mixed radix: the pair's interval along each axis
        c = cnt[ax][r]
        flat = flat * sizes[ax] + start[ax][r] + q % c
        q //= c
    g = table[flat]
    ok = g >= 0  # (a holder interval tuple no class holds: not a region anyone sends)
    g, r = g[ok], r[ok]
    n_dev = int(max(h_dev.max(), r_dev.max())) + 1
    hkey = h_cls.astype(np.int64) * n_dev + h_dev
    known = np.unique(hkey)
    want = g * n_dev + r_dev[r]
    pos = np.minimum(np.searchsorted(known, want), known.size - 1)
    moving = known[pos] != want  # no class member on the receiver's device
    g, r = g[moving], r[moving]
    holder = order[first[g] + r % counts[g]]
    return holder.astype(np.int64), r.astype(np.int64)


class _Hops:
    """Link tasks per transfer between two devices: the cluster's path length, looked up once
    per device pair; :data:`_HOPS_WITHOUT_CLUSTER` each without a cluster. ``period``: a shift
    of every device by a multiple of it keeps the hops (identical nodes, numbered node by node:
    a pipeline stage's transfers on the next node take the same paths), else None."""

    def __init__(self, cluster: Cluster | None) -> None:
        self.cluster = cluster
        self.known: dict[int, int] = {}
        self.period: int | None = None
        if cluster is not None and len(cluster.node_specs) == 1:
            g = cluster.node_specs[0].gpus
            if all(d.node == d.id // g for d in cluster.devices):
                self.period = g

    def __call__(self, src: np.ndarray, dst: np.ndarray) -> int:
        if self.cluster is None or src.size == 0:
            return _HOPS_WITHOUT_CLUSTER * int(src.size)
        D = self.cluster.num_devices
        pairs, times = np.unique(src * D + dst, return_counts=True)
        total = 0
        for pair, k in zip(pairs.tolist(), times.tolist()):
            h = self.known.get(pair)
            if h is None:
                h = self.known[pair] = len(self.cluster.path(pair // D, pair % D))
            total += h * k
        return total


def _groups_of(grid: np.ndarray, names: list[str], keep: set[str], devs: np.ndarray) -> int:
    """How many groups of partitions equal on the dims in ``keep`` span more than one device
    (a collective over each; a one-device group needs none)."""
    cls = classes(grid, names, keep)
    n_dev = int(devs.max()) + 1
    per = np.unique(cls * n_dev + devs) // n_dev  # distinct (group, device)
    return int(np.count_nonzero(np.bincount(per) > 1))


def _same_regions(prod: Op, cons: Op, i: int, names: list[str]) -> bool:
    """Whether, under one config splitting ``names``, every consumer partition reads from input
    ``i`` exactly the region the producer partition of the same index writes: each split dim
    maps onto the same tensor axis on both sides (or onto none), no two onto one axis, and no
    convolution or pooling halo."""
    window = sliding_window(cons.kind, cons.attrs) is not None
    axes = []
    for n in names:
        d = cons.dim(n)
        ax = d.in_axes[i] if i < len(d.in_axes) else None
        if ax != prod.dim(n).out_axis or (window and n in ("height", "width")):
            return False
        if ax is not None:
            axes.append(ax)
    return len(axes) == len(set(axes))


def _gathered(h_lo, h_hi, h_dev, h_cls, r_lo, r_hi, r_dev) -> tuple[np.ndarray, np.ndarray, list[tuple]]:
    """The moving (holder, receiver) pairs the builder leaves as transfers after taking out
    the all-gathers (:func:`.dataflow.split_gathers`), and the gathers' device groups."""
    rest, gathers = split_gathers(transfer_plan(h_lo, h_hi, h_dev, h_cls, r_lo, r_hi, r_dev),
                                  h_lo, h_hi, h_dev, h_cls, r_lo, r_hi, r_dev)
    moving = rest[2] > 0
    return rest[0][moving], rest[1][moving], [(tuple(sorted(h_dev[hs].tolist())), part) for hs, _, part in gathers]


def _tensor(prod: Op, o: int, pcfg: Config, users: list[tuple[Op, int, Config]],
            sp: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """(source devices, destination devices) of the transfers of output ``o`` of ``prod`` to
    all its ``users`` (consumer, input index, config) per microbatch, forward and backward
    together, and its collectives with the link tasks of any transfers too many to enumerate
    (:func:`_pairs`), as :meth:`.dataflow.DataflowBuilder.build` makes them: the regions each
    consumer partition reads, the gradients sent back, the partial input gradients'
    all-reduce. With several users, a region goes to a device once, the gradients of one
    producer partition from one device are summed there and sent once (not after a partial
    all-reduce), and users with one config share their all-reduces, as in the builder. Under
    sequence parallelism (``sp``) and for attention under context parallelism, gathers are one
    collective per group (shared by the users in the forward pass), as in the builder."""
    shared = len(users) > 1
    fwd_groups: set[tuple] = set()
    pnames, pgrid = partition_grid(prod, pcfg)
    pdev = np.asarray(pcfg.devices, np.int64)
    h_lo, h_hi = out_regions(prod, pcfg, pnames, pgrid, o)
    h_cls = classes(pgrid, pnames, {n for n in pnames if prod.dim(n).out_axis is not None})
    grads = prod.out_tensors[o].dtype in FLOAT_DTYPES and prod.kind != "input"  # gradients flow back
    D = 1 + max(int(pdev.max()), *(max(ccfg.devices) for _, _, ccfg in users))
    once: dict[str, list[np.ndarray]] = {"fwd": [], "bwd": []}  # [pair] holder * D + device, deduplicated
    src, dst = [], []
    extra, reduced = 0, set()
    for cons, i, ccfg in users:
        cnames, cgrid = partition_grid(cons, ccfg)
        cdev = np.asarray(ccfg.devices, np.int64)
        partial = {n for n in cnames if cons.dim(n).kind != REPLICA
                   and (i >= len(cons.dim(n).in_axes) or cons.dim(n).in_axes[i] is None)}
        keep = frozenset(n for n in cnames if n not in partial)
        if grads and partial and (ccfg, keep) not in reduced:
            reduced.add((ccfg, keep))
            extra += _groups_of(cgrid, cnames, keep, cdev)
        if pcfg == ccfg and _same_regions(prod, cons, i, cnames):
            continue  # every partition reads what it wrote (an elementwise chain)
        r_lo, r_hi = in_regions(cons, ccfg, cnames, cgrid, i)
        if (sp or context_parallel(cons, ccfg, i)) and len(h_lo) * len(r_lo) <= _MAX_PAIRS:  # (a dense plan)
            holder, recv, groups = _gathered(h_lo, h_hi, pdev, h_cls, r_lo, r_hi, cdev)
            fwd_groups.update(groups)
        else:
            holder, recv, beyond = _pairs(h_lo, h_hi, pdev, h_cls, r_lo, r_hi, cdev)
            extra += beyond
        if shared:
            once["fwd"].append(holder * D + cdev[recv])
        else:
            src.append(pdev[holder])
            dst.append(cdev[recv])
        if grads:
            ckeep = {n for n in keep if cons.dim(n).kind != REPLICA}
            if sp and len(h_lo) * len(r_lo) <= _MAX_PAIRS:
                holder, recv, groups = _gathered(r_lo, r_hi, cdev, classes(cgrid, cnames, ckeep), h_lo, h_hi, pdev)
                extra += len(groups)
            else:
                holder, recv, beyond = _pairs(r_lo, r_hi, cdev, classes(cgrid, cnames, ckeep), h_lo, h_hi, pdev)
                extra += beyond
            if shared and not partial:
                once["bwd"].append(recv * D + cdev[holder])
            else:
                src.append(cdev[holder])
                dst.append(pdev[recv])
    if once["fwd"]:  # (producer partition, destination device)
        code = np.unique(np.concatenate(once["fwd"]))
        src.append(pdev[code // D])
        dst.append(code % D)
    if once["bwd"]:  # (producer partition, source device)
        code = np.unique(np.concatenate(once["bwd"]))
        src.append(code % D)
        dst.append(pdev[code // D])
    none = np.zeros(0, np.int64)
    extra += len(fwd_groups)
    return (np.concatenate(src) if src else none), (np.concatenate(dst) if dst else none), extra


def _pairs(*args: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`overlap_pairs` within :data:`_MAX_PAIRS`, and the link tasks of the pairs past
    it (then all counted as transfers of :data:`_HOPS_BEYOND` links, none enumerated)."""
    try:
        return (*overlap_pairs(*args, max_pairs=_MAX_PAIRS), 0)
    except TooManyPairs as e:
        none = np.zeros(0, np.int64)
        return none, none, e.pairs * _HOPS_BEYOND


def _op_collectives(op: Op, cfg: Config) -> int:
    """Collectives of one op per microbatch: the all-reduce (reduce-scatter) of partial sums
    over a reduction split (:meth:`.compute.ComputeBuilder._reduce`), and a mixture-of-experts
    layer's four exchanges per expert-parallel group (``_dispatch``)."""
    names, grid = partition_grid(op, cfg)
    devs = np.asarray(cfg.devices, np.int64)
    n = 0
    red = [x for x in names if op.dim(x).kind == REDUCTION]
    if red:
        n += _groups_of(grid, names, {x for x in names if x not in red}, devs)
    experts = [x for x in names if op.dim(x).kind == EXPERT]
    if op.kind == "experts" and experts:
        n += 4 * _groups_of(grid, names, {x for x in names if x not in experts}, devs)
    return n


def _sync_collectives(graph: OpGraph, strategy: Strategy) -> int:
    """Parameter synchronisation per iteration (:class:`.sync.SyncBuilder`): per parameter unit
    and group of partitions holding one region, the gradient all-reduce (ZeRO-2/3: reduce-scatter,
    ZeRO-3's every microbatch), ZeRO-1/2's parameter all-gather after the update, ZeRO-3's gathers
    before each forward and backward of every microbatch (per op with ``gather_unit`` "op"), and
    hybrid sharding's all-reduces across the shard groups."""
    zero, m = strategy.zero_stage, max(1, strategy.pipeline.microbatches)
    # unit -> group key -> [groups, device sets, members]: ops of a unit whose partitions group
    # alike share collectives (ZeRO keys a group by its devices, else by the split dims' names)
    units: dict[str, dict[tuple, list]] = {}
    devices: dict[int, frozenset[int]] = {}  # id of a config -> its devices
    shares = zero_shares(graph, strategy) if zero >= 1 else {}  # sequence-parallel ops: one group per tp rank
    for op in graph.ops:
        if not op.param_count or op.kind == "input":
            continue
        cfg = strategy.configs[op.name]
        ds = devices.get(id(cfg))
        if ds is None:
            ds = devices[id(cfg)] = frozenset(cfg.devices)
        if zero >= 1:
            split = tuple(n for n in cfg.degrees if n not in ("sample", "length"))
            share = shares.get(op.name, 1)
            key: tuple = (ds, share)
        else:
            split = tuple(n for n in cfg.degrees if any(ax is not None for ax in op.dim(n).param_axes))
            share, key = 1, split
        entry = units.setdefault(sync_unit(op, zero), {}).setdefault(key, [1, set(), 0])
        entry[0] = max(entry[0], math.prod(cfg.degrees[n] for n in split) * share)
        entry[1].add(ds)
        entry[2] += 1
    per_op_gathers = zero >= 3 and strategy.gather_unit == "op"
    k = strategy.shard_group if zero >= 2 else 0
    n = 0
    for keyed in units.values():
        for groups, sets, members in keyed.values():
            size = len(frozenset().union(*sets)) // groups  # devices per group
            if size <= 1:
                continue
            subs = size // k if k and k < size else 1
            per_group = subs * ((m if zero >= 3 else 1) + (1 if zero in (1, 2) else 0))
            if subs > 1:
                per_group += k
            if zero >= 3:
                per_group += subs * 2 * m * (members if per_op_gathers else 1)
            n += groups * per_group
    return n


def estimate_tasks(graph: OpGraph, strategy: Strategy, cluster: Cluster | None = None,
                   stop_above: int | None = None) -> int:
    """About how many tasks a full (not symmetric) build of ``strategy`` makes: a forward per
    partition and microbatch and a backward but for inputs; each transfer's link tasks (one per
    link of its path through ``cluster``, :data:`_HOPS_WITHOUT_CLUSTER` without one) between
    the pairs of partitions whose regions overlap on different devices, forward and backward;
    the collectives of reductions, expert exchanges and parameter synchronisation; an
    optimizer step per device of the cluster; each device's barriers between its pipeline
    schedule units.

    Over the 37 layouts of ``benchmarks/estimate_tasks.py`` (Megatron with tp, pp, vpp, dp,
    cp, sequence parallelism and ZeRO 1/2, FSDP with per-block or per-op gathers and hybrid
    sharding, MoE with ep, FlexFlow-style random per-op splits; up to 1,024 GPUs) it is the
    real count on 35 and at most 0.7% above it on the other two (ZeRO with sequence
    parallelism; measured again after sequence and context parallelism's gathers became
    collectives, issue 28). It errs high where the builder shares more than it follows (consumers of
    one tensor with different configs on the same devices share the input-gradient
    all-reduce there; ZeRO groups of one unit over the same devices; an edge past
    :data:`_MAX_PAIRS` pairs). Edges between the same split on devices shifted alike
    (repeated layers, pipeline stages) are counted once: 5-80 ms for the sample models
    (GPT-3 175B on 64 GPUs: 80-150 ms, on 1,024: 35-400 ms; FlexFlow-style random splits of
    Inception-v3, every edge distinct: 0.2-0.5 s; on a loaded 2-core machine), against
    seconds to minutes for the build. A search asks it before building a candidate that
    could take gigabytes (GPT-3 under FlexFlow's expert strategy on 64 GPUs: 23.8 M tasks,
    5.2 GB).

    >>> from engine.formats import resolve_model
    >>> from engine.cluster import preset
    >>> from engine.search.baselines import data_parallel
    >>> g, c = resolve_model("alexnet"), preset("p100-4x4")
    >>> estimate_tasks(g, data_parallel(g, c), c)
    760

    ``stop_above``: return the count so far once it passes this many tasks (a lower bound then:
    a FlexFlow-style random strategy of GPT-3 on 512 GPUs, every edge distinct, took 48 s to
    count in full, and a search only asks whether it is under a cap).
    """
    m = max(1, strategy.pipeline.microbatches)
    cfg = [strategy.configs[op.name] for op in graph.ops]
    hops = _Hops(cluster)
    # a forward per partition and microbatch, a backward too but for inputs; an optimizer step per device
    n = m * sum(c.num_partitions * (1 if op.kind == "input" else 2) for op, c in zip(graph.ops, cfg))
    n += cluster.num_devices if cluster is not None else (strategy.cluster_devices or len(strategy.devices_used()))
    pipe = strategy.pipeline
    if m > 1 or pipe.stages > 1:  # each device's chain of barriers between its schedule units (.schedule)
        n += len(strategy.devices_used()) * (2 * m * max(1, pipe.virtual_stages) - 1)
    kinds: dict[tuple, int] = {}  # op signature -> a small id (identical layers share it)
    sig = [kinds.setdefault(op_signature(op), len(kinds)) for op in graph.ops]
    # Counts depend on devices only through which are equal, so configs are keyed by their
    # degrees and devices less the first (the same split on the next pipeline stage shares it)
    by_id: dict[int, tuple[int, int]] = {}  # id of a config -> (pattern id, its lowest device)
    patterns: dict[tuple, int] = {}
    pat, lo = [], []
    for c in cfg:
        hit = by_id.get(id(c))
        if hit is None:
            low = min(c.devices)
            code = (tuple(c.degrees.items()), tuple(d - low for d in c.devices))
            hit = by_id[id(c)] = (patterns.setdefault(code, len(patterns)), low)
        pat.append(hit[0])
        lo.append(hit[1])
    seen: dict[tuple, int] = {}  # (signature, pattern) -> collectives per microbatch
    for oi, (op, c) in enumerate(zip(graph.ops, cfg)):
        key = (sig[oi], pat[oi])
        if key not in seen:
            seen[key] = _op_collectives(op, c)
        n += m * seen[key]
    users: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (producer, output) -> [(consumer, input)]
    for (p, o, c, i) in graph.edges:
        users.setdefault((p, o), []).append((c, i))
    tensors: dict[tuple, tuple] = {}  # tensor -> (sources, destinations less the producer's lowest device, extra)
    links: dict[tuple, int] = {}  # (tensor, where it lies) -> link tasks
    for (p, o), readers in users.items():
        dtype = graph.ops[p].out_tensors[o].dtype  # (whether gradients flow back: not in the signature)
        key = (sig[p], o, dtype, pat[p], tuple((sig[c], i, pat[c], lo[c] - lo[p]) for c, i in readers))
        hit = tensors.get(key)
        if hit is None:
            src, dst, extra = _tensor(graph.ops[p], o, cfg[p], [(graph.ops[c], i, cfg[c]) for c, i in readers],
                                      strategy.sequence_parallel)
            hit = tensors[key] = (src - lo[p], dst - lo[p], extra)
        where = (key, lo[p] % hops.period if hops.period else lo[p])
        k = links.get(where)
        if k is None:
            k = links[where] = hops(hit[0] + lo[p], hit[1] + lo[p])
        n += m * (k + hit[2])
        if stop_above is not None and n > stop_above:
            return n
    return n + _sync_collectives(graph, strategy)


#: per pair of differently split partitions, the tasks :func:`quick_task_bound` charges (a
#: transfer each way over a few links)
_QUICK_TASKS_PER_PAIR = 6


def quick_task_bound(graph: OpGraph, strategy: Strategy) -> int:
    """A fast, loose upper bound of :func:`estimate_tasks` (the estimate before issue 28: 2 m
    tasks a partition, and per edge between different configs a transfer per partition, or
    :data:`_QUICK_TASKS_PER_PAIR` per pair of partitions: quadratic in the data-parallel
    degree; 0.98x to 1,379x the real count over ``benchmarks/estimate_tasks.py``). Microseconds
    a thousand ops: what :func:`tasks_within` asks first."""
    m = max(1, strategy.pipeline.microbatches)
    cfg = [strategy.configs[op.name] for op in graph.ops]
    parts = [c.num_partitions for c in cfg]
    n = 2 * m * sum(parts)
    for (p, _, c, _) in graph.edges:
        a, b = cfg[p], cfg[c]
        if a is b or a == b:
            continue
        n += 2 * m * parts[p] if a.degrees == b.degrees else _QUICK_TASKS_PER_PAIR * m * parts[p] * parts[c]
    return n


#: :func:`tasks_within` stops counting past this many times its cap (:func:`count_text`)
STOP_FACTOR = 8


def tasks_within(graph: OpGraph, strategy: Strategy, cap: int, cluster: Cluster | None = None) -> int:
    """The task count to compare with ``cap``: :func:`quick_task_bound` when it is within the cap
    (the real count is too, and the explorer's hot path stays at microseconds), else the close
    :func:`estimate_tasks` (tens to hundreds of milliseconds at 1,024 GPUs), which stops once it
    passes :data:`STOP_FACTOR` times the cap (then a lower bound: :func:`count_text`)."""
    quick = quick_task_bound(graph, strategy)
    return quick if quick <= cap else estimate_tasks(graph, strategy, cluster, stop_above=STOP_FACTOR * cap)


def count_text(n: int, cap: int) -> str:
    """A count from :func:`tasks_within` for a message: "about N", or "over N" where the
    estimate stopped counting."""
    return f"{'over' if n > STOP_FACTOR * cap else 'about'} {n:,}"


def estimate_symmetric_tasks(graph: OpGraph, strategy: Strategy, cluster: Cluster, full: int | None = None) -> int:
    """About how many tasks :func:`build_task_graph` makes with its symmetry reduction: the
    representatives it simulates (the devices used over the replicas :func:`find_symmetry`
    finds) at a forward, a backward and a communication task per op of their pipeline stage
    and microbatch (GPT-3 175B, tp 8 x pp 16 on 1,024 GPUs: 1.39 M estimated, ~1 M built;
    LLaMA-2 7B, tp 8 x pp 2 on 64: 0.59 M, 0.43 M built); :func:`estimate_tasks` when no
    symmetry holds, and never above it (``full``: that estimate, when the caller has it)."""
    n = estimate_tasks(graph, strategy, cluster) if full is None else full
    sym = symmetric_task_bound(graph, strategy, cluster)
    return n if sym is None else min(n, sym)


def symmetric_task_bound(graph: OpGraph, strategy: Strategy, cluster: Cluster) -> int | None:
    """The symmetric part of :func:`estimate_symmetric_tasks` alone (None when no exact
    symmetry holds): the representatives at three tasks per op of their stage and microbatch,
    without :func:`estimate_tasks` (which it is capped by there). A caller comparing with a cap
    asks this first on a large cluster: when it is within the cap, the capped estimate is too,
    and the full estimate (~80 ms on GPT-3 175B over 1,024 GPUs) is not needed."""
    sym = find_symmetry(graph, strategy, cluster)
    if sym is None:
        return None
    replicas = max(1, math.prod(d for d, _ in sym.axes))
    reps = max(1, len(strategy.devices_used()) // replicas)
    p = strategy.pipeline
    return reps * 3 * max(1, p.microbatches) * math.ceil(len(graph.ops) / max(1, p.stages))
