"""What the exports say of mixture-of-experts models and of multi-head latent attention
(:mod:`engine.export`'s MoE part): Megatron-LM's MoE and MLA flags, DeepSpeed's AutoEP
section and torchtitan's expert-parallel degrees, or a refusal naming what the framework
lacks.

Names were read from the frameworks' source, each at the release cited:

* Megatron-LM ``megatron/training/arguments.py`` at ``core_v0.15.3`` (commit 309ffca6a405, the
  last release that lists every flag by hand; from ``core_v0.17`` the same flags are made from
  ``TransformerConfig``'s fields as ``"--" + name.replace("_", "-")``, and every one used here is
  a field at ``core_v0.19.0``, 5be9626709af). The checks of ``validate_args`` and of
  ``TransformerConfig.__post_init__`` that concern these flags hold in what is emitted: experts
  divisible by ep, sequence parallelism with tp, ep x etp dividing the ranks of a stage,
  the grouped GEMM in bf16 only, the expert bias with sigmoid scores only, biases in MoE layers
  with etp 1 only, pre-softmax routing when top-k is 1.
* DeepSpeed 0.19.8 (installed): ``deepspeed/runtime/config.py`` reads an ``expert_parallel``
  section (AutoEP, ``deepspeed/module_inject/auto_ep_config.py``: ``enabled``,
  ``autoep_size``, ``expert_tensor_parallel_size``, which must be 1). AutoEP is dropless and
  dispatches by all-to-all (``auto_ep_layer.py``).
* torchtitan 0.3.0 (installed) ``torchtitan/config/configs.py``: the override
  ``--parallelism.expert_parallel_degree`` (``torchtitan/distributed/parallel_dims.py`` borrows
  the ep ranks from dp_shard x cp x tp, never from the replicas); 0.3.0 has no
  ``expert_tensor_parallel_degree`` (v0.2.2 had it), so etp > 1 is refused. torchtitan's MoE is
  dropless and dispatches by all-to-all (``models/common/token_dispatcher.py``).

The MoE shape is read from the graph's ``router`` and ``experts`` ops; shared experts and MLA
from the op names :mod:`engine.models.moe` gives them (``<layer>.mlp.shared.down``,
``<layer>.attn.kv_split``, ``<layer>.attn.k_v_split``, ``<layer>.attn.q_down``); a graph built
otherwise exports without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..graph import OpGraph
from ..layout import Layout
from ..graph.blocks import layer_blocks
from ..moe import moe_layout_problem
from .refusals import refuse

__all__ = ["MoEShape", "MLAShape", "moe_shape", "mla_shape", "megatron_moe_flags", "megatron_layer_freq",
           "megatron_pipeline_layout", "deepspeed_expert_parallel", "torchtitan_expert_lines"]


@dataclass(frozen=True)
class MoEShape:
    """A model's mixture-of-experts layers as Megatron-LM's flags describe them (one setting
    for every MoE layer)."""

    num_experts: int
    top_k: int
    ffn_hidden: int  # one routed expert's intermediate width
    score: str  # softmax, or sigmoid with DeepSeek-V3's balancing bias
    capacity_factor: float  # 0: dropless
    dispatcher: str  # alltoall or allgather
    bias: bool  # biases on the experts (GPT-OSS)
    shared_ffn: int  # the shared experts' total width; 0: none
    moe_layers: tuple[bool, ...]  # [layer] whether the numbered layer has experts
    precision: str


@dataclass(frozen=True)
class MLAShape:
    """Multi-head latent attention's widths (DeepSeek-V2 §2.1)."""

    q_lora: int  # 0: a full query projection
    kv_lora: int
    qk_nope: int
    qk_rope: int
    v_head: int


