"""What each view shows, computed from the engine's objects as plain arrays and dicts.

The figure builders in :mod:`app.figures` draw these; keeping the two apart lets tests check
the numbers without a figure and the figures without a simulation.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import networkx as nx
import numpy as np

from engine.cluster import Cluster
from engine.graph import OpGraph
from engine.memory import MemoryReport
from engine.simulate import Timeline
from engine.strategy import Config, Strategy
from engine.device_runs import device_runs
from engine.taskgraph import BWD, COLL, COLL_NAMES, FWD, UPDATE, XFER

from .fmt import format_bytes, format_seconds

__all__ = ["gantt_data", "block_stack", "stage_of_devices", "parse_row_filter", "ROW_GROUPS", "graph_layout",
           "config_label", "op_details", "topology_data", "memory_data", "mfu",
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


#: how the timeline's GPU rows are grouped (``auto``: each GPU up to 16 rows, else by stage
#: when pipelined, else by node)
ROW_GROUPS = ("auto", "gpu", "stage", "node")
#: link rows shown by default up to this many (beyond: behind the "links" toggle)
AUTO_LINK_ROWS = 16
#: GPU rows drawn at most (the rest are counted; the row filter or a grouping reaches them)
MAX_GPU_ROWS = 128


def stage_of_devices(strategy: Strategy, n_devices: int) -> np.ndarray | None:
    """[device] the pipeline stage whose ops run on it (-1: none); None without a pipeline."""
    if strategy.pipeline.stages <= 1 or not strategy.stage_of:
        return None
    out = np.full(n_devices, -1, np.int64)
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for name, stage in strategy.stage_of.items():
        cfg = strategy.configs.get(name)
        if cfg is None:
            continue
        key = (stage % strategy.pipeline.stages, cfg.devices)
        if key in seen:  # (a stage's blocks share their devices: each set looked at once)
            continue
        seen.add(key)
        out[np.asarray(cfg.devices, np.int64)] = key[0]
    return out


def parse_row_filter(text: str) -> list[tuple[str, Any]]:
    """The timeline's row filter: comma-separated GPU ids or ranges (``0-7, 12``), ``stage K``
    / ``node K`` (ranges too), or any other text matched against row labels. Raises
    ValueError naming the part it cannot read (a range given backwards)."""
    out: list[tuple[str, Any]] = []
    for part in str(text or "")[:200].split(","):
        p = part.strip().lower()
        if not p:
            continue
        m = re.fullmatch(r"(?:(gpu|stage|node)s?\s*)?(\d{1,7})(?:\s*-\s*(\d{1,7}))?", p)
        if m:
            a, b = int(m.group(2)), int(m.group(3) or m.group(2))
            if b < a:
                raise ValueError(f"row filter {part.strip()!r}: the range runs backwards")
            out.append((m.group(1) or "gpu", (a, b)))
        else:
            out.append(("text", p))
    return out


def _row_plan(timeline: Timeline, cluster: Cluster, dev_used: np.ndarray, rows: str,
              stage_of_device: np.ndarray | None, row_filter: str) -> tuple[np.ndarray, list[str], str]:
    """The GPUs whose rows the timeline draws, in order, each with its label, and the grouping
    used. ``gpu``: every simulated GPU (a symmetric simulation's mirrored GPUs counted on the row
    they mirror); ``stage`` / ``node``: one row per pipeline stage or node, drawing its first GPU,
    labelled with how many GPUs it stands for and how far their busy times spread."""
    tg = timeline.tasks
    n = tg.n_devices
    image = tg.info.get("device_image")
    if image is None:
        image = np.full(n, -1, np.int64)
        image[dev_used] = dev_used
    members_all = np.flatnonzero(image >= 0)  # every GPU the plan uses, mirrored ones too
    node = np.array([d.node for d in cluster.devices], np.int64)
    if rows not in ROW_GROUPS:
        rows = "auto"
    if rows == "auto":
        rows = "gpu" if dev_used.size <= 16 else ("stage" if stage_of_device is not None else "node")
    if rows == "stage" and stage_of_device is None:
        rows = "node"
    busy = np.zeros(n)  # compute seconds per simulated GPU
    comp = (tg.kind == FWD) | (tg.kind == BWD)
    np.add.at(busy, tg.device[comp], tg.dur_s[comp])
    busy_all = np.where(image >= 0, busy[np.maximum(image, 0)], 0.0)
    filt = parse_row_filter(row_filter)

    def wanted(label: str, devs: np.ndarray, group: Any) -> bool:
        if not filt:
            return True
        for kind, v in filt:
            if kind == "text" and v in label.lower():
                return True
            if kind == "gpu" and np.any((devs >= v[0]) & (devs <= v[1])):
                return True
            if kind in ("stage", "node"):  # (whatever the grouping: the stage or node of the GPUs a row stands for)
                key = stage_of_device if kind == "stage" else node
                if key is not None and np.any((key[devs] >= v[0]) & (key[devs] <= v[1])):
                    return True
        return False

    reps: list[int] = []
    labels: list[str] = []
    if rows == "gpu":
        alike = np.bincount(image[image >= 0], minlength=n)
        for d in dev_used:
            k = int(alike[d])
            label = f"GPU {d}" + (f" (x{k} alike)" if k > 1 else "")
            if wanted(label, np.flatnonzero(image == d), int(d)):
                reps.append(int(d))
                labels.append(label)
        return np.array(reps[:MAX_GPU_ROWS], np.int64), labels[:MAX_GPU_ROWS], rows
    key = stage_of_device if rows == "stage" else node
    groups: dict[int, list[int]] = {}  # representative GPU -> the groups its row stands for
    members: dict[int, list[np.ndarray]] = {}
    for grp in np.unique(key[members_all]):
        if grp < 0:
            continue
        devs = members_all[key[members_all] == grp]
        sim = np.intersect1d(np.unique(image[devs]), dev_used)
        if sim.size == 0:
            continue
        rep = int(sim[0])  # (under symmetry a group's GPUs may mirror another group's: one row for both)
        groups.setdefault(rep, []).append(int(grp))
        members.setdefault(rep, []).append(devs)
    for rep, grps in groups.items():
        devs = np.concatenate(members[rep])
        b = busy_all[devs]
        spread = (b.max() - b.min()) / b.max() if b.max() > 0 else 0.0
        k = devs.size // len(grps)
        count = f" ({k} GPUs each)" if len(grps) > 1 else f" ({k} GPUs)" if k > 1 else ""
        runs = device_runs(grps).replace(",", ", ")
        label = (f"{rows}{'s' if len(grps) > 1 else ''} {runs}{count}: GPU {rep}"
                 + (f", busy ±{spread / 2:.0%}" if spread > 0.02 else ""))
        if wanted(label, devs, grps):
            reps.append(rep)
            labels.append(label)
    return np.array(reps[:MAX_GPU_ROWS], np.int64), labels[:MAX_GPU_ROWS], rows


def gantt_data(graph: OpGraph, cluster: Cluster, timeline: Timeline, window: tuple[float, float] | None = None,
               selected: list[str] | None = None, max_bars: int = MAX_BARS, rows: str = "gpu",
               stage_of_device: np.ndarray | None = None, links: bool | None = None,
               row_filter: str = "", pipeline: tuple[int, int, int] | None = None) -> dict[str, Any]:
    """Rows and bars of the timeline: per GPU row (see ``rows``) a compute row (forward,
    backward, optimizer step) and a collectives row, then one row per link that carries
    transfers (``links``: None shows them up to :data:`AUTO_LINK_ROWS`).

    ``rows`` groups GPUs (:data:`ROW_GROUPS`, :func:`_row_plan`); ``row_filter`` keeps the rows
    it names (:func:`parse_row_filter`). ``window`` (seconds) limits the view; when more than
    ``max_bars`` tasks fall in it, neighbouring tasks are merged per row and kind (the hover says
    how many). The critical chain and the selected ops' tasks come as overlays, merged the same
    way when they are many. ``pipeline`` (stages, microbatches, virtual stages): the idle gaps of
    each GPU row before its last backward task come as the "bubble", with its measured share
    and the schedule's formula (:func:`_bubble`).
    """
    tg = timeline.tasks
    start, end = timeline.start_s, timeline.end_s
    makespan = timeline.makespan_s
    t0, t1 = window if window else (0.0, makespan)
    names = [op.name for op in graph.ops]
    kind = tg.kind
    dev_used = np.unique(tg.device[(kind == FWD) | (kind == BWD)])
    shown, gpu_labels, grouping = _row_plan(timeline, cluster, dev_used, rows, stage_of_device, row_filter)
    image = tg.info.get("device_image")
    gpus_in_plan = int(np.count_nonzero(image >= 0)) if image is not None else int(dev_used.size)
    dev_row = np.full(tg.n_devices, -1, np.int64)
    dev_row[shown] = np.arange(shown.size) * 2
    labels: list[str] = []
    for label in gpu_labels:
        labels += [label, label.split(":")[0].split(" (")[0] + " collectives"]
    links_all = np.unique(tg.link[kind == XFER])
    show_links = links if links is not None else links_all.size <= AUTO_LINK_ROWS
    links_used = links_all if show_links else links_all[:0]
    link_names = [f"{cluster.links[int(lk)].src} → {cluster.links[int(lk)].dst}" for lk in links_used]
    filt = parse_row_filter(row_filter)
    if links_used.size and filt:  # a filter keeps the link rows its text names ("nic", "gpu3:")
        keep = [i for i, nm in enumerate(link_names) if any(k == "text" and v in nm.lower() for k, v in filt)]
        links_used, link_names = links_used[keep], [link_names[i] for i in keep]
    link_row = np.full(max(tg.n_links, 1), -1, np.int64)
    link_row[links_used] = 2 * shown.size + np.arange(links_used.size)
    labels += link_names
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
    bubble = _bubble(tg, start, end, dev_row, shown, pipeline, t0, t1) if pipeline and pipeline[0] > 1 else None
    return {"labels": labels, "bars": bars, "overlays": over, "makespan_s": makespan, "window": [t0, t1],
            "bubble": bubble,
            "merged": eps >= 0, "tasks_in_view": int(ids.size), "rows": grouping,
            "gpu_rows": int(shown.size), "gpus_in_plan": gpus_in_plan,
            "link_rows": int(links_used.size), "links_hidden": int(links_all.size - links_used.size)}


def _bubble(tg, start: np.ndarray, end: np.ndarray, dev_row: np.ndarray, shown: np.ndarray,
            pipeline: tuple[int, int, int], t0: float, t1: float) -> dict[str, Any]:
    """The pipeline bubble on each shown GPU row: the gaps in its forward/backward work between
    the iteration's start and the last backward task of any GPU (the gaps of at least 0.5% of
    that span drawn), the measured idle share (mean over every GPU of the plan, mirrored ones
    counted), and the schedule's
    formula: with p stages, m microbatches and v model chunks per GPU the bubble takes
    (p-1)/(v*m + p-1) of the time (Narayanan et al., SC'21, section 2.2: bubble time / ideal
    time = (p-1)/m, divided by v under the interleaved schedule)."""
    p, m, v = (int(x) for x in pipeline)
    formula = (p - 1) / (v * m + p - 1)
    comp = np.flatnonzero((tg.kind == FWD) | (tg.kind == BWD))
    span = float(end[comp].max()) if comp.size else 0.0
    out = {"formula": formula, "stages": p, "microbatches": m, "virtual": v, "span_s": span, "measured": 0.0,
           "start": np.zeros(0), "end": np.zeros(0), "row": np.zeros(0, np.int64)}
    if span <= 0:
        return out
    dev = tg.device[comp]
    by_dev = np.argsort(dev, kind="stable")  # [task] grouped by device, then each group by start:
    cut = np.flatnonzero(np.diff(dev[by_dev])) + 1  # (per-group sorts: cheaper than one lexsort)
    groups = np.split(by_dev, cut)
    t = np.concatenate([comp[g][np.argsort(start[comp[g]], kind="stable")] for g in groups])
    d = tg.device[t]
    devs = np.array([tg.device[comp[g[0]]] for g in groups], np.int64)
    rank = np.repeat(np.arange(devs.size), [g.size for g in groups])
    # each device's covered time so far: a running max of ends that never crosses devices
    # (offset by the device's rank times more than the span, so earlier devices stay below)
    off = rank * (2.0 * span + 1.0)
    covered = np.maximum.accumulate(end[t] + off) - off
    first = np.r_[True, d[1:] != d[:-1]]
    last = np.r_[d[1:] != d[:-1], True]
    prev_end = np.where(first, 0.0, np.r_[0.0, covered[:-1]])  # [task] idle from here ...
    gap = start[t] - prev_end  # ... to its start: from 0 to a device's first task, between runs
    tail_s = covered[last]  # [device] idle from its last task to the span's end
    idle = np.bincount(rank, weights=np.where(gap > 0, gap, 0.0), minlength=devs.size) + \
        np.maximum(span - tail_s, 0.0)
    image = tg.info.get("device_image")
    alike = np.bincount(image[image >= 0], minlength=tg.n_devices) if image is not None else None
    weights = alike[devs].astype(np.float64) if alike is not None else np.ones(devs.size)  # GPUs each stands for
    out["measured"] = float(np.average(idle / span, weights=weights))
    big = (gap > 0.005 * span) & (dev_row[d] >= 0)
    tail = (span - tail_s > 0.005 * span) & (dev_row[devs] >= 0)
    gs = np.concatenate([prev_end[big], tail_s[tail]])
    ge = np.concatenate([start[t][big], np.full(int(tail.sum()), span)])
    gr = np.concatenate([dev_row[d][big], dev_row[devs][tail]]).astype(np.int64)
    vis = (ge >= t0) & (gs <= t1)
    out.update(start=gs[vis], end=ge[vis], row=gr[vis])
    return out


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
                op_text[ops[-1]] = " · ".join(n[strip:] if n.startswith(r[0] + ".") else n for n in ops)
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
    return f"{name} · {ops} · {top}{more} · {len(devs):,} GPU{'s' if len(devs) > 1 else ''}{stage}"


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


def memory_data(report: MemoryReport, devices: list[int], stage_of_device: np.ndarray | None = None,
                max_groups: int = 64) -> dict[str, Any]:
    """Per group of GPUs whose memory is identical (bytes): weights, gradients, optimizer state,
    buffers, peak activations and capacity; one bar per group, labelled with its pipeline stage
    (``stage_of_device``, :func:`stage_of_devices`), its first GPU and how many it stands for
    (1,024 data-parallel GPUs are one bar; a pipeline's stages one each). At most ``max_groups``
    bars, the fullest kept (``hidden`` counts the groups left out)."""
    d = np.asarray(devices, np.int64)
    parts = {"weights": report.weights_bytes[d], "gradients": report.grads_bytes[d],
             "optimizer": report.optimizer_bytes[d], "comm buffers": report.comm_buffer_bytes[d],
             "activations (peak)": report.activations_peak_bytes[d]}
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


def why_text(summary: dict, dp: dict | None, timeline: Timeline, memory: MemoryReport | None = None) -> str:
    """Why the current strategy is as fast as it is, from its numbers (and data parallel's):
    what its critical chain is made of, its speedup, and advice that follows from what
    dominates: gradient synchronisation (per-iteration collectives), collectives inside the
    layers (tensor / sequence parallelism, ZeRO-3 gathers: per microbatch), transfers between
    ops, idle GPUs; and, when it does not fit, what lowers the peak (``memory``)."""
    tg = timeline.tasks
    crit = timeline.critical_tasks
    dur = tg.dur_s[crit]
    kind, mb = tg.kind[crit], tg.mb[crit]
    total = float(dur.sum()) or 1.0
    comp = float(dur[(kind == FWD) | (kind == BWD)].sum()) / total
    share = {"gradient synchronisation": float(dur[(kind == COLL) & (mb < 0)].sum()) / total,
             "collectives inside the layers": float(dur[(kind == COLL) & (mb >= 0)].sum()) / total,
             "transfers between ops": float(dur[kind == XFER].sum()) / total}
    comm = sum(share.values())
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
        top = max(share, key=lambda k: share[k])
        advice = {
            "gradient synchronisation": "split the large-parameter ops along their parameter dims (tensor "
                                        "parallelism: fewer replicas to synchronise), shard with ZeRO, or give "
                                        "each GPU more of the batch so the sync hides behind the backward pass.",
            "collectives inside the layers": "a lower tensor-parallel degree, tensor parallelism kept inside a "
                                             "node (NVLink), or ZeRO 1/2 instead of 3 (no weight gathers) cut "
                                             "them.",
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
