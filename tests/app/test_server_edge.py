"""Issue 45, item 1: the server's edge (:mod:`app.edge`) against slow and greedy clients, on a
real socket: connections that send a header line now and then fill the connection limit, and
a new visitor is still answered; they are closed past the header deadline; one address's
connections past its share make room for its next; a request being answered is never closed
for room. Deadlines are shortened for the test; no assertion on how fast anything is."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from app import edge


def _app(environ, start_response):
    if environ.get("PATH_INFO") == "/slow":
        time.sleep(float(environ.get("QUERY_STRING") or 1))
    body = b"ok"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


@pytest.fixture()
def server(monkeypatch):
    monkeypatch.setattr(edge, "HEADER_TIMEOUT_S", 1.0)
    monkeypatch.setattr(edge, "BODY_TIMEOUT_S", 1.0)
    made = {}

    def start(limit=40, share=1000, threads=4):
        srv = edge.make_server(_app, "127.0.0.1", 0, client_connections=share, threads=threads,
                               connection_limit=limit, channel_timeout=30, cleanup_interval=0.2,
                               asyncore_use_poll=True, ident="test")
        t = threading.Thread(target=srv.run, daemon=True)
        t.start()
        made["srv"] = srv
        return srv, srv.effective_port

    yield start
    if "srv" in made:
        made["srv"].task_dispatcher.shutdown()
        made["srv"].close()


def _slow(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET / HTTP/1.1\r\n")
        out.append(s)
    return out


def _get(port: int, path: str = "/", timeout: float = 60) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        return data


def _closed(s: socket.socket, wait: float) -> bool:
    s.settimeout(wait)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_a_visitor_is_answered_past_a_limit_full_of_slow_connections(server):
    srv, port = server(limit=40)
    slow = _slow(port, 60)  # past the limit: waitress stopped accepting here and never answered again
    for s in slow[:10]:
        s.sendall(b"X-Drip: 1\r\n")  # (a header line now and then: never idle)
    assert _get(port).startswith(b"HTTP/1.1 200")
    assert srv.closed["limit"] >= 21  # room made for 21 past 40, then for the visitor
    # past the header deadline, the ones still open are closed
    assert all(_closed(s, 60) for s in slow)  # (each returns as soon as the server closes it)
    assert srv.closed["headers"] >= 1
    for s in slow:
        s.close()
    # the index of connections by address follows them as they close (it does not grow)
    deadline = time.monotonic() + 60
    while sum(len(v) for v in srv.by_client.values()) != len(srv.active_channels):
        assert time.monotonic() < deadline, (srv.by_client, srv.active_channels)
        time.sleep(0.1)
    assert sum(len(v) for v in srv.by_client.values()) <= 1


def test_one_address_past_its_share_makes_room_from_its_own(server):
    srv, port = server(limit=1000, share=5)
    slow = _slow(port, 8)
    assert _get(port).startswith(b"HTTP/1.1 200")
    assert srv.closed["client share"] >= 4
    assert sum(_closed(s, 60) for s in slow[:4]) == 4  # the oldest made room
    for s in slow:
        s.close()


def test_a_request_being_answered_is_never_closed_for_room(server):
    srv, port = server(limit=3, share=1000, threads=4)
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("slow", _get(port, "/slow?2")))
    t.start()
    deadline = time.monotonic() + 60
    while not any(ch.requests for ch in list(srv.active_channels.values())):  # (until it is being answered)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for _ in range(3):
        assert _get(port).startswith(b"HTTP/1.1 200")
    t.join(60)
    assert got["slow"].startswith(b"HTTP/1.1 200")


def test_an_upload_gets_time_for_its_announced_length(monkeypatch):
    ch = object.__new__(edge.EdgeChannel)
    ch.requests, ch.will_close, ch.request_started, ch.began = [], False, 0.0, 1
    ch.request = type("R", (), {"headers_finished": True, "content_length": 10 * edge.BODY_MIN_BYTES_PER_S})()
    assert ch.overdue(edge.BODY_TIMEOUT_S + 9.0) is None
    assert ch.overdue(edge.BODY_TIMEOUT_S + 11.0) == "body"
    ch.request.headers_finished = False
    assert ch.overdue(edge.HEADER_TIMEOUT_S + 0.1) == "headers"
