"""The server store's shape: its tables (:data:`SCHEMA`) and the bounds on what it keeps
(:mod:`app.store` keeps them; its module docstring says how)."""

from __future__ import annotations

import sqlite3
from typing import Callable, ContextManager

__all__ = ["SEARCHES_PER_SESSION", "MAX_KEPT_SEARCHES", "CLIENT_SEARCHES", "CLIENT_UPLOADS", "UPLOADS_PER_SESSION", "MAX_QUEUED_SEARCHES", "MAX_STORED_UPLOADS", "MAX_STORED_UPLOAD_BYTES", "UPLOAD_IN_USE_S", "KEEP_DAYS", "DB_NAME", "MAX_PROGRESS_ROWS", "PLAN_JOB", "STATUSES", "FINAL", "SCHEMA", "LATE_SCHEMA", "SEARCH_SUMMARY", "TABLES",
           "MIGRATED", "columns", "make_tables"]

#: searches kept per session (oldest finished ones dropped first)
SEARCHES_PER_SESSION = 5
#: uploads kept per session (least recently used dropped first); the state names one model
#: and one cluster, a few more let undo across an import still resolve
UPLOADS_PER_SESSION = 8
#: finished searches kept on one server, all sessions together (the oldest dropped first, with
#: their progress rows): with each search's trace at most MAX_PROGRESS_ROWS rows and its
#: starting strategy dropped when it ends, the store stays within a few hundred MB
MAX_KEPT_SEARCHES = 200
#: searches one client (an address: :mod:`app.clients`) may have queued at once, all its
#: pages together (a page has one search at a time): a classroom behind one address queues a
#: search per student; one visitor's hundred pages take no more, and the queue takes clients
#: in turn (:mod:`app.fairqueue`), so another visitor's search waits for one of theirs at most
CLIENT_SEARCHES = 32
#: uploads one client may keep on the server, all its sessions together (past it, its own
#: least recently used make room: it cannot fill the server's store)
CLIENT_UPLOADS = 64
#: searches queued at once on one server, all clients together (running ones not counted: at
#: most one per worker): two clients' full shares
MAX_QUEUED_SEARCHES = 64
#: uploads kept on one server, all sessions together: how many, and their total size (bytes of
#: their JSON). Past either, uploads unused for :data:`UPLOAD_IN_USE_S` are dropped, least
#: recently used first; when that is not enough, the upload is refused
MAX_STORED_UPLOADS = 512
MAX_STORED_UPLOAD_BYTES = 256 * 2**20
#: an upload read or stored within this long is never dropped to make room for another
UPLOAD_IN_USE_S = 3600.0
#: finished searches and uploads untouched for this long are deleted at start-up
KEEP_DAYS = 14
#: the database's file name in the data directory
DB_NAME = "soapbox.sqlite3"
#: progress rows stored per search (a long MCMC run emits one per 10 proposals); beyond this,
#: every other stored row is dropped, so the trace keeps its shape at half the resolution
MAX_PROGRESS_ROWS = 4000

#: the algorithm name under which a GPU comparison (:mod:`app.planjob`) is queued
PLAN_JOB = "plan"

STATUSES = ("queued", "running", "finished", "stopped", "failed", "interrupted")
#: statuses after which a search no longer changes
FINAL = ("finished", "stopped", "failed", "interrupted")

SCHEMA = """
CREATE TABLE IF NOT EXISTS uploads (
    sid TEXT NOT NULL, digest TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,
    data TEXT NOT NULL, used_at REAL NOT NULL, size_bytes INTEGER NOT NULL DEFAULT 0,
    client TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (sid, digest));
CREATE TABLE IF NOT EXISTS searches (
    id INTEGER PRIMARY KEY AUTOINCREMENT, sid TEXT NOT NULL, algorithm TEXT NOT NULL,
    budget TEXT NOT NULL, budget_s REAL, seed INTEGER NOT NULL, refs TEXT NOT NULL,
    initial TEXT, status TEXT NOT NULL, stop_requested INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL, started_at REAL, finished_at REAL, worker_pid INTEGER,
    best_cost_s REAL, best TEXT, result TEXT, error TEXT, client TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS searches_sid ON searches (sid, id);
CREATE INDEX IF NOT EXISTS searches_status ON searches (status, id);
CREATE TABLE IF NOT EXISTS progress (
    search_id INTEGER NOT NULL, seq INTEGER NOT NULL, row TEXT NOT NULL, PRIMARY KEY (search_id, seq));
"""
#: made once the columns :data:`MIGRATED` adds are there: the fair queue's per-client counts and
#: last starts (:mod:`app.fairqueue`) read an index, not every row past its starting strategy
LATE_SCHEMA = """
CREATE INDEX IF NOT EXISTS searches_client ON searches (client, status, started_at);
CREATE INDEX IF NOT EXISTS searches_queue ON searches (status, client);
"""
#: a search's columns but its starting strategy (its worker's alone: a page's poll never reads
#: the tens of kB to MBs of JSON)
SEARCH_SUMMARY = ("id, sid, algorithm, budget, budget_s, seed, refs, status, stop_requested, created_at, started_at, "
                  "finished_at, worker_pid, best_cost_s, best, result, error, client")
TABLES = ("uploads", "searches", "progress")
#: columns a store made before may lack (added when it is opened: :class:`app.store.Store`)
MIGRATED = {"uploads": {"size_bytes": "INTEGER NOT NULL DEFAULT 0", "client": "TEXT NOT NULL DEFAULT ''"},
            "searches": {"client": "TEXT NOT NULL DEFAULT ''"}}


def make_tables(db: sqlite3.Connection, tx: Callable[[], ContextManager[sqlite3.Connection]]) -> None:
    """Give ``db`` this shape: :data:`SCHEMA`'s tables (a new file gets incremental auto-vacuum
    first: deleted rows then free pages), the columns :data:`MIGRATED` lists where a store made
    before lacks them (each added in a write transaction of ``tx``), then :data:`LATE_SCHEMA`."""
    if not db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]:
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # (set before the first table)
    db.executescript(SCHEMA)
    for table, added in MIGRATED.items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        for name, definition in added.items():
            if name not in have:
                with tx() as t:
                    t.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
                    if name == "size_bytes":
                        t.execute("UPDATE uploads SET size_bytes = LENGTH(CAST(data AS BLOB))")
    db.executescript(LATE_SCHEMA)


def columns() -> dict[str, set[str]]:
    """Each table's columns as :data:`SCHEMA` makes them, less those :data:`MIGRATED` adds."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(SCHEMA)
        return {t: {r[1] for r in mem.execute(f"PRAGMA table_info({t})")} - set(MIGRATED.get(t, {})) for t in TABLES}
    finally:
        mem.close()
