"""Hierarchical prediction of a layout (issue 43): the full simulation's answer from a short
reference run, composed.

A Megatron-shaped layout's pipeline repeats: its middle stages run the same ops on other
devices, its microbatches the same units in the same order. :func:`predict_layout` simulates,
task by task as :func:`engine.sim.report.simulate_strategy` would, a *reference*: the same
layout on the first stage, a middle stage for each place a stage takes in a node, and the
last stage only (the model's layers cut to theirs, :func:`reference_graph`; the cluster to
their nodes) and on the first few microbatches, each still 1/m of the batch. Each unit of the
reference becomes a max-plus block (:mod:`engine.sim.units`) and the whole iteration is laid out from them and simulated
(:mod:`engine.sim.unroll`): the same iteration time as the full simulation (to float
rounding; tests/sim/test_hier.py compares the two on generated layouts). Memory: each stage's
static parts are its reference stage's, and its activation peak follows its schedule order,
one microbatch's saved activations per forward unit, freed by its backward
(:func:`engine.sim.memory.memory_report`'s rule, checked on the reference).

Stages that hold different numbers of layers (an uneven split,
:func:`engine.layout.placement.balanced_layers`, or the layout's own ``layers_per_stage``) are
composed from a reference that keeps a middle stage of each run of equal counts for each place
in a node (:func:`engine.sim.composed.uneven_plan`; one model chunk a stage).

Where the reading would not be exact it says why (:class:`HierProblem`) and the caller runs
the full simulation: a layout with its own stage placement, layers that are not alike, an
uneven split with interleaving, stages that share a node while the reference has fewer
stages, a stage split by pods, activation offload, a unit whose inputs a transfer or a per-iteration
task holds in a way its position class does not share, a queue order on a link that the whole
pipeline reverses (:func:`engine.sim.composed.order_problem`: context parallelism's collectives
and a pipeline transfer on one NIC, their gap drifting each microbatch), and so on. The layout's settings are
checked as :func:`engine.layout.build.build_layout` checks them
(:func:`engine.strategy.checks.settings_problems`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..cluster import Cluster
from ..costs import CostModel
from ..graph import OpGraph
from ..graph.blocks import layer_blocks
from ..layout import Layout, resolved
from ..layout.build import build_layout, build_unchecked
from ..layout.placement import balanced_layers, check_layer_counts
from ..taskgraph import build_task_graph
from .full import simulate
from .steady import repeating, runs_to_try
from .memory import MemoryReport, memory_report
from .memory_floor import MemoryFloor, memory_floor
from .composed_memory import ActivationRuleProblem, composed_memory
from .units import UnitProblem, classify, read_units
from .composed import Geometry, Reference, StagePlan, even_plan, order_problem, uneven_plan
from .positions import NoCounterpart
from .unroll import UnrollProblem, unroll
from .reference import HierProblem, layers_alike, link_stages, reference_cluster, reference_graph, reference_pods

__all__ = ["HierProblem", "HierResult", "predict_layout", "reference_graph", "reference_plan", "reference_run",
           "reference_units", "reference_floor", "REFERENCE_STAGES"]

#: fewest stages a reference keeps (the first, a middle one, the last): a pipeline of more is
#: composed from it. Four (two middle stages) until 2026-11-30: on 1,220 generated layouts
#: three composed as many, every one as exact (``docs/benchmarks``, issue 43's tenth round)
REFERENCE_STAGES = 3
#: most schedule units composed one by one (each a handful of tasks): past it, a pipeline whose
#: composed run does not repeat is left to the full simulation
MAX_UNITS = 1_000_000
#: how far (a share of its iteration) the reference composed from its own blocks may be from
#: its simulation: float rounding only
SELF_CHECK = 1e-12


@dataclass
class HierResult:
    """A hierarchical prediction: ``iteration_time_s``, the per-device ``memory`` report (no
    curves), and how it was made (``reference_stages``, ``reference_microbatches``,
    ``reference_tasks`` simulated task by task, ``composed_tasks`` in the composed run)."""

    iteration_time_s: float
    memory: MemoryReport
    reference_stages: int
    reference_microbatches: int
    reference_tasks: int
    composed_tasks: int

    def describe(self) -> str:
        if not self.composed_tasks:
            return f"simulated whole ({self.reference_tasks:,} tasks): the reference is the whole run"
        return (f"composed from a reference of {self.reference_stages} stages x {self.reference_microbatches} "
                f"microbatches ({self.reference_tasks:,} tasks simulated; {self.composed_tasks:,} in the composed run)")


def _reference_microbatches(pr: int, v: int, m: int) -> int:
    """Microbatches a reference of ``pr`` stages simulates (of the run's ``m``): two rounds of
    ``pr`` interleaved, else ``pr + 2`` (at least 4)."""
    return min(m, 2 * pr if v > 1 else max(pr + 2, 4))


def _reference_stages(p: int, v: int, m: int, stage_gpus: int, gpus_per_node: int, least: int = 0) -> int:
    """Stages the reference keeps: the whole pipeline when it is short; else the first, a
    middle stage for each place a stage can take in a node (one more where a node holds
    several stages: :mod:`engine.sim.unroll` moves a reference stage by whole nodes), and the
    last, in the same place in its node as the whole run's last (and, interleaved, dividing
    the microbatches); ``least`` stages at the least."""
    if stage_gpus % gpus_per_node and gpus_per_node % stage_gpus:
        return p  # (stages that straddle nodes unevenly: no stage stands for another)
    period = max(1, gpus_per_node // stage_gpus)
    tries = range(max(REFERENCE_STAGES, period + 2, least), p)
    for pr in tries:
        if (p - pr) % period == 0 and (v == 1 or m % pr == 0):
            return pr
    return p


def _problem(graph: OpGraph, cluster: Cluster, lay: Layout) -> str | None:
    """Why ``lay`` (resolved) is not read hierarchically here, or None."""
    if lay.stage_mesh is not None:
        return "the layout sets its own stage placement"
    if len(cluster.node_specs) != 1:
        return "the cluster's nodes are not all alike"
    if cluster.pod_gpus and cluster.num_devices > cluster.pod_gpus and cluster.pod_gpus % (lay.tp * lay.cp * lay.dp):
        return (f"a stage of {lay.tp * lay.cp * lay.dp:,} GPUs does not fit the fabric's pods of {cluster.pod_gpus:,} "
                "GPUs (a collective within a stage would cross pods in one stage and not in another)")
    if lay.zero_stage >= 3:
        return "ZeRO-3: each microbatch's parameter gathers wait for nothing and queue on the links from the start"
    if lay.vpp > 1 and lay.pp == 1:
        return "model chunks without pipeline stages"
    blocks = layer_blocks(graph)
    chunks = lay.pp * lay.vpp
    if len(blocks) < chunks:
        return f"{len(blocks)} layers cannot fill {chunks} model chunks"
    if lay.vpp > 1 and len(blocks) % chunks:
        return f"{len(blocks)} layers do not split evenly into {chunks} interleaved model chunks"
    return layers_alike(graph, blocks)


def _chunk_layers(graph: OpGraph, lay: Layout) -> tuple[int, ...]:
    """[model chunk] layers, as the layout's build splits them (:func:`engine.layout.build.build_layout`;
    a ``layers_per_stage`` that does not fit the model raises its ValueError)."""
    n = len(layer_blocks(graph))
    if lay.layers_per_stage is not None and lay.vpp == 1:
        check_layer_counts(lay.layers_per_stage, lay.pp, n)
        return tuple(lay.layers_per_stage)
    return tuple(balanced_layers(n, lay.pp * lay.vpp))


def reference_plan(graph: OpGraph, cluster: Cluster, lay: Layout) -> StagePlan:
    """Which stages the reference of ``lay`` (resolved) keeps and what each stands for: where
    the middle stages hold as many layers, :func:`_reference_stages`; where they do not (one
    model chunk a stage), one of each run of equal counts for each place in a node
    (:func:`engine.sim.composed.uneven_plan`); the whole pipeline where that would not be
    shorter."""
    p, v = lay.pp, lay.vpp
    stage_gpus, G = lay.tp * lay.cp * lay.dp, cluster.gpus_per_node
    counts = _chunk_layers(graph, lay)
    period = max(1, G // stage_gpus)
    if v > 1 or len(set(counts)) == 1:  # (an uneven split with interleaving: refused by _problem)
        pr = _reference_stages(p, v, graph.batch_size // (lay.dp * lay.micro_batch), stage_gpus, G)
        return even_plan(p, pr, period, counts)
    plan = None if stage_gpus % G and G % stage_gpus else uneven_plan(counts, period)
    return plan if plan is not None and len(plan.stages) < p else even_plan(p, p, 1, counts)


def reference_run(graph: OpGraph, cluster: Cluster, lay: Layout, plan: StagePlan | None = None,
                  cost: CostModel | None = None) -> tuple:
    """The reference of ``lay`` (resolved) that ``plan`` (default :func:`reference_plan`)
    describes, simulated task by task: (its stages, its microbatches, its graph, cluster and
    strategy, task graph, timeline). A model cut shorter (as ``benchmarks/hier_layer_steps.py``
    does) stands for stages of fewer layers."""
    plan = plan if plan is not None else reference_plan(graph, cluster, lay)
    pr = len(plan.stages)
    g_ref, c_ref, s_ref = _reference_strategy(graph, cluster, lay, plan)
    mr = _reference_microbatches(pr, lay.vpp, s_ref.pipeline.microbatches)
    tg = build_task_graph(g_ref, s_ref, c_ref, cost, microbatches=mr)
    return pr, mr, g_ref, c_ref, s_ref, tg, simulate(tg)


def _reference_strategy(graph: OpGraph, cluster: Cluster, lay: Layout, plan: StagePlan) -> tuple:
    """(graph, cluster, strategy) of the reference ``plan`` describes (the layout's own where it
    keeps every stage); the layout's settings checked as :func:`build_layout` checks them. The
    last one made is kept: a sweep reads a point's memory floor off it
    (:func:`reference_floor`), then predicts the point from the same reference."""
    key = (lay, len(plan.stages), plan.counts, plan.ref_counts)
    with _LAST_LOCK:
        last = _LAST_REFERENCE[0] if _LAST_REFERENCE else None
    if last is not None and last[0] is graph and last[1] is cluster and last[2] == key:
        return last[3]
    made = _made_reference(graph, cluster, lay, plan)
    with _LAST_LOCK:
        _LAST_REFERENCE[:] = [(graph, cluster, key, made)]
    return made


#: [(graph, cluster, key, what :func:`_reference_strategy` returned)]: the last one made
_LAST_REFERENCE: list[tuple] = []
_LAST_LOCK = threading.Lock()


def _made_reference(graph: OpGraph, cluster: Cluster, lay: Layout, plan: StagePlan) -> tuple:
    """:func:`_reference_strategy`'s reference, made."""
    p, pr = lay.pp, len(plan.stages)
    stage_gpus = lay.tp * lay.cp * lay.dp
    if pr == p:
        return graph, cluster, build_layout(graph, cluster, lay)
    g_ref = reference_graph(graph, sum(plan.ref_counts))
    c_ref = reference_cluster(cluster, -(-pr * stage_gpus // cluster.gpus_per_node),
                               reference_pods(cluster, p, stage_gpus))
    split = None if len(set(plan.counts)) == 1 else plan.ref_counts
    s_ref = build_unchecked(g_ref, c_ref, replace(lay, pp=pr, layers_per_stage=split), check_settings=True)
    return g_ref, c_ref, s_ref


def reference_floor(graph: OpGraph, cluster: Cluster, layout: Layout) -> MemoryFloor | None:
    """The floor under ``layout``'s memory (:func:`engine.sim.memory_floor.memory_floor`) read
    off its reference's strategy, none of it built or simulated: each reference stage's GPUs
    hold what the real stages it stands for hold (the composed prediction's own reading,
    :func:`engine.sim.composed_memory.composed_memory`), and their activations are counted in
    the schedule of the earliest of those stages, which runs the most forwards before its first
    backward; ``gpus`` names the real GPUs. None where the composed prediction does not read the
    layout (:func:`predict_layout`'s refusals before its reference run).

    Raises
    ------
    ValueError
        When the layout cannot be built on the cluster (as :func:`engine.layout.build.build_layout`).
    """
    lay = resolved(layout, graph, cluster)
    _chunk_layers(graph, lay)
    if _problem(graph, cluster, lay):
        return None
    plan = reference_plan(graph, cluster, lay)
    g_ref, c_ref, s_ref = _reference_strategy(graph, cluster, lay, plan)
    stage_gpus = lay.tp * lay.cp * lay.dp
    real = []
    for i, stage in enumerate(plan.stages):
        real.append(min([stage] + [int(s) for s in np.nonzero(plan.rep == i)[0]]))
    gpus = np.arange(c_ref.num_devices)
    kept = len(plan.stages) * stage_gpus
    gpus[:kept] = np.repeat(np.asarray(real, np.int64), stage_gpus) * stage_gpus + gpus[:kept] % stage_gpus
    return replace(memory_floor(g_ref, s_ref, c_ref, [(lay.pp, s) for s in real]), gpus=gpus)


def reference_units(g_ref: OpGraph, s_ref: Any, tg: Any, tl: Any, mr: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """([op] model chunk, [task] unit (:func:`engine.sim.units.classify`), the units' blocks
    (:func:`engine.sim.units.read_units`)) of a reference run; raises
    :class:`~engine.sim.units.UnitProblem` where the reading does not apply."""
    chunk_of = np.array([s_ref.stage_of.get(op.name, 0) for op in g_ref.ops], np.int64)
    unit = classify(tg, chunk_of, mr)
    return chunk_of, unit, read_units(tg, tl.order, unit, tl.end_s, tl.extra["ready_s"])


def predict_layout(graph: OpGraph, cluster: Cluster, layout: Layout, cost: CostModel | None = None) -> HierResult:
    """The iteration time and memory of ``layout`` as the full simulation gives them, from a
    reference run (module docstring).

    Raises
    ------
    ValueError
        When the layout cannot be built on the cluster (as :func:`engine.layout.build.build_layout`).
    HierProblem
        When the prediction would not be exact; the message says why.
    """
    lay = resolved(layout, graph, cluster)
    _chunk_layers(graph, lay)  # (a layers_per_stage that does not fit: the build's ValueError, first)
    why = _problem(graph, cluster, lay)
    if why:
        raise HierProblem(why)
    plan = reference_plan(graph, cluster, lay)
    try:
        return _composed(graph, cluster, lay, plan, cost)
    except _Longer:  # (the fine position classes need more of a stage's warm-up: one more try)
        longer = _longer_plan(graph, cluster, lay, plan)
        if longer is None:
            raise HierProblem("a unit's place in its stage's schedule has no counterpart in the reference") from None
        try:
            return _composed(graph, cluster, lay, longer, cost)
        except _Longer as e:
            raise HierProblem(str(e)) from None


class _Longer(HierProblem):
    """A unit's position class is not among the reference's (:class:`engine.sim.positions.NoCounterpart`)."""


def _longer_plan(graph: OpGraph, cluster: Cluster, lay: Layout, plan: StagePlan) -> StagePlan | None:
    """The plan of the next reference that keeps two stages more (the whole pipeline at most),
    for a pipeline whose middle stages hold as many layers; None otherwise."""
    p, pr = lay.pp, len(plan.stages)
    if len(set(plan.counts)) > 1 or pr >= p:
        return None
    stage_gpus = lay.tp * lay.cp * lay.dp
    m = graph.batch_size // (lay.dp * lay.micro_batch)
    more = _reference_stages(p, lay.vpp, m, stage_gpus, cluster.gpus_per_node, least=pr + 2)
    return even_plan(p, more, max(1, cluster.gpus_per_node // stage_gpus), plan.counts)


def _composed(graph: OpGraph, cluster: Cluster, lay: Layout, plan: StagePlan, cost: CostModel | None) -> HierResult:
    """:func:`predict_layout` from the reference ``plan`` describes."""
    p, v = lay.pp, lay.vpp
    blocks = layer_blocks(graph)
    stage_gpus = lay.tp * lay.cp * lay.dp
    G = cluster.gpus_per_node
    pr, mr, g_ref, c_ref, s_ref, tg, tl = reference_run(graph, cluster, lay, plan, cost)
    m = s_ref.pipeline.microbatches
    if pr == p and mr == m:  # (the reference is the whole run: its simulation is the answer)
        return HierResult(tl.makespan_s, memory_report(g_ref, s_ref, c_ref, tl), pr, mr, tg.num_tasks, 0)
    try:
        chunk_of, unit, units = reference_units(g_ref, s_ref, tg, tl, mr)
        links_per_node = len(c_ref.links) // max(1, c_ref.num_nodes)
        ref = Reference(tg, unit, units, pr, v, mr, s_ref.pipeline.schedule,
                        Geometry(G, links_per_node, stage_gpus, link_stages(c_ref, stage_gpus)),
                        **_numbering(g_ref, chunk_of, plan, len(blocks)), fine_classes=len(set(plan.counts)) == 1)
        # the reference composed from its own blocks must give the reference's own time: what the
        # reading cannot see (a task whose place in a queue its block moves) shows here
        own = simulate(unroll(ref, pr, mr, c_ref.num_devices, len(c_ref.links))).makespan_s
        if abs(own - tl.makespan_s) > SELF_CHECK * tl.makespan_s:
            raise HierProblem(f"the reference composed from its blocks takes {own * 1e3:.6f} ms, not its "
                              f"{tl.makespan_s * 1e3:.6f} ms (a queue its blocks do not keep in order)")
        iteration, composed = _compose(ref, p, v, m, cluster)
    except (UnitProblem, UnrollProblem) as e:
        raise (_Longer if isinstance(e.__cause__, NoCounterpart) else HierProblem)(str(e)) from None
    try:
        mem = composed_memory(g_ref, s_ref, c_ref, tl, unit, ref, cluster, p, m, stage_gpus)
    except ActivationRuleProblem as e:
        raise HierProblem(str(e)) from None
    return HierResult(iteration, mem, pr, mr, tg.num_tasks, composed)


def _compose(ref: Reference, p: int, v: int, m: int, cluster: Cluster) -> tuple[float, int]:
    """(iteration s, tasks simulated) of the whole run composed from ``ref``: a long pipeline's
    first few microbatches and its steady state extrapolated where the composed run is checked
    to repeat (:func:`engine.sim.steady.repeating`, the rule :mod:`engine.sim.steady` applies to
    the full simulation), else every microbatch."""
    D, L = cluster.num_devices, len(cluster.links)
    built = 0
    for n, q in runs_to_try(p, v, ref.schedule, m):
        if n < ref.microbatches:
            continue
        if n != built:  # (a run checked for two periods is composed once)
            built = n
            short = unroll(ref, p, n, D, L)
            tl = _checked(short, simulate(short))
        found = repeating(short, tl, n, p, q)
        if found is not None:
            return tl.makespan_s + (m - n) // q * found[2], short.num_tasks
    if 2 * p * v * m > MAX_UNITS:
        raise HierProblem(f"{2 * p * v * m:,} schedule units that do not reach a steady state (at most {MAX_UNITS:,} "
                          "are composed one by one)")
    whole = unroll(ref, p, m, D, L)
    return _checked(whole, simulate(whole)).makespan_s, whole.num_tasks


def _checked(tg: Any, tl: Any) -> Any:
    """``tl``, the simulation of composed run ``tg``, where every queue order its blocks assume
    holds in it (:func:`engine.sim.composed.order_problem`); else :class:`HierProblem`."""
    why = order_problem(tg, tl.start_s, tl.end_s)
    if why:
        raise HierProblem(why)
    return tl


def _numbering(g_ref: OpGraph, chunk_of: np.ndarray, plan: StagePlan, layers: int) -> dict[str, Any]:
    """How the reference's ops sit in the whole model (:class:`engine.sim.unroll.Reference`)."""
    blocks = layer_blocks(g_ref)
    inside = np.array([op.block in set(blocks) for op in g_ref.ops])
    first = int(np.argmax(inside)) if inside.any() else len(g_ref.ops)
    place = np.where(inside, 1, np.where(np.arange(len(g_ref.ops)) < first, 0, 2))
    per = int(inside.sum()) // max(1, len(blocks))

    def starts(counts: tuple[int, ...]) -> np.ndarray:
        return np.cumsum((0, *counts))[:-1].astype(np.int64)

    return dict(op_chunk=chunk_of, op_place=place, ops_per_layer=per, first_layer_ref=starts(plan.ref_counts),
                first_layer=starts(plan.counts), ref_layers=len(blocks), layers=layers, stage_rep=plan.rep,
                ref_class=plan.ref_class)
