"""The explorer on a long pipeline (issue 43): its workspace simulates the steady state's first
microbatches and unfolds the rest (engine.sim.unfold); every view drawn from it is the one the
full simulation draws."""

from __future__ import annotations

import numpy as np
import pytest

from app import events as EV
from app import state as ST
from app.gantt import gantt_data
from app.simulation import workspace
from app.tabs import explore as EXP
from app.views import op_details
from engine.sim.memory import memory_report
from engine.sim.report import simulate_strategy


@pytest.fixture(scope="module")
def llama_pp2():
    """LLaMA-2 7B on 64 A100s, tp 8 pp 2 (256 microbatches): the workspace and the full run."""
    s = ST.new_state("llama2-7b", "dgx-a100-80gb:8", sid=ST.new_sid())
    s, msg = EV.on_event("layout-apply", s, layout={"kind": "megatron", "tp": 8, "pp": 2, "micro_batch": 1})
    assert msg.startswith("Layout"), msg
    ws = workspace(s)
    full = simulate_strategy(ws.graph, ws.strategy, ws.cluster, check=False, symmetry="only",
                             account_memory=False).timeline
    return s, ws, full


def test_the_workspace_of_a_long_pipeline_is_unfolded_from_its_steady_state(llama_pp2):
    s, ws, full = llama_pp2
    st = ws.timeline.tasks.info["unfolded"]
    assert st.simulated < st.microbatches == 256
    assert ws.timeline.tasks.num_tasks == full.tasks.num_tasks
    assert ws.timeline.makespan_s == pytest.approx(full.makespan_s, rel=1e-9, abs=0)
    out = EXP.render_explore(s)
    assert out["sum-tasks"].endswith(f"(2 of 64 GPUs, {st.simulated} of 256 microbatches simulated; the rest mirror or "
                                     "repeat them)")
    assert f"Of the 256 microbatches, the first {st.simulated} were simulated" in out["why"]
    assert out["sum-time"] == EXP.format_seconds(full.makespan_s)


@pytest.mark.parametrize("window", [None, (0.30, 0.31), (0.97, 1.0)], ids=["whole", "steady", "cool-down"])
def test_the_gantt_drawn_from_it_is_the_full_runs(llama_pp2, window):
    """Every bar (start, end, row, how many tasks merged, hover text), row label, overlay and the
    bubble's figures alike, zoomed or not (task ids aside: the two number their tasks apart)."""
    s, ws, full = llama_pp2
    win = None if window is None else (window[0] * full.makespan_s, window[1] * full.makespan_s)
    pipe = (2, 256, 1)
    a = gantt_data(ws.graph, ws.cluster, ws.timeline, window=win, pipeline=pipe)
    b = gantt_data(ws.graph, ws.cluster, full, window=win, pipeline=pipe)
    assert a["labels"] == b["labels"] and a["tasks_in_view"] == b["tasks_in_view"] > 0
    for part in ("bars", "overlays"):
        assert a[part].keys() == b[part].keys()
        for kind in a[part]:
            x, y = a[part][kind], b[part][kind]
            for key in x:
                if key == "task":
                    continue
                if isinstance(x[key], np.ndarray) and x[key].dtype.kind == "f":
                    np.testing.assert_allclose(x[key], y[key], rtol=0, atol=1e-9 * full.makespan_s)
                else:
                    assert list(x[key]) == list(y[key]), (part, kind, key)
    for key, v in a["bubble"].items():
        assert v == pytest.approx(b["bubble"][key], rel=1e-9), key


def test_op_details_and_memory_drawn_from_it_are_the_full_runs(llama_pp2):
    _, ws, full = llama_pp2
    ops = ws.graph.ops
    for name in (ops[0].name, ops[len(ops) // 2].name, ops[-1].name):
        a, b = op_details(ws.graph, ws.strategy, ws.timeline, name), op_details(ws.graph, ws.strategy, full, name)
        assert a.pop("time_s") == pytest.approx(b.pop("time_s"), rel=1e-9)
        assert a == b
    np.testing.assert_allclose(ws.memory.peak_bytes, memory_report(ws.graph, ws.strategy, ws.cluster, full).peak_bytes,
                               rtol=1e-9, atol=0)


def test_where_nothing_is_unfolded_the_page_says_why():
    """A layout the steady state does not apply to (GPipe) is simulated at every microbatch,
    and the summary says so and why."""
    s = ST.new_state("gpt2", "dgx-a100-80gb:1", sid=ST.new_sid())
    s, msg = EV.on_event("layout-apply", s, layout={"kind": "megatron", "tp": 2, "pp": 4, "micro_batch": 1,
                                                   "schedule": "gpipe"})
    assert msg.startswith("Layout"), msg
    ws = workspace(s)
    assert "unfolded" not in ws.timeline.tasks.info
    m = ws.strategy.pipeline.microbatches
    assert m > 1
    out = EXP.render_explore(s)
    assert f"All {m} microbatches were simulated (GPipe: every forward runs before the first backward" in out["why"]
    assert "microbatches" not in out["sum-tasks"]
