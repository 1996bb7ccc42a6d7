"""Would numbering tasks in dispatch order pay for one prediction? (issue 28, "tasks numbered in
dispatch order")

The event loop (:func:`engine.sim.full.dispatch`) touches a dozen arrays per task at the task's
id; on GPT-3 175B's 1 M-task graph its ready heap holds 18 tasks on average, so the loop is
bound by memory access, not by the heap. Numbering tasks in the order they will run puts what
the loop touches next to each other. Ties between equal ready times are broken by task id, so a
renumbering changes schedules unless the heap breaks ties by the *original* id: the variant here
carries that id in the heap (a third heap array), and its results, mapped back, are checked to
equal the loop's bit for bit.

For each order the script reports, median of ``--repeat`` runs in one process, interleaved with
the loop as it is (:func:`engine.sim.full.run_schedule`'s compiled ``_run``):
- ``prep``: the permutation and the permuted arrays (CSR rows reordered, successors renamed);
- ``loop``: the renumbered loop; ``back``: its results mapped back to the original ids.

Orders: ``dispatch`` (the order a previous run dispatched in: the best case, known only after a
simulation), ``microbatch`` (a stable counting sort by the task's microbatch: known before).

A second variant keeps ids and packs each task's hot fields into one row (array of structs):
``aos`` (the loop on two [task, k] arrays) with ``pack`` (building them).

Usage: python benchmarks/bench_locality.py [--repeat 3] [--case gpt3|gpt3-sp|nmt]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numba as nb
import numpy as np

from engine.sim.full import HEAP_ARITY, _run, loop_state


@nb.njit(cache=True, inline="always")
def _before(ka, ia, kb, ib):  # pragma: no cover
    return ka < kb or (ka == kb and ia < ib)


@nb.njit(cache=True)
def _push3(hk, ht, hi, n, key, tie, idx):  # pragma: no cover
    """A heap entry (ready time, the task's original id for ties, its id now)."""
    i = n
    while i > 0:
        p = (i - 1) // HEAP_ARITY
        if _before(hk[p], ht[p], key, tie):
            break
        hk[i] = hk[p]
        ht[i] = ht[p]
        hi[i] = hi[p]
        i = p
    hk[i] = key
    ht[i] = tie
    hi[i] = idx
    return n + 1


@nb.njit(cache=True)
def _pop3(hk, ht, hi, n):  # pragma: no cover
    idx = hi[0]
    n -= 1
    k, x, y = hk[n], ht[n], hi[n]
    i = 0
    while True:
        c = HEAP_ARITY * i + 1
        if c >= n:
            break
        best = c
        for j in range(c + 1, min(c + HEAP_ARITY, n)):
            if _before(hk[j], ht[j], hk[best], ht[best]):
                best = j
        if _before(k, x, hk[best], ht[best]):
            break
        hk[i], ht[i], hi[i] = hk[best], ht[best], hi[best]
        i = best
    hk[i], ht[i], hi[i] = k, x, y
    return idx, n


@nb.njit(cache=True)
def renumbered_loop(dur, res_ptr, res_idx, succ_ptr, succ_idx, npred, chain_next, chain_lag, n_res,
                    tie):  # pragma: no cover
    """FIFO list scheduling as :func:`engine.sim.full.dispatch`, ties broken by ``tie`` (the
    original ids) instead of the ids of this numbering. (The engine's loop, written out again
    with that one change: the measurement below decided against it, so the engine keeps one
    loop and this variant lives only here.)"""
    n = dur.shape[0]
    start, end, ready, left, last, last_task, res_pred, order = loop_state(npred, n_res, n)
    hk = np.empty(n + 1)
    ht = np.empty(n + 1, np.int64)
    hi = np.empty(n + 1, np.int64)
    h = 0
    for t in range(n):
        if left[t] == 0:
            h = _push3(hk, ht, hi, h, ready[t], tie[t], t)
    done = 0
    while h > 0:
        t, h = _pop3(hk, ht, hi, h)
        s = ready[t]
        rp = -1
        for k in range(res_ptr[t], res_ptr[t + 1]):
            q = res_idx[k]
            if last[q] > s:
                s = last[q]
                rp = last_task[q]
        e = s + dur[t]
        start[t] = s
        end[t] = e
        res_pred[t] = rp
        for k in range(res_ptr[t], res_ptr[t + 1]):
            last[res_idx[k]] = e
            last_task[res_idx[k]] = t
        order[done] = t
        done += 1
        c = chain_next[t]
        if c >= 0:
            rc = s + chain_lag[t]
            if rc > ready[c]:
                ready[c] = rc
            left[c] -= 1
            if left[c] <= 0:
                h = _push3(hk, ht, hi, h, ready[c], tie[c], c)
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            v = succ_idx[k]
            if e > ready[v]:
                ready[v] = e
            left[v] -= 1
            if left[v] == 0:
                h = _push3(hk, ht, hi, h, ready[v], tie[v], v)
    return start, end, order[:done], res_pred


@nb.njit(cache=True)
def _permute_csr(ptr, idx, perm, inv):  # pragma: no cover
    """Rows in ``perm``'s order (new row i is old row perm[i]); entries renamed by ``inv`` when
    it is not empty."""
    n = perm.shape[0]
    nptr = np.empty(n + 1, np.int64)
    nptr[0] = 0
    for i in range(n):
        nptr[i + 1] = nptr[i] + ptr[perm[i] + 1] - ptr[perm[i]]
    nidx = np.empty(idx.shape[0], np.int64)
    for i in range(n):
        b = nptr[i]
        for k in range(ptr[perm[i]], ptr[perm[i] + 1]):
            nidx[b] = inv[idx[k]] if inv.shape[0] > 0 else idx[k]
            b += 1
    return nptr, nidx


@nb.njit(cache=True)
def _by_key(key):  # pragma: no cover
    """Stable counting sort of the tasks by ``key`` (negative keys last)."""
    n = key.shape[0]
    nk = 0
    for t in range(n):
        nk = max(nk, key[t] + 1)
    cnt = np.zeros(nk + 2, np.int64)
    for t in range(n):
        cnt[(key[t] if key[t] >= 0 else nk) + 1] += 1
    for j in range(nk + 1):
        cnt[j + 1] += cnt[j]
    perm = np.empty(n, np.int64)
    for t in range(n):
        j = key[t] if key[t] >= 0 else nk
        perm[cnt[j]] = t
        cnt[j] += 1
    return perm


@nb.njit(cache=True)
def aos_loop(fl, it, res_idx, succ_idx, chain_lag, n_res):  # pragma: no cover
    """The loop with each task's fields in one row: ``fl[t]`` = (ready, dur, start, end),
    ``it[t]`` = (first resource, end, first successor, end, next hop, predecessors left,
    resource predecessor, -)."""
    n = fl.shape[0]
    last = np.zeros(n_res)
    last_task = np.full(n_res, -1, np.int64)
    order = np.empty(n, np.int64)
    hk = np.empty(n + 1)
    ht = np.empty(n + 1, np.int64)
    hi = np.empty(n + 1, np.int64)
    h = 0
    for t in range(n):
        if it[t, 5] == 0:
            h = _push3(hk, ht, hi, h, fl[t, 0], t, t)
    done = 0
    while h > 0:
        t, h = _pop3(hk, ht, hi, h)
        s = fl[t, 0]
        rp = -1
        for k in range(it[t, 0], it[t, 1]):
            q = res_idx[k]
            if last[q] > s:
                s = last[q]
                rp = last_task[q]
        e = s + fl[t, 1]
        fl[t, 2] = s
        fl[t, 3] = e
        it[t, 6] = rp
        for k in range(it[t, 0], it[t, 1]):
            last[res_idx[k]] = e
            last_task[res_idx[k]] = t
        order[done] = t
        done += 1
        c = it[t, 4]
        if c >= 0:
            rc = s + chain_lag[t]
            if rc > fl[c, 0]:
                fl[c, 0] = rc
            it[c, 5] -= 1
            if it[c, 5] <= 0:
                h = _push3(hk, ht, hi, h, fl[c, 0], c, c)
        for k in range(it[t, 2], it[t, 3]):
            v = succ_idx[k]
            if e > fl[v, 0]:
                fl[v, 0] = e
            it[v, 5] -= 1
            if it[v, 5] == 0:
                h = _push3(hk, ht, hi, h, fl[v, 0], v, v)
    return order[:done]


def _graph(case: str):
    from engine.cluster import preset
    from engine.formats import resolve_model
    from engine.layout import Layout, resolved
    from engine.models import build_sample
    from engine.layout.build import build_layout
    from engine.search.baselines import data_parallel
    from engine.taskgraph import build_task_graph

    if case == "nmt":
        g, c = resolve_model("nmt"), preset("k80-16x4")
        return build_task_graph(g, data_parallel(g, c), c)
    opts = {"tp": 8, "pp": 16, "micro_batch": 1, "recompute": "full", "sequence_parallel": case == "gpt3-sp"}
    g, c = build_sample("gpt3-175b"), preset("dgx-a100-80gb:128")
    return build_task_graph(g, build_layout(g, c, resolved(Layout.from_options(opts), g, c)), c)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--case", choices=["gpt3", "gpt3-sp", "nmt"], default="gpt3")
    args = ap.parse_args()
    tg = _graph(args.case)
    npred = tg.npred + np.bincount(tg.chain_next[tg.chain_next >= 0], minlength=tg.num_tasks)
    n_res = tg.n_devices + tg.n_links
    base_args = (tg.res_ptr, tg.res_idx, tg.succ_ptr, tg.succ_idx, npred, tg.chain_next, tg.chain_lag_s, n_res,
                 np.zeros(0))
    ref = _run(tg.dur_s, *base_args)
    dispatch_pos = np.empty_like(ref[2])
    dispatch_pos[ref[2]] = np.arange(ref[2].size)
    keys = {"dispatch": dispatch_pos, "microbatch": tg.mb.astype(np.int64)}
    print(f"# {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}; {args.case}: {tg.num_tasks:,} tasks, {tg.succ_idx.size:,} edges; "
          f"median of {args.repeat} (the first run of each compiled function not counted)")
    times: dict[str, list[float]] = {}

    def clock(name, fn):
        t = time.perf_counter()
        out = fn()
        times.setdefault(name, []).append(time.perf_counter() - t)
        return out

    for r in range(args.repeat + 1):
        if r == 1:
            times.clear()
        clock("loop as it is", lambda: _run(tg.dur_s, *base_args))
        for name, key in keys.items():
            def prep(key=key):
                perm = _by_key(key)
                inv = np.empty_like(perm)
                inv[perm] = np.arange(perm.size)
                rp, ri = _permute_csr(tg.res_ptr, tg.res_idx, perm, np.zeros(0, np.int64))
                sp, si = _permute_csr(tg.succ_ptr, tg.succ_idx, perm, inv)
                cn = tg.chain_next[perm]
                cn = np.where(cn >= 0, inv[np.maximum(cn, 0)], -1)
                return perm, (tg.dur_s[perm], rp, ri, sp, si, npred[perm], cn, tg.chain_lag_s[perm], n_res, perm)

            perm, pargs = clock(f"{name}: prep", prep)
            out = clock(f"{name}: loop", lambda: renumbered_loop(*pargs))

            def back(out=out, perm=perm):
                start, end = np.empty_like(out[0]), np.empty_like(out[1])
                start[perm], end[perm] = out[0], out[1]
                rp = np.where(out[3] >= 0, perm[np.maximum(out[3], 0)], -1)
                res_pred = np.empty_like(rp)
                res_pred[perm] = rp
                return start, end, perm[out[2]], res_pred

            got = clock(f"{name}: back", back)
            assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(got, ref[:4])), name

        def pack():
            fl = np.zeros((tg.num_tasks, 4))
            fl[:, 1] = tg.dur_s
            it = np.empty((tg.num_tasks, 8), np.int64)
            it[:, 0], it[:, 1] = tg.res_ptr[:-1], tg.res_ptr[1:]
            it[:, 2], it[:, 3] = tg.succ_ptr[:-1], tg.succ_ptr[1:]
            it[:, 4], it[:, 5], it[:, 6], it[:, 7] = tg.chain_next, npred, -1, 0
            return fl, it

        fl, it = clock("aos: pack", pack)
        order = clock("aos: loop", lambda: aos_loop(fl, it, tg.res_idx, tg.succ_idx, tg.chain_lag_s, n_res))
        assert np.array_equal(order, ref[2]) and np.array_equal(fl[:, 3], ref[1], equal_nan=True)
    base = statistics.median(times["loop as it is"])
    print("| variant | median s | min-max s | / loop as it is |")
    print("|---|---:|---:|---:|")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| {name} | {m:.3f} | {min(ts):.3f}-{max(ts):.3f} | {m / base:.2f} |")
    for name in keys:
        total = sum(statistics.median(times[f"{name}: {p}"]) for p in ("prep", "loop", "back"))
        print(f"{name} order, prep + loop + back: {total:.3f} s against {base:.3f} s ({total / base:.2f}x)")
    total = sum(statistics.median(times[f"aos: {p}"]) for p in ("pack", "loop"))
    print(f"aos, pack + loop: {total:.3f} s against {base:.3f} s ({total / base:.2f}x)")


if __name__ == "__main__":
    main()
