"""The one enumerator of the valid layouts of a model on a cluster: what MCMC's layout moves
(:mod:`engine.search.moves`), the pipeline planner (:mod:`engine.search.pipeline`) and the
sweep's ``layout_points`` (:mod:`engine.studies.sweep`) draw from. Its rules are stated once, in
:func:`valid_layouts`' docstring; the hard ones (what any layout must satisfy) are
:func:`engine.layout.record.layout_problem`'s, the rest are search limits stated here.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from ..cluster import Cluster
from ..graph import OpGraph
from ..graph.blocks import layer_blocks
from ..moe import expert_counts
from ..strategy.config import divisors
from ..strategy.core import MAX_MICROBATCHES
from .experts import expert_shapes
from .record import Layout
from .rules import tp_problem

__all__ = ["valid_layouts", "mesh_shapes", "micro_batch_sizes", "MAX_CP", "MIN_CP_TOKENS", "MAX_MICROBATCHES_PER_STAGE"]

#: the largest context-parallel degree the enumerator proposes by default: Megatron-Core's
#: long-context runs use 2-16 (Llama 3 405B: cp 16 at 128 K tokens only, Dubey et al. 2024
#: Table 4); each cp rank is simulated (not mirrored), so a cp of 64 on GPT-3 makes ~10 M tasks
MAX_CP = 8

#: the fewest tokens a context-parallel rank keeps (below it attention is not worth splitting)
MIN_CP_TOKENS = 512

#: the most microbatches per pipeline stage the enumerator proposes by default (8 with one
#: stage). The bubble is (pp - 1) / m of the time (Narayanan et al. SC'21 §2.2.1): 8 per stage
#: leaves it under 1/8, and every microbatch more adds tasks (GPT-3 on 1,024 GPUs, pp 32 and
#: 768 microbatches: 23 M tasks even under symmetry)
MAX_MICROBATCHES_PER_STAGE = 8


def micro_batch_sizes(batch: int, dp: int, pp: int = 1,
                      max_per_stage: int | None = MAX_MICROBATCHES_PER_STAGE) -> list[int]:
    """The micro-batch sizes (samples) allowed for ``dp`` replicas of a ``batch``: the
    divisors of the per-replica batch (:func:`microbatch_count`), at most
    ``MAX_MICROBATCHES`` microbatches, and at most ``max_per_stage`` x ``pp`` of them
    (None: no such limit); ascending.

    >>> micro_batch_sizes(32, 2), micro_batch_sizes(32, 2, max_per_stage=None)
    ([2, 4, 8, 16], [1, 2, 4, 8, 16])
    """
    if dp < 1 or batch % dp:
        return []
    per = batch // dp
    cap = MAX_MICROBATCHES if max_per_stage is None else min(MAX_MICROBATCHES, max_per_stage * pp)
    return [mb for mb in range(1, per + 1) if per % mb == 0 and per // mb <= cap]


def _cp_choices(n: int, cap: int, seqs: Sequence[int], tp: int, sp: bool) -> list[int]:
    """Context-parallel degrees of ``n`` devices: divisors up to ``cap`` that divide every
    sequence length (times tp under sequence parallelism); [1] without a sequence."""
    if not seqs:
        return [1]
    return [d for d in divisors(n, n) if d <= cap and (d == 1 or not any(s % (d * (tp if sp else 1)) for s in seqs))]


def _cp_cap(seqs: Sequence[int], max_cp: int | None) -> int:
    return max(1, min(MAX_CP, min(seqs, default=0) // MIN_CP_TOKENS)) if max_cp is None else max_cp


def mesh_shapes(graph: OpGraph, cluster: Cluster, n_devices: int, *, max_cp: int | None = None,
                sequence_parallel: bool = False) -> list[tuple[int, int, int]]:
    """The (tp, cp, dp) meshes of ``n_devices`` consecutive devices (one pipeline stage, or one
    block of ops that MCMC re-lays), tp then cp ascending, by :func:`valid_layouts`' rules for
    tp (inside a node, dividing the heads) and cp (up to ``max_cp``, dividing the sequence);
    dp the devices left over.

    >>> from engine.cluster import preset
    >>> from engine.formats import resolve_model
    >>> mesh_shapes(resolve_model("gpt2", batch=8), preset("dgx-a100-80gb:1"), 8)
    [(1, 1, 8), (1, 2, 4), (2, 1, 4), (2, 2, 2), (4, 1, 2), (4, 2, 1)]
    """
    seqs = [op.dim("length").size for op in graph.ops if "length" in op.dim_names]
    cap = _cp_cap(seqs, max_cp)
    return [(tp, cp, n_devices // (tp * cp)) for tp in divisors(n_devices, n_devices)
            if tp_problem(graph, cluster, tp) is None
            for cp in _cp_choices(n_devices // tp, cap, seqs, tp, sequence_parallel and tp > 1)]


def valid_layouts(graph: OpGraph, cluster: Cluster, *, tps: Sequence[int] | None = None,
                  pps: Sequence[int] | None = None, micro_batches: Sequence[int] | None = None,
                  max_cp: int | None = None, max_microbatches_per_stage: int | None = MAX_MICROBATCHES_PER_STAGE,
                  **settings: Any) -> Iterator[Layout]:
    """Every valid Megatron-shaped layout of ``graph`` on ``cluster``, in the order tp, pp,
    cp, ep, etp, micro-batch (each ascending; ``dp`` the devices left over). The one enumerator: MCMC's
    layout moves, the pipeline planner and the sweep's ``layout_points`` draw from it.

    The rules (Megatron-LM ``arguments.py``; Narayanan et al. SC'21 §3):

    * **tiling**: tp x pp x cp x dp = the cluster's devices; ranks tp fastest, then cp, dp, pp.
    * **a node** is :attr:`engine.cluster.Cluster.gpus_per_node` consecutive devices; **tp
      divides it**, so every tensor-parallel group sits inside a node (its all-reduces run
      every layer, over NVLink; §3.2).
    * **heads**: tp divides every op's attention heads (query and key/value).
    * **layers**: pp is at most the number of layer blocks (1 for a model without them).
    * **sequence**: cp > 1 only for a model with a sequence (``length``) dim; cp divides
      every sequence length, and is at most ``max_cp`` (default: :data:`MAX_CP`, and each
      rank keeps at least :data:`MIN_CP_TOKENS` tokens of the shortest sequence).
    * **batch**: dp divides the global batch.
    * **experts** (MoE): (ep, etp) by :func:`expert_shapes` (dense: 1, 1); sequence parallelism
      wherever tp > 1, whatever is asked (Megatron-LM ``arguments.py`` requires it with MoE).
    * **micro-batches** (:func:`micro_batch_sizes`): the micro-batch divides the per-replica
      batch (batch / dp), and the microbatches (batch / (dp x micro-batch)) are at most
      ``max_microbatches_per_stage`` x pp (default :data:`MAX_MICROBATCHES_PER_STAGE`; None:
      no such cap).

    ``tps``, ``pps``, ``micro_batches`` restrict the candidates (default: every divisor) and
    set their order (default ascending);
    ``settings`` (recompute, zero_stage, fp8, sequence_parallel, ...) are copied into every
    layout (sequence parallelism only where tp > 1). vpp is 1 (no interleaving).

    >>> from engine.cluster import preset
    >>> from engine.formats import resolve_model
    >>> lays = list(valid_layouts(resolve_model("gpt2", batch=8), preset("p100-4x4")))
    >>> sorted({(x.tp, x.pp, x.dp) for x in lays})[:3], all(x.tp * x.pp * x.cp * x.dp == 16 for x in lays)
    ([(1, 1, 8), (1, 2, 4), (1, 2, 8)], True)
    """
    n, batch = cluster.num_devices, graph.batch_size
    n_layers = len(layer_blocks(graph))
    seqs = [op.dim("length").size for op in graph.ops if "length" in op.dim_names]
    cp_cap = _cp_cap(seqs, max_cp)
    sp = bool(settings.pop("sequence_parallel", False)) or bool(expert_counts(graph))
    for tp in (tps if tps is not None else divisors(n, n)):
        if n % tp or tp_problem(graph, cluster, tp):
            continue
        tsp = sp and tp > 1
        for pp in (pps if pps is not None else divisors(n // tp, n // tp)):
            if (n // tp) % pp or pp > max(1, n_layers):
                continue
            for cp in _cp_choices(n // (tp * pp), cp_cap, seqs, tp, tsp):
                dp = n // (tp * pp * cp)
                allowed = micro_batch_sizes(batch, dp, pp, max_microbatches_per_stage)
                for ep, etp in expert_shapes(graph, tp, cp, dp):
                    for mb in (allowed if micro_batches is None else [m for m in micro_batches if m in allowed]):
                        yield Layout(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp, micro_batch=mb,
                                     sequence_parallel=tsp, **settings)
