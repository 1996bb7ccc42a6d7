"""Plans a framework can run: a strategy as Megatron-LM flags, a DeepSpeed config or a
torchtitan TOML (``soapbox export``).

A strategy is exportable when it *is* a Megatron-shaped layout: :func:`infer_layout` reads its
tensor / pipeline / context / data-parallel degrees, microbatches, schedule, layer split and
settings, rebuilds that layout with :func:`engine.search.baselines.megatron`, and compares
every op's config with the strategy's. Any op that differs (a per-op SOAP split no framework
flag expresses) is listed and the export refused: nothing is approximated silently. Each
format then refuses what its framework cannot express (ZeRO-2/3 in Megatron-LM's flags,
tensor or pipeline parallelism in a DeepSpeed config, ZeRO-1 in torchtitan), naming the
setting and the format that can. A mixture-of-experts model's expert-parallel degrees come from
its ``experts`` ops, and its MoE and MLA settings go out as :mod:`engine.export_moe` states.

Flag and key names are those of the frameworks' documentation: Megatron-LM
``megatron/training/arguments.py`` (``--tensor-model-parallel-size``, ...), DeepSpeed's config
JSON reference (https://www.deepspeed.ai/docs/config-json/), torchtitan's
``torchtitan/config/job_config.py`` (``[parallelism]``, ``[activation_checkpoint]``, ...).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict
from typing import Any

from .cluster import Cluster
from .errors import Problem, ValidationError
from .export_moe import deepspeed_expert_parallel, megatron_moe_flags, megatron_pipeline_layout, torchtitan_expert_lines
from .graph import OpGraph
from .layout import SWITCHES, Layout, layer_blocks
from .search.baselines import build_layout
from .search.layouts import balanced_layers
from .strategy import Strategy, splits_into_microbatches

__all__ = ["Layout", "infer_layout", "to_megatron", "to_deepspeed", "to_torchtitan", "FORMATS", "export",
           "layout_from_megatron", "layout_from_deepspeed", "layout_from_torchtitan", "build_layout"]

FORMATS = ("megatron", "deepspeed", "torchtitan")


def _fail(problems: list[Problem]) -> ValidationError:
    return ValidationError(problems, "export")


def infer_layout(graph: OpGraph, strategy: Strategy, cluster: Cluster) -> Layout:
    """The Megatron-shaped layout ``strategy`` is, or :class:`ValidationError` listing the ops
    (and settings) no layout explains."""
    layers = layer_blocks(graph)
    lin = next((op for op in graph.ops if op.kind == "linear" and op.block in layers), None)
    if lin is None:
        raise _fail([Problem("model", f"{graph.name!r} has no numbered transformer layers: the frameworks' "
                                      "layouts (tensor / pipeline / data parallel) are defined over them")])
    cfg = strategy.configs[lin.name]
    tp = cfg.degree("feature") * cfg.degree("in_feature") * cfg.degree("replica")
    cp_sp = cfg.degree("length")
    sp = strategy.sequence_parallel
    pp, vpp = strategy.pipeline.stages, strategy.pipeline.virtual_stages
    dp = cfg.degree("sample")
    # the first layer's norm tells cp apart from sequence parallelism (its length splits are
    # cp x tp under SP, cp alone otherwise)
    norm = next((op for op in graph.ops if op.block == lin.block and op.kind in ("layernorm", "rmsnorm")), None)
    cp = cp_sp
    if norm is not None:
        ncfg = strategy.configs[norm.name]
        cp = ncfg.degree("length") // (tp if sp else 1) or 1
    # expert parallelism: ep folded over samples (expert) and sequence shards (expert_seq)
    moe = next((strategy.configs[op.name] for op in graph.ops if op.kind == "experts"), None)
    ep = moe.degree("expert") * moe.degree("expert_seq") if moe is not None else 1
    etp = moe.degree("ffn") if moe is not None else 1
    m = max(1, strategy.pipeline.microbatches)
    batch = graph.batch_size
    problems: list[Problem] = []
    if not splits_into_microbatches(batch, dp, m):
        problems.append(Problem("pipeline.microbatches", f"batch {batch} does not split into {m} microbatches on "
                                                         f"{dp} data-parallel ranks"))
        raise _fail(problems)
    counts = None
    if pp > 1 and vpp == 1:
        per = [0] * pp
        for b in layers:
            first = next(op for op in graph.ops if op.block == b)
            per[strategy.stage_of.get(first.name, 0)] += 1
        counts = tuple(per)
    lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, micro_batch=batch // (dp * m), global_batch=batch,
                 schedule=strategy.pipeline.schedule, recompute=strategy.recompute, zero_stage=strategy.zero_stage,
                 recompute_modules=strategy.recompute_modules,
                 sequence_parallel=sp, fp8=strategy.fp8, tp_comm_overlap=strategy.tp_comm_overlap,
                 layers_per_stage=counts, gather_unit=strategy.gather_unit, shard_group=strategy.shard_group,
                 **{k: getattr(strategy, k) for k in SWITCHES})
    try:
        rebuilt = build_layout(graph, cluster, lay)
    except ValueError as e:
        raise _fail([Problem("layout", f"{lay.describe()} is no valid Megatron layout here: {e}")]) from None
    # the same configs up to which block of devices each stage sits on (Megatron places stage
    # s on devices s*dp*cp*tp...; a strategy may have permuted the stages)
    mapping: dict[int, int] = {}
    for op in graph.ops:
        a, b = strategy.configs[op.name], rebuilt.configs[op.name]
        if a.degrees != b.degrees or len(a.devices) != len(b.devices):
            problems.append(Problem(f"ops.{op.name}", f"split {dict(a.degrees)} where the layout has {dict(b.degrees)}"))
            continue
        for x, y in zip(a.devices, b.devices):
            if mapping.setdefault(y, x) != x:
                problems.append(Problem(f"ops.{op.name}", f"devices {list(a.devices)[:8]} break the layout's "
                                                          f"device order {list(b.devices)[:8]}"))
                break
        if (strategy.stage_of.get(op.name) or 0) != (rebuilt.stage_of.get(op.name) or 0):
            problems.append(Problem(f"ops.{op.name}", f"on stage {strategy.stage_of.get(op.name)} where the layout "
                                                      f"puts it on {rebuilt.stage_of.get(op.name)}"))
    if len(set(mapping.values())) != len(mapping):
        problems.append(Problem("devices", "two layout ranks share a device"))
    if problems:
        shown = problems[:20]
        if len(problems) > 20:
            shown.append(Problem("ops", f"... and {len(problems) - 20:,} more"))
        raise _fail([Problem("layout", f"not a Megatron-shaped layout (nearest: tp {tp}, pp {pp}, cp {cp}, dp {dp}); "
                                       f"{len(problems):,} op(s) differ")] + shown)
    return lay




def _refuse(fmt: str, what: str, instead: str) -> ValidationError:
    return _fail([Problem(fmt, f"{what}; {instead}")])


def to_megatron(lay: Layout, graph: OpGraph | None = None) -> list[str]:
    """Megatron-LM (Megatron-Core) command-line flags; with ``graph``, also its MoE and MLA
    settings (:func:`engine.export_moe.megatron_moe_flags`) and an uneven interleaved split."""
    if lay.zero_stage >= 2:
        raise _refuse("megatron", f"ZeRO stage {lay.zero_stage} has no Megatron-LM flag (its distributed optimizer "
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
            raise _refuse("megatron", f"layers per stage {list(lay.layers_per_stage)}: Megatron-LM sets only the "
                                      "first and last stage's layers", "make the middle stages even")
        f += ["--decoder-first-pipeline-num-layers", str(first), "--decoder-last-pipeline-num-layers", str(last)]
    if lay.sequence_parallel:
        f.append("--sequence-parallel")
    if lay.tp_comm_overlap:
        f.append("--tp-comm-overlap")
    if lay.recompute == "selective-op":
        raise _refuse("megatron", "torchtitan's per-op selective checkpointing has no Megatron-LM flag (its "
                                  "'selective' recomputes the attention core only)", "export --format torchtitan")
    if lay.offload_optimizer != "none" or lay.offload_params != "none":
        raise _refuse("megatron", "ZeRO-Offload (optimizer state and step on the host) is DeepSpeed's; Megatron-Core's "
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
        raise _refuse("megatron", "the GPipe schedule has no Megatron-LM flag (it runs 1F1B, or interleaved with "
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


def to_deepspeed(lay: Layout, precision: str, graph: OpGraph | None = None) -> dict[str, Any]:
    """A DeepSpeed config (ZeRO data parallelism; expert parallelism by AutoEP)."""
    if lay.tp > 1 or lay.pp > 1 or lay.cp > 1:
        raise _refuse("deepspeed", f"tensor / pipeline / context parallelism (tp {lay.tp}, pp {lay.pp}, cp {lay.cp}) "
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
        raise _refuse("deepspeed", "Megatron-Core's merged-1F1B all-to-all overlap has no DeepSpeed setting",
                      "export --format megatron")
    if lay.recompute == "selective":
        raise _refuse("deepspeed", "selective recomputation (Megatron's: attention's core only) has no DeepSpeed "
                                   "setting; DeepSpeed checkpoints whole layers", "export --format megatron")
    if lay.recompute == "selective-op":
        raise _refuse("deepspeed", "torchtitan's per-op selective checkpointing has no DeepSpeed setting",
                      "export --format torchtitan")
    if lay.recompute == "full":
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
    cfg["zero_optimization"]["overlap_comm"] = lay.overlap_grad_reduce
    for key, where in (("offload_optimizer", lay.offload_optimizer), ("offload_param", lay.offload_params)):
        if where == "nvme":
            raise _refuse("deepspeed", f"{key} to NVMe needs the nodes' NVMe mount (nvme_path), which soapbox does not "
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


def to_torchtitan(lay: Layout, precision: str, seq_len: int, graph: OpGraph | None = None) -> str:
    """A torchtitan job config (TOML)."""
    if lay.zero_stage == 1:
        raise _refuse("torchtitan", "ZeRO-1 (sharded optimizer state only) has no torchtitan setting (FSDP shards "
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
        raise _refuse("torchtitan", "Megatron-Core's recompute modules and MoE all-to-all overlap have no torchtitan "
                                    "setting", "export --format megatron")
    if lay.offload_optimizer != "none" or lay.offload_params != "none":
        raise _refuse("torchtitan", "ZeRO-Offload / ZeRO-Infinity (DeepSpeed's) is not torchtitan's CPU offload (which "
                                    "moves parameters, gradients and optimizer state together)", "export --format deepspeed")
    if lay.fp8:
        lines += ["", "[float8]", "enable_fsdp_float8_all_gather = false"]
    if lay.tp_comm_overlap or (lay.tp > 1 and not lay.sequence_parallel):
        # torchtitan's tensor parallelism is always sequence-parallel (its "loss parallel")
        raise _refuse("torchtitan", "tensor parallelism without sequence parallelism (or with Megatron-Core's "
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


def export(fmt: str, graph: OpGraph, strategy: Strategy, cluster: Cluster) -> str:
    """The strategy in format ``fmt`` as text (flags on one line, JSON, or TOML)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; formats: {', '.join(FORMATS)}")
    lay = infer_layout(graph, strategy, cluster)
    if fmt == "megatron":  # (shell-quoted: a layout string or --moe-layer-freq list has | ( ) *)
        return shlex.join(to_megatron(lay, graph)) + "\n"
    if fmt == "deepspeed":
        return json.dumps(to_deepspeed(lay, graph.precision, graph), indent=2) + "\n"
    seq = next((op.dim("length").size for op in graph.ops if "length" in op.dim_names), 0)
    return to_torchtitan(lay, graph.precision, seq, graph)


def layout_dict(lay: Layout) -> dict[str, Any]:
    d = asdict(lay)
    d["microbatches"] = lay.microbatches
    d["layers_per_stage"] = list(lay.layers_per_stage) if lay.layers_per_stage else None
    return d

