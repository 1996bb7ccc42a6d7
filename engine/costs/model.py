"""The cost model: how long an operator partition takes, and the one object that prices every
task (:class:`CostModel`).

Operator time (FlexFlow's assumption 1: task times are predictable) comes from

* a **measured profile table** keyed by (op kind, partition shapes, precision, device type),
  FlexFlow's "measure each distinct operator once" (Jia et al. SysML'19 §5.1), when it has
  the entry; otherwise
* a **roofline** (Williams et al. CACM 2009): ``max(FLOPs / (peak x efficiency),
  bytes / (memory bandwidth x efficiency)) + kernel overhead``, with the achievable fraction
  of peak per kind of op given by the named constants below.

Transfers follow FlexFlow's assumption 2 per link: latency + bytes / bandwidth, with a link
efficiency (the fraction of the nominal rate NCCL reaches). Collectives use NCCL's own cost
model (ring or tree, LL/LL128/Simple, per-step latencies NVIDIA measured), whichever is
fastest, as NCCL's tuner chooses (:mod:`engine.costs.collectives`).

Every constant below was chosen from a published figure (a kernel benchmark, a paper's
measurement, a datasheet); none is fitted on end-to-end training rows, per row or per device
type (issue 42: benchmarks/calibrate.py judges what such fits would do out of sample).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Mapping

from ..ops import DTYPE_BYTES, experts_capacity_share
from .collectives import LINK_EFFICIENCY, LINK_SHARE, LinkShares
from .profile import ProfileTable


__all__ = ["CostModel", "MATMUL_KINDS", "GROUPED_GEMM_SHARE", "GROUPED_GEMM_TILE_M"]

#: Op kinds whose time is dominated by matrix-multiply FLOPs (run on tensor cores).
MATMUL_KINDS = frozenset({"conv2d", "linear", "batch_matmul", "lstm", "attention", "router", "experts"})
#: rows of a GEMM tile: a grouped GEMM pads each expert's tokens to a multiple of it
GROUPED_GEMM_TILE_M = 128
#: What a large grouped GEMM (a MoE layer's experts in one kernel) keeps of a dense GEMM's
#: large-GEMM fraction, per precision: measured on one H200 (benchmarks/gpu_grouped_gemm.py,
#: benchmarks/measured/h200_grouped_gemm.jsonl: torch 2.11's ``_grouped_mm`` and fp8 rowwise
#: ``_scaled_grouped_mm`` at the five MoE samples' per-rank shapes), reduced by
#: benchmarks/fit_grouped_gemm.py. bf16 grouped GEMMs reached 0.52-0.78 of peak, fp8 only
#: 0.41-0.49 of fp8's peak (1.0-1.2x bf16's rate). Applied on every architecture (measured on
#: Hopper only).
GROUPED_GEMM_SHARE = {"bf16": 0.856, "fp16": 0.856, "fp8": 0.583}

# GEMM time from its shape (M x K) . (K x N), per device and precision:
#     fraction of dense peak = large-GEMM fraction(arch, precision)
#                              x tile-and-wave quantisation(M, N, SMs) x K-loop amortisation(K)
# * The large-GEMM fraction is the Maximum Achievable Matmul FLOPS (MAMF) that mamf-finder
#   measured on each GPU (Bekman, "ML Engineering", compute/accelerator/README.md, "Maximum
#   Achievable Matmul FLOPS comparison table", bf16, no sparsity): A100 SXM 267.9 of 312
#   TFLOP/s (0.859, CUDA 12.1), A100 PCIe 256.4 (0.822), H100 SXM 792.1 of 989 (0.801, CUDA
#   12.1), GH200 821.0 of 989 (0.830, CUDA 12.5); B200 1745 of 2250 (0.776) and fp8 on H200
#   0.734, on B200 0.763 (same author, "H200 vs B200" guide, torch 2.13). Measured, not fitted.
#   Precisions without a measurement (fp16 on these GPUs: the same tensor-core rate as bf16;
#   tf32) take their architecture's bf16 fraction; GPUs without one (V100, Turing and Ada
#   GeForce cards) take MATMUL_EFFICIENCY, the middle of the measured 0.78-0.86.
# * Tile and wave quantisation (NVIDIA, "Matrix Multiplication Background User's Guide",
#   docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication): the output
#   is cut into tiles (cuBLAS's large-GEMM tiles are 128 x 256 / 256 x 128 / 128 x 128), one
#   thread block per tile, at most one per SM at a time: a GEMM of T tiles on S SMs runs
#   ceil(T / S) waves, the last one partly idle, and its edge tiles are partly padding. cuBLAS
#   picks the tile; the model takes the best of the three.
# * The K loop: each tile's prologue and epilogue (loading the pipeline, writing C) cost about
#   GEMM_K_HALF iterations' worth of the main loop, so a short inner dimension K reaches
#   K / (K + GEMM_K_HALF) of what a long one does, relative to the MAMF shapes' K (~2048).
#   GEMM_K_HALF is two 64-deep K tiles (not fitted; benchmarks/calibrate.py prints the
#   in-sample error at 64, 128 and 256).
# * Nothing is fitted per device type on end-to-end rows (issue 42): the share per device type
#   soapbox had (SUSTAINED_FRACTION, fitted on 3-16 rows each) predicted its own rows to a median
#   of 2-16% and the source families it was not fitted on to 25-53%: it stood for the software
#   stack, the clocks and every unmodelled kernel, not for the device. benchmarks/calibrate.py
#   --loso keeps the judgement; docs/benchmarks/2026-11-28-issue-42-out-of-sample.md the table.
MATMUL_EFFICIENCY = 0.8
#: (architecture, precision) -> large-GEMM fraction of the dense tensor-core peak (MAMF, above)
GEMM_FRACTION: dict[tuple[str, str], float] = {
    ("ampere", "bf16"): 0.859, ("ampere", "fp16"): 0.859, ("ampere", "tf32"): 0.859,
    ("hopper", "bf16"): 0.801, ("hopper", "fp16"): 0.801, ("hopper", "tf32"): 0.801, ("hopper", "fp8"): 0.734,
    ("blackwell", "bf16"): 0.776, ("blackwell", "fp16"): 0.776, ("blackwell", "tf32"): 0.776,
    ("blackwell", "fp8"): 0.763,
}
#: device type -> its own measured fraction (bf16, fp16, tf32) where it differs from its architecture's
DEVICE_GEMM_FRACTION: dict[str, float] = {"GH200-96GB": 0.830, "GH200-144GB": 0.830, "A100-PCIe-80GB": 0.822}
#: Output tiles cuBLAS uses for large GEMMs (rows x columns of C per thread block).
GEMM_TILES = ((128, 256), (256, 128), (128, 128))
#: K of the shapes MAMF was measured at (6912x16384x2048 on A100, 6144x17920x2816 on H100).
GEMM_K_REF = 2048
#: K-loop iterations' worth of prologue and epilogue per tile, in elements of K: two 64-deep K
#: tiles (one to fill the pipeline, one to write C), checked at 64/128/256 by benchmarks/calibrate.py.
GEMM_K_HALF = 128.0
# Batched matmuls of attention (small inner dimension, many heads) run less efficiently.
BMM_EFFICIENCY = 0.55
# Fused attention: FlashAttention-2 reaches 50-73% of the A100's peak in the forward pass and
# less in the backward pass (Dao 2023, §4.1: 187-225 TFLOP/s forward and backward together at
# head dimension 128, i.e. 0.6-0.72 of 312).
ATTENTION_EFFICIENCY = 0.6
#: Fused attention's fraction of peak by architecture where it differs from the A100's: on
#: Hopper, FlashAttention-3 and cuDNN's fused attention (what Transformer Engine and PyTorch's
#: SDPA use there) reach 75% of the bf16 peak forward (Shah et al. 2024, FlashAttention-3,
#: §4.1: 740 TFLOP/s) and 1.5-1.75x FlashAttention-2's backward (~0.5 of peak); the backward
#: does 2.5x the forward's FLOPs, so together 3.5 / (1/0.75 + 2.5/0.5) = 0.55. Blackwell: no
#: published fraction yet (FlashAttention-4 and cuDNN are young there); Hopper's is kept.
ATTENTION_FRACTION: dict[str, float] = {"hopper": 0.55, "blackwell": 0.55}
# Non-matmul FLOPs run on the CUDA cores, whose peak is the fp32 SIMT rate.
POINTWISE_FLOPS_EFFICIENCY = 0.8
# Fraction of HBM bandwidth that memory-bound kernels reach (STREAM-like kernels on A100/H100
# reach 85-92% of the datasheet bandwidth).
MEMORY_EFFICIENCY = 0.85
# Fixed cost per kernel launch (CUDA launch latency is ~3-5 us; back-to-back launches overlap
# it partly). FlexFlow's assumption 4 sets it to 0; real iteration times need it.
KERNEL_OVERHEAD_S = 3e-6
# Bytes moved per parameter by a mixed-precision Adam step: read fp32 master weight, fp32
# gradient, two fp32 moments; write weight, two moments and the half-precision copy
# (Rajbhandari et al. SC'20 §3 count 16 bytes of state per parameter).
ADAM_BYTES_PER_PARAM = 4 * 4 + 3 * 4 + 2
#: The same by optimizer state (:data:`engine.strategy.OPTIMIZER_STATES`): with the moments in
#: bf16 each moment is read and written in 2 bytes, not 4 (8 bytes fewer); with no master copy
#: the bf16 parameter is read and written (2 + 2), its bf16 gradient read (2), the bf16
#: moments read and written (4 x 2).
ADAM_BYTES_BY_STATE = {"fp32": ADAM_BYTES_PER_PARAM, "bf16-moments": ADAM_BYTES_PER_PARAM - 8, "bf16": 4 + 2 + 8}

# Transformer Engine's fused cast-transpose (fp8): reads a 2-byte element, writes its fp8 value
# and its fp8 transpose (1 + 1 bytes), bytes per element.
FP8_CAST_BYTES_PER_ELEMENT = 4


@dataclass(frozen=True)
class CostModel:
    """Operator, transfer and collective times. All efficiencies are fractions of peak."""

    matmul_efficiency: float = MATMUL_EFFICIENCY
    bmm_efficiency: float = BMM_EFFICIENCY
    attention_efficiency: float = ATTENTION_EFFICIENCY
    pointwise_efficiency: float = POINTWISE_FLOPS_EFFICIENCY
    memory_efficiency: float = MEMORY_EFFICIENCY
    kernel_overhead_s: float = KERNEL_OVERHEAD_S
    #: data-rate share of links whose kind :attr:`link_shares` does not name (PCIe, a user's own)
    link_efficiency: float = LINK_EFFICIENCY
    optimizer_bytes_per_param: float = ADAM_BYTES_PER_PARAM
    profile: ProfileTable | None = None
    #: ((architecture, precision), large-GEMM fraction): :data:`GEMM_FRACTION`
    gemm_fractions: tuple[tuple[tuple[str, str], float], ...] = tuple(GEMM_FRACTION.items())
    #: (device type name, fraction) measured on that GPU itself: :data:`DEVICE_GEMM_FRACTION`
    device_gemm_fractions: tuple[tuple[str, float], ...] = tuple(DEVICE_GEMM_FRACTION.items())
    #: K-loop amortisation constant, elements of K (:data:`GEMM_K_HALF`); 0: none
    gemm_k_half: float = GEMM_K_HALF
    #: tile and wave quantisation of linear layers' GEMMs (needs the device's SM count)
    gemm_quantisation: bool = True
    #: (architecture, fused attention's fraction of peak): :data:`ATTENTION_FRACTION`
    attention_fractions: tuple[tuple[str, float], ...] = tuple(ATTENTION_FRACTION.items())
    #: (device type name, share of its kernel rates) a what-if: e.g. a user's own measured
    #: step time on their cluster, or benchmarks/calibrate.py's diagnostic of what a source
    #: family's rows would want. None by default: soapbox fits no factor per device (issue 42).
    sustained_fractions: tuple[tuple[str, float], ...] = ()
    #: (link kind, share of its nominal rate NCCL's transfers reach): :data:`LINK_SHARE`
    #: (NVLink 0.80, InfiniBand/RoCE 0.96); () takes ``link_efficiency`` for every link
    link_shares: tuple[tuple[str, float], ...] = tuple(LINK_SHARE.items())

    @cached_property
    def links(self) -> LinkShares:
        """Each kind of link's data-rate share (:attr:`link_shares`, else ``link_efficiency``);
        made once per cost model (every collective of a build asks for it)."""
        return LinkShares(self.link_shares, self.link_efficiency)

    def sustained(self, device_type) -> float:
        """The share of its kernel rates ``device_type`` is told to sustain
        (:attr:`sustained_fractions`; 1 when none is given, as by default)."""
        name = getattr(device_type, "name", None)
        for n, f in self.sustained_fractions:
            if n == name:
                return f
        return 1.0

    def large_gemm_fraction(self, device_type, precision: str = "bf16") -> float:
        """The fraction of its dense tensor-core peak ``device_type`` reaches on large, aligned
        GEMMs at ``precision``: the GPU's own measurement (not for fp8), else its
        architecture's, else ``matmul_efficiency`` (convolutions and LSTM gates take it whole:
        their small-channel cases are memory-bound in the roofline already)."""
        name = getattr(device_type, "name", None)
        if precision != "fp8":
            for n, eff in self.device_gemm_fractions:
                if n == name:
                    return eff
        key = (getattr(device_type, "arch", ""), precision)
        for k, eff in self.gemm_fractions:
            if k == key:
                return eff
        return self.matmul_efficiency

    def tensor_core_scale(self, device_type, precision: str = "bf16") -> float:
        """How much more (or less) of its tensor-core peak ``device_type`` reaches than the
        default: its large-GEMM fraction over ``matmul_efficiency`` (1 when it has none)."""
        return self.large_gemm_fraction(device_type, precision) / self.matmul_efficiency

    def gemm_fraction(self, m: float, n: float, k: float, device_type, precision: str = "bf16") -> float:
        """Achievable fraction of peak of one (m x k) . (k x n) GEMM on ``device_type``: the
        large-GEMM fraction, times the tile-and-wave quantisation of its m x n output on the
        device's SMs, times the K loop's amortisation (see :data:`GEMM_FRACTION`,
        :data:`GEMM_TILES`, :data:`GEMM_K_HALF`).

        >>> from engine.cluster import DEVICE_TYPES
        >>> a100 = DEVICE_TYPES["A100-SXM4-80GB"]
        >>> round(CostModel(gemm_k_half=0).gemm_fraction(6912, 16384, 2048, a100), 3)  # a MAMF shape
        0.859
        """
        frac = self.large_gemm_fraction(device_type, precision)
        sms = getattr(device_type, "sms", 0) or 0
        if self.gemm_quantisation and sms > 0 and m > 0 and n > 0:
            frac *= _quantisation(m, n, sms, waves=getattr(device_type, "arch", "") not in STREAM_K_ARCHS)
        if self.gemm_k_half > 0 and k > 0:
            h = self.gemm_k_half
            frac *= min(1.0, k * (GEMM_K_REF + h) / ((k + h) * GEMM_K_REF))
        return frac

    def attention_fraction(self, device_type) -> float:
        """Fused (flash) attention's fraction of the tensor-core peak on ``device_type``."""
        arch = getattr(device_type, "arch", "")
        for a, eff in self.attention_fractions:
            if a == arch:
                return eff
        return self.attention_efficiency

    def op_time_s(self, kind: str, flops: float, bytes_moved: float, precision: str, device_type,
                  matmul: bool | None = None, fraction: float | None = None) -> float:
        """Roofline time of one kernel: ``max(compute, memory) + overhead`` seconds.

        Parameters
        ----------
        kind : str
            Op kind; decides which peak (tensor core or SIMT) and efficiency apply.
        flops : float
        bytes_moved : float
            Bytes read and written in HBM.
        precision : str
        device_type : DeviceType
        fraction : float, optional
            The GEMM's achievable fraction of peak when the caller knows its shape
            (:meth:`gemm_fraction`); otherwise the kind's.
        """
        if flops == 0 and bytes_moved == 0:
            return 0.0
        if kind in MATMUL_KINDS if matmul is None else matmul:
            if fraction is not None:
                eff = fraction
            elif kind == "batch_matmul":
                eff = self.bmm_efficiency * self.tensor_core_scale(device_type, precision)
            elif kind == "attention":
                eff = self.attention_fraction(device_type)
            else:
                eff = self.large_gemm_fraction(device_type, precision)
            peak = device_type.peak(precision) * eff * self.sustained(device_type)
        else:
            peak = device_type.peak("fp32") * self.pointwise_efficiency
        compute = flops / peak
        memory = bytes_moved / (device_type.mem_bw_bytes_per_s * self.memory_efficiency)
        return max(compute, memory) + self.kernel_overhead_s

    def partition_times_s(self, op, degrees: Mapping[str, int], precision: str, device_type,
                          fp8: bool = False) -> tuple[float, float]:
        """(forward, backward) seconds of one partition of ``op`` under ``degrees``: the
        profile entry when there is one, else the roofline. A linear layer's three GEMMs are
        priced by shape (:meth:`gemm_fraction`): the forward (tokens x in) . (in x out), the
        input gradient (tokens x out) . (out x in) and the weight gradient (out x tokens) .
        (tokens x in), the backward's two sharing its FLOPs equally. ``fp8``: a linear layer's
        GEMMs run in fp8 (Transformer Engine; :attr:`engine.strategy.Strategy.fp8`): at the fp8
        peak and fp8's measured fraction of it, plus the kernels that cast the input (forward) and the output
        gradient (backward) to fp8 with their transposes: read 2 bytes, write 1 + 1, per
        element, memory-bound. Weights are cast once per iteration (TE caches them over
        microbatches) and not counted."""
        ins, outs, params = op.partition_shapes(degrees)
        fp8 = fp8 and op.kind in ("linear", "experts")
        if self.profile is not None:
            hit = self.profile.get(ProfileTable.key(op.kind, ins, outs, params, "fp8" if fp8 else precision,
                                                    device_type.name))
            if hit is not None:
                return hit
        if op.kind == "input":
            return 0.0, 0.0
        parts = max(1, math.prod(v for k, v in degrees.items() if k != "replica"))
        fwd_flops, bwd_flops = op.partition_flops(degrees)
        fwd_bytes = (op.fwd_bytes_read + op.fwd_bytes_written) / parts
        bwd_bytes = (op.bwd_bytes_read + op.bwd_bytes_written) / parts
        gemm = "fp8" if fp8 else precision
        f_frac = b_frac = None
        if op.kind == "linear" and params and len(params[0]) == 2 and outs:
            n, k = params[0]  # weight (out, in)
            m = math.prod(outs[0]) / max(1, n)  # tokens of this partition
            f_frac = self.gemm_fraction(m, n, k, device_type, gemm)
            dgrad, wgrad = self.gemm_fraction(m, k, n, device_type, gemm), self.gemm_fraction(n, k, m, device_type, gemm)
            b_frac = 2.0 / (1.0 / dgrad + 1.0 / wgrad) if dgrad > 0 and wgrad > 0 else None
        elif op.kind == "router" and params and outs:
            e, h = params[0]
            m = math.prod(outs[0]) / max(1, e)
            f_frac = self.gemm_fraction(m, e, h, device_type, gemm)
            b_frac = 2.0 / (1.0 / self.gemm_fraction(m, h, e, device_type, gemm)
                            + 1.0 / self.gemm_fraction(e, h, m, device_type, gemm))
        elif op.kind == "experts" and params and outs:
            f_frac, b_frac = self._grouped_fractions(op, ins, outs, params, device_type, gemm)
        fwd = self.op_time_s(op.kind, fwd_flops, fwd_bytes, gemm, device_type, fraction=f_frac)
        bwd = self.op_time_s(op.kind, bwd_flops, bwd_bytes, gemm, device_type, fraction=b_frac)
        if op.kind == "experts" and params and outs:
            f_s, b_s = self._experts_pointwise_s(op, outs, params, precision, device_type, fp8)
            fwd, bwd = fwd + f_s, bwd + b_s
        elif fp8:
            bw = device_type.mem_bw_bytes_per_s * self.memory_efficiency
            fwd += FP8_CAST_BYTES_PER_ELEMENT * math.prod(ins[0]) / bw + self.kernel_overhead_s
            bwd += FP8_CAST_BYTES_PER_ELEMENT * math.prod(outs[0]) / bw + self.kernel_overhead_s
        if op.is_view:
            fwd = bwd = 0.0
        return fwd, bwd

    def _grouped_fractions(self, op, ins, outs, params, device_type, gemm: str) -> tuple[float, float]:
        """(forward, backward) fraction of peak of one experts partition's grouped GEMMs (Megatron-
        Core's GroupedMLP / Transformer Engine's GroupedLinear: one kernel over the local
        experts). Each local expert multiplies its tokens (the partition's tokens x top_k x
        capacity share / local experts, balanced) by its (h x f_in) and (f x h) weights: the
        GEMMs are priced by :meth:`gemm_fraction` on the experts' rows stacked, times the
        measured grouped-GEMM share (:data:`GROUPED_GEMM_SHARE`), times each expert's rows
        padded to a :data:`GROUPED_GEMM_TILE_M` tile (few tokens per expert, as with many
        experts on few ranks' tokens, waste the tile). The two GEMMs are weighted
        by their FLOPs; the backward's data and weight gradients as a linear layer's."""
        local, h, f_in = params[0]
        f = params[1][1]
        rows = math.prod(outs[0][:-1]) * op.attrs["top_k"] * experts_capacity_share(op.attrs)
        m_e = rows / max(1, local)
        pad = m_e / (math.ceil(m_e / GROUPED_GEMM_TILE_M) * GROUPED_GEMM_TILE_M) if m_e > 0 else 1.0

        share = GROUPED_GEMM_SHARE.get(gemm, 1.0)

        def frac(m, n, k):
            return self.gemm_fraction(m, n, k, device_type, gemm) * pad * share

        def weighted(pairs):  # [(flops, fraction)] -> the fraction of their sum
            return sum(w for w, _ in pairs) / sum(w / x for w, x in pairs if x > 0)

        fwd = weighted([(f_in, frac(rows, f_in, h)), (f, frac(rows, h, f))])
        bwd = weighted([(f_in, frac(rows, h, f_in)), (f_in, frac(h, f_in, m_e)),
                        (f, frac(rows, f, h)), (f, frac(f, h, m_e))])
        return fwd, bwd

    def _experts_pointwise_s(self, op, outs, params, precision: str, device_type, fp8: bool) -> tuple[float, float]:
        """(forward, backward) seconds of an experts partition's memory-bound kernels, which run
        beside its grouped GEMMs, not under them (Megatron-Core's MoE layer: ``permute``,
        the activation, ``unpermute``; Transformer Engine's fp8 casts). Per routed token copy
        (the partition's tokens x top_k x capacity share), in elements of the model's dtype:
        permute reads the token and writes its copy (2h), the SwiGLU (or GeLU) reads the first
        GEMM's output and writes its input to the second (f_in + f), unpermute reads the copy
        and adds it, scaled by its router weight, into the token (h + h/top_k); under fp8
        the two GEMM inputs are cast to fp8 with their transposes (h + f elements at
        :data:`FP8_CAST_BYTES_PER_ELEMENT` bytes). The backward runs the same kernels' gradients,
        counted as twice the forward's bytes. Five kernel launches a pass."""
        _, h, f_in = params[0]
        f = params[1][1]
        k = op.attrs["top_k"]
        rows = math.prod(outs[0][:-1]) * k * experts_capacity_share(op.attrs)
        item = DTYPE_BYTES.get(precision, 2)
        per_row = (2 * h + f_in + f + h + h / k) * item + (FP8_CAST_BYTES_PER_ELEMENT * (h + f) if fp8 else 0)
        bw = device_type.mem_bw_bytes_per_s * self.memory_efficiency
        fwd = rows * per_row / bw + 5 * self.kernel_overhead_s
        return fwd, 2 * fwd

    def optimizer_time_s(self, params: float, device_type, state: str = "fp32") -> float:
        """One Adam step over ``params`` parameters (memory-bound), with the optimizer keeping
        ``state`` (:data:`ADAM_BYTES_BY_STATE`: the mixed-precision default is
        ``optimizer_bytes_per_param``; the others take fewer bytes in the same proportion)."""
        if params <= 0:
            return 0.0
        per = self.optimizer_bytes_per_param * ADAM_BYTES_BY_STATE.get(state, ADAM_BYTES_PER_PARAM) / ADAM_BYTES_PER_PARAM
        return params * per / (device_type.mem_bw_bytes_per_s * self.memory_efficiency) + self.kernel_overhead_s


