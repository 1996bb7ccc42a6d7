"""What each op keeps for its backward pass: bytes per partition and microbatch under a
strategy (recomputation, sequence and context parallelism, fp8, fused kernels), and which
layers' activations go to host memory (:attr:`engine.strategy.Strategy.offload_activations`).

Read by the memory model (:mod:`engine.sim.memory`) and by the task-graph builder, whose
activation copies to and from the host carry these bytes (:mod:`engine.taskgraph.offload`).
"""

from __future__ import annotations

import math

import numpy as np

from ..graph import OpGraph, TensorRef, layer_blocks
from ..ops import DTYPE_BYTES, FLOAT_DTYPES, op_kind
from .core import Strategy
from .recompute import SavedKey, experts_saved, keeps_output, kept_inputs, saved_outputs

__all__ = ["saved_bytes", "offloaded_layers", "GATED_ACTIVATIONS"]


def saved_bytes(graph: OpGraph, strategy: Strategy, m: int, cache: dict) -> np.ndarray:
    """[op] bytes one partition saves for its backward pass, per microbatch (Korthikanti et
    al. 2022 §4, activations per layer with and without sequence parallelism and
    selective or full recomputation; ``tests/sim/test_memory.py`` checks their Table 2).

    A tensor read by several ops under the same partitioning on the same devices (the
    LayerNorm output that the Q, K and V projections read) is kept once, by its first reader:
    that reader's backward runs last, so the tensor's lifetime is the first reader's forward
    to its backward (§4.1 counts the QKV input once). Dropout keeps a one-byte mask per
    element (``bwd_saved_bytes_per_element``). Under sequence parallelism a tensor-parallel
    op that reads a sequence-split tensor keeps the shard, not the gathered tensor, and
    gathers it again in its backward (§4.2.2), under context parallelism too (the shard of
    its cp shard). With fp8 GEMMs a linear layer keeps its input in fp8 (1 byte per element),
    as Transformer Engine does. Under context parallelism fused attention keeps its own
    rank's keys and values (:func:`_cp_share`); with fused kernels a gated MLP does not keep
    its activation's output (:func:`_unfused`)."""
    out = np.zeros(len(graph.ops))
    recompute = strategy.recompute
    mods = strategy.recompute_modules if recompute == "selective" else ()
    fused = getattr(strategy, "kernels", "fused") == "fused"
    saving = cache.get(("saving", recompute, strategy.fp8, mods, fused))
    if saving is None:
        saving = cache[("saving", recompute, strategy.fp8, mods, fused)] = [
            (i, op, kept) for i, op in enumerate(graph.ops)
            if (kept := _unfused(graph, op, kept_inputs(graph, op, recompute, strategy.fp8, mods), fused))
            or keeps_output(graph, op, recompute, strategy.fp8)]
    configs = strategy.configs
    sp = strategy.sequence_parallel
    flags = (m, strategy.fp8, recompute, sp, mods, fused)
    # each op's entries (the once-only key, the tensor, bytes), kept for its config: a search
    # changes one op a proposal, the others are looked up (a sweep's next layout: equal configs)
    per_op = cache.setdefault(("saved_per_op", flags), {})
    kept_tensors: set[tuple] = set()  # (tensor, partition shape, devices) kept by an earlier reader
    for i, op, inputs in saving:
        cfg = configs[op.name]
        entries = per_op.get(op.name)
        if entries is None or (entries[0] is not cfg and entries[0] != cfg):
            made = _op_saved(graph, op, cfg, inputs, strategy, m, cache)
            entries = per_op[op.name] = (cfg, [(((ref.op, ref.index), shape, cfg.devices), ref, nbytes)
                                               for ref, shape, nbytes in made])
        total = 0.0  # (the same additions, in the same order, as out[i] += each)
        for key, ref, nbytes in entries[1]:
            if key in kept_tensors:
                continue
            kept_tensors.add(key)
            if sp:  # the shard of a sequence-split input, not the gathered tensor (under cp too)
                pcfg = configs[ref.op]
                split = pcfg.degree("length") / cfg.degree("length")
                if split > 1 and set(pcfg.devices) == set(cfg.devices):
                    nbytes /= split
            total += nbytes
        out[i] = total
    return out


#: pointwise activations a fused gated-MLP kernel recomputes in its backward from the input it
#: keeps (Megatron-Core's ``SwiGLUFunction`` / ``GeGLUFunction``: ``ctx.save_for_backward(input)``)
GATED_ACTIVATIONS = frozenset({"silu", "gelu", "sigmoid", "tanh", "relu"})


