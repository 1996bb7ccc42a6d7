"""Sweeps of layouts x cluster sizes (``soapbox sweep``): every combination simulated, infeasible
ones kept with the reason, on one process, a local process pool (the default; no service) or a
Ray cluster (``backend="ray"``: the same call runs on a laptop in Ray's local mode or on a
cluster given its address).

A point is a Megatron-shaped layout (:func:`engine.search.baselines.megatron`: tp, pp, cp, vpp,
micro-batch, recomputation, ZeRO stage, sequence parallelism; expert and expert tensor parallelism
ep and etp for a mixture-of-experts model) of one model on one cluster;
its row holds the layout, the simulated iteration time, tokens (or samples) per second, the
peak memory per GPU and whether it fits, or why it cannot be built. Points are sent to
workers in batches (``batch`` points a task), so that per-task scheduling costs little against
the simulations (Ray's is milliseconds a task). The rows' files and the report: :mod:`engine.studies.sweep_files`.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from ..errors import first_line
from .network import check_sweep_pods, network_points, parse_network

__all__ = ["GRID_KEYS", "parse_grid", "parse_clusters", "points", "layout_points", "sweep_points", "evaluate",
           "run_sweep", "model_graph", "pareto", "COLUMNS", "smallest_fit", "training_front", "gpu_type", "MAX_POINTS",
           "MAX_CLUSTERS", "ModelRef"]

#: grid keys and the :class:`engine.layout.Layout` field each sets
GRID_KEYS = {"tp": "tp", "pp": "pp", "cp": "cp", "vpp": "vpp", "mb": "micro_batch", "zero": "zero_stage",
             "recompute": "recompute", "sp": "sequence_parallel", "ep": "ep", "etp": "etp"}

#: the columns of a result row, in order
COLUMNS = ("cluster", "gpus", "tp", "pp", "cp", "dp", "vpp", "mb", "zero", "recompute", "sp", "feasible",
           "iteration_time_s", "throughput_per_s", "peak_memory_bytes", "why", "ep", "etp", "predicted_by",
           "nics", "nic_gbps", "pod_gpus", "oversub", "memory_floor_bytes")

#: the most points one sweep runs
MAX_POINTS = 100_000
#: the most clusters (sizes x presets x networks given in ``--clusters``) one sweep compares:
#: each is built to check it before the sweep runs (2,048 sizes took minutes and 18 GB)
MAX_CLUSTERS = 64
#: the most worker processes a sweep starts per core (more only queue for the cores)
WORKERS_PER_CORE = 8


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["tp=1,2,4", "pp=1,2", "recompute=none,full"]`` -> {key: values}.

    >>> parse_grid(["tp=1,2", "sp=0,1"])
    {'tp': [1, 2], 'sp': [False, True]}
    """
    grid: dict[str, list[Any]] = {}
    if "auto" in [str(i).strip() for i in items]:
        raise ValueError("--grid auto stands alone (every valid layout of the model); or give KEY=V1,V2 items")
    for item in items:
        key, sep, values = str(item).partition("=")
        key = key.strip()
        if not sep or key not in GRID_KEYS:
            raise ValueError(f"--grid {str(item)[:60]!r}: expected KEY=V1,V2,... with KEY one of {', '.join(GRID_KEYS)}")
        if key in grid:
            raise ValueError(f"--grid {key} given twice")
        vals: list[Any] = []
        for v in values.split(","):
            v = v.strip()
            if key == "recompute":
                if v not in ("none", "selective", "full"):
                    raise ValueError(f"--grid recompute={v!r}: none, selective or full")
                vals.append(v)
            elif key == "sp":
                if v not in ("0", "1", "false", "true"):
                    raise ValueError(f"--grid sp={v!r}: 0 or 1")
                vals.append(v in ("1", "true"))
            else:
                low = 0 if key == "zero" else 1
                if not (v.isascii() and v.isdigit() and len(v) <= 9) or not low <= int(v) <= 1 << 20:
                    raise ValueError(f"--grid {key}={v[:40]!r}: a {'non-negative' if low == 0 else 'positive'} "
                                     f"whole number up to {1 << 20:,}")
                vals.append(int(v))
        if not vals:
            raise ValueError(f"--grid {key}: no values")
        grid[key] = list(dict.fromkeys(vals))
    return grid


