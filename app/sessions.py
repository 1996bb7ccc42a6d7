"""Everything the server keeps between requests, in one object: :class:`Sessions`.

The browser's state is the single source of truth (:mod:`app.state`); what the server holds
is a cache of what that state costs to compute again — parsed models and strategies, each
session's simulation (a :class:`app.simulation.Workspace`), drawn views, Compare's
simulations, baselines' costs, smallest-cluster scans — and the background builds that are
filling it. All of it lives here, bounded, with idle entries evicted by the server's janitor
(:meth:`Sessions.evict_idle`, :meth:`Sessions.trim`); no other module of the app keeps
mutable state of its own. A restarted server loses nothing but time.

Background builds (:meth:`Sessions.submit`) run on a small pool; each carries a
:class:`threading.Event` that the build's loops poll (cooperative cancellation,
:class:`engine.errors.Cancelled`): a build the session cancelled or moved on from *stops*,
it is not merely forgotten. At most :data:`MAX_QUEUED_BUILDS` wait at once on a server; past
that a new one is refused with a message (:class:`Busy`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from engine.cluster.presets import PRESETS

from .cache import IdleCache

__all__ = ["Sessions", "Build", "FitScan", "Busy", "current", "reset", "MAX_SESSIONS", "MAX_QUEUED_BUILDS",
           "BUILD_WORKERS"]

#: sessions whose simulation is kept in memory (least recently used dropped first)
MAX_SESSIONS = 32
#: background builds (simulations of a page's strategy) running at once on a server
BUILD_WORKERS = 2
#: background builds queued or running at once on a server, all sessions together; past it a
#: new one is refused ("the server is busy") rather than queued behind an unbounded line
MAX_QUEUED_BUILDS = 8
#: smallest-cluster scans kept (one per session; the oldest sessions' go first)
MAX_FIT_SCANS = 64


class Busy(RuntimeError):
    """The server already has :data:`MAX_QUEUED_BUILDS` simulations queued or running."""


@dataclass
class Build:
    """A page's strategy being simulated off the request path, for one session's state."""

    sid: str
    key: str  #: :func:`app.state.content_key` of the state it simulates
    started: float = field(default_factory=time.monotonic)  #: monotonic seconds
    future: Future | None = None
    phase: str = "queued behind other simulations"
    #: set when the session cancels the build or moves on from it; the build's loops poll it
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class FitScan:
    """A session's smallest-cluster scan (:mod:`app.fitscan`): the sizes tried so far."""

    key: str
    layout: str
    rows: list = field(default_factory=list)
    done: bool = False
    error: str | None = None
    cancelled: bool = False


