"""benchmarks/gcprobe: a process started with it on PYTHONPATH and SOAPBOX_GC_LOG set logs each
full collection, and bench_load.gc_summary reads the logs by role and time window."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_load import gc_summary  # noqa: E402

CODE = ("import gc\n"
        "class Node: pass\n"
        "for _ in range(3):\n"
        "    a, b = Node(), Node(); a.b, b.a = b, a; del a, b\n"
        "    gc.collect()\n")


def _run(tmp_path: Path, log: bool) -> list[Path]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "benchmarks" / "gcprobe"))
    env.pop("SOAPBOX_GC_LOG", None)
    if log:
        env["SOAPBOX_GC_LOG"] = str(tmp_path)
    subprocess.run([sys.executable, "-c", CODE], env=env, check=True, timeout=600)
    return sorted(tmp_path.glob("gc.*.tsv"))


def test_each_full_collection_is_logged_and_summed_by_role(tmp_path):
    t0 = time.time()
    logs = _run(tmp_path, True)
    t1 = time.time()
    assert len(logs) == 1
    lines = logs[0].read_text().splitlines()
    assert lines[0].startswith("# ") and "-c" in lines[0]
    rows = [ln.split("\t") for ln in lines[1:]]
    assert len(rows) >= 3 and all(len(r) == 4 for r in rows)  # (when, seconds, collected, young seconds)
    assert sum(int(r[2]) for r in rows) >= 6  # each cycle's two nodes
    got = gc_summary(str(tmp_path), t0, t1)
    assert got["other"]["processes"] == 1 and got["other"]["n"] == len(rows)
    assert got["other"]["total_s"] >= got["other"]["max_s"] > 0
    assert gc_summary(str(tmp_path), t1 + 1, t1 + 2)["other"]["n"] == 0  # outside the window: not counted


def test_without_the_variable_nothing_is_written(tmp_path):
    assert _run(tmp_path, False) == []
