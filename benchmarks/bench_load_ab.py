"""The load benchmark before and after a change, side by side: ``benchmarks/bench_load.py`` run
alternately on the code of a base commit (a git worktree, with *its own* bench_load.py: each tree's
client sends the requests its own page sends) and on this tree, ``--rounds`` times each, on the
same machine at the same load; the figures of every run and the medians per tree.

Reported per run: edit -> figures p50 / p95 (s), page render p95 (s), the server's CPU seconds
per edit (its CPU time over the run divided by the edits drawn: what each edit and the polls
between edits cost it), its cores busy, searches without proposals, the longest wait in the
queue, and errors.

``--same-client``: this tree's bench_load.py (and benchmarks/gcprobe) copied into the base's
worktree, so both servers get the same client (where the page sends the same requests in both);
``--gc-log``: each run also times its processes' full garbage collections (bench_load.py
``--gc-log``; with ``--same-client``, or a base that has the option).

Usage: python benchmarks/bench_load_ab.py --base 5c1fba7 [--rounds 2] [--duration 120] [--sessions 20]
    [--same-client] [--gc-log]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tree: Path, args: argparse.Namespace, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run([sys.executable, str(tree / "benchmarks" / "bench_load.py"), "--sessions", str(args.sessions),
                    "--duration", str(args.duration), "--settle", "10", "--json", str(out)]
                   + (["--gc-log"] if args.gc_log else []),
                   cwd=tree, env=env, capture_output=True, text=True, check=True)
    d = json.loads(out.read_text())
    e, s = d["edit_to_figures_s"], d["searches"]
    cpu = d["server_at_end"]["cpu_s"] - d["server_before"]["cpu_s"]
    return {"p50": e["p50"], "p95": e["p95"], "edits": e["n"], "render_p95": d["page_render_s"]["p95"],
            "cpu_per_edit": cpu / max(1, e["n"]), "cores": d["server_cores_busy"],
            "no_proposals": s["without_proposals"], "queue_max": s["queue_wait_s_max"], "errors": d["error_count"],
            "gc": d.get("full_collections", {}).get("server")}


def _line(name: str, r: dict) -> str:
    return (f"{name}: edit p50 {r['p50']:.2f} s, p95 {r['p95']:.2f} s ({r['edits']} edits); render p95 "
            f"{r['render_p95']:.2f} s; server {r['cpu_per_edit'] * 1e3:.0f} ms CPU an edit, {r['cores']:.2f} cores; "
            f"searches without proposals {r['no_proposals']}; longest queue wait {r['queue_max']:.0f} s; "
            f"errors {r['errors']}"
            + (f"; server full collections {r['gc']['n']}, {r['gc']['total_s']:.2f} s, longest {r['gc']['max_s']:.3f} s"
               if r.get("gc") else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare with (a worktree is made of it)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=int, default=120)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--same-client", action="store_true", help="run this tree's bench_load.py on the base too")
    ap.add_argument("--gc-log", action="store_true", help="time the full garbage collections (bench_load.py --gc-log)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="soapbox-load-ab-"))
    base = tmp / "base"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True,
                   capture_output=True)
    if args.same_client:
        shutil.copy(ROOT / "benchmarks" / "bench_load.py", base / "benchmarks" / "bench_load.py")
        shutil.copytree(ROOT / "benchmarks" / "gcprobe", base / "benchmarks" / "gcprobe", dirs_exist_ok=True)
    head = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
    print(f"# {os.uname().nodename}, {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}; base "
          f"{args.base} vs {head} (working tree), {args.rounds} rounds of {args.sessions} sessions x "
          f"{args.duration} s, alternating", flush=True)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    try:
        for k in range(args.rounds):
            for name, tree in (("before", base), ("after", ROOT)):
                r = _run(tree, args, tmp / f"{name}-{k}.json")
                runs[name].append(r)
                print(_line(f"{name} {k + 1} ({time.strftime('%H:%M')})", r), flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    for name in ("before", "after"):
        rs = runs[name]
        med = {k: statistics.median(r[k] for r in rs) for k in ("p50", "p95", "cpu_per_edit")}
        print(f"median {name}: edit p50 {med['p50']:.2f} s, p95 {med['p95']:.2f} s; "
              f"{med['cpu_per_edit'] * 1e3:.0f} ms server CPU an edit")


if __name__ == "__main__":
    main()
