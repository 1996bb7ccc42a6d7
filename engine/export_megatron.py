"""Megatron-LM (Megatron-Core) command-line flags for a layout (``soapbox export --format
megatron``), and the layout such flags give back (for round trips).

Flag names are Megatron-LM's ``megatron/training/arguments.py``.
"""

from __future__ import annotations

from typing import Any
import re
import shlex

from .cluster import Cluster
from .export_moe import megatron_moe_flags, megatron_pipeline_layout, refuse
from .graph import OpGraph
from .layout import Layout, layer_blocks
from .search.layouts import balanced_layers


def to_megatron(lay: Layout, graph: OpGraph | None = None) -> list[str]:
    """Megatron-LM (Megatron-Core) command-line flags; with ``graph``, also its MoE and MLA
    settings (:func:`engine.export_moe.megatron_moe_flags`) and an uneven interleaved split."""
    if lay.zero_stage >= 2:
        raise refuse("megatron", f"ZeRO stage {lay.zero_stage} has no Megatron-LM flag (its distributed optimizer "
                                  "is ZeRO-1)", "export --format torchtitan (FSDP) or deepspeed")
    f = ["--tensor-model-parallel-size", str(lay.tp), "--pipeline-model-parallel-size", str(lay.pp)]
    if lay.cp > 1:
        f += ["--context-parallel-size", str(lay.cp)]
    chunks = balanced_layers(len(layer_blocks(graph)), lay.pp * lay.vpp) if graph is not None and lay.vpp > 1 else []
    if len(set(chunks)) > 1:  # (the balanced split build_layout makes: only a layout string says it)
        f += ["--pipeline-model-parallel-layout", megatron_pipeline_layout(chunks, lay.pp)]
    elif lay.vpp > 1:
        f += ["--num-virtual-stages-per-pipeline-rank", str(lay.vpp)]
    if lay.layers_per_stage and len(set(lay.layers_per_stage)) > 1:
        first, *mid, last = lay.layers_per_stage
        if len(set(mid)) > 1:
            raise refuse("megatron", f"layers per stage {list(lay.layers_per_stage)}: Megatron-LM sets only the "
                                      "first and last stage's layers", "make the middle stages even")
        f += ["--decoder-first-pipeline-num-layers", str(first), "--decoder-last-pipeline-num-layers", str(last)]
    if lay.sequence_parallel:
        f.append("--sequence-parallel")
    if lay.tp_comm_overlap:
        f.append("--tp-comm-overlap")
    if lay.recompute == "selective-op":
        raise refuse("megatron", "torchtitan's per-op selective checkpointing has no Megatron-LM flag (its "
                                  "'selective' recomputes the attention core only)", "export --format torchtitan")
    if lay.offload_optimizer != "none" or lay.offload_params != "none":
        raise refuse("megatron", "ZeRO-Offload (optimizer state and step on the host) is DeepSpeed's; Megatron-Core's "
                                  "--optimizer-cpu-offload is a different hybrid optimizer", "export --format deepspeed")
    if lay.recompute == "selective":
        f += ["--recompute-granularity", "selective"]
        if lay.recompute_modules:
            f += ["--recompute-modules", *lay.recompute_modules]
    elif lay.recompute == "full":
        f += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if lay.zero_stage == 1:
        f.append("--use-distributed-optimizer")
    if lay.moe_comm_overlap:  # (Megatron-Core 0.14's merged 1F1B; it needs the delayed weight gradient)
        f += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if lay.overlap_grad_reduce:  # (on in the simulation unless turned off; Megatron-LM's default is off)
        f.append("--overlap-grad-reduce")
        if lay.overlap_param_gather and lay.zero_stage == 1:
            f.append("--overlap-param-gather")
    if lay.fp8:
        f += ["--fp8-format", "hybrid"]
        if lay.fp8_params:
            f.append("--fp8-param-gather")
    if lay.pp > 1 and lay.schedule == "gpipe":
        raise refuse("megatron", "the GPipe schedule has no Megatron-LM flag (it runs 1F1B, or interleaved with "
                                  "virtual stages)", "use 1f1b")
    f += ["--micro-batch-size", str(lay.micro_batch), "--global-batch-size", str(lay.global_batch)]
    if graph is not None:
        f += megatron_moe_flags(graph, lay)
    elif lay.ep * lay.etp > 1:
        raise ValueError("to_megatron: an expert-parallel layout's flags need the model (graph=...)")
    return f


def layout_from_megatron(flags: list[str], base: Layout) -> Layout:
    """The layout Megatron-LM flags give (``base`` supplies what they do not say: the layer
    split when even, the gather unit); for round trips."""
    v: dict[str, Any] = {}
    k = 0
    while k < len(flags):
        name, values = flags[k], []
        k += 1
        while k < len(flags) and not flags[k].startswith("--"):  # (--recompute-modules takes several)
            values.append(flags[k])
            k += 1
        v[name] = (values if name == "--recompute-modules" else values[0]) if values else True
    tp, pp, cp = int(v["--tensor-model-parallel-size"]), int(v["--pipeline-model-parallel-size"]), \
        int(v.get("--context-parallel-size", 1))
    mb, gb = int(v["--micro-batch-size"]), int(v["--global-batch-size"])
    counts = base.layers_per_stage
    if "--decoder-first-pipeline-num-layers" in v:
        first, last = int(v["--decoder-first-pipeline-num-layers"]), int(v["--decoder-last-pipeline-num-layers"])
        total = sum(base.layers_per_stage or ())
        mid = (total - first - last) // max(1, pp - 2)
        counts = (first, *([mid] * (pp - 2)), last)
    vpp = int(v.get("--num-virtual-stages-per-pipeline-rank", 1))
    if "--pipeline-model-parallel-layout" in v:  # (stages split by "|"; "(tt|)*29" repeats one)
        text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)),
                      v["--pipeline-model-parallel-layout"])
        vpp = (text.count("|") + 1) // pp
    ep, etp = int(v.get("--expert-model-parallel-size", 1)), int(v.get("--expert-tensor-parallel-size", 1))
    return Layout(tp=tp, pp=pp, dp=base.dp, cp=cp, ep=ep, etp=etp, vpp=vpp, micro_batch=mb, global_batch=gb,
                  schedule="interleaved" if vpp > 1 else "1f1b", recompute=v.get("--recompute-granularity", "none"),
                  zero_stage=1 if v.get("--use-distributed-optimizer") else 0,
                  sequence_parallel=bool(v.get("--sequence-parallel")), fp8="--fp8-format" in v,
                  tp_comm_overlap=bool(v.get("--tp-comm-overlap")), layers_per_stage=counts,
                  gather_unit=base.gather_unit, shard_group=base.shard_group,
                  overlap_grad_reduce="--overlap-grad-reduce" in v, overlap_param_gather="--overlap-param-gather" in v,
                  fp8_params="--fp8-param-gather" in v, grad_reduce_in_fp32=base.grad_reduce_in_fp32,
                  recompute_modules=tuple(v.get("--recompute-modules", ())),
                  moe_comm_overlap="--overlap-moe-expert-parallel-comm" in v)


def render(lay: Layout, graph: OpGraph, cluster: Cluster) -> str:
    """The export's text (shell-quoted: a layout string or --moe-layer-freq list has | ( ) *)."""
    return shlex.join(to_megatron(lay, graph)) + "\n"
