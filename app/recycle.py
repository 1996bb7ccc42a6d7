"""Giving back what a burst of visitors left behind: once the server is idle and holds much
more memory than it did after warm-up, it starts itself again, in place (issue 45).

Why. After 20 sessions edit and search for a few minutes and close their tabs, the server
keeps 75-85 MB more than it held before them, though every object they made is gone
(BENCHMARKS.md, issue 45; docs/benchmarks/2026-11-30-issue-43-one-run-two-periods.md).
CPython's small-object allocator gives a 1 MiB arena back only when every object in it is
freed, and the 0.8% of a session's objects that live on (interned names, a parsed profile,
a cache entry) pin most of the arenas that were filled during the burst; glibc keeps the heap
pages that small live chunks sit in. Clearing every cache freed 16,338 blocks and no arena.
Only a fresh process holds what a fresh process holds.

Why in place. Nothing the server keeps is lost by starting again: the browser holds each
session's state (:mod:`app.state`), the store holds searches and uploads, the rest is cache
(:mod:`app.sessions`: "a restarted server loses nothing but time"). The process replaces its
own image (``os.execv`` of the same command line), so it keeps its process id (a supervisor,
the lock file's holder and ``kill`` still name it) and keeps open, across the exec, exactly
two things: the listening socket(s), so that a visitor who connects meanwhile waits in the
socket's backlog and is answered by the new image once it has warmed up (3-5 s here),
and the data directory's lock (:class:`app.datadir.FolderLock`), so that no second server can
take the folder in between.

When. Every one of :meth:`Recycler.why_not`'s conditions: resident memory more than
``growth_mb`` over the least it held since warm-up; no request for ``idle_s`` seconds and none being
read, answered or written out; no tab holding a simulation (a tab's is dropped when it closes,
or after ``--idle-evict`` without a request: a tab left open keeps it, and the server waits),
none building, no smallest-cluster scan, no search or plan queued or running. Linux only (the resident size is read
from ``/proc``); ``soapbox serve --recycle-mb 0`` never does it.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from typing import Any, Callable

__all__ = ["Recycler", "rss_kb", "handed_over", "GROWTH_MB", "IDLE_S", "ENV"]

#: resident memory (MB) over the post-warm-up size past which an idle server starts again
GROWTH_MB = 40.0
#: seconds without a request before the server counts as idle
IDLE_S = 30.0
#: the environment variable that carries the kept descriptors across the exec (JSON)
ENV = "SOAPBOX_HANDED_OVER"


def rss_kb() -> int | None:
    """This process's resident memory (KiB, ``VmRSS`` of ``/proc/self/status``); None where
    there is no ``/proc``."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def handed_over() -> dict[str, Any] | None:
    """What the image before this one handed over (and removed from the environment, so that
    workers do not see it): ``{"listen": [fd], "lock": [folder fd, file fd], "restarts": n,
    "held_mb": MB}``; None on a first start or when it does not read as that (descriptors that
    are not open, or listening ones that are not sockets: the server then starts afresh)."""
    raw = os.environ.pop(ENV, None)
    if raw is None:
        return None
    try:
        got = json.loads(raw)
        ok = (isinstance(got, dict) and all(isinstance(fd, int) and fd > 2 for fd in got["listen"] + got["lock"])
              and got["listen"] and len(got["lock"]) in (0, 2)
              and all(stat.S_ISSOCK(os.fstat(fd).st_mode) for fd in got["listen"])  # (open, and sockets)
              and all(os.fstat(fd) for fd in got["lock"]))
    except (ValueError, KeyError, TypeError, OSError):
        ok = False
    return got if ok else None


class Recycler:
    """Decides when the idle server starts again and does it (see the module).

    Parameters
    ----------
    growth_mb : float
        Resident memory over ``baseline_kb`` (MB) past which it starts again.
    idle_s : float
        Seconds without a request first.
    baseline_kb : int
        The resident memory after warm-up (KiB); lowered to the least seen since.
    busy : callable
        Why the server's own work is not finished (builds, scans, searches), or None.
    prepare : callable
        Lets go of what the exec must not leave running (the search workers); returns the lock's
        descriptors to keep ([] when there is no lock).
    restarts : int
        How many times this process started again before.
    """

    def __init__(self, growth_mb: float, idle_s: float, baseline_kb: int, busy: Callable[[], str | None],
                 prepare: Callable[[], list[int]], last_request: Callable[[], float], restarts: int = 0) -> None:
        self.growth_kb = growth_mb * 1024
        self.idle_s, self.baseline_kb = idle_s, baseline_kb
        self.busy, self.prepare, self.last_request = busy, prepare, last_request
        self.restarts = restarts
        self.enabled = True

    def why_not(self, servers: list[Any], now: float | None = None) -> str | None:
        """Why the server does not start again now (None: it should)."""
        if not self.enabled:
            return "not enabled"
        rss = rss_kb()
        if rss is None:
            return "no resident size to read"
        self.baseline_kb = min(self.baseline_kb, rss)  # (the floor: after warm-up, the janitor trims a little)
        if rss - self.baseline_kb <= self.growth_kb:
            return f"{(rss - self.baseline_kb) / 1024:.0f} MB over its start"
        now = time.monotonic() if now is None else now
        if now - self.last_request() < self.idle_s:
            return "a request came in the last seconds"
        for s in servers:
            d = s.task_dispatcher
            if d.active_count or d.queue:
                return "a request is being answered"
            for ch in list(s.active_channels.values()):
                if ch.requests or ch.request is not None or ch.total_outbufs_len:
                    return "a request is being read or written"
        return self.busy()

    def check(self, servers: list[Any]) -> None:
        """Start again when :meth:`why_not` says nothing against it (from the server's loop, so
        that no connection is being accepted meanwhile)."""
        if self.why_not(servers) is None:
            self.restart(servers)

    def restart(self, servers: list[Any]) -> None:
        """Replace this process's image with a fresh one of the same command line, handing
        over the listening sockets and the data directory's lock. Returns only when the exec
        fails (then it is not tried again)."""
        rss = rss_kb() or 0
        print(f"soapbox: note: {rss / 1024:.0f} MB resident, {(rss - self.baseline_kb) / 1024:.0f} MB over its start, "
              f"idle {self.idle_s:.0f} s: starting again in place to give it back", file=sys.stderr, flush=True)
        listen = [s.socket.fileno() for s in servers]
        keep = self.prepare() + listen
        for fd in keep:
            os.set_inheritable(fd, True)
        os.environ[ENV] = json.dumps({"listen": listen, "lock": keep[:len(keep) - len(listen)],
                                      "restarts": self.restarts + 1, "held_mb": round(rss / 1024, 1)})
        sys.stdout.flush()
        try:
            os.execv(sys.executable, [sys.executable] + list(sys.orig_argv[1:]))
        except OSError as e:  # (the interpreter gone or replaced under us: keep serving as we are)
            os.environ.pop(ENV, None)
            self.enabled = False
            print(f"soapbox: warning: could not start again ({e}); serving on as before", file=sys.stderr, flush=True)
