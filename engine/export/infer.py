"""Plans a framework can run: a strategy as Megatron-LM flags, a DeepSpeed config or a
torchtitan launch line (``soapbox export``), each for a named release of its framework.

A strategy is exportable when it *is* a Megatron-shaped layout: :func:`infer_layout` reads its
tensor / pipeline / context / data-parallel degrees, microbatches, schedule, layer split and
settings, rebuilds that layout with :func:`engine.search.baselines.megatron`, and compares
every op's config with the strategy's. Any op that differs (a per-op SOAP split no framework
flag expresses) is listed and the export refused: nothing is approximated silently. Each
format's module then writes what that release would run as simulated, or refuses what it
would run differently, naming the setting and what to do instead:

* :mod:`engine.export.megatron`: Megatron-LM core_v0.19.0 flags (precision, the environment it
  needs, Megatron-FSDP for ZeRO-2/3, pipeline layout strings);
* :mod:`engine.export.deepspeed`: a DeepSpeed 0.19.8 config (ZeRO, offload, AutoTP, AutoEP,
  the recomputation block and what the model code must do for it);
* :mod:`engine.export.torchtitan`: a torchtitan 0.3.0 launch line (config function and
  command-line overrides).

A mixture-of-experts model's expert-parallel degrees come from its ``experts`` ops, and its
MoE and MLA settings go out as :mod:`engine.export.moe` states. Each module cites the source
files of its release that its names and rules were read from.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..cluster import Cluster
from ..errors import Problem
from . import deepspeed as export_deepspeed, megatron as export_megatron, torchtitan as export_torchtitan
from ..graph import OpGraph
from ..layout import SWITCHES, Layout
from ..graph.blocks import layer_blocks
from ..layout.build import build_layout
from ..strategy import Strategy, splits_into_microbatches
from .refusals import not_a_layout

__all__ = ["infer_layout", "EXPORT_FORMATS", "export", "layout_dict"]

EXPORT_FORMATS = ("megatron", "deepspeed", "torchtitan")


def infer_layout(graph: OpGraph, strategy: Strategy, cluster: Cluster) -> Layout:
    """The Megatron-shaped layout ``strategy`` is, or :class:`ValidationError` listing the ops
    (and settings) no layout explains."""
    layers = layer_blocks(graph)
    lin = next((op for op in graph.ops if op.kind == "linear" and op.block in layers), None)
    if lin is None:
        raise not_a_layout([Problem("model", f"{graph.name!r} has no numbered transformer layers: the frameworks' "
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
        raise not_a_layout(problems)
    counts = None
    if pp > 1 and vpp == 1:
        per = [0] * pp
        for b in layers:
            first = next(op for op in graph.ops if op.block == b)
            per[strategy.stage_of.get(first.name, 0)] += 1
        counts = tuple(per)
    # the loss on gathered logits: replicated over tp while its logits' producer splits the vocabulary
    # (an unsplittable vocabulary replicates both, as Megatron-LM would not run it either)
    loss_op = next((op for op in graph.ops if op.kind == "softmax_cross_entropy"), None)
    loss_parallel = True
    if tp > 1 and loss_op is not None and strategy.configs[loss_op.name].degree("replica") > 1:
        head = strategy.configs[graph[loss_op.inputs[0].op].name]
        loss_parallel = head.degree("feature") * head.degree("vocab") <= 1
    lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, micro_batch=batch // (dp * m), global_batch=batch,
                 loss_parallel=loss_parallel,
                 schedule=strategy.pipeline.schedule, recompute=strategy.recompute, zero_stage=strategy.zero_stage,
                 recompute_modules=strategy.recompute_modules,
                 sequence_parallel=sp, fp8=strategy.fp8, tp_comm_overlap=strategy.tp_comm_overlap,
                 layers_per_stage=counts, gather_unit=strategy.gather_unit, shard_group=strategy.shard_group,
                 **{k: getattr(strategy, k) for k in SWITCHES})
    try:
        rebuilt = build_layout(graph, cluster, lay)
    except ValueError as e:
        raise not_a_layout([Problem("layout", f"{lay.describe()} is no valid Megatron layout here: {e}")]) from None
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
        raise not_a_layout([Problem("layout", f"not a Megatron-shaped layout (nearest: tp {tp}, pp {pp}, cp {cp}, dp {dp}); "
                                       f"{len(problems):,} op(s) differ")] + shown)
    return lay




def export(fmt: str, graph: OpGraph, strategy: Strategy, cluster: Cluster) -> str:
    """The strategy in format ``fmt`` as the text a user hands the framework (each format's
    ``render``: it names the framework release it targets)."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; formats: {', '.join(EXPORT_FORMATS)}")
    lay = infer_layout(graph, strategy, cluster)
    return {"megatron": export_megatron.render, "deepspeed": export_deepspeed.render,
            "torchtitan": export_torchtitan.render}[fmt](lay, graph, cluster)


def layout_dict(lay: Layout) -> dict[str, Any]:
    d = asdict(lay)
    d["microbatches"] = lay.microbatches
    d["layers_per_stage"] = list(lay.layers_per_stage) if lay.layers_per_stage else None
    return d

