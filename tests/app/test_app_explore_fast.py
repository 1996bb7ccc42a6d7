"""The explorer's layout change does each check once (issue 43): a layout or baseline the
builder validated is not validated again when drawn, a layout on many GPUs is sized by its
symmetry without the full estimate, and the critical chain is walked beside the memory report
with the same result as in line."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import TooLargeError, ValidationError
from engine.sim.full import Timeline
from engine.strategy import Config
from app import actions as ACT
from app import events as EV
from app import simulation as SIM
from app import state as ST
from app.tabs import explore as EXP


def _layout(state, **form):
    return EV.on_event("layout-apply", state, layout={"kind": "megatron", **form})


@pytest.fixture
def gpt2():
    return ST.new_state("gpt2", "dgx-a100-80gb:1", sid=ST.new_sid())


def _count_validations(monkeypatch) -> list:
    calls = []
    real = SIM.validate_strategy

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(SIM, "validate_strategy", counting)
    return calls


def test_a_layout_the_builder_validated_is_not_validated_again_when_drawn(gpt2, monkeypatch):
    new, msg = _layout(gpt2, tp=2, pp=2)
    assert msg.startswith("Layout"), msg
    calls = _count_validations(monkeypatch)
    out = EXP.draw_explore(new, True, "utilization", {})
    assert calls == [] and out["summary"]["iteration_time_s"] > 0


def test_a_strategy_set_without_the_builders_check_is_validated_when_drawn(gpt2, monkeypatch):
    """An uploaded or loaded strategy (set without ``validated``) is checked when drawn, and a
    bad one is refused with its problems, as before."""
    s = ST.page_strategy(gpt2)
    good, _ = ACT.set_strategy(gpt2, s, "set")
    calls = _count_validations(monkeypatch)
    EXP.draw_explore(good, True, "utilization", {})
    assert len(calls) == 1
    op = next(iter(s.configs))
    bad_s = s.with_config(op, Config({"sample": 1}, (99,)))  # (the cluster has 8 GPUs)
    bad, _ = ACT.set_strategy(gpt2, bad_s, "set")
    with pytest.raises(ValidationError):
        SIM.workspace(bad)


def test_a_layout_on_1024_gpus_is_sized_by_its_symmetry_alone(monkeypatch):
    """GPT-3 175B, tp 8 x pp 16 on 1,024 GPUs: its one pipeline is within the explorer's cap,
    so the full estimate (every GPU's tasks, ~80 ms) is not made."""
    import engine.taskgraph.estimate as EST

    s = ST.new_state("gpt3-175b", "dgx-a100-80gb:128", sid=ST.new_sid())
    new, msg = _layout(s, tp=8, pp=16, micro_batch=1, recompute="full")
    assert msg.startswith("Layout"), msg

    def no_full(*a, **k):
        raise AssertionError("the full estimate was made")

    monkeypatch.setattr(EST, "estimate_tasks", no_full)
    SIM.check_size(SIM.graph_of(new), ST.page_strategy(new), cluster=SIM.cluster_of(new))


def test_a_plan_over_the_cap_even_with_its_symmetry_is_still_refused(gpt2, monkeypatch):
    new, _ = _layout(gpt2, tp=2, pp=2)
    monkeypatch.setattr(SIM, "APP_MAX_TASKS", 50)
    with pytest.raises(TooLargeError, match="one GPU per set of identical ones"):
        SIM.check_size(SIM.graph_of(new), ST.page_strategy(new), cluster=SIM.cluster_of(new))


def test_the_critical_chain_walked_beside_is_the_one_walked_in_line(gpt2):
    new, _ = _layout(gpt2, tp=2, pp=2)
    tl = SIM.workspace(new).timeline
    fresh = Timeline(tasks=tl.tasks, start_s=tl.start_s, end_s=tl.end_s, order=tl.order,
                     resource_pred=tl.resource_pred)
    SIM.paths_in_background(tl).join()
    assert "critical_tasks" in tl.__dict__ and "earliest_starts_s" in tl.__dict__
    assert np.array_equal(tl.critical_tasks, fresh.critical_tasks)
    assert np.array_equal(tl.earliest_starts_s, fresh.earliest_starts_s)
    assert tl.critical_tasks.size > 0


@pytest.mark.parametrize("model, cluster, form", [
    ("gpt2", "dgx-a100-80gb:1", {"tp": 2, "pp": 2, "flags": ["sequence_parallel"], "recompute": "selective"}),
    ("gpt2", "dgx-a100-80gb:1", {"tp": 2, "zero_stage": 1, "flags": ["fp8"], "overlap": []}),
    ("gpt2", "dgx-a100-80gb:2", {"kind": "fsdp"}),
    ("mixtral-8x7b", "dgx-h100:4", {"tp": 2, "ep": 8, "zero_stage": 1, "flags": ["sequence_parallel"]}),
])
def test_the_strategy_kept_for_a_layout_is_what_parsing_its_page_form_gives(model, cluster, form):
    """A layout's Strategy is kept for the page's form (not parsed again when drawn): it must be
    the one parsing that form gives, field for field."""
    from engine.formats import load_strategy

    s = ST.new_state(model, cluster, sid=ST.new_sid())
    new, msg = EV.on_event("layout-apply", s, layout={"kind": "megatron", **form})
    assert msg.startswith("Layout"), msg
    assert ST.page_strategy(new) == load_strategy(new["strategy"])
    for kind in ("data-parallel", "expert"):
        b, msg = EV.on_event("pick-baseline", s, baseline=kind)
        if b is not s:
            assert ST.page_strategy(b) == load_strategy(b["strategy"])
