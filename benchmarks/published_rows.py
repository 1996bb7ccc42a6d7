"""Reading one row of the published-runs CSV (``validation/published_runs_public.csv``): its
cells, source family, cluster preset and the family's conventions; ``published_setup.py``
turns the result into the model and layout (:func:`published_setup.setup_for`).

A row is read in three steps:

1. its **source family** (:func:`source_of`: a short name per source, ``FAMILIES``);
2. the family's **reader** (``READERS``): the conventions of that source that its columns
   leave implicit, as cell overrides and notes (a framework's documented default where a
   value is missing), or a :class:`Skip` with the reason where nothing defensible exists;
3. the **generic reader** (``published_setup.setup_for``): columns -> ``GPTConfig``, cluster preset
   (``_cluster_name``) and the ``fsdp`` or ``megatron`` baseline with the row's layout.

Every assumption is a note printed with the row; no value is guessed silently. Mixture-of-
experts rows (notes starting ``ep=``) are skipped: soapbox cannot express them yet (issue 26).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.cluster import preset  # noqa: E402
from engine.cluster.devices import DEVICE_TYPES  # noqa: E402
from engine.cluster.presets import PRESETS  # noqa: E402
from engine.errors import printable  # noqa: E402
from engine.models.transformer import GPTConfig  # noqa: E402
from engine.ops import DTYPE_BYTES  # noqa: E402

__all__ = ["FAMILIES", "SOURCES", "Skip", "expert_parallel_of", "Setup", "cell_int", "cell_float", "cell_number",
           "source_of", "is_moe", "software_of", "group_key", "memory_counter", "mfu_peak", "READERS"]

#: (short family name, substrings of the ``source`` column that identify it); first match wins.
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Megatron SC'21", ("SC'21", "2104.04473")),
    ("Megatron 2019", ("Shoeybi", "1909.08053")),
    ("MosaicML", ("MosaicML", "llm-foundry")),
    ("torchtitan-community", ("torchtitan community",)),
    ("torchtitan", ("torchtitan",)),
    ("KempnerForge", ("KempnerForge",)),
    ("NeMo long-seq", ("NeMo long-sequence",)),
    ("Megatron-Bridge", ("Megatron-Bridge",)),
    ("Megatron-Core MoE", ("Megatron-Core MoE",)),
    ("Sailor", ("Sailor",)),
)
SOURCES = tuple(name for name, _ in FAMILIES)

#: The framework each family ran (``Setup.software["framework"]``).
FRAMEWORK = {"Megatron SC'21": "megatron", "Megatron 2019": "megatron", "MosaicML": "fsdp",
             "torchtitan": "torchtitan", "torchtitan-community": "torchtitan", "KempnerForge": "fsdp",
             "NeMo long-seq": "nemo", "Megatron-Bridge": "megatron", "Megatron-Core MoE": "megatron",
             "Sailor": "deepspeed"}

#: Families whose attention is fused by default (PyTorch SDPA's flash kernel, Transformer Engine).
FUSED_ATTENTION = {"torchtitan": "torch SDPA's flash kernel (torchtitan's attention)",
                   "torchtitan-community": "torch SDPA's flash kernel (torchtitan's attention)",
                   "KempnerForge": "torch SDPA's flash kernel (assumed: a torchtitan-style FSDP2 trainer)",
                   "NeMo long-seq": "Transformer Engine's fused attention (NeMo's default)",
                   "Megatron-Bridge": "Transformer Engine's fused attention (Megatron-Core's default)"}

#: Families whose runs materialise the attention scores (no fused attention), with the reason:
#: the Hopper default of :func:`published_setup` does not hold for them.
UNFUSED_ATTENTION = {"Sailor": "Sailor's Megatron-DeepSpeed fork fuses attention only with --use-flash-attn* "
                               "(megatron/arguments.py at cf2c8e3), which its launch script "
                               "(ae_scripts/clariden_scripts/run_opt.slurm) does not pass; nor --fp16/--bf16, which "
                               "flash attention needs"}


class Skip(Exception):
    """A row that cannot be predicted; the message is the reason shown to the user."""


@dataclass
class Setup:
    cfg: GPTConfig
    cluster_name: str
    build: Callable[[Any, Any], Any]  # (graph, cluster) -> Strategy
    layout: str
    recompute_full: bool
    assumptions: list[str]
    family: str = ""
    #: what the run's software did: compile, async_tp, fp8, fp8_all_gather (bool, or None where
    #: the row does not say) and framework; recorded for the engine's switches, not modelled yet
    software: dict[str, Any] = field(default_factory=dict)
    #: the PyTorch counter of the row's published peak memory: "reserved", "allocated" or None
    memory_counter: str | None = None
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    zero_stage: int = 0
    #: a mixture-of-experts row's model (() -> OpGraph: the sample builder with the row's batch,
    #: sequence and precision; ``cfg`` then only carries the sizes the metrics read) and its
    #: expert-parallel degree and top-k (Megatron's MoE FLOPs formula reads them)
    make_graph: Callable[[], Any] | None = None
    ep: int = 1
    top_k: int = 0


# --------------------------------------------------------------------------- cells


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
    """The row's source family (``FAMILIES``), or its ``source`` column for an unknown one."""
    s = row.get("source") or ""
    for name, keys in FAMILIES:
        if any(k in s for k in keys):
            return name
    return s


