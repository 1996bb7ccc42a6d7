"""The ``soapbox`` command: the engine's commands plus ``serve`` (the web app)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from engine.cli import int_in
from engine.cli import main as engine_main

__all__ = ["main"]


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0 for all; default 127.0.0.1)")
    p.add_argument("--port", type=int_in(0, 65535), default=8050, help="port (default 8050)")
    p.add_argument("--data-dir", help="where uploads and searches are kept (an SQLite database; default "
                                      "the platform's user data directory, e.g. ~/.local/share/soapbox)")
    p.add_argument("--workers", type=int_in(1, 256), help="searches run at once, each in its own process "
                                                  "(default: cores - 1, at least 1); more wait in a queue")
    p.add_argument("--threads", type=int_in(1, 256), default=8, help="request threads (default 8)")
    p.add_argument("--idle-evict", type=_seconds, default=None, metavar="SECONDS",
                   help="drop a session's cached simulation after this long without a request (default 600)")
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


_served = False  # whether this process ran the server (which exits the normal way)


def _serve(args: argparse.Namespace) -> int:
    global _served
    _served = True
    from . import IDLE_EVICT_S, MAX_REQUEST_BYTES, create_app, limit_malloc_arenas
    from .warmup import warm_up

    limit_malloc_arenas(2)  # before the janitor, the pool's manager and the request threads
    try:
        app = create_app(args.data_dir, args.workers, args.idle_evict or IDLE_EVICT_S)
    except OSError as e:
        raise ValueError(f"cannot use the data directory {args.data_dir or '(default)'}: {e.strerror or e}") from None
    warm_up()
    info = app.soapbox_info
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    print(f"soapbox explorer: http://{shown}:{args.port}/  (Ctrl+C to stop)", flush=True)
    print(f"data: {info['data_dir']}; searches run {info['workers']} at a time"
          + (f"; {info['interrupted']} search(es) interrupted by the last stop" if info["interrupted"] else ""),
          flush=True)
    if args.debug:
        app.run(host=args.host, port=args.port, debug=True)
        return 0
    import waitress  # a production WSGI server: a fixed pool of request threads, bounded bodies

    waitress.serve(app.server, host=args.host, port=args.port, threads=args.threads,
                   max_request_body_size=MAX_REQUEST_BYTES, ident="soapbox")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return engine_main(argv, extra={"serve": ("run the web explorer (Dash)", _serve_args, _serve)})


def run() -> None:
    """The console entry point: :func:`main`, then exit at once.

    A one-shot command's outputs are closed by then (files in ``with`` blocks, temporary
    files removed in ``finally``), so after flushing stdout and stderr the process ends
    without tearing down its modules and arrays: 0.15 s of a 0.7 s ``soapbox simulate``
    of Inception-v3 (numba's and llvmlite's finalisers). ``serve`` exits normally."""
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
