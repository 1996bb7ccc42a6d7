"""The rules every layout must satisfy on a model and a cluster: tensor parallelism within a
node and the heads, :func:`layout_problem` (the first reason a layout cannot be built: the hard
rules of :func:`engine.layout.enumeration.valid_layouts`), and :func:`resolved` (a layout with
what depends on the model and cluster filled in)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..cluster import Cluster
from ..graph import OpGraph
from ..graph.blocks import layer_blocks
from ..moe import moe_layout_problem

from .record import Layout

__all__ = ["tp_problem", "layout_problem", "resolved"]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def tp_problem(graph: OpGraph, cluster: Cluster | None, tp: int) -> str | None:
    """Why a tensor-parallel degree does not fit, or None: ``tp`` must divide every op's
    attention heads (Megatron-LM asserts that query and key/value heads are multiples of tp),
    and, given a cluster, divide :attr:`engine.cluster.Cluster.gpus_per_node`, so that the
    tensor-parallel groups (consecutive ranks) sit inside nodes (Narayanan et al. SC'21 §3.2,
    "tensor model parallelism within a server")."""
    if cluster is not None and cluster.gpus_per_node % tp:
        return (f"tp {tp} does not divide the {cluster.gpus_per_node} GPUs per node of {cluster.name}: a "
                "tensor-parallel group would span nodes")
    if tp > 1:
        for size, name in graph.dim_sizes("head"):  # (each distinct size once, with the first op that has it)
            if size % tp:
                return (f"tp {tp} does not divide the {size} heads of {name!r} (Megatron-LM needs "
                        "query and key/value heads to be multiples of tp)")
    return None


def layout_problem(graph: OpGraph, cluster: Cluster, lay: Layout) -> str | None:
    """Why ``lay`` cannot be built for ``graph`` on ``cluster`` (the first reason), or None.
    The hard rules of :func:`valid_layouts` (tiling, heads, layers, sequence, batch and
    micro-batch); not its search limits (tp within a node, the cp and microbatch caps)."""
    n, batch = cluster.num_devices, graph.batch_size
    tp, pp, cp = lay.tp, lay.pp, lay.cp
    model = tp * cp * pp
    if lay.dp is None:
        if n % model:
            return (f"tp ({tp}) x cp ({cp}) x pp ({pp}) does not divide the {n} devices of {cluster.name}" if cp > 1
                    else f"tp ({tp}) x pp ({pp}) does not divide the {n} devices of {cluster.name}")
        dp = n // model
    else:
        dp = lay.dp
        if model * dp > n:
            return (f"tp x cp x pp x dp = {tp} x {cp} x {pp} x {dp} = {model * dp} devices, but {cluster.name} has {n}"
                    if cp > 1 else f"tp x pp x dp = {tp} x {pp} x {dp} = {tp * pp * dp} devices, but {cluster.name} "
                                   f"has {n}")
    why = tp_problem(graph, None, tp)
    if why:
        return why
    n_layers = len(layer_blocks(graph))
    if pp * lay.vpp > 1 and n_layers == 0:
        return f"model {graph.name!r} has no numbered layer blocks to split into pipeline stages"
    if pp * lay.vpp > n_layers > 0:
        return f"{n_layers} layers cannot fill {pp * lay.vpp} pipeline chunks (pp x vpp)"
    if cp > 1:
        seqs = {size for size, _ in graph.dim_sizes("length")}
        if not seqs:
            return f"cp {cp}: the model has no sequence (length) dimension to split"
        need = cp * (tp if lay.sequence_parallel else 1)
        bad = sorted(s for s in seqs if s % need)
        if bad:
            return (f"cp {cp}{f' x tp {tp} (sequence parallel)' if lay.sequence_parallel else ''} does not divide "
                    f"the sequence length {bad[0]}")
    why = moe_layout_problem(graph, tp, cp, dp, lay.ep, lay.etp, lay.sequence_parallel)
    if why:
        return why
    if lay.global_batch is not None and lay.global_batch != batch:
        return (f"global batch {lay.global_batch}: the model was built with a batch of {batch} (rebuild it with "
                f"--batch {lay.global_batch})")
    if batch % dp:
        return f"global batch {batch} is not divisible by dp ({dp})"
    if lay.micro_batch is not None and batch % (lay.micro_batch * dp):
        return f"global batch {batch} is not a multiple of micro_batch ({lay.micro_batch}) x dp ({dp})"
    return None


def resolved(lay: Layout, graph: OpGraph, cluster: Cluster) -> Layout:
    """``lay`` with the defaults that depend on the model and cluster filled in (dp,
    micro-batch, global batch, schedule), or ValueError when it cannot be built there
    (:func:`layout_problem`)."""
    why = layout_problem(graph, cluster, lay)
    if why:
        raise ValueError(why)
    n, batch = cluster.num_devices, graph.batch_size
    dp = lay.dp if lay.dp is not None else n // (lay.tp * lay.cp * lay.pp)
    mb = lay.micro_batch if lay.micro_batch is not None else (batch // dp if lay.pp == 1 else 1)
    return replace(lay, dp=dp, micro_batch=mb, global_batch=batch,
                   schedule=lay.schedule or ("interleaved" if lay.vpp > 1 else "1f1b"))
