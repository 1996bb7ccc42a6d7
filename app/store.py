"""What the explorer must not forget, in an embedded SQLite database.

A session's edits live in its browser tab (``sessionStorage``), so they survive a reload and a
server restart by themselves. What lives on the server is kept here, in one SQLite file under
the data directory (``soapbox serve --data-dir``; by default the platform's user data
directory, e.g. ``~/.local/share/soapbox`` on Linux):

* **uploads**: the model and cluster files a session uploaded, keyed by (session id, content
  digest). The session's state names an upload by its digest only; the server resolves it for
  that session and for no other, so a crafted state cannot name a file on the server's disk.
* **searches**: every search a session started, its progress rows, its best strategy so far
  and its result. Searches run in worker processes (:mod:`app.worker`) that write here; the
  page polls from here. A search that was queued or running when the server died is marked
  ``interrupted`` at the next start and keeps the best strategy it had written.

SQLite is used in WAL mode (readers never block the one writer) with a busy timeout, one
connection per thread and process. Sizes are bounded: a few searches per session and
:data:`MAX_QUEUED_SEARCHES` queued on the server, a few uploads per session and
:data:`MAX_STORED_UPLOADS` / :data:`MAX_STORED_UPLOAD_BYTES` on the server, at most
:data:`MAX_KEPT_SEARCHES` finished searches on the server (each with at most
:data:`MAX_PROGRESS_ROWS` progress rows; its starting strategy dropped when it ends), finished
searches dropped after :data:`KEEP_DAYS` days; the pages they free go back to the file system
(incremental auto-vacuum). A bound that is reached raises :class:`StoreFull`, a store SQLite
cannot write (the disk full, read-only) :class:`StoreUnavailable` (both ``ValueError`` subclasses whose
message a page can show: :mod:`app.storefaults`).

The data directory is the server's alone:

* **one server**: a store opened as a server opens it (:func:`open_checked`, ``configure(...,
  checked=True)``) holds an exclusive lock (``flock``) on the folder and on ``soapbox.lock`` in it
  until the process exits (deleting the file does not free the folder); a second server on the same folder is refused (:class:`DataDirInUse`)
  rather than marking the first one's searches interrupted. The lock dies with its process,
  so a crash leaves nothing stale. A server that starts again in place (:mod:`app.recycle`)
  keeps it across the exec.
* **its owner's only**: the folder is made (or tightened to) mode 0700, the database and its
  ``-wal`` / ``-shm`` files 0600 (SQLite gives those the database file's mode); a shared folder
  (``/tmp``, mode 1777) is refused, not tightened, and a link is never followed to tighten.
* **checked on open**: :func:`open_checked` runs SQLite's ``quick_check``; a damaged file (not
  a database, truncated, a folder where the file should be, failing the check) is set aside as
  ``soapbox.sqlite3.damaged-<time>`` and a fresh store made, and an emptied one (0 bytes, or its
  tables gone while the folder shows earlier use) is reported: :attr:`Store.notices` says so
  in words the server prints.

(:mod:`app.datadir` holds the folder's helpers.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .datadir import DataDirInUse, default_data_dir, inspect_store, lock_folder, private_dir, private_file, set_aside
from .fairqueue import fair_order
from .storefaults import StoreFull, StoreUnavailable, guarded, storage_problem
from .storeschema import (CLIENT_SEARCHES, CLIENT_UPLOADS, DB_NAME, FINAL, KEEP_DAYS, MAX_KEPT_SEARCHES,
                          MAX_PROGRESS_ROWS, MAX_QUEUED_SEARCHES, MAX_STORED_UPLOAD_BYTES,
                          MAX_STORED_UPLOADS, PLAN_JOB, SEARCH_SUMMARY, SEARCHES_PER_SESSION, STATUSES, TABLES,
                          UPLOAD_IN_USE_S, UPLOADS_PER_SESSION, columns, make_tables)

__all__ = ["Store", "StoreFull", "StoreUnavailable", "storage_problem", "DataDirInUse", "configure", "current", "open_checked", "default_data_dir",
           "digest_of", "PLAN_JOB", "KEEP_DAYS", "MAX_KEPT_SEARCHES", "SEARCHES_PER_SESSION", "UPLOADS_PER_SESSION", "MAX_QUEUED_SEARCHES",
           "MAX_STORED_UPLOADS", "MAX_STORED_UPLOAD_BYTES", "UPLOAD_IN_USE_S", "DB_NAME", "FINAL", "STATUSES"]





def digest_of(data: Any) -> str:
    """A content digest of a JSON-able value (SHA-256 of its canonical JSON, 32 hex digits)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


