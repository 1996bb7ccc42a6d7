"""The published training runs (``validation/published_runs_public.csv``, in the repository),
shared by ``benchmarks/validate_published.py`` (which predicts and reports every row) and
``benchmarks/calibrate.py`` (which fits the cost model's constants on the in-sample rows):
loading the rows (:func:`load_rows`), predicting a row's published metrics with the engine's
entry point (:class:`Predictor`), and which rows are in-sample (:func:`in_sample`). Reading a
row into a model, cluster and layout lives in ``published_rows.py`` (cells, families,
clusters) and ``published_setup.py`` (:func:`setup_for`). Neither script imports the other.
"""

from __future__ import annotations

import csv
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(Path(__file__).resolve().parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from published_rows import (SOURCES, Setup, Skip, cell_float, cell_int,  # noqa: E402,F401
                            cell_number, group_key, is_moe, mfu_peak, source_of)
from published_setup import setup_for  # noqa: E402

from engine.cluster import preset  # noqa: E402
from engine.errors import printable  # noqa: E402
from engine.models.transformer import gpt  # noqa: E402
from engine.sim.report import model_flops, simulate_strategy  # noqa: E402

__all__ = ["ROOT", "SOURCES", "Skip", "RowResult", "Setup", "Predictor", "CsvError", "default_csv",
           "load_rows", "cell_int", "cell_float", "cell_number", "source_of", "group_key", "megatron_flops",
           "setup_for", "in_sample", "MEMORY_METRICS"]

#: Columns every row needs for the checker to read it at all.
REQUIRED_COLUMNS = ("row_id", "source", "model", "gpus", "gpu_type", "metric_name", "metric_value")
#: Published peak-memory metrics (GiB per GPU), compared with the simulated peak.
MEMORY_METRICS = ("peak_memory_gib", "peak_alloc_gib")


class CsvError(ValueError):
    """The published-runs CSV cannot be read: one line naming the file and what is wrong."""


def default_csv() -> Path:
    """The in-repository copy, ``validation/published_runs_public.csv`` (see validation/SOURCE.md)."""
    return ROOT / "validation" / "published_runs_public.csv"


def load_rows(path: Path | None = None) -> list[dict[str, str]]:
    """Every row of the published-runs CSV (``path``, default :func:`default_csv`), as read.

    Raises
    ------
    CsvError
        The file is missing or unreadable, lacks a required column, or has a row whose
        ``row_id`` is not an integer (the message names the file, and the line)."""
    path = Path(path or default_csv())
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise CsvError(f"{path}: not a published-runs CSV: missing column(s) {', '.join(missing)}")
            rows = list(reader)
    except OSError as e:
        raise CsvError(f"cannot read the published-runs CSV {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise CsvError(f"{path}: not a readable CSV: {printable(str(e), 200)}") from None
    for i, r in enumerate(rows, start=2):
        if not (r.get("row_id") or "").strip().isdigit():
            raise CsvError(f"{path}, line {i}: row_id {printable(str(r.get('row_id')), 40)!r} is not an integer")
    return rows


@dataclass
class RowResult:
    row_id: int
    source: str  # the source family (published_rows.FAMILIES)
    model: str
    gpus: int
    layout: str = ""
    metric_name: str = ""
    published: float | None = None
    predicted: float | None = None
    error_pct: float | None = None
    metric2_name: str = ""
    published2: float | None = None
    predicted2: float | None = None
    error2_pct: float | None = None
    iteration_time_s: float | None = None
    published_iteration_time_s: float | None = None
    feasible: bool | None = None
    peak_memory_gb: float | None = None  # worst device
    capacity_gb: float | None = None
    #: the row's published peak memory (metric2 or its notes), GiB, and soapbox's figure for
    #: the same PyTorch counter (``memory_counter``: reserved, allocated, or soapbox's peak)
    published_memory_gib: float | None = None
    predicted_memory_gib: float | None = None
    memory_error_pct: float | None = None
    memory_counter: str = ""
    software: dict[str, Any] = field(default_factory=dict)
    num_tasks: int | None = None
    wall_s: float = 0.0
    cluster: str = ""
    assumptions: list[str] = field(default_factory=list)
    not_compared: str | None = None  # why metric2 is not compared, when it is not
    skipped: str | None = None


def megatron_flops(B: int, s: int, l: int, h: int, V: int, recompute: bool) -> float:
    """FLOPs per iteration as Megatron counts them (Narayanan et al. SC'21, Eq. 3).

    With full recomputation (the SC'21 runs) each layer's forward runs twice:
    ``96 B s l h^2 (1 + s/6h + V/16lh)``. Without it the same count is
    ``72 B s l h^2 (1 + s/6h + V/12lh)`` (forward + backward = 3x the forward; the logit
    layer is never recomputed)."""
    if recompute:
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def megatron_moe_flops(graph, recompute: bool) -> float:
    """FLOPs per iteration of a mixture-of-experts GPT as Megatron-LM counts them
    (``num_floating_point_operations`` in megatron/training/training.py, MCore v0.8-0.9, the
    release of the Mixtral row): ``12 B s L h^2 ((1 + g/n + s/h) + (f/h) k (3/2 with SwiGLU) +
    V/(2 L h))`` (16 instead of 12 with full recomputation), g/n the key/value heads per query
    head, f the expert FFN width, k the top-k; routers, shared experts and dense layers are
    not in that formula, so their models are refused."""
    experts = [op for op in graph.ops if op.kind == "experts"]
    cores = [op for op in graph.ops if op.kind == "attention"]
    if not experts or not cores or len(experts) != len(cores) or any(".shared." in op.name for op in graph.ops):
        raise Skip("Megatron's v0.8 MoE FLOPs formula covers every layer a MoE layer without shared experts")
    q, k = cores[0].in_tensors[0], cores[0].in_tensors[1]
    B, n, s_len, d = q.shape
    h = experts[0].in_tensors[0].shape[-1]
    if n * d != h:
        raise Skip("Megatron's v0.8 MoE FLOPs formula assumes heads x head width = hidden")
    e = experts[0].attrs
    gated = 1.5 if e.get("gated", True) else 1.0
    V = graph["embed.tokens"].attrs["num_embeddings"]
    L = len(experts)
    per = (1 + k.shape[1] / n + s_len / h) + e["ffn_hidden"] / h * e["top_k"] * gated + V / (2 * L * h)
    return (16.0 if recompute else 12.0) * B * s_len * L * h * h * per


#: Families whose "GB" of memory is GiB: KempnerForge's step log prints ``mem=peak/total GB``
#: with ``peak_gb = torch.cuda.max_memory_allocated() / 1024**3`` (kempnerforge/metrics/memory.py
#: and tracker.py at 5666d0d1, the report's commit). Its report gives an H200's total as 140
#: "GB": the H200's 143,771 MiB (nvidia-smi) are 140.4 GiB but 150.8 * 10^9 bytes.
GIB_AS_GB = ("KempnerForge",)


def published_memory_gib(row: dict[str, str]) -> tuple[str, float] | None:
    """(metric name, GiB) of the row's published peak memory: its ``metric2`` when that is a
    memory metric, else a "peak mem X GB/GPU" in its notes (GB read as 10^9 bytes, except where
    the source's own logger prints GiB as "GB": :data:`GIB_AS_GB`)."""
    if row.get("metric2_name") in MEMORY_METRICS and cell_number(row, "metric2_value") is not None:
        return row["metric2_name"], float(cell_number(row, "metric2_value"))
    m = re.search(r"peak mem(?:ory)? ([\d.]+) GB/GPU", row.get("notes") or "")
    if not m:
        return None
    return "peak_memory_gb (notes)", float(m.group(1)) * (1.0 if source_of(row) in GIB_AS_GB else 1e9 / 2**30)


# --------------------------------------------------------------------------- one row


class Predictor:
    """Simulates rows on demand and caches results (rows 43-46 need the 2019 baseline row)."""

    def __init__(self, rows: list[dict[str, str]], cost=None):
        self.cost = cost  # the cost model (None: the calibrated default)
        self.rows = {int(r["row_id"]): r for r in rows}
        self.cache: dict[int, RowResult] = {}
        self.sim_cache: dict[int, tuple[float, float]] = {}  # row id -> (t, achieved FLOP/s per GPU)
        self._pending_notes: list[str] = []
        self._no_flops = ""  # why Megatron's FLOPs count was not made for the last row

    def _baseline_row(self, row: dict[str, str]) -> dict[str, str]:
        src = source_of(row)
        for r in self.rows.values():
            if (source_of(r) == src and cell_int(r, "gpus") == 1 and "baseline" in r["table_or_figure"].lower()
                    and r["metric_name"] == "tflops_per_gpu"):
                return r
        raise Skip("weak-scaling efficiency needs the source's single-GPU baseline row, which is not in the CSV")

    def per_gpu_flops(self, row: dict[str, str]) -> float:
        """Predicted Megatron-counted FLOP/s per GPU of a row (simulates it if needed)."""
        rid = int(row["row_id"])
        if rid not in self.sim_cache:
            res = self.run(row)
            if res.skipped:
                raise Skip(f"baseline row {rid} could not be predicted: {res.skipped}")
        return self.sim_cache[rid][1]

    def run(self, row: dict[str, str]) -> RowResult:
        rid = int(row["row_id"])
        if rid in self.cache:
            return self.cache[rid]
        family = source_of(row)
        if is_moe(row) and not family.endswith("MoE"):  # mixture-of-experts rows are reported apart
            family += " MoE"
        res = RowResult(rid, family, row.get("model") or "", cell_number(row, "gpus") or 0,
                        metric_name=row.get("metric_name") or "", published=cell_number(row, "metric_value"),
                        metric2_name=row.get("metric2_name") or "", published2=cell_number(row, "metric2_value"))
        t0 = time.perf_counter()
        outer_notes, self._pending_notes = self._pending_notes, []
        try:
            setup = setup_for(row)
            res.layout, res.cluster, res.assumptions = setup.layout, setup.cluster_name, setup.assumptions
            res.software = setup.software
            self._simulate(row, setup, res)
        except Skip as e:
            res.skipped = str(e)
        res.assumptions.extend(self._pending_notes)
        self._pending_notes = outer_notes
        res.wall_s = time.perf_counter() - t0
        res.error_pct = _error_pct(res.predicted, res.published)
        res.error2_pct = _error_pct(res.predicted2, res.published2)
        res.memory_error_pct = _error_pct(res.predicted_memory_gib, res.published_memory_gib)
        self.cache[rid] = res
        return res

    def _simulate(self, row: dict[str, str], setup: Setup, res: RowResult) -> None:
        """Simulate the row's setup and fill ``res`` with its predicted metrics."""
        try:
            graph = setup.make_graph() if setup.make_graph is not None else gpt(setup.cfg)
            cluster = preset(setup.cluster_name)
            strategy = setup.build(graph, cluster)
        except ValueError as e:
            raise Skip(str(e)) from None
        sim = simulate_strategy(graph, strategy, cluster, self.cost)
        t = sim.iteration_time_s
        res.iteration_time_s, res.feasible, res.num_tasks = t, sim.memory.feasible, sim.tasks.num_tasks
        worst = int(sim.memory.peak_bytes.argmax())
        res.peak_memory_gb = float(sim.memory.peak_bytes[worst]) / 2**30
        res.capacity_gb = float(sim.memory.capacity_bytes[worst]) / 2**30
        self._memory(row, setup, sim.memory, res)
        c = setup.cfg
        try:
            F = megatron_moe_flops(graph, setup.recompute_full) if setup.make_graph is not None else \
                megatron_flops(c.batch, c.seq_len, c.layers, c.hidden, c.vocab, setup.recompute_full)
        except Skip as e:  # a metric that needs Megatron's count says why
            F, self._no_flops = None, str(e)
        self.sim_cache[res.row_id] = (t, F / (t * res.gpus) if F is not None else float("nan"))
        model_F = model_flops(graph)
        res.predicted, res.published_iteration_time_s = self.metric(row, row["metric_name"], res.published, setup, t,
                                                                     F, model_F)
        if res.metric2_name in MEMORY_METRICS:
            res.predicted2 = res.predicted_memory_gib
        elif res.metric2_name and res.published2 is not None:
            try:
                res.predicted2, _ = self.metric(row, res.metric2_name, res.published2, setup, t, F, model_F)
            except Skip as e:
                res.not_compared = str(e)

    def _memory(self, row: dict[str, str], setup: Setup, memory, res: RowResult) -> None:
        """The published peak memory and soapbox's figure for the same counter (worst device)."""
        pub = published_memory_gib(row)
        if pub is None:
            return
        counter = "allocated" if pub[0] == "peak_alloc_gib" else setup.memory_counter
        arr = getattr(memory, f"{counter}_peak_bytes", None) if counter else None
        if arr is None:
            arr = memory.peak_bytes
            why = f"soapbox has no {counter} figure yet" if counter else "the source's counter is not stated"
            self._pending_notes.append(f"peak memory: {why}; compared with soapbox's simulated peak")
            counter = "peak"
        res.memory_counter = counter
        res.published_memory_gib = pub[1]
        res.predicted_memory_gib = float(max(arr)) / 2**30

    def metric(self, row: dict[str, str], name: str, published: float | None, setup: Setup, t: float,
               F: float, model_F: float | None = None) -> tuple[float, float | None]:
        """(predicted metric, iteration time implied by the published value or None), by the
        conversions of ``validation/README.md``. ``F``: Megatron-counted FLOPs per iteration;
        ``model_F``: model FLOPs without recomputation (:func:`engine.sim.report.model_flops`; built
        from ``setup.cfg`` when not given)."""
        c, gpus = setup.cfg, cell_int(row, "gpus")
        tokens = c.batch * c.seq_len
        if F is None and name in ("tflops_per_gpu", "aggregate_pflops", "weak_scaling_efficiency_pct"):
            raise Skip(self._no_flops)
        if name in ("iteration_time_s", "iteration_time_ms"):
            scale = 1e3 if name.endswith("_ms") else 1.0
            return t * scale, (published / scale if published else None)
        if name in ("model_tflops_per_gpu", "mfu_pct"):
            model_F = model_F if model_F is not None else model_flops(gpt(c))
            per = 1e12 if name == "model_tflops_per_gpu" else self._mfu_peak(row, setup) / 100.0
            return model_F / (t * gpus * per), (model_F / (published * per * gpus) if published else None)
        if name == "tokens_per_s_per_gpu":
            pub_t = tokens / (published * gpus) if published else None
            return tokens / (t * gpus), pub_t
        if name == "tflops_per_gpu":
            pub_t = F / (published * 1e12 * gpus) if published else None
            return F / (t * gpus * 1e12), pub_t
        if name == "aggregate_pflops":
            pub_t = F / (published * 1e15) if published else None
            return F / (t * 1e15), pub_t
        if name == "weak_scaling_efficiency_pct":
            return self._weak_scaling(row, t, F, gpus), None
        raise Skip(f"no conversion from iteration time to {name!r} in validation/README.md")

    def _mfu_peak(self, row: dict[str, str], setup: Setup) -> float:
        peak, how = mfu_peak(row, setup.cluster_name)
        if how not in self._pending_notes:
            self._pending_notes.append(how)
        return peak

    def _weak_scaling(self, row: dict[str, str], t: float, F: float, gpus: int) -> float:
        base = self._baseline_row(row)
        if int(base["row_id"]) == int(row["row_id"]):
            raise Skip("row is its own weak-scaling baseline")
        base_rate = self.per_gpu_flops(base)
        note = (f"weak-scaling efficiency = predicted FLOP/s per GPU / predicted FLOP/s of the single-GPU "
                f"baseline row {base['row_id']} ({base_rate / 1e12:.1f} TFLOP/s)")
        if note not in self._pending_notes:
            self._pending_notes.append(note)
        return 100.0 * (F / (t * gpus)) / base_rate


def _error_pct(predicted: float | None, published: float | None) -> float | None:
    if predicted is None or not published:
        return None
    return 100.0 * (predicted - published) / published


# --------------------------------------------------------------------------- in-sample rows


def _mosaic_small(rows: list[dict[str, str]], gpu_type: str) -> list[int]:
    return [int(r["row_id"]) for r in rows if r["source"].startswith("MosaicML") and r["gpu_type"] == gpu_type
            and (cell_int(r, "gpus") or 0) <= 16]


#: Families whose rows existed before the in-sample rule below (their in-sample rows are named).
_NAMED_FAMILIES = ("Megatron SC'21", "Megatron 2019", "MosaicML")


def in_sample(rows: list[dict[str, str]]) -> dict[str, list[int]]:
    """Set name -> the in-sample row ids; every other row is held out.

    * ``A100`` and ``H100``: the rows calibrate.py was first fitted on: Megatron-LM SC'21
      Table 1 and MosaicML's one- and two-node runs (A100-40GB; H100-80GB).
    * One set per newer source family with at least 6 rows, chosen by rule and never by
      error: its rows are grouped by :func:`published_rows.group_key` (same model, GPU type,
      precision, software and metric: a layout sweep), mixture-of-experts rows left out; the
      first row (smallest ``row_id``) of each group is in-sample, groups taken in order of
      that row, at most a third of the family's rows (rounded down). The rest of each family
      stays held out.

    ``benchmarks/calibrate.py`` may fit on any of these rows and on no other. Rows from 5000 on
    (Megatron-Bridge on Blackwell, added with issue 42, when the engine stopped fitting
    anything on rows) are in no set: the sets stay those the per-device shares were judged on.
    """
    rows = [r for r in rows if int(r["row_id"]) < 5000]
    sc21 = [int(r["row_id"]) for r in rows if r["source"].startswith("Narayanan et al. SC'21")]
    out = {"A100": sc21 + _mosaic_small(rows, "A100-40GB"), "H100": _mosaic_small(rows, "H100-80GB")}
    families: dict[str, list[dict[str, str]]] = {}
    for r in sorted(rows, key=lambda r: int(r["row_id"])):
        families.setdefault(source_of(r), []).append(r)
    for fam, members in families.items():
        if fam in _NAMED_FAMILIES or fam not in SOURCES or len(members) < 6:
            continue
        firsts: dict[tuple, int] = {}
        for r in members:
            if not is_moe(r):
                firsts.setdefault(group_key(r), int(r["row_id"]))
        picked = sorted(firsts.values())[: len(members) // 3]
        if picked:
            out[fam] = picked
    return out
