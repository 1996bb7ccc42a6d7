"""The parts of a composed prediction's reference (:mod:`engine.sim.hier`, issue 43): the model
cut to the layers of the stages it keeps (:func:`reference_graph`), the cluster cut to their
nodes and pods (:func:`reference_cluster`, :func:`reference_pods`), and which of its stages
uses each link (:func:`link_stages`). Each is made once per shape and kept: a sweep asks for
the same few again and again.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import replace

import numpy as np

from ..cluster import Cluster
from ..graph import OpGraph
from ..graph.blocks import layer_blocks

__all__ = ["HierProblem", "reference_graph", "reference_cluster", "reference_pods", "link_stages", "layers_alike"]


class HierProblem(Exception):
    """The layout is not one the hierarchical prediction reads exactly (the message says why;
    :mod:`engine.sim.hier` raises it, and so does :func:`reference_graph`)."""


def reference_graph(graph: OpGraph, keep: int) -> OpGraph:
    """``graph`` with only its first ``keep`` layer blocks: the ops after the layers read the
    last kept layer where they read the last layer (the layers are alike: checked by the
    caller).

    The same graph object for the same ``graph`` and ``keep`` (the last few made per graph,
    :data:`_REFERENCE_GRAPHS`): what is worked out once per graph (the memory model's per-op
    results, :func:`engine.sim.memory_static.graph_cache`; layer blocks; op signatures) then
    carries from one prediction to the next, as a sweep's points of one pipeline depth share
    it. Graphs are never changed once made."""
    blocks = layer_blocks(graph)
    n = len(blocks)
    if keep >= n:
        return graph
    with _REFERENCE_LOCK:
        made = _REFERENCE_GRAPHS.setdefault(graph, {})
        hit = made.get(keep)
    if hit is None:
        hit = _cut_graph(graph, blocks, keep)
        with _REFERENCE_LOCK:
            made[keep] = hit
            while len(made) > REFERENCE_GRAPHS_KEPT:
                made.pop(next(iter(made)))
    return hit


#: reference graphs kept per model graph (by the number of layers they keep)
REFERENCE_GRAPHS_KEPT = 16
_REFERENCE_GRAPHS: "weakref.WeakKeyDictionary[OpGraph, dict[int, OpGraph]]" = weakref.WeakKeyDictionary()
_REFERENCE_LOCK = threading.Lock()


def _cut_graph(graph: OpGraph, blocks: list[str], keep: int) -> OpGraph:
    """:func:`reference_graph`'s graph, made."""
    n = len(blocks)
    index = {b: i for i, b in enumerate(blocks)}
    drop = set(blocks[keep:])
    rename: dict[str, str] = {}
    for op in graph.ops:
        if op.block in drop:
            i = index[op.block]
            if i >= n - 1:  # the last layer's ops stand for the last kept layer's
                rename[op.name] = blocks[keep - 1] + op.name[len(op.block):]
    ops, kept = [], set()
    for op in graph.ops:
        if op.block in drop:
            continue
        if any(r.op in rename for r in op.inputs):
            op = replace(op, inputs=tuple(replace(r, op=rename.get(r.op, r.op)) for r in op.inputs))
        if any(r.op not in kept for r in op.inputs):
            raise HierProblem(f"op {op.name} reads a layer the reference drops")
        ops.append(op)
        kept.add(op.name)
    return OpGraph(graph.name, graph.precision, ops, graph.description, graph.source)


def layers_alike(graph: OpGraph, blocks: list[str]) -> str | None:
    """Why the layer blocks are not alike op for op (kind, shapes, attributes), or None.
    Found once per graph (a graph's ops do not change; a sweep asks for every point)."""
    memo = graph.__dict__.setdefault("_hier_layers_alike", {})
    key = tuple(blocks)
    if key not in memo:
        memo[key] = _layers_differ(graph, blocks)
    return memo[key]


