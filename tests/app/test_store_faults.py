"""Issue 45, item 3: every storage fault a clear message, no HTTP 500, and a store whose size is
bounded. A full disk is SQLite's ``max_page_count`` reached (SQLITE_FULL, what a full file
system gives), a read-only store ``query_only`` (SQLITE_READONLY; these tests may run as root,
whom file modes do not stop). Then: the lock file deleted, another program's ``uploads`` table,
a shared 1777 folder, a symlinked store set aside, a damaged session key; and the store's size
over 20 search start/stop cycles of a 1,024-GPU strategy."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from app import datadir, sessions, store
from app import events as EV
from app import state as ST
from app.store import DataDirInUse, Store, StoreUnavailable, open_checked
from app.tabs import search as SRCH

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def faults():
    """Stores given a fault by a test: their connections closed after it (a pragma stays on
    the connection it was run on)."""
    made: list[Store] = []
    yield made
    for st in made:
        st._local.faulty = None
        st.close()


def _faulty(monkeypatch, st: Store, fault, made: list) -> None:
    """Every connection ``st`` opens from now on gets ``fault`` first (a pragma, or a function
    of the connection that may return what stands for it)."""
    real = Store._conn
    made.append(st)
    st._local.faulty = None

    def conn(self):
        c = real(self)
        if self is not st:
            return c
        if getattr(self._local, "faulty", None) is None:
            made = fault(c) if callable(fault) else c.execute(fault)
            self._local.faulty = made if isinstance(made, _FullDisk) else c
        return self._local.faulty

    st.close()
    monkeypatch.setattr(Store, "_conn", conn)


class _FullDisk:
    """A connection on a full disk: every write fails as SQLite's does (SQLITE_FULL, "database
    or disk is full"), reads work. (A store-level test fills a real file to its page limit;
    here, whatever a page writes fails however small.)"""

    def __init__(self, conn) -> None:
        self._c = conn

    def execute(self, sql, *a):
        import sqlite3

        if sql.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE", "COMMIT")):
            err = sqlite3.OperationalError("database or disk is full")
            err.sqlite_errorcode = sqlite3.SQLITE_FULL
            raise err
        return self._c.execute(sql, *a)

    def __getattr__(self, name):
        return getattr(self._c, name)


def _full(c) -> None:
    """The disk full: the file may not grow, and the space inside it is taken."""
    import sqlite3

    c.execute(f"PRAGMA max_page_count={c.execute('PRAGMA page_count').fetchone()[0] + 8}")
    c.execute("CREATE TABLE IF NOT EXISTS filler (b BLOB)")
    for size in (65536, 4096, 512, 64, 8, 1):
        try:
            while True:
                c.execute("INSERT INTO filler VALUES (zeroblob(?))", (size,))
        except sqlite3.OperationalError:
            pass


class TestFaultsSaidInWords:
    @pytest.mark.parametrize("pragma, cause", [(_full, "the disk that holds the server's data is full"),
                                               ("PRAGMA query_only=1", "the server's data store is read-only")])
    def test_store_calls(self, tmp_path, monkeypatch, pragma, cause, faults):
        st = Store(tmp_path / store.DB_NAME)
        _faulty(monkeypatch, st, pragma, faults)
        big = {"format": "soapbox.model/1", "pad": "x" * 200_000}
        for call in (lambda: st.put_upload("s", "model", "m", big),
                     lambda: st.create_search("s", "mcmc", "5s", 5.0, 0, {"pad": "y" * 200_000}, None)):
            with pytest.raises(StoreUnavailable) as e:
                call()
            assert str(e.value).startswith(cause) and str(tmp_path) in str(e.value)
            assert "rollback" not in str(e.value)
        assert st.latest_search("s") is None  # (reads still work; nothing half-written)

    @pytest.mark.parametrize("pragma, cause", [(_FullDisk, "disk that holds the server's data is full"),
                                               ("PRAGMA query_only=1", "data store is read-only")])
    def test_the_page_says_it_for_a_search_and_an_upload(self, monkeypatch, pragma, cause, faults):
        from app.jobs import pool

        alex = ST.new_state("alexnet")
        for st in {id(x): x for x in (pool().store, store.current())}.values():  # (searches', uploads')
            _faulty(monkeypatch, st, pragma, faults)
        status, disabled = SRCH.search_start(alex, "mcmc", "5s", 0)
        assert disabled and status.startswith("Search not started: the ") and cause in status, status
        import base64
        import json

        from engine.formats import resolve_model

        model = dict(resolve_model("alexnet", batch=40).to_dict(), name="mine")
        text = base64.b64encode(json.dumps(model).encode()).decode()
        same, msg = EV.on_event("upload", alex, upload=f"data:application/json;base64,{text}", filename="mine.json")
        assert same is alex and cause in msg and "rollback" not in msg, msg


class TestTheFolder:
    def test_the_lock_file_deleted_does_not_let_a_second_server_in(self, tmp_path):
        path = tmp_path / "d" / store.DB_NAME
        first = open_checked(path)
        try:
            first.create_search("s0", "mcmc", "10s", 10.0, 0, {"model": "alexnet"}, None)
            (path.parent / datadir.LOCK_NAME).unlink()
            p = subprocess.run([sys.executable, "-c", (
                "import sys; from app.store import open_checked, DataDirInUse\n"
                "try:\n    open_checked(sys.argv[1]).recover()\nexcept DataDirInUse as e:\n"
                "    print(e); sys.exit(3)"), str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert p.returncode == 3, p.stdout + p.stderr
            assert "in use by another soapbox server" in p.stdout
            assert first.latest_search("s0")["status"] == "queued"  # not marked interrupted
        finally:
            first.release()

    def test_a_foreign_uploads_table_is_set_aside_and_the_server_starts(self, tmp_path):
        path = tmp_path / store.DB_NAME
        import sqlite3

        db = sqlite3.connect(path)
        db.execute("CREATE TABLE uploads (id INTEGER PRIMARY KEY, blob BLOB)")
        db.execute("INSERT INTO uploads (blob) VALUES (x'00')")
        db.commit()
        db.close()
        st = open_checked(path)
        try:
            assert len(st.notices) == 1 and "table 'uploads' is not soapbox's" in st.notices[0]
            assert "set aside as" in st.notices[0]
            st.put_upload("s", "model", "m", {"format": "soapbox.model/1"})
        finally:
            st.release()

    def test_a_shared_1777_folder_is_refused_not_tightened(self, tmp_path):
        shared = tmp_path / "shared"
        shared.mkdir()
        os.chmod(shared, 0o1777)
        with pytest.raises(ValueError, match="is a shared folder .mode 1777.*--data-dir .*soapbox-data"):
            open_checked(shared / store.DB_NAME)
        assert stat.S_IMODE(shared.stat().st_mode) == 0o1777

    def test_a_symlinked_store_is_set_aside_as_a_link_and_its_target_untouched(self, tmp_path):
        target = tmp_path / "elsewhere" / "mine.txt"
        target.parent.mkdir()
        target.write_text("someone's notes, not a database")
        os.chmod(target, 0o644)
        folder = tmp_path / "d"
        folder.mkdir()
        (folder / store.DB_NAME).symlink_to(target)
        st = open_checked(folder / store.DB_NAME)
        try:
            assert "set aside as" in st.notices[0]
        finally:
            st.release()
        assert stat.S_IMODE(target.stat().st_mode) == 0o644 and target.read_text().startswith("someone's")

    def test_a_damaged_session_key_is_announced(self, tmp_path, caplog):
        key = tmp_path / "session.key"
        key.write_bytes(b"short")
        with caplog.at_level(logging.WARNING, logger="soapbox.sessions"):
            made = sessions._read_or_make_key(key)
        assert len(made) == 32 and key.read_bytes() == made
        assert any("was damaged (5 bytes, not 32)" in r.getMessage() and "start new sessions" in r.getMessage()
                   for r in caplog.records)


class TestTheStoreIsBounded:
    def test_search_cycles_of_a_large_strategy_keep_the_store_small(self, tmp_path, monkeypatch):
        """20 fresh sessions each start and stop a search of GPT-3 on 1,024 GPUs: the starting
        strategy is dropped when a search ends and the freed pages go back to the disk."""
        st = Store(tmp_path / store.DB_NAME)
        initial = {"ops": {f"op{i}": {"degrees": {"sample": 8}, "devices": "0-1023"} for i in range(2410)},
                   "pad": "z" * 2_000_000}
        sizes = []
        for k in range(20):
            sid = st.create_search(f"s{k}", "mcmc", "5s", 5.0, 0, {"model": "gpt3-175b"}, initial)
            st.request_stop(sid)  # (a queued search stops at once: it ends)
            st.compact()
            sizes.append(os.path.getsize(st.path) + os.path.getsize(str(st.path) + "-wal"))
        assert st.search(sid)["initial"] is None
        assert max(sizes) < 12e6 and sizes[-1] < 2 * sizes[2], sizes  # (one search's strategy at a time)
