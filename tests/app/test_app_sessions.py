"""Issue 24: what the server keeps and who may reach it — session ids the server issues, uploads
drawn for the session that made them only (even when their views are cached), the bounded
Sessions object and its eviction."""

from __future__ import annotations

import json

import pytest

from app import events as EV
from app import sessions as SES
from app import simulation as SIM
from app import sources as SRC
from app import state as ST
from app import uploads as UP
from app.tabs import compare as CMP
from app.tabs import explore as EXP
from engine.errors import ValidationError
from engine.formats import resolve_model


class TestSessionIds:
    def test_issued_ids_check_and_invented_ones_do_not(self):
        sid = ST.new_sid()
        assert len(sid) == 32 and ST.issued(sid)
        assert not ST.issued("0" * 32) and not ST.issued(sid[:-1] + ("0" if sid[-1] != "0" else "1"))
        assert not ST.issued(None) and not ST.issued(123) and not ST.issued("é" * 32)
        assert len({ST.new_sid() for _ in range(100)}) == 100

    def test_a_state_with_an_invented_id_is_refused_and_started_afresh(self, alex):
        crafted = dict(alex, sid="a" * 32)
        with pytest.raises(ValidationError, match="not started by this server"):
            ST.check_state(crafted)
        new, msg = EV.on_event("pick-baseline", crafted, baseline="expert")
        assert new["sid"] != crafted["sid"] and ST.issued(new["sid"]) and "starting afresh" in msg

    def test_ids_survive_a_new_sessions_object(self):
        """The key lives beside the store: a restarted server (a new Sessions) knows its ids."""
        sid = ST.new_sid()
        SES.reset()
        assert ST.issued(sid)


class TestUploadOwnership:
    def _upload(self, state):
        g = resolve_model("alexnet", batch=40)
        data = g.to_dict()
        data["name"] = "mine"
        new, msg, ok = UP.import_file(state, json.dumps(data), "mine.json")
        assert ok, msg
        return new

    def test_another_session_cannot_draw_an_upload_by_its_digest(self, alex):
        mine = self._upload(alex)
        assert EXP.render_explore(mine, True)["sum-time"]  # drawn (and cached) for its owner
        other = ST.new_state("alexnet")
        thief = dict(other, model=dict(mine["model"]), strategy=mine["strategy"])
        ST.check_state(thief)  # well formed, with an id the server issued: only ownership stops it
        with pytest.raises(ValueError, match="was not uploaded in this session"):
            EXP.render_explore(thief, True)
        with pytest.raises(ValueError, match="was not uploaded in this session"):
            SIM.workspace(thief)
        with pytest.raises(ValueError, match="was not uploaded in this session"):
            CMP.compared(thief, {"name": "x", "strategy": mine["strategy"]})
        assert ST.content_key(thief) != ST.content_key(mine)

    def test_the_owner_still_draws_it_from_the_cache(self, alex):
        mine = self._upload(alex)
        a = EXP.render_explore(mine, True)
        assert EXP.render_explore(mine, True) is a


class TestSessionsBounds:
    def test_workspaces_are_bounded_least_recent_first(self):
        s = SES.Sessions(max_sessions=2)
        for sid in ("a", "b", "c"):
            s.keep(sid, SIM.Workspace(None, None, None))
        assert list(s.workspaces) == ["b", "c"]
        s.workspace("b")  # used: now the most recent
        s.keep("d", SIM.Workspace(None, None, None))
        assert list(s.workspaces) == ["b", "d"]

    def test_evict_idle_and_forget(self):
        s = SES.Sessions()
        s.keep("a", SIM.Workspace(None, None, None))
        s.keep("b", SIM.Workspace(None, None, None))
        assert s.forget("a") and not s.forget("a")
        assert s.evict_idle(3600.0) == 1  # (the one forgotten)
        assert s.evict_idle(-1.0) == 1 and not s.workspaces

    def test_trim_drops_idle_cache_entries(self):
        s = SES.Sessions()
        s.drawn.put("k", 1)
        s.parsed.put("p", 2)
        assert s.trim(-1.0) == 2 and "k" not in s.drawn

    def test_a_cancelled_build_that_never_started_is_not_run(self):
        import threading

        s = SES.Sessions(build_workers=1)
        gate, ran = threading.Event(), []
        first = s.submit("a", "k1", lambda b: gate.wait(60))
        second = s.submit("b", "k2", lambda b: ran.append(1))
        assert s.cancel("b") and second.cancel.is_set()
        gate.set()
        first.future.result(timeout=60)
        assert ran == [] and second.future.cancelled()
        s.close()

    def test_one_build_per_session_and_state(self):
        import threading

        s = SES.Sessions(build_workers=1)
        gate = threading.Event()
        b1 = s.submit("a", "k", lambda b: gate.wait(60))
        assert s.submit("a", "k", lambda b: None) is b1  # the same state: taken up
        b2 = s.submit("a", "k2", lambda b: None)  # another state: the first is cancelled
        assert b2 is not b1 and b1.cancel.is_set()
        gate.set()
        s.close()


def test_the_default_sources_are_shared(alex):
    """Samples and presets resolve to one object per name (a workspace tells by identity that
    its model is still the state's)."""
    assert SRC.graph_of(alex) is SRC.graph_of(ST.new_state("alexnet"))
    assert SRC.cluster_of(alex) is SRC.preset_cluster("p100-4x4")
