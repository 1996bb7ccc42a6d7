"""Issue 45, item 2: fair use per visitor. A client (an address: :mod:`app.clients`) with a
hundred pages open has at most its share of the search queue, other visitors' searches are
taken in turn with its own (two clients' searches interleaved, run by the real worker pool),
and one client's uploads cannot lock the others' out."""

from __future__ import annotations

import time

import pytest
from flask import Flask

from app import clients, jobs, store
from app import state as ST
from app.store import Store, StoreFull
from app.tabs import search as SRCH

_FLASK = Flask("fair-use-test")


def _as(ip: str, headers: dict | None = None):
    """A request from ``ip`` (what a callback runs inside)."""
    return _FLASK.test_request_context(environ_base={"REMOTE_ADDR": ip}, headers=headers or {})


class TestClients:
    def test_the_address_and_a_trusted_proxys_forwarded_one(self):
        assert clients.client_address() == clients.LOCAL  # (outside a request: no visitor)
        with _as("10.0.0.7", {"X-Forwarded-For": "1.2.3.4"}):
            assert clients.client_address() == "10.0.0.7"  # an untrusted header is ignored
        clients.trust_proxy(["10.0.0.7"])
        try:
            with _as("10.0.0.7", {"X-Forwarded-For": "6.6.6.6, 1.2.3.4"}):
                assert clients.client_address() == "1.2.3.4"  # the entry the proxy added itself
        finally:
            clients.trust_proxy(None)


class TestTheQueue:
    def test_a_clients_share_and_the_order_clients_take_turns_in(self, tmp_path, monkeypatch):
        monkeypatch.setattr(store, "CLIENT_SEARCHES", 2)
        st = Store(tmp_path / store.DB_NAME)
        a1 = st.create_search("a-page1", "mcmc", "5s", 5.0, 0, {}, None, client="A")
        a2 = st.create_search("a-page2", "mcmc", "5s", 5.0, 0, {}, None, client="A")
        with pytest.raises(StoreFull, match="you have 2 searches queued on this server"):
            st.create_search("a-page3", "mcmc", "5s", 5.0, 0, {}, None, client="A")
        b1 = st.create_search("b-page1", "mcmc", "5s", 5.0, 0, {}, None, client="B")
        b2 = st.create_search("b-page2", "mcmc", "5s", 5.0, 0, {}, None, client="B")
        c1 = st.create_search("c-page1", "mcmc", "5s", 5.0, 0, {}, None, client="C")
        assert [st.queue_position(i) for i in (a1, b1, c1, a2, b2)] == [1, 2, 3, 4, 5]
        assert [st.claim_next(0)["id"] for _ in range(5)] == [a1, b1, c1, a2, b2]
        assert st.claim_next(0) is None

    def test_a_hundred_pages_of_one_client_leave_another_visitor_next_in_line(self):
        them = [ST.new_state("alexnet") for _ in range(100)]
        me = ST.new_state("alexnet")
        refused = 0
        with _as("10.9.9.9"):
            for s in them:
                status, _ = SRCH.search_start(s, "mcmc", "100000000", 0)
                refused += status.startswith("Search not started: you have 32 searches queued on this server")
        assert refused >= 100 - 32 - jobs.pool().workers  # (its share: 32 queued, and what the workers took)
        with _as("10.8.8.8"):  # the queue is full of the first client's: the second is let in, in turn
            status, disabled = SRCH.search_start(me, "mcmc", "30", 0)
        assert not disabled, status
        # behind at most the first client's first search (its fair share), not its sixteen
        assert jobs.get(me["sid"]).status == "running" or jobs.get(me["sid"]).queue_position <= 2, status
        for s in them + [me]:
            SRCH.search_stop(s["sid"])


