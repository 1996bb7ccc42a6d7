"""Whole-process ``soapbox simulate`` at 1,024, 4,096 and 16,384 GPUs (issue 12).

A Llama-3-405B-shaped model (126 layers, hidden 16,384, 128 heads with 8 KV heads, SwiGLU FFN
53,248, sequence 8,192, global batch 2,048 sequences; Dubey et al. 2024 Table 3) on DGX H100
nodes, three layouts per size:

* ``megatron-zero1``: tp 8, pp 16, the rest data parallel, Megatron's distributed optimizer;
* ``fsdp-4d``: FSDP (ZeRO-3) over data parallelism with tp 8 and pp 16, full recomputation
  (Llama 3's layout without context parallelism);
* ``fsdp-tp8``: ZeRO-3 over data parallelism with tp 8, no pipeline (2-D; at 16,384 GPUs one
  sequence per data-parallel rank: pure FSDP cannot run there, the batch has 2,048);
* ``fsdp-4d-cp2``: the 4-D layout with context parallelism 2 (tp 8, cp 2, pp 16, FSDP over
  dp x cp), full recomputation;
* ``megatron-fp8``: ``megatron-zero1`` with fp8 GEMMs.

Each run is a fresh process (``python -m app.cli simulate``), warm (one untimed run first:
numba's cache, the page cache); the median of ``--repeat`` runs. Goal (issue 12): every layout
at 16,384 GPUs within 10 s. Exit status 3 (does not fit in memory) is a valid outcome here.

Usage: python benchmarks/bench_scale.py [--repeat 3] [--sizes 1024,4096,16384]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["--layers", "126", "--hidden", "16384", "--heads", "128", "--kv-heads", "8", "--ffn-hidden", "53248",
         "--swiglu", "--seq-len", "8192", "--vocab", "128256", "--batch", "2048", "--precision", "bf16",
         "--name", "llama3-405b-shape"]


def layouts(gpus: int) -> dict[str, list[str]]:
    return {
        "megatron-zero1": ["--strategy", "megatron", "--tp", "8", "--pp", "16", "--dp", str(gpus // 128),
                           "--micro-batch", "1", "--zero-stage", "1"],
        "fsdp-4d": ["--strategy", "fsdp", "--tp", "8", "--pp", "16", "--micro-batch", "1", "--recompute", "full"],
        "fsdp-tp8": ["--strategy", "fsdp", "--tp", "8", "--micro-batch", "1"],
        "fsdp-4d-cp2": ["--strategy", "fsdp", "--tp", "8", "--cp", "2", "--pp", "16", "--micro-batch", "1",
                        "--recompute", "full"],
        "megatron-fp8": ["--strategy", "megatron", "--tp", "8", "--pp", "16", "--dp", str(gpus // 128),
                         "--micro-batch", "1", "--zero-stage", "1", "--precision", "fp8"],
    }


def soapbox(*args: str) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, capture_output=True, text=True)
    return time.perf_counter() - t, p.returncode, p.stdout + p.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default="1024,4096,16384")
    ap.add_argument("--layouts", default="", help="comma-separated layout names (default: all)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(Path(tmp) / "model.json")
        _, rc, out = soapbox("model", "gpt", *MODEL, "-o", model)
        if rc:
            raise SystemExit(out)
        print(f"# {platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M')}; median of {args.repeat} warm runs")
        print(f"{'GPUs':>6} {'layout':16} {'wall s':>7} {'fits':>5} {'tasks':>9} {'iteration s':>12}")
        for gpus in (int(x) for x in args.sizes.split(",")):
            cluster = f"dgx-h100:{gpus // 8}"
            for name, opts in layouts(gpus).items():
                if args.layouts and name not in args.layouts.split(","):
                    continue
                cmd = ["simulate", "--model", model, "--cluster", cluster, *opts, "--json"]
                soapbox(*cmd)  # warm
                runs = [soapbox(*cmd) for _ in range(args.repeat)]
                wall = statistics.median(r[0] for r in runs)
                rc, out = runs[-1][1], runs[-1][2]
                if rc not in (0, 3):
                    print(f"{gpus:>6} {name:16} failed: {out.strip().splitlines()[-1]}")
                    continue
                s = json.loads(out)
                print(f"{gpus:>6} {name:16} {wall:7.2f} {'yes' if s['feasible'] else 'no':>5} {s['num_tasks']:>9,} "
                      f"{s['iteration_time_s']:12.2f}", flush=True)


if __name__ == "__main__":
    main()
