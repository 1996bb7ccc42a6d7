"""Chrome Trace Event export of a simulated iteration (opens in Perfetto and chrome://tracing).

Layout (Trace Event Format, "JSON Object Format"): one process per GPU (``pid`` = device id)
with a compute thread and a collectives thread, one process ``links`` with a thread per link
that carried traffic, flow events from each transfer's producer task to its consumer task,
and a memory counter per GPU. Times are microseconds, as the format requires.

A run simulated under symmetry (one representative per set of identical replicas) draws each
representative's compute and optimizer step on every device it stands for (``args.
mirrors_device`` names the representative), and every device's memory; its transfers and
the collectives of mirrored groups are drawn once, on the representative's links and ranks
(the iteration's byte count, ``comm_bytes``, includes every replica's).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

import numpy as np

from ..cluster import Cluster
from ..formats import atomic_writer
from ..graph import OpGraph
from .memory import MemoryReport
from .full import Timeline
from ..taskgraph import BWD, COLL_NAMES, FWD, UPDATE, XFER

__all__ = ["trace_events", "write_chrome_trace"]

LINKS_PID = 1_000_000
COMPUTE_TID, COLLECTIVE_TID = 0, 1
#: Counter points per device in the memory track (the curve is thinned beyond this).
MAX_COUNTER_POINTS = 4000


def _us(seconds: np.ndarray | float) -> Any:
    return np.round(np.asarray(seconds) * 1e6, 3)


def _mirrors(image: np.ndarray | None, n_devices: int) -> dict[int, tuple[int, ...]]:
    """Representative device -> every device that runs its tasks (itself first); empty
    without symmetry (every device holds its own tasks)."""
    if image is None:
        return {}
    out: dict[int, list[int]] = {}
    for d in range(n_devices):
        r = int(image[d])
        if r >= 0 and r != d:
            out.setdefault(r, [r]).append(d)
    return {r: tuple(ds) for r, ds in out.items()}


def trace_events(graph: OpGraph, cluster: Cluster, timeline: Timeline,
                 memory: MemoryReport | None = None) -> Iterator[dict[str, Any]]:
    """Yield trace events one at a time (a large iteration never sits in memory as dicts)."""
    tg = timeline.tasks
    start, end = timeline.start_s, timeline.end_s
    names = [op.name for op in graph.ops]
    for d in cluster.devices:
        yield {"ph": "M", "name": "process_name", "pid": d.id, "args": {"name": f"{d.name} ({d.type})"}}
        yield {"ph": "M", "name": "process_sort_index", "pid": d.id, "args": {"sort_index": d.id}}
        yield {"ph": "M", "name": "thread_name", "pid": d.id, "tid": COMPUTE_TID, "args": {"name": "compute"}}
        yield {"ph": "M", "name": "thread_name", "pid": d.id, "tid": COLLECTIVE_TID, "args": {"name": "collectives"}}
    yield {"ph": "M", "name": "process_name", "pid": LINKS_PID, "args": {"name": "links"}}
    used = np.unique(tg.link[tg.kind == XFER])
    for lk in used:
        link = cluster.links[int(lk)]
        yield {"ph": "M", "name": "thread_name", "pid": LINKS_PID, "tid": int(lk),
               "args": {"name": f"{link.src} -> {link.dst} ({link.bw_bytes_per_s / 1e9:g} GB/s)"}}
    ts, dur = _us(start), _us(end - start)
    phase = {FWD: "fwd", BWD: "bwd"}
    copies = _mirrors(tg.info.get("device_image"), cluster.num_devices)
    for t in np.nonzero((tg.kind == FWD) | (tg.kind == BWD))[0]:
        k = int(tg.kind[t])
        dev = int(tg.device[t])
        args = {"op": names[tg.op[t]], "partition": int(tg.part[t]), "microbatch": int(tg.mb[t]),
                "flops": float(tg.flops[t])}
        for d in copies.get(dev, (dev,)):  # a representative's task runs on each device it stands for
            yield {"ph": "X", "name": f"{names[tg.op[t]]} {phase[k]}", "cat": phase[k], "pid": d,
                   "tid": COMPUTE_TID, "ts": float(ts[t]), "dur": float(dur[t]),
                   "args": args if d == dev else {**args, "mirrors_device": dev}}
    for t in np.nonzero((tg.kind == UPDATE) & (tg.dur_s > 0))[0]:  # devices with parameters to update
        dev = int(tg.device[t])
        for d in copies.get(dev, (dev,)):
            yield {"ph": "X", "name": "optimizer step", "cat": "update", "pid": d, "tid": COMPUTE_TID,
                   "ts": float(ts[t]), "dur": float(dur[t])}
    for t in np.nonzero(tg.kind == XFER)[0]:
        op = names[tg.op[t]] if tg.op[t] >= 0 else "?"
        yield {"ph": "X", "name": f"{op} transfer", "cat": "transfer", "pid": LINKS_PID, "tid": int(tg.link[t]),
               "ts": float(ts[t]), "dur": float(dur[t]),
               "args": {"bytes": float(tg.size_bytes[t]), "microbatch": int(tg.mb[t])}}
    coll_devs = tg.info.get("coll_devices")
    if coll_devs is not None:
        ptr, idx, tasks = coll_devs
        for j, t in enumerate(tasks):
            name = f"{names[tg.op[t]] if tg.op[t] >= 0 else ''} {COLL_NAMES[tg.coll[t]]}".strip()
            for d in idx[ptr[j]:ptr[j + 1]]:
                yield {"ph": "X", "name": name, "cat": "collective", "pid": int(d), "tid": COLLECTIVE_TID,
                       "ts": float(ts[t]), "dur": float(dur[t]),
                       "args": {"bytes": float(tg.size_bytes[t]), "ranks": int(ptr[j + 1] - ptr[j])}}
    # flows: producer compute task -> first hop ... last hop -> consumer compute task
    for flow_id, (src_dev, from_s, to_pid, to_tid, to_s) in enumerate(_flows(timeline), 1):
        yield {"ph": "s", "id": flow_id, "name": "transfer", "cat": "flow", "pid": src_dev,
               "tid": COMPUTE_TID, "ts": float(_us(from_s))}
        yield {"ph": "f", "bp": "e", "id": flow_id, "name": "transfer", "cat": "flow", "pid": to_pid, "tid": to_tid,
               "ts": float(_us(to_s))}
    if memory is not None:
        for d, (times, level) in enumerate(memory.curves):
            if times.size > MAX_COUNTER_POINTS:
                keep = np.linspace(0, times.size - 1, MAX_COUNTER_POINTS).astype(np.int64)
                times, level = times[keep], level[keep]
            yield {"ph": "C", "name": "memory", "pid": d, "ts": 0.0,
                   "args": {"GB": round(float(memory.static_bytes[d]) / 1e9, 6)}}
            for t_s, b in zip(_us(times), level):
                yield {"ph": "C", "name": "memory", "pid": d, "ts": float(t_s),
                       "args": {"GB": round(float(b) / 1e9, 6)}}


def _flows(timeline: Timeline) -> Iterator[tuple[int, float, int, int, float]]:
    """Each transfer's flow: (producer's device, when the producer ends, the consumer's pid and
    tid, when the consumer starts; seconds): from the producing compute task to the consuming
    one, or to the last hop's link when the consumer is not a compute task. Read from the task
    graph's edges; a timeline unfolded from a steady short run (:mod:`engine.sim.unfold`),
    whose tasks have none, gives its short run's flows, each moved where the unfolding put its
    first hop."""
    tg = timeline.tasks
    from_short = tg.info.get("unfolded_from")
    if from_short is None:
        for t, p, d, last in _graph_flows(tg):
            yield _flow(timeline, p, d, last, 0.0)
        return
    short, src, moved_s = from_short
    flows = {t: (p, d, last) for t, p, d, last in _graph_flows(short.tasks)}
    firsts = np.fromiter(flows, np.int64, len(flows))
    for f in np.flatnonzero(np.isin(src, firsts)).tolist():
        yield _flow(short, *flows[int(src[f])], float(moved_s[f]))


def _flow(tl: Timeline, p: int, d: int, last: int, moved_s: float) -> tuple[int, float, int, int, float]:
    tg = tl.tasks
    if tg.kind[d] in (FWD, BWD):
        return int(tg.device[p]), tl.end_s[p] + moved_s, int(tg.device[d]), COMPUTE_TID, tl.start_s[d] + moved_s
    return int(tg.device[p]), tl.end_s[p] + moved_s, LINKS_PID, int(tg.link[last]), tl.end_s[last] + moved_s


def _graph_flows(tg) -> Iterator[tuple[int, int, int, int]]:
    """(first hop, producer compute task, consumer task, last hop) of every transfer whose first
    hop follows a forward or backward task and whose last hop has a successor."""
    pred_ptr, pred_idx = tg.pred_lists()
    for t in np.nonzero((tg.kind == XFER) & (tg.npred > 0))[0].tolist():
        p = pred_idx[pred_ptr[t]:pred_ptr[t + 1]]
        if p.size == 0 or tg.kind[p[0]] not in (FWD, BWD):
            continue
        last = t
        while tg.chain_next[last] >= 0:
            last = int(tg.chain_next[last])
        succ = tg.succ_idx[tg.succ_ptr[last]:tg.succ_ptr[last + 1]]
        if succ.size == 0:
            continue
        yield t, int(p[0]), int(succ[0]), last


def write_chrome_trace(path: str | os.PathLike, graph: OpGraph, cluster: Cluster, timeline: Timeline,
                       memory: MemoryReport | None = None) -> int:
    """Write the trace to ``path`` (streamed into a unique temporary file beside it, then
    renamed into place: see :func:`engine.formats.atomic_writer`); returns the number of
    events written. The folder must exist.

    Raises
    ------
    OutputError
        ``cannot write PATH: reason``.
    """
    n = 0
    with atomic_writer(path) as f:
        f.write('{"displayTimeUnit": "ms", "otherData": {"generator": "soapbox"}, "traceEvents": [\n')
        for ev in trace_events(graph, cluster, timeline, memory):
            f.write((",\n" if n else "") + json.dumps(ev, separators=(",", ":"), allow_nan=False))
            n += 1
        f.write("\n]}\n")
    return n
