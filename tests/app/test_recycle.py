"""The idle server starts again in place to give back memory (issue 45, :mod:`app.recycle`).

First the decision, on stand-ins for waitress's server and dispatcher (each condition alone
keeps it from starting again); then the handing over of the data directory's lock across an
exec; then a real ``soapbox serve`` (a separate process, ``python -m app.cli``) with a 1 MB
threshold: it does not start again while a tab holds its simulation, does once the tab has
closed, keeps its process id, its port and its lock, and serves the page after. Network:
127.0.0.1 only; every wait is bounded and generous; no test asserts a speed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from app import datadir, recycle
from app.recycle import Recycler, handed_over

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_load import DashClient, call_dependency  # noqa: E402  (the page's requests, without a browser)
from test_server_limits import WAIT_S, Served  # noqa: E402


def _status(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=WAIT_S) as r:
        return r.status


def _server(active: int = 0, queued: bool = False, channels: list | None = None) -> SimpleNamespace:
    d = SimpleNamespace(active_count=active, queue=[1] if queued else [])
    chans = {i: c for i, c in enumerate(channels or [])}
    return SimpleNamespace(task_dispatcher=d, active_channels=chans)


def _channel(requests=(), request=None, out=0) -> SimpleNamespace:
    return SimpleNamespace(requests=list(requests), request=request, total_outbufs_len=out)


@pytest.fixture
def rss(monkeypatch):
    """The resident size :func:`app.recycle.rss_kb` reads (KiB), set by the test."""
    now = {"kb": 300 * 1024}
    monkeypatch.setattr(recycle, "rss_kb", lambda: now["kb"])
    return now


def _recycler(busy=None, last=0.0) -> Recycler:
    return Recycler(40.0, 30.0, 300 * 1024, busy=lambda: busy, prepare=lambda: [], last_request=lambda: last)


def test_it_starts_again_only_when_every_condition_holds(rss):
    r = _recycler()
    quiet = [_server(channels=[_channel()])]
    rss["kb"] = 340 * 1024  # 40 MB over: not past the threshold
    assert r.why_not(quiet, now=100.0) == "40 MB over its start"
    rss["kb"] = 341 * 1024
    assert r.why_not(quiet, now=100.0) is None
    assert r.why_not(quiet, now=29.0) == "a request came in the last seconds"
    assert r.why_not([_server(active=1)], now=100.0) == "a request is being answered"
    assert r.why_not([_server(queued=True)], now=100.0) == "a request is being answered"
    for ch in (_channel(requests=[1]), _channel(request=object()), _channel(out=10)):
        assert r.why_not([_server(channels=[_channel(), ch])], now=100.0) == "a request is being read or written"
    held = _recycler(busy="2 open session(s) hold a simulation")
    assert held.why_not(quiet, now=100.0) == "2 open session(s) hold a simulation"
    r.enabled = False
    assert r.why_not(quiet, now=100.0) == "not enabled"


def test_the_threshold_counts_from_the_least_resident_size_seen(rss):
    r = _recycler()
    rss["kb"] = 280 * 1024  # (the janitor gave some back after warm-up)
    assert r.why_not([_server()], now=100.0) == "0 MB over its start"
    rss["kb"] = 321 * 1024  # 41 MB over the floor, 21 over the size at warm-up
    assert r.why_not([_server()], now=100.0) is None


def test_no_resident_size_no_start_again(monkeypatch):
    monkeypatch.setattr(recycle, "rss_kb", lambda: None)
    assert _recycler().why_not([_server()], now=100.0) == "no resident size to read"


@pytest.mark.parametrize("raw, ok", [
    ('{"listen": [S], "lock": [F, G], "restarts": 1, "held_mb": 350.0}', True),
    ('{"listen": [S], "lock": [], "restarts": 2, "held_mb": 350.0}', True),
    ('{"listen": [], "lock": [F, G]}', False),  # nothing to listen on
    ('{"listen": [1], "lock": [F, G]}', False),  # a standard stream is never handed over
    ('{"listen": [S], "lock": [F]}', False),
    ('{"listen": ["S"], "lock": [F, G]}', False),
    ('{"listen": [F], "lock": [F, G], "restarts": 1, "held_mb": 1.0}', False),  # a file is not a socket
    ('{"listen": [S], "lock": [F, 999999], "restarts": 1, "held_mb": 1.0}', False),  # not open
    ('[5, 6, 7]', False),
    ("not json", False),
])
def test_what_was_handed_over_is_read_once_and_checked(monkeypatch, tmp_path, raw, ok):
    sock = socket.socket()
    files = [open(tmp_path / name, "w") for name in ("f", "g")]
    raw = raw.replace("S", str(sock.fileno())).replace("F", str(files[0].fileno())).replace("G", str(files[1].fileno()))
    try:
        _check_handed_over(monkeypatch, raw, ok)
    finally:
        sock.close()
        for f in files:
            f.close()


def _check_handed_over(monkeypatch, raw: str, ok: bool) -> None:
    monkeypatch.setenv(recycle.ENV, raw)
    got = handed_over()
    assert (got == json.loads(raw)) if ok else got is None
    assert recycle.ENV not in os.environ  # (the search workers, started later, never see it)
    assert handed_over() is None


def _lock_in_child(folder: Path) -> int:
    """Exit status of another process taking ``folder`` (0: it could)."""
    code = ("import sys; from pathlib import Path; from app.datadir import lock_folder, DataDirInUse\n"
            "try:\n    lock_folder(Path(sys.argv[1]))\nexcept DataDirInUse:\n    sys.exit(3)\n")
    return subprocess.run([sys.executable, "-c", code, str(folder)], cwd=Path(__file__).resolve().parents[2],
                          timeout=WAIT_S).returncode


def test_a_handed_over_lock_is_taken_as_it_is_and_stays_held(tmp_path):
    first = datadir.lock_folder(tmp_path)
    fds = first.descriptors()
    assert len(fds) == 2
    datadir.adopt_lock(fds)
    again = datadir.lock_folder(tmp_path)  # (a second open of the folder would be refused: this one is ours)
    try:
        assert again.descriptors() == fds
        assert (tmp_path / datadir.LOCK_NAME).read_text() == str(os.getpid())
        assert _lock_in_child(tmp_path) == 3
    finally:
        again.close()
    assert _lock_in_child(tmp_path) == 0


def test_a_lock_handed_over_for_another_folder_is_let_go(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    datadir.adopt_lock(datadir.lock_folder(a).descriptors())
    lock = datadir.lock_folder(b)
    try:
        assert _lock_in_child(a) == 0  # its descriptors were closed
        assert _lock_in_child(b) == 3
    finally:
        lock.close()


# --------------------------------------------------------------------------- a real server


def _views(client: DashClient, state: dict) -> None:
    """The Explore, editor and Compare views of ``state``, as the page asks for them."""
    values = {"state.data": state, "collapse.value": ["on"], "topo-metric.value": "utilization"}
    for d in client.deps:
        if d["inputs"] and d["inputs"][0]["id"] == "state" and d.get("clientside_function") is None:
            call_dependency(client, d, values)


def _open_page(port: int, query: str = "") -> tuple[DashClient, dict]:
    client = DashClient(f"http://127.0.0.1:{port}/")
    state = client.call("url", {"url.search": query}, [])["state"]["data"]
    _views(client, state)
    return client, state


def _wait_for(srv: Served, text: str, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if text in srv.output:
            return True
        if srv.proc.poll() is not None:
            raise AssertionError(f"soapbox serve exited ({srv.proc.returncode}):\n{srv.output}")
        time.sleep(0.5)
    return False


def _listening_sockets(pid: int) -> int:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            inodes.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:  # (closed by the server since it was listed: it holds nothing now)
            continue
    listening = set()
    with open("/proc/net/tcp", encoding="ascii") as f:
        for line in list(f)[1:]:
            cols = line.split()
            if cols[3] == "0A":  # TCP_LISTEN
                listening.add(f"socket:[{cols[9]}]")
    return len(inodes & listening)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="the resident size is read from /proc (Linux)")
def test_a_real_server_starts_again_in_place_once_its_tabs_are_closed(tmp_path):
    srv = Served(tmp_path, ["--recycle-mb", "1", "--recycle-idle", "2"])
    try:
        srv.wait_listening()
        # (pages bigger than the default one, which warm-up drew: four of FlexFlow's models on 64
        # GPUs leave the server holding more than before once their tabs close; one page alone no
        # longer does since the server freezes its start-up heap, app.warmup.settle_heap)
        pages = [_open_page(srv.port, f"?model={m}&cluster=k80-16x4") for m in ("nmt", "inception_v3", "rnnlm",
                                                                               "resnet101")]
        assert _listening_sockets(srv.proc.pid) == 1
        # idle, grown, but the tabs hold their simulations: it stays as it is
        assert not _wait_for(srv, "starting again in place", 15.0)
        for client, state in pages:
            client.post("_soapbox/bye", state["sid"].encode(), "text/plain")  # the tabs close
        assert _wait_for(srv, "started again in place (time 1)", WAIT_S), srv.output
        out = srv.output
        assert "starting again in place to give it back" in out and "Traceback" not in out
        assert out.count("soapbox explorer: http://") == 1  # (said once: the address has not changed)
        assert srv.proc.poll() is None
        assert _status(srv.port) == 200
        assert _listening_sockets(srv.proc.pid) == 1  # the same socket, not a second one
        assert (tmp_path / datadir.LOCK_NAME).read_text() == str(srv.proc.pid)
        assert _lock_in_child(tmp_path) == 3  # the folder stayed held through the exec
        client, state = _open_page(srv.port)  # a new tab: its page and views
        assert state["sid"]
    finally:
        srv.stop()


def test_never_with_recycle_mb_0(tmp_path):
    srv = Served(tmp_path, ["--recycle-mb", "0", "--recycle-idle", "1"])
    try:
        srv.wait_listening()
        client, state = _open_page(srv.port)
        client.post("_soapbox/bye", state["sid"].encode(), "text/plain")
        assert not _wait_for(srv, "in place", 12.0)
    finally:
        srv.stop()
