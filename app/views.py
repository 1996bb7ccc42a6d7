"""What each view shows, computed from the engine's objects as plain arrays and dicts.

The figure builders in :mod:`app.figures` draw these; keeping the two apart lets tests check
the numbers without a figure and the figures without a simulation.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import networkx as nx
import numpy as np

from engine.cluster import Cluster
from engine.graph import OpGraph
from engine.memory import MemoryReport
from engine.simulate import Timeline
from engine.strategy import Config, Strategy
from engine.taskgraph import BWD, COLL, COLL_NAMES, FWD, UPDATE, XFER

from .fmt import format_bytes, format_seconds

__all__ = ["gantt_data", "graph_layout", "config_label", "op_details", "topology_data", "memory_data",
           "summary_data", "why_text", "config_diff", "MAX_BARS"]

#: bars drawn per Gantt view at most; beyond it, neighbouring tasks of one kind on one row
#: whose gap is under a pixel-sized interval are drawn as one bar (zooming in redraws them)
MAX_BARS = int(__import__("os").environ.get("SOAPBOX_MAX_BARS", 3000))
_PHASE = {FWD: "forward", BWD: "backward", UPDATE: "optimizer", XFER: "transfer", COLL: "collective"}


# --------------------------------------------------------------------------- Gantt


def _merge(row: np.ndarray, start: np.ndarray, end: np.ndarray, eps: float) -> tuple[np.ndarray, ...]:
    """Bars of tasks (sorted by row, then start) merged where the gap to the previous task on
    the row is at most ``eps``: (first index of each bar, start, end, tasks per bar)."""
    if start.size == 0:
        z = np.zeros(0)
        return np.zeros(0, np.int64), z, z, np.zeros(0, np.int64)
    new = np.ones(start.size, bool)
    if eps >= 0:
        new[1:] = (row[1:] != row[:-1]) | (start[1:] - end[:-1] > eps)
    idx = np.flatnonzero(new)
    return idx, np.minimum.reduceat(start, idx), np.maximum.reduceat(end, idx), np.diff(np.append(idx, start.size))


def gantt_data(graph: OpGraph, cluster: Cluster, timeline: Timeline, window: tuple[float, float] | None = None,
               selected: list[str] | None = None, max_bars: int = MAX_BARS) -> dict[str, Any]:
    """Rows and bars of the timeline: per used GPU a compute row (forward, backward, optimizer
    step) and a collectives row, then one row per link that carries transfers.

    ``window`` (seconds) limits the view; when more than ``max_bars`` tasks fall in it,
    neighbouring tasks are merged per row and kind (the hover says how many). The critical
    chain and the selected ops' tasks come as overlays, merged the same way when they are many.
    """
    tg = timeline.tasks
    start, end = timeline.start_s, timeline.end_s
    makespan = timeline.makespan_s
    t0, t1 = window if window else (0.0, makespan)
    names = [op.name for op in graph.ops]
    kind = tg.kind
    dev_used = np.unique(tg.device[(kind == FWD) | (kind == BWD)])
    dev_row = np.full(tg.n_devices, -1, np.int64)
    dev_row[dev_used] = np.arange(dev_used.size) * 2
    labels: list[str] = []
    image = tg.info.get("device_image")  # symmetric simulation: each row stands for its replicas
    alike = np.bincount(image[image >= 0], minlength=tg.n_devices) if image is not None else None
    for d in dev_used:
        n = int(alike[d]) if alike is not None else 1
        tag = f" (x{n} alike)" if n > 1 else ""
        labels += [f"GPU {d}{tag}", f"GPU {d} collectives"]
    links_used = np.unique(tg.link[kind == XFER])
    link_row = np.full(max(tg.n_links, 1), -1, np.int64)
    link_row[links_used] = 2 * dev_used.size + np.arange(links_used.size)
    for lk in links_used:
        link = cluster.links[int(lk)]
        labels.append(f"{link.src} → {link.dst}")
    # a row per task (collectives: see below)
    row = np.full(tg.num_tasks, -1, np.int64)
    comp = (kind == FWD) | (kind == BWD) | ((kind == UPDATE) & (tg.dur_s > 0))
    row[comp] = dev_row[tg.device[comp]]
    hop = kind == XFER
    row[hop] = link_row[tg.link[hop]]
    # collectives: a bar on the collectives row of every device that takes part, so the
    # task list below is (task, row) pairs: each other task once, a collective per device
    pair_task = np.flatnonzero(row >= 0)
    pair_row = row[pair_task]
    coll_devs = tg.info.get("coll_devices")
    if coll_devs is not None:
        ptr, idx, tasks = coll_devs
        if tasks.size:
            ct = np.repeat(tasks, np.diff(ptr))
            cr = dev_row[idx]
            ok = cr >= 0
            pair_task = np.concatenate([pair_task, ct[ok]])
            pair_row = np.concatenate([pair_row, cr[ok] + 1])
    vis = (end[pair_task] >= t0) & (start[pair_task] <= t1) & (end[pair_task] > start[pair_task])
    pair_task, pair_row = pair_task[vis], pair_row[vis]
    ids = np.arange(pair_task.size)  # pair index
    eps = -1.0
    if ids.size > max_bars:
        eps = (t1 - t0) / 1500
    per_kind = {}  # kind -> its (task, row) pairs ordered by row, then start (sorted once)
    for k, label in _PHASE.items():
        sel = ids[kind[pair_task] == k]
        if sel.size:
            t, r = pair_task[sel], pair_row[sel]
            o = np.lexsort((start[t], r))
            per_kind[label] = (t[o], r[o])
    bars: dict[str, dict[str, Any]] = {}
    while True:
        bars, total = {}, 0
        for label, (t, r) in per_kind.items():
            first, b_start, b_end, count = _merge(r, start[t], end[t], eps)
            bars[label] = {"task": t[first], "start": b_start, "end": b_end, "row": r[first], "count": count}
            total += first.size
        if total <= max_bars or eps < 0 or eps > (t1 - t0):
            break  # (past the window's width every row and kind is one bar already)
        eps *= 2
    for label, b in bars.items():
        b["text"] = _task_texts(tg, names, b["task"], b["count"], b["start"], b["end"])
    overlays = {}
    crit = timeline.critical_tasks
    first_row = np.full(tg.num_tasks, -1, np.int64)
    first_row[pair_task[::-1]] = pair_row[::-1]  # a collective's first device's row
    row = np.where(row >= 0, row, first_row)
    crit = crit[(row[crit] >= 0) & (end[crit] > start[crit])]
    overlays["critical path"] = crit
    if selected:
        want = np.array([graph.index[n] for n in selected if n in graph.index], np.int64)
        sel = np.flatnonzero(np.isin(tg.op, want) & (row >= 0) & comp)
        overlays["selected"] = sel[:2 * max_bars]
    over = {}
    for name, t in overlays.items():
        t = t[(end[t] >= t0) & (start[t] <= t1)]  # (only what the window shows)
        if eps >= 0 and t.size > max_bars // 4:
            # merged as the bars are (an LLM plan's critical chain runs to 10^5 tasks: drawn one
            # by one it made a 22 MB figure the browser took minutes to draw)
            o = np.lexsort((start[t], row[t]))
            t = t[o]
            first, b_start, b_end, count = _merge(row[t], start[t], end[t], eps)
            over[name] = {"start": b_start, "end": b_end, "row": row[t][first],
                          "text": _task_texts(tg, names, t[first], count, b_start, b_end)}
        else:
            over[name] = {"start": start[t], "end": end[t], "row": row[t],
                          "text": _task_texts(tg, names, t, np.ones(t.size, np.int64), start[t], end[t])}
    return {"labels": labels, "bars": bars, "overlays": over, "makespan_s": makespan, "window": [t0, t1],
            "merged": eps >= 0, "tasks_in_view": int(ids.size)}


def _task_texts(tg, names: list[str], tasks: np.ndarray, counts: np.ndarray, starts: np.ndarray,
                ends: np.ndarray) -> list[str]:
    """Hover text of each bar: task ``tasks[i]`` standing for ``counts[i]`` merged tasks from
    ``starts[i]`` to ``ends[i]`` (seconds). The task arrays are read once, as Python lists (a
    view has thousands of bars: indexing NumPy per bar cost more than the formatting)."""
    tasks = np.asarray(tasks, np.int64)
    kind, op, part, mb = (tg.kind[tasks].tolist(), tg.op[tasks].tolist(), tg.part[tasks].tolist(),
                          tg.mb[tasks].tolist())
    size, coll = tg.size_bytes[tasks].tolist(), tg.coll[tasks].tolist()
    out = []
    for i, (c, s, e) in enumerate(zip(np.asarray(counts).tolist(), np.asarray(starts, np.float64).tolist(),
                                      np.asarray(ends, np.float64).tolist())):
        k = kind[i]
        if c > 1:
            out.append(f"{c} {_PHASE[k]} tasks · {format_seconds(s)} – {format_seconds(e)} (zoom in for each)")
            continue
        name = names[op[i]] if op[i] >= 0 else ""
        dur = format_seconds(e - s)
        if k == FWD or k == BWD:
            out.append(f"{name} {_PHASE[k]} · part {part[i]} · microbatch {mb[i]} · {dur}")
        elif k == XFER:
            out.append(f"{name} transfer · {format_bytes(size[i])} · microbatch {mb[i]} · {dur}")
        elif k == COLL:
            out.append(f"{name} {COLL_NAMES[coll[i]]} · {format_bytes(size[i])} · {dur}")
        else:
            out.append(f"optimizer step · {dur}")
    return out


# --------------------------------------------------------------------------- op graph


@lru_cache(maxsize=32)
def graph_layout(graph: OpGraph, collapse: bool) -> dict[str, Any]:
    """Positions of a layered drawing (computed once per graph and mode): layers by longest
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
    edges = list(g.edges())
    return {"nodes": nodes, "x": [float(layer[n]) for n in nodes], "y": [pos_y[n] for n in nodes],
            "members": members, "edges": edges, "collapsed": collapse}


