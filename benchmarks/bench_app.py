"""Explorer responsiveness (issue 5).

1. Hand edit -> new figures, server time: Inception-v3 on p100-4x4 (16 GPUs); from the
   data-parallel strategy, ``--edits`` random valid single-op edits (seeded), each timed from
   the event (``on_event('edit-apply')``) through the delta re-simulation and every Explore
   figure to their JSON (what Dash sends). Baseline in the same process: the same edits drawn
   from scratch (a fresh session each time: full build and simulation, no delta).
2. First page load in headless Chromium (Playwright, the system's browser): from navigation
   to the summary cards and the timeline drawn, on a warmed server (``soapbox serve`` warms
   up before it listens); a fresh browser context per load. Baseline in the same process: a
   Dash page with one empty graph (the framework's own floor on this machine).

Usage: python benchmarks/bench_app.py [--edits 20] [--loads 5] [--only edit|load]
"""

from __future__ import annotations

import argparse
import logging
import platform
import random
import socket
import statistics
import threading
import time

import plotly.io as pio

from engine.search.chains import random_config
from app import events as EV
from app.tabs import explore as EXP
from app import simulation as SIM
from app import sources as SRC
from app import state as ST
from app import warmup as WU


def _edits(n: int, seed: int = 0):
    state = ST.new_state("inception_v3", "p100-4x4")
    g, c = SRC.graph_of(state), SRC.cluster_of(state)
    rng = random.Random(seed)
    names = [op.name for op in g.ops if op.kind != "input"]
    sim = SIM.workspace(state).sim
    out = []
    while len(out) < n:
        name = rng.choice(names)
        cfg = random_config(g[name], c.num_devices, rng)
        if sim.check(name, cfg):
            continue
        out.append((name, dict(cfg.degrees), ",".join(map(str, cfg.devices))))
    return state, out


def _timed_edit(state: dict, edit) -> tuple[dict, float]:
    name, degrees, devices = edit
    t = time.perf_counter()
    new, msg = EV.on_event("edit-apply", dict(state, selected=[name]), degrees=degrees, devices=devices)
    assert new is not state, msg
    out = EXP.draw_explore(new, True, "utilization")  # the views themselves, not the cache
    for key in ("op-graph", "gantt", "topology", "memory"):
        pio.to_json(out[key], validate=False)
    return new, time.perf_counter() - t


def bench_edit(n: int) -> None:
    state, edits = _edits(n)
    EXP.render_explore(state, True, "utilization")  # warm: kernels compiled, caches filled
    delta, full = [], []
    for e in edits:
        state, dt = _timed_edit(state, e)
        delta.append(dt)
        fresh = dict(state, sid=ST.new_sid())  # same strategy, new session: full build
        name, degrees, devices = e
        t = time.perf_counter()
        out = EXP.draw_explore(fresh, True, "utilization")
        for key in ("op-graph", "gantt", "topology", "memory"):
            pio.to_json(out[key], validate=False)
        full.append(time.perf_counter() - t)
    d, f = statistics.median(delta), statistics.median(full)
    print(f"hand edit -> figures, Inception-v3 on p100-4x4 (16 GPUs), {n} edits: "
          f"median {d * 1e3:.1f} ms (min {min(delta) * 1e3:.1f}, max {max(delta) * 1e3:.1f}); "
          f"drawn from scratch {f * 1e3:.1f} ms; ratio {f / d:.2f}x", flush=True)


def _serve(app) -> tuple[str, object]:
    from werkzeug.serving import make_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = make_server("127.0.0.1", port, app.server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{port}/", server


def bench_load(n: int) -> None:
    from dash import Dash, dcc, html
    from playwright.sync_api import sync_playwright

    from app import create_app

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app = create_app()
    WU.warm_up()
    url, server = _serve(app)
    floor = Dash(__name__)
    floor.layout = html.Div([html.H1("floor"), dcc.Graph(id="g", figure={"data": [{"x": [0, 1], "y": [0, 1]}]})])
    floor_url, floor_server = _serve(floor)
    import shutil

    exe = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])

        def load(u: str, ready: list[str]) -> list[float]:
            """Seconds from navigation until each selector in turn is present."""
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = ctx.new_page()
            t = time.perf_counter()
            page.goto(u)
            marks = []
            for sel in ready:
                page.wait_for_selector(sel, timeout=60_000)
                marks.append(time.perf_counter() - t)
            ctx.close()
            return marks

        app_ready = ["#sum-time:has-text('ms')", "#gantt .barlayer .point", "#op-graph .scatterlayer .point"]
        load(url, app_ready)  # the browser's own first start
        runs = [load(url, app_ready) for _ in range(n)]
        summary_t = [r[0] for r in runs]
        app_t = [r[-1] for r in runs]
        floor_t = [load(floor_url, ["#g .scatterlayer .trace"])[0] for _ in range(n)]
        browser.close()
    server.shutdown()
    floor_server.shutdown()
    a, f = statistics.median(app_t), statistics.median(floor_t)
    print(f"first page load, {n} loads: summary shown {statistics.median(summary_t):.2f} s; summary, timeline and "
          f"op graph drawn {a:.2f} s (min {min(app_t):.2f}, max {max(app_t):.2f}); one-graph Dash page {f:.2f} s; "
          f"ratio {a / f:.2f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--edits", type=int, default=20)
    ap.add_argument("--loads", type=int, default=5)
    ap.add_argument("--only", choices=["edit", "load"])
    args = ap.parse_args()
    print(f"# {platform.node()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    if args.only != "load":
        bench_edit(args.edits)
    if args.only != "edit":
        bench_load(args.loads)


if __name__ == "__main__":
    main()
