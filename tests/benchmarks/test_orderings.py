"""Published orderings a planner acts on (issue 42), each a test: the simulator must rank two
layouts as the published runs did. Nothing here is fitted; the times are the simulator's own
(``benchmarks/orderings.py`` prints them side by side with the published figures).

* async vs vanilla tensor parallelism: torchtitan's pairs of rows that differ only in async TP;
* interleaved vs plain 1F1B: Narayanan et al. SC'21 §2.2.2 (interleaving shrinks the bubble);
* PTD-P vs ZeRO-3 on GPT-3 175B, 384-1,536 A100s, batch 1,536 (SC'21 §5.2): PTD-P faster at
  every size, and increasingly so with scale (ZeRO-3's throughput roughly halves per doubling
  there). The second half is not reproduced yet: a strict expected failure, so that the day it
  holds the test says so.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/
sys.path.insert(0, str(HERE.parent / "benchmarks"))

from orderings import async_pairs  # noqa: E402
from validate_published import Predictor  # noqa: E402

from engine.cluster import preset  # noqa: E402
from engine.layout import Layout, build_layout  # noqa: E402
from engine.layout.build import fsdp  # noqa: E402
from engine.models.transformer import GPTConfig, gpt  # noqa: E402
from engine.sim.report import simulate_strategy  # noqa: E402

CSV = HERE.parent / "validation" / "published_runs_public.csv"
SIZES = (384, 768, 1536)


def _gpt3():
    return gpt(GPTConfig(96, 12288, 96, 2048, 51200, 1536, precision="fp16", name="gpt3-175b"))


def test_async_tensor_parallelism_is_faster_in_every_published_pair():
    rows = list(csv.DictReader(CSV.open(newline="")))
    pairs = list(async_pairs(rows))
    assert len(pairs) == 6
    pred = Predictor(rows)
    for vanilla, fast in pairs:
        v, a = pred.run(vanilla), pred.run(fast)
        assert a.published > v.published  # (the published order)
        assert a.predicted > v.predicted, (vanilla["row_id"], fast["row_id"])


def test_interleaving_shrinks_the_pipeline_bubble():
    g, c = _gpt3(), preset("dgx-a100-80gb:128")
    t = [simulate_strategy(g, build_layout(g, c, Layout(tp=8, pp=16, micro_batch=1, vpp=v, recompute="full")), c,
                           steady=True).iteration_time_s for v in (1, 2)]
    assert t[1] < t[0]


@pytest.fixture(scope="module")
def zero3_vs_ptdp():
    """GPUs -> (PTD-P seconds, ZeRO-3 seconds): DeepSpeed's ZeRO-3 (per-module gathers, its
    prefetch bucket) against Megatron's tp 8 x pp 8, full recomputation, micro-batch 1."""
    g = _gpt3()
    out = {}
    for n in SIZES:
        c = preset(f"dgx-a100-80gb:{n // 8}")
        ptdp = simulate_strategy(g, build_layout(g, c, Layout(tp=8, pp=8, micro_batch=1, recompute="full")), c,
                                 steady=True)
        z3 = simulate_strategy(g, fsdp(g, c, Layout(zero_stage=3, gather_unit="op", recompute="full", micro_batch=1)),
                               c)
        out[n] = (ptdp.iteration_time_s, z3.iteration_time_s)
    return out


_ZERO3_TOO_FAST = pytest.mark.xfail(strict=True, reason=(
    "issue 42: since the recomputed forward redoes PTD-P's tensor-parallel all-reduces (Korthikanti et "
    "al.'s Table 4), PTD-P is 67.75 / 36.29 s against ZeRO-3's 67.06 / 35.96 s at 384 / 768 GPUs: "
    "DeepSpeed ZeRO-3's own costs at that scale (SC'21 §5.2 has PTD-P ahead at every size) are not "
    "modelled"))


@pytest.mark.parametrize("n", [pytest.param(384, marks=_ZERO3_TOO_FAST), pytest.param(768, marks=_ZERO3_TOO_FAST),
                               1536])
def test_ptdp_is_faster_than_zero3(zero3_vs_ptdp, n):
    p, z = zero3_vs_ptdp[n]
    assert p < z, zero3_vs_ptdp


@pytest.mark.xfail(strict=True, reason="SC'21 §5.2: ZeRO-3 falls behind PTD-P more with every doubling of GPUs; "
                                       "predicted 0.99x, 0.99x, 1.02x at 384, 768, 1,536 (issue 42, not modelled yet)")
def test_zero3_falls_behind_more_with_scale(zero3_vs_ptdp):
    ratios = [zero3_vs_ptdp[n][1] / zero3_vs_ptdp[n][0] for n in SIZES]
    assert ratios[0] < ratios[1] < ratios[2] and ratios[2] > 1.5, ratios
