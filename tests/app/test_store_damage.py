"""The store's data directory (issue 24 part 7): a damaged store is set aside with a message
naming the file and what was wrong, an emptied one is reported, one server per folder, files
readable by their owner only, and the server-wide bounds on queued searches and stored uploads.

These run on :mod:`app.store` directly (no Dash); ``tests/app/test_server_limits.py`` drives a real
``soapbox serve``.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app import datadir, store
from app.store import DataDirInUse, Store, StoreFull, open_checked

ROOT = Path(__file__).resolve().parents[2]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _used_store(folder: Path) -> Path:
    """A store in ``folder`` that has been used: uploads over several pages, a search, the
    session key beside it; closed and checkpointed (no -wal left). Its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / store.DB_NAME
    st = Store(path)
    for k in range(6):
        st.put_upload(f"s{k}", "model", f"m{k}", {"format": "soapbox.model/1", "pad": "x" * 20_000, "k": k})
    st.create_search("s0", "mcmc", "10s", 10.0, 0, {"model": "alexnet"}, None)
    st._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    st.close()
    (folder / "session.key").write_bytes(os.urandom(32))
    return path


def _aside(folder: Path) -> list[Path]:
    """The stores set aside in ``folder`` (not their -wal / -shm files)."""
    return sorted(p for p in folder.glob(f"{store.DB_NAME}.damaged-*") if not p.name.endswith(("-wal", "-shm")))


def _works(st: Store) -> None:
    """The store opened is usable: an upload round trip, a search queued, recovery runs."""
    d = st.put_upload("sid", "cluster", "c", {"format": "soapbox.cluster/1", "nodes": []})
    assert st.get_upload("sid", d, "cluster") == {"format": "soapbox.cluster/1", "nodes": []}
    st.create_search("sid", "mcmc", "5s", 5.0, 0, {}, None)
    assert st.recover() == 1


@pytest.fixture
def opened():
    """Stores opened by a test, released after it (their folder locks with them)."""
    made: list[Store] = []
    yield made
    for st in made:
        st.release()


def _open(opened, path: Path, **kw) -> Store:
    st = open_checked(path, **kw)
    opened.append(st)
    return st


# --------------------------------------------------------------------------- damaged files


