"""Session state, simulation and actions of the explorer (app.state, app.simulation, app.actions,
app.links, app.uploads, app.fitscan), without Dash or a browser."""

from __future__ import annotations

import base64
import time
import json
import zlib

import pytest

from engine.errors import ValidationError
from engine.strategy.runs import compact_strategy_dict, devices_of_entry

from app import store
from engine.cluster import preset
from engine.formats import load_strategy, resolve_model
from engine.models import sample_names
from engine.sim.report import simulate_strategy
from engine.search.baselines import data_parallel, expert
from engine.strategy import strategy_from_dict
from app import actions as ACT
from app import events as EV
from app.tabs import explore as EXP
from app.tabs import export as EXPT
from app import fitscan as FIT
from app import links as LNK
from app.tabs import learn as LRN
from app import sessions as SES
from app import simulation as SIM
from app import sources as SRC
from app import state as ST
from app.tabs import timeline as TL
from app import uploads as UP
from dash import no_update

ALL16 = list(range(16))


def frozen(state: dict) -> str:
    return json.dumps(state, sort_keys=True)


def fresh_cost(state: dict) -> float:
    """Iteration time of the state's strategy simulated from scratch (no delta, no cache)."""
    g, c = SRC.graph_of(state), SRC.cluster_of(state)
    return simulate_strategy(g, strategy_from_dict(state["strategy"]), c).iteration_time_s




def link(payload) -> str:
    blob = base64.urlsafe_b64encode(zlib.compress(json.dumps(payload).encode())).decode().rstrip("=")
    return "?model=alexnet&cluster=p100-4x4&s=" + blob


class TestNewState:
    def test_default_is_inception_on_p100_data_parallel(self):
        s = ST.new_state()
        assert s["model"] == {"name": "inception_v3"}
        assert s["cluster"] == {"name": "p100-4x4"}
        assert s["baseline"] == "data-parallel"
        assert s["undo"] == [] and s["redo"] == [] and s["compare"] == [] and s["selected"] is None
        assert s["version"] == 0
        g = resolve_model("inception_v3")
        assert s["strategy"]["ops"] == compact_strategy_dict(data_parallel(g, preset("p100-4x4")).to_dict())["ops"]

    def test_state_is_json_serialisable(self, alex):
        assert json.loads(json.dumps(alex)) == alex

    def test_session_ids_are_distinct_unless_given(self):
        assert ST.new_state("alexnet")["sid"] != ST.new_state("alexnet")["sid"]
        assert ST.new_state("alexnet", sid="abc")["sid"] == "abc"

    def test_other_baseline(self, alexnet):
        g, c = alexnet
        s = ST.new_state("alexnet", baseline="expert")
        assert s["baseline"] == "expert"
        assert s["strategy"]["ops"] == compact_strategy_dict(expert(g, c).to_dict())["ops"]

    def test_unknown_model_names_the_samples(self):
        with pytest.raises(ValueError) as e:
            ST.new_state("no-such-model")
        msg = str(e.value)
        assert "no-such-model" in msg
        for name in sample_names():
            assert name in msg

    def test_unknown_cluster_names_the_presets(self):
        with pytest.raises(ValueError) as e:
            ST.new_state("alexnet", "no-such-cluster")
        msg = str(e.value)
        assert "no-such-cluster" in msg
        assert "p100-4x4" in msg and "k80-16x4" in msg

    def test_unknown_baseline(self):
        with pytest.raises(ValueError, match="nope"):
            ST.new_state("alexnet", baseline="nope")


class TestParseDevices:
    def test_ranges_and_singles(self):
        assert ACT.parse_devices("0-3, 8", 16) == [0, 1, 2, 3, 8]
        assert ACT.parse_devices("0-3, 8, 10-11", 16) == [0, 1, 2, 3, 8, 10, 11]
        assert ACT.parse_devices(" 5 ", 16) == [5]
        assert ACT.parse_devices("0;1", 16) == [0, 1]
        assert ACT.parse_devices("0-15", 16) == ALL16
        assert ACT.parse_devices("2-2,", 16) == [2]

    @pytest.mark.parametrize("text, part", [("a", "'a'"), ("0-3, x7", "'x7'"), ("3-1", "'3-1'"), ("0-x", "'0-x'"),
                                            ("1.5", "'1.5'")])
    def test_bad_part_is_named(self, text, part):
        with pytest.raises(ValueError) as e:
            ACT.parse_devices(text, 16)
        assert part in str(e.value)
        assert str(e.value).startswith("devices:")

    def test_nothing_given(self):
        with pytest.raises(ValueError, match="none given"):
            ACT.parse_devices(" , ", 16)

    @pytest.mark.parametrize("text, bad", [("16", "16"), ("0-20", "16"), ("3, 99", "99")])
    def test_missing_device_is_named(self, text, bad):
        with pytest.raises(ValueError) as e:
            ACT.parse_devices(text, 16)
        assert str(e.value) == f"devices: {bad} does not exist; this cluster has devices 0..15"


