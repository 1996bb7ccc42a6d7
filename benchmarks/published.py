"""The published training runs (``shared/validation/published_runs_public.csv``), shared by
``benchmarks/validate_published.py`` (which predicts and prints every row) and
``benchmarks/calibrate.py`` (which fits the cost model's constants on the in-sample rows):
loading the rows, reading a row's columns into a model, cluster and layout (:func:`setup_for`),
predicting its published metric with the engine's entry point (:class:`Predictor`), and which
rows the constants are fitted on (:func:`in_sample`). Neither script imports the other.
"""

from __future__ import annotations

import csv
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.cluster import preset
from engine.errors import printable
from engine.models.transformer import GPTConfig, gpt
from engine.report import simulate_strategy
from engine.search.baselines import fsdp, megatron

__all__ = ["ROOT", "SOURCES", "Skip", "RowResult", "Setup", "Predictor", "default_csv", "load_rows", "cell_int",
           "cell_float", "cell_number", "source_of", "megatron_flops", "setup_for", "in_sample"]


def default_csv() -> Path:
    for base in (ROOT.parent / "shared", ROOT / "shared"):
        p = base / "validation" / "published_runs_public.csv"
        if p.exists():
            return p
    return ROOT.parent / "shared" / "validation" / "published_runs_public.csv"


def load_rows(path: Path | None = None) -> list[dict[str, str]]:
    """Every row of the published-runs CSV (``path``, default :func:`default_csv`), as read."""
    with (path or default_csv()).open(newline="") as f:
        return list(csv.DictReader(f))


SOURCES = ("Megatron SC'21", "Megatron 2019", "MosaicML")


class Skip(Exception):
    """A row that cannot be predicted; the message is the reason shown to the user."""


@dataclass
class RowResult:
    row_id: int
    source: str
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
    num_tasks: int | None = None
    wall_s: float = 0.0
    cluster: str = ""
    assumptions: list[str] = field(default_factory=list)
    not_compared: str | None = None  # why metric2 is not compared, when it is not
    skipped: str | None = None


# --------------------------------------------------------------------------- CSV helpers


def cell_int(row: dict[str, str], key: str) -> int | None:
    v = cell_float(row, key)
    return int(v) if v is not None else None


def cell_float(row: dict[str, str], key: str) -> float | None:
    """The cell as a number (thousands separators allowed); None when empty; a Skip naming
    the column when it is not a number."""
    v = (row.get(key) or "").strip().replace(",", "").replace("_", "")
    if not v:
        return None
    try:
        x = float(v)
    except ValueError:
        raise Skip(f"column {key} is not a number: {printable(row.get(key), 40)!r}") from None
    if not math.isfinite(x):
        raise Skip(f"column {key} is not a finite number: {row.get(key)!r}")
    return x


def cell_number(row: dict[str, str], key: str) -> Any:
    """:func:`cell_float` (an int for ``gpus``), or None where the cell is not a number (the row
    is then skipped with the reason when its setup reads the cell)."""
    try:
        v = cell_float(row, key)
    except Skip:
        return None
    return int(v) if v is not None and key == "gpus" else v


def source_of(row: dict[str, str]) -> str:
    s = row["source"]
    if "SC'21" in s or "2104.04473" in s:
        return "Megatron SC'21"
    if "Shoeybi" in s or "1909.08053" in s:
        return "Megatron 2019"
    if "MosaicML" in s or "llm-foundry" in s:
        return "MosaicML"
    return s


# --------------------------------------------------------------------------- metrics


def megatron_flops(B: int, s: int, l: int, h: int, V: int, recompute: bool) -> float:
    """FLOPs per iteration as Megatron counts them (Narayanan et al. SC'21, Eq. 3).

    With full recomputation (the SC'21 runs) each layer's forward runs twice:
    ``96 B s l h^2 (1 + s/6h + V/16lh)``. Without it the same count is
    ``72 B s l h^2 (1 + s/6h + V/12lh)`` (forward + backward = 3x the forward; the logit
    layer is never recomputed)."""
    if recompute:
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


# --------------------------------------------------------------------------- row -> setup


@dataclass
class Setup:
    cfg: GPTConfig
    cluster_name: str
    build: Callable[[Any, Any], Any]  # (graph, cluster) -> Strategy
    layout: str
    recompute_full: bool
    assumptions: list[str]


