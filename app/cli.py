"""The ``soapbox`` command: the engine's commands plus ``serve`` (the web app)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from engine.cli import int_in
from engine.cli import main as engine_main

__all__ = ["main", "waitress_options", "CHANNEL_TIMEOUT_S", "CLEANUP_INTERVAL_S", "CONNECTION_LIMIT"]

#: ``soapbox serve``'s waitress settings (https://docs.pylonsproject.org/projects/waitress/en/stable/arguments.html).
#: Waitress's defaults (100 connections; an idle one closed after 120 s, looked for every 30 s)
#: let 101 idle connections make a new visitor wait 143 s: an idle connection costs a socket,
#: not a request thread, so many are allowed, and they are closed sooner.
#: seconds without activity after which a connection with no request in progress is closed
CHANNEL_TIMEOUT_S = 30
#: how often (seconds) idle connections are looked for
CLEANUP_INTERVAL_S = 5
#: connections open at once (past it, new ones wait in the listen backlog until idle ones close);
#: served with poll() rather than select(), whose sets stop at 1,024 descriptors
CONNECTION_LIMIT = 1000


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0 for all; default 127.0.0.1)")
    p.add_argument("--port", type=int_in(0, 65535), default=8050, help="port (default 8050)")
    p.add_argument("--data-dir", help="where uploads and searches are kept (an SQLite database; default "
                                      "the platform's user data directory, e.g. ~/.local/share/soapbox)")
    p.add_argument("--workers", type=int_in(1, 256), help="searches run at once, each in its own process "
                                                  "(default: cores - 1, at least 1); more wait in a queue")
    p.add_argument("--threads", type=int_in(1, 256), default=8, help="request threads (default 8); idle "
                   f"connections take none and are closed after {CHANNEL_TIMEOUT_S} s")
    p.add_argument("--client-connections", type=int_in(0, 100_000), default=None, metavar="N",
                   help="connections one address may hold before its waiting ones make room (default "
                        "256; 0 behind a reverse proxy, which bounds each client itself)")
    p.add_argument("--trusted-proxy", nargs="+", metavar="ADDR", default=None,
                   help="reverse proxies whose X-Forwarded-For names the visitor (for each visitor's fair share of "
                        "searches and uploads; default: the connection's own address)")
    p.add_argument("--idle-evict", type=_seconds, default=None, metavar="SECONDS",
                   help="drop a session's cached simulation after this long without a request (default 600)")
    p.add_argument("--recycle-mb", type=_megabytes, default=None, metavar="MB",
                   help="once idle, start again in place when holding this much memory over its start, to give "
                        "back what a burst of visitors left (default 40; 0: never; Linux)")
    p.add_argument("--recycle-idle", type=_seconds, default=None, metavar="SECONDS",
                   help="seconds without a request before it may start again (default 30)")
    p.add_argument("--debug", action="store_true", help="Dash debug mode on Flask's development server "
                                                        "(reloads on code changes)")


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 1 <= v <= 7 * 86400:
        raise argparse.ArgumentTypeError(f"{text} must be between 1 and {7 * 86400} seconds")
    return v


def _megabytes(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of megabytes") from None
    if not 0 <= v <= 1e6:
        raise argparse.ArgumentTypeError(f"{text} must be between 0 and 1000000 MB")
    return v


_served = False  # whether this process ran the server (which exits the normal way)
_own_process = False  # whether the command owns its process (the console entry): only then may it exec itself


def waitress_options(threads: int = 8) -> dict:
    """The keyword arguments ``soapbox serve`` gives ``waitress.serve`` (host and port aside): at
    most :data:`CONNECTION_LIMIT` connections, fewer where the process's file limit is lower
    (see :func:`_raise_file_limit`)."""
    from . import MAX_REQUEST_BYTES

    limit = CONNECTION_LIMIT
    soft = _file_limit()
    if soft is not None:  # a connection is a file descriptor: keep 256 for the rest
        limit = max(16, min(limit, soft - 256))
    return {"threads": threads, "connection_limit": limit, "channel_timeout": CHANNEL_TIMEOUT_S,
            "cleanup_interval": CLEANUP_INTERVAL_S, "asyncore_use_poll": True,
            "max_request_body_size": MAX_REQUEST_BYTES, "ident": "soapbox"}


def _file_limit() -> int | None:
    """The process's soft limit on open files (None: unlimited or unknown)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return None if soft == resource.RLIM_INFINITY else int(soft)
    except (ImportError, ValueError, OSError):  # (no resource module on Windows)
        return None


