"""The whole iteration's timeline unfolded from a steady short run (engine.sim.unfold): task for
task what the full simulation gives, to float rounding: every task's arrays and times, the
earliest starts, the critical chain, each collective's devices, the memory report and the
trace."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from engine.cluster import preset
from engine.layout import Layout, build_layout
from engine.models import build_sample
from engine.sim.full import simulate
from engine.sim.memory import memory_report
from engine.sim.report import simulate_strategy
from engine.sim.trace import trace_events
from engine.sim.unfold import unfold

from toys import drawn_megatron  # tests/toys.py

#: what a time may differ by, as a share of the iteration (float rounding of k x period)
REL = 1e-9
COLUMNS = ("kind", "op", "part", "mb", "device", "link", "coll")
MODELS: dict[str, object] = {}


def model(name: str, batch: int | None = None):
    key = f"{name}/{batch}"
    if key not in MODELS:
        MODELS[key] = build_sample(name, **({"batch": batch} if batch else {}))
    return MODELS[key]


def canonical(tl) -> np.ndarray:
    """The tasks in an order both timelines share: by every column, then start."""
    tg = tl.tasks
    return np.lexsort([tl.start_s] + [getattr(tg, c) for c in reversed(COLUMNS)])


def assert_unfolds_to_the_full_run(g, s, c) -> None:
    short = simulate_strategy(g, s, c, check=False, steady=True, account_memory=False)
    full = simulate_strategy(g, s, c, check=False, account_memory=False)
    assert short.steady is not None
    u, f = unfold(short.timeline), full.timeline
    assert u is not None
    tol = REL * f.makespan_s
    assert u.tasks.num_tasks == f.tasks.num_tasks == short.num_tasks
    a, b = canonical(u), canonical(f)
    for col in COLUMNS + ("dur_s", "size_bytes", "flops"):
        np.testing.assert_array_equal(getattr(u.tasks, col)[a], getattr(f.tasks, col)[b], err_msg=col)
    for name in ("start_s", "end_s", "earliest_starts_s"):
        np.testing.assert_allclose(getattr(u, name)[a], getattr(f, name)[b], rtol=0, atol=tol, err_msg=name)
    assert u.makespan_s == pytest.approx(f.makespan_s, rel=REL, abs=0)
    assert u.critical_path_s == pytest.approx(f.critical_path_s, rel=REL, abs=0)
    assert u.comm_bytes == pytest.approx(f.comm_bytes, rel=REL, abs=0)
    np.testing.assert_allclose(u.device_busy_s, f.device_busy_s, rtol=REL, atol=1e-15)
    cu, cf = u.critical_tasks, f.critical_tasks  # the chain: the same tasks at the same times
    assert cu.size == cf.size
    np.testing.assert_allclose(u.start_s[cu], f.start_s[cf], rtol=0, atol=tol)
    for col in COLUMNS:
        np.testing.assert_array_equal(getattr(u.tasks, col)[cu], getattr(f.tasks, col)[cf], err_msg=col)
    assert same_collectives(u, f, tol)
    mu, mf = memory_report(g, s, c, u), memory_report(g, s, c, f)  # (u's: from the short run; curves later)
    np.testing.assert_allclose(mu.peak_bytes, mf.peak_bytes, rtol=REL, atol=0)
    np.testing.assert_allclose(mu.allocated_peak_bytes, mf.allocated_peak_bytes, rtol=REL, atol=0)
    assert len(mu.curves) == len(mf.curves) == c.num_devices
    for d in (0, c.num_devices // 2, c.num_devices - 1):
        (ta, ba), (tb, bb) = mu.curves[d], mf.curves[d]
        np.testing.assert_allclose(ta, tb, rtol=0, atol=tol)
        np.testing.assert_allclose(ba, bb, rtol=1e-12, atol=0)


def collectives(tl) -> list[tuple]:
    """(op, microbatch, its devices, start) of every collective task, sorted."""
    tg = tl.tasks
    ptr, idx, tasks = tg.info["coll_devices"]
    return sorted((int(tg.op[t]), int(tg.mb[t]), tuple(sorted(idx[ptr[j]:ptr[j + 1]].tolist())), float(tl.start_s[t]))
                  for j, t in enumerate(tasks.tolist()))


def same_collectives(u, f, tol: float) -> bool:
    a, b = collectives(u), collectives(f)
    return len(a) == len(b) and all(x[:3] == y[:3] and abs(x[3] - y[3]) <= tol for x, y in zip(a, b))


LAYOUTS = [
    ("1f1b", "gpt2", 256, "dgx-a100-80gb:2", Layout(tp=2, pp=4, micro_batch=1)),
    ("1f1b-sp-full-recompute", "gpt2", 256, "dgx-a100-80gb:2",
     Layout(tp=2, pp=4, micro_batch=1, sequence_parallel=True, recompute="full")),
    ("interleaved", "gpt2", 256, "dgx-a100-80gb:2", Layout(tp=2, pp=2, vpp=3, micro_batch=1, recompute="full")),
    ("gradient-accumulation", "gpt2", 256, "dgx-a100-80gb:2", Layout(tp=2, pp=1, micro_batch=1)),
    ("zero1-param-gather", "gpt2", 256, "dgx-a100-80gb:2",
     Layout(tp=1, pp=2, micro_batch=1, zero_stage=1, overlap_grad_reduce=True, overlap_param_gather=True)),
    ("cp2-pp4", "gpt2", 256, "dgx-a100-80gb:2", Layout(tp=2, cp=2, pp=4, micro_batch=1, sequence_parallel=True)),
    ("repeats-every-p-one-run", "llama2-7b", None, "dgx-a100-80gb:8", Layout(tp=8, pp=2, micro_batch=1)),
    ("interleaved-mb2-overlap-period-4", "gpt2", 512, "dgx-a100-80gb:2",
     Layout(tp=2, pp=4, vpp=2, micro_batch=2, overlap_grad_reduce=True)),
    ("offload-activations", "gpt2", 256, "dgx-a100-80gb:2", Layout(tp=2, pp=1, micro_batch=1, offload_activations=2)),
    ("offload-optimizer", "gpt2", 256, "dgx-a100-80gb:2",
     Layout(tp=2, pp=4, micro_batch=1, zero_stage=1, offload_optimizer="cpu")),
    ("h100-sp-tp-comm-overlap", "gpt2", 256, "dgx-h100:2",
     Layout(tp=2, pp=4, micro_batch=1, sequence_parallel=True, tp_comm_overlap=True)),
]


@pytest.mark.parametrize("name,model_name,batch,cluster,layout", LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_the_unfolded_timeline_is_the_full_simulation_task_for_task(name, model_name, batch, cluster, layout):
    g, c = model(model_name, batch), preset(cluster)
    assert_unfolds_to_the_full_run(g, build_layout(g, c, layout), c)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([2, 4]), vpp=st.sampled_from([1, 2]),
       mb=st.sampled_from([1, 2]), sp=st.booleans(), zero=st.sampled_from([0, 1, 2]),
       recompute=st.sampled_from(["none", "selective", "full"]), overlap=st.booleans())
def test_random_megatron_layouts_unfold_to_the_full_simulation(tp, pp, vpp, mb, sp, zero, recompute, overlap):
    """Megatron layouts of GPT-2 (batch 512) on 16 GPUs drawn at random: wherever the steady
    state is extrapolated, the unfolded timeline is the full simulation's, task for task."""
    from hypothesis import assume

    g, c = model("gpt2", 512), preset("dgx-a100-80gb:2")
    s = drawn_megatron(g, c, tp, pp, vpp, mb, sp, zero, recompute, overlap)
    short = simulate_strategy(g, s, c, check=False, steady=True, account_memory=False)
    assume(short.steady is not None)
    assert_unfolds_to_the_full_run(g, s, c)


