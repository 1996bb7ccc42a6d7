"""PaSE: the optimum of a per-op + per-edge cost by dynamic programming (Elango, IPDPS'21).

PaSE's cost of a strategy φ is a sum over vertices and edges of the operator graph,

    F(φ) = Σ_v t_l(v, φ_v) + Σ_(u,v) t_x(u, v, φ_u, φ_v),

and it is minimised exactly by eliminating vertices one at a time in an order that keeps the
*dependent sets* small (Algorithm GENERATESEQ, Fig. 3): each step takes the unprocessed vertex
whose connected set of processed vertices has the fewest unprocessed neighbours. Eliminating
v_i tabulates R(i, φ_D(i)) — the best cost of everything processed so far that touches v_i,
for every configuration of its dependent set D(i) — as the min over v_i's configs of its own
cost, its edges to D(i) and the tables of the processed sets it joins (Theorem 1). The last
table is the optimum; walking the argmin tables back gives the strategy. A table holds
Π_{u ∈ {v_i} ∪ D(i)} |C(u)| entries: the largest dependent set is reported, and an instance
whose table would not fit in ``max_table_bytes`` is refused before any work.

Config space (as PaSE restricts it): each op splits its data and parameter dimensions (FlexFlow
kinds S, A, P; no reduction or replica splits), degrees dividing the dimension with at least
``min_part`` elements per partition, their product dividing the device count, partitions on
the first devices in row-major order. On a mixed cluster the devices are part of the config
(:mod:`engine.search.pase_placement`): a k-way config may also run on the k fastest devices or
inside the fastest node or device type that holds k, and k may also divide the size of the
fastest device types together (8 = 4 H100 + 4 A100 on 12 GPUs); at most 4 device sets a
degree vector. On one device type the space and the tables are PaSE's, bit for bit.

Costs, from the simulator's cost model (:mod:`engine.costs`):

* t_l(v, c): forward + backward time of one partition (the roofline or a profile table) on
  the slowest of the config's devices (:func:`compute_time_s`: on a mixed cluster the slowest
  device gates a synchronous split; on one device type, that type's time), plus the
  all-reduce of its parameter gradients over the partitions that replicate them (ring/tree
  collective over the group's slowest path; on a mixed cluster over the real groups of the
  config's devices, the slowest gating: :func:`engine.search.pase_placement.sync_groups_time_s`).
* t_x(u, v, c_u, c_v): the elements a consumer partition must fetch (its input region less
  what the producer partition on its own device holds), for the partition that fetches the
  most, twice (activations forward, their gradients backward), at the slowest path bandwidth
  of the devices involved (both configs' devices together), plus one latency when anything moves.

The optimum of F is then simulated like any strategy, so it can be compared with the others.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..cluster import Cluster
from ..costs import CostModel, transfer_time_s
from ..costs.collectives import group_rates
from ..graph import Op, OpGraph
from ..ops import DTYPE_BYTES
from ..strategy import Config, Strategy, partition_grid
from ..strategy.config import degree_choices
from .api import Budget, PaseOptions, Price, Progress, ProgressFn, SearchResult, price, price_baselines, stamp
from . import pase_placement as placement
from .baselines import data_parallel

__all__ = ["PaseProblem", "pase_configs", "compute_time_s", "build_problem", "generate_seq", "solve", "pase",
           "PaseResult", "finish"]

#: largest DP table (bytes) an instance may need before it is refused
MAX_TABLE_BYTES = PaseOptions.max_table_bytes


def _pase_degrees(op: Op, n_devices: int | list[int], min_part: int = 1) -> list[dict[str, int]]:
    """Degree vectors of ``op`` whose product divides ``n_devices`` (or one of a list of device
    counts: :func:`engine.search.pase_placement.partition_totals`), smallest product first."""
    totals = [n_devices] if isinstance(n_devices, int) else list(n_devices)
    # PaSE's own space splits a fully-connected layer's input (reduction) dim too (its code's
    # FC configurations; the partial sums are then all-reduced, priced in the vertex cost)
    dims = [d for d in op.dims if (d.kind in ("S", "A", "P") or d.kind == "R" and op.kind == "linear") and d.size > 0]
    out: list[dict[str, int]] = [{}]
    for d in dims:
        ks = sorted({k for n in totals for k in degree_choices(d, n, min_part=min_part)})
        out = [dict(c, **({d.name: k} if k > 1 else {})) for c in out for k in ks
               if any(n % (math.prod(c.values()) * k) == 0 for n in totals)]
    out.sort(key=lambda c: (math.prod(c.values()), sorted(c.items())))
    return out


def pase_configs(op: Op, n_devices: int, min_part: int = 1,
                 sets: dict[int, list[tuple[int, ...]]] | None = None) -> list[Config]:
    """PaSE's configs of ``op``: degrees over its S, A and P dims (and a linear layer's input
    dim) that divide the dims (at least ``min_part`` elements a partition) with a product
    dividing ``n_devices``, on devices ``0 .. product-1``. The unsplit config comes first.

    ``sets`` (:func:`engine.search.pase_placement.placements`: partition count -> device
    tuples) widens the space on a mixed cluster: a degree vector whose product is a key, once
    on each of its device tuples (the first-k devices first)."""
    if sets is None:
        return [Config(c, tuple(range(math.prod(c.values())))) for c in _pase_degrees(op, n_devices, min_part)]
    totals = [k for k in sets if not any(m % k == 0 and m != k for m in sets)]  # the maximal counts
    return [Config(c, devs) for c in _pase_degrees(op, totals, min_part) for devs in sets[math.prod(c.values())]]


@dataclass
class PaseProblem:
    """Vertices (ops), their configs and costs (seconds), and edge cost matrices
    ``edges[(u, v)]`` of shape [configs of u, configs of v]."""

    graph: OpGraph
    cluster: Cluster
    configs: list[list[Config]]
    vertex_cost: list[np.ndarray]
    edges: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)

    def cost(self, choice: list[int]) -> float:
        """F(φ) of one choice of config index per op."""
        total = sum(float(self.vertex_cost[v][c]) for v, c in enumerate(choice))
        return total + sum(float(m[choice[u], choice[v]]) for (u, v), m in self.edges.items())


def _regions(op: Op, cfg: Config, tensor_axes: Any, n_axes: int, shape: tuple[int, ...],
             n_devices: int) -> tuple[np.ndarray, np.ndarray]:
    """[device, axis] lo and hi of the region of one tensor each partition holds or needs,
    partition p on device ``cfg.devices[p]`` (rows of the other devices are empty),
    partitions row-major over ``op.dims`` (:func:`engine.strategy.config.partition_grid`)."""
    lo = np.zeros((n_devices, n_axes), np.int64)
    hi = np.zeros((n_devices, n_axes), np.int64)
    rows = list(cfg.devices)
    hi[rows] = np.asarray(shape, np.int64)
    names, grid = partition_grid(op, cfg)
    for j, name in enumerate(names):
        d, k = op.dim(name), cfg.degree(name)
        ax = tensor_axes(d)
        if ax is None:
            continue
        coord = grid[:, j]
        step = shape[ax] // k
        lo[rows, ax] = coord * step
        hi[rows, ax] = (coord + 1) * step
    return lo, hi


def compute_time_s(op: Op, cfg: Config, precision: str, cluster: Cluster, cost: CostModel) -> float:
    """Forward + backward seconds of ``op`` under ``cfg``: the partitions run in step (every
    partition waits for its inputs from all of the previous op's), so the slowest device of
    the config gates it — the max over the config's device types of one partition's time on
    that type (:meth:`engine.costs.CostModel.partition_times_s`, as the simulator prices a
    partition on its own device, :meth:`engine.taskgraph.emit.Emitter.partition_times_s`).
    On a cluster of one device type this is that type's partition time."""
    types = {cluster.devices[d].type: cluster.device_type(d) for d in cfg.devices}
    best = 0.0
    for dt in types.values():
        f_s, b_s = cost.partition_times_s(op, cfg.degrees, precision, dt)
        best = max(best, f_s + b_s)
    return best


def _config_counts(graph: OpGraph, cluster: Cluster, min_part: int,
                   sets: dict[int, list[tuple[int, ...]]]) -> list[int]:
    """[op] how many configs each op has (memoised per op signature; nothing is priced)."""
    memo: dict[tuple, int] = {}
    counts = []
    for op in graph.ops:
        sig = (op.kind, tuple((d.name, d.kind, d.size) for d in op.dims))
        if sig not in memo:
            memo[sig] = len(pase_configs(op, cluster.num_devices, min_part, sets))
        counts.append(memo[sig])
    return counts


def build_problem(graph: OpGraph, cluster: Cluster, cost: CostModel | None = None, min_part: int = 1,
                  max_table_bytes: int | None = MAX_TABLE_BYTES) -> PaseProblem:
    """PaSE's configs and cost tables for ``graph`` on ``cluster`` (see the module docstring;
    on a mixed cluster each config's device set is part of the space:
    :mod:`engine.search.pase_placement`).

    Raises
    ------
    ValueError
        When the DP's largest table would exceed ``max_table_bytes`` (checked from the config
        counts and the ordering alone, before any cost is computed)."""
    cost = cost or CostModel()
    D = cluster.num_devices
    sets = placement.placements(cluster, graph.precision)
    if max_table_bytes is not None:  # refuse before any config or cost is made
        edges = list(dict.fromkeys((p, c) for (p, _, c, _) in graph.edges))
        _check_tables(graph, _config_counts(graph, cluster, min_part, sets), edges, max_table_bytes)
    configs = [pase_configs(op, D, min_part, sets) for op in graph.ops]
    pbytes = DTYPE_BYTES[graph.precision]
    eff = cost.links
    vertex = []
    for op, cs in zip(graph.ops, configs):
        costs = np.zeros(len(cs))
        replicating = [d.name for d in op.dims if all(a is None for a in d.param_axes)]
        reducing = [d.name for d in op.dims if d.kind == "R"]
        for k, c in enumerate(cs):
            t = compute_time_s(op, c, graph.precision, cluster, cost) if op.kind != "input" else 0.0
            if op.param_count:
                elems = op.partition_param_elements(c.degrees)
                repl = math.prod(c.degree(name) for name in replicating)
                if repl > 1 and elems > 0:
                    t += placement.sync_groups_time_s(op, c, replicating, elems * pbytes, cluster, eff)
            red = math.prod(c.degree(name) for name in reducing)
            if red > 1 and op.kind != "input":  # partial outputs summed over the reduction split
                _, outs, _ = op.partition_shapes(c.degrees)
                size = float(math.prod(outs[0])) * DTYPE_BYTES[op.out_tensors[0].dtype]
                t += placement.sync_groups_time_s(op, c, reducing, size, cluster, eff)
            costs[k] = t
        vertex.append(costs)
    problem = PaseProblem(graph, cluster, configs, vertex)
    cache: dict[tuple, np.ndarray] = {}
    for (p, o, c, i) in graph.edges:
        prod, cons = graph.ops[p], graph.ops[c]
        tensor = prod.out_tensors[o]
        shape = tuple(tensor.shape)
        key = (prod.kind, tuple((d.name, d.kind, d.size, d.out_axis) for d in prod.dims),
               cons.kind, tuple((d.name, d.kind, d.size, d.in_axes[i] if i < len(d.in_axes) else None)
                                for d in cons.dims), shape, tensor.dtype)
        m = cache.get(key)
        if m is None:
            m = cache[key] = _edge_costs(prod, configs[p], cons, configs[c], i, shape, DTYPE_BYTES[tensor.dtype],
                                         cluster, eff)
        if (p, c) in problem.edges:  # two tensors between the same ops
            problem.edges[(p, c)] = problem.edges[(p, c)] + m
        else:
            problem.edges[(p, c)] = m
    return problem


def _device_set_index(cs: list[Config]) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The distinct device tuples of ``cs`` and [config] the index of each config's."""
    index: dict[tuple[int, ...], int] = {}
    of = np.array([index.setdefault(c.devices, len(index)) for c in cs], np.int64)
    return list(index), of


def _edge_costs(prod: Op, pcs: list[Config], cons: Op, ccs: list[Config], i: int, shape: tuple[int, ...],
                nbytes: float, cluster: Cluster, eff) -> np.ndarray:
    D, A = cluster.num_devices, len(shape)
    P_lo = np.zeros((len(pcs), D, A), np.int64)
    P_hi = np.zeros((len(pcs), D, A), np.int64)
    for k, c in enumerate(pcs):
        P_lo[k], P_hi[k] = _regions(prod, c, lambda d: d.out_axis, A, shape, D)
    C_lo = np.zeros((len(ccs), D, A), np.int64)
    C_hi = np.zeros((len(ccs), D, A), np.int64)
    for k, c in enumerate(ccs):
        C_lo[k], C_hi[k] = _regions(cons, c, lambda d: d.in_axes[i] if i < len(d.in_axes) else None, A, shape, D)
    # [cv] elements a partition reads (every partition of a config reads as much)
    need = np.array([np.prod(C_hi[k, c.devices[0]] - C_lo[k, c.devices[0]]) for k, c in enumerate(ccs)], np.float64)
    # [cu, cv, device] elements the consumer partition on a device finds there
    ov = np.minimum(P_hi[:, None], C_hi[None]) - np.maximum(P_lo[:, None], C_lo[None])
    local = np.prod(np.clip(ov, 0, None), axis=3).astype(np.float64)
    valid = np.zeros((len(ccs), D), bool)  # [cv, device] the consumer config's devices
    for k, c in enumerate(ccs):
        valid[k, list(c.devices)] = True
    local = np.where(valid[None], local, np.inf).min(axis=2)  # the partition that has least
    remote = np.maximum(need[None, :] - local, 0.0)  # [cu, cv]
    # the group of both configs' devices: its slowest path carries the transfer
    p_sets, p_of = _device_set_index(pcs)
    c_sets, c_of = _device_set_index(ccs)
    bw = np.empty((len(p_sets), len(c_sets)))
    lat = np.empty((len(p_sets), len(c_sets)))
    for a, ps in enumerate(p_sets):
        for b, cset in enumerate(c_sets):
            grp = cluster.collective_group(tuple(sorted(set(ps) | set(cset))))
            bw[a, b], lat[a, b] = group_rates(grp, eff)[0], max(grp.latency_s, grp.inter_latency_s)
    bw, lat = bw[p_of[:, None], c_of[None, :]], lat[p_of[:, None], c_of[None, :]]
    # activations forward and their gradients back
    return np.where(remote > 0, transfer_time_s(2 * remote * nbytes, bw, lat, 1.0), 0.0)


# --------------------------------------------------------------------------- ordering, DP


def generate_seq(n: int, edges: list[tuple[int, int]]) -> tuple[list[int], list[list[int]]]:
    """PaSE's GENERATESEQ (Fig. 3): the order in which to process vertices, and each one's
    dependent set D(i) — the unprocessed vertices adjacent to the connected set of processed
    vertices it joins. Greedy: the next vertex is one whose D is smallest (ties: lowest id)."""
    dep: list[set[int]] = [set() for _ in range(n)]
    for u, v in edges:
        if u != v:
            dep[u].add(v)
            dep[v].add(u)
    alive = [True] * n
    order, sets = [], []
    import heapq

    heap = [(len(dep[v]), v) for v in range(n)]
    heapq.heapify(heap)
    while heap:
        size, v = heapq.heappop(heap)
        if not alive[v] or size != len(dep[v]):
            continue  # stale entry
        alive[v] = False
        order.append(v)
        d = sorted(dep[v])
        sets.append(d)
        for u in d:  # u's set now includes everything v's set reached
            dep[u] = (dep[u] | dep[v]) - {u, v}
            heapq.heappush(heap, (len(dep[u]), u))
    return order, sets


@dataclass
class PaseResult:
    choice: list[int]
    cost_s: float
    order: list[int]
    largest_dependent_set: int
    largest_table_entries: int
    seconds: float


def _check_tables(g: OpGraph, counts: list[int], edges: list[tuple[int, int]], max_table_bytes: int):
    """GENERATESEQ's order and dependent sets, and each step's table size; ValueError naming
    the op, its dependent set and the size when a table would exceed ``max_table_bytes``."""
    order, sets = generate_seq(len(counts), edges)
    sizes = [counts[v] * math.prod(counts[u] for u in d) for v, d in zip(order, sets)]
    worst = int(np.argmax(sizes)) if sizes else 0
    if sizes and sizes[worst] * 8 > max_table_bytes:
        v = order[worst]
        raise ValueError(
            f"PaSE's table for op {g.ops[v].name!r} would hold {sizes[worst]:,} entries "
            f"({sizes[worst] * 8 / 1e9:.1f} GB > {max_table_bytes / 1e9:.1f} GB): its dependent set has "
            f"{len(sets[worst])} ops ({', '.join(g.ops[u].name for u in sets[worst][:6])}"
            f"{', ...' if len(sets[worst]) > 6 else ''}); use fewer devices, a larger min_part, or MCMC")
    return order, sets, sizes


def solve(problem: PaseProblem, max_table_bytes: int = MAX_TABLE_BYTES) -> PaseResult:
    """The configs minimising F, by Theorem 1's recurrence over GENERATESEQ's order.

    Raises
    ------
    ValueError
        When a table would exceed ``max_table_bytes`` (naming the step, its dependent set
        and the size), before any table is built.
    """
    t0 = time.perf_counter()
    g = problem.graph
    nv = len(problem.configs)
    order, sets, sizes = _check_tables(g, [len(c) for c in problem.configs], list(problem.edges), max_table_bytes)
    # factors: scope (tuple of vertices) -> table; a vertex's pending factors
    factors: dict[int, list[tuple[tuple[int, ...], np.ndarray]]] = {v: [] for v in range(nv)}
    for v in range(nv):
        factors[v].append(((v,), problem.vertex_cost[v]))
    for (u, v), m in problem.edges.items():
        factors[u].append(((u, v), m))  # held by whichever is eliminated first
        factors[v].append(((u, v), m))
    done = [False] * nv
    argmins: list[tuple[int, tuple[int, ...], np.ndarray]] = []
    total = 0.0
    for v, dset in zip(order, sets):
        scope = (v, *dset)
        axis = {u: k for k, u in enumerate(scope)}
        shape = [len(problem.configs[u]) for u in scope]
        table = np.zeros(shape)
        for fs, f in factors[v]:
            if any(done[u] for u in fs):
                continue  # consumed when another vertex of its scope was eliminated
            # align the factor's axes with the table's
            src = [axis[u] for u in fs]
            perm = np.argsort(src)
            view_shape = [1] * len(scope)
            for u in fs:
                view_shape[axis[u]] = len(problem.configs[u])
            table += np.transpose(f, perm).reshape(view_shape)
        best = table.argmin(axis=0)
        msg = table.min(axis=0)
        done[v] = True
        argmins.append((v, tuple(dset), best))
        if dset:
            factors[dset[0]].append((tuple(dset), msg))
            for u in dset[1:]:
                factors[u].append((tuple(dset), msg))
        else:  # a connected component is finished
            total += float(msg)
    choice = [0] * nv
    for v, dset, best in reversed(argmins):
        choice[v] = int(best[tuple(choice[u] for u in dset)]) if dset else int(best)
    return PaseResult(choice, total, order, max((len(s) for s in sets), default=0), max(sizes, default=0),
                      time.perf_counter() - t0)


# --------------------------------------------------------------------------- the search


def pase(graph: OpGraph, cluster: Cluster, budget: Budget | None = None, *, seed: int = 0,
         progress: ProgressFn | None = None, initial: Strategy | None = None, cost: CostModel | None = None,
         options: PaseOptions | None = None) -> SearchResult:
    """Search by PaSE's DP; the result is priced like the other searches' (budget, seed and
    initial strategy do not apply: the DP is exact for its cost and deterministic).

    Returns
    -------
    SearchResult
        ``best`` is PaSE's optimum with ``found_by`` recording the DP's cost, its largest
        dependent set and table; ``best_cost_s`` its simulated iteration time (inf when it does
        not fit in memory: PaSE's cost has no memory term).
    """
    opts = options or PaseOptions()
    t0 = time.perf_counter()
    cost_model = cost or CostModel()
    limit = opts.max_seconds if budget is None or budget.seconds is None else min(opts.max_seconds, budget.seconds)
    est = estimate_seconds(graph, cluster, opts.min_part)
    if est > limit:
        raise ValueError(f"PaSE would take about {est:.0f} s here (its dynamic program and edge costs, estimated "
                         f"before starting), more than {'the budget' if limit != opts.max_seconds else 'max_seconds'} "
                         f"({limit:g} s): give it more time, fewer devices or a larger min_part, or use the "
                         "differentiable search or MCMC")
    problem = build_problem(graph, cluster, cost_model, opts.min_part, opts.max_table_bytes)
    built = time.perf_counter() - t0
    r = solve(problem, opts.max_table_bytes)
    found_by = {"algorithm": "pase", "options": {"min_part": opts.min_part}, "pase_cost_s": r.cost_s,
                "largest_dependent_set": r.largest_dependent_set, "largest_table_entries": r.largest_table_entries,
                "dp_seconds": r.seconds, "setup_seconds": built}
    result = finish(graph, cluster, problem, r.choice, cost_model, found_by, t0)
    if progress is not None:
        progress(result.trace[-1])
    return result


#: Rates of the two costly parts of PaSE on the development VM (2 cores, x86-64), measured on
#: Inception-v3, ResNet-101, RNNTC and NMT (2026-11-23): the edge cost matrices take
#: ~0.9-2.8 us an entry, the dynamic program 57-196 M table entries a second. The estimate
#: takes the slow ends, so that it errs long (NMT on 64 K80s: estimated 124 s, took 107 s).
EDGE_ENTRY_S = 3e-6
TABLE_ENTRIES_PER_S = 5e7


def estimate_seconds(graph: OpGraph, cluster: Cluster, min_part: int = 1) -> float:
    """Seconds PaSE would take on ``graph`` and ``cluster``, from the config counts and the
    elimination order alone (a fraction of a second; nothing is priced)."""
    counts = _config_counts(graph, cluster, min_part, placement.placements(cluster, graph.precision))
    edges = list(dict.fromkeys((p, c) for (p, _, c, _) in graph.edges))
    _, _, sizes = _check_tables(graph, counts, edges, 1 << 62)
    return sum(counts[p] * counts[c] for p, c in edges) * EDGE_ENTRY_S + sum(sizes) / TABLE_ENTRIES_PER_S


def finish(graph: OpGraph, cluster: Cluster, problem: PaseProblem, choice: list[int], cost: CostModel,
           found_by: dict[str, Any], t0: float, iterations: int = 1,
           known: dict[str, Price] | None = None) -> SearchResult:
    """The search result of a choice of configs (data parallel's settings otherwise), priced
    with the baselines (:func:`engine.search.api.price`; ``known``: baselines already priced).

    No search offers a plan slower than the best baseline it knows without saying so: when
    the plan simulates slower than a baseline that fits (or does not fit), the fastest such
    baseline is returned as ``best``, with a note saying so and ``baseline_returned`` naming
    it (the plan's own time stays in ``found_by``)."""
    from .baselines import make_baseline

    best = replace(data_parallel(graph, cluster),
                   configs={op.name: problem.configs[v][choice[v]] for v, op in enumerate(graph.ops)})
    p = price(graph, best, cluster, cost)
    baselines, notes = price_baselines(graph, cluster, cost, known=known)
    algorithm = found_by["algorithm"]
    if not p.feasible:
        notes.insert(0, f"the strategy found does not fit in memory ({algorithm}'s cost has no memory term)")
    fitting = {n: c for n, c in baselines.items() if math.isfinite(c)}
    returned = None
    if fitting and min(fitting.values()) < p.cost_s:
        returned = min(fitting, key=lambda n: fitting[n])
        plan = f"{p.time_s * 1e3:.3f} ms" + (f", {p.time_s / fitting[returned]:.2f}x the baseline's" if p.feasible
                                              else ", does not fit in memory")
        notes.insert(0, f"{algorithm}'s plan ({plan}) is slower than the {returned} baseline "
                        f"({fitting[returned] * 1e3:.3f} ms): the baseline is returned as the best instead")
        found_by = {**found_by, "baseline_returned": returned, "plan_time_s": p.time_s, "plan_fits": p.feasible}
        best, p = make_baseline(returned, graph, cluster), Price(fitting[returned], True)
    elapsed = time.perf_counter() - t0
    stamped = stamp(best, graph, cluster, found_by, p)
    row = Progress(iterations, elapsed, p.cost_s, p.cost_s, 1.0, 1, best=stamped if p.feasible else None)
    return SearchResult(stamped, p.cost_s, baselines, iterations, elapsed, [row], algorithm=algorithm,
                        best_time_s=p.time_s, notes=notes, baseline_returned=returned)
