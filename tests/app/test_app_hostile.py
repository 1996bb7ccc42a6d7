"""The explorer's server against crafted requests, bad links and oversized input (issue 10).

The rule under test: a name that came from a request resolves only to a sample model, a
cluster preset or content this session uploaded; nothing a client sends makes the server open
a path, inflate without bound, build a huge cluster, or lose the session's state.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
import zlib
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import store
from engine.formats import resolve_model
from app import actions as ACT
from app.tabs import compare as CMP
from app import events as EV
from app.tabs import explore as EXP
from app import links as LNK
from app import sessions as SES
from app import simulation as SIM
from app import sources as SRC
from app import state as ST
from app.tabs import timeline as TL
from app import uploads as UP
from app import warmup as WU

# --------------------------------------------------------------------------- who opens what

_opened: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


@contextmanager
def files_opened():
    """Every path opened by this process inside the block (Python's ``open`` audit event)."""
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


def _link(payload: bytes) -> str:
    return "?s=" + base64.urlsafe_b64encode(payload).decode().rstrip("=")


# --------------------------------------------------------------------------- names and paths


class TestNamesNeverOpenPaths:
    @pytest.mark.parametrize("name", ["/etc/hostname", "../../etc/passwd.json", "/dev/zero", "model.json",
                                      "alexnet/../../x", "C:\\windows\\x.json"])
    def test_a_model_name_in_the_state_is_refused_without_opening_it(self, alex, name):
        crafted = dict(alex, model={"name": name})
        with files_opened() as opened:
            new, msg = EV.on_event("pick-baseline", crafted, baseline="expert")
            render = None
            with pytest.raises(ValueError, match="unknown sample model"):
                render = SRC.graph_of(crafted)
        assert render is None and new is crafted
        assert f"unknown sample model {name!r}" in msg
        assert not [p for p in opened if name in p or p.startswith(("/etc", "/dev"))], opened

    def test_a_fifo_named_by_a_request_is_never_opened(self, alex, tmp_path):
        fifo = tmp_path / "model.json"
        os.mkfifo(fifo)
        done = []

        def attempt():
            done.append(EV.on_event("pick-baseline", dict(alex, model={"name": str(fifo)}), baseline="expert"))

        t = threading.Thread(target=attempt, daemon=True)
        t.start()
        t.join(20)
        assert done, "the server blocked on a FIFO named in a request"
        assert "unknown sample model" in done[0][1]

    @pytest.mark.parametrize("name", ["/etc/hostname", "x.json", "dgx-h100:100000000", "dgx-a100-80gb:129",
                                      "p100-4x4:2", "hetero-demo:" + "9" * 400])
    def test_a_cluster_name_is_a_preset_within_the_explorer_s_size(self, alex, name, monkeypatch):
        from engine.cluster import Cluster

        built, init = [], Cluster.__init__  # the size of every cluster built meanwhile

        def counting(self, *a, **kw):
            init(self, *a, **kw)
            built.append(self.num_devices)

        monkeypatch.setattr(Cluster, "__init__", counting)
        with files_opened() as opened:
            new, msg = EV.on_event("pick-cluster", alex, cluster=name)
        assert all(n <= SRC.MAX_APP_DEVICES for n in built), built  # refused before it was built
        assert new is alex and msg.startswith("That did not work: ValueError: ")
        assert "unknown cluster" in msg or "more than the explorer simulates" in msg or "fixed size" in msg
        assert not [p for p in opened if p.startswith(("/etc", "/dev")) or p.endswith("x.json")]

    def test_an_upload_of_another_session_cannot_be_named(self, alex):
        m = resolve_model("alexnet").to_dict()
        m["name"] = "mine"
        mine, _, ok = UP.import_file(alex, json.dumps(m), "m.json")
        assert ok
        other = ST.new_state("alexnet")
        crafted = dict(other, model=mine["model"], strategy=mine["strategy"])
        with pytest.raises(ValueError, match="was not uploaded in this session"):
            SRC.graph_of(crafted)
        _, msg = EV.on_event("pick-baseline", crafted, baseline="expert")
        assert "was not uploaded in this session" in msg
        assert SRC.graph_of(mine).name == "mine"  # its owner still has it


class TestCraftedStates:
    @pytest.mark.parametrize("mutate", [
        lambda s: {**s, "sid": "../../etc"},
        lambda s: {**s, "model": {"name": "alexnet", "data": {"format": "soapbox.model/1"}}},  # an older soapbox's
        lambda s: {**s, "undo": [[{"op": "fc6"}]]},
        lambda s: {**s, "compare": [{"name": "x", "strategy": {}}] * 7},
        lambda s: {**s, "version": 10**30},
        lambda s: {**s, "selected": [1, 2]},
        lambda s: {**s, "strategy": "yes"},
        lambda s: {k: v for k, v in s.items() if k != "cluster"},
        lambda s: {**s, "model": {"name": "\ud800"}},
    ])
    def test_the_session_starts_afresh_with_a_message(self, alex, mutate):
        new, msg = EV.on_event("undo", mutate(alex))
        assert msg.startswith("The page's saved state could not be used (the page's state: ")
        ST.check_state(new)
        assert new["model"] == {"name": SRC.DEFAULT_MODEL}

    def test_the_same_content_is_checked_once_and_a_bad_one_every_time(self, alex, monkeypatch):
        calls = []
        real = json.dumps
        monkeypatch.setattr(json, "dumps", lambda x, **kw: (calls.append(1) if kw.get("allow_nan") is False else None,
                                                            real(x, **kw))[1])
        fresh = {**alex, "version": alex["version"] + 12_345}
        ST.check_state(fresh)
        ST.check_state(json.loads(json.dumps(fresh)))  # (another object, the same content)
        assert len(calls) == 1
        for bad in ({**fresh, "selected": [1, 2]}, {**fresh, "version": float("nan")}, {**fresh, "x": {1, 2}}):
            for _ in range(2):
                with pytest.raises(ValueError, match="the page's state"):
                    ST.check_state(bad)

    def test_a_strategy_that_does_not_fit_the_model_is_refused_by_name(self, alex):
        bad = json.loads(json.dumps(alex))
        bad["strategy"]["ops"]["fc6"]["devices"] = [99]
        bad["version"] += 1
        with pytest.raises(ValueError, match="fc6"):
            EXP.render_explore(bad)

    def test_an_undo_stack_is_bounded(self, alex):
        s = alex
        for k in range(ST.MAX_HISTORY + 5):
            s, _ = EV.on_event("edit-apply", s, ops=["fc6"], degrees={"sample": 2 if k % 2 else 4},
                              devices="0-1" if k % 2 else "0-3")
        assert len(s["undo"]) == ST.MAX_HISTORY
        ST.check_state(s)


class TestShareLinks:
    def test_a_zip_bomb_is_refused_while_inflating(self):
        bomb = zlib.compress(b"[" * 10 + b"0" * (150 * 2**20), 9)  # 153 KB, 150 MiB inflated
        inflated, real = [], zlib.decompressobj  # bytes out of every inflate call

        class Counting:
            def __init__(self, *a):
                self._d = real(*a)

            def __getattr__(self, name):
                return getattr(self._d, name)

            def decompress(self, data, max_length=0):
                out = self._d.decompress(data, max_length)
                inflated.append(len(out))
                return out

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(zlib, "decompressobj", Counting)
            with pytest.raises(ValueError, match="inflates to more than 8 MiB"):
                LNK.state_from_query(_link(bomb))
        assert inflated and sum(inflated) <= LNK.MAX_LINK_INFLATED_BYTES  # stopped at 8 MiB, not 150

    def test_a_too_long_link_is_refused_before_decoding(self):
        with pytest.raises(ValueError, match="longer than a soapbox share link"):
            LNK.state_from_query("?s=" + "A" * (LNK.MAX_LINK_CHARS + 1))

    @pytest.mark.parametrize("payload, what", [
        (b"[" * 5000 + b"]" * 5000, "nested more than"),
        (json.dumps({"b": "data-parallel", "d": {"fc6": {"devices": [5.5]}}}).encode(), "fc6"),
        (json.dumps({"b": "nope"}).encode(), "nope"),
        (json.dumps([1, 2]).encode(), "not a soapbox share"),
        (b'"\\ud800"', "link"),
        (json.dumps({"s": {"format": "soapbox.strategy/1", "ops": {"fc6": {"devices": [10**30]}}}}).encode(), "link"),
    ])
    def test_damaged_links_say_what(self, payload, what):
        with pytest.raises(ValueError, match="link") as e:
            LNK.state_from_query("?model=alexnet&cluster=p100-4x4&" + _link(zlib.compress(payload))[1:])
        assert what in str(e.value)

    def test_a_damaged_link_still_opens_the_default(self):
        state, msg = EV.on_event("url", None, query="?model=/etc/hostname")
        assert state["model"] == {"name": SRC.DEFAULT_MODEL} and "could not be loaded" in msg

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(query=st.one_of(
        st.text(max_size=300),
        st.builds(lambda m, c, s: f"?model={m}&cluster={c}&s={s}",
                  st.sampled_from(["alexnet", "nope", "", "/etc/hostname", "gpt2"]),
                  st.sampled_from(["p100-4x4", "dgx-h100:2", "dgx-h100:99999999", "x", ""]),
                  st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=", max_size=200)),
        st.builds(lambda obj: "?model=alexnet&s=" + base64.urlsafe_b64encode(
            zlib.compress(json.dumps(obj).encode())).decode(),
            st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
                         lambda ch: st.one_of(st.lists(ch, max_size=4),
                                              st.dictionaries(st.sampled_from(["b", "d", "s", "fc6", "devices",
                                                                               "degrees", "sample", "format", "ops"]),
                                                              ch, max_size=4)), max_leaves=20))))
    def test_fuzzed_links_end_in_a_valid_state_and_words(self, query):
        state, msg = EV.on_event("url", None, query=query)
        ST.check_state(state)
        assert isinstance(msg, str)


class TestUploads:
    def test_a_huge_model_is_refused_before_it_is_loaded(self, alex):
        m = resolve_model("alexnet").to_dict()
        op = m["ops"][-1]
        m["ops"] = m["ops"] + [dict(op, name=f"x{k}") for k in range(60_001)]
        text = json.dumps(m)
        loaded = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(UP, "load_model", lambda *a, **kw: loaded.append(a))
            new, msg, ok = UP.import_file(alex, text, "huge.json")
        assert not ok and new is alex and "more than the explorer simulates" in msg
        assert loaded == []  # parsing only: no schema check, no build

    def test_a_cluster_with_a_huge_repeat_is_refused_at_once(self, alex):
        c = {"format": "soapbox.cluster/1", "name": "x", "nodes": [{"name": "n", "gpus": 8, "device_type": "A100-80GB",
                                                                     "repeat": 10**8}]}
        loaded = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(UP, "load_cluster", lambda *a, **kw: loaded.append(a))
            new, msg, ok = UP.import_file(alex, json.dumps(c), "c.json")
        assert not ok and new is alex and "800,000,000 devices" in msg
        assert loaded == []  # refused from the file's numbers: no node expanded, no schema check

    def test_a_deep_file_is_refused_with_where(self, alex):
        new, msg, ok = UP.import_file(alex, "[" * 2000 + "]" * 2000, "deep.json")
        assert not ok and new is alex and "deep.json" in msg and "nested" in msg


# --------------------------------------------------------------------------- the HTTP server


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from app import create_app

    app = create_app(data_dir=tmp_path_factory.mktemp("hostile-data"))
    return app.server.test_client()


class TestServer:
    def test_a_request_over_the_size_limit_is_refused_unread(self, client):
        from app import MAX_REQUEST_BYTES

        r = client.post("/_dash-update-component", data=b" " * (MAX_REQUEST_BYTES + 1),
                        content_type="application/json")
        assert r.status_code == 413

    def test_a_deeply_nested_request_is_refused_before_parsing(self, client):
        r = client.post("/_dash-update-component", data=b"[" * 100_000 + b"]" * 100_000,
                        content_type="application/json")
        assert r.status_code == 400 and b"nested deeper" in r.data

    @pytest.mark.parametrize("body, says", [(b"{not json", b"not JSON"), (b"null", b"not a JSON object"),
                                            (b"[1, 2]", b"not a JSON object"),
                                            (b'{"output": 3}', b"is not text")])
    def test_a_malformed_envelope_is_refused_with_what(self, client, body, says):
        r = client.post("/_dash-update-component", data=body, content_type="application/json")
        assert r.status_code == 400 and says in r.data

    @pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b'"\\ud800"'])
    def test_nan_in_a_request_is_not_json(self, client, token):
        body = b'{"output": "x.children", "outputs": {"id": "x", "property": "children"}, "inputs": [{"id": "s", ' \
               b'"property": "data", "value": {"v": ' + token + b'}}], "changedPropIds": []}'
        r = client.post("/_dash-update-component", data=body, content_type="application/json")
        assert r.status_code == 400 and b"not JSON" in r.data and b"column" in r.data  # (where: orjson's place)

    @pytest.mark.parametrize("output", ["nowhere.children", "sid.data"])  # (sid.data: a callback run in the browser)
    def test_a_request_for_no_server_callback_is_refused_by_name(self, client, output):
        i, p = output.split(".")
        body = {"output": output, "outputs": {"id": i, "property": p},
                "inputs": [{"id": "state", "property": "data", "value": None}], "changedPropIds": []}
        r = client.post("/_dash-update-component", data=json.dumps(body), content_type="application/json")
        assert r.status_code == 400 and b"no callback on the server writes" in r.data and output.encode() in r.data

    def test_a_callback_body_is_parsed_once(self, client, monkeypatch):
        """The envelope check reads the request's own parse, which Dash then takes (one
        json.loads of a 25 kB state a request, not two)."""
        body = json.dumps({"output": "sum-time.children", "outputs": {"id": "sum-time", "property": "children"},
                           "inputs": [{"id": "state", "property": "data", "value": {"x": list(range(50))}}],
                           "changedPropIds": []}).encode()
        seen, inside = [], []
        provider = client.application.json  # (the request's parse) and Python's (any other)

        def counted(real):
            def loads(s, **kw):
                if not inside:  # (a parse, not a parser calling another)
                    seen.append(s)
                inside.append(1)
                try:
                    return real(s, **kw)
                finally:
                    inside.pop()
            return loads
        for owner in (json, provider):
            monkeypatch.setattr(owner, "loads", counted(owner.loads))
        client.post("/_dash-update-component", data=body, content_type="application/json")
        assert sum(1 for s in seen if s == body) == 1

    def test_bye_drops_the_session_s_simulation(self, client, alex):
        SIM.workspace(alex)
        assert client.post("/_soapbox/bye", data=alex["sid"].encode()).status_code == 204
        assert SES.current().forget(alex["sid"]) is False  # already gone

    def test_the_data_directory_holds_the_database(self, tmp_path):
        from app import create_app

        app = create_app(data_dir=tmp_path / "d")
        assert (tmp_path / "d" / "soapbox.sqlite3").exists()
        assert app.soapbox_info["data_dir"] == str(tmp_path / "d")
        assert store.current().path == tmp_path / "d" / "soapbox.sqlite3"