def test_nothing_is_unfolded_from_a_run_simulated_in_full():
    g, c = model("gpt2", 256), preset("dgx-a100-80gb:2")
    s = build_layout(g, c, Layout(tp=2, pp=4, micro_batch=1))
    full = simulate_strategy(g, s, c, check=False, account_memory=False)
    assert unfold(full.timeline) is None


def test_no_cut_that_passes_the_checks_gives_none(monkeypatch):
    """Where every cut's periods differ (here: made to, by a task moved in the short run),
    nothing is unfolded and the caller simulates every microbatch."""
    from engine.sim import unfold as U

    g, c = model("gpt2", 256), preset("dgx-a100-80gb:2")
    s = build_layout(g, c, Layout(tp=2, pp=4, micro_batch=1))
    short = simulate_strategy(g, s, c, check=False, steady=True, account_memory=False)
    assert unfold(short.timeline) is not None
    monkeypatch.setattr(U, "_pairs", lambda *a, **k: None)
    assert unfold(short.timeline) is None


def test_the_unfolded_task_graph_is_a_drawing_the_simulator_refuses():
    g, c = model("gpt2", 256), preset("dgx-a100-80gb:2")
    s = build_layout(g, c, Layout(tp=2, pp=4, micro_batch=1))
    u = unfold(simulate_strategy(g, s, c, check=False, steady=True, account_memory=False).timeline)
    assert u.tasks.num_edges == 0 and u.tasks.info["unfolded"].microbatches == s.pipeline.microbatches
    with pytest.raises(ValueError, match="unfolded from a steady short run"):
        simulate(u.tasks)