class Store:
    """The explorer's database at ``path`` (created with its tables when missing).

    Safe to share between threads (one connection per thread) and processes (SQLite's own
    locking; every write is one short transaction).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        #: what was wrong with the file when it was opened (:func:`open_checked`), in words
        self.notices: list[str] = []
        self._folder_lock: Any = None  # the data directory's lock, when this store holds it
        private_dir(self.path.parent)
        private_file(self.path, create=True)
        self._local = threading.local()
        make_tables(self._conn(), self._tx)  # (a store made before gets its new columns and indexes)
        for suffix in ("-wal", "-shm"):  # (SQLite makes them with the database's mode; older ones: tightened)
            private_file(self.path.with_name(self.path.name + suffix))

    # ------------------------------------------------------------------ plumbing

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            # one connection per thread (the server's request threads, its janitor and pool
            # manager, each worker). Kept small: no statement cache (compiling one of these
            # statements takes microseconds; the cached ones, made while sessions come and go
            # and kept for good, pinned freed memory in the server: BENCHMARKS.md) and a
            # 512 KiB page cache (SQLite's default is 2 MiB per connection; the database is
            # read by index)
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=True,
                                   cached_statements=0)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
            conn.execute("PRAGMA cache_size=-512")
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (taken at once: ``BEGIN IMMEDIATE``); SQLite's errors come out
        as :class:`app.storefaults.StoreUnavailable`. SQLite may have rolled a failed
        transaction back itself (a full disk): it is rolled back here only when still open."""
        try:
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise storage_problem(e, self.path) from None
        try:
            yield db
            db.execute("COMMIT")
        except BaseException as e:
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if isinstance(e, sqlite3.Error):
                raise storage_problem(e, self.path) from None
            raise

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def lock_descriptors(self) -> list[int]:
        """The data directory's lock's descriptors when this store holds it, else [] (what a
        server starting again in place keeps across its exec: :mod:`app.recycle`)."""
        return self._folder_lock.descriptors() if self._folder_lock is not None else []

    def release(self) -> None:
        """Close this thread's connection and let go of the data directory (when this store
        holds it: :func:`open_checked`); a server exiting lets go anyway."""
        self.close()
        if self._folder_lock is not None:
            self._folder_lock.close()  # (closing the file releases its flock)
            self._folder_lock = None

    # ------------------------------------------------------------------ uploads

    def put_upload(self, sid: str, kind: str, name: str, data: dict, client: str = "") -> str:
        """Keep an uploaded model or cluster for session ``sid`` of ``client`` (:mod:`app.clients`);
        its content digest.

        The session keeps its :data:`UPLOADS_PER_SESSION` most recent uploads, the client (all
        its sessions) its :data:`CLIENT_UPLOADS` most recent. Past the server's bounds
        (:data:`MAX_STORED_UPLOADS`, :data:`MAX_STORED_UPLOAD_BYTES`), uploads unused for
        :data:`UPLOAD_IN_USE_S` are dropped, least recently used first; when that is not enough,
        the least recently used of the client holding most (so that one client's uploads cannot
        lock everyone else's out: it makes room from its own).

        Raises
        ------
        StoreFull
            When that does not make room (the upload is not kept).
        """
        digest = digest_of(data)
        text = json.dumps(data, separators=(",", ":"))
        size = len(text.encode("utf-8"))
        now = time.time()
        with self._tx() as db:
            db.execute("INSERT INTO uploads (sid, digest, kind, name, data, used_at, size_bytes, client) VALUES "
                       "(?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (sid, digest) DO UPDATE SET used_at = excluded.used_at",
                       (sid, digest, kind, name, text, now, size, client))
            db.execute("DELETE FROM uploads WHERE sid = ? AND digest NOT IN (SELECT digest FROM uploads WHERE sid = ? "
                       "ORDER BY used_at DESC LIMIT ?)", (sid, sid, UPLOADS_PER_SESSION))
            if client:
                db.execute("DELETE FROM uploads WHERE client = ? AND rowid NOT IN (SELECT rowid FROM uploads WHERE "
                           "client = ? ORDER BY used_at DESC LIMIT ?)", (client, client, CLIENT_UPLOADS))
            count, total = db.execute("SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM uploads").fetchone()
            if count > MAX_STORED_UPLOADS or total > MAX_STORED_UPLOAD_BYTES:
                idle = db.execute("SELECT sid, digest, size_bytes FROM uploads WHERE used_at < ? AND NOT "
                                  "(sid = ? AND digest = ?) ORDER BY used_at", (now - UPLOAD_IN_USE_S, sid, digest))
                for old_sid, old_digest, old_size in idle.fetchall():
                    if count <= MAX_STORED_UPLOADS and total <= MAX_STORED_UPLOAD_BYTES:
                        break
                    db.execute("DELETE FROM uploads WHERE sid = ? AND digest = ?", (old_sid, old_digest))
                    count, total = count - 1, total - int(old_size)
                while count > MAX_STORED_UPLOADS or total > MAX_STORED_UPLOAD_BYTES:
                    row = db.execute(  # (the least recently used of the client holding most, not this one)
                        "SELECT sid, digest, size_bytes FROM uploads WHERE client = (SELECT client FROM uploads "
                        "GROUP BY client ORDER BY COUNT(*) DESC, SUM(size_bytes) DESC LIMIT 1) AND client != '' "
                        "AND NOT (sid = ? AND digest = ?) ORDER BY used_at LIMIT 1", (sid, digest)).fetchone()
                    if row is None:
                        raise StoreFull(  # (the transaction is rolled back: nothing was kept or dropped)
                            f"the server's upload storage is full (it keeps at most {MAX_STORED_UPLOADS:,} files "
                            f"and {MAX_STORED_UPLOAD_BYTES / 2**20:.0f} MB, and those it holds were used within "
                            f"the last {UPLOAD_IN_USE_S / 60:.0f} minutes); try again later")
                    db.execute("DELETE FROM uploads WHERE sid = ? AND digest = ?", (row[0], row[1]))
                    count, total = count - 1, total - int(row[2])
        return digest

    def has_upload(self, sid: str, digest: str, kind: str) -> bool:
        """Whether session ``sid`` uploaded a ``kind`` under ``digest`` (another session's
        upload of the same content does not count)."""
        return self._conn().execute("SELECT 1 FROM uploads WHERE sid = ? AND digest = ? AND kind = ?",
                                    (sid, digest, kind)).fetchone() is not None

    def get_upload(self, sid: str, digest: str, kind: str) -> dict | None:
        """The content session ``sid`` uploaded under ``digest`` (None when it did not: the
        pair, never the digest alone, names an upload). Counts as a use (at most one write a
        minute), so an upload a session still reads is not dropped for another's."""
        row = self._conn().execute("SELECT data, used_at FROM uploads WHERE sid = ? AND digest = ? AND kind = ?",
                                   (sid, digest, kind)).fetchone()
        if row is None:
            return None
        now = time.time()
        if row["used_at"] < now - 60.0:
            with self._tx() as db:
                db.execute("UPDATE uploads SET used_at = ? WHERE sid = ? AND digest = ?", (now, sid, digest))
        return json.loads(row["data"])

    def upload_usage(self) -> tuple[int, int]:
        """(files, bytes) of the uploads the server keeps, all sessions together."""
        count, total = self._conn().execute("SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM uploads").fetchone()
        return int(count), int(total)

    # ------------------------------------------------------------------ searches

    def create_search(self, sid: str, algorithm: str, budget: str, budget_s: float | None, seed: int,
                      refs: dict, initial: dict | None, client: str = "") -> int:
        """Queue a search of ``client`` (:mod:`app.clients`); its id. Older finished searches
        of the session beyond :data:`SEARCHES_PER_SESSION` are dropped with their progress.

        Raises
        ------
        StoreFull
            When the client has :data:`CLIENT_SEARCHES` queued already (all its pages
            together), or :data:`MAX_QUEUED_SEARCHES` are queued on the server (twice that for a
            client with none queued).
        """
        with self._tx() as db:
            mine = db.execute("SELECT COUNT(*) FROM searches WHERE client = ? AND status = 'queued'",
                              (client,)).fetchone()[0] if client else 0
            if mine >= CLIENT_SEARCHES:
                raise StoreFull(f"you have {mine} searches queued on this server (from this page or others), as many "
                                "as one visitor may: stop one, or wait for one to start")
            queued = db.execute("SELECT COUNT(*) FROM searches WHERE status = 'queued'").fetchone()[0]
            # (a visitor with none queued is let in past the bound, up to twice it: it runs in turn)
            if queued >= 2 * MAX_QUEUED_SEARCHES or (queued >= MAX_QUEUED_SEARCHES and (mine or not client)):
                raise StoreFull(f"the server has {queued} searches queued (its limit); try again later")
            cur = db.execute(
                "INSERT INTO searches (sid, algorithm, budget, budget_s, seed, refs, initial, status, created_at, "
                "client) VALUES (?, ?, ?, ?, ?, ?, ?, 'queued', ?, ?)",
                (sid, algorithm, budget, budget_s, seed, json.dumps(refs), json.dumps(initial) if initial else None,
                 time.time(), client))
            new_id = int(cur.lastrowid)
            old = [r[0] for r in db.execute(
                "SELECT id FROM searches WHERE sid = ? AND status IN ('finished', 'stopped', 'failed', 'interrupted') "
                "ORDER BY id DESC LIMIT -1 OFFSET ?", (sid, SEARCHES_PER_SESSION - 1))]
            old += [r[0] for r in db.execute(  # (and the server's oldest, past its bound: any session's)
                "SELECT id FROM searches WHERE status IN ('finished', 'stopped', 'failed', 'interrupted') "
                "ORDER BY id DESC LIMIT -1 OFFSET ?", (MAX_KEPT_SEARCHES,)) if r[0] not in old]
            self._delete(db, old)
        return new_id

    @staticmethod
    def _delete(db: sqlite3.Connection, ids: list[int]) -> None:
        for i in ids:
            db.execute("DELETE FROM progress WHERE search_id = ?", (i,))
            db.execute("DELETE FROM searches WHERE id = ?", (i,))

    def claim_next(self, worker_pid: int) -> dict | None:
        """Mark the next queued search (:func:`app.fairqueue.fair_order`) running for ``worker_pid`` and
        return it."""
        with self._tx() as db:
            order = fair_order(db)
            if not order:
                return None
            row = db.execute("SELECT * FROM searches WHERE id = ?", (order[0],)).fetchone()
            db.execute("UPDATE searches SET status = 'running', started_at = ?, worker_pid = ? WHERE id = ?",
                       (time.time(), worker_pid, row["id"]))
        out = self._row(row)
        out["status"] = "running"
        return out

    def add_progress(self, search_id: int, rows: list[dict]) -> None:
        """Append progress rows (thinning old ones past :data:`MAX_PROGRESS_ROWS`)."""
        if not rows:
            return
        with self._tx() as db:
            last = db.execute("SELECT COALESCE(MAX(seq), -1), COUNT(*) FROM progress WHERE search_id = ?",
                              (search_id,)).fetchone()
            seq, count = int(last[0]) + 1, int(last[1])
            db.executemany("INSERT INTO progress (search_id, seq, row) VALUES (?, ?, ?)",
                           [(search_id, seq + k, json.dumps(r)) for k, r in enumerate(rows)])
            if count + len(rows) > MAX_PROGRESS_ROWS:  # drop every other older row
                db.execute("DELETE FROM progress WHERE search_id = ? AND seq IN (SELECT seq FROM (SELECT seq, "
                           "ROW_NUMBER() OVER (ORDER BY seq) AS rn FROM progress WHERE search_id = ? AND seq < ?) "
                           "WHERE rn % 2 = 0)", (search_id, search_id, seq))

    def set_best(self, search_id: int, cost_s: float, strategy: dict) -> None:
        with self._tx() as db:
            db.execute("UPDATE searches SET best_cost_s = ?, best = ? WHERE id = ?",
                       (cost_s, json.dumps(strategy, separators=(",", ":")), search_id))

    def finish(self, search_id: int, status: str, result: dict | None = None, error: str | None = None,
               best: dict | None = None, best_cost_s: float | None = None) -> None:
        """Record how a search ended (status one of :data:`FINAL`)."""
        assert status in FINAL, status
        with self._tx() as db:
            # (the starting strategy only starts a search: dropped when it ends, it is the largest
            # field, a 1,024-GPU strategy's megabytes per start)
            db.execute("UPDATE searches SET status = ?, finished_at = ?, result = ?, error = ?, initial = NULL, "
                       "best = COALESCE(?, best), best_cost_s = COALESCE(?, best_cost_s) WHERE id = ? "
                       "AND status NOT IN ('finished', 'stopped', 'failed', 'interrupted')",
                       (status, time.time(), json.dumps(result) if result is not None else None, error,
                        json.dumps(best, separators=(",", ":")) if best is not None else None, best_cost_s,
                        search_id))

    def request_stop(self, search_id: int) -> str | None:
        """Ask a search to stop; a queued one is stopped at once. Its status before."""
        with self._tx() as db:
            row = db.execute("SELECT status FROM searches WHERE id = ?", (search_id,)).fetchone()
            if row is None:
                return None
            if row["status"] == "queued":
                db.execute("UPDATE searches SET status = 'stopped', finished_at = ?, error = NULL, initial = NULL "
                           "WHERE id = ?", (time.time(), search_id))
            elif row["status"] == "running":
                db.execute("UPDATE searches SET stop_requested = 1 WHERE id = ?", (search_id,))
            return row["status"]

    def stop_requested(self, search_id: int) -> bool:
        row = self._conn().execute("SELECT stop_requested, status FROM searches WHERE id = ?",
                                   (search_id,)).fetchone()
        return row is None or bool(row["stop_requested"]) or row["status"] in FINAL

    def search(self, search_id: int) -> dict | None:
        row = self._conn().execute("SELECT * FROM searches WHERE id = ?", (search_id,)).fetchone()
        return None if row is None else self._row(row)

    def latest_search(self, sid: str, plans: bool = False) -> dict | None:
        """The session's most recent search (``plans``: its most recent GPU comparison,
        :mod:`app.planjob`, a job of the same queue and workers)."""
        row = self._conn().execute(  # (not its starting strategy, which is its worker's alone: tens of kB)
            f"SELECT {SEARCH_SUMMARY} FROM searches WHERE sid = ? AND algorithm {'=' if plans else '!='} ? "
            "ORDER BY id DESC LIMIT 1", (sid, PLAN_JOB)).fetchone()
        return None if row is None else self._row(row)

    def running_searches(self) -> list[dict]:
        return [self._row(r) for r in self._conn().execute("SELECT * FROM searches WHERE status = 'running'")]

    def progress_since(self, search_id: int, seq: int) -> list[tuple[int, dict]]:
        """(seq, row) of the search's progress rows after ``seq``, in order."""
        return [(int(r[0]), json.loads(r[1])) for r in self._conn().execute(
            "SELECT seq, row FROM progress WHERE search_id = ? AND seq > ? ORDER BY seq", (search_id, seq))]

    def queued_count(self) -> int:
        """Searches queued on the server, all sessions together."""
        return int(self._conn().execute("SELECT COUNT(*) FROM searches WHERE status = 'queued'").fetchone()[0])

    def queue_position(self, search_id: int) -> int:
        """1 for the next search to start, 2 for the one after, ... (:func:`app.fairqueue.fair_order`); 0
        when not queued."""
        order = fair_order(self._conn())
        return order.index(search_id) + 1 if search_id in order else 0

    def compact(self, pages: int = 2048) -> int:
        """Give up to ``pages`` freed pages back to the file system (a store made with
        incremental auto-vacuum; an older one keeps its size until :meth:`recover` vacuums it);
        the pages still free after."""
        db = self._conn()
        db.execute(f"PRAGMA incremental_vacuum({int(pages)})").fetchall()
        return int(db.execute("PRAGMA freelist_count").fetchone()[0])

    def recover(self) -> int:
        """At server start: every search left queued or running by a server that is gone is
        marked ``interrupted`` (keeping its best so far); old rows are pruned. Returns how many
        were interrupted."""
        now = time.time()
        cutoff = now - KEEP_DAYS * 86400
        with self._tx() as db:
            n = db.execute("UPDATE searches SET status = 'interrupted', finished_at = ?, initial = NULL, error = "
                           "'the server stopped while this search was ' || status WHERE status IN ('queued', 'running')",
                           (now,)).rowcount
            old = [r[0] for r in db.execute("SELECT id FROM searches WHERE finished_at < ?", (cutoff,))]
            self._delete(db, old)
            db.execute("DELETE FROM uploads WHERE used_at < ?", (cutoff,))
        conn = self._conn()
        if not conn.execute("PRAGMA auto_vacuum").fetchone()[0]:  # (a store made before: made compactable)
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            conn.execute("VACUUM")
        self.compact(1 << 30)
        return int(n)

    @staticmethod
    def _row(row: sqlite3.Row) -> dict:
        """A ``searches`` row as a dict, its JSON fields decoded."""
        out = dict(row)
        for key in ("refs", "initial", "best", "result"):
            if out.get(key) is not None:
                out[key] = json.loads(out[key])
        return out