def test_two_clients_searches_run_interleaved(tmp_path):
    """The real worker pool, one worker: client A queues two searches, then client B two; they
    run A, B, A, B (first come, first served ran A, A, B, B)."""
    from app.jobs import SearchPool

    st = Store(tmp_path / store.DB_NAME)
    refs = {"sid": "x", "model": {"name": "alexnet"}, "cluster": {"name": "p100-4x4"}}
    ids = [st.create_search(f"{c}-{k}", "mcmc", "20", None, 0, dict(refs, sid=f"{c}-{k}"), None, client=c)
           for c in "AB" for k in range(2)]
    pool = SearchPool(st, workers=1)
    pool.ensure_running()
    try:
        deadline = time.monotonic() + 600
        while any(st.search(i)["status"] in ("queued", "running") for i in ids):
            assert time.monotonic() < deadline, [st.search(i)["status"] for i in ids]
            time.sleep(0.2)
    finally:
        pool.shutdown()
    rows = sorted((st.search(i) for i in ids), key=lambda r: r["started_at"])
    assert [r["client"] for r in rows] == ["A", "B", "A", "B"]
    assert all(r["status"] == "finished" for r in rows), [(r["status"], r["error"]) for r in rows]


class TestUploads:
    def test_a_client_keeps_its_share_and_makes_room_from_its_own(self, tmp_path, monkeypatch):
        monkeypatch.setattr(store, "CLIENT_UPLOADS", 5)
        monkeypatch.setattr(store, "MAX_STORED_UPLOADS", 12)
        st = Store(tmp_path / store.DB_NAME)
        for k in range(8):  # one client, eight pages: its five most recent kept
            st.put_upload(f"a{k}", "model", "m", {"k": k, "who": "A"}, client="A")
        assert st.upload_usage()[0] == 5
        for k in range(5):
            st.put_upload(f"b{k}", "model", "m", {"k": k, "who": "B"}, client="B")
        # the server is at 10 of 12, every upload in use: a third client is not locked out
        for k in range(4):
            st.put_upload(f"c{k}", "model", "m", {"k": k, "who": "C"}, client="C")
        assert st.upload_usage()[0] == 12
        kinds = [r[0] for r in st._conn().execute("SELECT client FROM uploads")]
        assert kinds.count("C") == 4 and kinds.count("A") + kinds.count("B") == 8


class TestWhatAPollReads:
    def test_a_page_reads_its_search_without_the_strategy_it_started_from(self, tmp_path):
        st = Store(tmp_path / "s.sqlite3")
        state = ST.new_state()
        sid = st.create_search("page", "mcmc", "3s", 3.0, 0, {"model": "m"}, state["strategy"], client="A")
        row = st.latest_search("page")
        assert row["id"] == sid and row["status"] == "queued" and row["refs"] == {"model": "m"}
        assert "initial" not in row  # (a page's poll: its worker's part is not read)
        assert st.claim_next(1234)["initial"] == state["strategy"]  # the worker gets it

    def test_a_store_made_before_the_client_column_gets_its_indexes(self, tmp_path):
        import sqlite3

        path = tmp_path / "old.sqlite3"
        old = sqlite3.connect(path)  # the searches table as it was before clients were counted
        old.executescript(
            "CREATE TABLE searches (id INTEGER PRIMARY KEY AUTOINCREMENT, sid TEXT NOT NULL, algorithm TEXT NOT NULL,"
            " budget TEXT NOT NULL, budget_s REAL, seed INTEGER NOT NULL, refs TEXT NOT NULL, initial TEXT,"
            " status TEXT NOT NULL, stop_requested INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL,"
            " started_at REAL, finished_at REAL, worker_pid INTEGER, best_cost_s REAL, best TEXT, result TEXT,"
            " error TEXT);")
        old.close()
        st = Store(path)
        names = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"searches_client", "searches_queue"} <= names
        a = st.create_search("p1", "mcmc", "3s", 3.0, 0, {}, None, client="A")
        b = st.create_search("p2", "mcmc", "3s", 3.0, 0, {}, None, client="B")
        assert st.queue_position(a) == 1 and st.queue_position(b) == 2