class TestApplyEdit:
    def test_valid_edit_changes_only_that_op(self, alex):
        before = frozen(alex)
        new, msg = ACT.apply_edit(alex, ["fc6"], {"feature": 4}, [0, 1, 2, 3])
        assert msg == "Changed fc6 to feature 4 on devices 0-3."
        assert frozen(alex) == before  # the argument is not mutated
        assert new is not alex
        assert new["strategy"]["ops"]["fc6"] == {"degrees": {"feature": 4}, "devices": "0-3"}
        changed = [op for op in alex["strategy"]["ops"] if new["strategy"]["ops"][op] != alex["strategy"]["ops"][op]]
        assert changed == ["fc6"]
        assert new["undo"] == [[{"op": "fc6", "before": {"degrees": {"sample": 16}, "devices": "0-15"},
                                 "after": {"degrees": {"feature": 4}, "devices": "0-3"}}]]
        assert new["redo"] == []
        assert new["version"] == alex["version"] + 1
        assert new["strategy"]["found_by"]["algorithm"] == "hand-edited"
        assert new["strategy"]["found_by"]["from"] == alex["strategy"]["found_by"]

    def test_degree_one_is_dropped(self, alex):
        new, _ = ACT.apply_edit(alex, ["fc6"], {"feature": 4, "sample": 1}, [0, 1, 2, 3])
        assert new["strategy"]["ops"]["fc6"]["degrees"] == {"feature": 4}

    def test_two_ops_one_undo_entry(self, alex):
        new, msg = ACT.apply_edit(alex, ["fc6", "fc7"], {"feature": 2}, [4, 5])
        assert msg == "Changed 2 ops to feature 2 on devices 4-5."
        assert len(new["undo"]) == 1 and [e["op"] for e in new["undo"][0]] == ["fc6", "fc7"]
        back, msg = ACT.undo(new)
        assert back["strategy"]["ops"] == alex["strategy"]["ops"]
        assert msg == "Undid the change to 2 ops."

    def test_second_edit_clears_redo(self, alex):
        s1, _ = ACT.apply_edit(alex, ["fc6"], {"feature": 4}, [0, 1, 2, 3])
        s0, _ = ACT.undo(s1)
        assert len(s0["redo"]) == 1
        s2, _ = ACT.apply_edit(s0, ["fc7"], {"feature": 2}, [0, 1])
        assert s2["redo"] == [] and len(s2["undo"]) == 1

    @pytest.mark.parametrize("ops, degrees, devices, expect", [
        (["fc8"], {"feature": 3}, [0, 1, 2], "ops.fc8.degrees.feature: 3 does not divide feature (1000)"),
        (["fc8"], {"feature": 4}, [0, 1], "ops.fc8.devices: 2 device(s) for 4 partition(s)"),
        (["fc6"], {"bogus": 2}, [0, 1], "ops.fc6.degrees.bogus"),
        (["fc6"], {"feature": 0}, [0], "ops.fc6.degrees.feature"),
        (["no_such_op"], {}, [0], "no_such_op: no such op in alexnet"),
    ])
    def test_invalid_edit_is_refused(self, alex, ops, degrees, devices, expect):
        before = frozen(alex)
        new, msg = ACT.apply_edit(alex, ops, degrees, devices)
        assert new is alex
        assert frozen(alex) == before
        assert msg.startswith("Edit refused")
        assert expect in msg

    def test_one_bad_op_refuses_all(self, alex):
        new, msg = ACT.apply_edit(alex, ["fc6", "fc8"], {"feature": 16}, ALL16)
        assert new is alex
        assert msg.startswith("Edit refused") and "fc8" in msg and "fc6" not in msg

    def test_no_ops(self, alex):
        new, msg = ACT.apply_edit(alex, [], {"feature": 2}, [0, 1])
        assert new is alex and msg.startswith("Select an op")

    def test_no_change(self, alex):
        new, msg = ACT.apply_edit(alex, ["fc6"], {"sample": 16}, ALL16)
        assert new is alex and msg.startswith("No change")


class TestUndoRedo:
    def test_undo_then_redo_restore_exactly(self, alex):
        s1, _ = ACT.apply_edit(alex, ["fc6"], {"feature": 4}, [0, 1, 2, 3])
        s2, _ = ACT.apply_edit(s1, ["conv1"], {"sample": 4}, [8, 9, 10, 11])
        f1, f2 = frozen(s1), frozen(s2)
        u1, msg = ACT.undo(s2)
        assert msg == "Undid the change to conv1."
        assert u1["strategy"]["ops"] == s1["strategy"]["ops"]
        u0, _ = ACT.undo(u1)
        assert u0["strategy"]["ops"] == alex["strategy"]["ops"]
        assert u0["undo"] == [] and len(u0["redo"]) == 2
        r1, msg = ACT.redo(u0)
        assert msg == "Redid the change to fc6."
        assert r1["strategy"]["ops"] == s1["strategy"]["ops"]
        r2, _ = ACT.redo(r1)
        assert r2["strategy"]["ops"] == s2["strategy"]["ops"]
        assert r2["undo"] == s2["undo"] and r2["redo"] == []
        assert frozen(s1) == f1 and frozen(s2) == f2  # nothing along the way mutated its argument
        assert [s["version"] for s in (s2, u1, u0, r1, r2)] == [2, 3, 4, 5, 6]

    def test_nothing_to_undo_or_redo(self, alex):
        assert ACT.undo(alex) == (alex, "Nothing to undo.")
        assert ACT.redo(alex) == (alex, "Nothing to redo.")


