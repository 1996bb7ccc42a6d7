"""Issue 24 part 2: one Layout record and one enumerator of valid layouts.

The record parses and refuses options as a user can act on (the field and what it takes), round
trips through its options, and builds the same strategy the keyword form of the Megatron
baseline builds; the enumerator's layouts tile the cluster, keep tensor parallelism inside a
node, and each builds a strategy the loader accepts; MCMC's layout moves, the pipeline
planner, the sweep and the smallest-cluster scan draw from it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cluster import DEVICE_TYPES, Cluster, NodeSpec, preset
from engine.formats import resolve_model
from engine.layout import (OPTION_NAMES, Layout, layout_problem, micro_batch_sizes, microbatch_count, tp_problem,
                           valid_layouts)
from engine.models.transformer import GPTConfig, gpt
from engine.layout.build import build_layout
from engine.strategy import SCHEDULES, validate_strategy


def tiny_gpt(layers: int = 4, batch: int = 16, heads: int = 4, seq_len: int = 64):
    return gpt(GPTConfig(layers=layers, hidden=128, heads=heads, seq_len=seq_len, vocab=512, batch=batch, name="tiny"))


def nodes_of(*gpus: int) -> Cluster:
    """A cluster with one node of each GPU count given."""
    specs = [NodeSpec(f"n{k}_", g, "P100-SXM2-16GB", "mesh", 20e9, nics=1, nic_bw_bytes_per_s=12.5e9,
                      attach_bw_bytes_per_s=16e9) for k, g in enumerate(gpus)]
    return Cluster("nodes-" + "-".join(map(str, gpus)), specs, DEVICE_TYPES, "test cluster")


# =========================================================================== the record


class TestOptions:
    def test_text_values_are_parsed(self):
        lay = Layout.from_options({"tp": "2", "pp": 4, "sequence_parallel": "true", "recompute": "full",
                                   "layers_per_stage": "1,2,1", "micro_batch": None})
        assert (lay.tp, lay.pp, lay.sequence_parallel, lay.recompute, lay.layers_per_stage, lay.micro_batch) == \
            (2, 4, True, "full", (1, 2, 1), None)

    def test_defaults(self):
        lay = Layout()
        assert (lay.tp, lay.pp, lay.cp, lay.dp, lay.ep, lay.vpp, lay.zero_stage, lay.gather_unit) == \
            (1, 1, 1, None, 1, 1, 0, "block")
        assert lay.to_options() == {}

    @pytest.mark.parametrize("options, message", [
        ({"tp": "²"}, "tp: '²' is not a whole number (tp takes a positive whole number: 1, 2, 4, ...)"),
        ({"zero_stage": "one"}, "zero_stage: 'one' is not a whole number (zero_stage takes 0, 1, 2 or 3)"),
        ({"tp": 0}, "tp must be a positive integer, got 0"),
        ({"recompute": "some"}, "recompute: 'some' is not one of none, selective, full"),
        ({"schedule": "zb"}, f"schedule: 'zb' is not one of {', '.join(SCHEDULES)}"),
        ({"sequence_parallel": "maybe"}, "sequence_parallel: 'maybe' is not on or off (sequence_parallel takes "
                                         "true/false or 1/0)"),
        ({"zero_stage": 4}, "zero_stage must be 0 (none), 1, 2 or 3, got 4"),
        ({"layers_per_stage": "7,x"}, "layers_per_stage: 'x' is not a whole number"),
    ])
    def test_errors_name_the_field_and_what_it_takes(self, options, message):
        with pytest.raises(ValueError) as e:
            Layout.from_options(options)
        assert str(e.value).startswith(message)
        assert "invalid literal" not in str(e.value)

    def test_an_unknown_option_lists_the_options(self):
        with pytest.raises(ValueError, match=r"unknown layout option 'tensor'; options: tp, pp, cp, dp, ep"):
            Layout.from_options({"tensor": 2})

    def test_expert_parallelism_needs_a_mixture_of_experts_model(self):
        g = gpt(GPTConfig(layers=2, hidden=64, heads=4, seq_len=16, vocab=100, batch=8))
        why = layout_problem(g, preset("dgx-h100:1"), Layout(ep=2))
        assert why.startswith("ep 2, etp 1: expert parallelism needs a mixture-of-experts model")

    def test_microbatches(self):
        assert Layout(dp=4, micro_batch=2, global_batch=32).microbatches == 4
        with pytest.raises(ValueError, match="needs global_batch"):
            _ = Layout(dp=4).microbatches


layouts = st.fixed_dictionaries(dict(
    tp=st.sampled_from([1, 2, 4, 8]), pp=st.integers(1, 16), cp=st.sampled_from([1, 2, 4]),
    dp=st.none() | st.integers(1, 512), vpp=st.integers(1, 4), micro_batch=st.none() | st.integers(1, 64),
    global_batch=st.none() | st.integers(1, 4096), schedule=st.none() | st.sampled_from(SCHEDULES),
    recompute=st.sampled_from(["none", "selective", "full"]), sequence_parallel=st.booleans(),
    tp_comm_overlap=st.booleans(), zero_stage=st.integers(0, 3), shard_group=st.integers(0, 16),
    gather_unit=st.sampled_from(["block", "op"]), fp8=st.booleans(),
    layers_per_stage=st.none() | st.lists(st.integers(1, 20), min_size=1, max_size=8).map(tuple),
    stage_mesh=st.none() | st.permutations(range(4)).map(tuple))).filter(
        lambda kw: kw["pp"] > 1 or kw["vpp"] == 1).map(lambda kw: Layout(**kw))  # (model chunks need stages)


@settings(max_examples=200, deadline=None)
@given(layouts)
def test_options_round_trip(lay):
    assert Layout.from_options(lay.to_options()) == lay
    assert Layout.from_options(json.loads(json.dumps(lay.to_options()))) == lay  # JSON-ready
    assert set(lay.to_options()) <= set(OPTION_NAMES)


junk = st.one_of(st.none(), st.booleans(), st.integers(-5, 70), st.floats(allow_nan=True), st.text(max_size=8),
                 st.lists(st.integers(-2, 9), max_size=4), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(OPTION_NAMES + ("mb", "tensor")), junk, max_size=5))
def test_any_options_give_a_layout_or_a_message(options):
    """Crafted options never reach a user as a raw Python error."""
    try:
        lay = Layout.from_options(options)
    except ValueError as e:
        assert "invalid literal" not in str(e) and "could not convert" not in str(e)
    else:
        assert Layout.from_options(lay.to_options()) == lay


# =========================================================================== the rules


def test_gpus_per_node_is_one_definition():
    assert preset("dgx-a100-80gb:2").gpus_per_node == 8 and preset("p100-4x4").gpus_per_node == 4
    assert preset("v100-dgx2:2").gpus_per_node == 16 and preset("hetero-demo").gpus_per_node == 4
    # nodes of 6 and 4 GPUs: groups of 2 consecutive devices never span two nodes, 4 would
    assert nodes_of(6, 4).gpus_per_node == 2 and nodes_of(8, 4).gpus_per_node == 4


def test_the_micro_batch_rule():
    assert microbatch_count(32, 4, 2) == 4
    with pytest.raises(ValueError, match=r"global batch 32 is not a multiple of micro_batch \(3\) x dp \(4\)"):
        microbatch_count(32, 4, 3)
    assert micro_batch_sizes(32, 2) == [2, 4, 8, 16]  # at most 8 microbatches on one stage
    assert micro_batch_sizes(32, 2, pp=2) == [1, 2, 4, 8, 16]
    assert micro_batch_sizes(32, 2, max_per_stage=None) == [1, 2, 4, 8, 16]
    assert micro_batch_sizes(32, 3) == []  # dp does not divide the batch


def test_tp_stays_inside_a_node_and_divides_the_heads():
    g = tiny_gpt(heads=4)
    assert tp_problem(g, preset("dgx-a100-80gb:3"), 4) is None
    assert "does not divide the 8 GPUs per node" in tp_problem(g, preset("dgx-a100-80gb:3"), 3)
    assert "does not divide the 4 heads" in tp_problem(g, None, 8)


def test_layout_problem_names_the_first_reason():
    g, c = resolve_model("gpt2", batch=8), preset("dgx-a100-80gb:1")
    assert layout_problem(g, c, Layout(tp=4, pp=4)) == \
        "tp (4) x pp (4) does not divide the 8 devices of dgx-a100-80gb:1"
    assert layout_problem(g, c, Layout(dp=3)) == "global batch 8 is not divisible by dp (3)"
    assert layout_problem(g, c, Layout(micro_batch=2)) == "global batch 8 is not a multiple of micro_batch (2) x dp (8)"
    assert layout_problem(g, c, Layout(pp=4, vpp=4, dp=2)) == "12 layers cannot fill 16 pipeline chunks (pp x vpp)"
    assert layout_problem(g, c, Layout(global_batch=16)).startswith("global batch 16: the model was built with")
    assert layout_problem(g, c, Layout(tp=2, pp=2)) is None


# =========================================================================== the enumerator


CASES = [(tiny_gpt(), "p100-4x4"), (tiny_gpt(layers=3, batch=12), "hetero-demo"),
         (resolve_model("gpt2", batch=8), "dgx-a100-80gb:1")]


@pytest.mark.parametrize("graph, cluster_name", CASES, ids=[c for _, c in CASES])
def test_every_layout_tiles_the_cluster_and_builds_a_valid_strategy(graph, cluster_name):
    c = preset(cluster_name)
    lays = list(valid_layouts(graph, c))
    assert lays
    per_node = c.gpus_per_node
    for lay in lays:
        assert lay.tp * lay.pp * lay.cp * lay.dp == c.num_devices
        assert per_node % lay.tp == 0 and graph.batch_size % (lay.dp * lay.micro_batch) == 0
        assert layout_problem(graph, c, lay) is None
        s = build_layout(graph, c, lay)
        assert validate_strategy(s, graph, c) == [], lay
        assert s.devices_used() == set(range(c.num_devices)), lay  # every device used, none twice per rank
        # tensor-parallel groups (tp consecutive ranks, Megatron-Core's order) sit inside nodes
        node = [d.node for d in c.devices]
        assert all(len({node[d] for d in range(k, k + lay.tp)}) == 1 for k in range(0, c.num_devices, lay.tp))


def test_the_enumeration_on_a_small_case():
    """tiny GPT (4 layers, 4 heads, 64 tokens: no context parallelism), batch 16, 2 nodes x 4."""
    g, c = tiny_gpt(), preset("p100-4x4")  # 16 GPUs, 4 a node
    got = [(x.tp, x.pp, x.cp, x.dp, x.micro_batch) for x in valid_layouts(g, c)]
    # tp in 1, 2, 4 (inside a node); pp up to 4 layers; dp divides 16; micro-batches dividing
    # the per-replica batch, at most 8 x pp microbatches
    assert got == [(1, 1, 1, 16, 1), (1, 2, 1, 8, 1), (1, 2, 1, 8, 2), (1, 4, 1, 4, 1), (1, 4, 1, 4, 2),
                   (1, 4, 1, 4, 4), (2, 1, 1, 8, 1), (2, 1, 1, 8, 2), (2, 2, 1, 4, 1), (2, 2, 1, 4, 2),
                   (2, 2, 1, 4, 4), (2, 4, 1, 2, 1), (2, 4, 1, 2, 2), (2, 4, 1, 2, 4), (2, 4, 1, 2, 8),
                   (4, 1, 1, 4, 1), (4, 1, 1, 4, 2), (4, 1, 1, 4, 4), (4, 2, 1, 2, 1), (4, 2, 1, 2, 2),
                   (4, 2, 1, 2, 4), (4, 2, 1, 2, 8), (4, 4, 1, 1, 1), (4, 4, 1, 1, 2), (4, 4, 1, 1, 4),
                   (4, 4, 1, 1, 8), (4, 4, 1, 1, 16)]


def test_settings_are_copied_and_sequence_parallelism_needs_tp():
    lays = list(valid_layouts(tiny_gpt(), preset("p100-4x4"), tps=[1, 2], recompute="full", sequence_parallel=True))
    assert {x.recompute for x in lays} == {"full"}
    assert all(x.sequence_parallel == (x.tp > 1) for x in lays)


def test_megatron_is_the_layout_it_names():
    g, c = resolve_model("gpt2", batch=8), preset("dgx-a100-80gb:1")
    a = build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1, recompute="selective", zero_stage=1))
    b = build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1, recompute="selective", zero_stage=1))
    assert a.configs == b.configs and a.pipeline == b.pipeline and a.found_by == b.found_by


# =========================================================================== its users


def test_mcmc_layout_moves_are_the_enumerators_layouts():
    """Regression (issue 24): moves took tp up to the smallest node's GPU count (tp 3 and 6 on
    24 GPUs of 8 a node, whose groups span nodes) and any cp up to the cap, whatever the
    sequence; now the enumerator's layouts, nearest first."""
    from engine.search.moves import Space

    g, c = resolve_model("gpt2", batch=24), preset("dgx-a100-80gb:3")
    s = build_layout(g, c, Layout(micro_batch=1))
    moved = list(Space(g, c).neighbours(s, "layout"))
    tp = [m.configs["layers.0.mlp.fc1"].degree("feature") for m in moved]
    assert moved and set(tp) <= {1, 2, 4}  # (12 heads: not 8)
    assert {x.tp for x in valid_layouts(g, c)} == {1, 2, 4}
    for m in moved[:4]:
        assert validate_strategy(m, g, c) == []


