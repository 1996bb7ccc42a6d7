"""The timeline's data: one bar per task (or per merged run of tasks) on a row per GPU, per
pipeline stage or per node, link rows, the row filter, and the pipeline's idle time told
apart into the schedule's bubble and the stages' imbalance.

:func:`app.gantt_figure.build_gantt_figure` draws what :func:`gantt_data` returns.
"""

from __future__ import annotations

import math

import re
from typing import Any

import numpy as np

from engine.cluster import Cluster
from engine.graph import OpGraph
from engine.sim.full import Timeline
from engine.strategy import Strategy
from engine.strategy.runs import device_runs
from engine.sim.idle import device_gaps
from engine.sim.lanes import Lanes, lanes
from engine.taskgraph import BWD, COLL, COLL_INDEX, COLL_NAMES, FWD, UPDATE, XFER

from .fmt import format_bytes, format_seconds

__all__ = ["gantt_data", "merge_bars", "gap_before", "PHASE_NAMES", "A2A_LABEL", "a2a_roles",
           "stage_of_devices", "parse_row_filter", "ROW_GROUPS", "MAX_BARS", "AUTO_LINK_ROWS",
           "MAX_GPU_ROWS", "by_row_then_start"]

MAX_BARS = int(__import__("os").environ.get("SOAPBOX_MAX_BARS", 3000))
PHASE_NAMES = {FWD: "forward", BWD: "backward", UPDATE: "optimizer", XFER: "transfer", COLL: "collective"}
#: the bars of a mixture-of-experts layer's all-to-alls (token dispatch and combine), told apart
#: from the other collectives on the collectives row
A2A_LABEL = "all-to-all (MoE dispatch/combine)"
_A2A = COLL_INDEX["all_to_all"]


# --------------------------------------------------------------------------- Gantt


