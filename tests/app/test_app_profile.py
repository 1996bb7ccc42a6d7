"""Issue 27 item 4: the explorer reads a ``soapbox.profile/1`` table (the upload box), prices
the ops it measured from it, says so in the summary and marks each op's cost in the op panel;
detaching it returns to the roofline. Callbacks called as plain functions (no Dash server)."""

from __future__ import annotations

import base64
import json

import pytest

from app import events as EV
from app import uploads as UP
from app.profiles import ROOFLINE, op_cost_mark
from app.simulation import workspace
from app.sources import cluster_of, graph_of
from app.state import new_state, page_strategy
from app.tabs import explore as EXP
from engine.costs import ProfileTable
from engine.studies.profiling import needed_keys

#: made-up measured times (s): far from the roofline's, so the simulation shows them
FWD_S, BWD_S = 0.25, 0.5


def data_url(raw: bytes) -> str:
    return "data:application/json;base64," + base64.b64encode(raw).decode()


@pytest.fixture
def gpt2() -> dict:
    """GPT-2 at batch 8 on one DGX A100 (8 GPUs), data parallel, a session of its own."""
    return new_state("gpt2", "dgx-a100-80gb:1", batch=8)


def linear_table(state: dict) -> dict:
    """A profile table measuring only the linear ops' partitions of the state's strategy
    (made without a GPU, as tests/studies/test_profile.py makes them)."""
    g, c = graph_of(state), cluster_of(state)
    table = ProfileTable()
    for key in needed_keys(g, [page_strategy(state)], c):
        if key[0] == "linear":
            table.add(*key, FWD_S, BWD_S)
    assert len(table) > 0
    return table.to_dict()


def upload(state: dict, data, filename: str = "profile.json") -> tuple[dict, str]:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return EV.on_event("upload", state, upload=data_url(raw), filename=filename)


def selected(state: dict, op: str) -> dict:
    return {**state, "selected": [op]}


def op_panel_text(views: dict) -> str:
    return json.dumps(views["op-panel"].to_plotly_json(), default=str)


class TestAttach:
    def test_upload_attaches_the_table_and_prices_ops_from_it(self, gpt2):
        roofline_s = workspace(gpt2).timeline.makespan_s
        attached, msg = upload(gpt2, linear_table(gpt2))
        assert msg.startswith("Attached profile table profile.json (") and "A100-SXM4-80GB" in msg
        assert attached["profile"]["name"] == "profile.json" and len(attached["profile"]["upload"]) == 32
        assert attached["model"] == gpt2["model"] and attached["strategy"] == gpt2["strategy"]
        ws = workspace(attached)
        assert ws.profile is not None and ws.cost.profile is ws.profile
        # a quarter of a second per linear forward: the iteration is far longer than the roofline's
        assert ws.timeline.makespan_s > roofline_s + FWD_S

    def test_summary_says_how_many_ops_and_what_share_were_measured(self, gpt2):
        attached, _ = upload(gpt2, linear_table(gpt2))
        views = EXP.draw_explore(attached, False, "utilization")
        g = graph_of(gpt2)
        linears = sum(op.kind == "linear" for op in g.ops)
        ops = sum(op.kind != "input" for op in g.ops)
        note = views["profile-note"]
        assert note.startswith(f"Measured op costs: {linears:,} of {ops:,} ops priced from the profile table, ")
        share = float(note.split("table, ")[1].split("%")[0])
        assert 90 <= share <= 100  # (0.75 s a linear partition: nearly all the compute)
        assert note.endswith("the rest modelled (roofline).")

    def test_op_panel_marks_measured_and_modelled_ops(self, gpt2):
        attached, _ = upload(gpt2, linear_table(gpt2))
        g = graph_of(gpt2)
        lin = next(op.name for op in g.ops if op.kind == "linear")
        norm = next(op.name for op in g.ops if op.kind == "layernorm")
        ws = workspace(attached)
        assert op_cost_mark(ws, lin) == "measured (A100-SXM4-80GB)"
        assert op_cost_mark(ws, norm) == ROOFLINE
        text = op_panel_text(EXP.draw_explore(selected(attached, lin), False, "utilization"))
        assert "measured (A100-SXM4-80GB)" in text
        text = op_panel_text(EXP.draw_explore(selected(attached, norm), False, "utilization"))
        assert ROOFLINE in text and "measured (" not in text

    def test_without_a_table_every_op_is_modelled(self, gpt2):
        views = EXP.draw_explore(selected(gpt2, graph_of(gpt2).ops[1].name), False, "utilization")
        assert views["profile-note"].startswith("No profile table: op costs are modelled (roofline).")
        assert ROOFLINE in op_panel_text(views)

    def test_the_table_stays_with_a_new_cluster(self, gpt2):
        attached, _ = upload(gpt2, linear_table(gpt2))
        moved, _ = EV.on_event("pick-cluster", attached, cluster="p100-4x4")
        assert moved["profile"] == attached["profile"]
        # measured on A100s: no P100 op is priced from it
        assert "0 of" in EXP.draw_explore(moved, False, "utilization")["profile-note"]