class Sessions:
    """Per-server caches and background work, bounded and evicted when idle.

    Parameters
    ----------
    max_sessions : int
        Sessions whose simulation (workspace) is kept.
    build_workers : int
        Background builds that run at once.
    max_queued_builds : int
        Background builds queued or running at once, all sessions together.
    """

    def __init__(self, max_sessions: int = MAX_SESSIONS, build_workers: int = BUILD_WORKERS,
                 max_queued_builds: int = MAX_QUEUED_BUILDS) -> None:
        self.max_sessions = max_sessions
        self.max_queued_builds = max_queued_builds
        #: guards ``workspaces``, ``builds`` and ``fit_scans`` (re-entrant: a build's future may
        #: complete, and run its callback, inside it)
        self.lock = threading.RLock()
        # resolved sources: the same object for the same name, so that a workspace can tell by
        # identity that its model and cluster are still the state's
        self.samples = IdleCache(16)  #: (name, batch, seq_len, precision) -> OpGraph
        #: preset name -> Cluster: room for every family's one-node size (the page's cluster
        #: menu reads them all on each load: a smaller cache made them all again each time) and
        #: 32 sized ones
        self.presets = IdleCache(len(PRESETS) + 32)
        self.uploads = IdleCache(16)  #: "kind:digest" -> parsed OpGraph or Cluster
        self.parsed = IdleCache(64)  #: strategy content digest -> Strategy
        #: content keys whose strategy an action has already checked (the render that follows
        #: does not check and size it again), and states that passed ``check_state``
        self.checked = IdleCache(256)
        self.baselines = IdleCache(256)  #: (model fingerprint, cluster digest, kind) -> (s, bytes, fits)
        self.drawn = IdleCache(12)  #: render key -> the Explore views (the default page pinned)
        self.last_drawn = IdleCache(64)  #: sid -> the state its views were last drawn for
        self.layouts = IdleCache(32)  #: (model fingerprint, collapsed) -> the op graph's drawing
        self.compared = IdleCache(12)  #: content key -> (strategy, timeline, memory) of a kept strategy
        self.progress = IdleCache(64)  #: search id -> (seq read up to, progress rows)
        self.workspaces: "OrderedDict[str, Any]" = OrderedDict()  #: sid -> Workspace
        self.builds: dict[str, Build] = {}  #: sid -> its queued or running build
        self.fit_scans: "OrderedDict[str, FitScan]" = OrderedDict()  #: sid -> its latest scan
        self._inside = 0  # builds inside their work now
        self.last_request_s = time.monotonic()  #: when the server last saw a request (monotonic s)
        self._secrets: dict[Path, bytes] = {}  # data dir -> the key that signs session ids
        self.forgotten = 0  #: workspaces dropped by :meth:`forget` since the last :meth:`evict_idle`
        self._build_pool = ThreadPoolExecutor(max_workers=build_workers, thread_name_prefix="soapbox-build")
        self._scan_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="soapbox-scan")

    # ------------------------------------------------------------------ session ids

    def secret(self) -> bytes:
        """The key that signs session ids (:func:`app.state.new_sid`), kept beside the store in
        its data directory (readable by its owner only), so that ids outlive a restart."""
        from . import store

        folder = store.current().path.parent
        with self.lock:
            key = self._secrets.get(folder)
            if key is None:
                key = self._secrets[folder] = _read_or_make_key(folder / "session.key")
            return key

    # ------------------------------------------------------------------ workspaces

    def workspace(self, sid: str) -> Any | None:
        """The session's workspace (now counted as used), or None."""
        with self.lock:
            ws = self.workspaces.get(sid)
            if ws is not None:
                self.workspaces.move_to_end(sid)
                ws.used_at = time.monotonic()
            return ws

    def keep(self, sid: str, ws: Any) -> None:
        """Keep ``ws`` as the session's workspace (the least recently used go past the bound)."""
        with self.lock:
            self.workspaces[sid] = ws
            self.workspaces.move_to_end(sid)
            while len(self.workspaces) > self.max_sessions:
                self.workspaces.popitem(last=False)

    def has_workspace(self, sid: str) -> bool:
        with self.lock:
            return sid in self.workspaces

    def forget(self, sid: str) -> bool:
        """Drop session ``sid``'s workspace and stop its build (its tab was closed); whether
        there was a workspace."""
        self.cancel(str(sid))
        with self.lock:
            gone = self.workspaces.pop(str(sid), None) is not None
            self.forgotten += gone
        return gone

    def evict_idle(self, max_idle_s: float) -> int:
        """Drop workspaces unused for ``max_idle_s`` seconds; how many, counting those
        :meth:`forget` dropped since the last call."""
        now = time.monotonic()
        with self.lock:
            old = [sid for sid, ws in self.workspaces.items() if now - ws.used_at > max_idle_s]
            for sid in old:
                del self.workspaces[sid]
            n, self.forgotten = len(old) + self.forgotten, 0
        return n

    def trim(self, max_idle_s: float) -> int:
        """Drop cached views, parsed strategies, Compare's simulations and search traces unused
        for ``max_idle_s`` seconds (pinned entries stay); how many."""
        # (baselines' costs are a few numbers each and take a whole simulation to make again: kept)
        return sum(c.trim(max_idle_s) for c in (self.parsed, self.checked, self.drawn, self.last_drawn, self.layouts,
                                                 self.compared, self.progress, self.uploads))

    # ------------------------------------------------------------------ background builds

    def build(self, sid: str) -> Build | None:
        with self.lock:
            return self.builds.get(sid)

    def submit(self, sid: str, key: str, work: Callable[[Build], Any]) -> Build:
        """The session's build of the state ``key``: the one running if it is for the same
        state, else a new one (``work(build)`` on the pool), the session's previous build
        cancelled (it stops at its next check).

        Raises
        ------
        Busy
            When :attr:`max_queued_builds` builds are already queued or running.
        """
        with self.lock:
            b = self.builds.get(sid)
            if b is not None and b.key == key:
                return b
            if b is not None:
                self._stop(b)
            running = sum(1 for x in self.builds.values() if not x.future.done())
            running = max(running, self._inside)  # (cancelled builds still stopping count too)
            if running >= self.max_queued_builds:
                raise Busy(f"the server is simulating {running} strategies for other pages; try again in a moment")
            b = self.builds[sid] = Build(sid, key)
            b.future = self._build_pool.submit(self._run, work, b)
            b.future.add_done_callback(lambda _f, b=b: self._done(b))
            return b

    def cancel(self, sid: str) -> bool:
        """Stop the session's build (queued: never started; running: it stops at its next
        check, within a second); whether there was one."""
        with self.lock:
            b = self.builds.pop(str(sid), None)
        if b is None:
            return False
        self._stop(b)
        return True

    def busy(self) -> str | None:
        """What an open session still holds or awaits (a simulation kept for its next edit, a
        build queued or running, a smallest-cluster scan), in words; None when nothing: then
        only caches of what is cheap to make again are held (:mod:`app.recycle`)."""
        with self.lock:
            if self.workspaces:
                return f"{len(self.workspaces)} open session(s) hold a simulation"
            if self._inside or any(not b.future.done() for b in self.builds.values() if b.future is not None):
                return "a simulation is building"
            if any(not f.done for f in self.fit_scans.values()):
                return "a smallest-cluster scan is running"
        return None

    def running(self) -> int:
        """How many builds are inside their work now (a cancelled one counts until it has
        stopped)."""
        with self.lock:
            return self._inside

    def _run(self, work: Callable[[Build], Any], b: Build) -> Any:
        with self.lock:
            self._inside += 1
        try:
            return work(b)
        finally:
            with self.lock:
                self._inside -= 1

    @staticmethod
    def _stop(b: Build) -> None:
        b.cancel.set()
        if b.future is not None:
            b.future.cancel()

    def _done(self, b: Build) -> None:
        with self.lock:
            if self.builds.get(b.sid) is b:
                del self.builds[b.sid]

    # ------------------------------------------------------------------ smallest-cluster scans

    def scan(self, sid: str) -> FitScan | None:
        with self.lock:
            return self.fit_scans.get(sid)

    def start_scan(self, sid: str, scan: FitScan, work: Callable[[], None]) -> None:
        """Run ``work`` (the session's new scan) on the scans' pool, the session's previous
        scan cancelled; the oldest sessions' scans go past :data:`MAX_FIT_SCANS`."""
        with self.lock:
            old = self.fit_scans.pop(sid, None)
            if old is not None:
                old.cancelled = True
            self.fit_scans[sid] = scan
            while len(self.fit_scans) > MAX_FIT_SCANS:
                _, gone = self.fit_scans.popitem(last=False)
                gone.cancelled = True
        self._scan_pool.submit(work)

    def close(self) -> None:
        """Cancel every build and scan and stop the pools (a server shutting down, a test)."""
        with self.lock:
            for b in list(self.builds.values()):
                self._stop(b)
            self.builds.clear()
            for s in self.fit_scans.values():
                s.cancelled = True
        self._build_pool.shutdown(wait=False, cancel_futures=True)
        self._scan_pool.shutdown(wait=False, cancel_futures=True)


