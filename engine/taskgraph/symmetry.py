"""Translation symmetry of a strategy: when simulating one replica is exact."""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..graph import Op, OpGraph
from ..strategy import Config, Strategy

__all__ = ["Symmetry", "find_symmetry", "forget_found", "dim_strides"]

@dataclass(frozen=True)
class Symmetry:
    """Translation symmetry of a strategy: axes (degree, device stride) that every op's
    device grid follows. Partitions at coordinate 0 on every axis are *representatives*;
    every other partition runs the same tasks at the same times on its own devices.

    Attributes
    ----------
    axes : tuple of (degree, device stride)
    dims : mapping op name -> names of the dims that run along the axes
    """

    axes: tuple[tuple[int, int], ...]
    dims: dict[str, tuple[str, ...]]

    @property
    def replicas(self) -> int:
        return math.prod(k for k, _ in self.axes)


def dim_strides(op: Op, config: Config) -> dict[str, tuple[int, int]]:
    """(degree, device stride) of every split dim along which the device grid is affine."""
    names = [d.name for d in op.dims if config.degree(d.name) > 1]
    if not names:
        return {}
    shape = [config.degree(n) for n in names]
    grid = np.asarray(config.devices, np.int64).reshape(shape)
    out = {}
    for j, n in enumerate(names):
        diff = np.diff(grid, axis=j)
        if diff.size and np.all(diff == diff.flat[0]):
            out[n] = (shape[j], int(diff.flat[0]))
    return out


def find_symmetry(graph: OpGraph, strategy: Strategy, cluster: Cluster,
                  axes: tuple[tuple[int, int], ...] | None = None) -> Symmetry | None:
    """The translation symmetry under which simulating representatives is exact, or None.

    Exactness needs (1) axes (degree, stride) shared by every op, each matched by exactly one
    of its dims; (2) one device type and one node spec; (3) no link shared between devices,
    which holds inside a node (per-GPU switch or mesh links) and across nodes with one NIC per
    GPU (DGX presets), the fabric being non-blocking, or, where GPUs share NICs, along axes that
    move whole groups of a NIC's GPUs onto NICs no other replica uses; (4) on a fabric of
    oversubscribed pods, every replica in its representative's pods; (5) every replica on the nodes as its
    representative is (:func:`_nodes_alike`). Transfers that cross replicas are
    checked when the task graph is built (they make the reduction inexact, and the builder
    then simulates everything, or a subset of the axes: ``axes`` keeps only those).
    """
    configs = strategy.configs  # (all the search reads of the strategy)
    key = (id(graph), id(configs), id(cluster), axes)
    with _FOUND_LOCK:
        hit = _FOUND.get(key)
        if hit is not None and hit[0]() is graph and hit[1] is configs and hit[2]() is cluster:
            _FOUND.move_to_end(key)  # (least recently used first out, as search.api's price memo)
            return hit[3]
    sym = _find(graph, strategy, cluster, axes)
    with _FOUND_LOCK:
        _FOUND[key] = (weakref.ref(graph), configs, weakref.ref(cluster), sym)
        _FOUND.move_to_end(key)
        while len(_FOUND) > FOUND_MEMO_SIZE:
            _FOUND.popitem(last=False)
    return sym


#: the symmetries :func:`find_symmetry` found last, by the identity of the graph, the
#: strategy's configs (never changed in place: a changed strategy is a new mapping, and the
#: mapping held here keeps its ``id`` from being reused) and the cluster: a page's size check
#: and its build ask for the same one, the second on a copy of the strategy with its own
#: provenance (GPT-3 175B on 1,024 GPUs: ~25 ms each)
_FOUND: "OrderedDict[tuple, tuple]" = OrderedDict()
FOUND_MEMO_SIZE = 4
_FOUND_LOCK = threading.Lock()


def forget_found() -> None:
    """Drop what :func:`find_symmetry` remembers (a server that has gone quiet: the strategies'
    configs it holds would otherwise stay resident)."""
    with _FOUND_LOCK:
        _FOUND.clear()