class TestRefused:
    """A bad file is refused with its message, and the state is what it was."""

    def _refused(self, state: dict, data, filename: str = "p.json") -> str:
        before = json.dumps(state, sort_keys=True)
        new, msg = upload(state, data, filename)
        assert new is state and json.dumps(state, sort_keys=True) == before and "profile" not in new
        assert msg.startswith(f"Import refused: {filename}")
        return msg

    def test_malformed_json(self, gpt2):
        assert "invalid JSON" in self._refused(gpt2, b'{"format": "soapbox.profile/1", "entries": [')

    def test_wrong_schema(self, gpt2):
        data = linear_table(gpt2)
        data["entries"][0]["fwd_s"] = "fast"
        del data["entries"][1]["device_type"]
        msg = self._refused(gpt2, data)
        assert "entries[0].fwd_s" in msg and "entries[1]" in msg

    def test_empty_table(self, gpt2):
        msg = self._refused(gpt2, {"format": "soapbox.profile/1", "entries": []})
        assert "no entries" in msg or "entries" in msg

    def test_oversized(self, gpt2, monkeypatch):
        monkeypatch.setattr(UP, "MAX_UPLOAD_BYTES", 100)
        assert "larger than" in self._refused(gpt2, linear_table(gpt2))

    def test_a_bad_table_keeps_the_one_attached(self, gpt2):
        attached, _ = upload(gpt2, linear_table(gpt2))
        new, msg = upload(attached, {"format": "soapbox.profile/1", "entries": [{"kind": "linear"}]}, "bad.json")
        assert new is attached and msg.startswith("Import refused: bad.json")


class TestDetach:
    def test_detach_returns_to_the_roofline(self, gpt2):
        roofline = EXP.draw_explore(gpt2, False, "utilization")
        attached, _ = upload(gpt2, linear_table(gpt2))
        measured = EXP.draw_explore(attached, False, "utilization")
        assert measured["sum-time"] != roofline["sum-time"]
        detached, msg = EV.on_event("profile-detach", attached)
        assert msg == "Detached profile table profile.json: every op is priced by the roofline again."
        assert "profile" not in detached and detached["version"] > attached["version"]
        again = EXP.draw_explore(detached, False, "utilization")
        assert again["sum-time"] == roofline["sum-time"]
        assert workspace(detached).timeline.makespan_s == pytest.approx(workspace(gpt2).timeline.makespan_s)
        assert again["profile-note"].startswith("No profile table")

    def test_detach_without_a_table_changes_nothing(self, gpt2):
        state, msg = EV.on_event("profile-detach", gpt2)
        assert state is gpt2 and msg == "No profile table is attached."

    def test_another_session_cannot_draw_the_table(self, gpt2):
        attached, _ = upload(gpt2, linear_table(gpt2))
        other = new_state("gpt2", "dgx-a100-80gb:1", batch=8)
        stolen = {**other, "profile": attached["profile"]}
        with pytest.raises(ValueError, match="was not uploaded in this session"):
            workspace(stolen)