class TestADamagedStoreIsSetAside:
    def _check(self, opened, path: Path, words: str) -> Store:
        st = _open(opened, path)
        assert len(st.notices) == 1, st.notices
        note = st.notices[0]
        assert str(path) in note and words in note and "set aside as" in note
        aside = _aside(path.parent)
        assert len(aside) == 1 and aside[0].name in note
        _works(st)
        return st

    def test_a_truncated_store(self, opened, tmp_path):
        path = _used_store(tmp_path / "d")
        size = path.stat().st_size
        assert size > 8 * 4096
        with open(path, "r+b") as f:
            f.truncate(size // 2)
        self._check(opened, path, "is truncated")
        assert _aside(path.parent)[0].stat().st_size == size // 2  # kept as it was, for inspection

    def test_a_store_cut_inside_its_header(self, opened, tmp_path):
        path = _used_store(tmp_path / "d")
        with open(path, "r+b") as f:
            f.truncate(60)
        self._check(opened, path, "shorter than an SQLite header")

    def test_garbage_bytes(self, opened, tmp_path):
        path = tmp_path / "d" / store.DB_NAME
        path.parent.mkdir()
        path.write_bytes(bytes(range(256)) * 40)
        self._check(opened, path, "is not an SQLite database")

    def test_garbage_pages_behind_a_sound_header(self, opened, tmp_path):
        path = _used_store(tmp_path / "d")
        data = bytearray(path.read_bytes())
        data[4096:] = os.urandom(len(data) - 4096)  # every page but the first (the header and schema)
        path.write_bytes(bytes(data))
        st = self._check(opened, path, "")
        assert "integrity check" in st.notices[0] or "cannot be read as a database" in st.notices[0]

    def test_a_folder_where_the_file_should_be(self, opened, tmp_path):
        path = tmp_path / "d" / store.DB_NAME
        (path / "inside").mkdir(parents=True)
        self._check(opened, path, "is a folder, not a database file")
        assert (_aside(path.parent)[0] / "inside").is_dir()

    def test_a_text_file(self, opened, tmp_path):
        path = tmp_path / "d" / store.DB_NAME
        path.parent.mkdir()
        path.write_text("uploads and searches\nlive here\n")
        self._check(opened, path, "is a text file")

    def test_another_program_s_database(self, opened, tmp_path):
        path = tmp_path / "d" / store.DB_NAME
        path.parent.mkdir()
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE accounts (id INTEGER)")
        self._check(opened, path, "not soapbox's (its tables: accounts)")

    def test_its_wal_goes_aside_with_it(self, opened, tmp_path):
        path = tmp_path / "d" / store.DB_NAME
        path.parent.mkdir()
        path.write_text("not a database")
        Path(f"{path}-wal").write_bytes(b"\0" * 100)
        self._check(opened, path, "is a text file")
        aside = _aside(path.parent)[0]
        assert Path(f"{aside}-wal").exists()
        assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size != 100

    def test_two_damaged_starts_keep_both_files(self, opened, tmp_path):
        path = tmp_path / "d" / store.DB_NAME
        path.parent.mkdir()
        for text in ("first", "second"):
            path.write_text(text)
            _open(opened, path).release()
        assert sorted(p.read_text() for p in _aside(path.parent)) == ["first", "second"]

    def test_a_store_that_cannot_be_set_aside_says_what_to_do(self, tmp_path, monkeypatch):
        path = tmp_path / "d" / store.DB_NAME
        path.parent.mkdir()
        path.write_text("garbage")

        def refuse(*a):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(os, "rename", refuse)
        with pytest.raises(ValueError, match=r"is a text file.*cannot be set aside \(Permission denied\): move it"):
            open_checked(path)
        # and the folder was let go: a second try may take it
        monkeypatch.undo()
        open_checked(path).release()

    def test_a_sound_store_is_kept_with_its_contents(self, opened, tmp_path):
        path = _used_store(tmp_path / "d")
        st = _open(opened, path)
        assert st.notices == [] and _aside(path.parent) == []
        assert st.latest_search("s0")["status"] == "queued"
        assert st.upload_usage()[0] == 6


class TestAnEmptiedStoreIsReported:
    def test_zero_bytes(self, opened, tmp_path):
        path = _used_store(tmp_path / "d")
        path.write_bytes(b"")
        st = _open(opened, path)
        assert len(st.notices) == 1
        assert str(path) in st.notices[0] and "is empty (0 bytes)" in st.notices[0]
        assert "uploads and searches it held are gone" in st.notices[0]
        assert _aside(path.parent) == []  # (nothing in it to keep)
        _works(st)

    def test_tables_gone_in_a_folder_used_before(self, opened, tmp_path):
        path = _used_store(tmp_path / "d")
        path.unlink()
        with sqlite3.connect(path) as db:  # an SQLite file with no tables at all
            db.execute("PRAGMA user_version = 1")
        st = _open(opened, path)
        assert len(st.notices) == 1
        note = st.notices[0]
        assert "has lost its tables uploads, searches, progress" in note and "used before (session.key)" in note
        _works(st)

    def test_one_table_gone(self, opened, tmp_path):
        path = _used_store(tmp_path / "d")
        with sqlite3.connect(path) as db:
            db.execute("DROP TABLE searches")
        st = _open(opened, path)
        assert len(st.notices) == 1 and "has lost its table searches:" in st.notices[0]
        assert st.upload_usage()[0] == 6  # what was left is kept
        _works(st)

    def test_a_first_start_is_silent(self, opened, tmp_path):
        st = _open(opened, tmp_path / "new" / store.DB_NAME)
        assert st.notices == []
        _works(st)

    def test_a_table_less_file_in_an_unused_folder_is_silent(self, opened, tmp_path):
        path = tmp_path / "d" / store.DB_NAME
        path.parent.mkdir()
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA user_version = 1")
        assert _open(opened, path).notices == []


# --------------------------------------------------------------------------- one server per folder

_HOLD = """
import sys, time
from app.store import open_checked
try:
    held = open_checked(sys.argv[1])  # (kept: the lock lives as long as the store)
except ValueError as e:
    print("REFUSED", e, flush=True)
    sys.exit(3)
print("HELD", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _hold(path: Path, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _HOLD, str(path), str(seconds)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


class TestOneServerPerFolder:
    def test_a_second_process_is_refused_naming_the_first(self, opened, tmp_path):
        path = tmp_path / "d" / store.DB_NAME
        _open(opened, path)
        p = _hold(path, 0)
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 3, out
        assert f"the data directory {path.parent} is in use by another soapbox server (process {os.getpid()})" in out
        assert "another --data-dir" in out

    def test_the_folder_is_free_once_released(self, opened, tmp_path):
        path = tmp_path / "d" / store.DB_NAME
        _open(opened, path).release()
        p = _hold(path, 0)
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0 and "HELD" in out

    def test_a_killed_server_leaves_no_stale_lock(self, tmp_path):
        path = tmp_path / "d" / store.DB_NAME
        p = _hold(path, 600)
        try:
            assert p.stdout.readline().strip() == "HELD"
            with pytest.raises(DataDirInUse, match=f"process {p.pid}"):
                open_checked(path)
        finally:
            p.kill()  # (kill -9: no clean-up of any kind)
            p.wait(30)
        assert (path.parent / datadir.LOCK_NAME).exists()  # the file stays; its lock died with the process
        open_checked(path).release()

    def test_the_same_process_may_reopen_its_folder(self, tmp_path):
        path = tmp_path / "d" / store.DB_NAME
        a = store.configure(path, checked=True)
        try:
            assert store.configure(path, checked=True) is a
        finally:
            store.configure(tmp_path / "other" / store.DB_NAME)  # (let go of it: the next configure does)
        open_checked(path).release()

    def test_a_refused_second_server_changes_nothing(self, opened, tmp_path):
        path = _used_store(tmp_path / "d")
        first = _open(opened, path)
        assert first.latest_search("s0")["status"] == "queued"
        with pytest.raises(DataDirInUse):
            open_checked(path)
        assert first.latest_search("s0")["status"] == "queued"  # not marked interrupted by the second


# --------------------------------------------------------------------------- its owner's only


class TestFilesReadableByTheirOwnerOnly:
    @pytest.fixture(autouse=True)
    def _permissive_umask(self):
        old = os.umask(0o022)  # what a default shell gives: the store must not rely on a strict one
        yield
        os.umask(old)

    def test_a_new_folder_and_its_files(self, opened, tmp_path):
        folder = tmp_path / "new"
        st = _open(opened, folder / store.DB_NAME)
        st.put_upload("sid", "model", "m", {"format": "soapbox.model/1"})  # (the -wal and -shm exist now)
        assert _mode(folder) == 0o700
        names = {p.name: _mode(p) for p in folder.iterdir()}
        assert {store.DB_NAME, f"{store.DB_NAME}-wal", f"{store.DB_NAME}-shm", datadir.LOCK_NAME} <= set(names)
        assert names == {n: 0o600 for n in names}

    def test_an_old_permissive_folder_is_tightened(self, opened, tmp_path):
        folder = tmp_path / "old"
        path = _used_store(folder)
        os.chmod(folder, 0o755)
        os.chmod(path, 0o644)
        Path(f"{path}-wal").write_bytes(b"")
        os.chmod(f"{path}-wal", 0o644)
        _open(opened, path)
        assert _mode(folder) == 0o700 and _mode(path) == 0o600 and _mode(Path(f"{path}-wal")) == 0o600

    def test_a_set_aside_store_too(self, opened, tmp_path):
        path = tmp_path / "d" / store.DB_NAME
        path.parent.mkdir()
        path.write_text("a text file")
        os.chmod(path, 0o644)
        _open(opened, path)
        assert _mode(_aside(path.parent)[0]) == 0o600


# --------------------------------------------------------------------------- server-wide bounds


class TestServerWideBounds:
    def test_queued_searches_are_bounded_across_sessions(self, tmp_path):
        st = Store(tmp_path / "db.sqlite3")
        ids = [st.create_search(f"session-{k}", "mcmc", "10m", 600.0, 0, {}, None)
               for k in range(store.MAX_QUEUED_SEARCHES)]
        with pytest.raises(StoreFull, match=f"the server has {store.MAX_QUEUED_SEARCHES} searches queued "
                                            r"\(its limit\); try again later"):
            st.create_search("one-more", "mcmc", "10m", 600.0, 0, {}, None)
        assert st.latest_search("one-more") is None and st.queued_count() == store.MAX_QUEUED_SEARCHES
        st.request_stop(ids[0])  # a queued search stopped makes room
        st.create_search("one-more", "mcmc", "10m", 600.0, 0, {}, None)
        assert st.claim_next(1)["id"] == ids[1]  # a running search is not queued: room again
        st.create_search("yet-another", "mcmc", "10m", 600.0, 0, {}, None)

    def test_a_full_store_is_a_value_error_the_page_shows(self):
        assert issubclass(StoreFull, ValueError) and issubclass(DataDirInUse, ValueError)

    def _age(self, st: Store, sid: str, seconds: float) -> None:
        st._conn().execute("UPDATE uploads SET used_at = used_at - ? WHERE sid = ?", (seconds, sid))

    def test_upload_count_refused_while_all_are_in_use(self, tmp_path, monkeypatch):
        monkeypatch.setattr(store, "MAX_STORED_UPLOADS", 3)
        st = Store(tmp_path / "db.sqlite3")
        for k in range(3):
            st.put_upload(f"s{k}", "model", "m", {"k": k})
        with pytest.raises(StoreFull, match=r"upload storage is full .*at most 3 files.*try again later"):
            st.put_upload("s3", "model", "m", {"k": 3})
        assert st.upload_usage()[0] == 3 and not st.has_upload("s3", store.digest_of({"k": 3}), "model")
        # the same session storing what it holds already is no new file
        st.put_upload("s0", "model", "m", {"k": 0})

    def test_the_least_recently_used_idle_upload_makes_room(self, tmp_path, monkeypatch):
        monkeypatch.setattr(store, "MAX_STORED_UPLOADS", 3)
        st = Store(tmp_path / "db.sqlite3")
        for k in range(3):
            st.put_upload(f"s{k}", "model", "m", {"k": k})
        self._age(st, "s1", 2 * store.UPLOAD_IN_USE_S)
        self._age(st, "s2", 3 * store.UPLOAD_IN_USE_S)
        d = st.put_upload("s3", "model", "m", {"k": 3})
        assert st.get_upload("s3", d, "model") == {"k": 3}
        assert st.get_upload("s2", store.digest_of({"k": 2}), "model") is None  # the oldest went
        assert st.get_upload("s1", store.digest_of({"k": 1}), "model") == {"k": 1}
        assert st.upload_usage()[0] == 3

    def test_reading_an_upload_keeps_it(self, tmp_path, monkeypatch):
        monkeypatch.setattr(store, "MAX_STORED_UPLOADS", 2)
        st = Store(tmp_path / "db.sqlite3")
        d0 = st.put_upload("s0", "model", "m", {"k": 0})
        st.put_upload("s1", "model", "m", {"k": 1})
        self._age(st, "s0", 2 * store.UPLOAD_IN_USE_S)
        self._age(st, "s1", 3 * store.UPLOAD_IN_USE_S)
        assert st.get_upload("s0", d0, "model") == {"k": 0}  # s0's page still draws it
        st.put_upload("s2", "model", "m", {"k": 2})
        assert st.has_upload("s0", d0, "model") and not st.has_upload("s1", store.digest_of({"k": 1}), "model")

    def test_upload_bytes_are_bounded(self, tmp_path, monkeypatch):
        monkeypatch.setattr(store, "MAX_STORED_UPLOAD_BYTES", 50_000)
        st = Store(tmp_path / "db.sqlite3")
        st.put_upload("s0", "model", "m", {"pad": "x" * 20_000})
        st.put_upload("s1", "model", "m", {"pad": "y" * 20_000})
        assert 40_000 < st.upload_usage()[1] < 50_000
        with pytest.raises(StoreFull, match="50 KB|0 MB"):
            st.put_upload("s2", "model", "m", {"pad": "z" * 20_000})
        self._age(st, "s0", 2 * store.UPLOAD_IN_USE_S)
        st.put_upload("s2", "model", "m", {"pad": "z" * 20_000})
        assert st.upload_usage()[1] < 50_000

    def test_an_upload_is_drawn_by_its_owner_only(self, tmp_path):
        st = Store(tmp_path / "db.sqlite3")
        d = st.put_upload("owner", "model", "m", {"k": 1})
        assert st.get_upload("owner", d, "model") == {"k": 1} and st.has_upload("owner", d, "model")
        assert st.get_upload("thief", d, "model") is None and not st.has_upload("thief", d, "model")
        assert st.get_upload("owner", d, "cluster") is None

    def test_a_store_made_before_sizes_were_kept_counts_them(self, tmp_path):
        path = tmp_path / "db.sqlite3"
        with sqlite3.connect(path) as db:  # the uploads table as it was (no size_bytes)
            db.execute("CREATE TABLE uploads (sid TEXT NOT NULL, digest TEXT NOT NULL, kind TEXT NOT NULL, "
                       "name TEXT NOT NULL, data TEXT NOT NULL, used_at REAL NOT NULL, PRIMARY KEY (sid, digest))")
            db.execute("INSERT INTO uploads VALUES ('s', 'd', 'model', 'm', ?, ?)", ("x" * 1234, time.time()))
        assert Store(path).upload_usage() == (1, 1234)
