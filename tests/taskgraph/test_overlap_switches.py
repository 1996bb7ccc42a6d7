"""What current stacks overlap, as switches (issue 25): data-parallel gradient reduction with
the backward, ZeRO-1/2's parameter all-gather with the next forward, DeepSpeed ZeRO-3's
prefetch bucket; and --no-overlap on the command line."""

from __future__ import annotations

import pytest

from engine.cli.common import strategy_options
from engine.cluster import preset
from engine.models.transformer import gpt2
from engine.sim.report import simulate_strategy
from engine.layout.build import fsdp
from engine.sim.full import simulate
from engine.taskgraph import BWD, COLL, COLL_INDEX, FWD, build_task_graph
from engine.layout import Layout, build_layout


@pytest.fixture(scope="module")
def setup():
    return gpt2(batch=32, precision="bf16"), preset("dgx-a100-80gb:2")


def _run(g, c, s):
    tg = build_task_graph(g, s, c)
    return tg, simulate(tg)


def test_without_grad_reduce_overlap_no_gradient_collective_starts_before_the_backward_ends(setup):
    g, c = setup
    for overlap in (True, False):
        tg, tl = _run(g, c, build_layout(g, c, Layout(overlap_grad_reduce=overlap)))
        last_bwd = tl.end_s[tg.kind == BWD].max()
        first_coll = tl.start_s[tg.kind == COLL].min()
        if overlap:
            assert first_coll < last_bwd  # reduced bucket by bucket during the backward
        else:
            assert first_coll >= last_bwd - 1e-12
    on = simulate_strategy(g, build_layout(g, c, Layout()), c).iteration_time_s
    off = simulate_strategy(g, build_layout(g, c, Layout(overlap_grad_reduce=False)), c).iteration_time_s
    assert off > on


def test_overlapped_param_gather_runs_ahead_of_the_forward(setup):
    g, c = setup
    tg, tl = _run(g, c, build_layout(g, c, Layout(zero_stage=1)))
    gathers = (tg.kind == COLL) & (tg.coll == COLL_INDEX["all_gather"])
    assert tl.start_s[gathers].min() >= tl.end_s[tg.kind == BWD].max() - 1e-12  # after the step
    tg2, tl2 = _run(g, c, build_layout(g, c, Layout(zero_stage=1, overlap_param_gather=True)))
    first_fwd_end = tl2.end_s[tg2.kind == FWD].max()
    gathers2 = (tg2.kind == COLL) & (tg2.coll == COLL_INDEX["all_gather"])
    assert gathers2.sum() == gathers.sum()  # the same gathers, moved
    assert (tl2.start_s[gathers2] < first_fwd_end).all()  # every one during the forward now
    assert simulate_strategy(g, build_layout(g, c, Layout(zero_stage=1, overlap_param_gather=True)),
                             c).iteration_time_s < \
        simulate_strategy(g, build_layout(g, c, Layout(zero_stage=1)), c).iteration_time_s


def test_param_gather_overlap_needs_no_change_without_zero(setup):
    g, c = setup
    a = simulate_strategy(g, build_layout(g, c, Layout()), c).iteration_time_s
    b = simulate_strategy(g, build_layout(g, c, Layout(overlap_param_gather=True)), c).iteration_time_s
    assert a == b


def test_deepspeed_prefetch_buckets():
    """DeepSpeed ZeRO-3 fetches stage3_prefetch_bucket_size (5e7) parameters ahead: a module
    that does not fit the bucket starts one of its own, issued when the bucket before it starts."""
    from engine.taskgraph.sync import DEEPSPEED_PREFETCH_ELEMENTS, prefetch_buckets

    assert DEEPSPEED_PREFETCH_ELEMENTS == 5e7
    pieces = [(3e7, 10, [10]), (3e7, 11, [11]), (1e8, 12, [12]), (1e7, 13, [13]), (2e7, 14, [14])]
    # buckets {10}, {11}, {12}, {13, 14}: each issued at the start of the previous bucket's first op
    assert [after for *_, after in prefetch_buckets(pieces, per_op=True)] == [None, 10, 11, 12, 12]
    # FSDP (a block's parameters at once): every piece at the unit's prefetch point
    assert [after for *_, after in prefetch_buckets(pieces, per_op=False)] == [None] * 5