def parse_clusters(text: str) -> list[str]:
    """``"dgx-a100-80gb:4,8,16"`` -> the three presets; ``"p100-4x4"`` -> itself; several
    groups separated by spaces or semicolons; a network after a ``+`` applies to each size
    (``"dgx-h100:8,16+nics=4"``: :mod:`engine.cluster.network`)."""
    out: list[str] = []
    for group in str(text).replace(";", " ").split():
        group, plus, net = group.partition("+")
        base, sep, sizes = group.partition(":")
        if not sep:
            out.append(base + plus + net)
            continue
        for n in sizes.split(","):
            if not (n.strip().isascii() and n.strip().isdigit() and len(n.strip()) <= 9):
                raise ValueError(f"--clusters {group[:60]!r}: sizes must be whole numbers (dgx-a100-80gb:4,8,16)")
            out.append(f"{base}:{int(n)}{plus}{net}")
    if not out:
        raise ValueError("--clusters: no cluster given")
    out = list(dict.fromkeys(out))
    if len(out) > MAX_CLUSTERS:
        raise ValueError(f"--clusters: {len(out):,} clusters, more than the {MAX_CLUSTERS} a sweep compares")
    return out


def points(grid: dict[str, list[Any]], clusters: Sequence[str]) -> list[dict[str, Any]]:
    """Every combination, clusters outermost, in a fixed order."""
    keys = sorted(grid)
    n = math.prod(len(grid[k]) for k in keys) * len(clusters)  # (counted before any is made)
    if n > MAX_POINTS:
        raise ValueError(f"{n:,} points, more than the {MAX_POINTS:,} a sweep runs")
    combos = list(itertools.product(*(grid[k] for k in keys)))
    return [{"cluster": c, **dict(zip(keys, combo))} for c in clusters for combo in combos]


def layout_points(model: Any, clusters: Sequence[str], batch: int | None = None,
                  **limits: Any) -> list[dict[str, Any]]:
    """Every valid layout of ``model`` on each of ``clusters`` (names, as :func:`points`
    takes) as sweep points (grid keys tp, pp, cp, mb; ep, etp and sp where a mixture-of-experts
    layout sets them), clusters outermost: the grid that
    :func:`engine.layout.valid_layouts` gives (``soapbox sweep --grid auto``; ``limits`` are its
    keyword limits: ``tps``, ``max_microbatches_per_stage``, ...).

    >>> layout_points("gpt2", ["dgx-a100-80gb:1"], batch=8)[0]
    {'cluster': 'dgx-a100-80gb:1', 'tp': 1, 'pp': 1, 'cp': 1, 'mb': 1}
    """
    from ..formats import resolve_cluster
    from ..layout import valid_layouts

    g = model_graph(model, batch)
    out: list[dict[str, Any]] = []
    for name in clusters:
        for lay in valid_layouts(g, resolve_cluster(name, allow_path=True), **limits):
            pt = {"cluster": name, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "mb": lay.micro_batch}
            if lay.ep * lay.etp > 1:  # (a mixture-of-experts layout: its experts' degrees and sp)
                pt.update(ep=lay.ep, etp=lay.etp)
            if lay.sequence_parallel:
                pt["sp"] = True
            out.append(pt)
            if len(out) > MAX_POINTS:
                raise ValueError(f"more than the {MAX_POINTS:,} points a sweep runs")
    return out


