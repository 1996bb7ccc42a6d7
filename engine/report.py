"""One call from (model, strategy, cluster) to everything a user reads about a simulated
iteration: time, throughput, utilisation, communication, memory and feasibility.

Every number a user sees is finite: a value that is not (the throughput of an iteration that
takes no time) is shown as null (``None``) with a note in words (:func:`finite_json`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cluster import Cluster
from .costs import CostModel
from .errors import printable
from .graph import OpGraph
from .memory import MemoryReport, memory_report
from .simulate import Timeline, simulate
from .strategy import Strategy, check_strategy
from .taskgraph import TaskGraph, build_task_graph

__all__ = ["SimulationResult", "simulate_strategy", "finite_json", "json_text", "fit_words"]


def finite_json(value: Any, where: str = "", notes: list[str] | None = None) -> Any:
    """``value`` with every non-finite float replaced by None; when ``notes`` is given, a
    line naming each replaced field is appended to it. NumPy scalars and arrays become
    Python numbers and lists."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if notes is not None:
            notes.append(f"{where or 'a value'} is not a finite number ({value}); shown as null")
        return None
    if isinstance(value, dict):
        return {k: finite_json(v, f"{where}.{k}" if where else str(k), notes) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v, f"{where}[{i}]", notes) for i, v in enumerate(value)]
    return value


def json_text(obj: dict[str, Any]) -> str:
    """One line of strict JSON (no ``Infinity`` or ``NaN``) for ``--json`` outputs: a
    non-finite number becomes null and a line in the object's ``notes``."""
    notes: list[str] = list(obj.get("notes", []))
    clean = finite_json({k: v for k, v in obj.items() if k != "notes"}, "", notes)
    if notes or "notes" in obj:
        clean["notes"] = notes
    return json.dumps(clean, allow_nan=False)


def fit_words(memory: MemoryReport) -> str:
    """Whether every device fits in memory, in words (the worst devices named)."""
    over = memory.over_capacity()
    if not over:
        return "fits in memory on every device"
    worst = ", ".join(f"device {d} by {_fmt_bytes(b)} (of {_fmt_bytes(float(memory.capacity_bytes[d]))})"
                      for d, b in over[:3])
    more = f" and {len(over) - 3} more" if len(over) > 3 else ""
    return f"does not fit in memory: over capacity on {len(over)} device(s): {worst}{more}"


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
    def throughput_samples_per_s(self) -> float | None:
        """Samples per second; None when the iteration takes no time (a measured profile of
        zeros), where it would be infinite."""
        t = self.iteration_time_s
        return self.graph.batch_size / t if t > 0 else None

    @property
    def model_flops_per_s(self) -> float:
        """Forward + backward FLOPs of the model (no recomputation) per second."""
        t = self.iteration_time_s
        return (self.graph.fwd_flops + self.graph.bwd_flops) / t if t > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """The ``soapbox simulate --json`` object (seconds, bytes, samples/s, FLOP/s); every
        number finite, or null with a line in ``notes`` saying why."""
        used = sorted(self.strategy.devices_used())
        over = self.memory.over_capacity()
        notes = [] if self.memory.feasible else [f"the strategy {fit_words(self.memory)}"]
        if self.throughput_samples_per_s is None:
            notes.append("throughput_samples_per_s is null: the iteration takes 0 s (every op's measured time is 0)")
        out = {
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
            "memory": fit_words(self.memory),
        }
        out = finite_json(out, "", notes)
        out["notes"] = notes
        return out


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
    util = np.nan_to_num(np.asarray(r.timeline.utilization, dtype=float))
    peak = r.memory.peak_bytes
    cap = r.memory.capacity_bytes
    used = sorted(r.strategy.devices_used())
    throughput = s["throughput_samples_per_s"]
    lines = [
        f"{printable(r.graph.name)} on {printable(r.cluster.name)} ({printable(str(s['strategy']))}): {len(used)} of "
        f"{r.cluster.num_devices} GPUs, {s['microbatches']} microbatch(es), {s['num_tasks']:,} tasks",
        f"  iteration time     {s['iteration_time_s'] * 1e3:.3f} ms",
        f"  throughput         {throughput:.2f} samples/s" if throughput is not None else
        "  throughput         - (the iteration takes 0 s)",
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
