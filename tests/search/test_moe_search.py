"""Expert parallelism in the searches (issue 26, item 4): the enumerator's (ep, etp), MCMC's
moves, auto's mixture-of-experts seeds, the pipeline planner and the sweep's grid keys.

A small MoE GPT (4 layers, 8 experts of top-2) on two DGX H100 nodes (16 GPUs) throughout;
DeepSeek-V3 is a benchmark (benchmarks/moe_auto.py), not a test."""

from __future__ import annotations

import math

import pytest

from engine.cluster import preset
from engine.formats import resolve_model
from engine.layout import Layout, expert_shapes, layout_problem, valid_layouts
from engine.models.moe import MoEConfig, moe_gpt
from engine.layout.experts import megatron_eps
from engine.search.api import Budget, MCMCOptions, price
from engine.layout.build import build_layout
from engine.strategy import validate_strategy

SMALL = MoEConfig(layers=4, hidden=256, heads=8, seq_len=512, vocab=1000, batch=16, experts=8, top_k=2,
                  expert_ffn=512)


@pytest.fixture(scope="module")
def moe():
    return moe_gpt(SMALL)


@pytest.fixture(scope="module")
def cluster():
    return preset("dgx-h100:2")  # 16 GPUs, 8 a node


def experts_degrees(strategy, graph):
    """The (expert x expert_seq, ffn) degrees of every experts op of ``strategy``."""
    return {(strategy[op.name].degree("expert") * strategy[op.name].degree("expert_seq"),
             strategy[op.name].degree("ffn")) for op in graph.ops if op.kind == "experts"}


# =========================================================================== expert_shapes


def test_expert_shapes_by_hand():
    """8 experts on tp 2 x dp 2 (no cp): ep 1, 2, 4, 8 must divide 8; ep folds onto the tp x cp
    / etp sequence shards first, then onto dp: etp 1 has 2 shards (ep 4 = 2 shards x 2
    samples; ep 8 would need dp 4), etp 2 has 1 shard (ep 2 = 2 samples; ep 4 would need dp 4)."""
    g = moe_gpt(MoEConfig(2, 64, 4, 64, 100, 8, 8, 2, 64))
    assert expert_shapes(g, 2, 1, 2) == [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)]
    assert expert_shapes(g, 1, 1, 16) == [(1, 1), (2, 1), (4, 1), (8, 1)]
    assert expert_shapes(g, 1, 1, 1) == [(1, 1)]  # one rank: nothing to fold onto


def test_expert_shapes_of_a_dense_model_is_one():
    assert expert_shapes(resolve_model("gpt2", batch=8), 4, 2, 8) == [(1, 1)]


def test_etp_must_divide_the_experts_ffn_width():
    g = moe_gpt(MoEConfig(2, 64, 4, 64, 100, 8, 4, 2, 66))  # FFN width 66: etp 4 does not divide it
    assert {etp for _, etp in expert_shapes(g, 4, 1, 2)} == {1}
    assert {etp for _, etp in expert_shapes(g, 2, 1, 2)} == {1, 2}


def test_megatron_eps_in_a_node_and_across_nodes():
    g = moe_gpt(MoEConfig(2, 64, 4, 64, 100, 64, 64, 2, 64))  # 64 experts
    assert megatron_eps(g, 8, 1, 1, 64) == [8, 64]  # one node of 8; 8 nodes
    assert megatron_eps(g, 8, 1, 1, 4) == [4]  # a stage of 4 ranks: both are 4
    assert megatron_eps(resolve_model("gpt2", batch=8), 8, 1, 1, 8) == [1]


# =========================================================================== valid_layouts


def test_valid_layouts_of_a_moe_model_include_expert_parallel_ones(moe, cluster):
    lays = list(valid_layouts(moe, cluster))
    shapes = {(x.ep, x.etp) for x in lays}
    assert {(2, 1), (4, 1), (8, 1), (2, 2), (8, 2)} <= shapes
    for lay in lays:
        assert lay.tp * lay.pp * lay.cp * lay.dp == cluster.num_devices
        assert (lay.ep, lay.etp) in expert_shapes(moe, lay.tp, lay.cp, lay.dp)
        # Megatron-LM: MoE with tensor parallelism needs sequence parallelism, asked for or not
        assert lay.sequence_parallel == (lay.tp > 1)
        assert layout_problem(moe, cluster, lay) is None, lay


