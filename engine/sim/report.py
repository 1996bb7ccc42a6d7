"""One call from (model, strategy, cluster) to everything a user reads about a simulated
iteration: time, throughput, utilisation, communication, memory and feasibility.

:func:`simulate_strategy` is the engine's one simulation entry point (validate, build with
the symmetry reduction, simulate, account memory; refusable by size, cancellable); the CLI,
the sweep, what-if, the searches' pricing and the published-run validation go through it.
The throughput and utilisation metrics are defined here, once (:func:`tokens_per_sample`,
:func:`model_flops`, :func:`tokens_per_s`, :func:`mfu`), and read by every view.

Every number a user sees is finite: a value that is not (the throughput of an iteration that
takes no time) is shown as null (``None``) with a note in words (:func:`finite_json`).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from ..cluster import Cluster
from ..costs import CostModel
from ..errors import TooLargeError, check_cancel, printable
from ..graph import OpGraph
from .breakdown import critical_breakdown
from .memory import MemoryReport, fits_in_memory, memory_report
from .full import Timeline, simulate
from .steady import SteadyState, simulate_steady
from .report_moe import moe_fields, moe_lines
from ..strategy import Strategy, check_strategy
from ..taskgraph import TaskGraph, build_task_graph, count_text, estimate_symmetric_tasks, tasks_within

__all__ = ["SimulationResult", "simulate_strategy", "memory_breakdown", "SYMMETRY_MODES", "tokens_per_sample", "model_flops",
           "tokens_per_s", "peak_flops_per_s", "mfu", "devices_used", "finite_json", "json_text", "fit_words",
           "format_summary"]

#: ``symmetry`` of :func:`simulate_strategy`: ``auto`` and ``off`` as in
#: :func:`engine.taskgraph.build_task_graph`; ``only``: with an exact symmetry or not at all
SYMMETRY_MODES = ("auto", "off", "only")


# --------------------------------------------------------------------------- metrics, defined once


def tokens_per_sample(graph: OpGraph) -> int | None:
    """Tokens in one sample: the ``length`` of the graph's first input of integer type (token
    ids) that has a ``length`` dim; None when there is none (a CNN: its throughput is in
    samples). A float input with a length axis (audio frames, precomputed embeddings) holds
    features, not tokens. For an encoder-decoder (``nmt``, ``transformer``) this is the first
    such input, the source sequence.

    >>> from engine.formats import resolve_model
    >>> tokens_per_sample(resolve_model("gpt2")), tokens_per_sample(resolve_model("alexnet"))
    (1024, None)
    """
    for op in graph.ops:
        if op.kind == "input" and op.out_tensors[0].dtype.startswith("int") and "length" in op.dim_names:
            return op.dim("length").size
    return None


def model_flops(graph: OpGraph) -> float:
    """Model FLOPs of one training iteration: every op's forward and backward FLOPs for the
    whole batch, as the operator catalogue counts them (:mod:`engine.ops`), without
    recomputation (PaLM's *model* FLOPs, Chowdhery et al. 2022, Appendix B).

    * Attention is counted: its score and context matmuls, ``4 b h s s_kv d`` forward (an
      unfused ``batch_matmul`` pair counts the full square; the fused ``attention`` op of a
      causal model half of it, the blocks FlashAttention skips), backward twice the forward.
    * Recomputation is not counted: activation recomputation (full or selective) reruns
      forwards that are not in the ops' FLOPs, and the fused attention's backward, which the
      catalogue prices at 2.5x its forward (FlashAttention recomputes the scores), counts here
      at 2x (the 0.5x recomputed is hardware work, not model work).

    >>> from engine.formats import resolve_model
    >>> g = resolve_model("gpt2")  # no fused attention: the graph's own totals
    >>> model_flops(g) == g.fwd_flops + g.bwd_flops
    True
    """
    total = 0.0
    for op in graph.ops:
        total += op.fwd_flops + (2.0 * op.fwd_flops if op.kind == "attention" else op.bwd_flops)
    return total


def tokens_per_s(graph: OpGraph, iteration_time_s: float) -> float | None:
    """Training tokens per second: batch x :func:`tokens_per_sample` / iteration time; None
    for a model without tokens or an iteration of no time."""
    tokens = tokens_per_sample(graph)
    if not tokens or not iteration_time_s > 0:
        return None
    return graph.batch_size * tokens / iteration_time_s


def peak_flops_per_s(cluster: Cluster, devices, precision: str) -> float | None:
    """The summed dense peak FLOP/s (no 2:4 sparsity) of ``devices`` at ``precision`` (the
    run's precision: the model's); None when some device lacks that precision."""
    try:
        return float(sum(cluster.device_type(int(d)).peak(precision) for d in devices))
    except ValueError:
        return None


def mfu(graph: OpGraph, iteration_time_s: float, cluster: Cluster, devices) -> float | None:
    """Model FLOPs utilisation: :func:`model_flops` / (iteration time x the summed dense peak
    of the GPUs used at the model's precision, :func:`peak_flops_per_s`) -- on one device type,
    model FLOPs / (time x GPUs used x the device's peak) (PaLM, Chowdhery et al. 2022,
    Appendix B). None when the iteration takes no time, no GPU is used or a GPU lacks the
    precision. GPUs a layout leaves idle are not in the denominator.

    >>> from engine.formats import resolve_model
    >>> from engine.cluster import preset
    >>> g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
    >>> u = mfu(g, 1.0, c, range(8))  # fp32: 8 x 19.5 TFLOP/s
    >>> abs(u - model_flops(g) / (8 * 19.5e12)) < 1e-12
    True
    """
    devices = list(devices)
    if not iteration_time_s > 0 or not devices:
        return None
    peak = peak_flops_per_s(cluster, devices, graph.precision)
    return model_flops(graph) / (iteration_time_s * peak) if peak else None


def devices_used(strategy: Strategy) -> list[int]:
    """The devices ``strategy`` places partitions on, ascending: ``sorted(strategy.devices_used())``.

    Each distinct ``devices`` tuple is read once (a baseline's ops share a few: a 16,384-GPU
    FSDP layout's 3,030 ops have 6, where a set over every op's tuple took 2 s).

    >>> from engine.strategy import Config, Strategy
    >>> devices_used(Strategy({"a": Config({"sample": 2}, (3, 1)), "b": Config({}, (1,))}))
    [1, 3]
    """
    distinct = {id(c.devices): c.devices for c in strategy.configs.values()}
    if not distinct:
        return []
    return np.unique(np.concatenate([np.asarray(d, np.int64) for d in distinct.values()])).tolist()


# --------------------------------------------------------------------------- the result record


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
        if all(type(v) is float for v in value) and all(map(math.isfinite, value)):
            return list(value)  # (per-device lists of 16,384 finite floats: no call per item)
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
    host = memory.host_message()
    if not over:
        return host or "fits in memory on every device"
    worst = ", ".join(f"device {d} by {_fmt_bytes(b)} (of {_fmt_bytes(float(memory.capacity_bytes[d]))})"
                      for d, b in over[:3])
    more = f" and {len(over) - 3} more" if len(over) > 3 else ""
    return f"does not fit in memory: over capacity on {len(over)} device(s): {worst}{more}" + (f"; {host}" if host else "")


class SimulationResult:
    """What :func:`simulate_strategy` returns: the inputs, the task graph, the timeline, the
    memory report, and the metrics read from them, each defined once in this module.

    ``memory`` is made by :func:`simulate_strategy` unless it was asked not to
    (``account_memory=False``, a search's pricing): it is then made on first use, and
    :attr:`feasible` is answered from a cheaper bound (:func:`engine.sim.memory.fits_in_memory`).
    """

    def __init__(self, graph: OpGraph, strategy: Strategy, cluster: Cluster, tasks: TaskGraph, timeline: Timeline,
                 memory: MemoryReport | None = None) -> None:
        self.graph, self.strategy, self.cluster = graph, strategy, cluster
        self.tasks, self.timeline = tasks, timeline
        self._memory = memory
        self._used: tuple[Strategy, list[int]] | None = None  # (strategy, devices_used)

    @property
    def memory(self) -> MemoryReport:
        """Per-device memory over the iteration (:func:`engine.sim.memory.memory_report`)."""
        if self._memory is None:
            self._memory = memory_report(self.graph, self.strategy, self.cluster, self.timeline)
        return self._memory

    @memory.setter
    def memory(self, report: MemoryReport) -> None:
        self._memory = report

    @property
    def feasible(self) -> bool:
        """Every device fits in memory."""
        if self._memory is not None:
            return bool(self._memory.feasible)
        return bool(fits_in_memory(self.graph, self.strategy, self.cluster, self.timeline))

    @property
    def iteration_time_s(self) -> float:
        return self.timeline.makespan_s

    @property
    def steady(self) -> SteadyState | None:
        """How the steady state was extrapolated (``simulate_strategy(steady=True)``), or None
        where every microbatch was simulated."""
        return getattr(self.timeline, "steady", None)

    @property
    def num_tasks(self) -> int:
        """Tasks of the whole iteration (the ones simulated, or with an extrapolated steady
        state the count a full simulation would hold)."""
        return self.timeline.num_tasks if self.steady is not None else self.tasks.num_tasks

    @property
    def devices_used(self) -> list[int]:
        """The GPUs the strategy places work on (MFU's denominator), ascending; made once per
        strategy (:func:`devices_used`)."""
        hit = self._used
        if hit is None or hit[0] is not self.strategy:
            hit = self._used = (self.strategy, devices_used(self.strategy))
        return hit[1]

    @property
    def throughput_samples_per_s(self) -> float | None:
        """Samples per second; None when the iteration takes no time (a measured profile of
        zeros), where it would be infinite."""
        t = self.iteration_time_s
        return self.graph.batch_size / t if t > 0 else None

    @property
    def tokens_per_s(self) -> float | None:
        """Training tokens per second (:func:`tokens_per_s`); None for a model without tokens."""
        return tokens_per_s(self.graph, self.iteration_time_s)

    @property
    def model_flops(self) -> float:
        """Model FLOPs of the iteration (:func:`model_flops`: attention counted, no recomputation)."""
        return model_flops(self.graph)

    @property
    def model_flops_per_s(self) -> float:
        """:attr:`model_flops` per second of iteration (0 for an iteration of no time)."""
        t = self.iteration_time_s
        return self.model_flops / t if t > 0 else 0.0

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation of the GPUs used (:func:`mfu`, PaLM Appendix B)."""
        return mfu(self.graph, self.iteration_time_s, self.cluster, self.devices_used)

    def summary(self) -> dict[str, Any]:
        """The ``soapbox simulate --json`` object (seconds, bytes, samples/s, tokens/s, FLOP/s);
        every number finite, or null with a line in ``notes`` saying why."""
        used = self.devices_used
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
            "tokens_per_s": self.tokens_per_s,
            "model_flops_per_iteration": self.model_flops,
            "model_flops_per_s_per_gpu": self.model_flops_per_s / max(1, len(used)),
            "mfu": self.mfu,
            "feasible": self.memory.feasible,
            "over_capacity": [{"device": d, "bytes": b} for d, b in over],
            "peak_memory_bytes": self.memory.peak_bytes.tolist(),
            "max_memory_allocated_bytes": self.memory.allocated_peak_bytes.tolist(),
            "max_memory_reserved_bytes": self.memory.reserved_peak_bytes.tolist(),
            "memory_breakdown": memory_breakdown(self.memory),
            "memory_capacity_bytes": self.memory.capacity_bytes.tolist(),
            "utilization": self.timeline.utilization.tolist(),
            "comm_bytes": self.timeline.comm_bytes,
            "critical_path_s": self.timeline.critical_path_s,
            # the iteration's time on the critical chain by kind (engine.sim.breakdown)
            "critical_chain_shares": critical_breakdown(self.timeline),
            "num_tasks": self.num_tasks,
            "devices_used": len(used),
            "microbatches": self.strategy.pipeline.microbatches,
            "memory": fit_words(self.memory),
        }
        if self.steady is not None:
            st = self.steady
            out["steady_state"] = {"simulated_microbatches": st.simulated, "period_microbatches": st.period,
                                   "period_s": st.period_s, "repeats_from_microbatch": st.first,
                                   "microbatches_checked": st.checked}
        moe = moe_fields(self)
        if moe is not None:
            out["moe"] = moe
        out = finite_json(out, "", notes)
        out["notes"] = notes
        return out


def memory_breakdown(memory: MemoryReport) -> dict[str, Any]:
    """The busiest GPU's peak memory in its parts (bytes; they add up to its ``peak_memory_bytes``),
    with what PyTorch would report for it: ``max_memory_allocated`` and ``max_memory_reserved``
    (the allocator's), and the offloaded state it keeps on the host and on NVMe.

    >>> import numpy as np
    >>> m = MemoryReport(*(np.array([x, 2 * x]) for x in (1.0, 2.0, 3.0, 0.0, 4.0, 10.0)), 80.0, [])
    >>> b = memory_breakdown(m)
    >>> b["device"], b["parts"]["activations"], b["max_memory_allocated"]
    (1, 8.0, 20.0)
    """
    d = int(np.argmax(memory.peak_bytes))
    return {"device": d, "parts": memory.breakdown(d),
            "max_memory_allocated": float(memory.allocated_peak_bytes[d]),
            "max_memory_reserved": float(memory.reserved_peak_bytes[d]),
            "host": float(memory.host_bytes[d]), "nvme": float(memory.nvme_bytes[d])}


def simulate_strategy(graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel | None = None,
                      check: bool = True, *, symmetry: str = "auto", max_tasks: int | None = None,
                      cancel: Any = None, account_memory: bool = True, steady: bool = False) -> SimulationResult:
    """Validate, build the task graph, simulate and account memory: the engine's one
    simulation entry point.

    Parameters
    ----------
    graph, strategy, cluster
        What to simulate.
    cost : CostModel, optional
        Defaults to the roofline of measured kernel rates (nothing fitted on training runs).
    check : bool
        Validate ``strategy`` first (a caller that made it with a baseline or loaded it from
        a checked file may skip this).
    symmetry : {"auto", "off", "only"}
        ``auto``: simulate one representative per set of identical replicas when the
        strategy has an exact symmetry (:func:`engine.taskgraph.build_task_graph`), else
        every device; the timeline's per-device values are mirrored to every device.
        ``only``: with an exact symmetry, else refuse (:class:`~engine.errors.TooLargeError`)
        without a full build (the explorer then makes a delta simulator instead).
    max_tasks : int, optional
        Refuse, before building anything, a simulation whose estimated task count (with the
        symmetry reduction when ``symmetry`` is ``auto``:
        :func:`engine.taskgraph.estimate_symmetric_tasks`; else
        :func:`engine.taskgraph.estimate_tasks`) is above this; a symmetric build that turns
        out inexact falls back to a full build only within it.
    cancel : threading.Event or callable, optional
        Asked before any work, between the build's segments, every
        :data:`engine.sim.full.CANCEL_CHECK_EVENTS` tasks of the event loop and between the
        memory report's steps (:func:`engine.errors.check_cancel`).
    account_memory : bool
        Make the memory report now (default); with False it is made when first read, and
        :attr:`SimulationResult.feasible` uses a cheaper bound first.
    steady : bool
        For a pipeline of many microbatches, simulate only the first few and extrapolate the
        steady state where the schedule is checked to repeat (:mod:`engine.sim.steady`): the
        same iteration time, busy times, bytes, critical path, task count and peak memory
        (to float rounding), with the timeline's per-task arrays only for the microbatches
        simulated (``timeline.steady`` says how; None: every microbatch was simulated, as
        without it). For what reads the totals (a sweep, ``soapbox simulate``), not a
        timeline drawn task by task.

    Raises
    ------
    ValidationError
        When ``check`` and the strategy is not valid for ``graph`` on ``cluster``.
    TooLargeError
        See ``max_tasks`` and ``symmetry="only"``.
    Cancelled
        When ``cancel`` is set before the result is made.
    """
    check_cancel(cancel)
    if symmetry not in SYMMETRY_MODES:
        raise ValueError(f"symmetry {symmetry!r}: one of {', '.join(SYMMETRY_MODES)}")
    if check:
        check_strategy(strategy, graph, cluster)
    if max_tasks is not None:
        n = tasks_within(graph, strategy, max_tasks, cluster)  # (the symmetric estimate is never above it: asked only past the cap)
        if n > max_tasks and symmetry != "off":
            n = estimate_symmetric_tasks(graph, strategy, cluster, full=n)
        if n > max_tasks:
            raise TooLargeError(f"not simulated: {count_text(n, max_tasks)} tasks, more than the {max_tasks:,} allowed")
    short = simulate_steady(graph, strategy, cluster, cost, symmetry=symmetry, max_tasks=max_tasks,
                            cancel=cancel) if steady else None
    if short is not None:
        tg, tl = short
    else:
        tg = build_task_graph(graph, strategy, cluster, cost, symmetry=symmetry, max_tasks=max_tasks, cancel=cancel)
        tl = simulate(tg, cancel=cancel)
    mem = memory_report(graph, strategy, cluster, tl, cancel=cancel) if account_memory else None
    return SimulationResult(graph, strategy, cluster, tg, tl, mem)


def _fmt_bytes(b: float) -> str:
    for unit, k in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= k:
            return f"{b / k:.2f} {unit}"
    return f"{b:.0f} B"


def _memory_lines(mem: MemoryReport) -> list[str]:
    """The memory lines of :func:`format_summary`: the worst device's peak (against its capacity)
    and every part of it (:meth:`MemoryReport.breakdown`, summing to the peak); what
    PyTorch would report (allocated, reserved); host memory when state is offloaded."""
    peak, cap = mem.peak_bytes, mem.capacity_bytes
    d = int(np.argmax(peak / np.maximum(cap, 1.0))) if peak.size else 0
    parts = ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in mem.breakdown(d).items() if v > 0)
    lines = [f"  peak memory        max {_fmt_bytes(float(peak[d]))} of {_fmt_bytes(float(cap[d]))} (device {d}) = {parts}",
             f"  PyTorch would say  max_memory_allocated {_fmt_bytes(float(mem.allocated_peak_bytes[d]))}, "
             f"max_memory_reserved {_fmt_bytes(float(mem.reserved_peak_bytes[d]))}"]
    if np.any(mem.host_bytes > 0) or np.any(mem.nvme_bytes > 0):
        h = int(np.argmax(mem.host_bytes))
        lines.append(f"  host memory        max {_fmt_bytes(float(mem.host_bytes[h]))} of "
                     f"{_fmt_bytes(float(mem.host_capacity_bytes[h]))} per GPU (device {h}), offloaded state"
                     + (f"; NVMe {_fmt_bytes(float(mem.nvme_bytes.max()))} per GPU" if np.any(mem.nvme_bytes > 0) else ""))
    return lines


def format_summary(r: SimulationResult) -> str:
    """Human-readable report printed by ``soapbox simulate``."""
    s = r.summary()
    util = np.nan_to_num(np.asarray(r.timeline.utilization, dtype=float))
    used = r.devices_used
    throughput = s["throughput_samples_per_s"]
    lines = [
        f"{printable(r.graph.name)} on {printable(r.cluster.name)} ({printable(str(s['strategy']))}): {len(used)} of "
        f"{r.cluster.num_devices} GPUs, {s['microbatches']} microbatch(es), {s['num_tasks']:,} tasks",
        f"  iteration time     {s['iteration_time_s'] * 1e3:.3f} ms",
        *([f"  steady state       {r.steady.describe()}"] if r.steady is not None else []),
        f"  throughput         {throughput:.2f} samples/s" if throughput is not None else
        "  throughput         - (the iteration takes 0 s)",
        *([f"  tokens/s           {s['tokens_per_s']:,.0f} ({r.tokens_per_s / max(1, len(used)):,.0f} per GPU)"]
          if s["tokens_per_s"] is not None else []),
        f"  model FLOP/s/GPU   {s['model_flops_per_s_per_gpu'] / 1e12:.1f} TFLOP/s"
        + (f", MFU {s['mfu']:.1%}" if s["mfu"] is not None else ""),
        f"  critical path      {s['critical_path_s'] * 1e3:.3f} ms (dependencies only)",
        f"  utilisation        mean {util[used].mean() * 100:.1f}%, min {util[used].min() * 100:.1f}%, "
        f"max {util[used].max() * 100:.1f}%",
        f"  communication      {_fmt_bytes(s['comm_bytes'])} per iteration",
        "  critical chain     " + ", ".join(f"{k} {v:.0%}" for k, v in s["critical_chain_shares"].items()
                                         if v >= 0.005),
        *moe_lines(s),
        *_memory_lines(r.memory),
    ]
    if s["feasible"]:
        lines.append("  feasible           yes: every device fits in memory")
    else:
        worst = s["over_capacity"][:3]
        where = ", ".join(f"device {w['device']} by {_fmt_bytes(w['bytes'])}" for w in worst)
        if worst:
            lines.append(f"  feasible           NO: over memory capacity on {len(s['over_capacity'])} device(s): {where}")
        if r.memory.host_message():
            lines.append(f"  feasible           NO: {r.memory.host_message()}")
    return "\n".join(lines)
