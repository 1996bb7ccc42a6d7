"""Pipeline planning after Alpa's inter-operator pass (Zheng et al. OSDI'22 §5).

The layers are cut into ``pp`` consecutive stages, the cluster into ``pp`` meshes of
``dp x tp`` devices, and each stage runs Megatron-style intra-op parallelism inside its mesh
(tensor parallel of degree ``tp`` within a node, ``dp`` data-parallel replicas). For B
microbatches, Alpa's objective (Eq. 2) is the pipeline's latency

    T = Σ_s t_s + (B − 1) · max_s t_s,

t_s being stage s's latency for one microbatch (forward + backward). For every (tp, pp, dp,
microbatch size) the layer split minimising T is found by Alpa's dynamic programme: for a cap
t_max on any stage's latency, the least Σ t_s over splits with every t_s <= t_max (a DP over
(stages, layers)); T = that + (B − 1) t_max, minimised over caps tried in increasing order
(stopping once (B − 1) t_max alone exceeds the best; caps are the stage latencies' quantiles).

Beyond Alpa, where its users hit limits:

* **Communication between stages** (Alpa issue #459): each stage boundary sends one
  microbatch's activations forward and their gradients back over the slowest link between the
  two meshes; it is added to the sending stage's latency.
* **Microbatches chosen**: the microbatch size is searched with the rest (B = batch / (dp x size)),
  and the data-parallel gradient all-reduce of the slowest stage is added once per iteration.
* **Hardware-aware placement** on heterogeneous clusters: a stage's latency is computed on the
  device type of its mesh (its slowest GPU) and the links of that mesh, every assignment of
  stages to meshes is tried (up to 6 stages; beyond, by speed order), and the DP then gives the
  faster meshes more layers. ``hardware_aware=False`` plans as if every mesh were like the
  first one (the comparison in docs/benchmarks/2026-11-21-issue-6-pase-differentiable-pipeline.md).
* **Memory**: a plan whose stage would hold more than its GPUs' memory (weights, gradients and
  Adam state of its layers over tp, plus 1F1B's in-flight activations) is skipped.

The analytic model ranks plans; the best few are simulated (:mod:`engine.sim.full`, memory
included), each with data parallelism also with ZeRO-2 (:data:`ZERO_VARIANTS`), and the fastest
feasible one is returned.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace

import numpy as np

from ..cluster import Cluster
from ..costs import CostModel, group_collective_time_s, transfer_time_s
from ..graph import OpGraph
from ..sim.memory_static import optimizer_bytes_per_param
from ..ops import DTYPE_BYTES
from ..strategy import Strategy
from .api import Budget, PipelineOptions, Progress, ProgressFn, SearchResult, price, price_baselines, stamp
from ..layout import Layout, microbatch_count, valid_layouts
from ..moe import expert_counts, expert_split
from ..layout.experts import megatron_eps
from ..layout.build import build_layout
from ..graph.blocks import layer_blocks
from ..layout.placement import tp_plan

__all__ = ["Plan", "plan_pipeline", "pipeline", "ZERO_VARIANTS"]

#: ZeRO stages each simulated plan with data parallelism is priced with besides none. The
#: analytic model prices a stage's gradient sync as one bucketed all-reduce; the simulation
#: reduces each tensor apart without ZeRO (a per-tensor ring pays its n - 1 steps' latency)
#: and by block with it, the update sharded over dp (:func:`engine.taskgraph.sync.sync_unit`).
#: ResNet-101 on k80-16x4, tp 1 x pp 4 x dp 16: 95.25 ms without, 61.74 ms with ZeRO-2 (issue
#: 43). ZeRO-1 is not tried: it adds a parameter gather to the all-reduce ZeRO-2 splits
ZERO_VARIANTS = (2,)


@dataclass
class Plan:
    tp: int
    pp: int
    dp: int
    micro_batch: int
    microbatches: int
    layers_per_stage: list[int]
    stage_mesh: list[int]
    model_cost_s: float  # Alpa's T plus the data-parallel sync, analytic
    recompute: str = "none"
    ep: int = 1  # a mixture-of-experts model's expert-parallel degree (etp 1)
    moe: bool = False  # a mixture-of-experts model: sequence parallelism where tp > 1 (Megatron-LM's rule)
    zero_stage: int = 0  # ZeRO: the optimizer state and gradients sharded over dp (:data:`ZERO_VARIANTS`)

    @property
    def layout(self) -> Layout:
        """The plan as a :class:`engine.layout.Layout`."""
        return Layout(tp=self.tp, pp=self.pp, dp=self.dp, micro_batch=self.micro_batch, recompute=self.recompute,
                      layers_per_stage=self.layers_per_stage if self.pp > 1 else None,
                      stage_mesh=self.stage_mesh if self.pp > 1 else None, ep=self.ep,
                      sequence_parallel=self.moe and self.tp > 1, zero_stage=self.zero_stage)

    def describe(self) -> str:
        return (f"tp {self.tp} x pp {self.pp} x dp {self.dp}{f', ep {self.ep}' if self.ep > 1 else ''}, "
                f"micro-batch {self.micro_batch} "
                f"({self.microbatches} microbatches), recompute {self.recompute}, layers per stage "
                f"{self.layers_per_stage}, meshes {self.stage_mesh}"
                + (f", ZeRO-{self.zero_stage}" if self.zero_stage else ""))

    def variants(self) -> list["Plan"]:
        """The plan and, with data parallelism, the plan with each of :data:`ZERO_VARIANTS`."""
        return [self] + ([replace(self, zero_stage=z) for z in ZERO_VARIANTS] if self.dp > 1 else [])


def _units(graph: OpGraph) -> list[list[int]]:
    """Op indices of each layer, the ops before the first layer joining it and the ops after
    the last joining that (as the Megatron baseline assigns them)."""
    layers = layer_blocks(graph)
    index = {b: k for k, b in enumerate(layers)}
    units: list[list[int]] = [[] for _ in layers]
    pending: list[int] = []
    last = -1
    for i, op in enumerate(graph.ops):
        k = index.get(op.block) if op.block else None
        if k is None:
            pending.append(i)
            continue
        units[k].extend(pending)
        pending = []
        units[k].append(i)
        last = k
    if pending and last >= 0:
        units[last].extend(pending)
    return units


class _Model:
    """Per-layer latencies and sizes under (tp, dp, microbatches) on each mesh type."""

    def __init__(self, graph: OpGraph, cluster: Cluster, cost: CostModel):
        self.g, self.c, self.cost = graph, cluster, cost
        self.units = _units(graph)
        self.pbytes = DTYPE_BYTES[graph.precision]
        self.moe = bool(expert_counts(graph))
        self._plans: dict[int, dict] = {}
        self._times: dict[tuple, np.ndarray] = {}
        self._op_parts: dict[tuple, list] = {}
        self._partition_s: dict[tuple, tuple[float, float]] = {}
        self._sizes: dict[tuple, tuple] = {}

    def group(self, devices: tuple[int, ...]):
        """The collective group (bandwidth, latencies, nodes) of ``devices``."""
        return self.c.collective_group(devices)

    def tp_plan(self, tp: int) -> dict:
        if tp not in self._plans:  # (a mixture-of-experts model: sequence parallel, Megatron-LM's rule)
            self._plans[tp] = tp_plan(self.g, tp, self.moe and tp > 1)[0]
        return self._plans[tp]

    def degrees(self, op, tp: int, dp: int, m: int, ep: int) -> dict[str, int]:
        """``op``'s partition degrees for one microbatch on a (dp, tp) mesh: Megatron's tensor
        parallelism, or for an ``experts`` op the expert-parallel folding of
        :func:`engine.layout.placement.expert_config` (etp 1)."""
        if op.kind == "experts":
            ep_s, ep_l = expert_split(tp, 1, dp, ep, 1)
            want = {"sample": dp // ep_s * m, "expert": ep_s, "length": tp // ep_l, "expert_seq": ep_l}
            return {d.name: want[d.name] for d in op.dims if want.get(d.name, 1) > 1}
        dim, deg = self.tp_plan(tp)[op.name]
        degrees = {"sample": dp * m} if "sample" in op.dim_names else {}
        if dim is not None and deg > 1:
            degrees[dim] = deg
        return degrees

    def _split_key(self, dp: int, m: int) -> tuple[int, ...]:
        """What of (dp, m) an op's partition depends on (:meth:`degrees`): the batch dim's degree
        dp x m alone (one micro-batch's samples a partition), except an ``experts`` op's, which
        folds dp with ep. Layouts with the same micro-batch then share their layer times: on
        ResNet-101 / dgx-a100-40gb:8 the planner's 1,344 asks of 148 layouts made about 150 sets
        of layer times (51,208 op pricings, 3.7 of its 4 s on a loaded host); now 32 sets, from
        16 sets of op times, from 896 op pricings (a repeated layer's ops priced once); the plans
        the same to the bit (issue 43)."""
        return (dp, m) if self.moe else (dp * m,)

    def layer_times(self, tp: int, dp: int, m: int, dtype, tp_group: tuple[int, ...], recompute: str, ep: int = 1,
                    ep_group: tuple[int, ...] = ()) -> np.ndarray:
        """[layer] seconds of one microbatch's forward + backward (+ the recomputed forward)
        on one mesh (cached per device type: a tensor-parallel group sits inside one node);
        an ``experts`` op adds its dispatch and combine, an all-to-all each way in the forward
        and in the backward over ``ep_group`` (Megatron-Core's all-to-all token dispatcher)."""
        key = (tp, self._split_key(dp, m), dtype.name, recompute, ep, ep_group)
        hit = self._times.get(key)
        if hit is not None:
            return hit
        full = recompute == "full"
        out = np.zeros(len(self.units))
        for k, ops in enumerate(self._op_times(tp, dp, m, dtype, tp_group, ep, ep_group)):
            t = 0.0
            for f, b, kind, c in ops:  # (summed in the order each op adds its terms)
                t += f + b + (f if full else 0.0)
                if kind == "all_to_all":  # dispatch and combine, forward and backward (and recomputed)
                    t += (6 if full else 4) * c
                elif kind == "all_reduce":  # a row-parallel op's output, forward and backward (and recomputed)
                    t += (3 if full else 2) * c
            out[k] = t
        self._times[key] = out
        return out

    def _op_times(self, tp: int, dp: int, m: int, dtype, tp_group: tuple[int, ...], ep: int,
                  ep_group: tuple[int, ...]) -> list[list[tuple[float, float, str, float]]]:
        """[layer] [op] (forward s, backward s, the collective it adds, that collective's s) of one
        microbatch: what :meth:`layer_times` sums, with or without recomputation (made once for both)."""
        key = (tp, self._split_key(dp, m), dtype.name, ep, ep_group)
        hit = self._op_parts.get(key)
        if hit is not None:
            return hit
        plan = self.tp_plan(tp)
        group = self.group(tp_group)
        out = []
        for ops in self.units:
            row = []
            for i in ops:
                op = self.g.ops[i]
                if op.kind == "input":
                    continue
                dim, deg = plan[op.name]
                degrees = self.degrees(op, tp, dp, m, ep)
                # (a repeated layer's ops share a signature, so their partitions' times)
                at = (op.signature, tuple(sorted(degrees.items())), dtype.name)
                fb = self._partition_s.get(at)
                if fb is None:
                    fb = self._partition_s[at] = self.cost.partition_times_s(op, degrees, self.g.precision, dtype)
                f, b = fb
                kind, c = "", 0.0
                if op.kind == "experts":
                    if ep > 1:  # each token copy goes out to its expert and comes back
                        copies = float(math.prod(op.in_tensors[0].shape)) / (dp * m * tp) * op.attrs["top_k"]
                        kind, c = "all_to_all", group_collective_time_s(
                            "all_to_all", copies * self.pbytes, self.group(ep_group), self.cost.links)
                elif dim is not None and deg > 1 and op.dim(dim).kind == "R":  # row-parallel: all-reduce out
                    _, outs, _ = op.partition_shapes(degrees)
                    size = float(sum(math.prod(s) for s in outs)) * self.pbytes
                    kind, c = "all_reduce", group_collective_time_s("all_reduce", size, group, self.cost.links)
                row.append((f, b, kind, c))
            out.append(row)
        self._op_parts[key] = out
        return out

    def layer_sizes(self, tp: int, dp: int, m: int, ep: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[layer] parameters per GPU, activation bytes kept per microbatch per GPU, and the
        bytes of the layer's output per microbatch per GPU (what a stage boundary sends)."""
        key = (tp, self._split_key(dp, m), ep)
        hit = self._sizes.get(key)
        if hit is not None:
            return hit
        params = np.zeros(len(self.units))
        acts = np.zeros(len(self.units))
        outb = np.zeros(len(self.units))
        for k, ops in enumerate(self.units):
            for i in ops:
                op = self.g.ops[i]
                ins, outs, ps = op.partition_shapes(self.degrees(op, tp, dp, m, ep))
                params[k] += float(sum(math.prod(s) for s in ps))
                acts[k] += float(sum(math.prod(s) * DTYPE_BYTES[t.dtype] for s, t in zip(ins, op.in_tensors)))
            last = self.g.ops[ops[-1]] if ops else None
            if last is not None:
                _, outs, _ = last.partition_shapes({"sample": dp * m} if "sample" in last.dim_names else {})
                outb[k] = float(sum(math.prod(s) for s in outs)) * self.pbytes
        self._sizes[key] = (params, acts, outb)
        return params, acts, outb


def _split(times: list[np.ndarray], boundary: list[np.ndarray], B: int, ok: np.ndarray,
           caps: int = 64) -> tuple[float, list[int]] | None:
    """Alpa's DP: ``times[s]`` [layer] latencies on stage s's mesh, ``boundary[s]`` [layer]
    the cost of ending stage s after that layer; ``ok[s, i, j]`` whether layers i..j-1 fit
    stage s's memory. Returns (T, layers per stage) or None."""
    pp = len(times)
    L = times[0].size
    # t[s, i, j]: stage s running layers i..j-1
    t = np.full((pp, L + 1, L + 1), np.inf)
    for s in range(pp):
        pre = np.concatenate([[0.0], np.cumsum(times[s])])
        span = pre[None, :] - pre[:, None]
        comm = np.zeros(L + 1)
        if s < pp - 1:
            comm[1:] = boundary[s]
        tt = span + comm[None, :]
        tt[np.tril_indices(L + 1)] = np.inf  # need j > i
        tt[~ok[s]] = np.inf
        t[s] = tt
    finite = np.unique(t[np.isfinite(t)])
    if finite.size == 0:
        return None
    cand = np.unique(np.quantile(finite, np.linspace(0, 1, min(caps, finite.size)), method="higher"))
    best: tuple[float, list[int]] | None = None
    for cap in cand:
        if best is not None and (B - 1) * cap >= best[0]:
            break
        tc = np.where(t <= cap, t, np.inf)
        f = np.full(L + 1, np.inf)
        f[0] = 0.0
        arg = np.zeros((pp, L + 1), np.int64)
        for s in range(pp):
            cand_f = f[:, None] + tc[s]  # [i, j]
            arg[s] = cand_f.argmin(axis=0)
            f = cand_f.min(axis=0)
        if not np.isfinite(f[L]):
            continue
        total = f[L] + (B - 1) * cap
        if best is None or total < best[0]:
            j, counts = L, []
            for s in range(pp - 1, -1, -1):
                i = int(arg[s, j])
                counts.append(j - i)
                j = i
            best = (float(total), counts[::-1])
    return best


def plan_pipeline(graph: OpGraph, cluster: Cluster, cost: CostModel | None = None, hardware_aware: bool = True,
                  tps: tuple[int, ...] = (1, 2, 4, 8), micro_batches: tuple[int, ...] = (1, 2, 4, 8),
                  max_pp: int | None = None, recomputes: tuple[str, ...] = ("none", "full")) -> list[Plan]:
    """Every feasible plan's analytic cost, best first (see the module docstring)."""
    cost = cost or CostModel()
    n = cluster.num_devices
    L = len(layer_blocks(graph))
    if L == 0:
        raise ValueError(f"model {graph.name!r} has no numbered layer blocks (layers.0, layers.1, ...) for the "
                         f"pipeline search to cut into stages; search it with mcmc, pase or auto instead")
    model = _Model(graph, cluster, cost)
    batch = graph.batch_size
    mem_cap = np.array([cluster.device_type(d).memory_bytes for d in range(n)], dtype=np.float64)
    opt_bytes = 2 * model.pbytes + optimizer_bytes_per_param(graph.precision)  # weights, gradients, Adam
    plans: list[Plan] = []
    # the layouts (tp inside a node and dividing the heads, pp up to the layers, dp dividing the
    # batch, micro-batches dividing each replica's batch): engine.layout's one enumerator. No
    # cap on the microbatches: the planner prices each plan analytically and simulates only the
    # best few, so long gradient accumulation is a plan it may pick (the cap is MCMC's, whose
    # every jump is simulated)
    # A mixture-of-experts model's layouts are planned with etp 1 and the expert-parallel
    # degrees published runs take (:func:`engine.layout.experts.megatron_eps`: the largest in a
    # node, the largest across up to 8 nodes), not every one the enumerator folds
    pps = range(1, min(L, max_pp or L) + 1)
    moe = bool(expert_counts(graph))
    for lay in valid_layouts(graph, cluster, tps=tps, pps=pps, micro_batches=micro_batches, max_cp=1,
                             max_microbatches_per_stage=None):
        tp, pp, dp, mb, ep = lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.ep
        if moe and (lay.etp > 1 or ep not in megatron_eps(graph, cluster.gpus_per_node, tp, 1, dp)):
            continue
        model.tp_plan(tp)
        mesh_size = dp * tp
        meshes = [tuple(range(k * mesh_size, (k + 1) * mesh_size)) for k in range(pp)]
        speed = [min(cluster.device_type(d).peak_flops_per_s.get(graph.precision, 0.0) for d in mesh)
                 for mesh in meshes]
        B = microbatch_count(batch, dp, mb)
        m = B  # the engine's sample degree carries dp * microbatches
        # per mesh: the device type it runs at (hardware-aware) or the first mesh's
        types = [min((cluster.device_type(d) for d in mesh), key=lambda t: t.peak_flops_per_s.get(
            graph.precision, 0.0)) for mesh in meshes]
        if not hardware_aware:
            types = [cluster.device_type(0)] * pp
        params, acts, outb = model.layer_sizes(tp, dp, m, ep)
        for recompute in recomputes:
            for plan in _plans_for(model, cluster, graph, tp, pp, dp, mb, B, m, meshes, types, speed, params,
                                   acts, outb, recompute, hardware_aware, mem_cap, opt_bytes, cost, ep):
                plan.ep, plan.moe = ep, moe
                plans.append(plan)
    plans.sort(key=lambda p: p.model_cost_s)
    return plans


def _plans_for(model, cluster, graph, tp, pp, dp, mb, B, m, meshes, types, speed, params, acts, outb, recompute,
               hardware_aware, mem_cap, opt_bytes, cost, ep=1) -> list[Plan]:
    """The best layer split for every assignment of stages to meshes, for one layout."""
    n = cluster.num_devices
    L = params.size
    mesh_size = len(meshes[0])
    plans = []
    # the expert-parallel group of a mesh's first rank: ep_l sequence shards of each of ep_s samples
    ep_s, ep_l = expert_split(tp, 1, dp, ep, 1) if ep > 1 else (1, 1)
    ep_at = [s * tp + r for s in range(ep_s) for r in range(ep_l)]
    times_by_mesh = [model.layer_times(tp, dp, m, types[k], meshes[k][:tp], recompute, ep,
                                       tuple(meshes[k][i] for i in ep_at) if ep > 1 else ()) for k in range(pp)]
    if recompute == "full":  # only each layer's input is kept between forward and backward
        acts = np.concatenate([[outb[0]], outb[:-1]])
    pre_p = np.concatenate([[0.0], np.cumsum(params)])
    pre_a = np.concatenate([[0.0], np.cumsum(acts)])
    orders = [list(range(pp))]
    if hardware_aware and len(set(speed)) > 1:
        if pp <= 6:  # every assignment that differs in which kind of mesh runs which stage
            kinds = [types[k].name for k in range(pp)]
            seen, orders = set(), []
            for perm in itertools.permutations(range(pp)):
                key = tuple(kinds[k] for k in perm)
                if key not in seen:
                    seen.add(key)
                    orders.append(list(perm))
        else:
            orders = [sorted(range(pp), key=lambda k: -speed[k])]
    for order in orders:
        times = [times_by_mesh[order[s]] for s in range(pp)]
        boundary = []
        for s in range(pp - 1):
            a, b = meshes[order[s]][0], meshes[order[s + 1]][0]
            bw = (cluster.path_bandwidth(a, b, cost.links) if hardware_aware
                  else cluster.path_bandwidth(0, min(n - 1, mesh_size), cost.links))
            # activations forward and their gradients back; latency left out (one per
            # microbatch, microseconds against milliseconds of compute)
            boundary.append(transfer_time_s(2 * outb, bw, 0.0, 1.0))
        ok = np.zeros((pp, L + 1, L + 1), bool)
        for s in range(pp):
            inflight = pp - s  # 1F1B: stage s holds up to pp - s microbatches
            wt = (pre_p[None, :] - pre_p[:, None]) * opt_bytes
            ac = (pre_a[None, :] - pre_a[:, None]) * min(inflight, B)
            ok[s] = wt + ac <= mem_cap[meshes[order[s]][0]]
        res = _split(times, boundary, B, ok)
        if res is None:
            continue
        total, counts = res
        # data-parallel gradient sync of the heaviest stage, once per iteration
        sync = 0.0
        if dp > 1:
            at = 0
            for s, cnt in enumerate(counts):
                mesh = meshes[order[s]]
                size = (pre_p[at + cnt] - pre_p[at]) * model.pbytes
                sync = max(sync, group_collective_time_s("all_reduce", size, model.group(tuple(mesh[::tp])),
                                                         cost.links))
                at += cnt
        plans.append(Plan(tp, pp, dp, mb, B, counts, list(order), total + sync, recompute))
    return plans


def build_plan(graph: OpGraph, cluster: Cluster, plan: Plan) -> Strategy:
    """The strategy of a plan's layout (:func:`engine.search.baselines.build_layout`)."""
    return build_layout(graph, cluster, plan.layout)


def pipeline(graph: OpGraph, cluster: Cluster, budget: Budget | None = None, *, seed: int = 0,
             progress: ProgressFn | None = None, initial: Strategy | None = None, cost: CostModel | None = None,
             options: PipelineOptions | None = None) -> SearchResult:
    """The search interface: plan, price the ``simulate_top`` best plans (memory included;
    with data parallelism each also with ZeRO-2) and return the fastest that fits. The
    baseline is data parallel (the expert strategy of an LLM is a model-parallel layout many
    times slower to simulate, and never a pipeline's rival).

    With a time budget it answers within it once a plan that fits is priced: no plan is priced
    (nor the baseline) that would end past it at the slowest pace so far. ``auto`` runs it as a
    seed in a child process stopped at its share; one that ran past lost every plan (ResNet-101
    / k80-16x4 on a loaded core: planning 2.1 s, eight plans 1.2 s, the baseline 0.2 s, against
    a 3.2 s share; auto then ended at the expert strategy's 86.5 ms instead of 57.1, issue 43)."""
    opts = options or PipelineOptions()
    t0 = time.perf_counter()
    deadline = None if budget is None or budget.seconds is None else t0 + budget.seconds
    cost_model = cost or CostModel()
    plans = plan_pipeline(graph, cluster, cost_model, opts.hardware_aware)
    if not plans:
        raise ValueError(f"no pipeline plan of {graph.name!r} fits on {cluster.name!r}: no layout (tp x pp x dp = "
                         f"{cluster.num_devices} GPUs, micro-batches dividing the batch of {graph.batch_size}) "
                         f"holds its weights, optimizer state and activations in memory")
    best = None
    rows: list[Progress] = []
    tried = 0
    stop = False
    slowest = 0.0  # (s) the slowest plan priced so far

    def late() -> bool:  # (a plan that fits is in hand, and one more would end past the budget)
        return deadline is not None and best is not None and best[0].feasible and \
            time.perf_counter() + slowest > deadline
    for top in plans:
        if tried >= opts.simulate_top or stop:
            break
        priced = 0  # (a plan counts towards simulate_top once any of its variants is priced)
        for plan in top.variants():
            if late():
                stop = True
                break
            t = time.perf_counter()
            try:
                s = build_plan(graph, cluster, plan)
                p = price(graph, s, cluster, cost_model)
            except ValueError:  # (a plan the layout cannot build, or too large to simulate)
                continue
            slowest = max(slowest, time.perf_counter() - t)
            priced += 1
            if best is None or p.cost_s < best[0].cost_s:
                best = (p, s, plan)
            rows.append(Progress(len(rows) + 1, time.perf_counter() - t0, p.cost_s, best[0].cost_s, 1.0, 1,
                                 best=best[1] if best[0].feasible else None))
            if progress is not None and progress(rows[-1]) is False:
                stop = True
                break
        tried += priced > 0
    if best is None or not best[0].feasible:
        raise ValueError(f"none of the best {opts.simulate_top} pipeline plans fits in memory on {cluster.name}")
    p, s, plan = best
    if late():
        baselines, notes = {}, [f"the time budget ended after {len(rows)} plans priced: the data-parallel baseline "
                                "was not priced"]
    else:
        baselines, notes = price_baselines(graph, cluster, cost_model, names=("data-parallel",))
    found_by = {"algorithm": "pipeline", "plan": plan.describe(), "model_cost_s": plan.model_cost_s,
                "options": {"hardware_aware": opts.hardware_aware}, "notes": notes}
    return SearchResult(stamp(s, graph, cluster, found_by, p), p.cost_s, baselines, len(rows),
                        time.perf_counter() - t0, rows, algorithm="pipeline", best_time_s=p.time_s, notes=notes)