def gap_before(row: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """[task] (sorted by row, then start) the gap from the previous task on its row to its
    start (inf for the first task of a row)."""
    g = np.full(start.size, np.inf)
    if start.size > 1:
        g[1:] = np.where(row[1:] != row[:-1], np.inf, start[1:] - end[:-1])
    return g


def by_row_then_start(row: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The order that sorts tasks by row, then start, then their given order
    (``np.lexsort((start, row))``). A critical chain comes in time order, so a stable sort of
    the rows alone gives it, in a fraction of the time (radix on 16-bit rows: 1.3 against 5.7 ms
    for 212,000 tasks); any other order is lexsorted."""
    if start.size < 2 or not (start[1:] >= start[:-1]).all():
        return np.lexsort((start, row))
    small = row.size and 0 <= row.min() and row.max() < (1 << 15)
    return np.argsort(row.astype(np.int16) if small else row, kind="stable")


def merge_bars(row: np.ndarray, start: np.ndarray, end: np.ndarray, eps: float,
               gap: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Bars of tasks (sorted by row, then start) merged where the gap to the previous task on
    the row (``gap``: :func:`gap_before`) is at most ``eps`` (negative: none merged): (first
    index of each bar, start, end, tasks per bar)."""
    if start.size == 0:
        z = np.zeros(0)
        return np.zeros(0, np.int64), z, z, np.zeros(0, np.int64)
    if eps < 0:
        idx = np.arange(start.size)
        return idx, start.copy(), end.copy(), np.ones(start.size, np.int64)
    idx = np.flatnonzero((gap if gap is not None else gap_before(row, start, end)) > eps)
    return idx, np.minimum.reduceat(start, idx), np.maximum.reduceat(end, idx), np.diff(np.append(idx, start.size))


#: the bubble's gaps drawn: those longer than this share of the span
BUBBLE_MIN_GAP = 0.005

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
              stage_of_device: np.ndarray | None, row_filter: str) -> tuple[np.ndarray, list[str], str, int, int]:
    """The GPUs whose rows the timeline draws, in order, each with its label, the grouping
    used, the rows there are before the filter and after it (before :data:`MAX_GPU_ROWS` cuts
    them). ``gpu``: every simulated GPU (a symmetric simulation's mirrored GPUs counted on the row
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
    comp = (tg.kind == FWD) | (tg.kind == BWD)
    busy = np.bincount(tg.device[comp], weights=tg.dur_s[comp], minlength=n)  # compute seconds per simulated GPU
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
        return np.array(reps[:MAX_GPU_ROWS], np.int64), labels[:MAX_GPU_ROWS], rows, int(dev_used.size), len(reps)
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
    return np.array(reps[:MAX_GPU_ROWS], np.int64), labels[:MAX_GPU_ROWS], rows, len(groups), len(reps)


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
    makespan = timeline.makespan_s
    t0, t1 = window if window else (0.0, makespan)
    if not (math.isfinite(t0) and math.isfinite(t1) and t1 >= t0):  # (the page's reader refuses these first)
        raise ValueError(f"the timeline's window must be two finite times in seconds, the start not after the end; "
                         f"got {t0!r}, {t1!r}")
    names = [op.name for op in graph.ops]
    kind = tg.kind
    dev_used = np.flatnonzero(np.bincount(tg.device[(kind == FWD) | (kind == BWD)], minlength=tg.n_devices))
    shown, gpu_labels, grouping, candidates, kept = _row_plan(timeline, cluster, dev_used, rows, stage_of_device,
                                                              row_filter)
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
    links_filtered = 0
    if filt:  # a filter keeps the link rows its text names ("nic", "gpu3:"), hidden ones too
        if any(k == "text" for k, _ in filt):
            links_used = links_all
            link_names = [f"{cluster.links[int(lk)].src} → {cluster.links[int(lk)].dst}" for lk in links_used]
        keep = [i for i, nm in enumerate(link_names) if any(k == "text" and v in nm.lower() for k, v in filt)]
        links_filtered = links_used.size - len(keep)
        links_used, link_names = links_used[keep], [link_names[i] for i in keep]
    link_row = np.full(max(tg.n_links, 1), -1, np.int64)
    link_row[links_used] = 2 * shown.size + np.arange(links_used.size)
    labels += link_names
    lay = lanes(timeline, dev_row, link_row, t0, t1)
    in_view = lay.in_view
    per_kind = _pairs_by_kind(timeline, lay)
    eps = _merge_width(per_kind, in_view, max_bars, t0, t1)
    bars = _merged_bars(timeline, names, per_kind, eps)
    bubble = _bubble(timeline, dev_row, pipeline, t0, t1) if pipeline and pipeline[0] > 1 else None
    # (last: the critical chain may still be computed in the background, app.simulation.paths_in_background)
    over = _overlays(graph, timeline, names, lay, selected, eps, max_bars, t0, t1)
    return {"labels": labels, "bars": bars, "overlays": over, "makespan_s": makespan, "window": [t0, t1],
            "bubble": bubble,
            "merged": eps >= 0, "tasks_in_view": in_view, "rows": grouping,
            "gpu_rows": int(shown.size), "gpus_in_plan": gpus_in_plan,
            # rows the filter hid and rows past MAX_GPU_ROWS; GPUs a simulated one mirrors (symmetry)
            "rows_filtered": candidates - kept, "rows_cut": kept - int(shown.size),
            "gpus_mirrored": gpus_in_plan - int(dev_used.size),
            "link_rows": int(links_used.size), "links_filtered": int(links_filtered),
            "links_hidden": int(links_all.size - links_used.size - links_filtered)}


def _pairs_by_kind(timeline: Timeline, lay: Lanes) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per kind (:data:`PHASE_NAMES`, the all-to-alls apart as :data:`A2A_LABEL`) its drawn
    (task, row) pairs ordered by row, then start, with each pair's :func:`gap_before`."""
    tg = timeline.tasks
    start, end = timeline.start_s, timeline.end_s
    per_kind = {}  # kind -> its (task, row) pairs ordered by row, then start (sorted once)
    ct, cr = lay.coll
    a2a = tg.coll[ct] == _A2A
    for k, label in list(PHASE_NAMES.items()) + [(COLL, A2A_LABEL)]:
        if k == COLL:  # (a part of pairs ordered by row, then start, is so ordered)
            sel = a2a if label == A2A_LABEL else ~a2a
            t, r = ct[sel], cr[sel]
            if t.size:
                per_kind[label] = (t, r, gap_before(r, start[t], end[t]))
        elif k in lay.by_kind:
            per_kind[label] = lay.by_kind[k]
    return per_kind


def _merge_width(per_kind: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], in_view: int, max_bars: int,
                 t0: float, t1: float) -> float:
    """The merge's gap ``eps`` (negative: none merged, when the ``in_view`` (task, row) pairs are
    at most ``max_bars``): from 1/1500 of the window ``t0``..``t1``, doubled until the bars
    number at most ``max_bars`` (or it passes the window's width)."""
    eps = -1.0
    if in_view > max_bars:
        eps = (t1 - t0) / 1500
    while eps >= 0:  # (the merge's bar count at each width, without merging)
        total = sum(int(np.count_nonzero(g > eps)) for _, _, g in per_kind.values())
        if total <= max_bars or eps > (t1 - t0):
            break  # (past the window's width every row and kind is one bar already)
        eps *= 2
    return eps


