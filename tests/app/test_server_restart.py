"""kill -9 of a real ``soapbox serve`` during a search: after a restart on the same data
directory, the tab's edits and the search (interrupted, with its best so far) are still there.

The server runs as a separate process (``python -m app.cli serve``), exactly as a user starts
it; the browser is the system's Chromium driven by Playwright.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from test_browser import TIMEOUT_MS, edit_op, open_app, summary

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed, not yet reaped by init) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[-1].startswith("Z"))


class Server:
    """``soapbox serve`` in a subprocess on a fixed port and data directory."""

    def __init__(self, port: int, data_dir: Path) -> None:
        self.port, self.data_dir = port, data_dir
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port), "--data-dir", str(self.data_dir),
             "--workers", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            cwd=Path(__file__).resolve().parents[2])
        deadline = time.monotonic() + 120
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            lines.append(line)
            if "soapbox explorer: http://" in line:
                break
            if not line and self.proc.poll() is not None:
                raise AssertionError("soapbox serve exited:\n" + "".join(lines))
        else:
            raise AssertionError("soapbox serve did not start:\n" + "".join(lines))
        self.banner = "".join(lines) + self.proc.stdout.readline()
        while time.monotonic() < deadline:  # listening once waitress has bound the port
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise AssertionError("soapbox serve is not listening")

    def kill9(self) -> list[int]:
        """SIGKILL the server (no clean-up of any kind); the pids of its workers then."""
        workers = _children(self.proc.pid)
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        return workers

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def server(tmp_path):
    srv = Server(_free_port(), tmp_path / "data")
    srv.start()
    yield srv
    srv.stop()


def test_kill_9_during_a_search_loses_neither_edits_nor_the_search(page: Page, server: Server):
    open_app(page, server.url)
    before = summary(page)
    edit_op(page, "fc", {"sample": 4}, "4-7")
    expect(page.locator("#message")).to_contain_text("Changed fc")
    expect(page.locator("#sum-time")).not_to_have_text(before)
    edited = summary(page)

    page.locator("#tabs").get_by_text("Search", exact=True).click()
    page.fill("#search-budget", "10m")
    page.click("#search-start")
    # running, and it has written a best strategy (the worker stores it at most every 0.5 s)
    expect(page.locator("#search-status")).to_contain_text(re.compile(r"auto: [\d,]+ proposals in .* best \d"))
    page.wait_for_timeout(1500)

    workers = server.kill9()
    assert workers, "the search ran in a worker process"
    deadline = time.monotonic() + 60  # (a generous wait: PR_SET_PDEATHSIG acts at once)
    while any(_alive(w) for w in workers):  # the workers die with the server (PR_SET_PDEATHSIG)
        assert time.monotonic() < deadline, "a search worker outlived the server"
        time.sleep(0.1)

    server.start()
    assert "1 search(es) interrupted by the last stop" in server.banner
    page.reload()
    # the tab's state came back from sessionStorage: the edit is still there
    expect(page.locator("#sum-time")).to_have_text(edited, timeout=TIMEOUT_MS)
    page.locator("#tabs").get_by_text("Search", exact=True).click()
    status = page.locator("#search-status")
    expect(status).to_contain_text("interrupted (the server stopped while this search was running)")
    expect(status).to_contain_text("so far. Adopt it to edit it.")
    page.click("#search-adopt")
    expect(page.locator("#message")).to_contain_text("Adopted the search's best")
    # and the trace it had drawn is there too
    expect(page.locator("#search-trace .scatterlayer .trace").first.locator("path.js-line")).to_have_count(1)
