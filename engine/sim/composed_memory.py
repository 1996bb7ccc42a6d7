"""A composed prediction's memory (:mod:`engine.sim.hier`): the whole pipeline's memory report
from its reference run's.

Each stage's static memory (weights, gradients, optimizer state, buffers, gathered parameters,
logits, context) is its reference stage's, GPU for GPU; its activation peak follows its own
schedule order: one microbatch's saved activations per forward unit, freed by its backward
(:func:`engine.sim.memory.memory_report`'s rule, checked on the reference's own peaks).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cluster import Cluster
from ..graph import OpGraph
from ..taskgraph import FWD
from .composed import Reference, stage_order
from .memory import MemoryReport, memory_report, saved_activation_bytes
from .memory_static import FRAGMENTATION_FRACTION, host_capacity

__all__ = ["ActivationRuleProblem", "composed_memory"]


class ActivationRuleProblem(Exception):
    """The reference's activation peaks do not follow its schedule (the message says where)."""


def _walk(order: np.ndarray, amount: np.ndarray) -> float:
    """Activation peak (bytes) of a stage running its units in ``order`` ([unit, 3]: local
    chunk, microbatch, phase): a forward unit adds its chunk's saved bytes (``amount[chunk]``)
    as it runs, its backward frees them."""
    step = np.where(order[:, 2] == FWD, amount[order[:, 0]], -amount[order[:, 0]])
    return float(max(0.0, np.cumsum(step).max())) if step.size else 0.0


def composed_memory(g_ref: OpGraph, s_ref: Any, c_ref: Cluster, tl: Any, unit: np.ndarray, ref: Reference,
            cluster: Cluster, p: int, m: int, stage_gpus: int) -> MemoryReport:
    """The whole run's memory report from the reference's: each stage's static parts are its
    reference stage's, its activation peak walked along its own schedule (:func:`_walk`); the
    rule is checked on the reference's own peaks first (:class:`ActivationRuleProblem` where it
    does not hold)."""
    rep = memory_report(g_ref, s_ref, c_ref, tl)
    tg = ref.tg
    pr, v, mr = ref.stages, ref.chunks, ref.microbatches
    saved = saved_activation_bytes(g_ref, s_ref)
    f = np.nonzero((tg.kind == FWD) & (unit >= 0) & (tg.mb == 0))[0]
    # saved bytes of a forward unit per (reference chunk, device): alike for every microbatch
    amt: dict[tuple[int, int], float] = {}
    for c, d, b in zip(((unit[f] // 2) // mr).tolist(), tg.device[f].tolist(), saved[tg.op[f]].tolist()):
        amt[(c, d)] = amt.get((c, d), 0.0) + b
    devs = sorted({d for _, d in amt})
    image = tg.info.get("device_image")
    image = np.arange(c_ref.num_devices) if image is None else image

    def order(st: int, pp: int, mm: int) -> np.ndarray:
        return stage_order(s_ref.pipeline.schedule, pp, v, mm, st)

    def amounts(st_ref: int, d: int) -> np.ndarray:
        return np.array([amt.get((lc * pr + st_ref, d), 0.0) for lc in range(v)])

    for d in devs:  # the rule must give the reference's own activation peaks
        st = d // stage_gpus
        want = float(rep.activations_peak_bytes[d])
        got = _walk(order(st, pr, mr), amounts(st, d))
        if abs(got - want) > 1e-9 * max(1.0, want):
            raise ActivationRuleProblem(f"the reference's activation peak on GPU {d} does not follow its schedule "
                              f"({got:,.0f} against {want:,.0f} bytes)")
    D = cluster.num_devices
    real = np.arange(D)
    s_real = np.minimum(real // stage_gpus, p - 1)
    d_ref = ref.stage_rep[s_real] * stage_gpus + real % stage_gpus
    rep_local = image[d_ref] % stage_gpus
    peaks: dict[tuple[int, int], float] = {}
    act = np.zeros(D)
    for i in range(D):
        key = (int(s_real[i]), int(rep_local[i]))
        if key not in peaks:
            st_ref = int(ref.stage_rep[key[0]])
            peaks[key] = _walk(order(key[0], p, m), amounts(st_ref, st_ref * stage_gpus + key[1]))
        act[i] = peaks[key]
    used = real < p * stage_gpus

    def take(a: np.ndarray) -> np.ndarray:
        return np.where(used, np.asarray(a, float)[d_ref], 0.0)

    weights, grads, optim, comm = (take(a) for a in (rep.weights_bytes, rep.grads_bytes, rep.optimizer_bytes,
                                                     rep.comm_buffer_bytes))
    gathered, logits, context = take(rep.gathered_bytes), take(rep.logits_bytes), take(rep.context_bytes)
    act = np.where(used, act, 0.0)
    allocated = weights + grads + optim + comm + act + gathered + logits
    frag = FRAGMENTATION_FRACTION * allocated
    capacity = np.array([cluster.device_type(d).memory_bytes for d in range(D)], dtype=np.float64)
    return MemoryReport(weights, grads, optim, comm, act, allocated + frag + context, capacity, [],
                        gathered_bytes=gathered, logits_bytes=logits, fragmentation_bytes=frag,
                        context_bytes=context, allocated_peak_bytes=allocated, reserved_peak_bytes=allocated + frag,
                        host_bytes=take(rep.host_bytes), host_capacity_bytes=host_capacity(cluster),
                        nvme_bytes=take(rep.nvme_bytes))