def test_every_moe_layout_builds_and_simulates(moe, cluster):
    lays = list(valid_layouts(moe, cluster, tps=[1, 2]))
    assert len(lays) > 50
    for lay in lays:
        s = build_layout(moe, cluster, lay)
        assert validate_strategy(s, moe, cluster) == [], lay
        ep = {d for d, _ in experts_degrees(s, moe)}
        assert ep == {lay.ep}, lay  # the experts ops carry the layout's ep
        p = price(moe, s, cluster)
        assert math.isfinite(p.time_s) and p.time_s > 0, lay


def test_ep_and_etp_follow_the_tp_order_before_the_micro_batch(moe, cluster):
    got = [(x.tp, x.pp, x.cp, x.ep, x.etp, x.micro_batch) for x in valid_layouts(moe, cluster, tps=[2], pps=[4])]
    assert got == sorted(got)


@pytest.mark.parametrize("model, cluster_name", [("gpt2", "dgx-a100-80gb:1"), ("gpt2", "p100-4x4")])
def test_dense_enumeration_is_unchanged(model, cluster_name):
    """A dense model: every layout ep 1, etp 1, sequence parallelism only where asked, and
    the same (tp, pp, cp, dp, mb) as tp x pp x cp x micro-batch products allow (no (ep, etp)
    copies)."""
    g, c = resolve_model(model, batch=8), preset(cluster_name)
    lays = list(valid_layouts(g, c))
    assert lays and all(x.ep == 1 and x.etp == 1 and not x.sequence_parallel for x in lays)
    keys = [(x.tp, x.pp, x.cp, x.dp, x.micro_batch) for x in lays]
    assert len(keys) == len(set(keys)) and keys == sorted(keys)


# =========================================================================== MCMC's moves


def test_layout_moves_change_ep(moe, cluster):
    from engine.search.moves import Space

    s = build_layout(moe, cluster, Layout(micro_batch=1))
    moved = list(Space(moe, cluster).neighbours(s, "layout"))
    assert {ep for m in moved for ep, _ in experts_degrees(m, moe)} >= {1, 2, 4, 8}
    for m in moved[:8]:
        assert validate_strategy(m, moe, cluster) == []


def test_block_moves_relay_the_experts_with_every_shape(moe, cluster):
    from engine.search.moves import Space

    space = Space(moe, cluster)
    block = next(b for b, names in space.blocks.items() if any(moe[n].kind == "experts" for n in names))
    e = next(n for n in space.blocks[block] if moe[n].kind == "experts")

    def shapes(s):
        # (moves are checked by the loader's check before pricing: keep those it takes)
        moved = [m for m in space._block_moves(s, block) if validate_strategy(m, moe, cluster) == []]
        return {(m[e].degree("expert") * m[e].degree("expert_seq"), m[e].degree("ffn")) for m in moved}

    # with sequence parallelism: every mesh, every (ep, etp) that folds onto it
    assert {(1, 1), (2, 1), (8, 1), (2, 2), (8, 2)} <= shapes(build_layout(moe, cluster, Layout(tp=2, micro_batch=1,
                                                                                                sequence_parallel=True)))
    # without it no tensor parallelism in a block with experts (Megatron-LM's rule), so no etp > 1
    plain = shapes(build_layout(moe, cluster, Layout(micro_batch=1)))
    assert {(2, 1), (8, 1)} <= plain and all(etp == 1 for _, etp in plain)


# =========================================================================== auto and MCMC


def test_moe_seed_layouts(moe, cluster):
    from engine.search.seed_layouts import moe_seed_layouts

    seeds = moe_seed_layouts(moe, cluster, fp8=True)
    assert seeds
    for entry in seeds:
        for lay in entry:
            assert lay.ep == 8 and lay.etp == 1 and lay.zero_stage == 1 and lay.fp8 and lay.micro_batch == 1
            assert lay.sequence_parallel == (lay.tp > 1) and layout_problem(moe, cluster, lay) is None
        if len(entry) == 2:
            assert entry[1].pp > entry[0].pp  # the fallback is a deeper pipeline
    assert moe_seed_layouts(resolve_model("gpt2", batch=8), preset("dgx-a100-80gb:1")) == []


