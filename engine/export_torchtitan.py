"""A torchtitan job config for a layout (``soapbox export --format torchtitan``), and the
layout such a config gives back (for round trips).

Names are torchtitan's ``torchtitan/config/job_config.py``.
"""

from __future__ import annotations



from .cluster import Cluster
from .export_moe import refuse, torchtitan_expert_lines
from .graph import OpGraph
from .layout import Layout


def to_torchtitan(lay: Layout, precision: str, seq_len: int, graph: OpGraph | None = None) -> str:
    """A torchtitan job config (TOML)."""
    if lay.zero_stage == 1:
        raise refuse("torchtitan", "ZeRO-1 (sharded optimizer state only) has no torchtitan setting (FSDP shards "
                                    "parameters too)", "export --format megatron (--use-distributed-optimizer)")
    shard = lay.dp if lay.zero_stage >= 2 else 1
    replicate = 1 if lay.zero_stage >= 2 else lay.dp
    if lay.zero_stage >= 2 and lay.shard_group:
        shard, replicate = lay.shard_group, lay.dp // lay.shard_group
    sched = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}[lay.schedule]
    lines = [
        "# written by soapbox export (torchtitan job config)",
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f'fsdp_reshard_after_forward = "{"never" if lay.zero_stage == 2 else "default"}"',
        f"tensor_parallel_degree = {lay.tp}",
        f"context_parallel_degree = {lay.cp}",
        f"pipeline_parallel_degree = {lay.pp}",
        f'pipeline_parallel_schedule = "{sched}"',
        f"pipeline_parallel_microbatch_size = {lay.micro_batch}",
        *torchtitan_expert_lines(lay, graph, shard),
        "",
        "[training]",
        f"local_batch_size = {lay.global_batch // lay.dp}",
        f"global_batch_size = {lay.global_batch}",
        f"seq_len = {seq_len}",
        f'mixed_precision_param = "{ {"bf16": "bfloat16", "fp16": "float16"}.get(precision, "float32") }"',
        "",
        "[activation_checkpoint]",
        f'mode = "{"selective" if lay.recompute == "selective-op" else lay.recompute}"',
    ]
    if lay.recompute == "selective-op":
        lines.append('selective_ac_option = "op"')
    if lay.recompute_modules or lay.moe_comm_overlap:
        raise refuse("torchtitan", "Megatron-Core's recompute modules and MoE all-to-all overlap have no torchtitan "
                                    "setting", "export --format megatron")
    if lay.offload_optimizer != "none" or lay.offload_params != "none":
        raise refuse("torchtitan", "ZeRO-Offload / ZeRO-Infinity (DeepSpeed's) is not torchtitan's CPU offload (which "
                                    "moves parameters, gradients and optimizer state together)", "export --format deepspeed")
    if lay.fp8:
        lines += ["", "[float8]", "enable_fsdp_float8_all_gather = false"]
    if lay.tp_comm_overlap or (lay.tp > 1 and not lay.sequence_parallel):
        # torchtitan's tensor parallelism is always sequence-parallel (its "loss parallel")
        raise refuse("torchtitan", "tensor parallelism without sequence parallelism (or with Megatron-Core's "
                                    "--tp-comm-overlap) has no torchtitan setting", "export --format megatron")
    return "\n".join(lines) + "\n"


def layout_from_torchtitan(text: str, base: Layout) -> Layout:
    import tomllib

    t = tomllib.loads(text)
    p, tr = t["parallelism"], t["training"]
    shard, rep = int(p["data_parallel_shard_degree"]), int(p["data_parallel_replicate_degree"])
    zero = 0 if shard == 1 and base.zero_stage == 0 else (2 if p.get("fsdp_reshard_after_forward") == "never" else 3)
    sched = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved"}[p["pipeline_parallel_schedule"]]
    tp = int(p["tensor_parallel_degree"])
    return Layout(tp=tp, pp=int(p["pipeline_parallel_degree"]), dp=shard * rep, cp=int(p["context_parallel_degree"]),
                  ep=int(p.get("expert_parallel_degree", 1)), etp=int(p.get("expert_tensor_parallel_degree", 1)),
                  vpp=base.vpp, micro_batch=int(p["pipeline_parallel_microbatch_size"]),
                  global_batch=int(tr["global_batch_size"]), schedule=sched,
                  recompute=("selective-op" if t["activation_checkpoint"].get("selective_ac_option") == "op"
                             else t["activation_checkpoint"]["mode"]),
                  zero_stage=zero, sequence_parallel=tp > 1, fp8="float8" in t, tp_comm_overlap=False,
                  layers_per_stage=base.layers_per_stage, gather_unit=base.gather_unit,
                  shard_group=shard if zero >= 2 and rep > 1 else 0)


def render(lay: Layout, graph: OpGraph, cluster: Cluster) -> str:
    """The export's text."""
    seq = next((op.dim("length").size for op in graph.ops if "length" in op.dim_names), 0)
    return to_torchtitan(lay, graph.precision, seq, graph)