class TestWorkspace:
    def test_matches_a_fresh_simulation(self, alex):
        assert SIM.workspace(alex).timeline.makespan_s == fresh_cost(alex)

    def test_delta_path_after_edits_and_undos(self, alex):
        ws = SIM.workspace(alex)
        s, costs = alex, []
        steps = [("edit", ["fc6"], {"feature": 4}, [0, 1, 2, 3]),
                 ("edit", ["conv2"], {"sample": 8}, list(range(8))),
                 ("edit", ["fc7", "fc8"], {"sample": 2}, [4, 5]),
                 ("undo",), ("edit", ["conv5"], {"channel": 4}, [12, 13, 14, 15]), ("undo",), ("undo",), ("redo",)]
        for step in steps:
            if step[0] == "edit":
                s, msg = ACT.apply_edit(s, *step[1:])
                assert msg.startswith("Changed"), msg
            else:
                s, _ = getattr(ACT, step[0])(s)
            got = SIM.workspace(s)
            assert got is ws  # brought in line by delta simulation, not rebuilt
            assert got.timeline.makespan_s == fresh_cost(s)
            assert got.strategy.configs == strategy_from_dict(s["strategy"]).configs
            costs.append(got.timeline.makespan_s)
        assert len(set(costs)) > 2  # the edits did change the cost
        back, _ = ACT.undo(ACT.undo(s)[0])
        assert SIM.workspace(back).timeline.makespan_s == SIM.workspace(alex).timeline.makespan_s == fresh_cost(alex)

    def test_delta_path_on_inception(self):
        s = ST.new_state()
        ws = SIM.workspace(s)
        for op, deg, devs in [("Mixed_5b.branch1x1.conv", {"sample": 4}, [0, 1, 2, 3]),
                              ("fc", {"feature": 8}, list(range(8))),
                              ("Mixed_5b.branch5x5_1.conv", {"channel": 2}, [5, 9])]:
            s, msg = ACT.apply_edit(s, [op], deg, devs)
            assert msg.startswith("Changed"), msg
            assert SIM.workspace(s) is ws
            assert ws.timeline.makespan_s == fresh_cost(s)

    def test_few_changes_by_delta_many_by_rebuild(self, alex, alexnet):
        g, c = alexnet
        ws = SIM.workspace(alex)
        s, msg = ACT.select_baseline(alex, "expert")  # 3 ops differ from data parallel
        assert msg == "Strategy set to the expert baseline."
        assert SIM.workspace(s) is ws
        assert ws.timeline.makespan_s == simulate_strategy(g, expert(g, c), c).iteration_time_s
        s2, _ = ACT.select_baseline(s, "model-parallel")  # every op differs
        ws2 = SIM.workspace(s2)
        assert ws2 is not ws
        assert ws2.timeline.makespan_s == fresh_cost(s2)

    def test_sessions_are_separate(self, alexnet):
        a, b = ST.new_state("alexnet"), ST.new_state("alexnet")
        cost_b = SIM.workspace(b).timeline.makespan_s
        a1, _ = ACT.apply_edit(a, ["fc6"], {"feature": 4}, [0, 1, 2, 3])
        cost_a1 = SIM.workspace(a1).timeline.makespan_s
        assert cost_a1 != cost_b
        assert SIM.workspace(b).timeline.makespan_s == cost_b
        assert SIM.workspace(b) is not SIM.workspace(a1)
        assert SIM.workspace(b).strategy.configs == strategy_from_dict(b["strategy"]).configs

    def test_memory_follows_the_edit(self, alex):
        m0 = SIM.workspace(alex).memory.peak_bytes.copy()
        s1, _ = ACT.apply_edit(alex, ["fc6"], {"feature": 4}, [0, 1, 2, 3])
        m1 = SIM.workspace(s1).memory.peak_bytes
        assert (m0 != m1).any()


