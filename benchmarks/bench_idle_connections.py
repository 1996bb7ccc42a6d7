"""How long a new visitor waits while idle connections are open, under waitress's defaults and
under ``soapbox serve``'s settings (issue 24 part 7: 101 idle connections made a visitor wait
143 s). A tiny WSGI app on 127.0.0.1, so only the server's connection handling is measured.

    python benchmarks/bench_idle_connections.py [IDLE=120]
"""

from __future__ import annotations

import http.client
import socket
import sys
import threading
import time

import waitress

from app.cli import waitress_options


def _hello(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello"]


def visitor_wait_s(opts: dict, idle: int, timeout_s: float = 300.0) -> float:
    srv = waitress.create_server(_hello, host="127.0.0.1", port=0, **opts)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    socks = [socket.create_connection(("127.0.0.1", srv.effective_port), timeout=timeout_s) for _ in range(idle)]
    try:
        t0 = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", srv.effective_port, timeout=timeout_s)
        conn.request("GET", "/")
        assert conn.getresponse().read() == b"hello"
        conn.close()
        return time.monotonic() - t0
    finally:
        for s in socks:
            s.close()
        time.sleep(0.5)  # (the server notices the closed sockets before it is closed itself)
        srv.close()
        thread.join(10)


if __name__ == "__main__":
    idle = int(sys.argv[1]) if len(sys.argv) > 1 else 120
    print(f"soapbox serve's settings, {idle} idle connections: new visitor answered in "
          f"{visitor_wait_s(waitress_options(8), idle):.3f} s", flush=True)
    print(f"waitress's defaults, {idle} idle connections: new visitor answered in "
          f"{visitor_wait_s({'threads': 8}, idle):.1f} s", flush=True)
