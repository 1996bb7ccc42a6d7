"""One 22B layer's forward and backward against Korthikanti et al. 2022's Table 4
(benchmarks/check_layer_times.py; issue 42). Regression bounds on today's figures, not
claims of correctness: the backward within 5% of every row since the recomputed forward's
all-reduces and sequence parallelism's second all-gather are modelled (it was 8-11% short with
recomputation or sequence parallelism before); the forward still 6-9% short (today's -6.2% and
-9.4%: the layer's GEMMs, its fused softmax and its 100 MB collectives at NCCL's medium-size
rates are not measured on the 2022 stack)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from check_layer_times import rows  # noqa: E402


@pytest.fixture(scope="module")
def table4():
    return rows()


def test_every_backward_within_5_percent(table4):
    assert len(table4) == 5
    assert {(r["recompute"], r["sequence_parallel"]): r["bwd_error_pct"] for r in table4
            if abs(r["bwd_error_pct"]) > 5.0} == {}


def test_every_forward_within_10_percent(table4):
    assert {(r["recompute"], r["sequence_parallel"]): r["fwd_error_pct"] for r in table4
            if abs(r["fwd_error_pct"]) > 10.0} == {}


def test_what_each_technique_adds_has_the_published_sign(table4):
    """Full recomputation adds about a forward to the backward (published 7.6 ms for a 7.7 ms
    forward); selective recomputation about a tenth (1.3 ms); sequence parallelism saves
    forward time (0.5 ms) and next to no backward time (0.1 ms)."""
    by = {(r["recompute"], r["sequence_parallel"]): r for r in table4}
    full = by[("full", False)]["bwd_ms"] - by[("none", False)]["bwd_ms"]
    assert full == pytest.approx(by[("none", False)]["fwd_ms"], rel=0.05)
    sel = by[("selective", False)]["bwd_ms"] - by[("none", False)]["bwd_ms"]
    assert 0.5 < sel < 1.5
    assert 0.3 < by[("none", False)]["fwd_ms"] - by[("none", True)]["fwd_ms"] < 0.8
    assert abs(by[("none", False)]["bwd_ms"] - by[("none", True)]["bwd_ms"]) < 0.3