class TestImportFile:
    @pytest.mark.parametrize("text, what", [
        ("{bad", "invalid JSON"),
        ("", "empty file"),
        (json.dumps({"hello": 1}), "not a soapbox file"),
        ("[1, 2]", "not a soapbox file"),
        (json.dumps({"format": "other/1"}), "'other/1'"),
    ])
    def test_refused_files(self, alex, text, what):
        before = frozen(alex)
        new, msg, ok = UP.import_file(alex, text, "upload-1.json")
        assert ok is False and new is alex and frozen(alex) == before
        assert msg.startswith("upload-1.json: ")
        assert what in msg

    def test_malformed_json_names_the_file_once(self, alex):
        _, msg, _ = UP.import_file(alex, "{bad", "f.json")
        assert msg.count("f.json") == 1

    def test_strategy_for_another_model(self, alex):
        other = EXPT.strategy_export(ST.new_state("inception_v3"))
        new, msg, ok = UP.import_file(alex, json.dumps(other), "inception.json")
        assert ok is False and new is alex
        assert msg.startswith("inception.json: ")
        assert "inception_v3" in msg and "alexnet" in msg

    def test_strategy_that_does_not_fit_the_cluster(self, alex):
        exp = EXPT.strategy_export(alex)
        exp["ops"]["fc6"] = {"degrees": {"feature": 4}, "devices": [0, 1, 2, 99]}
        new, msg, ok = UP.import_file(alex, json.dumps(exp), "s.json")
        assert ok is False and new is alex and "ops.fc6.devices" in msg

    def test_strategy_round_trip(self, alex):
        edited, _ = ACT.apply_edit(alex, ["fc6"], {"feature": 4}, [0, 1, 2, 3])
        exported = EXPT.strategy_export(edited)
        assert exported["cost"]["iteration_time_s"] == SIM.workspace(edited).timeline.makespan_s
        assert exported["model"]["name"] == "alexnet" and exported["cluster"] == {"name": "p100-4x4", "devices": 16}
        new, msg, ok = UP.import_file(alex, json.dumps(exported), "mine.json")
        assert ok is True and msg == "Imported strategy from mine.json."
        assert new["strategy"]["ops"] == edited["strategy"]["ops"]
        assert SIM.workspace(new).timeline.makespan_s == exported["cost"]["iteration_time_s"]
        assert new["undo"] == [[{"op": "fc6", "before": alex["strategy"]["ops"]["fc6"],
                                 "after": edited["strategy"]["ops"]["fc6"]}]]
        back, _ = ACT.undo(new)
        assert back["strategy"]["ops"] == alex["strategy"]["ops"]

    def test_model_file(self, alex, alexnet):
        g, c = alexnet
        data = g.to_dict()
        data["name"] = "my-alexnet"
        new, msg, ok = UP.import_file(alex, json.dumps(data), "model.json")
        assert ok is True, msg
        assert msg.startswith("Loaded model my-alexnet (24 ops) from model.json")
        assert new["model"]["name"] == "my-alexnet" and set(new["model"]) == {"name", "upload"}
        # the content is kept in the store for this session only; the state names its digest
        assert store.current().get_upload(alex["sid"], new["model"]["upload"], "model") == data
        assert store.current().get_upload("0" * 32, new["model"]["upload"], "model") is None
        assert new["sid"] == alex["sid"] and new["undo"] == [] and new["baseline"] == "data-parallel"
        assert "data" not in alex["model"]
        ws = SIM.workspace(new)
        assert ws.graph.name == "my-alexnet"
        assert ws.timeline.makespan_s == simulate_strategy(g, data_parallel(g, c), c).iteration_time_s
        with pytest.raises(ValueError, match="cannot be shared"):
            LNK.share_query(new)

    def test_cluster_file(self, alex):
        c = preset("dgx-a100-80gb:1")
        new, msg, ok = UP.import_file(alex, json.dumps(c.to_dict()), "cluster.json")
        assert ok is True, msg
        assert "(8 GPUs)" in msg
        assert SRC.cluster_of(new).num_devices == 8
        assert len(devices_of_entry(new["strategy"]["ops"]["fc6"])) == 8


class TestShareLinks:
    def test_baseline_round_trip(self, alex):
        state, msg = LNK.state_from_query(LNK.share_query(alex))
        assert msg == "Loaded the shared strategy."
        assert state["strategy"]["ops"] == alex["strategy"]["ops"]
        assert state["sid"] != alex["sid"]

    def test_edited_round_trip(self, alex):
        s1, _ = ACT.apply_edit(alex, ["fc6"], {"feature": 4}, [0, 1, 2, 3])
        s2, _ = ACT.apply_edit(s1, ["conv1"], {"sample": 2}, [6, 7])
        s2, _ = ACT.apply_edit(s2, ["fc8", "loss"], {"sample": 4}, [12, 13, 14, 15])
        assert len(s2["undo"]) == 3
        q = LNK.share_query(s2)
        assert q.startswith("?model=alexnet&cluster=p100-4x4&s=")
        state, _ = LNK.state_from_query(q, sid="shared")
        assert state["sid"] == "shared"
        assert state["strategy"]["ops"] == s2["strategy"]["ops"]
        assert SIM.workspace(state).timeline.makespan_s == fresh_cost(s2)

    def test_other_baseline_round_trip(self, alex):
        s, _ = ACT.select_baseline(alex, "expert")
        s, _ = ACT.apply_edit(s, ["fc6"], {"feature": 2}, [0, 1])
        state, _ = LNK.state_from_query(LNK.share_query(s))
        assert state["baseline"] == "expert"
        assert state["strategy"]["ops"] == s["strategy"]["ops"]

    def test_no_strategy_part_gives_the_baseline(self):
        state, msg = LNK.state_from_query("?model=alexnet&cluster=p100-4x4")
        assert msg == "" and state["model"] == {"name": "alexnet"}

    @pytest.mark.parametrize("s", ["abc", "!!!", "eNqrVkpSslJKSSxJ1C1ILErMyUnNUdJRSlGyqq"])
    def test_damaged_link(self, s):
        with pytest.raises(ValueError, match="link"):
            LNK.state_from_query("?model=alexnet&cluster=p100-4x4&s=" + s)

    def test_truncated_link(self, alex):
        s1, _ = ACT.apply_edit(alex, ["fc6"], {"feature": 4}, [0, 1, 2, 3])
        with pytest.raises(ValueError, match="link"):
            LNK.state_from_query(LNK.share_query(s1)[:-6])

    def test_link_with_unknown_op(self):
        with pytest.raises(ValueError, match="link: op 'nope' is not in alexnet"):
            LNK.state_from_query(link({"b": "data-parallel", "d": {"nope": {"degrees": {}, "devices": [0]}}}))

    def test_link_with_invalid_config(self):
        with pytest.raises(ValueError, match="ops.fc6.degrees.feature"):
            LNK.state_from_query(link({"d": {"fc6": {"degrees": {"feature": 3}, "devices": [0, 1, 2]}}}))

    @pytest.mark.parametrize("payload", [[1], "x", {"d": []}, {"d": {"fc6": {"degrees": {}}}}])
    def test_link_with_wrong_shape(self, payload):
        with pytest.raises(ValueError, match="link"):
            LNK.state_from_query(link(payload))


