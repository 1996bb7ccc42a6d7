"""Times the garbage collector's full collections in any Python process started with this
folder on ``PYTHONPATH`` and ``SOAPBOX_GC_LOG`` naming a folder (``benchmarks/bench_load.py
--gc-log`` does both for the server it starts). Each full (generation 2) collection appends one
line to ``SOAPBOX_GC_LOG/gc.<pid>.tsv``: when it ended (Unix time), its wall seconds, the
objects it collected, and the seconds spent in generations 0 and 1 so far. The first line is
the process's command line.

A collection holds the interpreter lock from start to end: every other thread of the process
waits for it, so its length is added to whatever request is in flight. Python calls
``gc.callbacks`` at the start and end of every collection ("gc — Garbage Collector interface",
Python docs), which is all this uses. Nothing is written without ``SOAPBOX_GC_LOG``."""

import os
import sys

_DIR = os.environ.get("SOAPBOX_GC_LOG")
if _DIR:
    import gc
    import time

    _state = {"t": 0.0, "young_s": 0.0, "path": os.path.join(_DIR, f"gc.{os.getpid()}.tsv")}
    with open(_state["path"], "w") as f:
        f.write("# " + " ".join(getattr(sys, "orig_argv", sys.argv)).replace("\n", " ") + "\n")  # (one line)

    def _timed(phase: str, info: dict) -> None:
        if phase == "start":
            _state["t"] = time.perf_counter()
            return
        dt = time.perf_counter() - _state["t"]
        if info["generation"] < 2:
            _state["young_s"] += dt
            return
        with open(_state["path"], "a") as f:
            f.write(f"{time.time():.3f}\t{dt:.6f}\t{info.get('collected', 0)}\t{_state['young_s']:.6f}\n")

    gc.callbacks.append(_timed)
