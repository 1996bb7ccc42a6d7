"""Issue 45: a new visitor's ``GET /`` while slow clients hold connections to ``soapbox serve``.

Starts ``soapbox serve`` on a free port (a temporary data directory), opens ``--slow`` connections
(default 1,100) that each send a request line and then one header line every ``--drip`` seconds
(15: ~70 bytes/s in all; a slow client re-opens a connection the server closes, so that as many
stay held), and times a new visitor's ``GET /`` every ``--every`` seconds for ``--seconds``. Prints
the visitor's times (median, max, how many answered) and how many slow connections the server
closed; ``--json`` for a record.

    python benchmarks/slow_clients.py [--slow 1100] [--seconds 60] [--json]

Before issue 45 (waitress's own limits) every visitor timed out past the 1,000th slow connection.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(port: int, proc: subprocess.Popen, limit_s: float = 180) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if proc.poll() is not None:
            raise SystemExit(f"soapbox serve exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read()
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("soapbox serve did not answer")


def _visit(port: int, timeout: float) -> float | None:
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=timeout) as r:
            r.read()
            return time.perf_counter() - t if r.status == 200 else None
    except OSError:
        return None


class Drip:
    """``n`` slow connections kept open (re-opened when the server closes one)."""

    def __init__(self, port: int, n: int, drip_s: float) -> None:
        self.port, self.n, self.drip_s = port, n, drip_s
        self.sel = selectors.DefaultSelector()
        self.socks: dict[socket.socket, float] = {}  # socket -> when it last sent
        self.reopened = 0

    def _open(self) -> None:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", self.port))
        self.socks[s] = time.monotonic()
        self.sel.register(s, selectors.EVENT_READ)
        self._send(s, b"GET / HTTP/1.1\r\nHost: x\r\n")

    def _send(self, s: socket.socket, data: bytes) -> None:
        try:
            s.send(data)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(s)

    def _drop(self, s: socket.socket) -> None:
        if s in self.socks:
            del self.socks[s]
            self.sel.unregister(s)
            s.close()

    def fill(self) -> None:
        while len(self.socks) < self.n:
            self._open()

    def tick(self) -> None:
        for key, _ in self.sel.select(timeout=0):
            s = key.fileobj
            try:
                if not s.recv(4096):
                    self._drop(s)
                    self.reopened += 1
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._drop(s)
                self.reopened += 1
        now = time.monotonic()
        for s, last in list(self.socks.items()):
            if now - last >= self.drip_s:
                self.socks[s] = now
                self._send(s, b"X-Drip: 1\r\n")
        self.fill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slow", type=int, default=1100)
    ap.add_argument("--drip", type=float, default=15.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--timeout", type=float, default=30.0, help="a visitor gives up after this long")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.slow + 512)), hard))
    port = _free_port()
    with tempfile.TemporaryDirectory() as data:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--data-dir", data],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": os.getcwd()})
        try:
            _wait_up(port, proc)
            drip = Drip(port, args.slow, args.drip)
            drip.fill()
            times: list[float | None] = []
            t0 = time.monotonic()
            next_visit = t0 + 1.0
            while time.monotonic() - t0 < args.seconds:
                drip.tick()
                if time.monotonic() >= next_visit:
                    times.append(_visit(port, args.timeout))
                    next_visit = time.monotonic() + args.every
                time.sleep(0.02)
            held = len(drip.socks)
        finally:
            proc.terminate()
            proc.wait(30)
    ok = [t for t in times if t is not None]
    rec = {"slow_connections": args.slow, "held_at_end": held, "reopened_after_close": drip.reopened,
           "visits": len(times), "answered": len(ok), "median_s": statistics.median(ok) if ok else None,
           "max_s": max(ok) if ok else None, "timeout_s": args.timeout, "seconds": args.seconds}
    if args.json:
        print(json.dumps(rec, indent=1))
    else:
        print(f"{args.slow:,} slow connections (a header line every {args.drip:g} s, re-opened when closed: "
              f"{drip.reopened:,}); visitor GET /: {len(ok)}/{len(times)} answered, median "
              f"{rec['median_s'] or float('nan'):.3f} s, max {rec['max_s'] or float('nan'):.3f} s")


if __name__ == "__main__":
    main()