def _best_seed(moe, cluster):
    from engine.search.seed_layouts import moe_seed_layouts

    prices = [price(moe, build_layout(moe, cluster, lay), cluster) for entry in moe_seed_layouts(moe, cluster, True)
              for lay in entry]
    best = min(p.cost_s for p in prices)
    assert math.isfinite(best)
    return best


def test_auto_on_a_moe_model_is_no_slower_than_its_best_megatron_seed(moe, cluster):
    from engine.search.auto import auto

    r = auto(moe, cluster, Budget(iterations=20), seed=0)
    assert r.feasible
    seeds = {k: v for k, v in r.best.found_by["contributions"].items() if k.startswith("megatron ")}
    assert seeds and any("ep 8" in k for k in seeds)
    assert r.best_cost_s <= _best_seed(moe, cluster) * (1 + 1e-9)
    assert r.best_cost_s <= min(v for v in seeds.values() if v is not None) * (1 + 1e-9)


def test_auto_keeps_bf16_when_asked(moe, cluster):
    from engine.search.api import AutoOptions
    from engine.search.auto import auto

    r = auto(moe, cluster, Budget(iterations=2), options=AutoOptions(fp8=False, refine=False))
    assert not any(k.endswith(", fp8") for k in r.best.found_by["contributions"])


def test_mcmc_from_a_moe_seed_is_no_slower_than_it(moe, cluster):
    from engine.search.seed_layouts import moe_seed_layouts
    from engine.search.mcmc import mcmc

    start = build_layout(moe, cluster, moe_seed_layouts(moe, cluster, True)[0][0])
    c0 = price(moe, start, cluster).cost_s
    r = mcmc(moe, cluster, Budget(iterations=40), seed=1, initial=start, options=MCMCOptions(chains=3, polish=False))
    assert r.feasible and r.best_cost_s <= c0 * (1 + 1e-9)
    assert validate_strategy(r.best, moe, cluster) == []


# =========================================================================== pipeline planner


def test_pipeline_plans_expert_parallel_layouts(moe, cluster):
    from engine.search.pipeline import pipeline, plan_pipeline

    plans = plan_pipeline(moe, cluster)
    assert any(p.ep > 1 for p in plans)
    for p in plans[:10]:
        lay = p.layout
        assert lay.ep == p.ep and lay.sequence_parallel == (p.tp > 1)
        assert layout_problem(moe, cluster, lay) is None
        assert p.ep in megatron_eps(moe, cluster.gpus_per_node, p.tp, 1, p.dp)
    r = pipeline(moe, cluster)
    assert r.feasible and validate_strategy(r.best, moe, cluster) == []


# =========================================================================== sweep


def test_sweep_takes_ep_and_etp_grid_keys(moe, cluster, tmp_path):
    from engine.formats import save_json
    from engine.studies.sweep import layout_points, parse_grid, points, run_sweep

    path = str(tmp_path / "moe.json")
    save_json(moe.to_dict(), path)
    grid = parse_grid(["ep=1,8,3", "etp=1", "pp=2"])
    assert grid == {"ep": [1, 8, 3], "etp": [1], "pp": [2]}
    rows = run_sweep(path, points(grid, ["dgx-h100:2"]), backend="serial")
    by_ep = {r["ep"]: r for r in rows}
    assert by_ep[1]["feasible"] and by_ep[8]["feasible"] and by_ep[8]["etp"] == 1
    assert by_ep[1]["iteration_time_s"] != by_ep[8]["iteration_time_s"]
    assert "ep 3 does not divide the 8 experts" in by_ep[3]["why"]
    pts = layout_points(path, ["dgx-h100:2"], tps=[2], pps=[1])
    assert {p.get("ep", 1) for p in pts} >= {1, 2, 8} and all(p["sp"] for p in pts)
    assert Layout.from_options({"ep": 8, "sequence_parallel": True}).ep == 8