def test_the_trace_of_the_unfolded_timeline_is_the_full_runs_flows_included():
    """Every event of the Chrome trace (compute, transfers, collectives and the transfers'
    flow arrows, read from the short run's edges) at the full run's times (the trace's
    microsecond rounding aside)."""
    g, c = model("gpt2", 256), preset("dgx-a100-80gb:2")
    s = build_layout(g, c, Layout(tp=2, pp=4, micro_batch=1))
    u = unfold(simulate_strategy(g, s, c, check=False, steady=True, account_memory=False).timeline)
    f = simulate_strategy(g, s, c, check=False, account_memory=False).timeline

    def events(tl):
        out = []
        for e in trace_events(g, c, tl):
            if e["ph"] in ("s", "f", "X"):
                out.append((e["ph"], e["pid"], e["tid"], e.get("name", ""), e["ts"], e.get("dur", 0.0)))
        return sorted(out)

    a, b = events(u), events(f)
    assert len(a) == len(b) and sum(1 for e in a if e[0] == "s") > 0
    for x, y in zip(a, b):
        assert x[:4] == y[:4]
        assert abs(x[4] - y[4]) <= 2e-3 and abs(x[5] - y[5]) <= 2e-3  # (µs, rounded to 1e-3 by the trace)


def test_simulate_drawn_falls_back_to_every_microbatch_and_says_why(monkeypatch):
    """Where no cut passes, the whole iteration is simulated (the result and the timeline are
    that run's) and the timeline says why; where the steady state is not tried (GPipe), why."""
    from engine.sim import unfold as U

    g, c = model("gpt2", 256), preset("dgx-a100-80gb:2")
    s = build_layout(g, c, Layout(tp=2, pp=4, micro_batch=1))
    r, tl = U.simulate_drawn(g, s, c)
    assert r.steady is not None and tl.tasks.info["unfolded"] == r.steady and "every_microbatch" not in tl.extra
    monkeypatch.setattr(U, "_pairs", lambda *a, **k: None)
    r2, tl2 = U.simulate_drawn(g, s, c)
    assert r2.steady is None and tl2 is r2.timeline and tl2.tasks.num_tasks == tl.tasks.num_tasks
    assert tl2.extra["every_microbatch"] == "no cut inside its repeat passed the checks"
    assert r2.iteration_time_s == pytest.approx(r.iteration_time_s, rel=REL)
    gp = build_layout(g, c, Layout(tp=2, pp=4, micro_batch=1, schedule="gpipe"))
    _, tl3 = U.simulate_drawn(g, gp, c)
    assert tl3.extra["every_microbatch"].startswith("GPipe: every forward runs before the first backward")
