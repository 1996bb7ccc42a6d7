"""What a failure costs (``soapbox whatif``): a cluster without a failed GPU, node or network
link, or with one GPU slowed down, and the strategy (a) mapped onto the survivors by the rule
of its layout and (b) re-planned by the search; and goodput over a job with checkpoints.

Mapping onto survivors (a), by the strategy's shape:

* data parallel: over the largest number of surviving GPUs that divides the batch (the rule
  :func:`engine.search.baselines.data_parallel` applies to any cluster: 16 GPUs minus one
  give 8 for a batch of 64);
* FlexFlow's expert strategy: rebuilt by its rule on the survivors;
* a Megatron-shaped layout (:func:`engine.export.infer_layout`): the same tensor, pipeline
  and context degrees, micro-batch and settings, data parallelism shrunk to the largest degree
  the survivors hold that divides the batch (more microbatches keep the global batch), stages
  on consecutive survivors; the same expert-parallel degrees ep and etp, or, when ep no longer
  folds onto the smaller mesh (:func:`engine.moe.moe_layout_problem`), the largest ep below it
  that does (the rule says so);
* any other (per-op) strategy has no such rule: only the re-plan is given.

The re-plan (b), :func:`replan`, starts the search from the mapped layout and prices its plan
as the mapped layout is priced (slowed GPUs and the routing what-if included); a plan that
does not fit or is slower is not offered: the mapped layout is kept when it fits, and nothing
when neither fits (``soapbox whatif`` then exits with status 3 and writes no ``-o``).

A mixture-of-experts strategy's routing what-if (``expert_loads``) is carried onto the mapped
strategy.

A failed NIC link takes one NIC from its node (the node's GPUs share the rest); a slowed GPU
keeps the strategy and runs its compute at the given fraction of its speed.

Goodput: job MTBF M = per-GPU MTBF / GPUs (independent failures); checkpoint write time
delta = checkpoint bytes / storage bandwidth; the optimum checkpoint interval by Young
(Commun. ACM 17(9), 1974: tau = sqrt(2 delta M)) and by Daly's higher-order estimate
(Future Gener. Comput. Syst. 22(3), 2006, eq. 37: tau = sqrt(2 delta M) [1 + sqrt(delta / (2M)) / 3
+ delta / (18 M)] - delta for delta < 2M, else M); the expected share of time lost at
interval tau (Daly's first-order model): delta / (tau + delta) for writing checkpoints, plus
(tau + delta) / (2 M) of recomputed work and R / M of restarts (R: restart time).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from ..cluster import Cluster, NodeSpec
from ..costs import CostModel
from ..graph import OpGraph
from ..sim.memory_static import optimizer_bytes_per_param
from ..ops import DTYPE_BYTES
from ..strategy import Strategy

#: per-GPU mean time between failures (hours): Llama 3's 54-day pre-training on 16,384 H100s
#: saw 419 unexpected interruptions (Dubey et al. 2024, §3.3.4), one every 3.1 h, i.e. about
#: 50,000 GPU-hours per failure
DEFAULT_MTBF_GPU_HOURS = 50_000.0

__all__ = ["DEFAULT_MTBF_GPU_HOURS", "Failure", "parse_failure", "survivors", "map_strategy", "young_interval_s",
           "daly_interval_s", "goodput", "simulate_with_slow", "checkpoint_bytes", "Replan", "replan",
           "parse_replan_budget"]

_SPEC = re.compile(r"^(gpu|node|link):(.+)$")


@dataclass(frozen=True)
class Failure:
    """``kind`` gpu / node / link / slow; ``target`` a device or node index, or a NIC name
    (``dgx0/nic3``); ``factor`` the speed a slowed GPU keeps (0 < factor <= 1)."""

    kind: str
    target: Any
    factor: float = 1.0


def parse_failure(text: str, slow: bool = False) -> Failure:
    """``gpu:3``, ``node:1``, ``link:dgx0/nic3``; with ``slow``, ``gpu:5=0.7``."""
    text = str(text).strip()
    if slow:
        m = re.fullmatch(r"gpu:([0-9]{1,9})=([0-9]{0,20}\.?[0-9]{1,20}|[0-9]{1,20}\.)", text)
        if not m or not 0 < float(m.group(2)) <= 1:
            raise ValueError(f"--slow {text[:60]!r}: expected gpu:N=F with 0 < F <= 1 (the speed it keeps)")
        return Failure("slow", int(m.group(1)), float(m.group(2)))
    m = _SPEC.match(text)
    if not m:
        raise ValueError(f"--fail {text[:60]!r}: expected gpu:N, node:N or link:NODE/nicK")
    kind, target = m.group(1), m.group(2)
    if kind in ("gpu", "node"):
        if not (target.isascii() and target.isdigit() and len(target) <= 9):
            raise ValueError(f"--fail {text[:60]!r}: {kind} index must be a whole number")
        return Failure(kind, int(target))
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+/nic\d+", target):
        raise ValueError(f"--fail {text[:60]!r}: a link is named NODE/nicK (a node's network interface, e.g. "
                         "dgx0/nic3)")
    return Failure("link", target)


def survivors(cluster: Cluster, failures: list[Failure]) -> tuple[Cluster, list[int]]:
    """The cluster without the failed GPUs, nodes and NICs, and each surviving device's index
    in the original cluster (slowed GPUs are not failures: they stay). An oversubscribed pod
    tier (``Cluster.pod_gpus``) is not kept: the survivors' nodes no longer tile the pods, so
    their fabric is taken as non-blocking (optimistic for collectives across pods)."""
    nodes: list[NodeSpec] = []
    names: list[str] = []
    for spec in cluster.node_specs:
        for r in range(spec.repeat):
            nodes.append(replace(spec, repeat=1))
            names.append(f"{spec.name}{r}" if spec.repeat > 1 else spec.name)
    dead_gpus = {f.target for f in failures if f.kind == "gpu"}
    dead_nodes = {f.target for f in failures if f.kind == "node"}
    lost_nics: dict[int, int] = {}
    n = cluster.num_devices
    for f in failures:
        if f.kind == "gpu" and not 0 <= f.target < n:
            raise ValueError(f"--fail gpu:{f.target}: {cluster.name} has GPUs 0..{n - 1}")
        if f.kind == "node" and not 0 <= f.target < len(nodes):
            raise ValueError(f"--fail node:{f.target}: {cluster.name} has nodes 0..{len(nodes) - 1}")
        if f.kind == "link":
            node_name, _, nic = f.target.partition("/")
            if node_name not in names or int(nic[3:]) >= nodes[names.index(node_name)].nics or len(nodes) < 2:
                raise ValueError(f"--fail link:{f.target}: no such network interface in {cluster.name} (nodes "
                                 f"{', '.join(names[:4])}{'...' if len(names) > 4 else ''}, each with "
                                 f"{nodes[0].nics} NICs{'; one node has no network links' if len(nodes) < 2 else ''})")
            k = names.index(node_name)
            lost_nics[k] = lost_nics.get(k, 0) + 1
    kept_specs: list[NodeSpec] = []
    kept_ids: list[int] = []
    first = 0
    for k, spec in enumerate(nodes):
        ids = list(range(first, first + spec.gpus))
        first += spec.gpus
        alive = [d for d in ids if d not in dead_gpus]
        nics = spec.nics - lost_nics.get(k, 0)
        if k in dead_nodes or not alive or nics < 1:
            continue
        kept_specs.append(replace(spec, gpus=len(alive), nics=min(nics, len(alive))))
        kept_ids += alive
    if not kept_specs:
        raise ValueError("no GPU survives")
    merged: list[NodeSpec] = []
    for spec in kept_specs:  # consecutive identical nodes become one spec again (one spec: symmetry holds)
        if merged and replace(merged[-1], repeat=1, name=spec.name) == spec:
            merged[-1] = replace(merged[-1], repeat=merged[-1].repeat + 1)
        else:
            merged.append(spec)
    merged = [replace(m, name=m.name if k == 0 else f"{m.name}-{k}") for k, m in enumerate(merged)]
    what = ", ".join(f"{f.kind} {f.target}" for f in failures if f.kind != "slow")
    return Cluster(f"{cluster.name} without {what}"[:200], merged, cluster.device_types,
                   f"{cluster.name} after failures"), kept_ids


def map_strategy(graph: OpGraph, strategy: Strategy, cluster: Cluster, after: Cluster) -> tuple[Strategy | None, str]:
    """The strategy mapped onto the survivors by its layout's rule, and the rule used (or None
    and why there is none)."""
    from ..errors import ValidationError
    from ..layout import micro_batch_sizes
    from ..layout.build import build_layout
    from ..search.baselines import data_parallel, expert

    def carried(s: Strategy) -> Strategy:  # (the routing what-if travels with the strategy)
        return replace(s, expert_loads=strategy.expert_loads) if strategy.expert_loads is not None else s

    dp = data_parallel(graph, cluster)
    # (FSDP / ZeRO and recomputation share data parallel's configs: their settings take the
    # layout rule below, which carries them)
    if dict(strategy.configs) == dict(dp.configs) and _settings(strategy) == _settings(dp):
        s = data_parallel(graph, after)
        return carried(s), f"data parallel over {len(s.devices_used())} GPUs (the largest count dividing the batch)"
    try:
        if dict(strategy.configs) == dict(expert(graph, cluster).configs):
            return carried(expert(graph, after)), "FlexFlow's expert strategy rebuilt on the survivors"
    except ValueError:
        pass
    try:
        lay = _layout_of(graph, strategy, cluster)
    except (ValidationError, ValueError):
        return None, "a per-op strategy has no rule to map it onto fewer GPUs: re-planned only"
    fixed = lay.tp * lay.pp * lay.cp
    batch = graph.batch_size
    # the largest replica count the survivors hold whose replicas split the batch into the
    # layout's micro-batches (engine.layout's micro-batch rule; more microbatches keep the batch)
    dp = next((d for d in range(after.num_devices // fixed, 0, -1)
               if lay.micro_batch in micro_batch_sizes(batch, d, max_per_stage=None)), 0)
    if dp == 0:
        return None, (f"tp {lay.tp} x pp {lay.pp} x cp {lay.cp} = {fixed} GPUs a replica: the {after.num_devices} "
                      "survivors hold no replica that divides the batch")
    ep, ep_note = _mapped_ep(graph, lay, dp)
    if ep is None:
        return None, ep_note
    new = replace(lay, dp=dp, ep=ep, layers_per_stage=lay.layers_per_stage)
    try:
        s = build_layout(graph, after, new)
    except ValueError as e:
        return None, f"the layout does not fit the survivors: {e}"
    moe = f", ep {lay.ep}" + (f", etp {lay.etp}" if lay.etp > 1 else "") if lay.ep * lay.etp > 1 else ""
    return carried(s), (f"the same layout (tp {lay.tp}, pp {lay.pp}, cp {lay.cp}{moe}, micro-batch {lay.micro_batch}) "
                        f"with dp {lay.dp} -> {dp} ({fixed * dp} GPUs){ep_note}")


def _settings(s: Strategy) -> dict[str, Any]:
    """A strategy's settings that span ops (ZeRO stage, recomputation, microbatches, ...): every
    field but its configs, its labels and the routing what-if."""
    skip = {"configs", "stage_of", "model_name", "model_fingerprint", "cluster_name", "cluster_devices", "found_by",
            "cost", "expert_loads"}
    return {f.name: getattr(s, f.name) for f in fields(s) if f.name not in skip}


def _layout_of(graph: OpGraph, strategy: Strategy, cluster: Cluster):
    """The Megatron-shaped layout ``strategy`` is (:func:`engine.export.infer_layout`) with
    its expert-parallel degrees: infer_layout reads the dense ops, on a copy of the strategy
    whose experts ops are laid out as their routers (an experts op's config without expert
    parallelism is its router's); ep and etp come from the experts ops
    (:func:`engine.moe.expert_degrees`), and the layout with them must rebuild those ops.

    Raises
    ------
    ValueError, ValidationError
        When no layout explains the strategy."""
    from ..export import infer_layout
    from ..moe import expert_degrees
    from ..layout.build import build_layout

    ep, etp = expert_degrees(graph, strategy)
    if ep * etp == 1:
        return infer_layout(graph, strategy, cluster)
    experts = [op for op in graph.ops if op.kind == "experts"]
    probe = dict(strategy.configs)
    for op in experts:
        router = next((o for o in graph.ops if o.kind == "router" and o.block == op.block), None)
        if router is None:
            raise ValueError(f"experts op {op.name!r} has no router in its block")
        probe[op.name] = strategy.configs[router.name]
    lay = replace(infer_layout(graph, replace(strategy, configs=probe), cluster), ep=ep, etp=etp)
    rebuilt = build_layout(graph, cluster, lay)
    if any(rebuilt.configs[op.name] != strategy.configs[op.name] for op in experts):
        raise ValueError("the experts ops' splits are not those of the layout's ep and etp")
    return lay


def _mapped_ep(graph: OpGraph, lay, dp: int) -> tuple[int | None, str]:
    """(ep, note): the layout's ep when it still folds onto dp data-parallel ranks, else the
    largest smaller ep that does, with a note saying so; (None, why) when none does."""
    from ..moe import moe_layout_problem

    def problem(ep: int) -> str | None:
        return moe_layout_problem(graph, lay.tp, lay.cp, dp, ep, lay.etp, lay.sequence_parallel)

    if lay.ep * lay.etp == 1:
        return lay.ep, ""
    why = problem(lay.ep)
    if why is None:
        return lay.ep, ""
    ep = next((e for e in range(lay.ep - 1, 0, -1) if problem(e) is None), None)
    if ep is None:
        return None, f"ep {lay.ep} no longer folds onto dp {dp} ({why}), nor does any smaller ep: re-planned only"
    return ep, f"; ep {lay.ep} -> {ep}, the largest that folds onto dp {dp} ({why})"


def simulate_with_slow(graph: OpGraph, strategy: Strategy, cluster: Cluster, slow: list[Failure],
                       cost: CostModel | None = None):
    """(timeline, memory report) with each slowed GPU's compute tasks stretched by 1 / factor
    (a full simulation: a slow GPU breaks the replicas' symmetry). Without a slow GPU, the
    engine's entry point (:func:`engine.sim.report.simulate_strategy`, with symmetry)."""
    from ..sim.memory import memory_report
    from ..sim.report import simulate_strategy
    from ..sim.full import simulate
    from ..taskgraph import BWD, FWD, UPDATE, build_task_graph

    if not slow:
        r = simulate_strategy(graph, strategy, cluster, cost, check=False)
        return r.timeline, r.memory
    # (durations are edited between the build and the simulation: the entry point has no such step)
    tg = build_task_graph(graph, strategy, cluster, cost, symmetry="off")
    compute = (tg.kind == FWD) | (tg.kind == BWD) | (tg.kind == UPDATE)
    for f in slow:
        if not 0 <= f.target < cluster.num_devices:
            raise ValueError(f"--slow gpu:{f.target}: {cluster.name} has GPUs 0..{cluster.num_devices - 1}")
        sel = compute & (tg.device == f.target)
        tg.dur_s[sel] = tg.dur_s[sel] / f.factor
    tl = simulate(tg)
    return tl, memory_report(graph, strategy, cluster, tl)


@dataclass(frozen=True)
class Replan:
    """What the re-plan offers: ``strategy`` (None when nothing fits), which it is (``kept``:
    ``search``, the search's plan; ``mapped``, the mapped layout, when the search found nothing
    better that fits; ``none``), its iteration time (s) and fit priced as the mapped layout is
    (slowed GPUs and the routing what-if included), the search's time (s) and a line saying
    what was decided."""

    strategy: Strategy | None
    kept: str
    iteration_time_s: float | None
    feasible: bool
    search_s: float
    note: str
    source: str | None = None  # which of auto's parts found the search's plan


def parse_replan_budget(text: str) -> Any:
    """The re-plan's budget: ``None`` for a zero budget (``0``, ``0s``, ``0.0m``: no re-plan
    is asked for), else :meth:`engine.search.Budget.parse` of ``text`` (proposals or a time).

    >>> parse_replan_budget("0.0m") is None, parse_replan_budget("2s")
    (True, Budget(iterations=None, seconds=2.0))

    Raises ``ValueError`` (one line naming ``--budget``) for text that is neither.
    """
    from ..search import Budget

    if re.fullmatch(r"\s*0+(?:\.0*)?\s*[smh]?\s*", str(text)[:1000]):
        return None
    try:
        return Budget.parse(text)
    except ValueError as e:
        raise ValueError(f"--{e}") from None


def replan(graph: OpGraph, after: Cluster, mapped: Strategy | None, slow: list[Failure], budget: Any,
           expert_loads: Any = None, search: Any = None, mapped_priced: tuple[float, bool] | None = None) -> Replan:
    """Re-plan on the survivors ``after``, seeded with the ``mapped`` layout, and never offer a
    plan that is slower than it or does not fit.

    The search (``search``, default :data:`engine.search.ALGORITHMS` ``["auto"]``) starts from
    ``mapped`` (auto prices it with its baselines, and MCMC starts from it when it is the best
    of them). Its plan is then priced as the mapped layout is, by :func:`simulate_with_slow`
    with the slowed GPUs ``slow`` and the routing what-if ``expert_loads`` (the search prices
    balanced routing at full speed, and a search under load may stop early): the plan is kept
    only when it fits and is no slower than the mapped layout; otherwise the mapped layout is
    kept when it fits, and nothing when neither fits. ``mapped_priced``: the mapped layout's
    (iteration time in s, fits) when the caller has simulated it so already.
    """
    if search is None:
        from ..search import ALGORITHMS

        search = ALGORITHMS["auto"].run
    r = search(graph, after, budget, seed=0, initial=mapped)
    plan = r.best if expert_loads is None else replace(r.best, expert_loads=expert_loads)
    tl, mem = simulate_with_slow(graph, plan, after, slow)
    plan_s, plan_fits = tl.makespan_s, bool(mem.feasible)
    mapped_s, mapped_fits = None, False
    if mapped is not None and mapped_priced is not None:
        mapped_s, mapped_fits = mapped_priced
    elif mapped is not None:
        mtl, mmem = simulate_with_slow(graph, mapped, after, slow)
        mapped_s, mapped_fits = mtl.makespan_s, bool(mmem.feasible)
    source = r.best.found_by.get("source")
    what = f"{plan_s * 1e3:,.1f} ms" if plan_fits else f"{plan_s * 1e3:,.1f} ms, does not fit in memory"
    if plan_fits and (not mapped_fits or plan_s <= mapped_s):
        return Replan(plan, "search", plan_s, True, r.elapsed_s, f"the search's plan ({what}, from {source})", source)
    if mapped_fits:
        return Replan(mapped, "mapped", mapped_s, True, r.elapsed_s,
                      f"the mapped layout is kept: the search's best ({what}) is not better", source)
    return Replan(None, "none", plan_s, False, r.elapsed_s,
                  "nothing fits in memory on the survivors: neither the mapped layout "
                  f"{'(none)' if mapped is None else f'({mapped_s * 1e3:,.1f} ms)'} nor the search's best ({what})",
                  source)


def checkpoint_bytes(graph: OpGraph) -> float:
    """Weights in the training precision plus the optimizer state (Adam's moments and, in mixed
    precision, the fp32 master weights): what a restart needs (12 bytes a parameter in fp32,
    14 in mixed precision)."""
    return float(graph.param_count) * (optimizer_bytes_per_param(graph.precision) + DTYPE_BYTES[graph.precision])


def young_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Young 1974: sqrt(2 delta M)."""
    return math.sqrt(2.0 * delta_s * mtbf_s)


def daly_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Daly 2006, eq. 37: sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta
    when delta < 2M, else M."""
    if delta_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = delta_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * delta_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta_s


def goodput(iteration_s: float, gpus: int, mtbf_gpu_s: float, ckpt_bytes: float, storage_bw: float,
            restart_s: float) -> dict[str, float]:
    """The checkpoint interval (Daly; a whole number of iterations) and the expected share of
    time that does useful work."""
    mtbf = mtbf_gpu_s / gpus
    delta = ckpt_bytes / storage_bw
    tau = daly_interval_s(delta, mtbf)
    iters = max(1, round(tau / iteration_s)) if iteration_s > 0 else 1
    tau = iters * iteration_s
    lost = delta / (tau + delta) + (tau + delta) / (2.0 * mtbf) + restart_s / mtbf
    return {"job_mtbf_s": mtbf, "checkpoint_write_s": delta, "young_interval_s": young_interval_s(delta, mtbf),
            "daly_interval_s": daly_interval_s(delta, mtbf), "checkpoint_every_iterations": iters,
            "share_lost": min(1.0, lost), "goodput": max(0.0, 1.0 - lost)}
