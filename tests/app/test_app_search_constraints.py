"""Issue 44: the page's search takes constraints (exportable to a framework, fp8 allowed or the
model's precision, fixed tp / pp / ep, a memory headroom); a constrained search's adopted plan
exports. Callbacks called as plain functions (the search runs in a worker process)."""

from __future__ import annotations

import time

import pytest

from app import events as EV
from app import jobs
from app.tabs import export as EXPT
from app.tabs import search as SRCH
from app.state import new_state


def poll_until_done(state: dict, timeout: float = 300.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        _, status, disabled = SRCH.search_poll(state["sid"])
        if disabled:
            return status
        assert time.monotonic() < deadline, f"search still running after {timeout} s: {status}"
        time.sleep(0.05)


def test_the_boxes_become_options_and_bad_ones_are_named():
    assert SRCH.search_options("auto", None) == {"fp8": False}  # the model's precision unless fp8 is allowed
    got = SRCH.search_options("auto", {"exportable": "megatron", "fp8": True, "tp": 8, "pp": "", "ep": None,
                                       "headroom": 10})
    assert got == {"exportable": "megatron", "fp8": True, "tp": 8, "headroom": 0.1}
    assert SRCH.search_options("mcmc", {"exportable": "", "fp8": False}) == {}
    for algo, boxes, message in [
        ("auto", {"tp": 2.5}, "tp 2.5 must be a whole number from 1"),
        ("auto", {"pp": "x"}, "pp 'x' is not a whole number"),
        ("auto", {"headroom": 95}, "memory headroom 95 must be a whole number from 0 to 90"),
        ("auto", {"exportable": "nemo"}, "exportable to 'nemo': pick megatron, deepspeed or torchtitan"),
        ("mcmc", {"tp": 8}, "mcmc takes no constraints; use auto or layouts"),
    ]:
        with pytest.raises(ValueError, match=message):
            SRCH.search_options(algo, boxes)
    state = new_state("gpt2", "dgx-a100-80gb:1", batch=16)
    status, disabled = SRCH.search_start(state, "mcmc", "30", 0, {"tp": 8})
    assert disabled and status == "Search not started: mcmc takes no constraints; use auto or layouts (or clear them)"


def test_a_search_exportable_to_megatron_is_adopted_and_exported():
    state = new_state("gpt2", "dgx-a100-80gb:1", batch=16)
    status, disabled = SRCH.search_start(state, "auto", "100", 0, {"exportable": "megatron", "tp": 2})
    assert not disabled, status
    status = poll_until_done(state)
    assert status.startswith("auto finished: best "), status
    assert "constraints given: the layout search ran" in status
    adopted, msg = EV.on_event("search-adopt", state)
    assert msg.startswith("Adopted the search's best"), msg
    data, msg = EXPT.export_framework(adopted, "megatron")
    assert data is not None, msg
    assert "--tensor-model-parallel-size 2" in data["content"]
    assert jobs.get(state["sid"]).status == "finished"


def test_the_adopted_plan_fills_the_layout_panel():
    """Issue 44: after adopting a searched plan the Layout panel was empty; a plan that is a
    framework layout is shown as one, with where its flags come from."""
    from app.tabs import editor as ED
    from engine.search import ALGORITHMS, Budget
    from app.actions import set_strategy
    from app.sources import cluster_of, graph_of

    state = new_state("gpt2", "dgx-a100-80gb:1", batch=16)
    g, c = graph_of(state), cluster_of(state)
    r = ALGORITHMS["layouts"].run(g, c, Budget(iterations=100), options=__import__(
        "engine.search", fromlist=["LayoutOptions"]).LayoutOptions(tp=2, pp=2))
    adopted, _ = set_strategy(state, r.best, "adopted")
    v = ED.panel_values(adopted)
    assert v["kind"] == "megatron" and v["tp"] == 2 and v["pp"] == 2
    assert v["hint"].startswith("The plan shown (layouts) is the layout tp 2 · pp 2") and "Export tab" in v["hint"]
