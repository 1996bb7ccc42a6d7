"""A floor under a strategy's memory, from its configs and its pipeline schedule alone: no task
graph, no simulation (issue 43: a co-design sweep skips simulating layouts that cannot fit).

:func:`engine.sim.memory.memory_report` decides out of memory on ``required_bytes`` = the
allocated peak + the CUDA context, per device, where the allocated peak adds the weights,
gradients, optimizer state and communication buffers, the activations' peak over the timeline,
ZeRO-3's gathered units and the loss's fp32 logits. Every part is at least zero, so any of them
summed is a floor under it. :func:`memory_floor` sums, with the report's own functions:

* the weights, gradients and optimizer state, ZeRO-3's gathered units and the logits buffer
  (:func:`engine.sim.memory_static.state_memory`, :func:`~engine.sim.memory_static.logits_bytes`:
  the report's static parts but the communication buffers, which need the task graph's
  collectives);
* the CUDA context and cuBLAS workspace of every GPU the strategy uses (its NCCL buffers, which
  grow with the communicators it joins, left out);
* the activations the device holds when its first backward unit begins. Every device runs its
  stage's schedule units in order, held to it by a barrier between consecutive units that waits
  for the unit's sink tasks on that device (ops with no consumer in their model chunk;
  :class:`engine.taskgraph.schedule.SchedulePlan`), so every forward unit before the stage's
  first backward (:func:`engine.taskgraph.schedule.unit_order`: 1F1B's ``p - stage`` on
  stage ``stage``, every microbatch under GPipe; with one stage forward and backward alternate,
  one unit) has ended before any backward task starts, for the ops that feed the sinks; the
  report allocates an op partition's saved activations
  (:func:`engine.strategy.activations.saved_bytes`) when its forward task ends and frees them
  when its backward task ends, so none of them is freed yet. Counted: one forward task per op
  partition per unit (recomputed forwards allocate more; left out), for the ops the argument
  covers (:func:`_held_ops`: every sink of the op's chunk on every GPU of the chunk, and the
  op feeding each of them; Megatron-shaped layouts, whose stages end in one op on all their
  GPUs, are covered whole). With one stage and one microbatch no barrier orders anything: every
  backward task still descends from some sink's forward, which a covered op feeds, so the
  covered ops are held by data alone; a model with several losses (FlexFlow's NMT, 40) keeps
  only what every loss reads (counting every step, a review found the floor 4x over the peak
  there: the first loss's backward runs while later steps still run forward). None with
  activation offload (the saved activations leave the GPU before then).

So ``floor <= required_bytes`` on every device, whatever the timeline
(``tests/sim/test_memory_floor.py`` checks it against the report on generated layouts), and a
device whose floor passes its capacity does not fit, as the simulation would find. Host memory:
the offloaded optimizer state and parameters (``state_memory``'s host part) against the host memory
each GPU has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..graph import OpGraph
from ..strategy import Strategy
from ..strategy.activations import offloaded_layers, saved_bytes
from ..taskgraph.schedule import unit_order
from ..taskgraph.tasks import BWD
from .memory_static import (CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, graph_cache, host_capacity, logits_bytes,
                            state_memory)

__all__ = ["MemoryFloor", "memory_floor"]


@dataclass
class MemoryFloor:
    """Per device [device] bytes under :attr:`engine.sim.memory.MemoryReport.required_bytes`
    (``required_bytes``: the sum of the parts) and its capacity; the host's part and capacity."""

    weights_bytes: np.ndarray
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activations_bytes: np.ndarray
    gathered_bytes: np.ndarray
    logits_bytes: np.ndarray
    context_bytes: np.ndarray
    capacity_bytes: np.ndarray
    host_bytes: np.ndarray
    host_capacity_bytes: np.ndarray
    #: [device] the GPU of the whole run each stands for (a composed prediction's reference,
    #: :func:`engine.sim.hier.reference_floor`); None: itself
    gpus: np.ndarray | None = None

    @property
    def required_bytes(self) -> np.ndarray:
        """[device] bytes at least that must fit (added in the report's order)."""
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.gathered_bytes + self.logits_bytes + self.context_bytes)

    @property
    def fits(self) -> bool:
        """False when some device (or its host) is sure not to fit; True says only that the
        floor does (the simulation decides)."""
        return bool(np.all(self.required_bytes <= self.capacity_bytes)
                    and np.all(self.host_bytes <= self.host_capacity_bytes))

    def worst(self) -> tuple[int, float]:
        """(device, its floor in bytes) of the device furthest over its capacity (the fullest
        against its own capacity; the one :meth:`why` names)."""
        d = int(np.argmax(self.required_bytes - self.capacity_bytes))
        return d, float(self.required_bytes[d])

    def why(self) -> str:
        """Why it does not fit, in words, the worst device named, in GB as the sweep's other
        rows say it ('' when the floor fits)."""
        d, need = self.worst()
        over = need - self.capacity_bytes[d]
        gpu = d if self.gpus is None else int(self.gpus[d])
        if over > 0:
            state = (self.weights_bytes + self.grads_bytes + self.optimizer_bytes)[d]
            return (f"does not fit in memory: GPU {gpu} needs at least {need / 1e9:.2f} GB (weights, gradients, "
                    f"optimizer state {state / 1e9:.2f} GB; activations held before its first backward "
                    f"{self.activations_bytes[d] / 1e9:.2f} GB), {over / 1e9:.2f} GB over its "
                    f"{self.capacity_bytes[d] / 1e9:.2f} GB")
        host = self.host_bytes - self.host_capacity_bytes
        d = int(np.argmax(host))
        gpu = d if self.gpus is None else int(self.gpus[d])
        if host[d] > 0:
            return (f"does not fit in host memory: GPU {gpu}'s offloaded state needs at least "
                    f"{self.host_bytes[d] / 1e9:.2f} GB, {host[d] / 1e9:.2f} GB over the "
                    f"{self.host_capacity_bytes[d] / 1e9:.2f} GB of host memory it has")
        return ""


