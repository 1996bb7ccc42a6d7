"""Composing a pipeline from its units (issue 43): the explicit tasks of an iteration (barriers,
point-to-point transfers, gradient synchronisation, the optimizer step) simulated by the event
loop of :mod:`engine.sim.full`, each unit standing in as its max-plus block
(:mod:`engine.sim.units`): a zero-duration join per (unit, exit) that waits for one delay
task per entry, ``coef[entry, exit]`` seconds long."""

from __future__ import annotations

import numpy as np

from ..taskgraph import BARRIER, TaskGraph
from .units import Unit

__all__ = ["Compressed", "compress"]


class Compressed:
    """A task graph's explicit tasks and its units' blocks: ``tg`` (a :class:`TaskGraph`) and
    ``explicit`` (its first ``len(explicit)`` tasks are these reference task ids)."""

    def __init__(self, tg: TaskGraph, explicit: np.ndarray) -> None:
        self.tg, self.explicit = tg, explicit


def compress(tg: TaskGraph, unit: np.ndarray, units: dict[int, Unit]) -> Compressed:
    """The reference ``tg`` with every unit replaced by its block (for the self-check: the
    compressed run must give the explicit tasks the reference's times)."""
    ext = np.nonzero(unit < 0)[0]
    n_ext = ext.size
    N = tg.num_tasks
    bridges = np.unique(np.concatenate([u.exits[u.exits >= N] for u in units.values()] + [np.zeros(0, np.int64)]))
    new_id = np.full(2 * N, -1, np.int64)
    new_id[ext] = np.arange(n_ext)
    new_id[bridges] = n_ext + np.arange(bridges.size)
    src, dst = tg.edge_src, tg.succ_idx
    keep = (unit[src] < 0) & (unit[dst] < 0)
    e_src, e_dst = [new_id[src[keep]]], [new_id[dst[keep]]]
    dur = [tg.dur_s[ext], np.zeros(bridges.size)]
    n = n_ext + bridges.size
    for u in units.values():
        ent_ok = u.entries
        for xi, y in enumerate(u.exits):
            col = u.coef[:, xi]
            ok = np.isfinite(col)
            if not ok.any():
                continue
            k = int(ok.sum())
            j = n + k  # the join
            d = np.arange(n, n + k)
            dur.append(col[ok])
            dur.append(np.zeros(1))
            ents = ent_ok[ok]
            has = ents >= 0
            e_src.append(new_id[ents[has]]); e_dst.append(d[has])
            e_src.append(d); e_dst.append(np.full(k, j))
            e_src.append(np.array([j])); e_dst.append(np.array([new_id[y]]))
            n = j + 1
    return Compressed(_graph(tg, ext, n, np.concatenate(dur), np.concatenate(e_src), np.concatenate(e_dst)), ext)


def _graph(tg: TaskGraph, ext: np.ndarray, n: int, dur: np.ndarray, src: np.ndarray, dst: np.ndarray) -> TaskGraph:
    """A TaskGraph of ``n`` tasks: the first ``ext.size`` are ``tg``'s tasks ``ext`` (kind,
    resources, chains kept), the rest resource-free delays and joins (kind BARRIER)."""
    n_ext = ext.size
    new_id = np.full(tg.num_tasks, -1, np.int64)
    new_id[ext] = np.arange(n_ext)

    def col(a, fill):
        out = np.full(n, fill, a.dtype)
        out[:n_ext] = a[ext]
        return out

    kind = col(tg.kind, BARRIER)
    cnt = np.zeros(n, np.int64)
    cnt[:n_ext] = np.diff(tg.res_ptr)[ext]
    res_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(cnt, out=res_ptr[1:])
    res_idx = np.concatenate([tg.res_idx[tg.res_ptr[t]:tg.res_ptr[t + 1]] for t in ext]) if n_ext else np.zeros(0, np.int64)
    order = np.lexsort((dst, src))
    src, dst = src[order], dst[order]
    succ_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=succ_ptr[1:])
    npred = np.bincount(dst, minlength=n).astype(np.int64)
    chain_next = np.full(n, -1, np.int64)
    cn = tg.chain_next[ext]
    ok = cn >= 0
    chain_next[:n_ext][ok] = new_id[cn[ok]]
    if (chain_next[:n_ext][ok] < 0).any():
        raise ValueError("a transfer chain crosses into a unit")
    lag = col(tg.chain_lag_s, 0.0)
    z = np.zeros(n)
    return TaskGraph(kind=kind, op=col(tg.op, -1), part=col(tg.part, -1), mb=col(tg.mb, -1),
                     device=col(tg.device, -1), dur_s=dur, size_bytes=z, flops=z.copy(), coll=col(tg.coll, -1),
                     link=col(tg.link, -1), res_ptr=res_ptr, res_idx=res_idx.astype(np.int64), succ_ptr=succ_ptr,
                     succ_idx=dst.astype(np.int64), npred=npred, chain_next=chain_next, chain_lag_s=lag,
                     n_devices=tg.n_devices, n_links=tg.n_links)
