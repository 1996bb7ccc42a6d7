"""What goes wrong with the server's store, in words a page and a log can show: a bound reached
(:class:`StoreFull`) or SQLite failing (:class:`StoreUnavailable`: the disk full, the store
read-only, an I/O error, a lock held too long), and :func:`guarded` that turns the second into
the first kind of message on every :class:`app.store.Store` method."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

__all__ = ["StoreFull", "StoreUnavailable", "storage_problem", "guarded"]


class StoreFull(ValueError):
    """A server-wide bound is reached (queued searches, stored uploads); the message says which
    and what to do."""


class StoreUnavailable(ValueError):
    """The store cannot be read or written: the disk is full, the file or folder read-only, an
    I/O error, a lock held too long. The message names the cause (SQLite's own words are
    "database or disk is full", "attempt to write a readonly database", "cannot rollback - no
    transaction is active": none says what to do)."""


def storage_problem(e: sqlite3.Error, path: Path) -> StoreUnavailable:
    """``e`` (SQLite's error on the store at ``path``) as what a page and a log can say."""
    code = getattr(e, "sqlite_errorcode", None)
    base = code & 0xFF if isinstance(code, int) else None
    text = str(e).lower()
    if base == sqlite3.SQLITE_FULL or "disk is full" in text:
        why = "the disk that holds the server's data is full"
    elif base == sqlite3.SQLITE_READONLY or "readonly" in text or "read-only" in text:
        why = "the server's data store is read-only"
    elif base == sqlite3.SQLITE_IOERR or "disk i/o error" in text:
        why = "the disk that holds the server's data failed (an I/O error)"
    elif base in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in text:
        why = "the server's data store is locked by another process"
    elif base == sqlite3.SQLITE_CANTOPEN or "unable to open" in text:
        why = "the server's data store cannot be opened"
    else:
        why = f"the server's data store failed ({str(e)[:120]})"
    return StoreUnavailable(f"{why} ({path}); searches and uploads cannot be kept until the server's operator "
                            "fixes it")


def guarded(method: Any) -> Any:
    """``method`` of :class:`app.store.Store` with SQLite's errors as :class:`StoreUnavailable`."""
    import functools

    @functools.wraps(method)
    def run(self: Any, *a: Any, **kw: Any) -> Any:
        try:
            return method(self, *a, **kw)
        except sqlite3.Error as e:
            raise storage_problem(e, self.path) from None

    return run