def _raise_file_limit(want: int = CONNECTION_LIMIT + 256) -> None:
    """Raise the soft limit on open files to ``want`` where the hard limit allows (a common soft
    limit is 1,024, below :data:`CONNECTION_LIMIT` connections and the server's own files)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard),
                                                        hard))
    except (ImportError, ValueError, OSError):
        pass


def _log_to_stderr() -> None:
    """The server's own warnings (``soapbox.*`` loggers: a store set aside, a search pool's
    failure) on stderr as ``soapbox: warning: ...``, once each."""
    import logging

    class _Lower(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return f"soapbox: {record.levelname.lower()}: {super().format(record)}"

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Lower("%(message)s"))
    log = logging.getLogger("soapbox")
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False  # (waitress configures the root logger: not twice)


def _serve(args: argparse.Namespace) -> int:
    global _served
    _served = True
    import sqlite3

    from . import IDLE_EVICT_S, create_app, limit_malloc_arenas
    from .warmup import settle_heap, warm_up

    limit_malloc_arenas(2)  # before the janitor, the pool's manager and the request threads
    from .clients import trust_proxy
    from .datadir import adopt_lock
    from .recycle import handed_over

    handed = handed_over()  # (this image replaced one that started again in place: app.recycle)
    if handed is not None:
        adopt_lock(handed["lock"])

    trust_proxy(args.trusted_proxy)
    _log_to_stderr()
    _raise_file_limit()
    os.umask(0o077)  # what the server and its workers write is their owner's only (see app.datadir)
    try:
        app = create_app(args.data_dir, args.workers, args.idle_evict or IDLE_EVICT_S)
    except OSError as e:
        raise ValueError(f"cannot use the data directory {args.data_dir or '(default)'}: {e.strerror or e}") from None
    except sqlite3.Error as e:  # (a store that fails after its check: no traceback either)
        raise ValueError(f"cannot use the store in {args.data_dir or '(the default data directory)'}: {e}") from None
    info = app.soapbox_info  # (a store set aside or found emptied was said on stderr: app.store.open_checked)
    warm_up()
    settle_heap()
    if handed is None:
        shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        print(f"soapbox explorer: http://{shown}:{args.port}/  (Ctrl+C to stop)", flush=True)
        print(f"data: {info['data_dir']}; searches run {info['workers']} at a time"
              + (f"; {info['interrupted']} search(es) interrupted by the last stop" if info["interrupted"] else ""),
              flush=True)
    if args.debug:
        app.run(host=args.host, port=args.port, debug=True)
        return 0
    import logging

    from .edge import CLIENT_CONNECTIONS, make_server  # waitress, each client bounded (app.edge)

    logging.basicConfig()  # (waitress's own warnings, as waitress.serve sets them up)
    share = CLIENT_CONNECTIONS if args.client_connections is None else args.client_connections
    server = make_server(app.server, args.host, args.port, client_connections=share,
                         sockets=handed["listen"] if handed else None, **waitress_options(args.threads))
    _recycle_when_idle(server.edge_servers, args, handed)
    server.run()
    return 0


def _recycle_when_idle(servers: list, args: argparse.Namespace, handed: dict | None) -> None:
    """Let the idle server start again in place when it holds much more memory than now
    (:mod:`app.recycle`); said on stderr when it has just done so."""
    from . import jobs, store
    from .recycle import GROWTH_MB, IDLE_S, Recycler, rss_kb
    from .sessions import current

    now = rss_kb()
    if handed is not None:
        print(f"soapbox: note: started again in place (time {handed['restarts']}): {handed['held_mb']:.0f} MB "
              f"resident before, {(now or 0) / 1024:.0f} MB now", file=sys.stderr, flush=True)
    growth = GROWTH_MB if args.recycle_mb is None else args.recycle_mb
    if not _own_process or not growth or now is None:
        return

    def busy() -> str | None:
        why = current().busy()
        if why:
            return why
        try:
            db = store.current()
            return "a search or plan is queued or running" if db.running_searches() or db.queued_count() else None
        except Exception as e:  # (a store that cannot be read now: not the moment)
            return f"the store cannot be read ({e})"

    def prepare() -> list[int]:
        jobs.pool().shutdown()  # (its workers are this image's children: not left behind)
        return store.current().lock_descriptors()

    rec = Recycler(growth, IDLE_S if args.recycle_idle is None else args.recycle_idle, now, busy, prepare,
                   lambda: current().last_request_s, handed["restarts"] if handed else 0)
    for s in servers:
        s.after_maintenance = lambda _s: rec.check(servers)


def main(argv: Sequence[str] | None = None) -> int:
    return engine_main(argv, extra={"serve": ("run the web explorer (Dash)", _serve_args, _serve)})


def run() -> None:
    """The console entry point: :func:`main`, then exit at once.

    A one-shot command's outputs are closed by then (files in ``with`` blocks, temporary
    files removed in ``finally``), so after flushing stdout and stderr the process ends
    without tearing down its modules and arrays: 0.15 s of a 0.7 s ``soapbox simulate``
    of Inception-v3 (numba's and llvmlite's finalisers). ``serve`` exits normally."""
    global _own_process
    _own_process = True
    rc = main(sys.argv[1:])
    if _served:  # (its worker pool and database close in their own handlers)
        sys.exit(rc)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`) or a closed stream
            pass
    os._exit(rc)


if __name__ == "__main__":
    run()
