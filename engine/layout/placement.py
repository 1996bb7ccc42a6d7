"""Megatron-style layout helpers shared by the baselines and the pipeline planner: which ops
form the model's layers, how layers split into pipeline chunks (evenly, or balanced counting
the embedding and the output layer), and the tensor-parallel dim of every op."""

from __future__ import annotations

import weakref
from typing import Sequence

import numpy as np

from ..graph import Op, OpGraph
from ..graph.blocks import layer_blocks
from ..moe import expert_split
from ..ops import REDUCTION, REPLICA_DIM
from ..strategy import Config, partition_coords, partition_grid

__all__ = ["balanced_layers", "check_layer_counts", "layer_chunks", "tp_plan", "mesh_config", "expert_config"]


def balanced_layers(n_layers: int, n_chunks: int) -> list[int]:
    """Layers per pipeline chunk: equal when they divide evenly (Megatron-LM's split);
    otherwise balanced counting the embedding and the output layer as one layer each, which
    sit on the first and the last chunk (Megatron-DeepSpeed's ``type:transformer|embedding``
    partitioning; Llama 3 405B runs 126 layers on 16 stages as 7 + 14 x 8 + 7, Dubey et al.
    2024 §3.3.2).

    >>> balanced_layers(126, 16)[:3], balanced_layers(126, 16)[-1], sum(balanced_layers(70, 12))
    ([7, 8, 8], 7, 70)
    """
    if n_layers % n_chunks == 0:
        return [n_layers // n_chunks] * n_chunks
    if n_chunks > n_layers:
        raise ValueError(f"{n_layers} layers cannot fill {n_chunks} pipeline chunks (pp x vpp)")
    units = n_layers + 2  # the embedding and the output layer count as one layer each
    q, r = divmod(units, n_chunks)
    counts = [q] * n_chunks
    for k in (list(range(1, n_chunks - 1)) + [0, n_chunks - 1])[:r]:  # the remainder to the middle first
        counts[k] += 1
    counts[0] -= 1
    counts[-1] -= 1
    while min(counts) < 1:  # (a few layers on many chunks: give the end chunks one back)
        k = counts.index(min(counts))
        counts[k] += 1
        counts[counts.index(max(counts))] -= 1
    return counts


def check_layer_counts(counts: Sequence[int], n_chunks: int, n_layers: int) -> None:
    """ValueError unless ``counts`` (a layout's ``layers_per_stage``) are ``n_chunks`` counts of
    at least one layer adding up to the model's ``n_layers``."""
    if len(counts) != n_chunks or sum(counts) != n_layers or min(counts, default=0) < 1:
        raise ValueError(f"layers per stage {list(counts)} must be {n_chunks} counts >= 1 adding up to "
                         f"the {n_layers} layers")


def layer_chunks(graph: OpGraph, n_chunks: int, counts: Sequence[int] | None = None) -> dict[str, int]:
    """Model chunk of every op: layer blocks split by :func:`balanced_layers` (or ``counts``
    layers per chunk);
    any other op joins the chunk of the next layer after it in topological order (the last
    chunk after the last layer), so an encoder-decoder's decoder embedding sits with the first
    decoder layer; inputs join their first consumer."""
    layers = layer_blocks(graph)
    if n_chunks == 1:
        return {op.name: 0 for op in graph.ops}
    if not layers:
        raise ValueError(f"model {graph.name!r} has no numbered layer blocks to split into pipeline stages")
    if counts is not None:
        check_layer_counts(counts, n_chunks, len(layers))
        owner = [k for k, c in enumerate(counts) for _ in range(c)]
        layer_chunk = {b: owner[i] for i, b in enumerate(layers)}
    else:
        owner = [k for k, c in enumerate(balanced_layers(len(layers), n_chunks)) for _ in range(c)]
        layer_chunk = {b: owner[i] for i, b in enumerate(layers)}
    chunk: dict[str, int] = {}
    following = n_chunks - 1
    for op in reversed(graph.ops):
        if op.block in layer_chunk:
            following = chunk[op.name] = layer_chunk[op.block]
        elif op.kind != "input":
            chunk[op.name] = following
    for op in graph.ops:
        if op.kind == "input":
            users = [chunk[c] for c in graph.consumers(op.name) if c in chunk]
            chunk[op.name] = min(users) if users else 0
    return chunk


def tp_plan(graph: OpGraph, tp: int, sequence_parallel: bool, loss_parallel: bool = True
            ) -> tuple[dict[str, tuple[str | None, int]], list[str]]:
    """:func:`_tp_plan`, worked out once per graph and arguments (a sweep builds thousands of
    layouts of one model: the propagation was ~15 ms of each GPT-3 point), a copy returned."""
    made = _TP_PLANS.setdefault(graph, {})
    key = (tp, bool(sequence_parallel), bool(loss_parallel))
    hit = made.get(key)
    if hit is None:
        hit = made[key] = _tp_plan(graph, tp, sequence_parallel, loss_parallel)
    return dict(hit[0]), list(hit[1])


#: :func:`tp_plan`'s results by graph (weakly) and arguments
_TP_PLANS: "weakref.WeakKeyDictionary[OpGraph, dict]" = weakref.WeakKeyDictionary()


def _tp_plan(graph: OpGraph, tp: int, sequence_parallel: bool, loss_parallel: bool
             ) -> tuple[dict[str, tuple[str | None, int]], list[str]]:
    """Tensor-parallel dim of every op (Shoeybi et al. 2019 §3), by propagating which axis of
    each tensor is split across the tensor-parallel group:

    * a linear reading a replicated tensor is column-parallel (splits ``feature``); one
      reading a tensor split on its contracted axis is row-parallel (``in_feature``, an
      all-reduce follows), which pairs QKV with the attention output projection and the
      MLP's first layer with its second;
    * ops whose inputs are split keep the split when one of their dims maps it (attention
      heads through reshape, transpose, batch_matmul, softmax, dropout; the MLP
      activation); otherwise they gather and replicate;
    * embeddings with the largest table (token embeddings; not positions or token types)
      are vocabulary-parallel; cross-entropy over split logits is vocabulary-parallel, or
      without ``loss_parallel`` replicated over the tensor-parallel group, the logits gathered
      to every rank (torchtitan's ``disable_loss_parallel``; KempnerForge's output head
      gathered to ``Replicate`` for the loss);
    * with sequence parallelism (Korthikanti et al. 2022 §4.2.2) replicated ops with a
      ``length`` dim split it instead, and row-parallel outputs are reduce-scattered.

    Returns op name -> (tp dim or None when tp is 1, tensor degree along it), and notes on
    ops that had to be replicated across the tensor-parallel group.

    Raises
    ------
    ValueError
        When ``tp`` does not divide an op's attention heads (Megatron-LM asserts that both
        the query and the key/value head counts are multiples of the tensor-parallel size).
    """
    plan: dict[str, tuple[str | None, int]] = {}
    notes: list[str] = []
    state: dict[tuple[str, int], int | None] = {}  # (op, output) -> split axis
    emb = [op for op in graph.ops if op.kind == "embedding"]
    largest = max((o.attrs["num_embeddings"] for o in emb), default=0)
    vocab_ops = {o.name for o in emb if o.attrs["num_embeddings"] == largest}

    def length_axis(op: Op) -> int | None:
        if not sequence_parallel or "length" not in op.dim_names:
            return None
        d = op.dim("length")
        return d.out_axis if d.size % tp == 0 and d.out_axis is not None else None

    for op in graph.ops:
        if tp > 1 and "head" in op.dim_names and op.dim("head").size % tp:
            raise ValueError(f"tp {tp} does not divide the {op.dim('head').size} heads of {op.name!r} "
                             "(Megatron-LM needs query and key/value heads to be multiples of tp)")
        ins = [state.get((r.op, r.index)) for r in op.inputs]
        if op.kind == "linear" and sequence_parallel:
            # all-gather the sequence before a column-parallel linear
            ins = [None if (ax is not None and op.in_tensors[i].axes[ax] == "length") else ax
                   for i, ax in enumerate(ins)]
        split = [(i, ax) for i, ax in enumerate(ins) if ax is not None]
        choice: tuple[str, int | None] | None = None
        if tp > 1 and op.kind == "softmax_cross_entropy" and not loss_parallel:
            choice = (REPLICA_DIM, None)
        elif tp > 1 and split:
            for d in op.dims:
                if d.is_replica or not d.size or d.size % tp:
                    continue
                if all(d.in_axes[i] == ax for i, ax in split):
                    out = d.out_axis
                    if d.kind == REDUCTION:
                        out = length_axis(op)
                    choice = (d.name, out)
                    break
        if choice is None and tp > 1:
            if op.kind == "linear" and op.dim("feature").size % tp == 0:
                choice = ("feature", len(op.out_tensors[0].shape) - 1)
            elif op.name in vocab_ops and op.dim("vocab").size % tp == 0:
                choice = ("vocab", length_axis(op))
            elif length_axis(op) is not None and op.kind != "input":
                choice = ("length", length_axis(op))
            else:
                choice = (REPLICA_DIM, None)
                size = (op.dim("feature").size if op.kind == "linear"
                        else op.dim("vocab").size if op.name in vocab_ops else None)
                if size is not None:
                    notes.append(f"{op.name}: {size} is not divisible by tp {tp}, so it is replicated on every "
                                 "tensor-parallel rank (Megatron-LM pads the vocabulary to a multiple of "
                                 "128 x tp; build the model with a padded vocabulary to match)")
        if choice is None:
            plan[op.name] = (None, 1)
            for k in range(len(op.out_tensors)):
                state[(op.name, k)] = None
            continue
        plan[op.name] = (choice[0], tp)
        for k in range(len(op.out_tensors)):
            state[(op.name, k)] = choice[1]
    return plan, notes


def mesh_config(op: Op, dim: str | None, deg: int, dp: int, cp: int, tp: int, devices: Sequence[int]) -> Config:
    """``op``'s config on a (dp, cp, tp) mesh of ``devices`` (dp * cp * tp of them), ranked as
    Megatron-Core ranks them (tp fastest, then cp, then dp): the sample dim split dp ways, the
    sequence (``length``) cp ways, and ``dim`` (the op's tensor-parallel dim from :func:`tp_plan`,
    or None) ``deg`` ways; under sequence parallelism (``dim`` is ``length``) the tp ranks split
    each context-parallel chunk further. Partition (sample s, cp rank c, tp rank t) runs on
    ``devices[s * cp * tp + c * tp + t]``.

    >>> from engine.graph import GraphBuilder
    >>> b = GraphBuilder("m"); x = b.input("x", [4, 6]); _ = b.add("linear", "fc", [x], out_features=2)
    >>> mesh_config(b.build()["fc"], "feature", 2, 2, 1, 2, [8, 9, 10, 11]).devices
    (8, 9, 10, 11)
    """
    degrees: dict[str, int] = {}
    if dp > 1 and "sample" in op.dim_names:
        degrees["sample"] = dp
    if dim is not None:
        degrees[dim] = deg
    ctx = cp > 1 and "length" in op.dim_names
    if ctx:
        degrees["length"] = cp * (deg if dim == "length" else 1)

    # each partition's coordinates (partition_grid's rows, in partition order), one column a dim
    names, grid = partition_grid(op, Config(degrees, ()))
    at = {n: grid[:, i].astype(np.int64) for i, n in enumerate(names)}
    none = np.zeros(grid.shape[0], np.int64)
    index = at.get("sample", none) * (cp * tp)
    if ctx and dim == "length":  # length coordinate = cp_rank * tp + tp_rank
        index = index + at["length"]
    else:
        index = index + (at.get("length", none) * tp if ctx else 0) + (at.get(dim, none) if dim else 0)
    return Config(degrees, tuple(np.asarray(devices, np.int64)[index].tolist()))


def expert_config(op: Op, dp: int, cp: int, tp: int, ep: int, etp: int, devices: Sequence[int]) -> Config:
    """A mixture-of-experts op's config on a (dp, cp, tp) stage mesh whose MoE layers use
    ``ep`` x ``etp`` (Megatron-Core's "MoE parallel folding": the expert mesh edp x ep x etp
    over the same ranks). Each partition keeps the tokens its device holds in the attention
    layers (dp samples, cp x tp sequence shards under sequence parallelism; an etp group
    shares its shards), so the only token movement is the dispatch itself: ``expert`` and
    ``expert_seq`` fold ep onto samples and sequence shards (:func:`engine.moe.expert_split`),
    ``ffn`` is etp.

    >>> from engine.graph import GraphBuilder
    >>> b = GraphBuilder("m"); x = b.input("x", [4, 8, 6], axes=["sample", "length", "feature"])
    >>> p = b.add("router", "r", [x], num_experts=4, top_k=2)
    >>> e = b.add("experts", "e", [x, p], num_experts=4, top_k=2, ffn_hidden=8)
    >>> c = expert_config(b.build()["e"], 2, 1, 2, 4, 1, range(4)); dict(c.degrees), c.devices
    ({'expert': 2, 'expert_seq': 2}, (0, 1, 2, 3))
    """
    ep_s, ep_l = expert_split(tp, cp, dp, ep, etp)
    shards = cp * tp // etp
    want = {"sample": dp // ep_s, "expert": ep_s, "length": shards // ep_l, "expert_seq": ep_l, "ffn": etp}
    degrees = {d.name: want[d.name] for d in op.dims if want.get(d.name, 1) > 1}
    probe = Config(degrees, ())
    out = []
    for c in partition_coords(op, probe):
        sample = c.get("sample", 0) * ep_s + c.get("expert", 0)
        shard = (c.get("length", 0) * ep_l + c.get("expert_seq", 0)) * etp + c.get("ffn", 0)
        out.append(devices[sample * cp * tp + shard])
    return Config(degrees, tuple(out))
