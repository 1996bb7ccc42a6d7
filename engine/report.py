"""One call from (model, strategy, cluster) to everything a user reads about a simulated
iteration: time, throughput, utilisation, communication, memory and feasibility."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .cluster import Cluster
from .costs import CostModel
from .graph import OpGraph
from .memory import MemoryReport, memory_report
from .simulate import Timeline, simulate
from .strategy import Strategy, check_strategy
from .taskgraph import TaskGraph, build_task_graph

__all__ = ["SimulationResult", "simulate_strategy"]


@dataclass
class SimulationResult:
    graph: OpGraph
    strategy: Strategy
    cluster: Cluster
    tasks: TaskGraph
    timeline: Timeline
    memory: MemoryReport

    @property
    def iteration_time_s(self) -> float:
        return self.timeline.makespan_s

    @property
    def throughput_samples_per_s(self) -> float:
        t = self.iteration_time_s
        return self.graph.batch_size / t if t > 0 else float("inf")

    @property
    def model_flops_per_s(self) -> float:
        """Forward + backward FLOPs of the model (no recomputation) per second."""
        t = self.iteration_time_s
        return (self.graph.fwd_flops + self.graph.bwd_flops) / t if t > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """The ``soapbox simulate --json`` object (seconds, bytes, samples/s, FLOP/s)."""
        used = sorted(self.strategy.devices_used())
        over = self.memory.over_capacity()
        return {
            "model": self.graph.name,
            "cluster": self.cluster.name,
            "strategy": self.strategy.found_by.get("algorithm", "file"),
            "iteration_time_s": self.iteration_time_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "model_flops_per_s_per_gpu": self.model_flops_per_s / max(1, len(used)),
            "feasible": self.memory.feasible,
            "over_capacity": [{"device": d, "bytes": b} for d, b in over],
            "peak_memory_bytes": self.memory.peak_bytes.tolist(),
            "memory_capacity_bytes": self.memory.capacity_bytes.tolist(),
            "utilization": self.timeline.utilization.tolist(),
            "comm_bytes": self.timeline.comm_bytes,
            "critical_path_s": self.timeline.critical_path_s,
            "num_tasks": self.tasks.num_tasks,
            "devices_used": len(used),
            "microbatches": self.strategy.pipeline.microbatches,
        }


def simulate_strategy(graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel | None = None,
                      check: bool = True) -> SimulationResult:
    """Validate, build the task graph, simulate and account memory.

    Raises
    ------
    ValidationError
        When ``check`` and the strategy is not valid for ``graph`` on ``cluster``.
    """
    if check:
        check_strategy(strategy, graph, cluster)
    tg = build_task_graph(graph, strategy, cluster, cost)
    tl = simulate(tg)
    mem = memory_report(graph, strategy, cluster, tl)
    return SimulationResult(graph, strategy, cluster, tg, tl, mem)


def _fmt_bytes(b: float) -> str:
    for unit, k in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= k:
            return f"{b / k:.2f} {unit}"
    return f"{b:.0f} B"


def format_summary(r: SimulationResult) -> str:
    """Human-readable report printed by ``soapbox simulate``."""
    s = r.summary()
    util = np.asarray(s["utilization"])
    peak = r.memory.peak_bytes
    cap = r.memory.capacity_bytes
    used = sorted(r.strategy.devices_used())
    lines = [
        f"{r.graph.name} on {r.cluster.name} ({s['strategy']}): {len(used)} of {r.cluster.num_devices} GPUs, "
        f"{s['microbatches']} microbatch(es), {s['num_tasks']:,} tasks",
        f"  iteration time     {s['iteration_time_s'] * 1e3:.3f} ms",
        f"  throughput         {s['throughput_samples_per_s']:.2f} samples/s",
        f"  model FLOP/s/GPU   {s['model_flops_per_s_per_gpu'] / 1e12:.1f} TFLOP/s",
        f"  critical path      {s['critical_path_s'] * 1e3:.3f} ms (dependencies only)",
        f"  utilisation        mean {util[used].mean() * 100:.1f}%, min {util[used].min() * 100:.1f}%, "
        f"max {util[used].max() * 100:.1f}%",
        f"  communication      {_fmt_bytes(s['comm_bytes'])} per iteration",
        f"  peak memory        max {_fmt_bytes(peak.max())} of {_fmt_bytes(cap[int(np.argmax(peak))])} "
        f"(device {int(np.argmax(peak))}); weights {_fmt_bytes(r.memory.weights_bytes.max())}, "
        f"optimizer {_fmt_bytes(r.memory.optimizer_bytes.max())}, "
        f"activations {_fmt_bytes(r.memory.activations_peak_bytes.max())}",
    ]
    if s["feasible"]:
        lines.append("  feasible           yes: every device fits in memory")
    else:
        worst = s["over_capacity"][:3]
        where = ", ".join(f"device {w['device']} by {_fmt_bytes(w['bytes'])}" for w in worst)
        lines.append(f"  feasible           NO: over memory capacity on {len(s['over_capacity'])} device(s): {where}")
    return "\n".join(lines)