def moe_shape(graph: OpGraph) -> MoEShape | None:
    """The MoE shape of ``graph``, None for a dense model.

    Raises
    ------
    ValidationError
        When MoE layers differ in a setting Megatron-LM gives once for all of them.
    """
    experts = [op for op in graph.ops if op.kind == "experts"]
    if not experts:
        return None
    routers = {op.block: op for op in graph.ops if op.kind == "router"}

    def settings(op) -> dict[str, Any]:
        a = op.attrs
        r = routers.get(op.block)
        return {"experts": a["num_experts"], "top-k": a["top_k"], "expert FFN": a["ffn_hidden"],
                "score": r.attrs.get("score", "softmax") if r is not None else "softmax",
                "capacity factor": float(a.get("capacity_factor", 0) or 0),
                "dispatcher": a.get("dispatcher", "alltoall"), "bias": bool(a.get("bias", False)),
                "gated": bool(a.get("gated", True))}

    first = settings(experts[0])
    for op in experts[1:]:
        other = settings(op)
        for key, v in first.items():
            if other[key] != v:
                raise refuse("megatron", f"{op.name} has {key} {other[key]} where {experts[0].name} has {v}: "
                                          "Megatron-LM sets one value for every MoE layer",
                              "give every MoE layer the same settings")
    shared = {op.block: op.params[0].shape[1] for op in graph.ops
              if op.kind == "linear" and op.name.endswith(".shared.down") and op.params}
    widths = {shared.get(op.block, 0) for op in experts}
    if len(widths) > 1:
        raise refuse("megatron", f"shared experts of widths {sorted(widths)} across the MoE layers: Megatron-LM sets "
                                  "one --moe-shared-expert-intermediate-size",
                      "give every MoE layer the same shared experts")
    with_experts = {op.block for op in experts}
    return MoEShape(first["experts"], first["top-k"], first["expert FFN"], first["score"], first["capacity factor"],
                    first["dispatcher"], first["bias"], widths.pop(),
                    tuple(b in with_experts for b in layer_blocks(graph)), graph.precision)


def mla_shape(graph: OpGraph) -> MLAShape | None:
    """MLA's widths from the first layer with a ``<layer>.attn.kv_split``, or None."""
    ops = {op.name: op for op in graph.ops}
    for b in layer_blocks(graph):
        kv, kv_v = ops.get(f"{b}.attn.kv_split"), ops.get(f"{b}.attn.k_v_split")
        if kv is None or kv_v is None:
            continue
        q_down = ops.get(f"{b}.attn.q_down")
        (kv_lora, rope), (nope, v) = kv.attrs["sizes"], kv_v.attrs["sizes"]
        return MLAShape(q_down.attrs["out_features"] if q_down is not None else 0, kv_lora, nope, rope, v)
    return None


def megatron_layer_freq(moe_layers: tuple[bool, ...]) -> str | None:
    """``--moe-layer-freq``'s list form for MoE and dense layers, None when all are MoE (the
    default, 1).

    >>> megatron_layer_freq((False,) * 3 + (True,) * 58)
    '([0]*3+[1]*58)'
    """
    if all(moe_layers):
        return None
    runs: list[list[int]] = []
    for x in moe_layers:
        if runs and runs[-1][0] == int(x):
            runs[-1][1] += 1
        else:
            runs.append([int(x), 1])
    return "(" + "+".join(f"[{v}]*{n}" for v, n in runs) + ")"


def megatron_pipeline_layout(counts: list[int], pp: int) -> str:
    """``--pipeline-model-parallel-layout`` for ``counts`` layers on each of the pp x vpp model
    chunks in order (chunk c on pipeline rank c % pp, as Megatron-Core's
    ``PipelineParallelLayerLayout`` places them): the embedding (E) with the first chunk, the
    output layer and loss (L) with the last.

    >>> megatron_pipeline_layout([1, 1, 2, 2, 2, 1], 3)
    'Et|t|(tt|)*3,tL'
    """
    if len(counts) % pp:
        raise ValueError(f"{len(counts)} chunks do not fill {pp} pipeline ranks")
    stages = ["t" * c for c in counts]
    stages[0] = "E" + stages[0]
    last = stages.pop() + "L"
    out, k = [], 0
    while k < len(stages):
        n = 1
        while k + n < len(stages) and stages[k + n] == stages[k]:
            n += 1
        out.append(f"({stages[k]}|)*{n}," if n > 1 else f"{stages[k]}|")
        k += n
    return "".join(out) + last