class TestWhatTheServerKeeps:
    def test_parsed_strategies_are_dropped_when_unused(self, alex):
        s = ST.page_strategy(alex)
        assert ST.page_strategy(alex) is s  # the callbacks of one edit parse it once
        time.sleep(0.01)
        assert SES.current().trim(3600.0) == 0
        assert SES.current().trim(0.0) >= 1 and len(SES.current().parsed) == 0
        assert ST.page_strategy(alex) == s

    def test_warm_up_draws_and_edits_then_keeps_only_the_default_page(self):
        WU.warm_up()
        assert not [sid for sid in SES.current().workspaces if sid.endswith("-warm-up")]
        assert set(SES.current().drawn) <= SES.current().drawn.pinned

    def test_warm_up_compiles_what_a_visitors_edit_runs_and_reads_every_preset(self):
        from engine.sim import delta, full

        from app.layout import make_layout

        WU.warm_up()
        # a visitor's edit: built on the background pool (the cancellable loop), then a delta
        # change (before, both were compiled in the middle of the first visitors' requests)
        for kernel in (full.loop_state, full.ready_heap, full.dispatch, delta._restore, delta._first_change):
            assert kernel.signatures, kernel
        # the page's cluster menu reads every family's one-node preset: all are kept, so a
        # page load makes none again (with 16 kept of 21, each load made them all)
        presets = SES.current().presets
        before = {name: presets.get(name) for name in presets}
        make_layout()
        assert all(presets.get(name) is c for name, c in before.items())
        assert len(presets) == len(before)

    def test_settle_heap_freezes_what_start_up_left_and_later_cycles_are_still_collected(self):
        import subprocess

        code = ("import gc, weakref\n"
                "import app.warmup as WU\n"
                "WU.settle_heap()\n"
                "frozen = gc.get_freeze_count()\n"
                "class Node: pass\n"
                "a, b = Node(), Node(); a.b, b.a = b, a; probe = weakref.ref(a); del a, b\n"
                "gc.collect()\n"
                "print(frozen, probe() is None)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(WU.__file__))))
        frozen, collected = out.stdout.split()
        assert int(frozen) > 50_000, out  # the app's imports: Dash, Plotly, the engine
        assert collected == "True"  # a cycle made after the freeze is collected as before

    def test_workers_import_the_app_the_server_runs(self, monkeypatch):
        from app import jobs

        root = os.path.dirname(os.path.dirname(os.path.abspath(jobs.__file__)))
        monkeypatch.setenv("PYTHONPATH", "/elsewhere")
        monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p) != root and p])
        assert jobs.worker_env()["PYTHONPATH"].split(os.pathsep) == [root, "/elsewhere"]
        monkeypatch.setattr(sys, "path", [root] + sys.path)
        assert jobs.worker_env()["PYTHONPATH"] == "/elsewhere"  # found there already: nothing added