class TestCompare:
    def test_add_keeps_cost_and_does_not_mutate(self, alex):
        before = frozen(alex)
        new, msg = ACT.add_to_compare(alex, "mine")
        assert msg == "Kept 'mine' for comparison (1 kept)."
        assert frozen(alex) == before and alex["compare"] == []
        assert new["compare"] == [{"name": "mine", "strategy": alex["strategy"],
                                   "cost_s": SIM.workspace(alex).timeline.makespan_s}]

    def test_default_name(self, alex):
        new, _ = ACT.add_to_compare(alex)
        assert new["compare"][0]["name"] == "#1 baseline:data-parallel"

    def test_refuses_duplicates(self, alex):
        s, _ = ACT.add_to_compare(alex, "x")
        for name in ("x", "  x  "):
            again, msg = ACT.add_to_compare(s, name)
            assert again is s and msg == "A compared strategy is already called 'x'."

    def test_at_most_six(self, alex):
        s = alex
        for i in range(6):
            s, msg = ACT.add_to_compare(s, f"s{i}")
            assert msg.startswith(f"Kept 's{i}'")
        assert len(s["compare"]) == 6
        again, msg = ACT.add_to_compare(s, "s6")
        assert again is s and msg.startswith("At most 6")


class TestBaselines:
    def test_baseline_cost(self, alex, alexnet):
        g, c = alexnet
        assert SIM.baseline_cost_s(alex) == simulate_strategy(g, data_parallel(g, c), c).iteration_time_s
        assert SIM.baseline_cost_s(alex, "expert") == simulate_strategy(g, expert(g, c), c).iteration_time_s

    def test_select_unknown_baseline(self, alex):
        new, msg = ACT.select_baseline(alex, "nope")
        assert new is alex and msg.startswith("Unknown baseline 'nope'")

    def test_select_baseline_is_undoable(self, alex):
        s, _ = ACT.select_baseline(alex, "expert")
        assert s["baseline"] == "expert" and len(s["undo"]) == 1
        back, _ = ACT.undo(s)
        assert back["strategy"]["ops"] == alex["strategy"]["ops"]

    def test_export_loads_against_the_model(self, alex, alexnet):
        g, c = alexnet
        exported = EXPT.strategy_export(alex)
        s = load_strategy(json.loads(json.dumps(exported)), g, c)
        assert simulate_strategy(g, s, c).iteration_time_s == exported["cost"]["iteration_time_s"]


class TestUploadLimits:
    def test_a_cluster_too_large_for_the_explorer_is_refused_and_nothing_is_lost(self, alex):
        import json as _json

        from engine.cluster import preset as _preset

        big = _json.dumps(_preset("dgx-a100-80gb:160").to_dict())  # 1,280 GPUs
        new, msg, ok = UP.import_file(alex, big, "big.json")
        assert not ok and new is alex
        assert "big.json" in msg and "1,280 devices" in msg and "soapbox simulate" in msg

    def test_a_model_too_large_for_the_explorer_is_refused(self, alex, monkeypatch):
        import json as _json

        from engine.formats import resolve_model as _resolve

        monkeypatch.setattr(SRC, "MAX_APP_OPS", 10)
        text = _json.dumps(_resolve("alexnet").to_dict())
        new, msg, ok = UP.import_file(alex, text, "alexnet.json")
        assert not ok and new is alex and "24 ops" in msg


class TestLayoutChangeChecksSizeOnce:
    """A layout change estimates the strategy's size once: where it is set (refused there when
    too large), not again when its views are drawn (~0.2 s on GPT-3 175B's 2,410 ops)."""

    def test_drawing_a_new_layout_does_not_repeat_the_size_check(self, monkeypatch):
        calls = []
        real = SIM.check_size

        def counted(*a, **k):
            calls.append(a[2] if len(a) > 2 else k.get("what"))
            return real(*a, **k)

        monkeypatch.setattr(SIM, "check_size", counted)
        monkeypatch.setattr(ACT, "check_size", counted)
        s = ST.new_state("gpt2", "dgx-a100-80gb:2", sid=ST.new_sid())
        new, msg = EV.on_event("layout-apply", s, layout={"kind": "megatron", "tp": 2, "pp": 2, "micro_batch": 1})
        assert msg.startswith("Layout"), msg
        assert len(calls) == 1
        assert new["undo"] == []  # (the settings changed: no op-by-op history to keep)
        ws = SIM.workspace(new)
        assert len(calls) == 1 and ws.timeline.makespan_s > 0
        # a state nobody checked (sent by a browser, say) is checked when drawn
        other = dict(new, sid=ST.new_sid(), strategy=dict(new["strategy"], cost={"x": 1}))
        SIM.workspace(other)
        assert len(calls) == 2
        SES.current().forget(new["sid"])
        SES.current().forget(other["sid"])


