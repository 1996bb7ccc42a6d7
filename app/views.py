"""What each view but the timeline shows (the op graph, an op's details, the cluster, memory,
the summary and why-text), computed from the engine's objects as plain arrays and dicts.

The figure builders in :mod:`app.figures` draw these; keeping the two apart lets tests check
the numbers without a figure and the figures without a simulation. The timeline's data is
:mod:`app.gantt`.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import networkx as nx
import numpy as np

from engine.cluster import Cluster
from engine.ops import EXPERT
from engine.graph import OpGraph
from engine.sim.memory import MemoryReport
from engine.sim.report import tokens_per_s
from engine.sim.full import Timeline
from engine.strategy import Config, Strategy
from engine.sim.breakdown import chain_seconds
from engine.taskgraph import BWD, COLL, FWD, XFER

from .fmt import format_bytes
from .gantt import PHASE_NAMES

__all__ = ["time_in_flight_s", "block_stack", "graph_layout", "config_label", "moe_text", "op_details",
           "topology_data", "memory_data", "summary_data", "why_text", "config_diff", "expert_param_share"]

# --------------------------------------------------------------------------- op graph


def graph_layout(graph: OpGraph, collapse: bool) -> dict[str, Any]:
    """Positions of a layered drawing (the page keeps one per graph and mode:
    :attr:`app.sessions.Sessions.layouts`): layers by longest
    path from the inputs, order within a layer by the barycentre of predecessors (two sweeps).
    With ``collapse`` every block (``op.block``) is one node."""
    if collapse:
        key = [op.block or op.name for op in graph.ops]
    else:
        key = [op.name for op in graph.ops]
    nodes = list(dict.fromkeys(key))
    members: dict[str, list[str]] = {n: [] for n in nodes}
    for op, k in zip(graph.ops, key):
        members[k].append(op.name)
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    for (p, _, c, _) in graph.edges:
        a, b = key[p], key[c]
        if a != b:
            g.add_edge(a, b)
    return {**_layered(g, nodes), "members": members, "collapsed": collapse}


def _layered(g: "nx.DiGraph", nodes: list[str]) -> dict[str, Any]:
    """Layers by longest path from the inputs, order within a layer by the barycentre of
    predecessors (two sweeps): ``nodes``, ``x`` (layer), ``y`` and ``edges``."""
    layer = {}
    for n in nx.topological_sort(g):
        layer[n] = max((layer[p] + 1 for p in g.predecessors(n)), default=0)
    layers: dict[int, list[str]] = {}
    for n in nodes:
        layers.setdefault(layer[n], []).append(n)
    pos_y = {}
    for li in sorted(layers):
        for i, n in enumerate(layers[li]):
            pos_y[n] = float(i)
    for _ in range(2):
        for li in sorted(layers):
            row = layers[li]
            bary = {n: np.mean([pos_y[p] for p in g.predecessors(n)]) if g.in_degree(n) else pos_y[n] for n in row}
            row.sort(key=lambda n: bary[n])
            mid = (len(row) - 1) / 2
            for i, n in enumerate(row):
                pos_y[n] = i - mid
    return {"nodes": nodes, "x": [float(layer[n]) for n in nodes], "y": [pos_y[n] for n in nodes],
            "edges": list(g.edges())}


#: vertical units per op of the expanded block in the stack
_STACK_OP_DY = 0.8


def block_stack(graph: OpGraph, strategy: Strategy, selected: list[str] | None = None) -> dict[str, Any]:
    """The operator graph of a model built from blocks (layers, Inception modules) as a stack,
    top to bottom: one row per block, consecutive blocks that are alike (the same ops with the
    same configs on the same GPUs, in the same pipeline stage) merged into one row with their
    count, each row labelled with its ops, its split and its GPUs. The row holding every
    ``selected`` op is expanded: its first block's ops are drawn below it, top to bottom, the ops
    of one layer of its DAG side by side and named in one text.

    Returns ``nodes`` / ``x`` / ``y`` / ``members`` / ``edges`` as :func:`graph_layout` does
    (rows and, when expanded, ops), ``rows`` (the row nodes, top to bottom), ``labels`` (a
    row's text), ``expanded`` (its node or None) and ``collapsed`` True."""
    blocks = list(dict.fromkeys(op.block or op.name for op in graph.ops))
    members: dict[str, list[str]] = {b: [] for b in blocks}
    for op in graph.ops:
        members[op.block or op.name].append(op.name)
    of = {m: b for b, ms in members.items() for m in ms}
    g = nx.DiGraph()
    g.add_nodes_from(blocks)
    for (p, _, c, _) in graph.edges:
        a, b = of[graph.ops[p].name], of[graph.ops[c].name]
        if a != b:
            g.add_edge(a, b)
    order = list(nx.lexicographical_topological_sort(g, key=blocks.index))

    def signature(b: str) -> tuple:
        strip = len(b) + 1
        return tuple((m[strip:] if m.startswith(b + ".") else m, strategy[m].degrees, strategy[m].devices,
                      strategy.stage_of.get(m)) for m in members[b])

    rows: list[list[str]] = []  # each row: its blocks
    for b in order:
        last = rows[-1][-1] if rows else None
        if (last is not None and g.has_edge(last, b) and g.out_degree(last) == 1 and g.in_degree(b) == 1
                and graph[members[b][0]].block and signature(b) == signature(last)):
            rows[-1].append(b)
        else:
            rows.append([b])
    row_of = {b: i for i, r in enumerate(rows) for b in r}
    sel = set(selected or ())
    row_members = [[m for b in r for m in members[b]] for r in rows]
    expanded = next((i for i, ms in enumerate(row_members) if sel and sel <= set(ms)), None)
    nodes, xs, ys, labels = [], [], [], {}
    op_text: dict[str, str] = {}  # the expanded block: one text per layer of its ops, at the last op
    mem_out: dict[str, list[str]] = {}
    edges: list[tuple[str, str]] = []
    y = 0.0
    row_y = []
    for i, r in enumerate(rows):
        node = r[0]
        nodes.append(node)
        xs.append(0.0)
        ys.append(y)
        row_y.append(y)
        mem_out[node] = row_members[i]
        labels[node] = _row_label(graph, strategy, r, members)
        y -= 1.0
        if i == expanded:  # the first block's ops, top to bottom like the stack, under the row
            sub = _sub_layout(graph, members[r[0]])
            by_layer: dict[float, list[tuple[float, str]]] = {}
            for n, layer, pos in zip(sub["nodes"], sub["x"], sub["y"]):
                by_layer.setdefault(layer, []).append((pos, n))
            for layer in sorted(by_layer):
                ops = [n for _, n in sorted(by_layer[layer])]
                for j, n in enumerate(ops):
                    nodes.append(n)
                    xs.append(0.6 + 0.35 * j)
                    ys.append(y)
                    mem_out[n] = [n]
                strip = len(r[0]) + 1
                op_text[ops[-1]] = " · ".join((n[strip:] if n.startswith(r[0] + ".") else n)
                                              + _moe_tag(graph[n], strategy[n]) for n in ops)
                y -= _STACK_OP_DY
            edges += sub["edges"]
            y -= 1.0 - _STACK_OP_DY
    for a, b in g.edges():
        ra, rb = row_of[a], row_of[b]
        if ra != rb:
            edges.append((rows[ra][0], rows[rb][0]))
    return {"nodes": nodes, "x": xs, "y": ys, "members": mem_out, "edges": list(dict.fromkeys(edges)),
            "rows": [r[0] for r in rows], "labels": labels, "op_text": op_text, "blocks": {r[0]: len(r) for r in rows},
            "expanded": rows[expanded][0] if expanded is not None else None, "collapsed": True, "stack": True}


def _sub_layout(graph: OpGraph, names: list[str]) -> dict[str, Any]:
    """:func:`graph_layout`'s drawing of the ops ``names`` alone (edges among them)."""
    keep = set(names)
    g = nx.DiGraph()
    g.add_nodes_from(names)
    for (p, _, c, _) in graph.edges:
        a, b = graph.ops[p].name, graph.ops[c].name
        if a in keep and b in keep and a != b:
            g.add_edge(a, b)
    return _layered(g, names)


def _row_label(graph: OpGraph, strategy: Strategy, blocks: list[str], members: dict[str, list[str]]) -> str:
    """``"layers.0–15 (16 blocks, same split) · 23 ops · sample 8 · feature 8 (+3 other splits) · 64 GPUs · stage 0"``."""
    first, last = blocks[0], blocks[-1]
    if len(blocks) > 1:
        pre = first.rsplit(".", 1)[0] + "." if "." in first else ""
        name = f"{first}–{last[len(pre):] if last.startswith(pre) else last} ({len(blocks)} blocks, same split)"
    else:
        name = first
    ms = members[first]
    counts: dict[str, int] = {}
    devs: set[int] = set()
    for m in ms:
        counts[config_label(strategy[m])] = counts.get(config_label(strategy[m]), 0) + 1
        devs.update(strategy[m].devices)
    top = max(counts, key=lambda k: counts[k])
    more = f" (+{len(counts) - 1} other split{'s' if len(counts) > 2 else ''})" if len(counts) > 1 else ""
    stages = sorted({strategy.stage_of[m] for m in ms if m in strategy.stage_of})
    stage = f" · stage {stages[0]}" if len(stages) == 1 and strategy.pipeline.stages > 1 else ""
    ops = f"{len(ms)} op{'s' if len(ms) > 1 else ''}" + (" each" if len(blocks) > 1 else "")
    moe = next((" · " + moe_text(graph[m], strategy[m], short=True) for m in ms if graph[m].kind == "experts"), "")
    return f"{name} · {ops}{moe} · {top}{more} · {len(devs):,} GPU{'s' if len(devs) > 1 else ''}{stage}"


def _moe_tag(op, config: Config) -> str:
    """The expanded block's note on a MoE op: ``" [top-2 of 8]"`` (router), ``" [8 experts
    top-2 · ep 8 · all-to-all in and out]"`` (experts); "" for other ops."""
    if op.kind == "router":
        return f" [top-{op.attrs['top_k']} of {op.attrs['num_experts']}]"
    if op.kind == "experts":
        how = "all-to-all" if op.attrs.get("dispatcher", "alltoall") == "alltoall" else "gather/scatter"
        return f" [{moe_text(op, config, short=True)[4:]} · {how} in and out]"
    return ""


def moe_text(op, config: Config, short: bool = False) -> str:
    """What a mixture-of-experts op does under ``config``: for the experts op ``"8 experts,
    top-2, ep 8 (all-to-all dispatch and combine)"`` (ep: the degrees of its expert dims, etp:
    of its ``ffn`` dim; ``short``: ``"MoE 8 experts top-2 · ep 8"``), for the router ``"scores
    over 8 experts, picks top-2"``; "" for any other op."""
    if op.kind == "router":
        return f"scores over {op.attrs['num_experts']} experts, picks top-{op.attrs['top_k']}"
    if op.kind != "experts":
        return ""
    ep = int(np.prod([config.degree(d.name) for d in op.dims if d.kind == EXPERT]))
    etp = config.degree("ffn")
    par = f"ep {ep}" + (f" x etp {etp}" if etp > 1 else "")
    e, k = op.attrs["num_experts"], op.attrs["top_k"]
    if short:
        return f"MoE {e} experts top-{k} · {par}"
    how = "all-to-all" if op.attrs.get("dispatcher", "alltoall") == "alltoall" else "all-gather / reduce-scatter"
    per = e // ep if e % ep == 0 else e / ep
    return (f"{e} experts, top-{k}, {par} ({per:g} expert{'s' if per != 1 else ''} per rank; tokens "
            f"dispatched to them and combined back by {how})")


def config_label(config: Config) -> str:
    """A short name of a config's split: ``"sample 4"``, ``"sample 2 · channel 2"``,
    ``"none"``."""
    return " · ".join(f"{k} {v}" for k, v in config.degrees.items()) or "none"


def time_in_flight_s(start: np.ndarray, end: np.ndarray) -> float:
    """Seconds covered by the intervals [start, end) together (overlaps counted once)."""
    if start.size == 0:
        return 0.0
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    gaps = np.maximum(s[1:] - reach[:-1], 0.0)
    return float(reach[-1] - s[0] - gaps.sum())


def op_details(graph: OpGraph, strategy: Strategy, timeline: Timeline, name: str) -> dict[str, Any]:
    """What the op panel shows for one op: its forward and backward time on its busiest GPU,
    and how long its transfers and collectives were in flight (never more than the iteration:
    summed over GPUs, a 46 ms transfer showed in a 31.6 ms iteration, issue 44)."""
    op = graph[name]
    tg = timeline.tasks
    oi = graph.index[name]
    mine = tg.op == oi
    busy = {}
    for k in (FWD, BWD):  # on its busiest GPU (summed over every GPU it read as more than the iteration)
        sel = np.nonzero(mine & (tg.kind == k))[0]
        per_gpu = np.bincount(tg.device[sel], weights=tg.dur_s[sel], minlength=1) if sel.size else np.zeros(1)
        busy[PHASE_NAMES[k]] = float(per_gpu.max())
    for k in (XFER, COLL):  # in flight: the union of its tasks' intervals in the iteration
        sel = np.nonzero(mine & (tg.kind == k))[0]
        busy[PHASE_NAMES[k]] = time_in_flight_s(timeline.start_s[sel], timeline.end_s[sel])
    cfg = strategy[name]
    return {
        "name": name, "kind": op.kind, "block": op.block,
        "outputs": [list(t.shape) for t in op.out_tensors],
        "dims": [{"name": d.name, "size": d.size, "kind": d.kind} for d in op.dims],
        "fwd_flops": op.fwd_flops, "bwd_flops": op.bwd_flops, "params": op.param_count,
        "config": cfg.to_dict(), "label": config_label(cfg),
        "time_s": busy, "partitions": cfg.num_partitions, "moe": moe_text(op, cfg),
    }


# --------------------------------------------------------------------------- topology, memory


def topology_data(cluster: Cluster, per_device: np.ndarray, metric: str) -> dict[str, Any]:
    """Positions of GPUs, switches, NICs and the fabric, the links between them (with their
    bandwidths) and a value per GPU (``metric``: utilisation or memory fraction). The drawing
    of the cluster is made once per cluster (:func:`_cluster_drawing`): only the values change
    from page to page (1,024 GPUs: ~30 ms of every page before)."""
    gpus, hubs, edges, nodes = _cluster_drawing(cluster)
    values = np.asarray(per_device, dtype=float).tolist()
    return {"gpus": [{**g, "value": values[g["id"]]} for g in gpus], "hubs": hubs, "edges": edges, "metric": metric,
            "nodes": nodes}


#: the drawings :func:`_cluster_drawing` made, by cluster (a cluster no page holds is let go)
_DRAWINGS: "weakref.WeakKeyDictionary[Cluster, tuple]" = weakref.WeakKeyDictionary()
_DRAWINGS_LOCK = threading.Lock()


def _cluster_drawing(cluster: Cluster) -> tuple[list[dict], list[dict], list[dict], list[str]]:
    """(GPUs without their values, hubs, edges, node names) of :func:`topology_data`, made once
    per cluster; the lists are shared: read them, never change them."""
    with _DRAWINGS_LOCK:
        hit = _DRAWINGS.get(cluster)
    if hit is not None:
        return hit
    pos: dict[str, tuple[float, float]] = {}
    nodes = cluster.node_names
    per_node: dict[int, list[int]] = {}
    for d in cluster.devices:
        per_node.setdefault(d.node, []).append(d.id)
    width = max(len(v) for v in per_node.values()) + 1
    for ni, name in enumerate(nodes):
        devs = per_node.get(ni, [])
        x0 = ni * width
        for j, d in enumerate(devs):
            pos[f"gpu{d}"] = (x0 + j, 2.0)
        pos[f"{name}/switch"] = (x0 + (len(devs) - 1) / 2, 1.2)
        for k in range(8):
            for side in ("tx", "rx"):
                pos[f"{name}/nic{k}:{side}"] = (x0 + k * 0.8, 0.6)
    pos["fabric"] = ((len(nodes) * width - 1) / 2, -0.4)

    def where(end: str) -> tuple[float, float] | None:
        if end.startswith("gpu") and ":" in end:
            return pos.get(end.split(":")[0])
        return pos.get(end)

    edges = []
    seen = set()
    for lk in cluster.links:
        a, b = where(lk.src), where(lk.dst)
        if a is None or b is None:
            continue
        key = tuple(sorted((a, b)))
        if key in seen:
            continue
        seen.add(key)
        edges.append({"from": a, "to": b, "kind": lk.kind, "bw": lk.bw_bytes_per_s})
    gpus = [{"id": d.id, "name": d.name, "type": d.type, "x": pos[f"gpu{d.id}"][0], "y": pos[f"gpu{d.id}"][1]}
            for d in cluster.devices]
    ends = {e["from"] for e in edges} | {e["to"] for e in edges}  # (a set: 1,024 GPUs have 3,000+ hubs)
    hubs = [{"name": n, "x": p[0], "y": p[1]} for n, p in pos.items() if not n.startswith("gpu") and p in ends]
    made = (gpus, hubs, edges, list(nodes))
    with _DRAWINGS_LOCK:
        _DRAWINGS[cluster] = made
    return made


#: The figure's names for :meth:`MemoryReport.breakdown`'s parts (the rest keep their own).
MEMORY_LABELS = {"optimizer state": "optimizer", "communication buffers": "comm buffers",
                 "activations": "activations (peak)"}


def memory_data(report: MemoryReport, devices: list[int], stage_of_device: np.ndarray | None = None,
                max_groups: int = 64, expert_share: np.ndarray | None = None) -> dict[str, Any]:
    """Per group of GPUs whose memory is identical (bytes): every part of the peak
    (:meth:`~engine.sim.memory.MemoryReport.breakdown_arrays`: weights, gradients, optimizer state,
    buffers, peak activations, gathered parameters, logits, fragmentation, CUDA context) and
    capacity; one bar per group, labelled with its pipeline stage
    (``stage_of_device``, :func:`stage_of_devices`), its first GPU and how many it stands for
    (1,024 data-parallel GPUs are one bar; a pipeline's stages one each). At most ``max_groups``
    bars, the fullest kept (``hidden`` counts the groups left out). ``expert_share``
    (:func:`expert_param_share`): a MoE model's routed experts' share of each GPU's
    parameters, given per bar as ``expert_share`` (the hover says it)."""
    d = np.asarray(devices, np.int64)
    # every part of the peak (MemoryReport.breakdown_arrays, summing to peak_bytes), by the
    # figure's labels
    parts = {MEMORY_LABELS.get(k, k): v[d] for k, v in report.breakdown_arrays().items()}
    cap = report.capacity_bytes[d]
    stage = stage_of_device[d] if stage_of_device is not None else np.full(d.size, -1, np.int64)
    keys = np.round(np.stack(list(parts.values()) + [cap], axis=1) / 1024.0)  # (KiB: equal up to rounding)
    keys = np.concatenate([keys, stage[:, None].astype(np.float64)], axis=1)  # (one bar never spans two stages)
    _, first, inverse, counts = np.unique(keys, axis=0, return_index=True, return_inverse=True, return_counts=True)
    order = np.argsort(first)
    hidden = 0
    if order.size > max_groups:  # the fullest groups, then back in device order
        fill = report.peak_bytes[d[first]] / np.maximum(cap[first], 1.0)
        top = np.argsort(-fill, kind="stable")[:max_groups]  # (group ids, fullest first)
        hidden = int(order.size - top.size)
        order = order[np.isin(order, top)]  # (back in device order)
    pick = first[order]
    labels = [(f"stage {int(stage[i])} · " if stage[i] >= 0 else "") + f"GPU {int(d[i])}"
              + (f" (x{int(counts[k])})" if counts[k] > 1 else "") for k, i in zip(order, pick)]
    return {"devices": [int(x) for x in d[pick]], "labels": labels,
            "parts": {k: v[pick] for k, v in parts.items()},
            "capacity": cap[pick], "feasible": report.feasible, "hidden": hidden,
            "over": report.over_capacity(),
            **({"expert_share": np.asarray(expert_share)[d][pick]} if expert_share is not None else {})}


def expert_param_share(graph: OpGraph, strategy: Strategy, n_devices: int) -> np.ndarray | None:
    """[device] the share of the parameters a GPU holds that are routed experts' (their
    weights, gradients and optimizer state scale with it); None for a dense model. Each op's
    partition counted on its device (before ZeRO's sharding, which cuts every part alike)."""
    if not any(op.kind == "experts" for op in graph.ops):
        return None
    held, experts = np.zeros(n_devices), np.zeros(n_devices)
    sizes: dict[tuple, float] = {}
    for op in graph.ops:
        if not op.param_count or op.kind == "input":
            continue
        cfg = strategy[op.name]
        key = (op.kind, tuple(p.shape for p in op.params), tuple(cfg.degrees.items()))
        n = sizes.get(key)
        if n is None:
            n = sizes[key] = op.partition_param_elements(cfg.degrees)
        devs = np.asarray(cfg.devices, np.int64)
        np.add.at(held, devs, n)
        if op.kind == "experts":
            np.add.at(experts, devs, n)
    return np.divide(experts, held, out=np.zeros(n_devices), where=held > 0)


def summary_data(graph: OpGraph, timeline: Timeline, report: MemoryReport, dp_cost_s: float | None) -> dict:
    """The summary cards' numbers (tokens/s as the engine defines it: :func:`engine.sim.report.tokens_per_s`)."""
    t = timeline.makespan_s
    tg = timeline.tasks
    return {
        "tokens_per_s": tokens_per_s(graph, t),
        "iteration_time_s": t,
        "throughput_samples_per_s": graph.batch_size / t if t > 0 else None,
        "speedup_vs_data_parallel": dp_cost_s / t if dp_cost_s and t > 0 else None,
        "comm_bytes": timeline.comm_bytes,
        "critical_path_s": timeline.critical_path_s,
        "tasks": tg.num_tasks,
        "peak_memory_bytes": float(report.peak_bytes.max()) if report.peak_bytes.size else 0.0,
        "feasible": report.feasible,
        "mean_utilization": float(np.mean(timeline.utilization[timeline.utilization > 0]))
        if np.any(timeline.utilization > 0) else 0.0,
    }


def why_text(summary: dict, dp: dict | None, timeline: Timeline, memory: MemoryReport | None = None) -> str:
    """Why the current strategy is as fast as it is, from its numbers (and data parallel's):
    what its critical chain is made of, its speedup, and advice that follows from what
    dominates: gradient synchronisation (per-iteration collectives), collectives inside the
    layers (tensor / sequence parallelism, ZeRO-3 gathers: per microbatch), transfers between
    ops, idle GPUs; and, when it does not fit, what lowers the peak (``memory``)."""
    sec = chain_seconds(timeline)  # (engine.sim.breakdown: the one classification of the chain's tasks)
    total = float(timeline.tasks.dur_s[timeline.critical_tasks].sum()) or 1.0
    comp = sec["compute"] / total
    share = {"gradient synchronisation": sec["gradient synchronisation"] / total,
             "collectives inside the layers": sec["tensor / sequence / context-parallel collectives"] / total,
             "the experts' all-to-alls": sec["expert all-to-alls"] / total,
             "transfers between ops": sec["transfers"] / total}
    comm = sum(share.values())
    parts = ", ".join(f"{k} {v:.0%}" for k, v in share.items() if v >= 0.005)
    lines = [f"The critical chain (the tasks that set the iteration time) is {comp:.0%} compute and "
             f"{comm:.0%} communication{f' ({parts})' if parts else ''}; the rest is waiting."]
    if dp and dp.get("comm_bytes"):
        ratio = summary["comm_bytes"] / dp["comm_bytes"]
        lines.append(f"It moves {format_bytes(summary['comm_bytes'])} per iteration, {ratio:.2f}x data "
                     f"parallel's {format_bytes(dp['comm_bytes'])}.")
    sp = summary.get("speedup_vs_data_parallel")
    if sp:
        if sp > 1.01:
            lines.append(f"It is {sp:.2f}x faster than data parallel: " +
                         ("less data moves, and less of it on the critical chain." if dp and
                          summary["comm_bytes"] < dp["comm_bytes"] else
                          "its work is spread so that devices wait less."))
        elif sp < 0.99:
            lines.append(f"It is {1 / sp:.2f}x slower than data parallel.")
        else:
            lines.append("It is as fast as data parallel.")
    if comm > 0.3:
        top = max(share, key=lambda k: share[k])
        advice = {
            "gradient synchronisation": "fewer data-parallel replicas to synchronise (more tensor or pipeline "
                                        "parallelism), the reduce overlapped with the backward pass, or more of the "
                                        "batch on each GPU so the sync hides behind more compute.",
            "collectives inside the layers": "they are the tensor-, sequence- or context-parallel collectives (and "
                                             "ZeRO-3's weight gathers): a lower degree, those groups kept inside a "
                                             "node (NVLink), or ZeRO 1/2 instead of 3 cut them.",
            "the experts' all-to-alls": "expert parallelism kept inside a node (NVLink) or of a lower degree, the "
                                        "all-to-alls overlapped with another microbatch's compute (the layout "
                                        "panel's MoE all-to-all overlap), or more tokens per expert cut them.",
            "transfers between ops": "keep neighbouring ops on the same devices with the same split (each change "
                                     "of split or devices moves the tensor between them).",
        }[top]
        lines.append(f"Communication dominates, mostly {top} ({share[top]:.0%} of the chain): {advice}")
    elif summary.get("mean_utilization", 1) < 0.5:
        lines.append("GPUs are idle more than half the time: the work is not spread evenly.")
    if memory is not None and not memory.feasible:
        over = memory.over_capacity()
        lines.append(f"It does not fit in memory ({len(over):,} GPU{'s' if len(over) != 1 else ''} over capacity, "
                     f"GPU {over[0][0]} by {format_bytes(over[0][1])}): recomputation, a higher ZeRO stage, more "
                     "tensor or pipeline parallelism, or a smaller micro-batch lower the peak; \"Smallest cluster "
                     "for this layout\" (under the memory chart) finds where it fits.")
    return " ".join(lines)


def config_diff(a: Strategy, b: Strategy) -> list[dict[str, str]]:
    """Ops whose configs differ between two strategies of one model, in op order."""
    return [{"op": op, "a": f"{config_label(a[op])} on {len(a[op].devices)} GPU(s)",
             "b": f"{config_label(b[op])} on {len(b[op].devices)} GPU(s)"}
            for op in a.configs if op in b.configs and a[op] != b[op]]
