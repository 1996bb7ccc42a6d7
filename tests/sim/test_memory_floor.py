"""The memory floor (engine.sim.memory_floor) against the simulated memory report (issue 43).

The floor must lie under every GPU's ``required_bytes`` whatever the layout (a property over
generated layouts: tp, cp, pp, vpp, dp, micro-batches, 1F1B, interleaved and GPipe, ZeRO 0-3,
recomputation, sequence parallelism, optimizer and activation offload, mixture of experts), so
a layout it says cannot fit is one the simulation finds does not fit. Where nothing but the
counted parts is held (one stage, no recomputation), its activations equal the report's peak.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engine.cluster import preset
from engine.layout import Layout, resolved
from engine.layout.build import build_layout
from engine.models.moe import MoEConfig, moe_gpt
from engine.models.transformer import GPTConfig, gpt
from engine.sim.memory import saved_activation_bytes
from engine.sim.memory_floor import memory_floor
from engine.sim.report import simulate_strategy


def _built(g, cluster_name: str, **opts):
    cl = preset(cluster_name)
    lay = resolved(Layout.from_options(opts), g, cl)
    return cl, build_layout(g, cl, lay)


@st.composite
def layouts(draw):
    """(graph, cluster, layout options) of a small GPT (or mixture of experts) on 1-4 nodes."""
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    cp = draw(st.sampled_from([1, 1, 2]))
    pp = draw(st.sampled_from([1, 2, 3, 4]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 2 else 1
    gpipe = vpp == 1 and pp > 1 and draw(st.booleans())
    dp = draw(st.sampled_from([1, 2]))
    mb = draw(st.sampled_from([1, 2]))
    m = draw(st.sampled_from([1, 2, 4])) * pp
    zero = draw(st.sampled_from([0, 1, 2, 3]))
    opts = dict(tp=tp, cp=cp, pp=pp, vpp=vpp, dp=dp, micro_batch=mb, zero_stage=zero,
                recompute=draw(st.sampled_from(["none", "selective", "full"])),
                sequence_parallel=tp > 1 and draw(st.booleans()))
    if gpipe:
        opts["schedule"] = "gpipe"
    if zero >= 1 and draw(st.booleans()):
        opts["offload_optimizer"] = "cpu"
    if pp == 1 and draw(st.booleans()):
        opts["offload_activations"] = 1
    layers = pp * vpp * draw(st.sampled_from([1, 2]))
    gpus = tp * cp * pp * dp
    nodes = -(-gpus // 8)
    assume(gpus == nodes * 8 or nodes == 1)
    batch = dp * mb * m
    if draw(st.integers(0, 4)) == 0:
        g = moe_gpt(MoEConfig(layers, 256, 8, 128 * cp, 1024, batch, experts=4, top_k=2, expert_ffn=256))
        if dp * cp % 2 == 0:
            opts["ep"] = 2
    else:
        g = gpt(GPTConfig(layers, 256, 8, 128 * cp, 1024, batch, precision=draw(st.sampled_from(["fp16", "bf16"])),
                          name="t"), source="test")
    return g, f"{draw(st.sampled_from(['dgx-a100-80gb', 'dgx-h100']))}:{nodes}", opts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(layouts())
def test_the_floor_is_under_every_gpu_s_required_memory(case):
    g, cluster_name, opts = case
    try:
        cl, s = _built(g, cluster_name, **opts)
    except ValueError:
        assume(False)
        return
    floor = memory_floor(g, s, cl)
    report = simulate_strategy(g, s, cl, check=False).memory
    assert np.all(floor.required_bytes <= report.required_bytes * (1 + 1e-12)), opts
    assert np.all(floor.host_bytes <= report.host_bytes * (1 + 1e-12) + 1e-6), opts
    if not floor.fits:
        assert not report.feasible, opts


def test_one_stage_holds_one_microbatch_and_gpipe_every_one():
    """pp 1, no recomputation: 1F1B holds one microbatch's saved activations at its peak, as
    the floor counts; with four microbatches each per stage, GPipe's first stage holds all
    four before its first backward, 1F1B's two (its warm-up of pp - 1, then one)."""
    g = gpt(GPTConfig(2, 256, 8, 128, 1024, 8, precision="bf16", name="t"), source="test")
    cl, s = _built(g, "dgx-h100:1", tp=2, dp=4, micro_batch=1)
    floor = memory_floor(g, s, cl)
    report = simulate_strategy(g, s, cl, check=False).memory
    assert floor.activations_bytes.max() > 0
    np.testing.assert_allclose(floor.activations_bytes, report.activations_peak_bytes, rtol=1e-12)
    saved = saved_activation_bytes(g, s)
    per_device = np.zeros(cl.num_devices)
    for i, op in enumerate(g.ops):
        np.add.at(per_device, np.asarray(s.configs[op.name].devices), saved[i])
    np.testing.assert_allclose(floor.activations_bytes, per_device, rtol=1e-12)

    g2 = gpt(GPTConfig(2, 256, 8, 128, 1024, 8, precision="bf16", name="t"), source="test")
    held = {}
    for schedule in ("gpipe", "1f1b"):
        cl, s = _built(g2, "dgx-h100:1", tp=2, pp=2, dp=2, micro_batch=1, schedule=schedule)
        one = np.zeros(cl.num_devices)
        saved = saved_activation_bytes(g2, s)
        for i, op in enumerate(g2.ops):
            if s.stage_of[op.name] == 0:
                np.add.at(one, np.asarray(s.configs[op.name].devices), saved[i])
        stage0 = one > 0
        held[schedule] = memory_floor(g2, s, cl).activations_bytes[stage0] / one[stage0]
    assert np.allclose(held["gpipe"], 4) and np.allclose(held["1f1b"], 2)


