"""The explorer under load (issue 10): many sessions editing and searching at once.

Starts ``soapbox serve`` as a separate process on loopback with a fresh data directory, then
drives ``--sessions`` concurrent sessions over HTTP exactly as the page's JavaScript does (the
same ``/_dash-update-component`` requests, built from the server's ``/_dash-dependencies``):

* **page render**: ``GET /``, the layout and the dependencies, then the first state and the
  Explore, editor and Compare views (the last three in parallel, as the browser sends them);
* **edit -> figures**: a random valid single-op edit of Inception-v3 on p100-4x4 (16 GPUs),
  then the Explore, editor and Compare views of the new state, in parallel; a think time of
  ``--think`` seconds (uniform) between edits;
* **search**: every session starts one ``--budget`` MCMC search right after its first render
  and polls it every 0.5 s (the page's interval, sending the session id as the page does) while
  it keeps editing.

Each session runs for ``--duration`` seconds, then closes its tab (``/_soapbox/bye``). Reported:
p50/p95 of page render and of edit -> figures (and its p95 in each minute of the run); each
search's run time (claimed -> finished, from the store) against its budget, and its time in the
queue; the server's resident memory and threads, and its worker processes, after warm-up, at the
end of the load, and ``--settle`` seconds after the sessions ended. Bounded: loopback only, a fixed number of
sessions and a fixed duration; the server is stopped at the end.

``--gc-log``: the server's, its search workers' and this process's full garbage collections
while the sessions ran (``benchmarks/gcprobe``: each holds its process's interpreter lock).
This process freezes its own start-up heap before the sessions (``gc.freeze``): it stands in for
browsers on other machines, and its collections would add to the latencies it measures.

Usage: python benchmarks/bench_load.py [--sessions 20] [--duration 60] [--budget 3s] [--think 2 4] [--rounds 1]
    [--gc-log]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from app import simulation as SIM
from app import sources as SRC
from app import state as ST

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- a Dash client


class DashClient:
    """Calls the app's callbacks over HTTP as the page would (no browser)."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/") + "/"
        self.deps = self.get_json("_dash-dependencies")

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.base + path, timeout=120) as r:
            return r.read()

    def get_json(self, path: str):
        return json.loads(self.get(path))

    def post(self, path: str, body: bytes, ctype: str = "application/json") -> bytes:
        req = urllib.request.Request(self.base + path, data=body, headers={"Content-Type": ctype}, method="POST")
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.read()

    def dep(self, first_input: str):
        return next(d for d in self.deps if d["inputs"] and d["inputs"][0]["id"] == first_input
                    and d.get("clientside_function") is None)

    def call(self, first_input: str, values: dict, changed: list[str]) -> dict:
        """Run the server callback whose first input is ``first_input``; ``values`` maps
        ``"id.prop"`` to what the page holds. Returns ``{id: {prop: value}}``."""
        d = self.dep(first_input)

        def entry(spec):
            if spec["id"].startswith("{"):  # a pattern (ALL) input: the components on the page
                return values.get(f"{spec['id']}.{spec['property']}", [])
            return {"id": spec["id"], "property": spec["property"],
                    "value": values.get(f"{spec['id']}.{spec['property']}")}

        out = d["output"]
        parts = [p.rsplit(".", 1) for p in out.strip(".").split("...")]
        outputs = [{"id": i, "property": p} for i, p in parts]
        body = {"output": out, "outputs": outputs if out.startswith("..") else outputs[0],
                "inputs": [entry(s) for s in d["inputs"]], "state": [entry(s) for s in d.get("state", [])],
                "changedPropIds": changed}
        raw = self.post("_dash-update-component", json.dumps(body).encode())
        return json.loads(raw)["response"] if raw else {}


# --------------------------------------------------------------------------- one session