class TestTour:
    """Issue 16: the Learn tab's guided comparison sets up each step's model, cluster and
    strategies, and keeps them to compare."""

    def test_soap_step(self):
        s, msg = LRN.tour(None, "soap")
        assert s["model"]["name"] == "alexnet" and s["cluster"]["name"] == "p100-4x4"
        assert [c["name"] for c in s["compare"]] == ["data parallel", "model parallel", "expert"]
        assert s["baseline"] == "expert" and msg.startswith("Guided comparison 1 · ")
        ST.check_state(s)

    def test_pipeline_step_keeps_the_session(self, alex):
        s, msg = LRN.tour(alex, "pipeline")
        assert s["sid"] == alex["sid"] and s["model"] == {"name": "gpt2", "batch": 64}
        assert [c["strategy"]["pipeline"]["microbatches"] for c in s["compare"]] == [4, 32]
        assert s["strategy"]["pipeline"]["stages"] == 4 and s["undo"] == []

    def test_unknown_step(self, alex):
        s, msg = LRN.tour(alex, "nope")
        assert s is alex and msg.startswith("Unknown step 'nope'")


def _held_builds(monkeypatch, polls_cancel: bool = False):
    """Make every task-graph build wait for the returned event (set it to let them go). With
    ``polls_cancel`` a waiting build ends with Cancelled once its cancel event is set, as the
    engine's loops do; the list it returns with the event gets each build's cancel argument."""
    import threading

    import engine.sim.report as R
    import engine.taskgraph as T
    from engine.errors import Cancelled

    gate, real, seen = threading.Event(), T.build_task_graph, []

    def held(*a, cancel=None, **kw):
        seen.append(cancel)
        deadline = time.monotonic() + 120  # (a test that fails before it lets go leaves no thread behind)
        while not gate.wait(0.01) and time.monotonic() < deadline:
            if polls_cancel and cancel is not None and cancel.is_set():
                raise Cancelled("stopped")
        return real(*a, **kw)

    monkeypatch.setattr(T, "build_task_graph", held)
    monkeypatch.setattr(R, "build_task_graph", held)
    return gate, seen


class TestBackgroundSimulation:
    """Issue 16: no click waits more than a moment for a simulation; a long one goes on off the
    request path, says how far it is, can be left (Cancel goes back), and one the explorer could
    not hold is refused before it starts."""

    def test_a_slow_build_answers_none_then_stops_on_cancel(self, monkeypatch):
        """Cancel stops the build (its engine loop sees the cancel event and ends with
        Cancelled), not merely forgets it; asked again, the state is built anew."""
        from engine.errors import Cancelled

        s = ST.new_state("alexnet", batch=48)  # (a batch no other test draws: nothing cached)
        assert EXP.render_explore(s, True, wait_s=SIM.MAX_WAIT_S) is not None  # drawn: what Cancel goes back to
        gate, saw = _held_builds(monkeypatch, polls_cancel=True)
        s2, msg = EV.on_event("pick-batch", s, batch=40)  # another graph: a full build
        assert msg.startswith("Batch: 40"), msg
        assert SIM.workspace_within(s2, 0.05) is None and EXP.render_explore(s2, True, wait_s=0.05) is None
        deadline = time.monotonic() + 60
        while not saw and time.monotonic() < deadline:
            time.sleep(0.01)
        assert saw and saw[0] is not None  # the build runs, with a cancel event
        st = SIM.build_status(s2)
        assert st is not None and st["elapsed_s"] >= 0.0 and st["phase"]
        assert EXP.sim_status_text(s2).startswith("Simulating off the page: ")
        build = SES.current().build(s2["sid"])
        back, msg = EXP.cancel_simulation(s2)
        assert msg.startswith("Went back to the strategy shown before") and "stopped" in msg
        assert back["strategy"] == s["strategy"] and back["version"] == s2["version"] + 1
        assert SIM.build_status(s2) is None
        with pytest.raises(Cancelled):  # it stopped: no workspace was made
            build.future.result(timeout=60)
        deadline = time.monotonic() + 60
        while SES.current().running() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert SES.current().running() == 0  # its thread is idle
        gate.set()
        ws = SIM.workspace(s2)  # asked again: built anew
        assert ws.strategy.configs == ST.page_strategy(s2).configs
        assert EXP.render_explore(s2, True, wait_s=SIM.MAX_WAIT_S)["sum-time"]
        SES.current().forget(s["sid"])

    def test_a_superseded_build_stops(self, monkeypatch):
        """A session that moves on (another state) cancels its previous build."""
        from concurrent.futures import CancelledError

        from engine.errors import Cancelled

        gate, _ = _held_builds(monkeypatch, polls_cancel=True)
        a = ST.new_state("alexnet", batch=20)
        assert SIM.workspace_within(a, 0.0) is None
        first = SES.current().build(a["sid"])
        b = EV.on_event("pick-batch", a, batch=36)[0]
        assert SIM.workspace_within(b, 0.0) is None
        with pytest.raises((Cancelled, CancelledError)):  # stopped in its loop, or never started
            first.future.result(timeout=60)
        gate.set()
        assert SIM.workspace(b).graph.batch_size == 36
        SES.current().forget(a["sid"])

    def test_the_queue_of_builds_is_bounded(self, monkeypatch):
        """Past the server's bound, a new background build is refused with a message (not queued)."""
        gate, _ = _held_builds(monkeypatch)
        sessions = SES.reset(SES.Sessions(max_queued_builds=2, build_workers=1))
        try:
            states = [ST.new_state("alexnet", batch=b) for b in (52, 56, 60)]
            assert SIM.workspace_within(states[0], 0.0) is None
            assert SIM.workspace_within(states[1], 0.0) is None
            with pytest.raises(SES.Busy, match="the server is simulating 2 strategies"):
                SIM.workspace_within(states[2], 0.0)
        finally:
            gate.set()
            SES.reset()
        assert sessions is not SES.current()

    def test_too_large_refused_before_it_starts(self):
        s = ST.new_state("gpt3-175b", "dgx-a100-80gb:128")
        new, msg = ACT.select_baseline(s, "expert")
        assert new is s and msg.startswith("Not set: it has no exact symmetry: its simulation would take ")
        assert msg.split(" would take ")[1].split()[0] in ("about", "over")  # (over: where the estimate stopped)
        assert f"more than the explorer simulates ({SRC.APP_MAX_TASKS:,})" in msg and "soapbox simulate" in msg

    def test_a_hand_edit_of_a_huge_symmetric_plan_is_refused(self):
        s = ST.new_state("gpt3-175b", "dgx-a100-80gb:128")
        s, msg = ACT.apply_layout(s, "megatron", {"tp": 8, "pp": 16, "micro_batch": 1})
        assert msg.startswith("Layout (megatron)"), msg
        op = next(iter(s["strategy"]["ops"]))
        new, msg = ACT.apply_edit(s, [op], {}, [0])
        assert new is s and msg.startswith("Edit refused: a hand edit needs the full simulation (no symmetry)")
        SES.current().forget(s["sid"])


