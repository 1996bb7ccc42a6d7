"""A unit's block for a stage of K layers, predicted from the layer block of a 3-layer reference
(issue 43: groundwork for a reference with fewer layers than the run; not used by the engine).

Inside a unit (``engine.sim.units``), the tasks are grouped by the layer they run, in the
order the unit runs the layers (a backward unit, its recomputed forwards included, runs them
last first). The cut after layer i is the set of tasks at or before layer i that a later
layer's task waits for (data, a transfer's chain, a resource's previous holder). From the
3-layer reference, with longest paths over those edges:

- In: the unit's entries to the first cut (``engine.sim.units``' own longest paths);
- A: the first cut to the second (the layer block);
- Out: the second cut to the unit's exits (its exits as ``read_units`` finds them).

The unit's block for K layers is then ``In (x) A^(K-2) (x) Out`` in max-plus algebra, if every
path crosses every cut and A is the same between any two cuts. The script checks the first
on the 3-layer reference (``In (x) A (x) Out`` must give its own block) and compares the
prediction with the block read off a reference of K layers a stage.

    PYTHONPATH=. python benchmarks/hier_layer_block.py [K] ['{"tp": 8, "pp": 16, ...}'] [cluster]
"""
import json
import sys
import numpy as np
from engine.formats import resolve_model
from engine.cluster import preset
from engine.layout import Layout
from engine.graph.blocks import layer_blocks
from engine.sim import units as U
from engine.taskgraph import BARRIER
from hier_layer_steps import reference  # (the reference run and its units, read as that script reads them)

NEG = -np.inf


def edges_in(tg, order):
    """(pred, succ, weight) of every start constraint: data, chain, resource order."""
    pred_ptr, pred_idx = tg.pred_lists()
    tgt = np.repeat(np.arange(tg.num_tasks), np.diff(pred_ptr))
    a, b, w = [pred_idx], [tgt], [tg.dur_s[pred_idx]]
    has = tg.chain_next >= 0
    c = np.nonzero(has)[0]
    a.append(c); b.append(tg.chain_next[c]); w.append(tg.chain_lag_s[c])
    rp = U._res_prev(tg, order)
    holder = np.repeat(np.arange(tg.num_tasks), np.diff(tg.res_ptr))
    k = rp >= 0
    a.append(rp[k]); b.append(holder[k]); w.append(tg.dur_s[rp[k]])
    return np.concatenate(a), np.concatenate(b), np.concatenate(w)


def layer_pos(ref):
    """[task] position of a unit task's layer in its unit's processing order (-1 before the
    layers, k after), and the ops a layer holds."""
    g, tg, k = ref["g"], ref["tg"], ref["k"]
    blocks = layer_blocks(g)
    bi = {b: i for i, b in enumerate(blocks)}
    first = next(i for i, op in enumerate(g.ops) if op.block in bi)
    lay = np.array([bi[op.block] % k if op.block in bi else (-1 if i < first or op.kind == "input" else k)
                    for i, op in enumerate(g.ops)])
    pos = lay[tg.op]
    bwd = (ref["unit"] >= 0) & (ref["unit"] % 2 == 1)  # (every task of a backward unit, recomputed forwards too)
    pos = np.where(bwd, k - 1 - pos, pos)  # (a backward runs the layers last first)
    per = sum(1 for op in g.ops if op.block == blocks[0])
    return pos, per


def longest_from(sources, tasks_in_order, a_by_t, n):
    """[task, source] longest path from each source's start to each task's start."""
    D = np.full((n, len(sources)), NEG)
    for j, s in enumerate(sources):
        D[s, j] = 0.0
    for t in tasks_in_order:
        for p, w in a_by_t.get(t, ()):
            v = D[p] + w
            np.maximum(D[t], v, out=D[t])
    return D


def mp(A, B):
    return np.max(A[:, :, None] + B[None, :, :], axis=1)


def analyse(ref, u):
    tg, tl, unit = ref["tg"], ref["tl"], ref["unit"]
    n = tg.num_tasks
    pos, per = layer_pos(ref)
    a, b, w = edges_in(tg, tl.order)
    mine = (unit[a] == u) & (unit[b] == u)
    back = mine & (pos[a] > pos[b])
    if back.any():
        return f"{int(back.sum())} edges run back a layer"
    skip = mine & (pos[b] - pos[a] > 1) & (pos[a] >= 0) & (pos[b] < ref["k"])
    if skip.any():
        return f"{int(skip.sum())} edges skip a layer"
    a_by_t = {}
    for x, y, ww in zip(a[mine].tolist(), b[mine].tolist(), w[mine].tolist()):
        a_by_t.setdefault(y, []).append((x, ww))
    order = [t for t in tl.order.tolist() if unit[t] == u]

    def cut(i):  # tasks at pos <= i with an edge to pos >= i + 1 (in the unit), in a layer-free order
        c = np.unique(a[mine & (pos[a] <= i) & (pos[b] >= i + 1)])
        key = np.lexsort((tg.device[c], tg.part[c], tg.kind[c], tg.mb[c],
                          tg.op[c] - i * per * (-1 if u % 2 == 1 else 1)))
        return c[key]
    return dict(a_by_t=a_by_t, order=order, cut=cut, pos=pos, per=per, n=n)