def sweep_points(model: Any, grid: Sequence[str], clusters: str, network: Sequence[str] = (),
                 batch: int | None = None) -> list[dict[str, Any]]:
    """The points of ``soapbox sweep``: the ``--grid`` items (``["auto"]``: every valid layout,
    :func:`layout_points`) on each cluster of ``--clusters``, each on every network of
    ``--network`` (:func:`engine.studies.network.parse_network`; none: the clusters' own)."""
    from ..formats import is_cluster_path, resolve_cluster

    from ..cluster.network import parse_variant

    names = parse_clusters(clusters)
    net = parse_network(network)  # (checked before the layouts are enumerated)
    pods = []  # (each cluster's pod size, all check_sweep_pods reads: the clusters are not kept)
    for name in dict.fromkeys(_base_name(n) for n in names):
        try:  # (a name that is no preset nor file: said now, once)
            pods.append(resolve_cluster(name, allow_path=True).pod_gpus)
        except ValueError as e:
            raise ValueError(f"--clusters {name[:60]!r}: {first_line(e)}") from None
        if net and is_cluster_path(name):
            raise ValueError(f"--network: {name[:60]!r} is a cluster file, whose own network it keeps (nics, "
                             "fabric.pod_gpus, fabric.oversubscription in the file); --network applies to presets")
    for name in names:  # (a network after a "+" that cannot be read: said now, as --network's would be)
        head, plus, suffix = name.partition("+")
        if plus and not is_cluster_path(name):
            try:
                parse_variant(suffix, f"cluster {head!r}")
            except ValueError as e:
                raise ValueError(f"--clusters {name[:80]!r}: {first_line(e)}") from None
    check_sweep_pods(net, pods)
    pts = layout_points(model, names, batch=batch) if list(grid) == ["auto"] else points(parse_grid(grid), names)
    return network_points(pts, net, MAX_POINTS)


def _base_name(name: str) -> str:
    """A ``--clusters`` name without the network after its ``+`` (a cluster file whose path
    holds a ``+`` is itself)."""
    from ..formats import is_cluster_path

    return name if is_cluster_path(name) else name.partition("+")[0]


_MODELS: dict[tuple, Any] = {}
_CLUSTERS: dict[str, Any] = {}


@dataclass(frozen=True)
class ModelRef:
    """A sample model or model file by name with its sequence length and precision (None: its
    own), as ``soapbox simulate --seq-len --model-precision`` makes it: what a sweep sends its
    workers (a graph does not pickle; each worker makes the model once)."""

    name: str
    seq_len: int | None = None
    precision: str | None = None


def model_graph(model: Any, batch: int | None = None) -> Any:
    """The model a sweep prices: ``model`` itself when it is a graph (an imported or edited
    model, at its own batch: ``batch`` must then be None), else the sample model or model file
    it names (a name, or a :class:`ModelRef`), at ``batch`` (kept per process: each point of a
    sweep reads it)."""
    from ..formats import resolve_model
    from ..graph import OpGraph

    if isinstance(model, OpGraph):
        if batch is not None:
            raise ValueError(f"a batch is set on {model.name}'s graph itself, not beside it")
        return model
    key = (model, batch)
    if key not in _MODELS:
        ref = model if isinstance(model, ModelRef) else ModelRef(str(model))
        _MODELS[key] = resolve_model(ref.name, allow_path=True, batch=batch, seq_len=ref.seq_len,
                                     precision=ref.precision)
    return _MODELS[key]