def _find(graph: OpGraph, strategy: Strategy, cluster: Cluster, axes) -> Symmetry | None:
    if len(cluster.node_specs) != 1 or len(cluster.device_types) < 1:
        return None
    spec = cluster.node_specs[0]
    shared = spec.repeat > 1 and spec.nics < spec.gpus
    group = (spec.gpus // spec.nics if spec.gpus % spec.nics == 0 else spec.gpus) if shared else 1
    if shared and graph.ops:
        # (every kept axis runs along a dim of every op, the first one's included: where none of
        # its strides moves whole groups of a NIC's GPUs, nothing can be kept; a search on one
        # NIC a node asks this at every pricing)
        first = graph.ops[0]
        strides = _with_nested(first, dim_strides(first, strategy.configs[first.name]))
        if not any(st % group == 0 for _, st in strides.values()):
            return None
    sym = _common_axes(graph, strategy, axes, factors=True)
    sym = sym if sym is not None else _common_axes(graph, strategy, axes, factors=False)
    if sym is not None and shared:
        # a node's GPUs share NICs (GPU g of G on NIC g * nics // G): a replica on its
        # representative's NIC would contend for it, one on another NIC's GPUs meets the same
        # contention there; only the axes that move whole groups of a NIC's GPUs are kept
        whole = tuple(a for a in sym.axes if a[1] % group == 0)
        sym = _common_axes(graph, strategy, whole, factors=False) if whole else None
        if sym is not None and not _nics_apart(graph, strategy, sym, group):
            return None
    if sym is not None and not _nodes_alike(graph, strategy, sym, spec.gpus):
        return None
    pods = getattr(cluster, "pod_gpus", 0) and getattr(cluster, "oversubscription", 1.0) > 1.0 \
        and cluster.num_devices > cluster.pod_gpus
    # (a group inside a pod and one across pods are not equivalent: every replica's devices
    # must sit in its representative's pods)
    return None if sym is None or pods and not _within_pods(graph, strategy, cluster.pod_gpus, sym) else sym


def _representatives(graph: OpGraph, strategy: Strategy, sym: Symmetry) -> tuple[np.ndarray, np.ndarray]:
    """(the representatives' devices, sorted; each replica's translation: a device shift)."""
    reps: set[int] = set()
    seen: set[tuple] = set()
    for op in graph.ops:
        cfg = strategy.configs[op.name]
        dims = tuple(sym.dims.get(op.name) or ())
        if (id(cfg), dims) in seen:
            continue
        seen.add((id(cfg), dims))
        names = [d.name for d in op.dims if cfg.degree(d.name) > 1]
        grid = np.asarray(cfg.devices, np.int64).reshape([cfg.degree(n) for n in names] or [-1])
        at = tuple(0 if n in dims else slice(None) for n in names)
        reps.update(np.asarray(grid[at] if names else grid).ravel().tolist())
    shifts = np.zeros(1, np.int64)
    for k, st in sym.axes:
        shifts = (shifts[:, None] + np.arange(k, dtype=np.int64)[None, :] * st).ravel()
    return np.unique(np.fromiter(reps, np.int64, len(reps))), shifts


def _nics_apart(graph: OpGraph, strategy: Strategy, sym: Symmetry, group: int) -> bool:
    """Whether the replicas use NICs apart: the NICs (device // ``group``, the GPUs a NIC
    serves) of the representatives' devices, moved by each replica's translation, meet none of
    another replica's (with strides that are multiples of ``group``, a translation moves a
    NIC's GPUs onto another NIC's)."""
    reps, shifts = _representatives(graph, strategy, sym)
    nics = np.unique(reps // group)
    moved = (nics[None, :] + shifts[:, None] // group).ravel()
    return np.unique(moved).size == moved.size


def _nodes_alike(graph: OpGraph, strategy: Strategy, sym: Symmetry, gpus_per_node: int) -> bool:
    """Whether every replica sits on the nodes as its representative does: two of the
    representatives' devices share a node exactly when their moved copies do, and the GPUs all
    the replicas use fill whole nodes (or lie in one). A hand placement shifted by part of a
    node breaks both: GPT-2 tp 4 x dp 4 moved 2 GPUs along three DGX H100 nodes put a
    replica's tensor-parallel group across two nodes (0.047 s with the reduction, 0.056 s in
    full); moved 4, on three nodes holding 4, 8 and 4 of its GPUs, each replica in one node,
    the reduction was still 1.3-3% fast on ``h100-pcie`` and ``dgx-h100`` (issue 43's review:
    of 164 shifted placements the reduction accepted, 47 were off; with this check none is)."""
    reps, shifts = _representatives(graph, strategy, sym)
    at = reps[None, :] + shifts[:, None]  # [replica, representative device] its device
    # (devices sorted, nodes ascend along a row: a replica's node map is one to one exactly
    # when neighbours share a node in the row where they share one in the representative)
    same = (reps // gpus_per_node)[1:] == (reps // gpus_per_node)[:-1]
    moved = at // gpus_per_node
    if not np.array_equal(moved[:, 1:] == moved[:, :-1], np.broadcast_to(same, (len(shifts), same.size))):
        return False
    used = np.unique(at.ravel())
    _, per_node = np.unique(used // gpus_per_node, return_counts=True)
    return per_node.size == 1 or bool(np.all(per_node == gpus_per_node))


def _within_pods(graph: OpGraph, strategy: Strategy, pod_gpus: int, sym: Symmetry) -> bool:
    """Whether every op's devices along the symmetry's dims lie in one pod of ``pod_gpus``:
    then a replica's collective groups span the pods its representative's do, and cost the
    same (:meth:`engine.cluster.Cluster.collective_group` is all that reads pods)."""
    seen: set[tuple] = set()
    for op in graph.ops:
        cfg = strategy.configs[op.name]
        dims = sym.dims.get(op.name) or ()
        key = (id(cfg), tuple(dims))
        if not dims or key in seen:
            continue
        seen.add(key)
        names = [d.name for d in op.dims if cfg.degree(d.name) > 1]
        grid = np.asarray(cfg.devices, np.int64).reshape([cfg.degree(n) for n in names]) // pod_gpus
        # (a mixture-of-experts op's ``outer+inner`` axis runs along both its dims: _with_nested)
        for n in {part for d in dims for part in d.split("+")} & set(names):
            if np.any(np.diff(grid, axis=names.index(n))):
                return False
    return True


def _factors(strides: dict[str, tuple[int, int]]) -> dict[str, list[tuple[tuple[int, int], tuple[int, int]]]]:
    """Each dim's splits into an inner and an outer axis: a dim of degree a x b and device
    stride s runs along (a, s) and (b, a x s) together (under sequence and context
    parallelism a norm splits the sequence over cp x tp ranks, where attention splits heads
    over tp and the sequence over cp)."""
    out: dict[str, list] = {}
    for n, (d, st) in strides.items():
        pairs = [((a, st), (d // a, st * a)) for a in range(2, d) if d % a == 0]
        if pairs:
            out[n] = pairs
    return out


def _common_axes(graph: OpGraph, strategy: Strategy, axes, factors: bool) -> Symmetry | None:
    """:func:`find_symmetry`'s search, with each dim also offered as its factor pairs
    (``factors``): an axis is common when every op runs exactly one dim (or one dim's factor)
    along it; a factored dim counts only with both its factors among the axes."""
    common: set[tuple[int, int]] | None = None
    per_op: dict[str, tuple[dict, dict]] = {}
    # ops that share a config (its degrees and its devices less the first: strides do not
    # see a shift) and a dim order share the strides (a baseline's 3,030 ops have a handful of
    # configs: reading each op's 16,384 devices took 1.4 s; a Megatron layout's 2,410 ops of
    # GPT-3 have one config object each, and 13 distinct ones)
    seen: dict[tuple, tuple[dict, dict]] = {}
    by_id: dict[int, tuple] = {}
    shapes: dict[int, bytes] = {}  # id(device tuple) -> its devices less the first (tuples are shared)
    for op in graph.ops:
        cfg = strategy.configs[op.name]
        code = by_id.get(id(cfg))
        if code is None:
            shape = shapes.get(id(cfg.devices))
            if shape is None:
                devs = np.asarray(cfg.devices, np.int64)
                shape = shapes[id(cfg.devices)] = (devs - devs.min()).tobytes() if devs.size else b""
            code = by_id[id(cfg)] = (tuple(cfg.degrees.items()), shape)
        key = (code, tuple(d.name for d in op.dims), op.kind)
        st = seen.get(key)
        if st is None:
            direct = _with_nested(op, dim_strides(op, cfg))
            fac = _factors(direct) if factors else {}
            listed = list(direct.values()) + [a for pairs in fac.values() for pair in pairs for a in pair]
            found = {a for a in listed if listed.count(a) == 1}
            if axes is not None:
                found &= set(axes)
            st = seen[key] = (direct, fac)
            common = found if common is None else common & found  # (an op class's axes met once)
            if not common:
                return None
        per_op[op.name] = st
    if not common:
        return None
    for d, st in list(common):  # an axis common whole, not as its factors
        for pair in _factors({"": (d, st)}).get("", []):
            common.difference_update(pair)
    chosen = tuple(sorted(common, key=lambda a: a[1]))
    dims = {}
    for name, (direct, fac) in per_op.items():
        used = [d for n, a in direct.items() if a in common for d in n.split("+")]
        covered = {a for a in direct.values() if a in common}
        for n, pairs in fac.items():
            for pair in pairs:
                inside = [a in common for a in pair]
                if all(inside):
                    used.append(n)
                    covered.update(pair)
        if len(set(used)) != len(used) or covered != common:
            # one dim on two axes, or an axis only half of a factored dim runs along: not a translation
            return None
        dims[name] = tuple(used)
    return Symmetry(chosen, dims)


def _with_nested(op: Op, strides: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """``strides`` plus the axes two dims make together when one nests inside the other on
    the devices (the inner's stride times its degree is the outer's stride): a
    mixture-of-experts layer's ``sample`` and ``expert`` together run along the axis the
    attention's ``sample`` runs along, so expert-parallel ranks mirror like data-parallel
    ones (balanced routing gives every rank the same work; the dispatch is one collective over
    the group). Named ``outer+inner``."""
    if op.kind != "experts" or len(strides) < 2:
        return strides
    out = dict(strides)
    names = list(strides)
    for i in names:
        for o in names:
            (di, si), (do, so) = strides[i], strides[o]
            if i != o and so == si * di and "+" not in i + o:
                out[f"{o}+{i}"] = (di * do, si)
    return out


