"""The soapbox explorer: a Dash app over :mod:`engine` (the engine never imports it).

``create_app()`` builds the app; ``soapbox serve`` runs it. Session state lives in the tab's
``dcc.Store`` (``sessionStorage``; see :mod:`app.state`); what the server keeps between
requests is one :class:`app.sessions.Sessions`; each tab's layout and callbacks are in
:mod:`app.tabs` (plain functions tests call), wired by :mod:`app.callbacks`; views are pure
figure builders (:mod:`app.figures`) over view data (:mod:`app.views`, :mod:`app.gantt`).
Searches run in worker processes (:mod:`app.jobs`) and, with uploads, are kept in an SQLite
database under the data directory (:mod:`app.store`). ``app/README.md`` maps the rooms.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

__all__ = ["create_app", "limit_malloc_arenas", "release_memory", "MAX_REQUEST_BYTES", "IDLE_EVICT_S"]

ASSETS = Path(__file__).parent / "assets"

#: the largest request body the server reads (Flask's ``MAX_CONTENT_LENGTH``); above the upload
#: box's limit plus the state sent with it, so that the upload check, not a bare 413, answers
MAX_REQUEST_BYTES = 32 * 2**20
#: a JSON request body nested deeper than this is refused before it is parsed (a session state
#: is nested about 8 deep)
MAX_REQUEST_DEPTH = 64
#: a session's cached simulation is dropped after this long without a request (the tab also
#: says when it closes, see ``assets/bye.js``)
IDLE_EVICT_S = 600.0
#: seconds unused after which a drawn view, a parsed strategy or a search's trace is dropped
CACHE_IDLE_S = 30.0
#: freed memory is handed back to the system after this many seconds without a request
QUIET_S = 2.0


def create_app(data_dir: str | os.PathLike | None = None, workers: int | None = None,
               idle_evict_s: float = IDLE_EVICT_S):
    """The Dash app, with its layout and callbacks (one instance serves many sessions; each
    browser tab has its own state).

    Parameters
    ----------
    data_dir : path, optional
        Where the database of uploads and searches lives (created if missing, mode 0700;
        default the platform's user data directory, see :func:`app.store.default_data_dir`).
        This process holds it until it exits (:func:`app.store.open_checked`); a damaged
        database in it is set aside (``app.soapbox_info["notices"]`` says so).
    workers : int, optional
        Searches run at once, each in its own process (default: cores - 1, at least 1).
    idle_evict_s : float
        Seconds without a request after which a session's cached simulation is dropped.

    Raises
    ------
    app.store.DataDirInUse
        When another server holds ``data_dir`` (a ``ValueError``).
    """
    from dash import Dash
    from flask import abort, request
    from werkzeug.exceptions import BadRequest

    from .sessions import current

    from . import jobs, store
    from .callbacks import register
    from .layout import make_layout

    folder = Path(data_dir or store.default_data_dir())
    # the folder for this process alone (a second server is refused: DataDirInUse); a damaged
    # database in it is set aside (db.notices say so)
    db = store.configure(folder / store.DB_NAME, checked=True)
    try:
        interrupted = db.recover()
    except store.StoreUnavailable as e:  # (a full disk or a read-only store: the explorer still serves)
        interrupted = 0
        db.notices.append(f"{e}: the explorer runs, but searches and uploads are refused with this reason")
        logging.getLogger("soapbox.store").warning(db.notices[-1])
    jobs.configure(db, workers)
    app = Dash(__name__, title="soapbox", assets_folder=str(ASSETS), suppress_callback_exceptions=False,
               update_title=None)
    app.layout = make_layout
    register(app)
    server = app.server
    server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    from .guard import StrictJSONProvider

    server.json = StrictJSONProvider(server)  # (NaN and Infinity in a request: 400, not JSON)

    @server.before_request
    def _refuse_deep_json():
        current().last_request_s = time.monotonic()
        if request.method == "POST" and request.mimetype == "application/json":
            from engine.formats import too_deep_at

            raw = request.get_data(cache=True)
            if too_deep_at(raw, MAX_REQUEST_DEPTH) is not None:
                abort(400, description=f"request nested deeper than {MAX_REQUEST_DEPTH} levels")
            if request.path.endswith("/_dash-update-component"):
                from .guard import callback_envelope_problem, not_json

                # (parsed by the request itself and cached there: Dash's own read takes the same
                # object, where the guard's json.loads had parsed each body a second time)
                try:
                    body = request.get_json()
                    problem = callback_envelope_problem(body)
                except (BadRequest, RecursionError):  # (werkzeug's answer to a failed parse)
                    body, problem = None, not_json(raw)
                # (one Dash does not know, or runs in the browser, raised KeyError inside Dash: a 500)
                if not problem and "callback" not in app.callback_map.get(body["output"], {}):
                    problem = f"no callback on the server writes {body['output'][:80]!r}"
                if problem:
                    abort(400, description=f"malformed callback request: {problem}")

    @server.post("/_soapbox/bye")
    def _bye():
        """The tab closed: drop its cached simulation now (``navigator.sendBeacon``)."""
        from .sessions import current

        sid = request.get_data(cache=False)[:64].decode("ascii", "replace")
        current().forget(sid)
        return "", 204

    threading.Thread(target=_janitor, args=(idle_evict_s,), name="soapbox-janitor", daemon=True).start()
    app.soapbox_info = {"data_dir": str(db.path.parent), "interrupted": interrupted, "workers": jobs.pool().workers,
                        "notices": list(db.notices)}
    return app


def _janitor(idle_evict_s: float) -> None:
    """Drop idle sessions' simulations and cached views; give freed memory back to the
    system once the server is quiet."""
    from .sessions import current

    period = min(5.0, idle_evict_s / 4)
    caches_s = min(CACHE_IDLE_S, idle_evict_s)
    pending = 0
    while True:
        time.sleep(min(period, QUIET_S))
        pending += current().evict_idle(idle_evict_s)
        # drawn views, parsed strategies and search traces are cheap to make again and large
        # to keep (BENCHMARKS.md: what a burst of sessions left otherwise stays resident)
        pending += current().trim(caches_s)
        try:  # (what deleted searches and uploads freed, back to the file system)
            from .store import current as store

            store().compact()
        except ValueError:
            pass  # (a store that cannot be written now: the pages stay free inside it)
        if pending and time.monotonic() - current().last_request_s >= QUIET_S:
            release_memory()  # (it holds the allocator's lock while it walks the heap: not under load)
            pending = 0


#: glibc ``mallopt`` parameter number of ``M_ARENA_MAX`` (malloc.h)
_M_ARENA_MAX = -8


def limit_malloc_arenas(n: int = 2) -> bool:
    """Let glibc keep at most ``n`` malloc arenas (its default is 8 per core): each request
    thread otherwise gets an arena of its own, and memory freed in one stays resident there
    (measured with benchmarks/bench_load.py: BENCHMARKS.md). Call before threads start;
    whether it took effect."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, int(n)))
    except (OSError, AttributeError):
        return False


def release_memory() -> None:
    """Collect garbage and ask glibc to return free heap pages (``malloc_trim``): freed arrays of
    a dropped simulation otherwise stay in the process's resident memory."""
    import ctypes
    import gc
    import sys

    from engine.taskgraph import forget_found

    forget_found()  # (the last strategies' configs the symmetry search remembers)
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