def evaluate(model: Any, point: dict[str, Any], batch: int | None = None, time_all: bool = False) -> dict[str, Any]:
    """One point's row (never raises for a layout that cannot be built or does not fit);
    ``model`` as :func:`model_graph` takes it.

    Before a point is predicted (composed, or simulated in full), the floor under its memory is
    read (:func:`engine.sim.memory_floor.memory_floor`: weights, gradients, optimizer state and
    the activations held before the first backward, from the configs alone; off the composed
    prediction's reference strategy where it applies, :func:`engine.sim.hier.reference_floor`).
    Where it already passes some GPU's capacity the prediction would find that the point does not
    fit: the row says so without a time (``predicted_by`` "memory floor (not simulated)",
    ``memory_floor_bytes``: the floor of the GPU furthest over its capacity, the one ``why``
    names). ``time_all``: predict it anyway, for its time. ``benchmarks/bench_memory_floor.py``
    measures how many of the co-design sweep's points it settles and checks them against the
    prediction; ``tests/sim/test_memory_floor.py`` that the floor is under the simulated memory."""
    from ..cluster.network import network_of
    from ..formats import resolve_cluster
    from ..layout import Layout, resolved
    from ..layout.build import build_layout, build_unchecked
    from ..sim.hier import REFERENCE_STAGES, HierProblem, predict_layout, reference_floor
    from ..sim.memory_floor import memory_floor
    from ..sim.report import simulate_strategy, tokens_per_s

    g = model_graph(model, batch)
    name = point["cluster"]
    if name not in _CLUSTERS:
        try:  # (a network the nodes cannot have, e.g. more NICs than GPUs: the rows say why)
            _CLUSTERS[name] = resolve_cluster(name, allow_path=True)
        except ValueError as e:
            if "+" not in name:
                raise
            _CLUSTERS[name] = (e, resolve_cluster(name.partition("+")[0], allow_path=True).num_devices)
    c = _CLUSTERS[name]
    opts = {GRID_KEYS[k]: v for k, v in point.items() if k in GRID_KEYS}
    row: dict[str, Any] = {k: None for k in COLUMNS}
    row.update(cluster=name, tp=opts.get("tp", 1), pp=opts.get("pp", 1), cp=opts.get("cp", 1),
               vpp=opts.get("vpp", 1), mb=opts.get("micro_batch"), zero=opts.get("zero_stage", 0),
               recompute=opts.get("recompute", "none"), sp=bool(opts.get("sequence_parallel", False)), feasible=False,
               ep=opts.get("ep", 1), etp=opts.get("etp", 1))
    if isinstance(c, tuple):
        row.update(why=first_line(c[0])[:300], gpus=c[1])
        return row
    row.update(gpus=c.num_devices, **network_of(c))
    floor = None  # (the floor under its memory, where it was read: engine.sim.memory_floor)
    try:
        lay = resolved(Layout.from_options(opts), g, c)
        try:  # the full simulation's figures, composed from a reference run (engine.sim.hier),
            # where the reference is smaller than the whole: more stages than it keeps
            if lay.pp <= REFERENCE_STAGES:
                raise HierProblem(f"{lay.pp} stage{'s' if lay.pp > 1 else ''}: the reference would hold "
                                  f"{'them all' if lay.pp > 1 else 'it'}")
            floor = None if time_all else reference_floor(g, c, lay)  # (off the reference's strategy: cheap)
            if floor is not None and not floor.fits:
                return _not_simulated(row, lay, floor)
            r = predict_layout(g, c, lay)
            row["predicted_by"] = "composed"
        except HierProblem as e:  # (not a layout it reads exactly: the full simulation says it)
            if floor is None and not time_all:  # (where the reference's was read, it is this one: it fits)
                # (off the strategy unchecked, its settings checked as the reference's are: the whole
                # check, ~70 ms on GPT-3, is made below, for a point that is simulated)
                floor = memory_floor(g, build_unchecked(g, c, lay, check_settings=True), c)
                if not floor.fits:
                    return _not_simulated(row, lay, floor)
            s = build_layout(g, c, lay)
            r = simulate_strategy(g, s, c, check=False, steady=True)  # (a row reads totals: engine.sim.steady)
            row["predicted_by"] = f"simulated ({str(e)[:120]})"
    except ValueError as e:
        row["why"] = first_line(e)[:300]
        return row
    row["dp"], row["mb"] = lay.dp, lay.micro_batch
    row["iteration_time_s"] = r.iteration_time_s
    # tokens/s for a language model, else samples/s (engine.sim.report.tokens_per_s: one rule)
    tok = tokens_per_s(g, r.iteration_time_s)
    row["throughput_per_s"] = tok if tok is not None else (g.batch_size / r.iteration_time_s
                                                           if r.iteration_time_s > 0 else None)
    row["peak_memory_bytes"] = float(max(r.memory.peak_bytes))
    row["feasible"] = bool(r.memory.feasible)
    if not r.memory.feasible:
        row["why"] = _over_why(r.memory)
    return row