def _unfused(graph: OpGraph, op, kept: tuple[int, ...], fused: bool) -> tuple[int, ...]:
    """``kept`` (the inputs ``op`` keeps for its backward) without those a fused kernel does not
    keep: with ``fused`` kernels, the product of a gated MLP does not keep its activation's
    output (the fused kernel recomputes it from the activation's input, which the activation
    keeps), so a SwiGLU keeps the gate's and the up projection's outputs and not the SiLU's
    (:attr:`engine.strategy.Strategy.kernels`)."""
    if not fused or op.kind != "mul":
        return kept
    return tuple(k for k in kept if graph[op.inputs[k].op].kind not in GATED_ACTIVATIONS)


def _cp_share(op, cfg, k: int) -> int:
    """How many ranks share input ``k`` of ``op`` that the partition reads whole but keeps a
    shard of: under context parallelism attention reads every key and value of the sequence,
    and keeps only its own rank's (Transformer Engine's ``AttnFuncWithCPAndKVP2P`` passes the
    key-value chunks round the cp ring again in the backward, ``AttnFuncWithCPAndKVAllGather``
    gathers them again: both save the local chunk, ``ctx.save_for_backward(q, k, v, ...)``);
    1 for every other input."""
    if op.kind != "attention" or cfg.degree("length") <= 1 or "length" not in op.dim_names:
        return 1
    axes = op.dim("length").in_axes
    return cfg.degree("length") if k >= len(axes) or axes[k] is None else 1


def _op_saved(graph: OpGraph, op, cfg, inputs, strategy: Strategy, m: int, cache: dict) -> list[tuple]:
    """(tensor, partition shape, bytes) one partition of ``op`` saves per microbatch under
    ``cfg``, before the once-only rule of :func:`saved_bytes` (cached by degrees)."""
    recompute = strategy.recompute
    mods = strategy.recompute_modules if recompute == "selective" else ()
    degrees = dict(cfg.degrees)
    if m > 1 and "sample" in op.dim_names:  # (one microbatch's share of a partition's samples)
        degrees["sample"] = degrees.get("sample", 1) * m
    # (keyed by what a microbatch's partition is, not by m and the degrees apart: a sweep's
    # points of one micro-batch size share the entries whatever their data parallelism)
    ck = ("saved", op.name, tuple(degrees.items()), strategy.fp8, getattr(strategy, "fp8_library", "te"), recompute,
          strategy.sequence_parallel, mods, inputs)
    hit = cache.get(ck)
    if hit is None:
        ins, outs, _ = op.partition_shapes(degrees)
        kind = op_kind(op.kind)
        per = kind.bwd_saved_bytes_per_element
        if strategy.fp8 and op.kind == "linear" and getattr(strategy, "fp8_library", "te") == "te":
            per = 1  # the fp8 (transposed) input Transformer Engine keeps for the weight gradient
            # (torchao's Float8Linear keeps the high-precision input: the input's own dtype)
        if kind.bwd_keeps_output and per is None and inputs:
            # the output, under its own name: a later reader keeping it shares it (softmax's
            # probabilities, read by the matmul with the values)
            hit = [(TensorRef(op.name, k), outs[k], math.prod(outs[k]) * DTYPE_BYTES[op.out_tensors[k].dtype])
                   for k in range(len(outs)) if op.out_tensors[k].dtype in FLOAT_DTYPES]
        else:
            # a derived tensor (dropout's mask) under the op's own name, never shared with a
            # reader keeping the input itself; an fp8 copy is shared by the readers of its input
            masked = kind.bwd_saved_bytes_per_element is not None
            hit = [(SavedKey(op.name, f"mask{k}") if masked else op.inputs[k], ins[k], math.prod(ins[k]) * (
                DTYPE_BYTES[op.in_tensors[k].dtype] if per is None else per) / _cp_share(op, cfg, k))
                for k in inputs if op.in_tensors[k].dtype in FLOAT_DTYPES]
        if recompute == "selective-op":
            hit += saved_outputs(graph, op, cfg, outs, strategy)
        hit += experts_saved(op, outs, op.partition_shapes(degrees)[2], recompute, strategy.fp8, mods)
        cache[ck] = hit
    return hit


def offloaded_layers(graph: OpGraph, strategy: Strategy) -> list[list[int]]:
    """The op indices of each layer whose saved activations go to host memory: the first
    :attr:`~engine.strategy.Strategy.offload_activations` layer blocks, in order (Megatron-Core
    offloads the first N transformer layers, ``TransformerBlock``'s ``_get_layer_offload``);
    empty when none are."""
    n = getattr(strategy, "offload_activations", 0)
    if not n:
        return []
    blocks = layer_blocks(graph)[:n]
    index = {b: k for k, b in enumerate(blocks)}
    out: list[list[int]] = [[] for _ in blocks]
    for i, op in enumerate(graph.ops):
        k = index.get(op.block)
        if k is not None:
            out[k].append(i)
    return out