def config_label(config: Config) -> str:
    """A short name of a config's split: ``"sample 4"``, ``"sample 2 · channel 2"``,
    ``"none"``."""
    return " · ".join(f"{k} {v}" for k, v in config.degrees.items()) or "none"


def op_details(graph: OpGraph, strategy: Strategy, timeline: Timeline, name: str) -> dict[str, Any]:
    """What the op panel shows for one op."""
    op = graph[name]
    tg = timeline.tasks
    oi = graph.index[name]
    mine = tg.op == oi
    busy = {}
    for k in (FWD, BWD, XFER, COLL):
        sel = mine & (tg.kind == k)
        busy[_PHASE[k]] = float(tg.dur_s[sel].sum())
    cfg = strategy[name]
    return {
        "name": name, "kind": op.kind, "block": op.block,
        "outputs": [list(t.shape) for t in op.out_tensors],
        "dims": [{"name": d.name, "size": d.size, "kind": d.kind} for d in op.dims],
        "fwd_flops": op.fwd_flops, "bwd_flops": op.bwd_flops, "params": op.param_count,
        "config": cfg.to_dict(), "label": config_label(cfg),
        "time_s": busy, "partitions": cfg.num_partitions,
    }


# --------------------------------------------------------------------------- topology, memory


def topology_data(cluster: Cluster, per_device: np.ndarray, metric: str) -> dict[str, Any]:
    """Positions of GPUs, switches, NICs and the fabric, the links between them (with their
    bandwidths) and a value per GPU (``metric``: utilisation or memory fraction)."""
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
    gpus = [{"id": d.id, "name": d.name, "type": d.type, "x": pos[f"gpu{d.id}"][0], "y": pos[f"gpu{d.id}"][1],
             "value": float(per_device[d.id])} for d in cluster.devices]
    ends = {e["from"] for e in edges} | {e["to"] for e in edges}  # (a set: 1,024 GPUs have 3,000+ hubs)
    hubs = [{"name": n, "x": p[0], "y": p[1]} for n, p in pos.items() if not n.startswith("gpu") and p in ends]
    return {"gpus": gpus, "hubs": hubs, "edges": edges, "metric": metric, "nodes": list(nodes)}


