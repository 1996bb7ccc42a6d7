"""The search queue's order: clients in turn (fair queueing), so that a visitor with many pages
open, or many searches, waits behind every other visitor's first search rather than ahead of
it (:class:`app.store.Store` claims and places searches by it)."""

from __future__ import annotations

import sqlite3
import time

__all__ = ["fair_order"]


def fair_order(db: sqlite3.Connection) -> list[int]:
    """The queued searches' ids in the order workers take them: clients in turn (fair
    queueing, one search per client per round): first the client with the fewest searches
    running, then the one whose last search started longest ago (one never served first),
    then the oldest search. As the order stands now: a client's second search waits for
    every other client's first."""
    rows = db.execute(
        "SELECT q.id, q.client, "
        "(SELECT COUNT(*) FROM searches r WHERE r.client = q.client AND r.status = 'running'), "
        "(SELECT COALESCE(MAX(r.started_at), 0) FROM searches r WHERE r.client = q.client) "
        "FROM searches q WHERE q.status = 'queued' ORDER BY q.id").fetchall()
    running = {c: n for _, c, n, _ in rows}
    last = {c: t for _, c, _, t in rows}
    waiting: dict[str, list[int]] = {}
    for i, c, _, _ in rows:
        waiting.setdefault(c, []).append(i)
    out: list[int] = []
    now = time.time()
    while waiting:  # (each round: the client first in line takes its oldest; it then counts as served now)
        c = min(waiting, key=lambda k: (running[k], last[k], waiting[k][0]))
        out.append(waiting[c].pop(0))
        running[c] += 1
        last[c] = now + len(out)
        if not waiting[c]:
            del waiting[c]
    return out