for _name in ("has_upload", "get_upload", "upload_usage", "claim_next", "add_progress", "set_best", "finish", "compact",
              "request_stop", "stop_requested", "search", "latest_search", "running_searches", "progress_since",
              "queued_count", "queue_position", "recover", "put_upload", "create_search"):
    setattr(Store, _name, guarded(getattr(Store, _name)))  # (SQLite's errors said in words)


# --------------------------------------------------------------------------- opening as a server does


def open_checked(path: str | os.PathLike, exclusive: bool = True) -> Store:
    """Open the store at ``path`` as a server does: with ``exclusive``, take its folder for this
    process (:func:`app.datadir.lock_folder`, held by the store until :meth:`Store.release` or
    the process's end); then a damaged file is set aside and a fresh store made, an emptied one
    opened. Either way :attr:`Store.notices` says what happened, naming the file (each notice is
    also logged as a warning).

    Raises
    ------
    DataDirInUse
        When another process holds the folder.
    ValueError
        When a damaged file cannot be set aside (permissions).
    """
    path = Path(path)
    private_dir(path.parent)
    lock = lock_folder(path.parent) if exclusive else None
    try:
        why, emptied = inspect_store(path, TABLES, columns())
        notices = []
        if why is not None:
            aside = set_aside(path, why)
            notices.append(f"the store {path} {why}; it was set aside as {aside.name} and the server starts with "
                           "an empty store (earlier uploads and searches are not available)")
        elif emptied is not None:
            notices.append(f"the store {path} {emptied}; the server starts with an empty store")
        st = Store(path)
    except BaseException:
        if lock is not None:
            lock.close()
        raise
    st.notices, st._folder_lock = notices, lock
    for n in notices:
        logging.getLogger("soapbox.store").warning(n)
    return st


# --------------------------------------------------------------------------- the process's store

_current: Store | None = None
_current_lock = threading.Lock()


def configure(path: str | os.PathLike, checked: bool = False) -> Store:
    """Open the store at ``path`` (a SQLite file) as this process's store; with ``checked`` as a
    server does (:func:`open_checked`: a damaged file is set aside)."""
    global _current
    with _current_lock:
        if _current is None or _current.path != Path(path):
            if _current is not None:
                _current.release()  # (a server's earlier folder, in tests: let go before the next is taken)
            _current = open_checked(path) if checked else Store(path)
        return _current


def current() -> Store:
    """This process's store; a fresh one in a temporary folder when none was configured (tests
    and library use; ``soapbox serve`` configures the data directory's)."""
    global _current
    with _current_lock:
        if _current is None:
            import tempfile

            _current = Store(Path(tempfile.mkdtemp(prefix="soapbox-")) / "soapbox.sqlite3")
        return _current