#: Architectures whose cuBLAS/CUTLASS GEMMs use a stream-K schedule for the last wave (Osama
#: et al. PPoPP'23; CUTLASS 3's Hopper and Blackwell kernels): no wave quantisation there,
#: only the tiles' padding.
STREAM_K_ARCHS = frozenset({"hopper", "blackwell"})


def _quantisation(m: float, n: float, sms: int, waves: bool = True) -> float:
    """The share of the SMs' tile slots that hold useful output when an m x n GEMM output is
    cut into the best of :data:`GEMM_TILES` (a dimension under 128 gets a tile of the next
    power of two from 16 up: cuBLAS's skinny-GEMM kernels), over ``ceil(tiles / sms)`` waves
    (``waves`` False: stream-K keeps every SM busy; fewer tiles than SMs are split along K).

    >>> _quantisation(256, 256, 4)  # four 128 x 128 tiles fill four SMs exactly
    1.0
    >>> round(_quantisation(640, 640, 4), 3)  # 25 tiles of 128 x 128 on 4 SMs: 7 waves, 25 of 28 slots
    0.893
    """
    best = 0.0
    for tm, tn in GEMM_TILES:
        tm = min(tm, max(16, 1 << max(0, math.ceil(math.log2(max(m, 1))))))
        tn = min(tn, max(16, 1 << max(0, math.ceil(math.log2(max(n, 1))))))
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        slots = max(tiles, sms * math.ceil(tiles / sms)) if waves and tiles >= sms else tiles
        best = max(best, m * n / (slots * tm * tn))
    return best