def memory_floor(graph: OpGraph, strategy: Strategy, cluster: Cluster,
                 real_stages: Sequence[tuple[int, int]] | None = None) -> MemoryFloor:
    """The floor under ``strategy``'s memory on ``cluster`` (the module docstring says why it is
    one), in bytes per device. ``real_stages``: [pipeline stage of ``strategy``] (stages, stage)
    of the pipeline whose schedule that stage's activations follow, for a reference that stands
    for a longer pipeline (:func:`engine.sim.hier.reference_floor`); default its own."""
    D = cluster.num_devices
    weights, grads, optim, gathered, host, _ = state_memory(graph, strategy, D)
    used = np.zeros(D, bool)
    for devices in {id(cfg.devices): cfg.devices for cfg in strategy.configs.values()}.values():
        used[np.asarray(devices, np.int64)] = True  # (ops of alike layers share their devices' tuple: once each)
    capacity = np.array([cluster.device_type(d).memory_bytes for d in range(D)], np.float64)
    return MemoryFloor(weights, grads, optim, _activations(graph, strategy, D, real_stages), gathered,
                       logits_bytes(graph, strategy, D),
                       np.where(used, CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES, 0.0),
                       capacity, host, host_capacity(cluster))


def _activations(graph: OpGraph, strategy: Strategy, D: int,
                 real_stages: Sequence[tuple[int, int]] | None) -> np.ndarray:
    """[device] saved activations of the forward units its stage runs before its first
    backward (in the schedule of ``real_stages``' stage, :func:`memory_floor`), one forward task
    per op partition per unit, for the ops :func:`_held_ops` finds held; zeros with activation
    offload. With one stage and one microbatch no barrier orders anything, and the held ops are
    held by data alone: every backward task descends from some sink's (a loss's) forward, and a
    held op feeds every sink."""
    out = np.zeros(D)
    if offloaded_layers(graph, strategy):
        return out
    pipe = strategy.pipeline
    p, v, m = max(1, pipe.stages), max(1, pipe.virtual_stages), max(1, pipe.microbatches)
    chunk_of = np.array([strategy.stage_of.get(op.name, 0) if p * v > 1 else 0 for op in graph.ops], np.int64)
    held = _held_ops(graph, strategy, chunk_of)
    saved = saved_bytes(graph, strategy, m, graph_cache(graph))
    per_chunk = np.zeros((p * v, D))  # one microbatch's saved bytes on each device, by model chunk
    by_devices: dict[tuple[int, int], list] = {}  # (chunk, id of a devices tuple) -> [bytes, devices]
    for i, op in enumerate(graph.ops):
        if saved[i] > 0 and held[i]:
            cfg = strategy.configs[op.name]
            hit = by_devices.setdefault((int(chunk_of[i]), id(cfg.devices)), [0.0, cfg.devices])
            hit[0] += saved[i]
    for (chunk, _), (amount, devices) in by_devices.items():
        np.add.at(per_chunk[chunk], np.asarray(devices, np.int64), amount)
    for stage in range(p):
        real_p, real_stage = real_stages[stage] if real_stages is not None else (p, stage)
        order = unit_order(pipe.schedule, real_p, v, m, real_stage)  # (the task graph's: one stage alternates)
        first = next((k for k, unit in enumerate(order) if unit[2] == BWD), len(order))
        units = np.bincount(np.array([unit[0] for unit in order[:first]], np.int64), minlength=v)
        for local in range(v):
            out += units[local] * per_chunk[local * p + stage]
    return out


def _held_ops(graph: OpGraph, strategy: Strategy, chunk_of: np.ndarray) -> np.ndarray:
    """[op] whether the barrier argument covers op's forward tasks: the barrier after a unit on
    a device waits for the unit's sink tasks on that device (ops with no consumer in their model
    chunk), so an op is counted when every sink of its chunk runs on every device of the chunk
    and the op feeds every one of them (or is one). Megatron-shaped layouts meet this (each
    stage's last op, or its loss, on all its GPUs); a model with several losses on different
    GPUs (FlexFlow's NMT, 40 of them) keeps only what every loss reads, or nothing."""
    n = len(graph.ops)
    preds: list[list[int]] = [[] for _ in range(n)]
    has_cons = np.zeros(n, bool)
    for (a, _, b, _) in graph.edges:
        if chunk_of[a] == chunk_of[b]:
            preds[b].append(a)
            has_cons[a] = True
    held = np.zeros(n, bool)
    for chunk in np.unique(chunk_of):
        members = np.flatnonzero(chunk_of == chunk)
        devices = set().union(*(strategy.configs[graph.ops[i].name].devices for i in members))
        sinks = [int(i) for i in members if not has_cons[i]]
        if not sinks or any(set(strategy.configs[graph.ops[i].name].devices) != devices for i in sinks):
            continue
        reached = np.zeros(n, np.int64)  # sinks each op feeds (or is)
        for sink in sinks:
            seen = {sink}
            todo = [sink]
            while todo:
                for a in preds[todo.pop()]:
                    if a not in seen:
                        seen.add(a)
                        todo.append(a)
            reached[list(seen)] += 1
        held[members] = reached[members] == len(sinks)
    return held