def test_pipeline_plans_come_from_the_enumerator():
    from engine.search.pipeline import plan_pipeline

    g, c = tiny_gpt(batch=32), preset("p100-4x4")
    valid = {(x.tp, x.pp, x.dp, x.micro_batch) for x in valid_layouts(g, c, max_microbatches_per_stage=None)}
    plans = plan_pipeline(g, c)
    assert plans and all((p.tp, p.pp, p.dp, p.micro_batch) in valid for p in plans)
    assert {p.tp for p in plans} <= {1, 2, 4}  # inside a node of 4


def test_sweep_layout_points_and_the_smallest_cluster_scan():
    from engine.studies.sweep import layout_points, smallest_fit

    g = resolve_model("gpt2", batch=8)
    pts = layout_points("gpt2", ["dgx-a100-80gb:1"], batch=8, tps=[2])
    assert pts and all(p["tp"] == 2 and p["cluster"] == "dgx-a100-80gb:1" for p in pts)
    assert len(pts) == len(list(valid_layouts(g, preset("dgx-a100-80gb:1"), tps=[2])))
    rows = smallest_fit(g, "megatron", {"tp": 4, "pp": 4, "micro_batch": 1}, [preset("dgx-a100-80gb:1")])
    assert rows[0]["why"] == "tp (4) x pp (4) does not divide the 8 devices of dgx-a100-80gb:1"