def is_moe(row: dict[str, str]) -> bool:
    """A mixture-of-experts run: its notes start with its expert-parallel degree (``ep=64;``,
    validation/README.md)."""
    return (row.get("notes") or "").lstrip().lower().startswith("ep=")


def expert_parallel_of(row: dict[str, str]) -> int:
    """The expert-parallel degree a MoE row's notes start with (``ep=64;`` -> 64)."""
    head = (row.get("notes") or "").lstrip()[3:].split(";")[0].strip()
    if not head.isdigit() or int(head) < 1:
        raise Skip(f"expert-parallel degree {head[:20]!r} in the notes is not a positive whole number")
    return int(head)


def _text(row: dict[str, str], *keys: str) -> str:
    return " ".join(row.get(k) or "" for k in keys).lower()


def software_of(row: dict[str, str]) -> dict[str, Any]:
    """What the row says its software did: framework, torch.compile, async TP, fp8 GEMMs, fp8
    all-gather, TP communication overlap (None where it does not say)."""
    notes = _text(row, "notes")
    text = _text(row, "notes", "precision", "sharding")
    if any(k in notes for k in ("no torch.compile", "torch.compile off", "eager mode")):
        compiled: bool | None = False
    else:
        compiled = True if "compile" in notes else None
    return {"framework": FRAMEWORK.get(source_of(row), ""), "compile": compiled,
            "async_tp": "async tp" in notes or "asynctp" in notes,
            "fp8": "fp8" in _text(row, "precision") and "presumed" not in _text(row, "precision"),
            "fp8_all_gather": "float8 all-gather" in text,
            "tp_comm_overlap": True if any(k in notes for k in ("tp-comm-overlap", "tp_comm_overlap", "userbuffer"))
            else None}


def group_key(row: dict[str, str]) -> tuple:
    """Rows that share a key differ only in their layout (or batch): a layout sweep. The key
    is (family, model, GPU type, precision, compile, async TP, metric)."""
    sw = software_of(row)
    return (source_of(row), row.get("model") or "", row.get("gpu_type") or "", row.get("precision") or "",
            sw["compile"], sw["async_tp"], row.get("metric_name") or "")


# --------------------------------------------------------------------------- cluster