def megatron_moe_flags(graph: OpGraph, lay: Layout) -> list[str]:
    """Megatron-LM's MoE and MLA flags for ``graph`` laid out as ``lay`` (empty for a dense
    model with standard attention).

    Raises
    ------
    ValidationError
        What Megatron-LM would reject or cannot express, with what would do.
    """
    f: list[str] = []
    mla = mla_shape(graph)
    if mla is not None:
        f.append("--multi-latent-attention")
        if mla.q_lora:
            f += ["--q-lora-rank", str(mla.q_lora)]
        f += ["--kv-lora-rank", str(mla.kv_lora), "--qk-head-dim", str(mla.qk_nope), "--qk-pos-emb-head-dim",
              str(mla.qk_rope), "--v-head-dim", str(mla.v_head)]
    moe = moe_shape(graph)
    if moe is None:
        if lay.ep * lay.etp > 1:
            raise refuse("megatron", f"ep {lay.ep}, etp {lay.etp} on {graph.name!r}, which has no experts",
                          "set ep and etp to 1")
        return f
    why = moe_layout_problem(graph, lay.tp, lay.cp, lay.dp or 1, lay.ep, lay.etp, lay.sequence_parallel)
    if why is not None:
        raise refuse("megatron", why, "choose ep and etp by Megatron-LM's rules")
    if (lay.tp * lay.cp * (lay.dp or 1)) % (lay.ep * lay.etp):  # (parallel_state: edp must be whole)
        raise refuse("megatron", f"ep {lay.ep} x etp {lay.etp} does not divide the {lay.tp * lay.cp * lay.dp} ranks "
                                  "of a pipeline stage", "choose ep x etp dividing tp x cp x dp")
    if moe.precision != "bf16":  # (core_v0.15.3's validate_args asserted it; core_v0.19.0 dropped the assert,
        # and TE's grouped GEMM in fp16 / fp32 is not what the simulation's grouped-GEMM rates were measured on)
        raise refuse("megatron", f"the experts as grouped GEMMs (--moe-grouped-gemm, as simulated) run in bf16 only "
                                  f"(Megatron-LM's rule up to core_v0.15.3), and the model is {moe.precision}",
                      "build the model in bf16")
    if moe.bias and lay.etp > 1:
        raise refuse("megatron", f"biases in MoE layers need etp 1 in Megatron-Core (etp {lay.etp} here)",
                      "set etp to 1")
    # (--bf16 comes with the model's precision: engine.export.megatron)
    f += ["--num-experts", str(moe.num_experts), "--expert-model-parallel-size", str(lay.ep),
          "--expert-tensor-parallel-size", str(lay.etp),  # (explicit: Megatron-LM's default is tp)
          "--moe-ffn-hidden-size", str(moe.ffn_hidden), "--moe-router-topk", str(moe.top_k),
          "--moe-router-score-function", moe.score]
    if moe.score == "sigmoid":  # DeepSeek-V3's auxiliary-loss-free balancing bias
        f.append("--moe-router-enable-expert-bias")
    elif moe.top_k == 1:  # (Megatron-Core: a softmax over one chosen score has no gradient)
        f.append("--moe-router-pre-softmax")
    f += ["--moe-router-dtype", "fp32",  # (the routing probabilities are simulated in fp32)
          "--moe-token-dispatcher-type", moe.dispatcher,  # (explicit: Megatron-LM's default is allgather)
          "--moe-grouped-gemm"]
    if moe.shared_ffn:
        f += ["--moe-shared-expert-intermediate-size", str(moe.shared_ffn)]
    freq = megatron_layer_freq(moe.moe_layers)
    if freq is not None:
        f += ["--moe-layer-freq", freq]
    if moe.capacity_factor > 0:
        # tokens over capacity dropped, no padding to capacity (the simulation prices min(1, cf)
        # of the routed tokens, not padded ones): --moe-pad-expert-input-to-capacity stays off
        f += ["--moe-expert-capacity-factor", f"{moe.capacity_factor:g}"]
    return f


