"""Activation offloading's copies (:attr:`engine.strategy.Strategy.offload_activations`).

Megatron-Core's ``--cpu-offloading-num-layers N`` (Transformer Engine's
``get_cpu_offload_context``: one offload group per layer) copies each of the first N layers'
saved activations to host memory on a side stream once the layer's forward is done, and at the
end of the next layer's forward waits for that copy before going on (the layer's buffers are
freed then); in the backward it starts bringing layer l back when layer l + 1's backward
begins, and layer l's backward waits for it.

Segment ``("offload",)``: per simulated microbatch, offloaded layer l and device holding it,
one OFFLOAD task to the host (after the forward of l's last op; before the forward of the op
after layer l + 1) and one back (after the backward of the op after layer l + 1; before the
backward of l's last op), each taking the layer's saved bytes on that device
(:func:`engine.strategy.activations.saved_bytes`) over the GPU's host link
(:meth:`engine.cluster.Cluster.host_bw_bytes_per_s`: PCIe, NVLink-C2C, at the cost model's
data-rate share for PCIe). Each GPU's link is its own: two GPUs of a Grace superchip copying at
once share the Grace's memory bandwidth, which is not modelled. The copies hold no
compute resource (copy engines); each direction's copies run one after another (one side
stream). What a copy takes beyond the compute it runs beside shows in the iteration.
"""

from __future__ import annotations

import numpy as np

from ..graph import layer_blocks
from ..strategy.activations import offloaded_layers, saved_bytes
from .context import BuildContext, OpTables
from .segments import Segment
from .tasks import OFFLOAD

__all__ = ["OffloadPlan"]


class OffloadPlan:
    """Which ops the offload segment reads, and the segment's tasks."""

    def __init__(self, ctx: BuildContext, tables: OpTables) -> None:
        self.ctx, self.tables = ctx, tables
        g = ctx.graph
        #: [layer] op indices of each offloaded layer
        self.layers = offloaded_layers(g, ctx.strategy)
        #: [layer] the op after layer l + 1 (its forward starts once l's copy is done), or -1
        self.after: list[int] = []
        if self.layers:
            blocks = layer_blocks(g)
            last = {}
            for i, op in enumerate(g.ops):
                if op.block is not None:
                    last[op.block] = i
            for k in range(len(self.layers)):
                nxt = last.get(blocks[k + 1]) if k + 1 < len(blocks) else None
                self.after.append(nxt + 1 if nxt is not None and nxt + 1 < len(g.ops) else -1)

    @property
    def refs(self) -> set[int]:
        """The ops the segment reads: every op of an offloaded layer (their saved bytes and
        tasks) and the op after each next layer."""
        return {i for ops in self.layers for i in ops} | {a for a in self.after if a >= 0}

    def build(self, seg: Segment) -> None:
        ctx, t = self.ctx, self.tables
        if not self.layers:
            return
        g, s, c = ctx.graph, ctx.strategy, ctx.cluster
        saved = saved_bytes(g, s, ctx.split, {})
        m = ctx.microbatches
        share = ctx.cost.links("pcie")  # (NVLink-C2C has no published copy rate here: the same share)
        prev_out: dict[int, np.ndarray] = {}  # device -> [mb] the last copy to the host
        back: list[tuple[int, dict[int, np.ndarray]]] = []
        for k, ops in enumerate(self.layers):
            last = ops[-1]
            reps = np.nonzero(t.rep[last])[0]
            devices = t.devs[last][reps]
            nbytes = np.zeros(c.num_devices)
            for i in ops:
                if saved[i]:
                    np.add.at(nbytes, t.devs[i][t.rep[i]], saved[i])
            after = self.after[k]
            ins: dict[int, np.ndarray] = {}
            for p, d in zip(reps.tolist(), devices.tolist()):
                if nbytes[d] <= 0:
                    continue
                dur = nbytes[d] / (c.host_bw_bytes_per_s(d) * share)
                out = seg.add(m, OFFLOAD, op=last, part=0, mb=np.arange(m), device=d, dur=dur, size=nbytes[d])
                inn = seg.add(m, OFFLOAD, op=last, part=1, mb=np.arange(m), device=d, dur=dur, size=nbytes[d])
                seg.edges(t.fwd[last][:m, p], out)
                seg.edges(out, inn)
                seg.edges(inn, t.bwd[last][:m, p])
                if d in prev_out:  # one side stream: the copies to the host in order
                    seg.edges(prev_out[d], out)
                prev_out[d] = out
                if after >= 0:
                    q = _part_on(t.devs[after], d)
                    if q >= 0:
                        seg.edges(out, t.fwd[after][:m, q])
                        if after in t.bwd:
                            seg.edges(t.bwd[after][:m, q], inn)
                ins[d] = inn
            back.append((k, ins))
        # back from the host in the backward's order (the later layer first)
        for (_, later), (_, earlier) in zip(back[1:], back[:-1]):
            for d, inn in later.items():
                if d in earlier:
                    seg.edges(inn, earlier[d])


def _part_on(devs: np.ndarray, d: int) -> int:
    """The first partition of an op on device ``d`` (-1: none)."""
    hit = np.nonzero(devs == d)[0]
    return int(hit[0]) if hit.size else -1