class TestIdleCache:
    def test_least_recently_used_goes_first_and_pinned_stays(self):
        from app.cache import IdleCache

        c = IdleCache(2)
        c.pinned.add("p")
        c.put("p", 0)
        c.put("a", 1)
        c.put("b", 2)  # full: "a" (not pinned, least recently used) goes
        assert list(c) == ["p", "b"] and c.get("a") is None and c.get("p") == 0
        time.sleep(0.01)
        assert c.trim(3600.0) == 0
        assert c.trim(0.0) == 1 and list(c) == ["p"]
        assert c.get("b", "gone") == "gone"


class TestIssue16Inputs:
    """The explorer's new inputs (issue 16) against what a crafted request can send."""

    @settings(max_examples=200, deadline=None)
    @given(text=st.text(max_size=400))
    def test_any_row_filter_is_read_or_named(self, text):
        from app.gantt import parse_row_filter

        try:
            parts = parse_row_filter(text)
        except ValueError as e:
            assert "row filter" in str(e)
        else:
            assert all(k in ("gpu", "stage", "node", "text") for k, _ in parts)

    @pytest.mark.parametrize("opts", [{"rows": "../../x", "links": 7, "filter": "x" * 10_000},
                                      {"rows": None, "links": None, "filter": "5-2"}, {"filter": "stage 99999999"}])
    def test_timeline_options_never_break_the_timeline(self, alex, opts):
        fig, notes = TL.zoom_gantt(alex, None, opts, trigger="gantt-rows")
        assert isinstance(fig, dict) and isinstance(notes, str)

    @pytest.mark.parametrize("shown", [None, [{"a": 1}], "dp", [1, 2, None], ["nope"] * 1000])
    def test_compare_ticks_of_any_shape(self, alex, shown):
        s, _ = ACT.add_to_compare(alex, "dp")
        names, value = CMP.compare_shown(s, shown, [{"value": "dp"}, 5, None])
        assert names == ["dp"] and set(value) <= {"dp"}
        CMP.render_compare(s, value)

    @pytest.mark.parametrize("step", ["../../etc/passwd", "", None, 7, "soap" * 100])
    def test_a_crafted_tour_step_is_named(self, alex, step):
        s, msg = EV.on_event("tour", alex, step=step)
        assert s is alex and msg.startswith("Unknown step")

    @pytest.mark.parametrize("trigger, size", [("pick-seq", "9" * 1000), ("pick-seq", -1), ("pick-seq", True),
                                               ("pick-seq", [4096]), ("pick-precision", {"x": 1}),
                                               ("pick-precision", "bf16" * 100)])
    def test_crafted_model_sizes_are_refused(self, trigger, size):
        s = ST.new_state("gpt2")
        new, msg = EV.on_event(trigger, s, size=size)
        assert new is s and " refused: " in msg

    def test_cancel_and_fit_without_anything_to_do(self, alex):
        s = dict(alex, sid=ST.new_sid())
        back, msg = EXP.cancel_simulation(s)
        assert back is s and msg == "Nothing to go back to."
        assert EXP.fit_view({"sid": "nope"}, start=True)[0].startswith("Cannot look for a cluster: ")
        assert EXP.fit_view(None, start=True)[1] is True


def test_a_kept_strategy_is_bounded_like_the_page_s(alex):
    """A strategy kept for Compare comes from the page too: its device runs are counted, not
    listed, and refused past the explorer's bound with its name."""
    from engine.errors import ValidationError

    s, _ = ACT.add_to_compare(alex, "dp")
    item = s["compare"][0]
    ops = {**item["strategy"]["ops"], "fc6": {"degrees": {}, "devices": "0-16383"}}
    bad = {**s, "compare": [{**item, "strategy": {**item["strategy"], "ops": ops}}]}
    with pytest.raises(ValidationError, match=r"(?s)the kept strategy 'dp'.*ops\.fc6\.devices: device runs stand for 16,384"):
        CMP.render_compare(bad)