def _layers_differ(graph: OpGraph, blocks: list[str]) -> str | None:
    sig: dict[str, list] = {b: [] for b in blocks}
    for op in graph.ops:
        if op.block in sig:
            sig[op.block].append((op.name[len(op.block):], op.signature, op.param_group is None))
    first = sig[blocks[0]]
    for b in blocks[1:]:
        if sig[b] != first:
            return f"layer {b} differs from {blocks[0]}"
    return None


#: reference clusters made, by (cluster, nodes): a sweep asks for the same few again and again
_CLUSTERS: dict[tuple, Cluster] = {}


def reference_cluster(cluster: Cluster, nodes: int, pod_gpus: int = 0) -> Cluster:
    """The first ``nodes`` nodes of a cluster of identical nodes, in pods of ``pod_gpus`` (0:
    one; :func:`reference_pods`) under the cluster's oversubscription (made once per shape)."""
    spec = cluster.node_specs[0]
    key = (spec, nodes, pod_gpus, cluster.oversubscription, id(cluster.device_types))
    hit = _CLUSTERS.get(key)
    if hit is None:
        if len(_CLUSTERS) > 64:
            _CLUSTERS.clear()
        hit = _CLUSTERS[key] = Cluster(f"{cluster.name} (reference: {nodes} nodes)", [replace(spec, repeat=nodes)],
                                       cluster.device_types, cluster.description, pod_gpus=pod_gpus,
                                       oversubscription=cluster.oversubscription)
    return hit


def reference_pods(cluster: Cluster, p: int, stage_gpus: int) -> int:
    """The pods of a shorter reference (0: one) under which every collective costs what its
    counterpart does in the whole run. Every stage lies in one pod (``engine.sim.hier._problem``), so a
    stage's collectives never cross pods; the one between stages, the first and last stages'
    tied embeddings, crosses them in the whole run when its p stages do not fit in one pod: the
    reference's pods then hold one stage or one node each, so its first and last stages (three
    stages, or a node and two stages, apart) sit in different pods too. (A transfer between
    stages is not slowed by pods: :meth:`engine.cluster.Cluster.collective_group` alone reads them.)"""
    if not cluster.pod_gpus or cluster.oversubscription == 1.0 or p * stage_gpus <= cluster.pod_gpus:
        return 0
    return math.lcm(stage_gpus, cluster.gpus_per_node)


#: which stage uses each link, by reference cluster and stage size
_LINK_STAGES: dict[tuple, np.ndarray] = {}


def link_stages(cluster: Cluster, stage_gpus: int) -> np.ndarray:
    """[link] the stage (``stage_gpus`` GPUs a stage, in device order) whose GPUs alone use a
    link, -1 where several stages' do (a NIC shared across stages, a mesh link between them)."""
    key = (id(cluster), cluster.num_devices, stage_gpus)
    hit = _LINK_STAGES.get(key)
    if hit is not None:
        return hit
    out = np.full(len(cluster.links), -2, np.int64)  # -2: not seen yet

    def mark(link: int, stage: int) -> None:
        out[link] = stage if out[link] in (-2, stage) else -1

    G = cluster.gpus_per_node
    D = cluster.num_devices
    for d in range(D):
        st = d // stage_gpus
        node = d // G
        for e in range(node * G, min(D, node * G + G)):
            if e == d:
                continue
            for path, mine in ((cluster.path(d, e), 0), (cluster.path(e, d), -1)):
                mark(path[mine], st)
                if len(path) == 1:  # (a mesh link between two GPUs: both use it)
                    mark(path[0], e // stage_gpus)
        if cluster.num_nodes > 1:
            far = (d + G) % D
            out_path, in_path = cluster.path(d, far), cluster.path(far, d)
            for link in out_path[:len(out_path) // 2]:
                mark(link, st)
            for link in in_path[len(in_path) // 2:]:
                mark(link, st)
    out[out == -2] = -1
    if len(_LINK_STAGES) > 64:
        _LINK_STAGES.clear()
    _LINK_STAGES[key] = out
    return out