def memory_data(report: MemoryReport, devices: list[int]) -> dict[str, Any]:
    """Per group of GPUs whose memory is identical (bytes): weights, gradients, optimizer state,
    buffers, peak activations and capacity; one bar per group, labelled with its first GPU and
    how many it stands for (1,024 data-parallel GPUs are one bar; a pipeline's stages one each)."""
    d = np.asarray(devices, np.int64)
    parts = {"weights": report.weights_bytes[d], "gradients": report.grads_bytes[d],
             "optimizer": report.optimizer_bytes[d], "comm buffers": report.comm_buffer_bytes[d],
             "activations (peak)": report.activations_peak_bytes[d]}
    cap = report.capacity_bytes[d]
    keys = np.round(np.stack(list(parts.values()) + [cap], axis=1) / 1024.0)  # (KiB: equal up to rounding)
    _, first, inverse, counts = np.unique(keys, axis=0, return_index=True, return_inverse=True, return_counts=True)
    order = np.argsort(first)
    pick = first[order]
    labels = [f"GPU {int(d[i])}" + (f" (x{int(counts[k])})" if counts[k] > 1 else "") for k, i in zip(order, pick)]
    return {"devices": [int(x) for x in d[pick]], "labels": labels,
            "parts": {k: v[pick] for k, v in parts.items()},
            "capacity": cap[pick], "feasible": report.feasible,
            "over": report.over_capacity()}


