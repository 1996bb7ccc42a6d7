"""The explorer at LLM scale (issue 16): server-side time of the page updates a planner makes.

1. Layout panel -> every Explore view as JSON (what Dash sends: the callback's outputs as it
   returns them, written by Plotly's JSON writer as Dash calls it): ``on_event('layout-apply')``
   then the views drawn from scratch in a fresh session (its simulation included, no cache),
   for LLaMA-2 7B on 64 A100s (Megatron tp 8 x pp 2, micro-batch 1) and GPT-3 175B on 1,024
   A100s (tp 8 x pp 16, micro-batch 1, full recomputation).
1b. Writing that response with its outputs as the callback returns them (``app.components.wire``)
   against with its components as made (``--only write``), alternating in one process.
2. The timeline regrouped (rows per stage) and zoomed (a tenth of the iteration) on those plans.
3. A slow strategy (FlexFlow's expert strategy for LLaMA-2 7B on 64 GPUs, ~9 M tasks): time to
   the page's first answer (it goes on off the request path) and until its views are drawn.
4. Cancel: a running ~9 M-task build cancelled 0.5, 2 and 5 s in; time until its thread is idle.
5. The page while a search runs: the default page's views drawn from scratch while an MCMC
   search of the same session runs in its worker process.

Baseline in the same process, interleaved with each round: the default page (Inception-v3 on
FlexFlow's 16 P100s, data parallel) drawn from scratch; ratios are against its median.

Usage: python benchmarks/bench_explorer.py [--repeat 5] [--only layout|write|timeline|slow|cancel|search]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

from plotly.io.json import to_json_plotly

from app import events as EV
from app.tabs import explore as EXP
from app import sessions as SES
from app import simulation as SIM
from app.tabs import search as SRCH
from app import state as ST
from app.tabs import timeline as TL
from app import warmup as WU

try:  # (the callback's outputs as it returns them; a tree before app.components.wire returned them as made)
    from app.components import wire
except ImportError:
    wire = None


CASES = {
    "LLaMA-2 7B, 64 A100s, tp 8 pp 2": ("llama2-7b", "dgx-a100-80gb:8", {"kind": "megatron", "tp": 8, "pp": 2, "micro_batch": 1}),
    "GPT-3 175B, 1,024 A100s, tp 8 pp 16, full recompute": (
        "gpt3-175b", "dgx-a100-80gb:128", {"kind": "megatron", "tp": 8, "pp": 16, "micro_batch": 1, "recompute": "full"}),
    "GPT-3 175B, 1,024 A100s, tp 8 pp 16, full recompute, sequence parallel": (
        "gpt3-175b", "dgx-a100-80gb:128",
        {"kind": "megatron", "tp": 8, "pp": 16, "micro_batch": 1, "recompute": "full", "flags": ["sequence_parallel"]}),
}


def _draw(state: dict) -> tuple[float, int]:
    """Seconds to draw every Explore view of ``state`` from scratch and write the response as
    the page's callback hands it to Dash (Plotly's JSON writer over the whole response, as Dash
    calls it), and the response's bytes."""
    t = time.perf_counter()
    out = EXP.draw_explore(state, True, "utilization", {})
    values = [out[i] for i in EXP.EXPLORE_IDS]
    if wire is not None:
        values = [wire(v) for v in values]
    size = len(_response(values))
    return time.perf_counter() - t, size


def _floor() -> float:
    s = ST.new_state(sid=ST.new_sid())
    dt, _ = _draw(s)
    SES.current().forget(s["sid"])
    return dt


def _layout_state(model: str, cluster: str, form: dict) -> tuple[dict, dict]:
    s = ST.new_state(model, cluster, sid=ST.new_sid())
    return s, dict(form)


def bench_layout(repeat: int) -> None:
    for name, (model, cluster, form) in CASES.items():
        times, floors, sizes = [], [], []
        for _ in range(repeat):
            s, f = _layout_state(model, cluster, form)
            t = time.perf_counter()
            new, msg = EV.on_event("layout-apply", s, layout=f)
            assert msg.startswith("Layout"), msg
            dt, size = _draw(new)
            times.append(time.perf_counter() - t)
            sizes.append(size)
            SES.current().forget(new["sid"])
            floors.append(_floor())
        m, fl = statistics.median(times), statistics.median(floors)
        print(f"layout panel -> figures, {name}: median {m:.2f} s (min {min(times):.2f}, max {max(times):.2f}), "
              f"{sizes[0] / 1e3:,.0f} KB of response; default page from scratch {fl:.2f} s; ratio {m / fl:.1f}x",
              flush=True)


def _response(values: list) -> str:
    """The Explore callback's response as Dash writes it (Plotly's JSON writer over the whole)."""
    return to_json_plotly({"multi": True, "response": {i: {"children": v} for i, v in zip(EXP.EXPLORE_IDS, values)}})


def bench_write(repeat: int) -> None:
    """Writing the Explore response: the outputs as the callback returns them
    (``app.components.wire``) against as they are made (components among them: Plotly's writer
    then walks the whole response in Python), alternating in one process; the same bytes."""
    if wire is None:
        print("write: this tree has no app.components.wire")
        return
    for name, (model, cluster, form) in CASES.items():
        s, f = _layout_state(model, cluster, form)
        new, _ = EV.on_event("layout-apply", s, layout=f)
        out = EXP.draw_explore(new, True, "utilization", {})
        made = [out[i] for i in EXP.EXPLORE_IDS]
        wired = [wire(v) for v in made]
        assert _response(made) == _response(wired)
        fast, slow = [], []
        for _ in range(5 * repeat):
            for values, into in ((wired, fast), (made, slow)):
                t = time.perf_counter()
                _response(values)
                into.append(time.perf_counter() - t)
        SES.current().forget(new["sid"])
        f_ms, s_ms = statistics.median(fast) * 1e3, statistics.median(slow) * 1e3
        print(f"write the Explore response, {name}: {f_ms:.1f} ms as returned (wire), {s_ms:.1f} ms with its "
              f"components as made ({f_ms / s_ms:.2f}x); {len(_response(wired)) / 1e3:,.0f} kB", flush=True)