def _edits(seed: int, n: int):
    """``n`` random valid single-op edits of Inception-v3 on p100-4x4 (degrees, devices)."""
    from engine.search.chains import random_config

    state = ST.new_state("inception_v3", "p100-4x4")
    g, c = SRC.graph_of(state), SRC.cluster_of(state)
    sim = SIM.workspace(state).sim
    rng = random.Random(seed)
    names = [op.name for op in g.ops if op.kind != "input"]
    out = []
    while len(out) < n:
        name = rng.choice(names)
        cfg = random_config(g[name], c.num_devices, rng)
        if not sim.check(name, cfg):
            out.append((name, dict(cfg.degrees), ",".join(map(str, cfg.devices)), [d.name for d in g[name].dims]))
    return out


def _by_minute(sessions: list, duration: float) -> list[list[float]]:
    """Every session's edit -> figures times, by the minute of the run each ended in."""
    out: list[list[float]] = [[] for _ in range(max(1, math.ceil(duration / 60)))]
    for s in sessions:
        for dt, at in zip(s.edit_s, s.edit_at):
            out[min(len(out) - 1, int(at // 60))].append(dt)
    return out


class Session(threading.Thread):
    def __init__(self, base: str, k: int, args, start_at: float) -> None:
        super().__init__(name=f"session-{k}", daemon=True)
        self.base, self.k, self.args, self.start_at = base, k, args, start_at
        self.render_s: float | None = None
        self.edit_s: list[float] = []
        self.edit_at: list[float] = []  # (when each edit ended, seconds after the sessions started)
        self.errors: list[str] = []
        self.sid: str | None = None
        self.rng = random.Random(k)
        self.search_status: str | None = None

    def views(self, client: DashClient, pool: ThreadPoolExecutor, state: dict) -> None:
        """The callbacks the page fires for a new state (Explore, editor, Compare), in parallel."""
        v = {"state.data": state, "collapse.value": ["on"], "topo-metric.value": "utilization"}
        # (the server's callbacks; one run in the browser, copying the session id, is not sent)
        deps = [d for d in client.deps if d["inputs"] and d["inputs"][0]["id"] == "state"
                and not d.get("clientside_function")]
        for f in [pool.submit(call_dependency, client, d, v) for d in deps]:
            f.result()

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # recorded and reported: a failed session is a finding
            self.errors.append(f"{type(e).__name__}: {e}")

    def _run(self) -> None:
        time.sleep(max(0.0, self.start_at - time.monotonic()))
        pool = ThreadPoolExecutor(3)
        t = time.perf_counter()
        client = DashClient(self.base)
        client.get("")
        client.get("_dash-layout")
        r = client.call("url", {"url.search": ""}, [])
        state = r["state"]["data"]
        self.sid = state["sid"]
        self.views(client, pool, state)
        self.render_s = time.perf_counter() - t
        r = client.call("search-start", {"search-start.n_clicks": 1, "state.data": state, "search-algo.value": "mcmc",
                                         "search-budget.value": self.args.budget, "search-seed.value": self.k},
                        ["search-start.n_clicks"])
        self.search_status = str((r.get("search-status") or {}).get("children"))
        edits = _edits(self.k, 1000)
        end = self.start_at + self.args.duration
        polling = True
        next_poll = time.monotonic() + 0.5
        next_edit = time.monotonic() + self.rng.uniform(*self.args.think)
        i = 0
        while time.monotonic() < end:
            now = time.monotonic()
            if polling and now >= next_poll:
                out = client.call("search-poll", {"search-poll.n_intervals": 1, "sid.data": state["sid"]},
                                  ["search-poll.n_intervals"])
                polling = not out["search-poll"]["disabled"]
                next_poll = now + 0.5
            if now >= next_edit:
                name, degrees, devices, dims = edits[i]
                i += 1
                t = time.perf_counter()
                deg = [{"id": {"dim": d, "type": "deg"}, "property": "value", "value": degrees.get(d, 1)} for d in dims]
                r = client.call("url", {"state.data": state, "edit-apply.n_clicks": i, "edit-ops.value": [name],
                                        "edit-devices.value": devices, "collapse.value": ["on"],
                                        '{"dim":["ALL"],"type":"deg"}.value': deg,
                                        '{"dim":["ALL"],"type":"deg"}.id': [{"id": x["id"], "property": "id",
                                                                              "value": x["id"]} for x in deg]},
                                ["edit-apply.n_clicks"])
                new = r["state"]["data"] if "state" in r else state  # (a refused or empty edit: the state is not sent)
                if new.get("version") == state.get("version"):
                    if not r["message"]["children"].startswith("No change"):
                        self.errors.append(f"edit refused: {r['message']['children']}")
                    continue  # the random edit was the op's config already: draw another
                state = new
                self.views(client, pool, state)
                self.edit_s.append(time.perf_counter() - t)
                self.edit_at.append(time.monotonic() - self.start_at)
                next_edit = time.monotonic() + self.rng.uniform(*self.args.think)
            time.sleep(max(0.0, min(next_poll if polling else end, next_edit, end) - time.monotonic()))
        while polling and time.monotonic() < end + 600:  # let its search finish before the tab closes
            out = client.call("search-poll", {"search-poll.n_intervals": 1, "sid.data": state["sid"]},
                              ["search-poll.n_intervals"])
            polling = not out["search-poll"]["disabled"]
            time.sleep(0.5)
        client.post("_soapbox/bye", self.sid.encode(), "text/plain")
        pool.shutdown()


def call_dependency(client: DashClient, d: dict, values: dict) -> dict:
    """Like :meth:`DashClient.call`, for a given dependency ``d`` (several share the first input
    "state"); the response's size in bytes."""
    out = d["output"]
    parts = [p.rsplit(".", 1) for p in out.strip(".").split("...")]
    outputs = [{"id": i, "property": p} for i, p in parts]
    body = {"output": out, "outputs": outputs if out.startswith("..") else outputs[0],
            "inputs": [{"id": s["id"], "property": s["property"], "value": values.get(f"{s['id']}.{s['property']}")}
                       for s in d["inputs"]],
            "state": [{"id": s["id"], "property": s["property"], "value": values.get(f"{s['id']}.{s['property']}")}
                      for s in d.get("state", [])], "changedPropIds": ["state.data"]}
    # the views' responses (figures, ~1 MB) are read but not parsed: a browser would, on another
    # machine; here the client shares the server's two cores, so it does as little as it can
    return {"bytes": len(client.post("_dash-update-component", json.dumps(body).encode()))}


# --------------------------------------------------------------------------- the server


def gc_summary(folder: str, t0: float, t1: float) -> dict[str, dict]:
    """Full collections that ended between Unix times ``t0`` and ``t1``, from the logs of
    ``benchmarks/gcprobe``, by role (the command line each log starts with): their number, total
    and longest wall seconds."""
    out: dict[str, dict] = {}
    for path in sorted(Path(folder).glob("gc.*.tsv")):
        lines = path.read_text().splitlines()
        cmd = lines[0] if lines else ""
        role = "server" if " serve " in cmd else "search worker" if "app.worker" in cmd or "worker.py" in cmd else \
            "load generator" if "bench_load" in cmd else "other"
        times = [float(ln.split("\t")[1]) for ln in lines[1:] if ln and t0 <= float(ln.split("\t")[0]) <= t1]
        r = out.setdefault(role, {"processes": 0, "n": 0, "total_s": 0.0, "max_s": 0.0})
        r["processes"] += 1
        r["n"] += len(times)
        r["total_s"] = round(r["total_s"] + sum(times), 3)
        r["max_s"] = round(max([r["max_s"]] + times), 3)
    return out


def _proc_status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            out[key] = int(value.split()[0])
    return out


def _children(pid: int) -> list[int]:
    res = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in res.split()]


def snapshot(pid: int) -> dict:
    s = _proc_status(pid)
    kids = _children(pid)
    kid_rss = 0
    for k in kids:
        try:
            kid_rss += _proc_status(k)["VmRSS"]
        except (FileNotFoundError, KeyError):
            pass
    return {"rss_mb": s["VmRSS"] / 1024, "threads": s["Threads"], "workers": len(kids), "workers_rss_mb": kid_rss / 1024,
            "cpu_s": _cpu_s(pid), "load_cpu_s": _cpu_s(os.getpid())}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (``/proc/PID/stat``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds each session edits")
    ap.add_argument("--budget", default="3s", help="each session's MCMC search budget")
    ap.add_argument("--think", type=float, nargs=2, default=(2.0, 4.0), help="seconds between edits (uniform)")
    ap.add_argument("--threads", type=int, default=8, help="the server's request threads (its --threads)")
    ap.add_argument("--settle", type=float, default=15.0, help="seconds to wait after the sessions end")
    ap.add_argument("--ramp", type=float, default=5.0, help="sessions start spread over this many seconds")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the sessions this many times, one set after another (memory after each: a leak grows "
                         "with every round, a one-time cost does not)")
    ap.add_argument("--json", help="write the figures here as JSON too")
    ap.add_argument("--gc-log", action="store_true",
                    help="time every full garbage collection of the server, its search workers and this process "
                         "(benchmarks/gcprobe) and report them")
    ap.add_argument("--serve-args", default="", metavar="ARGS",
                    help="more options for soapbox serve, e.g. '--recycle-mb 0' (never start again in place)")
    args = ap.parse_args()
    args.think = tuple(args.think)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tempfile.mkdtemp(prefix="soapbox-load-")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    gc_dir = tempfile.mkdtemp(prefix="soapbox-gc-") if args.gc_log else None
    if gc_dir:  # (the server and its workers load benchmarks/gcprobe/sitecustomize.py, which logs there)
        env.update(SOAPBOX_GC_LOG=gc_dir, PYTHONPATH=os.pathsep.join(
            [str(ROOT / "benchmarks" / "gcprobe")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])))
    server = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--data-dir", data,
                               "--threads", str(args.threads)] + args.serve_args.split(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                              env=env)
    try:
        while "soapbox explorer:" not in (line := server.stdout.readline()):
            if not line and server.poll() is not None:
                raise SystemExit("soapbox serve did not start")
        notes: list[str] = []  # its log's notes (a start again in place: app.recycle)
        threading.Thread(target=lambda: [notes.append(f"{time.strftime('%H:%M:%S')} {ln.strip()}")
                                         for ln in server.stdout if "note:" in ln], daemon=True).start()
        base = f"http://127.0.0.1:{port}/"
        for _ in range(300):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        DashClient(base).call("url", {"url.search": ""}, [])  # the first request of all
        time.sleep(3)
        before = snapshot(server.pid)
        print(f"server after warm-up: {before}", flush=True)
        # (this process stands in for 20 browsers on other machines: its full collections, which
        # walked its imports for up to 0.3 s with a request in flight, are not the server's latency)
        gc.collect()
        gc.freeze()
        if gc_dir:  # (this process's full collections too, from here on)
            import runpy
            os.environ["SOAPBOX_GC_LOG"] = gc_dir
            runpy.run_path(str(ROOT / "benchmarks" / "gcprobe" / "sitecustomize.py"))
        peak, sessions, rounds = dict(before), [], []
        t_sessions = time.time()
        for r in range(args.rounds):
            t0 = time.monotonic() + 0.5
            batch = [Session(base, 1000 * r + k, args, t0 + args.ramp * k / max(1, args.sessions))
                     for k in range(args.sessions)]
            sessions += batch
            for s in batch:
                s.start()
            while any(s.is_alive() for s in batch):
                snap = snapshot(server.pid)
                peak = {k: max(peak[k], snap[k]) for k in peak if k in snap}
                time.sleep(1.0)
            ended = snapshot(server.pid)
            t_ended = time.time()
            t_end, trace = time.monotonic(), []  # (s after the end, resident MB) every 5 s while it settles
            while (left := t_end + args.settle - time.monotonic()) > 0:
                time.sleep(min(5.0, left))
                trace.append((round(time.monotonic() - t_end), round(snapshot(server.pid)["rss_mb"], 1)))
            settled = snapshot(server.pid)
            rounds.append({"at_end": ended, "settled": settled, "settling_rss_mb": trace})
            print(f"round {r + 1}: at end {ended}, settled {settled}", flush=True)
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()

    db = sqlite3.connect(Path(data) / "soapbox.sqlite3")
    proposals = [json.loads(r[0] or "{}").get("iterations") for r in db.execute("SELECT result FROM searches")]
    # the searches that made no proposal, each with why (its queue wait, run time and the search's notes)
    empty = [{"status": st, "queued_s": round(s - c, 2) if s else None, "ran_s": round(f - s, 2) if s and f else None,
              "error": err, "notes": json.loads(res or "{}").get("notes")}
             for st, c, s, f, err, res in db.execute(
                 "SELECT status, created_at, started_at, finished_at, error, result FROM searches")
             if not json.loads(res or "{}").get("iterations")]
    rows = db.execute("SELECT status, budget_s, created_at, started_at, finished_at FROM searches").fetchall()
    run = [f - s for st, b, c, s, f in rows if s and f]
    wait = [s - c for st, b, c, s, f in rows if s]
    budget_s = rows[0][1] if rows else None
    within = sum(1 for r in run if budget_s and r <= 1.2 * budget_s)
    renders = [s.render_s for s in sessions if s.render_s is not None]
    edits = [e for s in sessions for e in s.edit_s]
    errors = [e for s in sessions for e in s.errors]

    def pct(xs, q):
        return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else (xs[0] if xs else float("nan"))

    res = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
        "sessions": args.sessions, "duration_s": args.duration, "budget": args.budget, "think_s": list(args.think),
        "page_render_s": {"p50": pct(renders, 50), "p95": pct(renders, 95), "n": len(renders)},
        "edit_to_figures_s": {"p50": pct(edits, 50), "p95": pct(edits, 95), "max": max(edits, default=float("nan")),
                              "n": len(edits)},
        # (per minute of the run: does the tail grow as the server's caches and heap do?)
        "edit_p95_by_minute_s": [pct(w, 95) for w in _by_minute(sessions, args.duration)],
        "searches": {"n": len(rows), "statuses": {st: sum(1 for r in rows if r[0] == st) for st in {r[0] for r in rows}},
                     "run_s_median": statistics.median(run) if run else None, "run_s_max": max(run, default=None),
                     "within_budget_plus_20pct": within, "queue_wait_s_max": max(wait, default=None),
                     "proposals_min": min((p for p in proposals if p is not None), default=None),
                     "without_proposals": sum(1 for p in proposals if not p), "without_proposals_why": empty,
                     "refused_at_start": [s.search_status for s in sessions
                                          if s.search_status and s.search_status.startswith("Search not started")]},
        "server_before": before, "server_peak": peak, "server_at_end": ended, "server_settled": settled,
        "rss_growth_after_settle_mb": settled["rss_mb"] - before["rss_mb"],
        # CPU the server (and this load generator) used while the sessions ran, in cores
        "server_cores_busy": (ended["cpu_s"] - before["cpu_s"]) / max(1e-9, args.duration + args.ramp),
        "load_generator_cores_busy": (ended["load_cpu_s"] - before["load_cpu_s"]) / max(1e-9, args.duration + args.ramp),
        "rounds": args.rounds, "settled_rss_mb_per_round": [x["settled"]["rss_mb"] for x in rounds],
        "settling_rss_mb": [x["settling_rss_mb"] for x in rounds], "server_notes": notes,
        "errors": errors[:10],
        "error_count": len(errors),
    }
    if gc_dir:  # (by process: the server, its search workers, this load generator; from the first round's
        # start to the last one's end, the settling between rounds included)
        res["full_collections"] = gc_summary(gc_dir, t_sessions, t_ended)
        shutil.rmtree(gc_dir, ignore_errors=True)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