#: (predicate on the upper-cased gpu_type, preset base); first match wins. GPUs per node come
#: from the preset itself.
GPU_PRESETS: tuple[tuple[Callable[[str], bool], str], ...] = (
    (lambda g: "GH200" in g, "gh200"),
    (lambda g: "GB200" in g, "gb200-nvl72"),
    (lambda g: "GB300" in g, "gb300-nvl72"),
    (lambda g: "B200" in g, "dgx-b200"),
    (lambda g: "B300" in g, "dgx-b300"),
    (lambda g: "H100" in g and ("GRAND TETON" in g or "HBM2E" in g), "grand-teton"),
    (lambda g: g.startswith("H100") and "PCIE" in g, "h100-pcie"),
    (lambda g: g.startswith("H100"), "dgx-h100"),
    (lambda g: g.startswith("H200"), "dgx-h200"),
    (lambda g: g.startswith("A100") and "40GB" in g, "dgx-a100-40gb"),
    (lambda g: g.startswith("A100"), "dgx-a100-80gb"),
    (lambda g: g.startswith("V100"), "v100-dgx2"),
    (lambda g: "4090" in g, "rtx4090"),
    (lambda g: "3090" in g, "rtx3090"),
    (lambda g: "2080" in g, "rtx2080ti"),
    (lambda g: "TITAN RTX" in g, "titan-rtx"),
)


@lru_cache(maxsize=None)
def _gpus_per_node(base: str) -> int:
    return preset(f"{base}:1").num_devices