def bench_timeline(repeat: int) -> None:
    for name, (model, cluster, form) in CASES.items():
        s, f = _layout_state(model, cluster, form)
        s, _ = EV.on_event("layout-apply", s, layout=f)
        ws = SIM.workspace(s)
        span = ws.timeline.makespan_s
        group, zoom, floors = [], [], []
        for _ in range(repeat):
            t = time.perf_counter()
            fig, _ = TL.zoom_gantt(s, None, {"rows": "stage"}, trigger="gantt-rows")
            to_json_plotly(fig)
            group.append(time.perf_counter() - t)
            t = time.perf_counter()
            fig, _ = TL.zoom_gantt(s, {"xaxis.range[0]": 0.45 * span * 1e3, "xaxis.range[1]": 0.55 * span * 1e3},
                                  {"rows": "stage"})
            to_json_plotly(fig)
            zoom.append(time.perf_counter() - t)
            floors.append(_floor())
        g, z, fl = statistics.median(group), statistics.median(zoom), statistics.median(floors)
        print(f"timeline, {name}: rows per stage {g * 1e3:.0f} ms, zoom to a tenth {z * 1e3:.0f} ms; default page "
              f"from scratch {fl:.2f} s; ratio {g / fl:.2f}x / {z / fl:.2f}x", flush=True)
        SES.current().forget(s["sid"])


def bench_slow(repeat: int) -> None:
    first, done, floors = [], [], []
    for _ in range(repeat):
        s = ST.new_state("llama2-7b", "dgx-a100-80gb:8", sid=ST.new_sid())
        assert EXP.render_explore(s, True, wait_s=60) is not None
        t = time.perf_counter()
        new, msg = EV.on_event("pick-baseline", s, baseline="expert")
        out = EXP.render_explore(new, True, "utilization", {}, wait_s=SIM.INLINE_WAIT_S)
        first.append(time.perf_counter() - t)
        while out is None:
            out = EXP.render_explore(new, True, "utilization", {}, wait_s=0.2)
        done.append(time.perf_counter() - t)
        SES.current().forget(s["sid"])
        SES.current().trim(0.0)
        floors.append(_floor())
    f, d, fl = statistics.median(first), statistics.median(done), statistics.median(floors)
    print(f"expert strategy, LLaMA-2 7B on 64 GPUs ({out['sum-tasks']} tasks): first answer {f:.2f} s, views "
          f"drawn {d:.2f} s (min {min(done):.2f}, max {max(done):.2f}); default page from scratch {fl:.2f} s; "
          f"ratio {d / fl:.1f}x", flush=True)


def bench_cancel(repeat: int) -> None:
    """Cancel a running ~9 M-task build (FlexFlow's expert strategy, LLaMA-2 7B on 64 GPUs) at
    several points of its life: seconds from Cancel until its thread is idle again."""
    for after_s in (0.5, 2.0, 5.0):
        lat = []
        for _ in range(repeat):
            s = ST.new_state("llama2-7b", "dgx-a100-80gb:8", sid=ST.new_sid())
            new, _ = EV.on_event("pick-baseline", s, baseline="expert")
            assert SIM.workspace_within(new, 0.0) is None
            time.sleep(after_s)
            phase = (SIM.build_status(new) or {}).get("phase", "done")
            t = time.perf_counter()
            EXP.cancel_simulation(new)
            while SES.current().running():
                time.sleep(0.002)
            lat.append(time.perf_counter() - t)
            SES.current().forget(s["sid"])
        print(f"cancel {after_s:g} s into the expert build ({phase}): idle {statistics.median(lat) * 1e3:.0f} ms "
              f"after Cancel (median of {repeat}; max {max(lat) * 1e3:.0f} ms)", flush=True)


def bench_search(repeat: int) -> None:
    from app import create_app

    create_app(data_dir=tempfile.mkdtemp(prefix="soapbox-bench-"))
    quiet, busy = [], []
    for _ in range(repeat):
        quiet.append(_floor())
        s = ST.new_state(sid=ST.new_sid())
        status, _ = SRCH.search_start(s, "mcmc", "30s", 0)
        time.sleep(2.0)  # the worker is searching
        busy.append(_floor())
        from app import jobs

        jobs.stop(s["sid"])
    q, b = statistics.median(quiet), statistics.median(busy)
    print(f"default page from scratch while an MCMC search runs: {b:.2f} s (min {min(busy):.2f}, max {max(busy):.2f}); "
          f"no search {q:.2f} s; ratio {b / q:.2f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", choices=["layout", "write", "timeline", "slow", "cancel", "search"])
    args = ap.parse_args()
    print(f"# {platform.node()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    WU.warm_up()
    getattr(WU, "settle_heap", lambda: None)()  # (as `soapbox serve` starts, where the tree has it)
    for name, fn in (("layout", bench_layout), ("write", bench_write), ("timeline", bench_timeline),
                     ("slow", bench_slow),
                     ("cancel", bench_cancel), ("search", bench_search)):
        if args.only in (None, name):
            fn(args.repeat)


if __name__ == "__main__":
    main()