def _cluster_name(row: dict[str, str], gpus: int, notes: list[str] | None = None) -> str:
    gt = (row.get("gpu_type") or "").upper()
    notes = notes if notes is not None else []
    if gt.startswith("A100") and "40GB" in gt:
        base, per = "dgx-a100-40gb", 8
    elif gt.startswith("A100"):
        base, per = "dgx-a100-80gb", 8
        if "80GB" not in gt:
            notes.append(f"gpu_type {row.get('gpu_type')!r} states no memory size: the 80 GB A100")
    elif gt.startswith("V100"):
        base, per = "v100-dgx2", 16
        if "SXM3" not in gt and "DGX-2" not in gt:
            notes.append(f"gpu_type {row.get('gpu_type')!r}: modelled on DGX-2H nodes (16 V100s on NVSwitch)")
    elif gt.startswith(("H200", "GH200")):
        base, per = "dgx-h200", 8
    elif gt.startswith("H100") and "PCIE" not in gt:
        base, per = "dgx-h100", 8  # H100 SXM5 nodes: 8 GPUs on NVSwitch, 8 x 400 Gb/s NICs
    else:
        raise Skip(f"no cluster preset for GPU type {row.get('gpu_type')!r}")
    nodes = max(1, math.ceil(gpus / per))
    return f"{base}:{nodes}"


def _zero_of(row: dict[str, str]) -> tuple[int, str, str, bool]:
    """(ZeRO stage, gather unit, framework, hybrid) from the row's ``sharding`` column.

    PyTorch FSDP's sharding strategies (torch.distributed.fsdp.ShardingStrategy): FULL_SHARD
    shards parameters, gradients and optimizer state (ZeRO-3); SHARD_GRAD_OP shards gradients
    and optimizer state and keeps parameters after the forward (ZeRO-2). DeepSpeed names its
    stages ZeRO-1/2/3 and gathers each module's parameters on their own (gather unit "op");
    Megatron's distributed optimizer is ZeRO-1. HYBRID_SHARD (HSDP) shards within a node
    and replicates across nodes; _HYBRID_SHARD_ZERO2 does so with ZeRO-2."""
    text = " ".join((row.get("sharding") or "", row.get("source") or "")).lower()
    sharding = (row.get("sharding") or "").lower()
    deepspeed = "deepspeed" in text or "zero" in sharding and "fsdp" not in sharding
    hybrid = "hybrid_shard" in sharding or "hsdp" in sharding or "mics" in sharding
    if hybrid:
        stage = 2 if "zero2" in sharding else 3
    elif "full_shard" in sharding or any(k in sharding for k in ("zero-3", "zero3", "zero stage 3", "stage 3")):
        stage = 3
    elif "shard_grad_op" in sharding or any(k in sharding for k in ("zero-2", "zero2", "zero stage 2", "stage 2")):
        stage = 2
    elif any(k in sharding for k in ("zero-1", "zero1", "zero stage 1", "stage 1", "distributed optimizer",
                                     "distributed-optimizer", "distributed_optimizer")):
        stage = 1
    elif "fsdp" in sharding:
        stage = 3  # FSDP's default sharding strategy
    else:
        stage = 0
    framework = "deepspeed" if deepspeed else "fsdp" if "fsdp" in text else "megatron"
    return stage, ("op" if deepspeed and stage == 3 else "block"), framework, hybrid