def test_export_infers_the_one_layout_type():
    from engine import export
    from engine.export import infer_layout

    g, c = resolve_model("gpt2", batch=8), preset("dgx-a100-80gb:1")
    lay = infer_layout(g, build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1)), c)
    assert isinstance(lay, Layout) and getattr(export, "Layout", Layout) is Layout  # (no second layout type)
    assert (lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.global_batch) == (2, 2, 2, 1, 8)


def test_cli_flags_are_layout_fields():
    import argparse

    from engine.cli.common import add_strategy_options, strategy_options

    p = argparse.ArgumentParser()
    add_strategy_options(p)
    opts = strategy_options(p.parse_args(["--tp", "2", "--layers-per-stage", "1,2,1", "--precision", "fp8"]))
    assert set(opts) <= set(OPTION_NAMES)
    lay = Layout.from_options(opts)
    assert (lay.tp, lay.layers_per_stage, lay.fp8) == (2, (1, 2, 1), True)


def test_cli_sweep_grid_auto_runs_every_valid_layout(tmp_path, capsys):
    from engine.cli import main

    out = tmp_path / "r.json"
    assert main(["sweep", "--model", "gpt2", "--batch", "2", "--grid", "auto", "--clusters", "dgx-a100-80gb:1",
                 "--backend", "serial", "-o", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    want = list(valid_layouts(resolve_model("gpt2", batch=2), preset("dgx-a100-80gb:1")))
    assert [(r["tp"], r["pp"], r["cp"], r["dp"], r["mb"]) for r in rows] == \
        [(x.tp, x.pp, x.cp, x.dp, x.micro_batch) for x in want]
    assert all(r["feasible"] or r["why"].startswith("does not fit in memory") for r in rows)  # every one builds


def test_model_chunks_need_pipeline_stages():
    """vpp > 1 with pp 1 is refused (it was taken as one stage under the interleaved schedule,
    and exported to Megatron-LM, which refuses it)."""
    with pytest.raises(ValueError, match=r"vpp 2: model chunks per stage need pipeline parallelism"):
        Layout(pp=1, vpp=2)
    assert Layout(pp=2, vpp=2).vpp == 2