def _not_simulated(row: dict[str, Any], lay: Any, floor: Any) -> dict[str, Any]:
    """``row`` of a layout sure not to fit by its memory floor: why, and the floor of the GPU it
    names; no time (not simulated)."""
    row.update(dp=lay.dp, mb=lay.micro_batch, why=floor.why(), predicted_by="memory floor (not simulated)",
               memory_floor_bytes=floor.worst()[1])
    return row


def _over_why(memory: Any) -> str:
    """Why a row does not fit: its fullest GPU and by how much."""
    d, over = memory.over_capacity()[0]
    return f"does not fit in memory: GPU {d} is {over / 1e9:.2f} GB over"


def smallest_fit(graph: Any, kind: str, options: dict[str, Any], clusters: Sequence[Any],
                 max_tasks: int | None = None, stop: Callable[[], bool] | None = None,
                 progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """The smallest of ``clusters`` (in the order given: smallest first) on which the layout
    ``kind`` (a baseline of :data:`engine.search.baselines.BASELINES`: megatron, fsdp, ...) with
    ``options`` fits in memory: a row per cluster tried, up to the first that fits. A
    Megatron-shaped layout that the rules of :func:`engine.layout.layout_problem` refuse on a
    cluster (devices it cannot tile, a batch it cannot split) is not built there.

    Each row: ``cluster`` (name), ``gpus``, ``feasible``, ``peak_memory_bytes``,
    ``capacity_bytes`` (of the fullest GPU), ``iteration_time_s``, ``why`` (a layout that
    cannot be built there, e.g. a data-parallel degree that does not divide the batch, or the
    GPU and bytes over capacity), ``memory_floor_bytes`` (set where the floor under the
    memory, :func:`engine.sim.memory_floor.memory_floor`, passed some GPU's capacity: that
    size is sure not to fit and is not simulated; the floor of the GPU furthest over its
    capacity). Simulated with the engine's symmetry reduction where it is exact, a long
    pipeline's steady state extrapolated (:mod:`engine.sim.steady`); ``max_tasks`` refuses a
    full build past it (that row's ``why`` says so); ``stop``
    ends the scan early (asked before each cluster and, as the simulation's ``cancel``, during
    each build and simulation: a cluster stopped mid-way has no row), ``progress`` gets each
    row as it comes.
    """
    from ..errors import Cancelled, SoapboxError
    from ..layout import Layout, layout_problem
    from ..sim.memory_floor import memory_floor
    from ..sim.report import simulate_strategy
    from ..search.baselines import make_baseline

    rows: list[dict[str, Any]] = []
    # a Megatron-shaped layout (megatron, fsdp) is checked against the layout rules first
    # (engine.layout.layout_problem): a cluster it cannot tile is refused without a build
    layout = None
    if kind in ("megatron", "fsdp"):
        try:
            layout = Layout.from_options({k: v for k, v in options.items() if v is not False})
        except ValueError:
            layout = None  # (make_baseline names the problem, per cluster)
    for c in clusters:
        if stop is not None and stop():
            break
        row: dict[str, Any] = {"cluster": c.name, "gpus": c.num_devices, "feasible": False,
                               "peak_memory_bytes": None, "capacity_bytes": None, "iteration_time_s": None, "why": None,
                               "memory_floor_bytes": None}
        try:
            why = layout_problem(graph, c, layout) if layout is not None else None
            if why:
                raise ValueError(why)
            s = make_baseline(kind, graph, c, **options)
            floor = memory_floor(graph, s, c)
            if not floor.fits:  # (sure not to fit: the simulation would say so; the next size is tried)
                row.update(why=floor.why(), memory_floor_bytes=floor.worst()[1])
                rows.append(row)
                if progress is not None:
                    progress(row)
                continue
            # (max_tasks with symmetry too: a plan of 10^5 microbatches is large however alike;
            # ``stop`` also ends a running build or simulation)
            r = simulate_strategy(graph, s, c, check=False, max_tasks=max_tasks, cancel=stop, steady=True)
            tl, mem = r.timeline, r.memory
        except Cancelled:
            break
        except (ValueError, TypeError, SoapboxError) as e:  # (TypeError: an option this builder lacks)
            row["why"] = first_line(e)[:300]
        else:
            worst = int((mem.peak_bytes / mem.capacity_bytes.clip(min=1)).argmax())
            row.update(feasible=bool(mem.feasible), peak_memory_bytes=float(mem.peak_bytes[worst]),
                       capacity_bytes=float(mem.capacity_bytes[worst]), iteration_time_s=tl.makespan_s)
            if not mem.feasible:
                row["why"] = _over_why(mem)
        rows.append(row)
        if progress is not None:
            progress(row)
        if row["feasible"]:
            break
    return rows


def _batch(context: tuple, pts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    model, batch, time_all = context
    return [evaluate(model, p, batch, time_all) for p in pts]


def run_sweep(model: Any, pts: list[dict[str, Any]], *, backend: str = "pool", workers: int | None = None,
              batch_points: int | None = None, address: str | None = None, batch: int | None = None,
              progress: Callable[[int, int], None] | None = None, time_all: bool = False) -> list[dict[str, Any]]:
    """Every point's row, in the points' order, on ``backend`` ("serial", "pool" or "ray":
    :class:`engine.search.processes.Backend`); ``model`` as :func:`model_graph` takes it;
    ``time_all``: :func:`evaluate`'s (points sure not to fit simulated too)."""
    from ..search.processes import Backend, check_backend

    backend = check_backend(backend)  # (an unknown name: one line naming the valid ones)
    n = len(pts)
    cores = os.cpu_count() or 1
    workers = max(1, min(workers or cores, WORKERS_PER_CORE * cores))
    size = batch_points or max(1, min(64, math.ceil(n / (4 * workers))))
    chunks = [pts[i:i + size] for i in range(0, n, size)]
    workers = max(1, min(workers, len(chunks)))  # (a process a task at most: a pool starts them all at once)
    done = 0

    def tick(k: int, rows: list[dict[str, Any]]) -> None:
        nonlocal done
        done += len(rows)
        if progress is not None:
            progress(done, n)

    with Backend(backend, context=(model, batch, bool(time_all)), workers=workers, address=address) as b:
        out = b.map(_batch, chunks, done=tick)
    return [row for rows in out for row in (rows or [])]


def pareto(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The feasible rows no other feasible row beats on all of iteration time, GPUs and peak
    memory (each at least as good and one better)."""
    ok = [r for r in rows if r["feasible"]]
    front = []
    for r in ok:
        key = (r["iteration_time_s"], r["gpus"], r["peak_memory_bytes"])
        if not any((o["iteration_time_s"], o["gpus"], o["peak_memory_bytes"]) != key and
                   o["iteration_time_s"] <= key[0] and o["gpus"] <= key[1] and o["peak_memory_bytes"] <= key[2]
                   for o in ok):
            front.append(r)
    return sorted(front, key=lambda r: (r["gpus"], r["iteration_time_s"]))


def gpu_type(cluster: str) -> str:
    """The GPU type a sweep row's cluster name stands for (its preset, before the node count
    and any network after a ``+``)."""
    return str(cluster).partition("+")[0].partition(":")[0]


def training_front(rows: Iterable[dict[str, Any]], tokens: float) -> list[dict[str, Any]]:
    """The feasible language-model rows no other beats on both the days to train ``tokens``
    tokens and the GPU-hours it takes (each at least as good and one better), fastest first;
    each with ``days`` and ``gpu_hours`` added."""
    ok = []
    for r in rows:
        tps = r.get("throughput_per_s")
        if r.get("feasible") and tps:
            seconds = tokens / tps
            ok.append({**r, "days": seconds / 86400.0, "gpu_hours": seconds / 3600.0 * r["gpus"]})
    front = [r for r in ok if not any((o["days"], o["gpu_hours"]) != (r["days"], r["gpu_hours"]) and
                                      o["days"] <= r["days"] and o["gpu_hours"] <= r["gpu_hours"] for o in ok)]
    return sorted(front, key=lambda r: r["days"])