class TestSmallestCluster:
    def test_scan_in_the_background_for_the_layout(self):
        import time as _time

        s = ST.new_state("llama2-7b", "dgx-a100-80gb:8")
        s, msg = ACT.apply_layout(s, "megatron", {"tp": 8, "pp": 2, "micro_batch": 1})
        assert FIT.fit_status(s) is None
        assert FIT.fit_start(s).startswith("Looking for the smallest cluster for megatron (tp 8, pp 2")
        t = _time.monotonic()
        while not (st := FIT.fit_status(s))[1]:
            assert _time.monotonic() - t < 600, "the scan never ended"  # (a hang guard, not a speed limit)
            _time.sleep(0.1)
        text = st[0]
        assert "dgx-a100-80gb:2 (16 GPUs) fits, peak " in text and "Tried: dgx-a100-80gb:1: " in text, text
        # another state: no scan shown for it
        assert FIT.fit_status(ACT.select_baseline(s, "fsdp")[0]) is None

    def test_sizes_sure_not_to_fit_are_said_without_a_simulation(self):
        """GPT-3 175B with tp 8 and no pipeline or ZeRO: every GPU holds an eighth of the model's
        weights, gradients and Adam state, over 80 GB at every size; each size is refused by its
        memory floor (engine.sim.memory_floor), not simulated, and the page says so."""
        import time as _time

        s = ST.new_state("gpt3-175b", "dgx-a100-80gb:8")
        s, msg = ACT.apply_layout(s, "megatron", {"tp": 8, "pp": 1, "micro_batch": 1})
        assert msg.startswith("Layout (megatron)"), msg
        FIT.fit_start(s)
        t = _time.monotonic()
        while not (st := FIT.fit_status(s))[1]:
            assert _time.monotonic() - t < 600, "the scan never ended"  # (a hang guard, not a speed limit)
            _time.sleep(0.1)
        text = st[0]
        assert "none of this family's sizes up to 1,024 GPUs fits" in text, text
        assert "Tried: dgx-a100-80gb:1 (8 GPUs): at least " in text and "GB, over" in text, text
        SES.current().forget(s["sid"])

    def test_refusals_name_what_to_do(self, alex):
        assert FIT.fit_start(alex).startswith("p100-4x4 has no sizes to try")
        s = ST.new_state("alexnet", "dgx-a100-80gb:2")
        edited, _ = ACT.apply_edit(s, ["fc6"], {"feature": 2}, [0, 1])
        assert FIT.fit_start(edited).startswith("This strategy was edited by hand or found by a search")
        assert SRC.family_sizes("dgx-a100-80gb:8")[-1] == "dgx-a100-80gb:128" and SRC.family_sizes("p100-4x4") == []


