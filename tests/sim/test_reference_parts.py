"""What a sweep point's prediction works out once and keeps (issue 43, twenty-first round): the
composed prediction's reference graph (engine.sim.reference), an op's partition shapes shared by
every op of the same shapes (engine.graph.core), a graph's dim sizes and expert counts, the
tensor-parallel plan (engine.layout.placement). Each kept result must equal what a fresh
computation gives, and a caller changing what it got must not change what the next one gets.
"""

from __future__ import annotations

import pytest

from engine.cluster import preset
from engine.graph import core
from engine.layout import Layout, resolved
from engine.layout.placement import _tp_plan, tp_plan
from engine.layout.rules import layout_problem
from engine.models.transformer import GPTConfig, gpt
from engine.sim import hier
from engine.sim.reference import REFERENCE_GRAPHS_KEPT, reference_graph


def _gpt(layers: int = 6, heads: int = 8):
    return gpt(GPTConfig(layers, 256, heads, 128, 1000, 16, precision="bf16"), source="test")


def test_the_reference_graph_is_made_once_per_graph_and_layer_count():
    g = _gpt()
    a, b = reference_graph(g, 3), reference_graph(g, 3)
    assert a is b and len(a.ops) < len(g.ops)
    assert reference_graph(g, 2) is not a and len(reference_graph(g, 2).ops) < len(a.ops)
    assert reference_graph(g, 6) is g and reference_graph(g, 9) is g  # (all its layers: the graph itself)
    other = _gpt()  # (an equal model built again: its own entry, by identity)
    assert reference_graph(other, 3) is not a
    assert [op.name for op in reference_graph(other, 3).ops] == [op.name for op in a.ops]


def test_the_reference_graphs_kept_are_bounded():
    g = _gpt(layers=REFERENCE_GRAPHS_KEPT + 4)
    made = [reference_graph(g, k) for k in range(1, REFERENCE_GRAPHS_KEPT + 3)]
    assert reference_graph(g, REFERENCE_GRAPHS_KEPT + 2) is made[-1]
    assert reference_graph(g, 1) is not made[0]  # (the oldest let go, made again: an equal graph)
    assert [op.name for op in reference_graph(g, 1).ops] == [op.name for op in made[0].ops]


def test_the_reference_strategy_is_the_last_one_made_for_an_equal_layout():
    g, c = _gpt(layers=8), preset("dgx-a100-80gb:4")
    lay = resolved(Layout.from_options({"tp": 2, "pp": 8, "micro_batch": 1}), g, c)
    plan = hier.reference_plan(g, c, lay)
    first = hier._reference_strategy(g, c, lay, plan)
    again = hier._reference_strategy(g, c, resolved(Layout.from_options({"tp": 2, "pp": 8, "micro_batch": 1}), g, c),
                                     hier.reference_plan(g, c, lay))
    assert again is first
    other = resolved(Layout.from_options({"tp": 2, "pp": 8, "micro_batch": 2}), g, c)
    assert hier._reference_strategy(g, c, other, hier.reference_plan(g, c, other)) is not first
    assert hier._reference_strategy(g, preset("dgx-a100-80gb:4"), lay, plan) is not first  # (another cluster object)


def test_ops_of_equal_shapes_share_their_partitions_and_get_what_a_fresh_computation_gives():
    g = _gpt()
    q0, q1 = g["layers.0.attn.q"], g["layers.1.attn.q"]
    assert q0._shapes_key == q1._shapes_key
    for degrees in ({}, {"feature": 2}, {"sample": 4, "feature": 8}, {"length": 2}):
        key = tuple(int(degrees.get(d.name, 1)) for d in q1.dims)
        assert q1._partition(degrees) == q0._partition(degrees) == q1._partition_shapes(key)
    ins, outs, params = q1.partition_shapes({"feature": 2})
    ins[0] = (1,)  # (a caller changing its lists changes nothing kept)
    assert q1.partition_shapes({"feature": 2})[0][0] != (1,)
    with pytest.raises(ValueError, match="layers.1.attn.q"):  # (a refusal names the op asked, never cached)
        q1.partition_shapes({"feature": 3})
    with pytest.raises(ValueError, match="layers.0.attn.q"):
        q0.partition_shapes({"feature": 3})


def test_the_shared_partitions_are_emptied_past_their_bound(monkeypatch):
    monkeypatch.setattr(core, "PARTITIONS_KEPT", 2)
    core._PARTITIONS.clear()
    op = _gpt()["layers.0.attn.q"]
    got = [op._partition({"feature": k}) for k in (1, 2, 4, 8)]
    assert len(core._PARTITIONS) <= 2
    assert [op._partition({"feature": k}) for k in (1, 2, 4, 8)] == got


def test_dim_sizes_name_the_first_op_of_each_size_and_the_rules_read_them():
    g = gpt(GPTConfig(2, 384, 12, 128, 1000, 16, kv_heads=4, precision="bf16"), source="test")
    heads = dict(g.dim_sizes("head"))
    assert set(heads) == {op.dim("head").size for op in g.ops if "head" in op.dim_names}
    for size, name in g.dim_sizes("head"):
        first = next(op.name for op in g.ops if "head" in op.dim_names and op.dim("head").size == size)
        assert name == first
    assert g.dim_sizes("no such dim") == ()
    c = preset("dgx-a100-80gb:1")
    # tp 8 divides neither 12 query heads nor 4 key/value ones: the first op whose heads it does not divide
    why = layout_problem(g, c, Layout.from_options({"tp": 8}))
    first_bad = next(op for op in g.ops if "head" in op.dim_names and op.dim("head").size % 8)
    assert why == (f"tp 8 does not divide the {first_bad.dim('head').size} heads of {first_bad.name!r} (Megatron-LM "
                   "needs query and key/value heads to be multiples of tp)")
    assert g.expert_counts == frozenset()


def test_the_tensor_parallel_plan_is_kept_and_a_copy_handed_out():
    g = _gpt()
    for tp, sp, lp in ((2, False, True), (4, True, True), (8, True, False)):
        plan, notes = tp_plan(g, tp, sp, lp)
        assert (plan, notes) == _tp_plan(g, tp, sp, lp)
        plan[g.ops[1].name] = ("nonsense", 99)
        notes.append("changed")
        assert tp_plan(g, tp, sp, lp) == _tp_plan(g, tp, sp, lp)
    with pytest.raises(ValueError, match="does not divide the 8 heads"):
        tp_plan(g, 16, False)


def test_shape_tokens_emptied_never_mix_two_shapes(monkeypatch):
    """Past :data:`engine.graph.core.SHAPES_KEPT` the tokens are emptied: an op made after gets a new
    token and its own entries, never an earlier op's of other shapes."""
    monkeypatch.setattr(core, "SHAPES_KEPT", 1)
    monkeypatch.setattr(core, "_SHAPES", {})
    a = _gpt()["layers.0.attn.q"]
    b = _gpt(heads=4, layers=2)["layers.0.mlp.fc1"]
    c = _gpt()["layers.0.attn.q"]
    assert a._shapes_key is not b._shapes_key and a._shapes_key is not c._shapes_key
    for op in (a, b, c):
        for degrees in ({}, {"feature": 2}, {"sample": 2}):
            key = tuple(int(degrees.get(d.name, 1)) for d in op.dims)
            assert op._partition(degrees) == op._partition_shapes(key)
