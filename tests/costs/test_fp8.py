"""fp8 GEMMs (Transformer Engine's recipe) in the cost and memory models: the linear layers'
GEMMs at the fp8 rate plus their cast kernels; fp8 inputs kept for the backward; cached fp8
weights; refused on devices without fp8 tensor cores."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from engine.cluster import preset
from engine.costs.model import FP8_CAST_BYTES_PER_ELEMENT
from engine.costs import CostModel
from engine.sim.memory import memory_report
from engine.models.transformer import GPTConfig, gpt
from engine.sim.full import simulate
from engine.strategy import strategy_from_dict, validate_strategy
from engine.taskgraph import build_task_graph
from engine.layout import Layout, build_layout


def model():
    return gpt(GPTConfig(layers=2, hidden=4096, heads=32, seq_len=2048, vocab=32000, batch=8, precision="bf16",
                         flash_attention=True, dropout=0.0))


def test_a_linear_gemm_at_the_fp8_rate_plus_its_casts():
    g, c = model(), preset("dgx-h100:1")
    h100 = c.device_types["H100-SXM5-80GB"]
    cost = CostModel(kernel_overhead_s=0.0, sustained_fractions=())  # the kernels alone
    fc = next(op for op in g.ops if op.kind == "linear")
    degrees = {"sample": 8}
    bf_f, bf_b = cost.partition_times_s(fc, degrees, "bf16", h100)
    f8_f, f8_b = cost.partition_times_s(fc, degrees, "bf16", h100, fp8=True)
    ins, outs, _ = fc.partition_shapes(degrees)
    bw = h100.mem_bw_bytes_per_s * cost.memory_efficiency
    f_flops, b_flops = fc.partition_flops(degrees)
    n, k = fc.partition_shapes(degrees)[2][0]
    m = math.prod(outs[0]) / n

    def fractions(precision):  # forward, and the backward's two GEMMs together (equal FLOPs)
        d, w = cost.gemm_fraction(m, k, n, h100, precision), cost.gemm_fraction(n, k, m, h100, precision)
        return cost.gemm_fraction(m, n, k, h100, precision), 2 / (1 / d + 1 / w)

    (bf_ff, bf_bf), (f8_ff, f8_bf) = fractions("bf16"), fractions("fp8")
    # fp8 reaches a smaller measured fraction of its (twice as high) peak than bf16 (MAMF)
    assert cost.large_gemm_fraction(h100, "fp8") < cost.large_gemm_fraction(h100, "bf16")
    # compute-bound GEMMs at their precision's peak and fraction, plus fp8's casts
    assert bf_f == pytest.approx(f_flops / (h100.peak("bf16") * bf_ff), rel=1e-9)
    assert bf_b == pytest.approx(b_flops / (h100.peak("bf16") * bf_bf), rel=1e-9)
    assert f8_f == pytest.approx(f_flops / (h100.peak("fp8") * f8_ff)
                                 + FP8_CAST_BYTES_PER_ELEMENT * math.prod(ins[0]) / bw, rel=1e-9)
    assert f8_b == pytest.approx(b_flops / (h100.peak("fp8") * f8_bf)
                                 + FP8_CAST_BYTES_PER_ELEMENT * math.prod(outs[0]) / bw, rel=1e-9)
    assert f8_f < bf_f and f8_b < bf_b
    # attention's core and the norms stay in bf16
    core = next(op for op in g.ops if op.kind == "attention")
    assert cost.partition_times_s(core, degrees, "bf16", h100, fp8=True) == \
        cost.partition_times_s(core, degrees, "bf16", h100)


def test_faster_and_lighter_activations_heavier_weights():
    g, c = model(), preset("dgx-h100:1")
    base = build_layout(g, c, Layout(tp=4, micro_batch=1))
    f8 = build_layout(g, c, Layout(tp=4, micro_batch=1, fp8=True))
    assert f8.fp8 and f8.found_by["options"]["fp8"] is True
    tb, t8 = simulate(build_task_graph(g, base, c)), simulate(build_task_graph(g, f8, c))
    assert 0.5 * tb.makespan_s < t8.makespan_s < tb.makespan_s
    mb, m8 = memory_report(g, base, c, tb), memory_report(g, f8, c, t8)
    assert m8.activations_peak_bytes.max() < mb.activations_peak_bytes.max()
    lin = sum(op.partition_param_elements(base.configs[op.name].degrees) for op in g.ops
              if op.kind == "linear" and op.param_count)
    # 1 + 1 bytes of cached fp8 weight and transpose per linear weight element on each GPU
    assert m8.weights_bytes[0] - mb.weights_bytes[0] == pytest.approx(2 * lin, rel=1e-9)


def test_round_trip_and_refused_without_fp8_tensor_cores():
    g, c = model(), preset("dgx-h100:1")
    s = build_layout(g, c, Layout(tp=4, micro_batch=1, fp8=True))
    d = s.to_dict()
    assert d["fp8"] is True and strategy_from_dict(d).fp8
    assert "fp8" not in build_layout(g, c, Layout(tp=4, micro_batch=1)).to_dict()
    a100 = preset("dgx-a100-80gb:1")
    plain = build_layout(g, a100, Layout(tp=4, micro_batch=1))
    problems = validate_strategy(replace(plain, fp8=True), g, a100)
    assert [p.path for p in problems] == ["fp8"] and "A100-SXM4-80GB" in problems[0].message


def test_cli_precision_fp8_and_cp(tmp_path, capsys):
    import json

    from engine.cli import main

    out = tmp_path / "s.json"
    assert main(["baseline", "--model", "gpt2", "--cluster", "dgx-h100:1", "--kind", "megatron", "--tp", "2",
                 "--cp", "2", "--precision", "fp8", "-o", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["fp8"] is True and d["found_by"]["options"]["cp"] == 2
    capsys.readouterr()
    assert main(["simulate", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--strategy", "megatron",
                 "--precision", "fp8"]) == 2
    assert "fp8 tensor cores" in capsys.readouterr().err
