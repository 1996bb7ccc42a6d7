"""Shared fixtures: the explorer served in-process for the browser tests, and Playwright
pointed at the system's Chromium (``apt-get install chromium``; Playwright's own browser
download is not used)."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading

import pytest


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium"


#: How long any wait of a browser test may last (ms): a page load, a click, a download and
#: every ``expect()`` (whose own default is 5 s). A loaded 2-core machine answers a first
#: page in tens of seconds; a test asserts what the page shows, never how fast.
BROWSER_TIMEOUT_MS = 60_000


@pytest.fixture(scope="session")
def browser(browser):
    """Playwright's browser, with every ``expect()`` waiting up to :data:`BROWSER_TIMEOUT_MS`
    (set once, globally: pages a test opens itself get it too)."""
    from playwright.sync_api import expect

    expect.set_options(timeout=BROWSER_TIMEOUT_MS)
    return browser


@pytest.fixture
def context(context):
    """Playwright's per-test context, its pages' actions and loads waiting up to
    :data:`BROWSER_TIMEOUT_MS`."""
    context.set_default_timeout(BROWSER_TIMEOUT_MS)
    context.set_default_navigation_timeout(BROWSER_TIMEOUT_MS)
    return context


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """Playwright uses the system's Chromium (see README: the test command installs it)."""
    path = os.environ.get("SOAPBOX_CHROMIUM") or _chromium()
    if not os.path.exists(path):
        pytest.fail(f"Chromium not found at {path}: install it (apt-get install -y chromium) or set SOAPBOX_CHROMIUM")
    return {**browser_type_launch_args, "executable_path": path, "args": ["--no-sandbox"]}


@pytest.fixture(scope="session")
def app_url(tmp_path_factory):
    """The explorer on a free local port, warmed up like ``soapbox serve``, for the session
    (its uploads and searches in a temporary data directory)."""
    from werkzeug.serving import make_server

    from app import create_app
    from app.warmup import warm_up

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no request log in test reports
    app = create_app(data_dir=tmp_path_factory.mktemp("soapbox-data"))
    warm_up()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = make_server("127.0.0.1", port, app.server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}/"
    server.shutdown()


@pytest.fixture
def alex() -> dict:
    """A fresh app state: AlexNet on p100-4x4, data parallel, with its own session id."""
    from app.state import new_state

    return new_state("alexnet")


@pytest.fixture(scope="module")
def alexnet():
    """(graph, cluster): AlexNet on p100-4x4."""
    from engine.cluster import preset
    from engine.formats import resolve_model

    return resolve_model("alexnet"), preset("p100-4x4")