def _merged_bars(timeline: Timeline, names: list[str], per_kind: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                 eps: float) -> dict[str, dict[str, Any]]:
    """Per kind its bars (:func:`merge_bars` at gap ``eps``) with their hover texts."""
    tg = timeline.tasks
    start, end = timeline.start_s, timeline.end_s
    bars: dict[str, dict[str, Any]] = {}
    for label, (t, r, g) in per_kind.items():
        first, b_start, b_end, count = merge_bars(r, start[t], end[t], eps, g)
        bars[label] = {"task": t[first], "start": b_start, "end": b_end, "row": r[first], "count": count}
    for label, b in bars.items():
        b["text"] = _task_texts(tg, names, b["task"], b["count"], b["start"], b["end"])
        if label == A2A_LABEL:  # (which of the four: dispatch or combine, forward or backward)
            roles = a2a_roles(tg, start, b["task"])
            b["text"] = [t if c > 1 else t.replace(" all_to_all ", f" all_to_all {r} ", 1)
                         for t, r, c in zip(b["text"], roles, np.asarray(b["count"]).tolist())]
    return bars


def _overlays(graph: OpGraph, timeline: Timeline, names: list[str], lay: Lanes,
              selected: list[str] | None, eps: float, max_bars: int,
              t0: float, t1: float) -> dict[str, dict[str, Any]]:
    """The overlays: the critical chain's tasks (a collective's on its first device's row) and
    the selected ops' compute tasks, those in the window, merged as the bars are (gap ``eps``)
    when they are many."""
    tg = timeline.tasks
    start, end = timeline.start_s, timeline.end_s
    overlays = {}
    crit = timeline.critical_tasks
    row = lay.row
    if lay.coll_first.size:  # (a collective's on its first device's row)
        tasks = tg.info["coll_devices"][2]
        shown = (lay.coll_first >= 0) & (row[tasks] < 0)
        row = row.copy()
        row[tasks[shown]] = lay.coll_first[shown]
    crit = crit[(row[crit] >= 0) & (end[crit] > start[crit])]
    overlays["critical path"] = crit
    if selected:
        want = np.array([graph.index[n] for n in selected if n in graph.index], np.int64)
        comp = (tg.kind == FWD) | (tg.kind == BWD) | ((tg.kind == UPDATE) & (tg.dur_s > 0))
        sel = np.flatnonzero(np.isin(tg.op, want) & (row >= 0) & comp)
        overlays["selected"] = sel[:2 * max_bars]
    over = {}
    for name, t in overlays.items():
        t = t[(end[t] >= t0) & (start[t] <= t1)]  # (only what the window shows)
        if eps >= 0 and t.size > max_bars // 4:
            # merged as the bars are (an LLM plan's critical chain runs to 10^5 tasks: drawn one
            # by one it made a 22 MB figure the browser took minutes to draw)
            t = t[by_row_then_start(row[t], start[t])]
            first, b_start, b_end, count = merge_bars(row[t], start[t], end[t], eps)
            over[name] = {"start": b_start, "end": b_end, "row": row[t][first],
                          "text": _task_texts(tg, names, t[first], count, b_start, b_end)}
        else:
            over[name] = {"start": start[t], "end": end[t], "row": row[t],
                          "text": _task_texts(tg, names, t, np.ones(t.size, np.int64), start[t], end[t])}
    return over


