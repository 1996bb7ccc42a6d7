"""Issue 44: searches a user can launch from -- the layout search under constraints (exportable
to a framework, fixed or bounded degrees, the model's precision, a memory headroom), and auto
delegating to it when a constraint is given."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from engine.cluster import preset
from engine.export.infer import export, infer_layout
from engine.formats import resolve_model
from engine.search import ALGORITHMS, AutoOptions, Budget, LayoutOptions
from engine.search.api import price
from engine.search.layouts import LADDER, candidates, headroom_cluster
from engine.layout.build import build_layout
from engine.sim.report import simulate_strategy


@pytest.fixture(scope="module")
def case():
    return resolve_model("gpt2", batch=16), preset("dgx-a100-80gb:1")


def test_the_answer_is_the_best_of_every_candidate_and_memory_setting(case):
    """By brute force: every allowed layout with every step of the ladder priced; the search's
    answer is the fastest that fits (the ladder stops at the first fitting step, which is the
    fastest of its steps)."""
    g, c = case
    r = ALGORITHMS["layouts"].run(g, c, Budget(iterations=10_000))
    costs = []
    for lay in candidates(g, c, LayoutOptions()):
        for zero, recompute in LADDER:
            s = build_layout(g, c, replace(lay, zero_stage=zero if lay.dp > 1 else 0, recompute=recompute))
            costs.append(price(g, s, c).cost_s)
    assert r.best_cost_s == min(costs) and math.isfinite(r.best_cost_s)
    assert r.iterations == len(candidates(g, c, LayoutOptions()))


def test_exportable_fixed_and_bounded_degrees(case):
    g, c = case
    r = ALGORITHMS["layouts"].run(g, c, Budget(iterations=10_000), options=LayoutOptions(exportable="megatron", tp=2))
    lay = infer_layout(g, r.best, c)
    assert lay.tp == 2 and "--tensor-model-parallel-size 2" in export("megatron", g, r.best, c)
    r = ALGORITHMS["layouts"].run(g, c, Budget(iterations=10_000), options=LayoutOptions(max_pp=1, max_tp=1))
    lay = infer_layout(g, r.best, c)
    assert (lay.tp, lay.pp) == (1, 1)
    with pytest.raises(ValueError, match="no layout of 'gpt2' on 'dgx-a100-80gb:1' meets the constraints"):
        ALGORITHMS["layouts"].run(g, c, Budget(iterations=10), options=LayoutOptions(tp=3))
    with pytest.raises(ValueError, match="exportable must be one of megatron, deepspeed, torchtitan"):
        ALGORITHMS["layouts"].run(g, c, Budget(iterations=10), options=LayoutOptions(exportable="nemo"))


def test_headroom_is_checked_on_the_memory_left(case):
    g, c = case
    cut = headroom_cluster(c, 0.25)
    assert cut.device_type(0).memory_bytes == int(c.device_type(0).memory_bytes * 0.75)
    assert cut.num_devices == c.num_devices and len(cut.links) == len(c.links)
    r = ALGORITHMS["layouts"].run(g, c, Budget(iterations=10_000), options=LayoutOptions(headroom=0.25))
    mem = simulate_strategy(g, r.best, c).memory
    assert np.all(mem.required_bytes <= 0.75 * mem.capacity_bytes)
    with pytest.raises(ValueError, match="headroom must be a fraction"):
        ALGORITHMS["layouts"].run(g, c, Budget(iterations=10), options=LayoutOptions(headroom=1.0))


def test_auto_runs_the_layout_search_when_constrained_and_keeps_the_precision():
    g, c = resolve_model("gpt2", batch=16, precision="bf16"), preset("dgx-h100:1")
    r = ALGORITHMS["auto"].run(g, c, Budget(iterations=10_000), options=AutoOptions(exportable="torchtitan"))
    assert r.algorithm == "auto" and r.notes[0].startswith("constraints given: the layout search ran")
    assert r.best.found_by["algorithm"] == "layouts" and not r.best.fp8
    assert export("torchtitan", g, r.best, c)


def test_a_setting_the_exporter_refuses_moves_on_to_the_next(case):
    """DeepSpeed refuses the ZeRO-0 rung (its gradient reduce does not overlap the backward
    without ZeRO); the layout is then tried at ZeRO-1, which it takes, rather than dropped: on one
    DGX the plain data-parallel layout is exportable that way and is the answer."""
    g, c = case
    r = ALGORITHMS["layouts"].run(g, c, Budget(iterations=10_000), options=LayoutOptions(exportable="deepspeed"))
    lay = infer_layout(g, r.best, c)
    assert r.best.found_by["memory"] == "ZeRO-1, recompute none" and (lay.tp, lay.pp, lay.cp) == (1, 1, 1)
    assert export("deepspeed", g, r.best, c)
    assert any("refused by the deepspeed export" in n and "without ZeRO" in n for n in r.notes)