def tokens_per_sample(graph: OpGraph) -> int | None:
    """Tokens in one sample of a language model (its integer input's sequence length), else None."""
    for op in graph.ops:
        if op.kind == "input" and op.out_tensors[0].dtype.startswith("int") and "length" in op.dim_names:
            return op.dim("length").size
    return None


def mfu(graph: OpGraph, timeline: Timeline, cluster, devices: list[int]) -> float | None:
    """Model FLOPs utilisation: the model's forward and backward FLOPs per iteration (no
    recomputation counted) over the iteration time x the used GPUs' dense peak at the model's
    precision (PaLM's definition, Chowdhery et al. 2022 App. B)."""
    t = timeline.makespan_s
    if t <= 0 or not devices:
        return None
    flops = sum(op.fwd_flops + op.bwd_flops for op in graph.ops)
    try:
        peak = sum(cluster.device_type(d).peak(graph.precision) for d in devices)
    except ValueError:
        return None
    return flops / (t * peak) if peak > 0 else None


def summary_data(graph: OpGraph, timeline: Timeline, report: MemoryReport, dp_cost_s: float | None) -> dict:
    t = timeline.makespan_s
    tg = timeline.tasks
    tokens = tokens_per_sample(graph)
    return {
        "tokens_per_s": graph.batch_size * tokens / t if tokens and t > 0 else None,
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


def why_text(summary: dict, dp: dict | None, timeline: Timeline) -> str:
    """Why the current strategy is as fast as it is, from its numbers (and data parallel's)."""
    tg = timeline.tasks
    crit = timeline.critical_tasks
    dur = tg.dur_s[crit]
    total = float(dur.sum()) or 1.0
    comp = float(dur[(tg.kind[crit] == FWD) | (tg.kind[crit] == BWD)].sum()) / total
    comm = float(dur[(tg.kind[crit] == XFER) | (tg.kind[crit] == COLL)].sum()) / total
    lines = [f"The critical chain (the tasks that set the iteration time) is {comp:.0%} compute and "
             f"{comm:.0%} communication; the rest is waiting."]
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
        lines.append("Communication dominates: try splitting large-parameter ops along their parameter dims "
                     "(less gradient sync) or keeping neighbouring ops on the same devices (fewer transfers).")
    elif summary.get("mean_utilization", 1) < 0.5:
        lines.append("GPUs are idle more than half the time: the work is not spread evenly.")
    return " ".join(lines)


def config_diff(a: Strategy, b: Strategy) -> list[dict[str, str]]:
    """Ops whose configs differ between two strategies of one model, in op order."""
    return [{"op": op, "a": f"{config_label(a[op])} on {len(a[op].devices)} GPU(s)",
             "b": f"{config_label(b[op])} on {len(b[op].devices)} GPU(s)"}
            for op in a.configs if op in b.configs and a[op] != b[op]]