def _model_config(row: dict[str, str], src: str, shape: dict[str, Any], precision: str,
                  notes: list[str]) -> GPTConfig:
    """The row's model: the source's conventions where soapbox knows them, else the family
    its name says (LLaMA-like: SwiGLU, RMSNorm, rotary, no biases, untied; otherwise GPT-3's
    conventions as Megatron-LM sets them)."""
    name = f"row-{row['row_id']}"
    text = " ".join((row.get("model") or "", row.get("notes") or "")).lower()
    gpu = (row.get("gpu_type") or "").upper()
    if src in ("Megatron SC'21", "Megatron 2019"):
        return GPTConfig(**shape, positions="learned", bias=True, tie_embeddings=True, dropout=0.1,
                         precision=precision, name=name)
    if src == "MosaicML":
        # MPT (llm-foundry): ALiBi (no position parameters -> 'rotary', which adds none), no
        # biases, LayerNorm, tied embeddings; the benchmark yamls set every dropout to 0.
        # attn_impl: flash in the benchmark yamls -> fused causal attention.
        return GPTConfig(**shape, positions="rotary", bias=False, tie_embeddings=True, dropout=0.0,
                         precision=precision, flash_attention=True, name=name)
    # FlashAttention (or cuDNN's fused attention through Transformer Engine) is every framework's
    # default on Hopper; elsewhere only where the row says so
    flash = "flash" in text or "fused attention" in text or gpu.startswith(("H100", "H200", "GH200"))
    if flash and "flash" not in text:
        notes.append("fused (flash) attention: the default of every framework on Hopper GPUs")
    llama = any(k in text for k in ("llama", "mistral", "mixtral", "qwen", "swiglu", "gemma", "nemotron"))
    if llama:
        notes.append("LLaMA-family model: SwiGLU MLP, RMSNorm, rotary positions, no biases, untied embeddings")
        return GPTConfig(**shape, swiglu=True, norm="rmsnorm", positions="rotary", bias=False, tie_embeddings=False,
                         dropout=0.0, precision=precision, flash_attention=flash, name=name)
    notes.append("GPT-style model (Megatron-LM's GPT conventions: learned positions, biases, tied embeddings, "
                 "dropout 0.1)")
    return GPTConfig(**shape, positions="learned", bias=True, tie_embeddings=True, dropout=0.1,
                     precision=precision, flash_attention=flash, name=name)


