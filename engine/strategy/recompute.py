"""Activation recomputation policies: which ops rerun their forward before their backward,
and what each op keeps for its backward pass, under each value of
:data:`engine.strategy.RECOMPUTE`. The task-graph builder reads :func:`recompute_reruns` (the
rerun's forward time is added to the op's backward task); the memory model reads
:func:`kept_inputs`, :func:`keeps_output` and :func:`saved_outputs`.

* ``none``: every op keeps the inputs its backward reads.
* ``selective``: Korthikanti et al. 2022 §5, the attention core (QK^T, softmax, its dropout,
  the context matmul) rerun from Q, K and V (:func:`selective_recompute_reruns`).
* ``full``: each block keeps its inputs only and reruns its whole forward.
* ``selective-op``: torchtitan's per-op selective activation checkpointing
  (:func:`op_checkpoint_saved`).

torchtitan's other selective option, an integer N (``selective_ac_option = "2"``: every N-th
transformer block wrapped in full checkpointing, the others not at all), is not modelled: it
would need a per-layer recompute value.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

from ..graph import Op, OpGraph
from ..ops import DTYPE_BYTES, FLOAT_DTYPES, REDUCTION, experts_capacity_share, op_kind
from .core import Strategy

__all__ = ["SavedKey",
           "selective_recompute_reruns", "op_checkpoint_saved", "recompute_reruns", "recomputed_ops", "kept_inputs", "keeps_output", "saved_outputs",
           "experts_saved"]


#: graph -> {fp8: (names of the layer blocks' ops, names of the ops whose outputs
#: selective-op saves)}; an entry goes with its graph
_OP_SAC: "weakref.WeakKeyDictionary[OpGraph, dict]" = weakref.WeakKeyDictionary()


def selective_recompute_reruns(graph: OpGraph, op: Op) -> bool:
    """Whether selective recomputation reruns ``op``'s forward before its backward (and so
    does not keep its activations): the attention core between the QK^T matmul and the
    context matmul, with the dropout on the attention probabilities (Korthikanti et al. 2022
    §5). One rule for the task-graph builder and the memory model."""
    return op.kind in ("batch_matmul", "softmax") or (
        op.kind == "dropout" and any(graph[r.op].kind == "softmax" for r in op.inputs))


def _op_sac(graph: OpGraph, fp8: bool) -> tuple[frozenset, frozenset]:
    """(the numbered layer blocks' ops, the ops whose outputs torchtitan's per-op policy saves)."""
    per = _OP_SAC.setdefault(graph, {})
    hit = per.get(fp8)
    if hit is None:
        from ..graph.blocks import layer_blocks  # (layout imports this module)
        layers = set(layer_blocks(graph))
        in_layer, saved, mm = set(), set(), {}
        for op in graph.ops:
            if op.block not in layers or op.kind == "input":
                continue
            in_layer.add(op.name)
            if op.kind == "attention":
                saved.add(op.name)
            elif op.kind == "linear" and not fp8:
                mm[op.block] = mm.get(op.block, 0) + 1
                if mm[op.block] % 2 == 1:  # the 1st, 3rd, ... mm of the block; every second one recomputed
                    saved.add(op.name)
        hit = per[fp8] = (frozenset(in_layer), frozenset(saved))
    return hit


def op_checkpoint_saved(graph: OpGraph, op: Op, fp8: bool = False) -> bool | None:
    """Under ``selective-op``: whether ``op``'s output is saved for the backward pass (True),
    recomputed (False), or ``op`` is outside the checkpointed layers (None: it keeps what it
    would without recomputation).

    torchtitan's per-op selective activation checkpointing (``activation_checkpoint.mode =
    "selective"``, ``selective_ac_option = "op"``, its Llama 3 configs' default;
    ``torchtitan/models/llama3/infra/parallelize.py`` ``_op_sac_save_list`` and
    ``torchtitan/distributed/activation_checkpoint.py``; at the 2024-12 benchmarks' commit in
    ``torchtitan/parallelisms/parallelize_llama.py`` ``_save_list``): each transformer block is
    wrapped in ``checkpoint_wrapper`` with a ``torch.utils.checkpoint`` policy that saves the
    outputs of ``aten.mm`` (but every second mm of the block: the 1st, 3rd, ... are saved;
    in torchtitan's Llama the q, v, w1 and w2 projections, k, wo and w3 recomputed), of the
    fused attention kernels (``_scaled_dot_product_{flash,efficient,cudnn}_attention``: the
    output and its log-sum-exp) and of ``reduce_scatter`` and ``max``; every other op
    (norms, rotary, SwiGLU, residual adds, the other mms) is recomputed in the backward from
    the block's input. With torchao's float8 linears the GEMMs are ``aten._scaled_mm``, not in
    the save list: no linear output is saved (``fp8``). The embedding, final norm and output
    layer are not checkpointed."""
    in_layer, saved = _op_sac(graph, fp8)
    if op.name not in in_layer:
        return None
    return op.name in saved


#: graph -> {modules: names of the ops they recompute}; an entry goes with its graph
_MODULES: "weakref.WeakKeyDictionary[OpGraph, dict]" = weakref.WeakKeyDictionary()


def _in_module(graph: OpGraph, op: Op, module: str, moe_blocks: set) -> bool:
    """Whether ``op`` belongs to Megatron-Core's recompute module ``module``, by the names the
    model builders give (``layers.i.mlp.*``, ``layers.i.attn.q_up``, ...). Megatron-Core's
    ``TransformerConfig.recompute_modules``: ``core_attn`` the attention core, ``mlp`` the dense
    MLP layers, ``moe`` the MoE layers (router, experts with their dispatch, shared experts),
    ``shared_experts`` the shared experts, ``moe_act`` the experts' activation, ``layernorm``
    the layer's norms, ``mla_up_proj`` MLA's up-projections and rotary parts."""
    if module == "core_attn":  # (a fused attention keeps no score matrix: nothing to recompute)
        return selective_recompute_reruns(graph, op)
    if module == "layernorm":
        return op.kind in ("layernorm", "rmsnorm")
    if module in ("mlp", "moe", "shared_experts"):
        in_mlp = ".mlp." in op.name
        if module == "moe":
            return in_mlp and op.block in moe_blocks
        if module == "shared_experts":
            return ".mlp.shared." in op.name
        return in_mlp and op.block not in moe_blocks  # "mlp": the dense MLP layers
    if module == "mla_up_proj":  # the up-projections and the head reshapes up to the attention core
        tail = op.name.rsplit(".attn.", 1)[-1] if ".attn." in op.name else ""
        return tail.startswith(("q_up", "kv_up", "kv_heads", "k_v_split", "k_rope", "k_cat", "k.to_bhsd",
                                "v.to_bhsd", "q.split_heads", "q.to_bhsd"))
    return False  # moe_act: inside the experts op (:func:`experts_saved`)


def recomputed_ops(graph: OpGraph, modules: tuple[str, ...]) -> frozenset:
    """Names of the layer ops whose forward Megatron-Core's selective recomputation of
    ``modules`` (``--recompute-modules``; empty: its default ``core_attn``) reruns before
    their backward. A tensor such an op makes is not kept for the backward (it is made
    again); the op keeps its inputs from outside the recomputed ops. ``moe_act`` (the experts'
    activation) is inside the experts op: :func:`experts_saved` drops it."""
    modules = tuple(modules) or ("core_attn",)
    per = _MODULES.setdefault(graph, {})
    hit = per.get(modules)
    if hit is None:
        from ..graph.blocks import layer_blocks  # (layout imports this module)
        layers = set(layer_blocks(graph))
        moe_blocks = {op.block for op in graph.ops if op.kind == "experts"}
        hit = per[modules] = frozenset(op.name for op in graph.ops if op.block in layers and op.kind != "input"
                                       and any(_in_module(graph, op, m, moe_blocks) for m in modules))
    return hit


def recompute_reruns(graph: OpGraph, op: Op, recompute: str, fp8: bool = False,
                     modules: tuple[str, ...] = ()) -> bool:
    """Whether ``op``'s forward runs again before its backward under ``recompute``: every op
    under ``full``; under ``selective`` the attention core (:func:`selective_recompute_reruns`),
    or the ops of Megatron-Core's recompute ``modules`` (:func:`recomputed_ops`); the
    checkpointed layers' ops whose outputs are not saved under ``selective-op``
    (:func:`op_checkpoint_saved`). One rule for the task-graph builder's timing."""
    if op.kind == "input" or recompute == "none":
        return False
    if recompute == "full":
        return True
    if recompute == "selective":
        if modules:
            return op.name in recomputed_ops(graph, modules)
        return selective_recompute_reruns(graph, op)
    return op_checkpoint_saved(graph, op, fp8) is False


def kept_inputs(graph: OpGraph, op, recompute: str, fp8: bool = False, modules: tuple[str, ...] = ()) -> tuple[int, ...]:
    """Indices of the inputs ``op`` keeps for its backward pass under ``recompute``: none
    for ops whose backward reads no input; with full recomputation only the layer's inputs
    (tensors made by another block), the rest being recomputed from them; an op that
    selective recomputation reruns keeps the inputs its rerun needs from outside the rerun
    region (the attention core's Q, K and V, Korthikanti et al. 2022 §5); under
    ``selective-op`` a checkpointed layer's op keeps only the layer's inputs, as under full
    (the outputs the policy saves: :func:`keeps_output`), and the ops outside the layers
    keep what they keep without recomputation. With Megatron-Core's recompute ``modules``
    no op keeps a tensor a recomputed op makes (:func:`recomputed_ops`)."""
    if op.kind == "input" or op.is_view or not op_kind(op.kind).bwd_reads_inputs:
        return ()
    every = range(len(op.inputs))
    if recompute == "full" or recompute == "selective-op" and op_checkpoint_saved(graph, op, fp8) is not None:
        return tuple(k for k in every if graph[op.inputs[k].op].block != op.block)
    if recompute == "selective" and modules:
        redo = recomputed_ops(graph, modules)
        return tuple(k for k in every if op.inputs[k].op not in redo)
    if recompute == "selective" and selective_recompute_reruns(graph, op):
        return tuple(k for k in every if not selective_recompute_reruns(graph, graph[op.inputs[k].op]))
    return tuple(every)


def keeps_output(graph: OpGraph, op, recompute: str, fp8: bool = False) -> bool:
    """Whether ``op`` keeps its output for the backward pass: under ``selective-op``, the ops
    whose outputs torchtitan's policy saves (:func:`op_checkpoint_saved`) and
    the row-parallel linears (their reduce-scattered output, saved under sequence
    parallelism: ``_c10d_functional.reduce_scatter_tensor`` is in the save list)."""
    if recompute != "selective-op":
        return False
    saved = op_checkpoint_saved(graph, op, fp8)
    return bool(saved) or saved is False and op.kind == "linear"


def saved_outputs(graph: OpGraph, op, cfg, outs, strategy: Strategy) -> list[tuple]:
    """(tensor, shape, bytes) ``op`` keeps under ``selective-op``, per partition and microbatch:
    a saved op's outputs (a fused attention's also its fp32 log-sum-exp, one per query row
    and head: FlashAttention's ``softmax_lse``), and under sequence parallelism a row-parallel
    linear's reduce-scattered output (its partial sum over the reduction degree)."""
    kept = []
    if op_checkpoint_saved(graph, op, strategy.fp8):
        for k, shape in enumerate(outs):
            if op.out_tensors[k].dtype in FLOAT_DTYPES:
                kept.append((SavedKey(op.name, f"out{k}"), shape,
                             math.prod(shape) * DTYPE_BYTES[op.out_tensors[k].dtype]))
        if op.kind == "attention":  # (batch, heads, length, head_dim) -> one fp32 per (batch, head, row)
            kept.append((SavedKey(op.name, "lse"), outs[0][:-1], 4.0 * math.prod(outs[0][:-1])))
    red = math.prod(cfg.degree(d.name) for d in op.dims if d.kind == REDUCTION)
    if op.kind == "linear" and red > 1 and strategy.sequence_parallel:
        nbytes = math.prod(outs[0]) * DTYPE_BYTES[op.out_tensors[0].dtype] / red
        kept.append((SavedKey(op.name, "reduce_scatter"), outs[0], nbytes))
    return kept


@dataclass(frozen=True)
class SavedKey:
    """A tensor an op keeps for its backward that no graph edge names (under selective-op an
    op's output, its attention log-sum-exp, its reduce-scattered output; a dropout's mask): its
    key in :func:`engine.strategy.activations.saved_bytes`'s once-only set."""

    op: str
    index: str


def experts_saved(op, outs, params, recompute: str, fp8: bool, modules: tuple[str, ...] = ()) -> list[tuple]:
    """(tensor, shape, bytes) a mixture-of-experts partition keeps inside its layer for the
    backward pass, per microbatch, besides its inputs: each routed token copy (the partition's
    tokens x top_k x capacity share) as permuted (h), the first GEMM's output (f_in) and the
    activation (f) (Megatron-Core's GroupedMLP / TEGroupedMLP saves all three; with fp8 the
    two GEMM inputs are kept in fp8, one byte). None under full recomputation (the layer's
    input is all it keeps), nor when Megatron-Core's ``moe`` module is recomputed;
    without the activation (f) when ``moe_act`` is (its recomputation, a pointwise kernel, is
    not timed)."""
    if op.kind != "experts" or recompute == "full" or not params or not outs:
        return []
    if recompute == "selective" and "moe" in modules:
        return []
    _, h, f_in = params[0]
    f = params[1][1]
    rows = math.prod(outs[0][:-1]) * op.attrs["top_k"] * experts_capacity_share(op.attrs)
    item = DTYPE_BYTES[op.out_tensors[0].dtype]
    low = 1 if fp8 else item
    if recompute == "selective" and "moe_act" in modules:
        f = 0
    return [(SavedKey(op.name, "routed"), (int(rows), h + f_in + f), rows * (h * low + f_in * item + f * low))]