def _cluster_name(row: dict[str, str], gpus: int, notes: list[str]) -> str:
    """``<preset>:<nodes>`` for the row's GPU type; a Skip naming the type without a preset."""
    raw = row.get("gpu_type") or ""
    g = raw.upper()
    base = next((b for test, b in GPU_PRESETS if test(g)), None)
    if base is None or base not in PRESETS:
        have = f" (no '{base}' preset yet)" if base else ""
        raise Skip(f"no cluster preset for GPU type {raw!r}{have}")
    if base in ("gb200-nvl72", "gb300-nvl72") and gpus > 72 and (gpus // 4) % 16 == 0:
        # Megatron-Bridge's launcher asks Slurm for --segment 16 (trays) when the job's trays are a
        # multiple of 16 above 18 (scripts/performance/utils/executors.py at 0fbfe7d3): 64-GPU NVLink domains
        base += "-seg16"
        notes.append("NVLink domains of 64 GPUs: the launcher's Slurm --segment 16 (16 trays of each rack)")
    if base == "dgx-a100-80gb" and ("80GB" not in g or "NOT STATED" in g):
        notes.append(f"gpu_type {raw!r}: modelled as DGX A100 80 GB (SXM4) nodes")
    if base == "v100-dgx2" and "SXM3" not in g and "DGX-2" not in g:
        notes.append(f"gpu_type {raw!r}: modelled on DGX-2H nodes (16 V100s on NVSwitch)")
    per = _gpus_per_node(base)
    stated = cell_number(row, "gpus_per_node")
    if stated and int(stated) != per and gpus > min(int(stated), per):
        notes.append(f"the row's nodes hold {int(stated)} GPUs, the {base} preset's {per}: "
                     f"{gpus} GPUs modelled on {max(1, math.ceil(gpus / per))} preset node(s)")
    return f"{base}:{max(1, math.ceil(gpus / per))}"


def mfu_peak(row: dict[str, str], cluster_name: str) -> tuple[float, str]:
    """(peak FLOP/s per GPU the source's MFU divides by, how it was chosen)."""
    notes = row.get("notes") or ""
    m = re.search(r"(\d+(?:\.\d+)?) TFLOP/s peak", notes)
    if m:
        return float(m.group(1)) * 1e12, f"MFU peak {m.group(1)} TFLOP/s, as the note states"
    if "SXM H100 peak" in notes:
        return DEVICE_TYPES["H100-SXM5-80GB"].peak("bf16"), "MFU peak: the H100 SXM dense bf16 peak, as the note states"
    dev = preset(f"{cluster_name.split(':')[0]}:1").device_type(0)
    return dev.peak("bf16"), f"MFU peak not stated: the {dev.name} dense bf16 peak"


def memory_counter(row: dict[str, str]) -> str | None:
    """The PyTorch counter behind a row's published peak memory: ``reserved``
    (``torch.cuda.max_memory_reserved``: torchtitan logs ``max_reserved_gib`` as its memory),
    ``allocated`` (``max_memory_allocated``, or a ``peak_alloc_gib`` metric), or None."""
    text = _text(row, "notes", "metric2_name")
    if "peak_alloc" in text or "max_memory_allocated" in text:
        return "allocated"
    if "reserved" in text or source_of(row) in ("torchtitan", "torchtitan-community"):
        return "reserved"
    if source_of(row) == "KempnerForge":  # its step log's peak_gb: max_memory_allocated (metrics/memory.py)
        return "allocated"
    return None


# --------------------------------------------------------------------------- family readers
# Each returns cell overrides for the generic reader (and appends notes), or raises Skip.


def _read_torchtitan(row: dict[str, str], notes: list[str]) -> dict[str, str]:
    # torchtitan's train.py (2024-25, the commits of its performance tables) compiles each
    # transformer block (apply_compile) and computes the loss eagerly, upcast:
    # loss_fn(pred, labels) = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
    notes.append("loss computed eagerly in fp32 (torchtitan's loss_fn: cross_entropy(pred.float()); torch.compile "
                 "wraps the transformer blocks only): kernels eager, which with its activation checkpointing "
                 "changes only the loss's memory")
    over: dict[str, str] = {"kernels": "eager"}
    vpp = (row.get("vpp") or "").strip()
    if vpp and not vpp.isdigit():
        raise Skip(f"interleaved 1F1B with an unstated number of stages per rank (vpp {vpp!r})")
    pp, dp, B = cell_int(row, "pp") or 1, cell_int(row, "dp"), cell_int(row, "global_batch")
    if pp > 1 and not (row.get("micro_batch") or "").strip() and dp and B:
        # torchtitan at 9dec370 (Dec 2024): --experimental.pipeline_parallel_microbatches
        # defaults to the number of pipeline stages; the local batch is global / FSDP degree.
        local = B // dp
        over["micro_batch"] = str(max(1, local // pp))
        notes.append(f"micro_batch missing: local batch {local} / {pp} micro-batches = {over['micro_batch']} "
                     "(torchtitan's default: as many micro-batches as pipeline stages)")
    return over


def _read_nemo(row: dict[str, str], notes: list[str]) -> dict[str, str]:
    over: dict[str, str] = {}
    if not (row.get("global_batch") or "").strip():
        if (cell_int(row, "pp") or 1) > 1:
            raise Skip("global and micro batch not published, and with pp > 1 the pipeline bubble depends on "
                       "the number of micro-batches, which nothing states")
        dp = cell_int(row, "dp") or 1
        over.update(global_batch=str(dp), micro_batch="1")
        notes.append("global/micro batch not published (the metric is a rate): micro-batch 1 (NeMo's Llama "
                     "configs), one micro-batch per data-parallel rank (global batch = dp); with pp = 1 the "
                     "batch only changes how often the gradient reduction is amortised")
    if (row.get("sharding") or "").strip().lower() in ("", "not stated"):
        over["sharding"] = "distributed optimizer"
        notes.append("sharding not stated: the distributed optimizer (ZeRO-1) of NeMo's Llama configs "
                     "(optim distributed_fused_adam)")
    return over


#: Megatron-Bridge's dense performance presets that offload activations, as (model, GPU, precision
#: words, global batch) -> (preset, cpu_offloading_num_layers): read from
#: scripts/performance/configs/llama/llama3_workload_base_configs.py at 0fbfe7d3 (the 0.4.0
#: release the 26.04 page's rows were measured with; the V2 presets are the page's GBS 256).
BRIDGE_OFFLOAD = {
    ("LLAMA3_70B", "GB300", "per-tensor current", 256): ("LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_CS_V2", 20),
    ("LLAMA3_70B", "GB200", "per-tensor current", 256): ("LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V2", 40),
}


def _read_megatron_bridge(row: dict[str, str], notes: list[str]) -> dict[str, str]:
    gpu, prec_words = row.get("gpu_type") or "", row.get("precision") or ""
    for (model, chip, words, batch), (preset, layers) in BRIDGE_OFFLOAD.items():
        if (row.get("model") == model and chip in gpu and words in prec_words
                and cell_int(row, "global_batch") == batch):
            notes.append(f"activations of the first {layers} layers offloaded to the host: {preset}'s "
                         f"cpu_offloading_num_layers (Megatron-Bridge 0.4.0, 0fbfe7d3)")
            return {"offload_activations": str(layers)}
    prec = (row.get("precision") or "").lower()
    if "not stated" in prec and ("fp8" in prec or "presumed" in prec):
        notes.append(f"precision {row.get('precision')!r}: fp8, as the row presumes")
        return {"precision": "fp8"}
    return {}


def _read_sailor(row: dict[str, str], notes: list[str]) -> dict[str, str]:
    if "tf32" not in DTYPE_BYTES:
        raise Skip("precision likely fp32/TF32 (not stated): soapbox's GPT models have no tf32 precision "
                   f"(engine.ops.DTYPE_BYTES: {', '.join(k for k in DTYPE_BYTES if k.startswith(('fp', 'bf')))})")
    notes.append("precision not stated, 'likely fp32/TF32': TF32 GEMMs")
    return {"precision": "tf32"}


def _read_megatron_2019(row: dict[str, str], notes: list[str]) -> dict[str, str]:
    if (row.get("recompute") or "").strip():
        return {}
    # Megatron-LM's README at 93ab4be (Sep 2019, the paper's release): the GPT-2 pretraining
    # script has "activation checkpointing ... turned on with --checkpoint-activations and
    # --checkpoint-num-layers set to checkpoint every 1 layers".
    notes.append("recompute not stated: full, every layer (Megatron-LM's 2019 GPT-2 recipe: "
                 "--checkpoint-activations --checkpoint-num-layers 1, README at 93ab4be)")
    return {"recompute": "full"}


def _read_kempnerforge(row: dict[str, str], notes: list[str]) -> dict[str, str]:
    # KempnerForge at the report's commit (01b461a): scripts/train.py builds the model with
    # build_parallel_model(..., param_dtype=tc.param_dtype), which casts it to that dtype
    # (kempnerforge/distributed/parallel.py: Transformer(...).to(device, dtype=param_dtype), or
    # model.to(dtype=param_dtype) after FSDP2) before build_optimizer sees it; the training
    # config's mixed_precision defaults to "bf16" (kempnerforge/config/schema.py). AdamW then
    # keeps its moments in the parameters' dtype: no fp32 master copy.
    # Its training loop wraps every micro-step but the last in maybe_no_sync
    # (kempnerforge/training/grad.py at 01b461a: model.set_requires_gradient_sync(False)), so FSDP2
    # accumulates unsharded gradients and reduce-scatters once an iteration.
    notes.append("optimizer state bf16 (no fp32 master copy): KempnerForge casts the model to bf16 before FSDP2 "
                 "and AdamW (build_parallel_model at 01b461a); gradient accumulation without a reduce-scatter per "
                 "micro-step (maybe_no_sync: set_requires_gradient_sync(False))")
    out = {"optimizer_state": "bf16", "accumulate_unsharded": "yes"}
    # kempnerforge/distributed/tensor_parallel.py at 01b461a: "Output head: ColwiseParallel
    # (split vocab, gather to Replicate for loss)"; scripts/train.py then calls F.cross_entropy
    # on the whole logits on every tensor-parallel rank
    if (cell_int(row, "tp") or 1) > 1:
        notes.append("loss on gathered logits: KempnerForge's output head is gathered to Replicate for the loss "
                     "(tensor_parallel.py at 01b461a)")
        out["loss_parallel"] = "no"
    return out


READERS: dict[str, Callable[[dict[str, str], list[str]], dict[str, str]]] = {
    "Megatron 2019": _read_megatron_2019,
    "KempnerForge": _read_kempnerforge,
    "torchtitan": _read_torchtitan,
    "torchtitan-community": _read_torchtitan,
    "NeMo long-seq": _read_nemo,
    "Megatron-Bridge": _read_megatron_bridge,
    "Sailor": _read_sailor,
}
