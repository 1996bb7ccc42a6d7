"""A DeepSpeed config (JSON) for a layout (``soapbox export --format deepspeed``), and the
layout such a config gives back (for round trips).

Key names are DeepSpeed's config JSON reference (https://www.deepspeed.ai/docs/config-json/).
"""

from __future__ import annotations

from typing import Any
import json

from .cluster import Cluster
from .export_moe import deepspeed_expert_parallel, refuse
from .graph import OpGraph
from .layout import Layout


def to_deepspeed(lay: Layout, precision: str, graph: OpGraph | None = None) -> dict[str, Any]:
    """A DeepSpeed config (ZeRO data parallelism; expert parallelism by AutoEP)."""
    if lay.tp > 1 or lay.pp > 1 or lay.cp > 1:
        raise refuse("deepspeed", f"tensor / pipeline / context parallelism (tp {lay.tp}, pp {lay.pp}, cp {lay.cp}) "
                                   "is set in the model code, not in a DeepSpeed config",
                      "export --format megatron (Megatron-DeepSpeed takes its flags) or torchtitan")
    cfg: dict[str, Any] = {
        "train_batch_size": lay.global_batch,
        "train_micro_batch_size_per_gpu": lay.micro_batch,
        "gradient_accumulation_steps": lay.microbatches,
        "zero_optimization": {"stage": lay.zero_stage},
    }
    if lay.zero_stage >= 2 and lay.shard_group:
        cfg["zero_optimization"]["zero_hpz_partition_size"] = lay.shard_group  # (ZeRO++ hierarchical partitioning)
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif precision == "fp16":
        cfg["fp16"] = {"enabled": True}
    if lay.moe_comm_overlap:
        raise refuse("deepspeed", "Megatron-Core's merged-1F1B all-to-all overlap has no DeepSpeed setting",
                      "export --format megatron")
    if lay.recompute == "selective":
        raise refuse("deepspeed", "selective recomputation (Megatron's: attention's core only) has no DeepSpeed "
                                   "setting; DeepSpeed checkpoints whole layers", "export --format megatron")
    if lay.recompute == "selective-op":
        raise refuse("deepspeed", "torchtitan's per-op selective checkpointing has no DeepSpeed setting",
                      "export --format torchtitan")
    if lay.recompute == "full":
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
    cfg["zero_optimization"]["overlap_comm"] = lay.overlap_grad_reduce
    for key, where in (("offload_optimizer", lay.offload_optimizer), ("offload_param", lay.offload_params)):
        if where == "nvme":
            raise refuse("deepspeed", f"{key} to NVMe needs the nodes' NVMe mount (nvme_path), which soapbox does not "
                                       "know", f"export with cpu, then set {key}.device to nvme and its nvme_path")
        if where == "cpu":
            cfg["zero_optimization"][key] = {"device": "cpu", "pin_memory": True}
    ep = deepspeed_expert_parallel(lay, graph)
    if ep is not None:
        cfg["expert_parallel"] = ep
    return cfg


def layout_from_deepspeed(cfg: dict[str, Any], base: Layout) -> Layout:
    mb, gb = int(cfg["train_micro_batch_size_per_gpu"]), int(cfg["train_batch_size"])
    acc = int(cfg["gradient_accumulation_steps"])
    z = cfg["zero_optimization"]
    return Layout(tp=1, pp=1, dp=gb // (mb * acc), cp=1, vpp=1, micro_batch=mb, global_batch=gb, schedule="1f1b",
                  recompute="full" if "activation_checkpointing" in cfg else "none",
                  zero_stage=int(z["stage"]), sequence_parallel=False, fp8=False, tp_comm_overlap=False,
                  layers_per_stage=None, gather_unit=base.gather_unit, shard_group=int(z.get("zero_hpz_partition_size", 0)),
                  overlap_grad_reduce=bool(z.get("overlap_comm", base.overlap_grad_reduce)),
                  offload_optimizer=z.get("offload_optimizer", {}).get("device", "none"),
                  offload_params=z.get("offload_param", {}).get("device", "none"),
                  ep=int(cfg.get("expert_parallel", {}).get("autoep_size", 1)))


def render(lay: Layout, graph: OpGraph, cluster: Cluster) -> str:
    """The export's text."""
    return json.dumps(to_deepspeed(lay, graph.precision, graph), indent=2) + "\n"
