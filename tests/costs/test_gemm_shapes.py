"""The compute model from the shape (issue 25): a GEMM's achievable fraction of peak from its
(M, N, K), per device and precision, fused attention by architecture, and the per-device
sustained share. Hand cases with exact values; invariants with hypothesis."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cluster import DEVICE_TYPES
from engine.costs.model import GEMM_FRACTION, GEMM_K_REF, MATMUL_EFFICIENCY, _quantisation
from engine.costs import CostModel
from engine.graph import GraphBuilder

A100 = DEVICE_TYPES["A100-SXM4-80GB"]
H100 = DEVICE_TYPES["H100-SXM5-80GB"]
V100 = DEVICE_TYPES["V100-SXM2-32GB"]
BARE = CostModel(gemm_k_half=0.0, sustained_fractions=())


def test_a_mamf_shape_reaches_the_measured_fraction():
    # 6912 x 16384 x 2048 (A100's best MAMF shape): 54 x 64 tiles of 128 x 256 = 3,456 = 32 waves of 108
    assert _quantisation(6912, 16384, 108) == 1.0
    assert BARE.gemm_fraction(6912, 16384, 2048, A100) == pytest.approx(0.859)
    assert BARE.gemm_fraction(6144, 17920, 2816, H100) == pytest.approx(0.801)
    assert BARE.gemm_fraction(6144, 17920, 2816, H100, "fp8") == pytest.approx(0.734)


def test_an_unmeasured_gpu_takes_the_default_fraction():
    assert BARE.large_gemm_fraction(V100, "fp16") == MATMUL_EFFICIENCY
    assert ("volta", "fp16") not in GEMM_FRACTION


def test_wave_quantisation_on_ampere_but_not_on_hopper():
    # 27,776 x 256 on A100's 108 SMs: 128 x 128 tiles are the best, 434 of them, 5 waves: 434 of 540
    # slots (128 x 256: 217 tiles in 3 waves, 217/324; 256 x 128: 218 tiles, 0.670)
    m, n = 128 * 217, 256
    assert _quantisation(m, n, 108) == pytest.approx(434 / 540)
    assert BARE.gemm_fraction(m, n, 4096, A100) == pytest.approx(0.859 * 434 / 540)
    # Hopper's stream-K schedule: no idle wave, only padding (none here)
    assert BARE.gemm_fraction(128 * 133, 128, 4096, H100) == pytest.approx(0.801)


def test_padding_of_a_skinny_dimension():
    # n = 96 pads to a 128-wide tile: 96/128 of the work is useful (one wave on Hopper)
    assert _quantisation(128 * 132, 96, 132, waves=False) == pytest.approx(96 / 128)


def test_the_k_loop():
    h = 128.0
    cost = CostModel(gemm_k_half=h, sustained_fractions=())
    big = cost.gemm_fraction(6912, 16384, GEMM_K_REF, A100)
    assert big == pytest.approx(0.859)  # the MAMF shapes' K: no loss
    assert cost.gemm_fraction(6912, 16384, 8 * GEMM_K_REF, A100) == pytest.approx(0.859)  # never above
    k = 256
    assert cost.gemm_fraction(6912, 16384, k, A100) == pytest.approx(
        0.859 * k * (GEMM_K_REF + h) / ((k + h) * GEMM_K_REF))


def test_attention_by_architecture_and_the_sustained_share():
    assert BARE.attention_fraction(H100) == 0.55
    assert BARE.attention_fraction(A100) == BARE.attention_efficiency == 0.6
    flops = 1e12
    base = BARE.op_time_s("attention", flops, 0.0, "bf16", H100)
    assert base == pytest.approx(flops / (989.4e12 * 0.55) + BARE.kernel_overhead_s)
    slow = CostModel(gemm_k_half=0.0, sustained_fractions=((H100.name, 0.5),))
    assert slow.op_time_s("attention", flops, 0.0, "bf16", H100) == pytest.approx(
        flops / (989.4e12 * 0.55 * 0.5) + BARE.kernel_overhead_s)
    # memory-bound kernels are not scaled by it
    assert slow.op_time_s("add", 0.0, 1e9, "bf16", H100) == BARE.op_time_s("add", 0.0, 1e9, "bf16", H100)


def test_a_linear_layers_backward_is_priced_by_its_two_gemms():
    b = GraphBuilder("one", precision="bf16")
    x = b.input("x", [64, 4096])
    b.add("linear", "fc", [x], out_features=96, bias=False)
    fc = b.build()["fc"]
    f, bwd = BARE.partition_times_s(fc, {}, "bf16", H100)
    m, n, k = 64, 96, 4096
    flops = 2 * m * n * k
    fwd_frac = BARE.gemm_fraction(m, n, k, H100)
    dgrad, wgrad = BARE.gemm_fraction(m, k, n, H100), BARE.gemm_fraction(n, k, m, H100)
    mem = (fc.fwd_bytes_read + fc.fwd_bytes_written) / (H100.mem_bw_bytes_per_s * BARE.memory_efficiency)
    assert f == pytest.approx(max(flops / (989.4e12 * fwd_frac), mem) + BARE.kernel_overhead_s)
    bmem = (fc.bwd_bytes_read + fc.bwd_bytes_written) / (H100.mem_bw_bytes_per_s * BARE.memory_efficiency)
    assert bwd == pytest.approx(max(flops / (989.4e12 * dgrad) + flops / (989.4e12 * wgrad), bmem)
                                + BARE.kernel_overhead_s)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 1 << 16), st.integers(1, 1 << 16), st.integers(1, 1 << 15),
       st.sampled_from(["A100-SXM4-80GB", "H100-SXM5-80GB", "B200-SXM-180GB", "V100-SXM2-32GB", "RTX-4090-24GB"]))
def test_a_fraction_is_within_the_large_gemm_one(m, n, k, name):
    dt = DEVICE_TYPES[name]
    cost = CostModel(sustained_fractions=())
    top = cost.large_gemm_fraction(dt, "bf16" if "bf16" in dt.peak_flops_per_s else "fp16")
    frac = cost.gemm_fraction(m, n, k, dt, "bf16" if "bf16" in dt.peak_flops_per_s else "fp16")
    assert 0.0 < frac <= top + 1e-12


def test_tf32_precision_fp32_tensors_on_tf32_tensor_cores():
    from engine.cluster import preset
    from engine.models.transformer import gpt2
    from engine.sim.report import simulate_strategy
    from engine.search.baselines import data_parallel
    from engine.errors import ValidationError

    c = preset("dgx-a100-80gb:1")
    runs = {p: simulate_strategy(gpt2(batch=16, precision=p), data_parallel(gpt2(batch=16, precision=p), c), c)
            for p in ("fp32", "tf32")}
    # same bytes (fp32 tensors, fp32 Adam without a master copy), GEMMs 8x the peak (156 vs 19.5 TFLOP/s)
    assert runs["tf32"].memory.peak_bytes.max() == runs["fp32"].memory.peak_bytes.max()
    assert runs["tf32"].iteration_time_s < runs["fp32"].iteration_time_s / 2
    b = GraphBuilder("one", precision="tf32")
    x = b.input("x", [8192, 4096])
    b.add("linear", "fc", [x], out_features=4096, bias=False)
    fc = b.build()["fc"]
    f, _ = BARE.partition_times_s(fc, {}, "tf32", A100)
    # 2,048 tiles of 128 x 128 on 108 SMs: 19 waves, 2,048 of 2,052 slots
    assert f == pytest.approx(2 * 8192 * 4096 * 4096 / (156e12 * 0.859 * 2048 / 2052) + BARE.kernel_overhead_s)
    g = gpt2(batch=16, precision="tf32")
    v100 = preset("v100-dgx2:1")
    with pytest.raises(ValidationError, match="no tf32 peak"):
        data_parallel(g, v100)