def _bubble(timeline: Timeline, dev_row: np.ndarray, pipeline: tuple[int, int, int], t0: float,
            t1: float) -> dict[str, Any]:
    """The pipeline bubble on each shown GPU row: the gaps in its forward/backward work between
    the iteration's start and the last backward task of any GPU (the gaps of at least 0.5% of
    that span drawn), the measured idle share (mean over every GPU of the plan, mirrored ones
    counted), and the schedule's
    formula: with p stages, m microbatches and v model chunks per GPU the bubble takes
    (p-1)/(v*m + p-1) of the time (Narayanan et al., SC'21, section 2.2: bubble time / ideal
    time = (p-1)/m, divided by v under the interleaved schedule)."""
    p, m, v = (int(x) for x in pipeline)
    formula = (p - 1) / (v * m + p - 1)
    g = device_gaps(timeline, BUBBLE_MIN_GAP)  # (one pass over the dispatch order: engine/sim/idle.py)
    span = g.span_s
    out = {"formula": formula, "stages": p, "microbatches": m, "virtual": v, "span_s": span, "measured": 0.0,
           "beyond": 0.0, "busy_spread": 0.0,
           "start": np.zeros(0), "end": np.zeros(0), "row": np.zeros(0, np.int64)}
    if span <= 0:
        return out
    tg = timeline.tasks
    image = tg.info.get("device_image")
    alike = np.bincount(image[image >= 0], minlength=tg.n_devices) if image is not None else None
    weights = alike[g.devices].astype(np.float64) if alike is not None else np.ones(g.devices.size)  # GPUs each stands for
    out["measured"] = float(np.average(g.idle_s / span, weights=weights))
    # what idles beyond the schedule's bubble: stages that compute unequal amounts (measured as
    # the spread of the GPUs' busy compute time) and waits for transfers
    out["beyond"] = max(out["measured"] - formula, 0.0)
    busy = g.busy_s
    out["busy_spread"] = float(busy.max() / busy.min() - 1.0) if busy.size and busy.min() > 0 else 0.0
    big = dev_row[g.gap_device] >= 0  # (the long gaps, on the rows shown)
    tail = (span - g.last_end_s > BUBBLE_MIN_GAP * span) & (dev_row[g.devices] >= 0)
    gs = np.concatenate([g.gap_from_s[big], g.last_end_s[tail]])
    ge = np.concatenate([g.gap_to_s[big], np.full(int(tail.sum()), span)])
    gr = np.concatenate([dev_row[g.gap_device][big], dev_row[g.devices][tail]]).astype(np.int64)
    vis = (ge >= t0) & (gs <= t1)
    out.update(start=gs[vis], end=ge[vis], row=gr[vis])
    return out


def a2a_roles(tg, start: np.ndarray, tasks: np.ndarray) -> list[str]:
    """For each all-to-all task in ``tasks``, which of its MoE layer's four it is: the forward
    ``dispatch`` (tokens to their experts' ranks: the experts op's forward tasks follow it),
    ``combine`` (the outputs back), and in the backward ``dispatch (backward)`` (the combine's
    gradient, before the experts' backward tasks) and ``combine (backward)`` (after them). Read
    from the task graph's successor edges; a combine belongs to the backward when it starts at
    or after the op's first backward task of its microbatch."""
    tasks = np.asarray(tasks, np.int64)
    if tasks.size == 0:
        return []
    ops = np.unique(tg.op[tasks])
    first_b: dict[tuple[int, int], float] = {}
    bwd = np.flatnonzero(np.isin(tg.op, ops) & (tg.kind == BWD))
    for o, m, s in zip(tg.op[bwd].tolist(), tg.mb[bwd].tolist(), start[bwd].tolist()):
        if s < first_b.get((o, m), np.inf):
            first_b[(o, m)] = s
    out = []
    ptr, idx = tg.succ_ptr, tg.succ_idx
    for t in tasks.tolist():
        op = tg.op[t]
        succ = idx[ptr[t]:ptr[t + 1]]
        mine = succ[tg.op[succ] == op]
        if np.any(tg.kind[mine] == FWD):
            out.append("dispatch")
        elif np.any(tg.kind[mine] == BWD):
            out.append("dispatch (backward)")
        else:
            late = start[t] >= first_b.get((int(op), int(tg.mb[t])), np.inf)
            out.append("combine (backward)" if late else "combine")
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
    secs: dict[float, str] = {}  # (a pipeline's repeated tasks: the same few durations and sizes, formatted once)
    sizes: dict[float, str] = {}

    def sec(x: float) -> str:
        got = secs.get(x)
        if got is None:
            got = secs[x] = format_seconds(x)
        return got

    def nbytes(x: float) -> str:
        got = sizes.get(x)
        if got is None:
            got = sizes[x] = format_bytes(x)
        return got

    out = []
    for i, (c, s, e) in enumerate(zip(np.asarray(counts).tolist(), np.asarray(starts, np.float64).tolist(),
                                      np.asarray(ends, np.float64).tolist())):
        k = kind[i]
        if c > 1:
            out.append(f"{c} {PHASE_NAMES[k]} tasks · {format_seconds(s)} – {format_seconds(e)} (zoom in for each)")
            continue
        name = names[op[i]] if op[i] >= 0 else ""
        dur = sec(e - s)
        if k == FWD or k == BWD:
            out.append(f"{name} {PHASE_NAMES[k]} · part {part[i]} · microbatch {mb[i]} · {dur}")
        elif k == XFER:
            out.append(f"{name} transfer · {nbytes(size[i])} · microbatch {mb[i]} · {dur}")
        elif k == COLL:
            out.append(f"{name} {COLL_NAMES[coll[i]]} · {nbytes(size[i])} · {dur}")
        else:
            out.append(f"optimizer step · {dur}")
    return out