def predict(ref3, u, K):
    """coef(K) of unit u predicted from the 3-layer reference, and its coef(3) recomposed."""
    info = analyse(ref3, u)
    if isinstance(info, str):
        return info
    tg, tl, unit = ref3["tg"], ref3["tl"], ref3["unit"]
    c0, c1 = info["cut"](0), info["cut"](1)
    if c0.size != c1.size or not c0.size:
        return f"cuts differ ({c0.size}, {c1.size})"
    # In: entries -> c0 (read_units' own longest paths)
    pred_ptr, pred_idx = tg.pred_lists()
    res_prev = U._res_prev(tg, tl.order)
    holder = np.repeat(np.arange(tg.num_tasks), np.diff(tg.res_ptr))
    res_next_ptr, res_next = U._res_next(tg, res_prev, holder)
    chain_prev = np.full(tg.num_tasks, -1, np.int64)
    has = tg.chain_next >= 0
    chain_prev[tg.chain_next[has]] = np.nonzero(has)[0]
    is_barrier = (tg.kind == BARRIER) & (unit < 0)
    reach = U._reach(tl.order, unit, is_barrier, tg.succ_ptr, tg.succ_idx, tg.chain_next, res_next_ptr, res_next)
    n_units = int(unit.max()) + 1
    for K_ in U.ENTRY_TABLES:
        L, ent, overflow = U._longest(tl.order, unit, tg.dur_s, tg.chain_lag_s, pred_ptr, pred_idx, chain_prev,
                                      tg.res_ptr, res_prev, reach, n_units, K_,
                                      np.full(tg.num_tasks, -1, np.int64), np.zeros((0, K_)))  # (no ready rows)
        if not overflow:
            break
    slots = np.r_[np.nonzero(ent[u, :K_ - 1] != -2)[0], K_ - 1]
    In = L[c0][:, slots].T  # [entry, c0]
    # A: c0 -> c1 ; Out: c1 -> exits (the reference's own coefficients, read as read_units does)
    D0 = longest_from(c0.tolist(), info["order"], info["a_by_t"], info["n"])
    A = D0[c1].T  # [c0, c1]
    Dl = longest_from(c1.tolist(), info["order"], info["a_by_t"], info["n"])
    unit_obj = ref3["units"][u]
    # exits: rebuild read_units' (t, y, w) for this unit
    src, dst = tg.edge_src, tg.succ_idx
    e = (unit[src] == u) & (unit[dst] < 0)
    ex_t, ex_y, ex_w = [src[e]], [dst[e]], [tg.dur_s[src[e]]]
    c = np.nonzero(has & (unit == u))[0]
    c = c[unit[tg.chain_next[c]] != u]
    ex_t.append(c); ex_y.append(tg.chain_next[c]); ex_w.append(tg.chain_lag_s[c])
    r = res_prev >= 0
    r[r] = (unit[res_prev[r]] >= 0) & (unit[holder[r]] < 0)
    r &= ~U._implied_frees(tg, unit, reach, res_prev, holder, r, tl.end_s, pred_ptr, pred_idx)
    r &= unit[np.maximum(res_prev, 0)] == u
    ex_t.append(res_prev[r]); ex_y.append(holder[r]); ex_w.append(tg.dur_s[res_prev[r]])
    t_all, y_all, w_all = (np.concatenate(x) for x in (ex_t, ex_y, ex_w))
    ys = unit_obj.exits
    Out = np.full((c1.size, ys.size), NEG)
    for t, y, ww in zip(t_all.tolist(), y_all.tolist(), w_all.tolist()):
        j = np.searchsorted(ys, y)
        Out[:, j] = np.maximum(Out[:, j], Dl[t] + ww)
    # paths that bypass the cuts: coef(3) recomposed must equal read_units'
    re3 = mp(mp(In, A), Out)
    fin = np.isfinite(unit_obj.coef)
    if not np.array_equal(fin, np.isfinite(re3)) or np.abs(re3[fin] - unit_obj.coef[fin]).max() > 1e-12:
        return "coef(3) not recomposed from the cuts"
    P = A
    for _ in range(K - 3):
        P = mp(P, A)
    return mp(mp(In, P), Out), c0.size


def main() -> int:
    K = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    opts = json.loads(sys.argv[2]) if len(sys.argv) > 2 else dict(tp=8, pp=16, dp=8, micro_batch=1, recompute="full")
    cl = sys.argv[3] if len(sys.argv) > 3 else "dgx-a100-80gb:128"
    g = resolve_model("gpt3-175b", batch=1536)
    c = preset(cl)
    lay0 = Layout.from_options(opts)
    r3 = reference(g, c, lay0, 3)
    rK = reference(g, c, lay0, K)
    ok = bad = skipped = 0
    for u in sorted(r3["units"]):
        got = predict(r3, u, K)
        if isinstance(got, str):
            skipped += 1
            print("unit", u, "not read:", got)
            continue
        pred, nc = got
        real = rK["units"].get(u)
        if real is None or real.coef.shape != pred.shape:
            skipped += 1
            print("unit", u, "shape", None if real is None else real.coef.shape, pred.shape)
            continue
        fin = np.isfinite(real.coef)
        err = np.abs(pred[fin] - real.coef[fin]).max() if fin.any() else 0.0
        same_fin = np.array_equal(fin, np.isfinite(pred))
        good = same_fin and err <= 1e-12
        ok += good
        bad += not good
        print("unit", u, f"cut {nc} tasks, err {err:.3g}, finite pattern same {same_fin}")
    print(f"K = {K}: {ok} units predicted exactly from the 3-layer reference's layer block, {bad} not, "
          f"{skipped} not read")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
