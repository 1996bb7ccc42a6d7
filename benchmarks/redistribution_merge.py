"""Would one task per link per redistribution (its hops' bytes summed) be the same schedule?
(Issue 43: NMT's MCMC proposals at 64 GPUs are slow because their task graphs are mostly the
hop-by-hop transfers of 64-way redistributions.)

For FlexFlow's NMT on k80-16x4 under three strategies (data parallel, FlexFlow's expert
strategy, the best-known plan of ``benchmarks/measured/best-plans/``), the full task graph is
built and simulated; its transfer hops are grouped by (op, microbatch, link): what merging
per link per redistribution would make one task. For each group it prints:

* how many tasks the graph would lose;
* groups whose hops lead to two or more different consumer tasks (a hop's chain followed to its
  last hop, then its successors): merged, each of those consumers would wait for every byte of
  the group, not only its own;
* in the simulated schedule, how much later than now each such consumer's data would arrive at
  the least: the group's last hop end against the end of the consumer's own last hop (a lower
  bound of the change: the merged task also moves when its first byte may go);
* groups whose hops all lead to one consumer (merged, no consumer would wait for another's bytes;
  their hops still come from different holders, ready at different times).

Usage: PYTHONPATH=. python benchmarks/redistribution_merge.py
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numpy as np

from engine.cluster import preset
from engine.formats import load_strategy, resolve_model
from engine.search.baselines import data_parallel, expert
from engine.sim.full import simulate
from engine.taskgraph import XFER, build_task_graph

ROOT = Path(__file__).resolve().parents[1]


def _last_hop(tg, t: np.ndarray) -> np.ndarray:
    """The last hop of each transfer chain that ``t``'s hops belong to."""
    last = t.copy()
    while True:
        nxt = tg.chain_next[last]
        more = nxt >= 0
        if not more.any():
            return last
        last[more] = nxt[more]


def analyse(name: str, graph, strategy, cluster) -> None:
    t0 = time.perf_counter()
    tg = build_task_graph(graph, strategy, cluster, symmetry="off")
    tl = simulate(tg)
    took = time.perf_counter() - t0
    x = np.flatnonzero(tg.kind == XFER)
    print(f"\n{name}: {tg.num_tasks:,} tasks, {x.size:,} transfer hops ({x.size / max(1, tg.num_tasks):.0%}); "
          f"built and simulated in {took:.1f} s; iteration {tl.makespan_s * 1e3:.2f} ms")
    if not x.size:
        return
    key = (tg.op[x].astype(np.int64) * (int(tg.mb.max()) + 2) + (tg.mb[x] + 1)) * (int(tg.link.max()) + 1) + tg.link[x]
    order = np.argsort(key, kind="stable")
    x, key = x[order], key[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    sizes = np.diff(np.r_[starts, key.size])
    print(f"  groups (op, microbatch, link): {starts.size:,}; merged, the graph would have "
          f"{tg.num_tasks - x.size + starts.size:,} tasks ({(tg.num_tasks - x.size + starts.size) / tg.num_tasks:.0%})")
    # the consumer of every hop: the successors of its chain's last hop (the first, by id)
    last = _last_hop(tg, x)
    has = tg.succ_ptr[last + 1] > tg.succ_ptr[last]
    cons = np.where(has, tg.succ_idx[np.minimum(tg.succ_ptr[last], max(tg.num_edges - 1, 0))], -1)
    end_last = tl.end_s[last]
    multi, same, delay = 0, 0, []
    multi_tasks = 0
    for a, n in zip(starts.tolist(), sizes.tolist()):
        if n < 2:
            continue
        c = cons[a:a + n]
        if np.unique(c).size > 1:
            multi += 1
            multi_tasks += n
            e = end_last[a:a + n]
            delay.append(float(e.max() - e.min()))
        else:
            same += 1
    big = sum(1 for s in sizes.tolist() if s >= 2)
    d = np.array(delay) if delay else np.zeros(1)
    print(f"  groups of 2 or more hops: {big:,}; leading to 2 or more consumers: {multi:,} ({multi_tasks:,} hops); "
          f"leading to one: {same:,}")
    print(f"  a consumer's data later if merged, at least: median {np.median(d) * 1e3:.3f} ms, max {d.max() * 1e3:.3f} ms, "
          f"{int(np.count_nonzero(d > 1e-12)):,} groups later by more than nothing")


def main() -> None:
    print(f"# {platform.node()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.2f}")
    g, c = resolve_model("nmt"), preset("k80-16x4")
    best = ROOT / "benchmarks" / "measured" / "best-plans" / "nmt--k80-16x4.json"
    for name, s in (("data parallel", data_parallel(g, c)), ("FlexFlow's expert strategy", expert(g, c)),
                    ("best-known plan", load_strategy(str(best), g, c))):
        analyse(name, g, s, c)


if __name__ == "__main__":
    main()