def setup_for(row: dict[str, str]) -> Setup:
    """The model, cluster and layout a row states, from its columns (any source): ``tp``,
    ``pp``, ``dp``, ``vpp``, ``micro_batch``, ``sharding`` (ZeRO stage and framework),
    ``recompute``, ``precision`` and the GPU type; a framework default where a value is
    missing, printed with the row."""
    src = source_of(row)
    notes: list[str] = []
    need = {k: cell_int(row, k) for k in ("layers", "hidden", "heads", "vocab", "global_batch", "gpus")}
    missing = [k for k, v in need.items() if v is None]
    if missing:
        raise Skip(f"missing {', '.join(missing)} in the row")
    layers, hidden, heads, vocab = need["layers"], need["hidden"], need["heads"], need["vocab"]
    B, gpus = need["global_batch"], need["gpus"]
    seq = cell_int(row, "seq_len")
    if seq is None:
        if src == "Megatron 2019":
            # Not a guess: Shoeybi et al. 2019 (arXiv 1909.08053 §5) train every GPT-2 model
            # with 1024-token sequences, as the row's notes say.
            seq = 1024
            notes.append("seq_len missing: 1024, the sequence length of all GPT-2 runs in Shoeybi et al. 2019")
        else:
            raise Skip("seq_len missing and the source states none")
    ffn = cell_int(row, "ffn_hidden")
    kv = cell_int(row, "kv_heads")
    tp, pp, dp = cell_int(row, "tp") or 1, cell_int(row, "pp") or 1, cell_int(row, "dp")
    vpp = cell_int(row, "vpp") or 1
    cp = cell_int(row, "cp") or 1
    rec_col = (row.get("recompute") or "").strip().lower()
    recompute = "full" if rec_col.startswith("full") else "selective" if rec_col.startswith("selective") else "none"
    if not rec_col:
        notes.append("recompute not stated: none (Megatron-LM default); FLOPs counted without recompute")
    prec_col = (row.get("precision") or "").lower()
    fp8 = "fp8" in prec_col
    precision = "bf16" if "bf16" in prec_col else "fp16" if "fp16" in prec_col else "fp32" if "fp32" in prec_col else None
    if fp8 and precision is None:
        precision = "bf16"
        notes.append("fp8: the linear layers' GEMMs in fp8 (Transformer Engine), the rest in bf16")
    if precision is None:
        raise Skip(f"precision {row.get('precision')!r} not recognised")
    mbs = cell_int(row, "micro_batch")
    cluster_name = _cluster_name(row, gpus, notes)
    if ffn is None and not any(k in (row.get("model") or "").lower() for k in ("llama", "mistral", "qwen")):
        ffn = 4 * hidden
        notes.append(f"ffn_hidden missing: 4h = {ffn} (GPT-2 / Megatron default)")
    shape = dict(layers=layers, hidden=hidden, heads=heads, seq_len=seq, vocab=vocab, batch=B, kv_heads=kv,
                 ffn_hidden=ffn)
    cfg = _model_config(row, src, shape, precision, notes)
    zero, unit, framework, hybrid = _zero_of(row)
    shard_group = 0
    if hybrid:
        per_node = cell_int(row, "gpus_per_node") or 8  # the DGX presets' 8
        shard_group = max(1, per_node // (tp * cp))
        notes.append(f"hybrid sharding: ZeRO-{zero} within each node ({shard_group} data-parallel ranks), "
                     "replicas across nodes")
    text = " ".join((row.get("notes") or "", row.get("sharding") or "")).lower()
    sp = "sequence parallel" in text or "sequence-parallel" in text or "sequence_parallel" in text
    overlap = any(k in text for k in ("tp-comm-overlap", "tp comm overlap", "tp_comm_overlap", "userbuffer"))
    if overlap and not (sp and tp > 1):
        notes.append("tp-comm-overlap stated without sequence parallelism and tp > 1: not modelled")
        overlap = False
    if src == "MosaicML" or (zero == 3) or (framework == "fsdp" and zero):
        if vpp > 1:
            raise Skip(f"ZeRO-{zero} with interleaved pipelining (vpp {vpp}) is not modelled by the fsdp baseline")
        if dp is not None and tp * cp * pp * dp != gpus:
            raise Skip(f"tp*cp*pp*dp = {tp * cp * pp * dp} does not equal the row's {gpus} GPUs")
        if mbs is None:
            notes.append("micro_batch missing: no gradient accumulation (Composer's and DeepSpeed's default: the "
                         "whole per-device batch)" if pp == 1 else "micro_batch missing: 1 (pipelined)")
        if sp:
            notes.append("sequence parallelism with ZeRO-3 is not modelled: tensor parallelism without it")
        zero = zero or 3

        def build(g, c, mbs=mbs, recompute=recompute, zero=zero, tp=tp, pp=pp, unit=unit, cp=cp, fp8=fp8,
                  k=shard_group):
            return fsdp(g, c, zero_stage=zero, micro_batch=mbs, recompute=recompute, tp=tp, pp=pp, gather_unit=unit,
                        cp=cp, fp8=fp8, shard_group=k if k and k < gpus // (tp * cp * pp) else 0)

        layout = (f"{'fp8 ' if fp8 else ''}{framework}-zero{zero} tp{tp}/{f'cp{cp}/' if cp > 1 else ''}pp{pp}/dp{gpus // (tp * cp * pp)} "
                  f"mbs{mbs} rc={recompute}")
        if unit == "op":
            layout += " per-op"
        if shard_group:
            layout += f" hybrid{shard_group}"
    else:
        if dp is None:
            dp = gpus // (tp * cp * pp)
            notes.append(f"dp missing: gpus/(tp*cp*pp) = {dp}")
        if tp * cp * pp * dp != gpus:
            raise Skip(f"tp*cp*pp*dp = {tp * cp * pp * dp} does not equal the row's {gpus} GPUs")
        if mbs is None:
            if src == "Megatron 2019" and pp == 1:
                # Megatron-LM 2019 had no gradient accumulation: --batch-size is the batch of
                # one data-parallel replica, so global batch = batch-size x dp.
                mbs = B // dp
                notes.append(f"micro_batch missing: global_batch/dp = {mbs} (Megatron-LM 2019 has no gradient "
                             "accumulation; --batch-size is per data-parallel replica)")
            else:
                # Megatron-LM's --micro-batch-size default is None; the baseline's documented
                # default is global/dp without pipelining, 1 with it.
                notes.append("micro_batch missing: soapbox megatron baseline default "
                             "(global/dp without pipelining, 1 with it)")

        def build(g, c, tp=tp, pp=pp, dp=dp, mbs=mbs, vpp=vpp, recompute=recompute, sp=sp, zero=zero, cp=cp, fp8=fp8,
                  overlap=overlap):
            return megatron(g, c, tp=tp, pp=pp, dp=dp, micro_batch=mbs, vpp=vpp, recompute=recompute,
                            sequence_parallel=sp and tp > 1, zero_stage=zero, cp=cp, fp8=fp8, tp_comm_overlap=overlap)

        layout = (f"{'fp8 ' if fp8 else ''}tp{tp}/{f'cp{cp}/' if cp > 1 else ''}pp{pp}/dp{dp}/vpp{vpp} {'zero' + str(zero) if zero else 'ddp'}{' sp' if sp else ''}{' overlap' if overlap else ''} "
                  f"mbs{mbs if mbs is not None else '-'} rc={recompute}")
    return Setup(cfg, cluster_name, build, layout, recompute == "full", notes)


# --------------------------------------------------------------------------- one row


class Predictor:
    """Simulates rows on demand and caches results (rows 43-46 need the 2019 baseline row)."""

    def __init__(self, rows: list[dict[str, str]], cost=None):
        self.cost = cost  # the cost model (None: the calibrated default)
        self.rows = {int(r["row_id"]): r for r in rows}
        self.cache: dict[int, RowResult] = {}
        self.sim_cache: dict[int, tuple[float, float]] = {}  # row id -> (t, achieved FLOP/s per GPU)
        self._pending_notes: list[str] = []

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
        src = source_of(row)
        res = RowResult(rid, src, row.get("model") or "", cell_number(row, "gpus") or 0,
                        metric_name=row.get("metric_name") or "", published=cell_number(row, "metric_value"),
                        metric2_name=row.get("metric2_name") or "", published2=cell_number(row, "metric2_value"))
        t0 = time.perf_counter()
        outer_notes, self._pending_notes = self._pending_notes, []
        try:
            setup = setup_for(row)
            res.layout, res.cluster, res.assumptions = setup.layout, setup.cluster_name, setup.assumptions
            try:
                graph = gpt(setup.cfg)
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
            c = setup.cfg
            F = megatron_flops(c.batch, c.seq_len, c.layers, c.hidden, c.vocab, setup.recompute_full)
            self.sim_cache[rid] = (t, F / (t * res.gpus))
            res.predicted, res.published_iteration_time_s = self.metric(row, row["metric_name"], res.published,
                                                                         setup, t, F)
            if res.metric2_name and res.published2 is not None:
                try:
                    res.predicted2, _ = self.metric(row, res.metric2_name, res.published2, setup, t, F)
                except Skip as e:
                    res.not_compared = str(e)
        except Skip as e:
            res.skipped = str(e)
        res.assumptions.extend(self._pending_notes)
        self._pending_notes = outer_notes
        res.wall_s = time.perf_counter() - t0
        if res.predicted is not None and res.published:
            res.error_pct = 100.0 * (res.predicted - res.published) / res.published
        if res.predicted2 is not None and res.published2:
            res.error2_pct = 100.0 * (res.predicted2 - res.published2) / res.published2
        self.cache[rid] = res
        return res

    def metric(self, row: dict[str, str], name: str, published: float | None, setup: Setup, t: float,
                F: float) -> tuple[float, float | None]:
        """(predicted metric, iteration time implied by the published value or None)."""
        c, gpus = setup.cfg, cell_int(row, "gpus")
        tokens = c.batch * c.seq_len
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
            base = self._baseline_row(row)
            if int(base["row_id"]) == int(row["row_id"]):
                raise Skip("row is its own weak-scaling baseline")
            base_rate = self.per_gpu_flops(base)
            note = (f"weak-scaling efficiency = predicted FLOP/s per GPU / predicted FLOP/s of the single-GPU "
                    f"baseline row {base['row_id']} ({base_rate / 1e12:.1f} TFLOP/s)")
            pending = self._pending_notes
            if note not in pending:
                pending.append(note)
            return 100.0 * (F / (t * gpus)) / base_rate, None
        raise Skip(f"no conversion from iteration time to {name!r} in shared/validation/README.md")


# --------------------------------------------------------------------------- calibration rows


def _mosaic_small(rows: list[dict[str, str]], gpu_type: str) -> list[int]:
    return [int(r["row_id"]) for r in rows if r["source"].startswith("MosaicML") and r["gpu_type"] == gpu_type
            and (cell_int(r, "gpus") or 0) <= 16]


def in_sample(rows: list[dict[str, str]]) -> dict[str, list[int]]:
    """Device family -> the row ids ``benchmarks/calibrate.py`` fits its constants on
    (Megatron-LM SC'21 Table 1 and MosaicML's one- and two-node runs); every other row is
    held out."""
    sc21 = [int(r["row_id"]) for r in rows if r["source"].startswith("Narayanan et al. SC'21")]
    return {"A100": sc21 + _mosaic_small(rows, "A100-40GB"), "H100": _mosaic_small(rows, "H100-80GB")}
