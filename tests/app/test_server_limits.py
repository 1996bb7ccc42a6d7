"""A real ``soapbox serve`` against what an outside fuzzer did to it (issue 24 part 7): it
starts on a damaged store (set aside, said on stderr, no traceback), refuses a second server on
its data directory, keeps its files to their owner, and answers a new visitor while 120 idle
connections are open. Then waitress's idle timeout itself, on a small in-process server: idle
connections are closed and the visitor behind them is served.

Network: 127.0.0.1 only. Every wait is bounded and generous; no test asserts a speed (the
figures go to benchmarks/).
"""

from __future__ import annotations

import http.client
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app import store
from app.cli import CHANNEL_TIMEOUT_S, waitress_options

ROOT = Path(__file__).resolve().parents[2]
#: seconds any one wait may take on a loaded 2-core machine (a bound, not a measure)
WAIT_S = 120.0
IDLE_CONNECTIONS = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str = "/", timeout: float = WAIT_S) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


class Served:
    """``soapbox serve`` in a subprocess on 127.0.0.1; its output collected by a thread."""

    def __init__(self, data_dir: Path, extra: list[str] | tuple[str, ...] = ()) -> None:
        self.port, self.data_dir = _free_port(), data_dir
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port), "--data-dir", str(data_dir),
             "--workers", "1", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_listening(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"soapbox serve exited ({self.proc.returncode}):\n{self.output}")
            if "soapbox explorer: http://" in self.output:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", self.port)) == 0:
                        return
            time.sleep(0.1)
        raise AssertionError(f"soapbox serve did not start within {WAIT_S:.0f} s:\n{self.output}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._reader.join(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server started on a data directory whose store is a text file."""
    data = tmp_path_factory.mktemp("served") / "data"
    data.mkdir()
    (data / store.DB_NAME).write_text("this is not a database\n")
    srv = Served(data)
    try:
        srv.wait_listening()
        yield srv
    finally:
        srv.stop()


def test_a_damaged_store_is_set_aside_and_the_server_starts(server):
    status, body = _get(server.port)
    assert status == 200 and b"soapbox" in body
    out = server.output
    path = server.data_dir / store.DB_NAME
    assert f"soapbox: warning: the store {path} is a text file, not an SQLite database" in out
    assert "it was set aside as soapbox.sqlite3.damaged-" in out
    assert "Traceback" not in out
    aside = [p for p in server.data_dir.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].read_text() == "this is not a database\n"


def test_a_second_server_on_the_data_dir_is_refused(server):
    second = Served(server.data_dir)
    try:
        rc = second.proc.wait(WAIT_S)
    finally:
        second.stop()
    assert rc != 0
    assert (f"soapbox: error: the data directory {server.data_dir} is in use by another soapbox server "
            f"(process {server.proc.pid})") in second.output
    assert "Traceback" not in second.output
    assert _get(server.port)[0] == 200  # the first one serves on


def test_the_data_files_are_readable_by_their_owner_only(server):
    _get(server.port)
    assert stat.S_IMODE(server.data_dir.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in server.data_dir.iterdir()}
    assert store.DB_NAME in modes and "soapbox.lock" in modes
    assert {n: m & 0o077 for n, m in modes.items()} == {n: 0 for n in modes}


def test_a_new_visitor_is_served_beside_idle_connections(server):
    idle: list[socket.socket] = []
    try:
        for _ in range(IDLE_CONNECTIONS):  # connected, sending nothing (as a stalled or hostile client does)
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S))
        t0 = time.monotonic()
        status, body = _get(server.port)
        waited_s = time.monotonic() - t0
    finally:
        for s in idle:
            s.close()
    assert status == 200 and b"soapbox" in body
    print(f"a new visitor beside {IDLE_CONNECTIONS} idle connections answered in {waited_s:.3f} s")


# --------------------------------------------------------------------------- waitress's idle timeout


def _hello(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello"]


def test_serve_closes_idle_connections():
    """The settings ``soapbox serve`` runs waitress with, and nothing close to its default
    (100 connections, 120 s idle, looked for every 30 s: 143 s for the 101st visitor)."""
    opts = waitress_options(8)
    assert opts["channel_timeout"] == CHANNEL_TIMEOUT_S <= 60 and opts["cleanup_interval"] <= 10
    assert opts["connection_limit"] >= 4 * IDLE_CONNECTIONS and opts["asyncore_use_poll"] is True


def test_a_full_server_closes_idle_connections_and_serves_the_next_visitor():
    """waitress with serve's settings but a small connection limit and a short idle timeout:
    idle connections fill it, they are closed, and the visitor waiting behind them is served."""
    import waitress

    limit = 12
    opts = dict(waitress_options(2), connection_limit=limit, channel_timeout=2, cleanup_interval=1)
    srv = waitress.create_server(_hello, host="127.0.0.1", port=0, **opts)
    port = srv.effective_port
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    idle: list[socket.socket] = []
    try:
        for _ in range(limit + 4):  # past the limit: the last ones wait in the listen backlog
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=WAIT_S))
        status, body = _get(port)  # answered once idle connections are closed (about 2-3 s)
        assert (status, body) == (200, b"hello")
        closed = 0
        for s in idle[:limit - 2]:  # accepted early, then closed by the server for idleness
            s.settimeout(WAIT_S)
            closed += s.recv(1) == b""
        assert closed == limit - 2
    finally:
        for s in idle:
            s.close()
        srv.close()
        thread.join(WAIT_S)
    assert not thread.is_alive()