def test_deepspeed_gathers_cost_more_than_fsdps_blocks(setup):
    g, c = setup
    block = simulate_strategy(g, fsdp(g, c, Layout(zero_stage=3)), c).iteration_time_s
    per_op = simulate_strategy(g, fsdp(g, c, Layout(zero_stage=3, gather_unit="op")), c).iteration_time_s
    assert per_op > block  # one collective per module, each paying its ring's latency


def test_switches_round_trip_through_a_strategy_file(setup):
    from engine.strategy import strategy_from_dict

    g, c = setup
    s = build_layout(g, c, Layout(zero_stage=1, overlap_grad_reduce=False, overlap_param_gather=True))
    d = s.to_dict()
    assert d["overlap_grad_reduce"] is False and d["overlap_param_gather"] is True
    back = strategy_from_dict(d)
    assert (back.overlap_grad_reduce, back.overlap_param_gather) == (False, True)


def test_no_overlap_on_the_command_line():
    import argparse

    from engine.cli.common import add_strategy_options

    p = argparse.ArgumentParser()
    add_strategy_options(p)
    opts = strategy_options(p.parse_args(["--no-overlap"]))
    assert opts["overlap_grad_reduce"] is False and not opts["tp_comm_overlap"] and not opts["overlap_param_gather"]
    with pytest.raises(ValueError, match="--no-overlap"):
        strategy_options(p.parse_args(["--no-overlap", "--tp-comm-overlap"]))
    opts = strategy_options(p.parse_args(["--no-overlap-grad-reduce", "--overlap-param-gather"]))
    assert opts["overlap_grad_reduce"] is False and opts["overlap_param_gather"] is True


def test_fsdp_with_sequence_parallel_tensor_parallelism(setup):
    """torchtitan's 2-D layout: FSDP over dp, tensor parallel with sequence-sharded norms, and
    async TP overlapping its collectives with the GEMMs."""
    g, c = setup
    plain = fsdp(g, c, Layout(zero_stage=3, tp=2))
    sp = fsdp(g, c, Layout(zero_stage=3, tp=2, sequence_parallel=True))
    async_tp = fsdp(g, c, Layout(zero_stage=3, tp=2, sequence_parallel=True, tp_comm_overlap=True))
    assert (sp.sequence_parallel, sp.zero_stage, async_tp.tp_comm_overlap) == (True, 3, True)
    t_sp = simulate_strategy(g, sp, c).iteration_time_s
    t_async = simulate_strategy(g, async_tp, c).iteration_time_s
    assert t_async < t_sp
    m_plain = simulate_strategy(g, plain, c).memory.peak_bytes.max()
    m_sp = simulate_strategy(g, sp, c).memory.peak_bytes.max()
    assert m_sp < m_plain  # the norms' activations are sharded over tp
    with pytest.raises(ValueError, match="sequence parallel"):
        fsdp(g, c, Layout(zero_stage=3, tp=2, tp_comm_overlap=True))


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_overlapped_param_gather_is_never_slower_where_gathers_outlast_a_layer(pp):
    """A layer's gather (4096-wide layers, data-parallel over InfiniBand) takes longer than
    its forward of one 128-token microbatch: chained behind the forward, stage by stage, the
    gathers paced every stage's first microbatch and lengthened the pipeline fill (GPT-3 on
    11,616 H100s went 2.98 -> 3.95 s with --overlap-param-gather). Megatron-LM aligns them
    across stages (``--align-param-gather``, its default): an overlap never slows a run down."""
    from engine.models.transformer import GPTConfig, gpt

    g = gpt(GPTConfig(layers=8, hidden=4096, heads=32, seq_len=128, vocab=1024, batch=64, precision="bf16",
                      flash_attention=True, dropout=0))
    c = preset("dgx-a100-80gb:8")
    t = [simulate_strategy(g, build_layout(g, c, Layout(pp=pp, zero_stage=1, micro_batch=1, overlap_param_gather=o)),
                           c).iteration_time_s for o in (False, True)]
    assert t[1] < t[0]