def _read_or_make_key(path: Path) -> bytes:
    """32 random bytes kept in ``path`` (made with mode 0600 if missing or damaged); a key for
    this process alone when the folder cannot be written."""
    try:
        data = path.read_bytes()
        if len(data) == 32:
            return data
        path.unlink()
        # (announced, not silent: every page open on this server has to start a new session)
        logging.getLogger("soapbox.sessions").warning(
            f"the key that signs session ids, {path}, was damaged ({len(data):,} bytes, not 32): a new one was "
            "made, so pages opened before start new sessions (their uploads are no longer theirs)")
    except FileNotFoundError:
        pass
    except OSError as e:
        logging.getLogger("soapbox.sessions").warning(
            f"cannot read the key that signs session ids, {path} ({e.strerror or e}): this server signs with a key "
            "of its own, so pages start new sessions after a restart")
        return os.urandom(32)
    key = os.urandom(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        return key
    except FileExistsError:  # (another thread or process made it first)
        return _read_or_make_key(path)
    except OSError:
        return key


_current: list[Sessions] = []  # the server's one Sessions (made on first use)
_current_lock = threading.Lock()


def current() -> Sessions:
    """The server's :class:`Sessions` (one per process, made on first use)."""
    with _current_lock:
        if not _current:
            _current.append(Sessions())
        return _current[0]


def reset(sessions: Sessions | None = None) -> Sessions:
    """Replace the server's :class:`Sessions` (a fresh one by default), closing the old one;
    the new one."""
    with _current_lock:
        if _current:
            _current.pop().close()
        _current.append(sessions or Sessions())
        return _current[0]