def test_a_layout_that_cannot_fit_is_named():
    """GPT-3 175B on one DGX H100 node, tp 8: 175 B parameters' weights, gradients and Adam
    state cannot fit in 80 GB a GPU; the floor says so, and names the GPU and the bytes."""
    from engine.models import build_sample
    g = build_sample("gpt3-175b", batch=8)
    cl, s = _built(g, "dgx-h100:1", tp=8, micro_batch=1)
    floor = memory_floor(g, s, cl)
    assert not floor.fits
    why = floor.why()
    assert why.startswith("does not fit in memory: GPU ") and "GB over its 85.90 GB" in why
    state = floor.weights_bytes + floor.grads_bytes + floor.optimizer_bytes
    assert state.max() > 175e9 * 16 / 8 * 0.99  # (fp16: 2 + 2 + 4 + 12 bytes a parameter over tp 8, at least)


@pytest.mark.parametrize("zero", [0, 3])
def test_fitting_layouts_pass(zero):
    """A small model on one node fits, by the floor and by the report."""
    g = gpt(GPTConfig(2, 256, 8, 128, 1024, 8, precision="bf16", name="t"), source="test")
    cl, s = _built(g, "dgx-h100:1", tp=1, dp=8, micro_batch=1, zero_stage=zero)
    assert memory_floor(g, s, cl).fits and memory_floor(g, s, cl).why() == ""


def test_the_reference_s_floor_is_the_whole_run_s():
    """Off the composed prediction's reference strategy (engine.sim.hier.reference_floor), each
    reference GPU's floor is the floor of the real GPU it names, and the fullest is the whole
    run's fullest: over generated layouts of more than three stages (test_hier's)."""
    from test_hier import _case

    from engine.sim.hier import reference_floor

    seen = 0
    for i in range(400):
        case = _case(i)
        if case is None or case[2]["pp"] <= 3:
            continue
        g, cl, opts = case
        try:
            lay = resolved(Layout.from_options(opts), g, cl)
            s = build_layout(g, cl, lay)
            ref = reference_floor(g, cl, lay)
        except ValueError:
            continue
        if ref is None:
            continue
        full = memory_floor(g, s, cl)
        used = ref.context_bytes > 0
        np.testing.assert_allclose(ref.required_bytes[used], full.required_bytes[ref.gpus[used]], rtol=1e-12,
                                   err_msg=str(opts))
        assert ref.required_bytes.max() == pytest.approx(full.required_bytes.max(), rel=1e-12), opts
        assert ref.fits == full.fits
        seen += 1
        if seen == 40:
            break
    assert seen == 40


def test_one_stage_under_gpipe_alternates_as_the_simulation_does():
    """A review's case: one stage with ``schedule="gpipe"`` runs forward and backward in turn
    (the task graph orders one stage so whatever the schedule), holding one microbatch; the
    floor counted every microbatch and refused a layout needing 5.3 GiB as 99 GiB."""
    g = gpt(GPTConfig(2, 256, 8, 512, 1024, 16, precision="bf16", name="t"), source="test")
    cl, s = _built(g, "dgx-h100:1", tp=1, dp=8, micro_batch=1, schedule="gpipe")
    assert s.pipeline.microbatches == 2
    floor = memory_floor(g, s, cl)
    report = simulate_strategy(g, s, cl, check=False).memory
    np.testing.assert_allclose(floor.activations_bytes, report.activations_peak_bytes, rtol=1e-12)


@pytest.mark.parametrize("model", ["nmt", "rnnlm"])
@pytest.mark.parametrize("kind, micro_batch", [("data-parallel", None), ("data-parallel", 2), ("expert", None),
                                               ("model-parallel", None)])
def test_models_with_many_losses(model, kind, micro_batch):
    """A review's case: FlexFlow's NMT and RNNLM end in 40 losses, one a time step. With one
    stage and one microbatch no barrier orders the units, and the first loss's backward runs
    while later steps still run forward: the floor counted every step's activations (NMT, data
    parallel: 30.0 MiB against a peak of 7.3). Now only the ops every loss reads (the encoder and
    the first step), where every loss runs on every GPU: 3.2 MiB there; none under the
    model-parallel strategy, whose losses sit on different GPUs."""
    from engine.cluster import preset
    from engine.formats import resolve_model
    from engine.search.baselines import make_baseline

    g, cl = resolve_model(model, batch=64), preset("p100-4x4")
    s = make_baseline(kind, g, cl, **({"micro_batch": micro_batch} if micro_batch else {}))
    floor = memory_floor(g, s, cl)
    report = simulate_strategy(g, s, cl, check=False).memory
    assert np.all(floor.required_bytes <= report.required_bytes * (1 + 1e-12))
    assert np.all(floor.activations_bytes <= report.activations_peak_bytes * (1 + 1e-12) + 1e-6)
    if kind == "data-parallel":  # (every loss on every GPU: what every loss reads counted)
        assert s.pipeline.microbatches == 64 // (16 * (micro_batch or 4)) and floor.activations_bytes.min() > 0
    if kind == "model-parallel":
        assert floor.activations_bytes.max() == 0
