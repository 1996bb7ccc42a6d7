"""Megatron layouts ``auto`` prices as seeds before its searches (:func:`moe_seed_layouts`):
mixture-of-experts models as the published recipes shape them, and dense layered models."""

from __future__ import annotations

from dataclasses import replace

from ..cluster import Cluster
from ..graph import OpGraph
from ..layout import Layout, layout_problem, tp_problem
from ..graph.blocks import layer_blocks
from ..sim.memory_static import state_bytes_per_param
from ..moe import expert_counts
from ..layout.experts import megatron_eps

__all__ = ["moe_seed_layouts", "MOE_STATIC_SHARE"]

#: the share of a GPU's memory the mixture-of-experts seeds let weights, gradients and
#: optimizer state take when they choose the pipeline depth (the rest is for activations,
#: buffers and the allocator); DeepSeek-V3 in Megatron-Bridge's layout (tp 2, pp 8, ep 64,
#: ZeRO-1) holds ~24 GB of them on an 80 GB H100 (weights 6.9, gradients 9.4, optimizer 7.6)
MOE_STATIC_SHARE = 0.5


def moe_seed_layouts(graph: OpGraph, cluster: Cluster, fp8: bool = False, dense: bool = False
                     ) -> list[list[Layout]]:
    """Megatron layouts of a mixture-of-experts model as the published recipes shape them:
    for tp 2 and 1 (with sequence parallelism; Megatron-Bridge's DeepSeek-V3 and Qwen3 recipes
    keep tp small) and each expert-parallel degree of :func:`engine.layout.experts.megatron_eps`
    (the largest inside a node, the largest across up to 8 nodes), the shallowest pipeline
    whose weights, gradients and ZeRO-1-sharded optimizer state per GPU stay under
    :data:`MOE_STATIC_SHARE` of its memory (the pp the memory needs), interleaved with the
    largest vpp of 4 and 2 the layers and microbatches allow (Megatron-LM ``arguments.py``: the
    microbatches a multiple of pp), micro-batch 1, ZeRO-1 (the distributed optimizer).
    Each entry is the layout and, after it, what to try when it does not fit: the next deeper
    pipeline, then the layout with full recomputation. Empty for a dense model unless ``dense``:
    then tp is the node's GPUs or half of them (ep 1), the rest alike.
    """
    moe = bool(expert_counts(graph))
    if not moe and not dense:
        return []
    n, batch, gpn = cluster.num_devices, graph.batch_size, cluster.gpus_per_node
    n_layers = len(layer_blocks(graph))
    capacity = min(cluster.device_type(d).memory_bytes for d in range(n))
    routed = float(sum(p.numel for op in graph.ops if op.kind == "experts" for p in op.params))
    dense = float(sum(p.numel for op in graph.ops if op.kind != "experts" for p in op.params))
    w, g, mg, o = state_bytes_per_param(graph.precision, 1)

    def static_bytes(tp: int, pp: int, dp: int, ep: int) -> float:
        # Megatron-Core's distributed-optimizer bytes per parameter, (w + g) + (main grads +
        # Adam) / d: dense weights over tp and sharded over dp, experts over ep and over edp
        edp = max(1, tp * dp // ep)
        return dense / (tp * pp) * (w + g + (mg + o) / dp) + routed / (ep * pp) * (w + g + (mg + o) / edp)

    out: list[list[Layout]] = []
    # ep across nodes, then inside one; tp 2 first. A dense model (``dense``): tp the node's GPUs,
    # then half of them, ep 1 (Narayanan et al. SC'21, Table 1: GPT-3 175B at tp 8)
    tps = ((2, -1), (2, 0), (1, -1), (1, 0)) if moe else ((gpn, 0), (gpn // 2, 0))
    for tp, which in tps:
        if tp < 1:
            continue
        if n % tp or tp_problem(graph, cluster, tp):
            continue
        fits = []
        for pp in (d for d in range(1, min(n // tp, n_layers) + 1) if (n // tp) % d == 0):
            dp = n // (tp * pp)
            if batch % dp:
                continue
            ep = megatron_eps(graph, gpn, tp, 1, dp)[which]
            vpp = next((v for v in (4, 2) if pp > 1 and pp * v <= n_layers and (batch // dp) % pp == 0), 1)
            lay = Layout(tp=tp, pp=pp, vpp=vpp, ep=ep, micro_batch=1, sequence_parallel=tp > 1, zero_stage=1,
                         fp8=fp8)
            if layout_problem(graph, cluster, lay) is None and \
                    (fits or static_bytes(tp, pp, dp, ep) <= MOE_STATIC_SHARE * capacity):
                fits.append(lay)
                if len(fits) == 2:
                    break
        if fits and all(fits[0] != x[0] for x in out):
            # activations do not shrink with pp (1F1B's first stage holds pp microbatches of
            # L / pp layers): when neither fits, full recomputation (Korthikanti et al. 2022)
            out.append(fits + [replace(fits[0], recompute="full")])
    return out
