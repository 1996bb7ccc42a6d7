"""The JSON depth check that runs before every POST the server reads (issue 45), alone and
with other threads busy: a request thread that lets go of the interpreter's lock waits to get it
back while the others compute (``engine.formats.too_deep_at``).

Body: the default page's state (Inception-v3 on p100-4x4, ~25 kB) as a callback sends it.
Baseline in the same process and the same conditions: ``json.loads`` of the same body (which
keeps the lock). Reports the median and p95 of each, alone and with ``--busy`` threads
spinning in pure Python.

Usage: python benchmarks/bench_depth_check.py [--calls 400] [--busy 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import threading
import time

from app import state as ST
from engine.formats import too_deep_at


def _timed(f, n: int) -> tuple[float, float]:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return statistics.median(ts) * 1e3, ts[int(0.95 * (n - 1))] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--busy", type=int, default=3)
    args = ap.parse_args()
    raw = json.dumps({"inputs": [{"id": "state", "property": "data", "value": ST.new_state()}]}).encode()
    print(f"{platform.node()}, python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}; "
          f"body {len(raw):,} bytes", flush=True)
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i

    for label, busy in (("alone", 0), (f"{args.busy} busy threads", args.busy)):
        threads = [threading.Thread(target=spin, daemon=True) for _ in range(busy)]
        for t in threads:
            t.start()
        n = args.calls if not busy else max(20, args.calls // 4)
        check, parse = _timed(lambda: too_deep_at(raw), n), _timed(lambda: json.loads(raw), n)
        stop.set()
        for t in threads:
            t.join()
        stop.clear()
        print(f"{label}: depth check median {check[0]:.3f} ms (p95 {check[1]:.3f}); json.loads median "
              f"{parse[0]:.3f} ms (p95 {parse[1]:.3f}); ratio {check[0] / parse[0]:.2f}x", flush=True)


if __name__ == "__main__":
    main()