def _plain_experts(fmt: str, graph: OpGraph | None, what: str) -> None:
    """Refuse what ``fmt``'s dropless all-to-all experts cannot run (a capacity factor, the
    all-gather dispatcher); the experts' shapes are the model code's, not the config's."""
    for op in graph.ops if graph is not None else ():
        if op.kind != "experts":
            continue
        cf, dispatcher = float(op.attrs.get("capacity_factor", 0) or 0), op.attrs.get("dispatcher", "alltoall")
        if cf > 0:
            raise refuse(fmt, f"token dropping ({op.name}: capacity factor {cf:g}): {what} is dropless",
                          "export --format megatron (--moe-expert-capacity-factor)")
        if dispatcher != "alltoall":
            raise refuse(fmt, f"the {dispatcher} token dispatcher ({op.name}): {what} dispatches by all-to-all",
                          "export --format megatron (--moe-token-dispatcher-type allgather), or use alltoall")


def deepspeed_expert_parallel(lay: Layout, graph: OpGraph | None) -> dict[str, Any] | None:
    """DeepSpeed's ``expert_parallel`` (AutoEP) section, None without expert parallelism."""
    _plain_experts("deepspeed", graph, "DeepSpeed's AutoEP")
    if lay.ep * lay.etp == 1:
        return None
    if lay.etp > 1:  # (unreachable with tp 1, which the DeepSpeed export needs; stated for hand-made layouts)
        raise refuse("deepspeed", f"etp {lay.etp}: AutoEP's expert_tensor_parallel_size must be 1 in DeepSpeed "
                                   "0.19.8", "export --format megatron (--expert-tensor-parallel-size)")
    return {"enabled": True, "autoep_size": lay.ep}


def torchtitan_expert_lines(lay: Layout, graph: OpGraph | None, shard: int) -> list[str]:
    """torchtitan 0.3.0's expert-parallel override (empty without expert parallelism); ``shard``
    is the data_parallel_shard_degree written.

    torchtitan 0.3.0 ``config/configs.py`` ``ParallelismConfig.expert_parallel_degree``: EP
    borrows its ranks from dp_shard x cp x tp and FSDP-shards the experts over the rest (efsdp =
    dp_shard x cp x tp / ep, never the replicas; ``distributed/parallel_dims.py`` keeps efsdp
    whenever ep > 1); ``expert_tensor_parallel_degree`` is gone (experts are not tensor-parallel)."""
    _plain_experts("torchtitan", graph, "torchtitan's MoE")
    if lay.ep * lay.etp == 1:
        return []
    if lay.etp > 1:
        raise refuse("torchtitan", f"etp {lay.etp}: torchtitan 0.3.0 has no expert tensor parallelism (its "
                                    "expert_tensor_parallel_degree is gone; experts take ep ranks only)",
                     "export --format megatron (--expert-tensor-parallel-size), or etp 1")
    ranks, width = shard * lay.cp * lay.tp, lay.ep
    if ranks % width or (lay.zero_stage < 2 and ranks != width):
        where = ("folds ep onto data-parallel replicas" if ranks % width
                 else f"replicates the experts over the other {ranks // width} (no ZeRO)")
        raise refuse("torchtitan", f"ep {lay.ep} over dp_shard {shard} x cp {lay.cp} x tp {lay.tp} "
                                    f"= {ranks} ranks: torchtitan takes the expert-parallel ranks from those and "
                                    f"shards the experts over the rest, where this layout {where}",
                      "export --format megatron, or choose ep = cp x tp (or FSDP, ZeRO 2/3)")
    return ["--parallelism.expert_parallel_degree", str(lay.ep)]