class TestReviewRegressions:
    """Bugs found in review of the issue-16 explorer work, each pinned."""

    def test_device_runs_cannot_make_a_small_state_list_millions(self):
        import tracemalloc

        s = ST.new_state("alexnet")
        ops = dict(s["strategy"]["ops"])
        for i in range(300):
            ops[f"x{i}"] = {"degrees": {}, "devices": "0-1023"}
        ops["fc6"] = {"degrees": {}, "devices": "0-16383"}  # more than the explorer's 1,024 GPUs
        bad = {**s, "strategy": {**s["strategy"], "ops": ops}}
        tracemalloc.start()
        try:
            with pytest.raises(ValidationError, match=r"ops\.fc6\.devices: device runs stand for 16,384 devices"):
                ST.page_strategy(bad)
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < 20e6, peak
        from engine.strategy.runs import check_runs

        assert check_runs({"a": {"devices": "0-9"}, "b": {"devices": "0-9"}}, limit=15) == [
            ("ops.b.devices", "the strategy's device runs stand for more than 15 device ids")]

    def test_a_symmetric_plan_with_too_many_microbatches_is_refused(self):
        s = ST.new_state("gpt2", "dgx-a100-80gb:1", batch=131072)
        new, msg = ACT.apply_layout(s, "megatron", {"pp": 4, "micro_batch": 1})
        assert new is s and msg.startswith("Not set: its simulation, one GPU per set of identical ones, would take")
        assert s["baseline"] == "data-parallel"  # (a refused layout changes nothing, the baseline neither)

    def test_the_same_strategy_under_a_new_version_is_not_rebuilt(self):
        s = ST.new_state("llama2-7b", "dgx-a100-80gb:8")
        s, _ = ACT.apply_layout(s, "megatron", {"tp": 8, "pp": 2, "micro_batch": 1})
        ws = SIM.workspace(s)
        assert ws.sim is None  # symmetric
        again = dict(s, version=s["version"] + 5)
        assert SIM.workspace(again) is ws and ws.sim is None and ws.version == again["version"]
        SES.current().forget(s["sid"])

    def test_a_build_cancelled_by_one_session_is_not_taken_by_another(self, monkeypatch):
        gate, _ = _held_builds(monkeypatch)
        a = ST.new_state("alexnet", batch=24)
        b = dict(a, sid=ST.new_sid())
        assert SIM.workspace_within(a, 0.0) is None
        first = SES.current().build(a["sid"])
        assert SIM.cancel_build(a["sid"]) is True
        assert SIM.workspace_within(b, 0.0) is None  # its own build
        assert SES.current().build(b["sid"]) is not first
        gate.set()
        wa, wb = SIM.workspace(a), SIM.workspace(b)
        assert wa is not wb
        t0 = time.monotonic()
        while SES.current().build(b["sid"]) is not None and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        assert SIM.build_status(b) is None
        SES.current().forget(a["sid"]), SES.current().forget(b["sid"])

    def test_a_smallest_cluster_scan_carries_only_what_the_user_set(self):
        s = ST.new_state("llama2-7b", "dgx-a100-80gb:2")
        s, _ = ACT.apply_layout(s, "megatron", {"tp": 8})  # micro-batch left empty: the builder's, per size
        kind, opts, text = FIT.layout_of(ST.page_strategy(s))
        assert kind == "megatron" and opts == {"tp": 8} and text == "megatron (tp 8)"

    def test_stage_and_node_filters_work_on_per_gpu_rows(self):
        import plotly.graph_objects as go

        s, _ = LRN.tour(None, "pipeline")  # GPT-2, pp 4 on one DGX: 8 GPUs, 2 per stage
        fig, notes = TL.zoom_gantt(s, None, {"rows": "gpu", "filter": "stage 1"}, trigger="gantt-filter")
        ticks = list(go.Figure(fig).layout.yaxis.ticktext)
        assert ticks[0].startswith("GPU 2") and "No row matches" not in notes
        fig, notes = TL.zoom_gantt(s, None, {"rows": "gpu", "filter": "stage 9"}, trigger="gantt-filter")
        assert notes.startswith("No row matches the filter.") and "0 GPU rows" not in notes
        assert TL.zoom_gantt(s, {"xaxis.range": [0, float("inf")]}) == (no_update, no_update)

    def test_a_late_timeline_redraw_for_another_state_draws_nothing(self):
        """CI, 2026-11-28: the guided step's row option redrew the timeline for the state the
        page still had, and that answer, arriving after the new state's views, left the dense
        model's timeline under Mixtral's cards. A redraw is for the state last drawn only."""
        old = ST.new_state("alexnet", batch=24)
        EXP.render_explore(old)  # the page shows it
        new, _ = EV.on_event("pick-batch", old, batch=48)
        assert new["version"] > old["version"]
        EXP.render_explore(new)  # the edit's views
        opts = {"rows": "gpu"}
        assert TL.zoom_gantt(old, None, opts, trigger="gantt-rows") == (no_update, no_update)
        fig, notes = TL.zoom_gantt(new, None, opts, trigger="gantt-rows")
        assert isinstance(fig, dict) and fig["data"] and isinstance(notes, str)
        newer, _ = EV.on_event("pick-batch", new, batch=96)  # not drawn yet: the views draw it
        assert TL.zoom_gantt(newer, None, opts, trigger="gantt-rows") == (no_update, no_update)
        SES.current().forget(old["sid"])


def test_an_edits_remembered_strategy_is_what_its_page_form_parses_to():
    """Issue 45 (edit -> figures under load): an edit keeps the Strategy it made as the parse of
    its page form (:func:`app.state.remember_strategy`); it must be exactly what parsing gives."""
    import random

    from engine.formats import load_strategy

    s = ST.new_state("inception_v3", "p100-4x4")
    g = SRC.graph_of(s)
    rng = random.Random(7)
    for _ in range(12):
        op = rng.choice(g.ops)
        dims = [d for d in op.dim_names if d in ("sample", "channel")][:1]
        degrees = {d: rng.choice([1, 2, 4]) for d in dims}
        n = 1
        for v in degrees.values():
            n *= v
        new, msg = EV.on_event("edit-apply", s, ops=[op.name], degrees=degrees,
                               devices=rng.sample(range(16), n))
        if new is s:
            continue
        assert ST.page_strategy(new) == load_strategy(new["strategy"]), msg
        s = new
