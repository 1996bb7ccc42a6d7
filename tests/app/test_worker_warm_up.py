"""A search worker warms up once a search waits, and before it claims it (a search's budget
counts from its claim: its proposals should not pay for loading the engine), never while
the queue is empty (an idle worker stays small). The worker's loop runs in a thread here,
with the warm-up and the search itself recorded instead of run."""

from __future__ import annotations

import os
import threading
import time

from app import store as S
from app import worker

WAIT_S = 60.0


def test_the_worker_warms_up_when_a_search_waits_then_claims_it(monkeypatch, tmp_path):
    st = S.Store(tmp_path / "s.sqlite3")
    calls: list[tuple] = []
    monkeypatch.setattr(worker, "warm_up", lambda: calls.append(("warm", st.queued_count(), len(st.running_searches()))))
    monkeypatch.setattr(worker, "run_search", lambda store, row, parent: calls.append(("run", row["id"])))
    monkeypatch.setattr(worker.signal, "signal", lambda *a: None)  # (the loop runs in a thread)
    monkeypatch.setattr(worker.os, "nice", lambda n: 0)
    monkeypatch.setattr(S, "configure", lambda path, checked=False: st)
    monkeypatch.setattr("engine.search.processes.die_with_parent", lambda: None)
    loop = threading.Thread(target=worker.main, args=(str(st.path), os.getppid(), 0.01), daemon=True)
    loop.start()
    time.sleep(0.5)
    assert calls == []  # nothing queued: no warm-up
    sid = st.create_search("page", "mcmc", "2s", 2.0, 0, {}, None)
    loop.join(WAIT_S)
    assert not loop.is_alive()
    assert calls == [("warm", 1, 0), ("run", sid)]  # warmed with the search queued, not yet claimed
