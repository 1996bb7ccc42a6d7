"""View data (app.views) and the Plotly figures drawn from it (app.figures), on small simulations."""

from __future__ import annotations

import math
import signal
from collections import Counter

import numpy as np
import plotly.graph_objects as go
import pytest
from hypothesis import given, settings, strategies as st

from app import figures as _figures
from app import gantt_figure as _gantt_figures
from app import gantt as G
from app import views as V
from app.fmt import format_bytes, format_count, format_rate, format_seconds
from engine.cluster import preset
from engine.formats import resolve_model
from engine.sim.report import simulate_strategy
from engine.search.baselines import data_parallel, expert
from engine.strategy import Config
from engine.sim.memory import memory_report
from engine.sim.full import simulate
from engine.taskgraph import BWD, COLL, FWD, UPDATE, XFER, build_task_graph
from app import actions as ACT
from app import simulation as SIM
from app import sources as SRC
from app import state as ST
from engine.layout import Layout, build_layout


class _Validating:
    """:mod:`app.figures` with every figure it builds (a plain dict, as the page takes it)
    loaded into ``go.Figure``, which validates it in full: a mistyped or unknown property
    fails the test."""

    def __init__(self, module) -> None:
        self._module = module

    def __getattr__(self, name):
        f = getattr(self._module, name)
        if not (callable(f) and name.endswith("_figure")):
            return f

        def validated(*args, **kwargs):
            fig = f(*args, **kwargs)
            assert isinstance(fig, dict) and set(fig) <= {"data", "layout"}
            # Plotly's default look, as go.Figure gives it (without it tick labels such as
            # "GPU 0 collectives" were cut off: the template lets axis margins grow to fit)
            assert fig["layout"]["template"]["layout"]["yaxis"]["automargin"] is True
            return go.Figure(fig)
        return validated


F = _Validating(_figures)
GF = _Validating(_gantt_figures)  # (the timeline's figures)

KIND = {FWD: "forward", BWD: "backward", UPDATE: "optimizer", XFER: "transfer", COLL: "collective"}
NO_MERGE = 10**9



@pytest.fixture(scope="module")
def dp(alexnet):
    g, c = alexnet
    return simulate_strategy(g, data_parallel(g, c), c)


@pytest.fixture(scope="module")
def ex(alexnet):
    """FlexFlow's expert strategy: thousands of transfers, so the Gantt merges by default."""
    g, c = alexnet
    return simulate_strategy(g, expert(g, c), c)


def pairs(r, labels):
    """Every (task, row label) the Gantt should draw, by kind, computed independently of
    gantt_data: compute and optimizer tasks on their GPU's row, transfers on their link's row,
    collectives on the collectives row of each device taking part; zero-length tasks skipped."""
    tg, c = r.tasks, r.cluster
    out = {k: [] for k in KIND.values()}
    for t in range(tg.num_tasks):
        k = int(tg.kind[t])
        if not tg.dur_s[t] > 0 or k == COLL:
            continue
        if k == XFER:
            lk = c.links[int(tg.link[t])]
            out["transfer"].append((t, f"{lk.src} → {lk.dst}"))
        else:
            out[KIND[k]].append((t, f"GPU {tg.device[t]}"))
    ptr, idx, tasks = tg.info["coll_devices"]
    for i, t in enumerate(tasks):
        if tg.dur_s[t] > 0:
            for d in idx[ptr[i]:ptr[i + 1]]:
                out["collective"].append((int(t), f"GPU {d} collectives"))
    return {k: v for k, v in out.items() if v}


def bar_pairs(data):
    """(task, row label) of every bar (each bar one task: an unmerged view), by kind."""
    out = {}
    for kind, b in data["bars"].items():
        assert (b["count"] == 1).all()
        out[kind] = [(int(t), data["labels"][int(r)]) for t, r in zip(b["task"], b["row"])]
    return out


class _Timeout(Exception):
    pass


def within(seconds, fn, *args, **kw):
    """Call fn, raising _Timeout if it runs longer than ``seconds`` (SIGALRM, main thread)."""
    def handler(signum, frame):
        raise _Timeout(f"{fn.__name__} did not return within {seconds} s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn(*args, **kw)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class TestGanttData:
    def test_rows(self, alexnet, dp, ex):
        g, c = alexnet
        d = G.gantt_data(g, c, dp.timeline)
        assert d["labels"] == [x for i in range(16) for x in (f"GPU {i}", f"GPU {i} collectives")]
        e = G.gantt_data(g, c, ex.timeline, links=True)
        links = {int(x) for x in np.unique(ex.tasks.link[ex.tasks.kind == XFER])}
        assert e["labels"][:32] == d["labels"]
        assert e["labels"][32:] == [f"{c.links[k].src} → {c.links[k].dst}" for k in sorted(links)]
        # more link rows than AUTO_LINK_ROWS: behind the toggle by default, counted
        auto = G.gantt_data(g, c, ex.timeline)
        assert len(links) > G.AUTO_LINK_ROWS and auto["labels"] == d["labels"] and auto["links_hidden"] == len(links)
        assert d["window"] == [0.0, dp.timeline.makespan_s] and d["makespan_s"] == dp.timeline.makespan_s

    @pytest.mark.parametrize("which", ["dp", "ex"])
    def test_every_task_in_exactly_one_bar_when_not_merged(self, alexnet, dp, ex, which):
        g, c = alexnet
        r = dp if which == "dp" else ex
        d = G.gantt_data(g, c, r.timeline, links=True, max_bars=NO_MERGE)
        assert d["merged"] is False
        want, got = pairs(r, d["labels"]), bar_pairs(d)
        assert set(got) == set(want)
        for kind in want:
            assert Counter(got[kind]) == Counter(want[kind]), kind
            assert len(set(got[kind])) == len(got[kind])  # no pair twice
        fb = ((r.tasks.kind == FWD) | (r.tasks.kind == BWD)) & (r.tasks.dur_s > 0)
        assert sum(int(d["bars"][k]["count"].sum()) for k in ("forward", "backward")) == int(fb.sum())
        assert d["tasks_in_view"] == sum(len(v) for v in want.values())
        tg = r.tasks
        for kind, b in d["bars"].items():  # an unmerged bar is its task
            np.testing.assert_array_equal(b["start"], r.timeline.start_s[b["task"]])
            np.testing.assert_array_equal(b["end"], r.timeline.end_s[b["task"]])
            assert len(b["text"]) == len(b["task"])
            assert {KIND[int(k)] for k in tg.kind[b["task"]]} == {kind}

    def test_collectives_on_every_participating_device(self, alexnet, dp):
        g, c = alexnet
        d = G.gantt_data(g, c, dp.timeline, max_bars=NO_MERGE)
        b = d["bars"]["collective"]
        ptr, idx, tasks = dp.tasks.info["coll_devices"]
        assert len(tasks) == 8
        for i, t in enumerate(tasks):
            rows = sorted(int(r) for r in b["row"][b["task"] == t])
            assert rows == sorted(2 * int(dv) + 1 for dv in idx[ptr[i]:ptr[i + 1]])
            assert all(d["labels"][r].endswith(" collectives") for r in rows)
        assert len(b["task"]) == 8 * 16

    def test_hover_text(self, alexnet, dp):
        g, c = alexnet
        tg = dp.tasks
        d = G.gantt_data(g, c, dp.timeline, max_bars=NO_MERGE)
        b = d["bars"]["forward"]
        i = int(np.flatnonzero(tg.op[b["task"]] == g.index["fc6"])[0])
        t = int(b["task"][i])
        assert b["text"][i] == (f"fc6 forward · part {tg.part[t]} · microbatch 0 · "
                                f"{format_seconds(tg.dur_s[t])}")
        b = d["bars"]["collective"]
        i = int(np.flatnonzero(tg.op[b["task"]] == g.index["fc6"])[0])
        t = int(b["task"][i])
        assert b["text"][i] == f"fc6 all_reduce · {format_bytes(tg.size_bytes[t])} · {format_seconds(tg.dur_s[t])}"
        assert d["bars"]["optimizer"]["text"][0].startswith("optimizer step · ")

    @pytest.mark.parametrize("max_bars", [3000, 1000, 250])
    def test_merging_keeps_every_task_and_the_span(self, alexnet, ex, max_bars):
        g, c = alexnet
        full = G.gantt_data(g, c, ex.timeline, links=True, max_bars=NO_MERGE)
        d = G.gantt_data(g, c, ex.timeline, links=True, max_bars=max_bars)
        assert full["tasks_in_view"] == d["tasks_in_view"] > max_bars
        assert d["merged"] is True
        n_bars = sum(len(b["task"]) for b in d["bars"].values())
        assert n_bars <= max_bars
        assert set(d["bars"]) == set(full["bars"])
        for kind, fb in full["bars"].items():
            b = d["bars"][kind]
            assert int(b["count"].sum()) == len(fb["task"]), kind  # every task counted once
            # every task lies inside a merged bar of its row and kind
            for row in np.unique(fb["row"]):
                s, e = fb["start"][fb["row"] == row], fb["end"][fb["row"] == row]
                bs, be = b["start"][b["row"] == row], b["end"][b["row"] == row]
                inside = (bs[None, :] <= s[:, None]) & (be[None, :] >= e[:, None])
                assert inside.any(axis=1).all(), (kind, row)
        starts = np.concatenate([b["start"] for b in d["bars"].values()])
        ends = np.concatenate([b["end"] for b in d["bars"].values()])
        f_starts = np.concatenate([b["start"] for b in full["bars"].values()])
        f_ends = np.concatenate([b["end"] for b in full["bars"].values()])
        assert starts.min() == f_starts.min() and ends.max() == f_ends.max()
        merged_texts = [t for b in d["bars"].values() for t, n in zip(b["text"], b["count"]) if n > 1]
        assert merged_texts and all("tasks" in t and "zoom in" in t for t in merged_texts)

    def test_merging_always_terminates(self, alexnet, dp):
        g, c = alexnet
        # 16 GPUs x (forward, backward, optimizer, collective rows) = 64 bars at the least
        d = within(120, G.gantt_data, g, c, dp.timeline, max_bars=40)  # a hang guard, not a speed limit
        assert d["merged"] is True
        assert sum(int(b["count"].sum()) for b in d["bars"].values()) == d["tasks_in_view"] == 816

    def test_window_limits_bars(self, alexnet, ex):
        g, c = alexnet
        ms = ex.timeline.makespan_s
        t0, t1 = 0.4 * ms, 0.5 * ms
        full = G.gantt_data(g, c, ex.timeline, links=True, max_bars=NO_MERGE)
        d = G.gantt_data(g, c, ex.timeline, links=True, window=(t0, t1), max_bars=NO_MERGE)
        assert d["window"] == [t0, t1]
        assert 0 < d["tasks_in_view"] < full["tasks_in_view"]
        for kind, b in d["bars"].items():
            assert ((b["end"] >= t0) & (b["start"] <= t1)).all()
        for kind, fb in full["bars"].items():  # and every overlapping task is there
            want = set(zip(fb["task"][(fb["end"] >= t0) & (fb["start"] <= t1)].tolist(),
                           fb["row"][(fb["end"] >= t0) & (fb["start"] <= t1)].tolist()))
            got = set(zip(d["bars"][kind]["task"].tolist(), d["bars"][kind]["row"].tolist())) \
                if kind in d["bars"] else set()
            assert got == want, kind

    def test_window_past_the_end_is_empty(self, alexnet, dp):
        g, c = alexnet
        ms = dp.timeline.makespan_s
        d = G.gantt_data(g, c, dp.timeline, window=(2 * ms, 3 * ms))
        assert d["bars"] == {} and d["tasks_in_view"] == 0 and d["merged"] is False
        assert GF.build_gantt_figure(d).layout.xaxis.range == (2 * ms * 1e3, 3 * ms * 1e3)

    @pytest.mark.parametrize("window", [(float("nan"), 1e-3), (0.0, float("inf")), (2e-3, 1e-3)])
    def test_a_window_that_is_not_a_range_is_refused(self, alexnet, dp, window):
        """A NaN or infinite bound, or a start after the end: said, where it drew nothing (the
        page's own reader refuses these before; a caller of gantt_data gets the same answer)."""
        g, c = alexnet
        with pytest.raises(ValueError, match="window must be two finite times"):
            G.gantt_data(g, c, dp.timeline, window=window)

    def test_critical_path_overlay(self, alexnet, dp):
        g, c = alexnet
        tl = dp.timeline
        d = G.gantt_data(g, c, tl)
        crit = tl.critical_tasks
        crit = crit[tl.end_s[crit] > tl.start_s[crit]]
        o = d["overlays"]["critical path"]
        assert len(o["start"]) == len(crit) > 0
        np.testing.assert_array_equal(o["start"], tl.start_s[crit])
        np.testing.assert_array_equal(o["end"], tl.end_s[crit])
        assert (o["row"] >= 0).all()
        assert o["end"].max() == tl.makespan_s

    def test_selected_overlay(self, alexnet, dp):
        g, c = alexnet
        d = G.gantt_data(g, c, dp.timeline, selected=["fc6", "not-an-op"])
        o = d["overlays"]["selected"]
        tg = dp.tasks
        mine = np.flatnonzero((tg.op == g.index["fc6"]) & ((tg.kind == FWD) | (tg.kind == BWD)))
        assert len(mine) == 32
        np.testing.assert_array_equal(np.sort(o["start"]), np.sort(dp.timeline.start_s[mine]))
        assert sorted(d["labels"][int(r)] for r in o["row"]) == sorted(f"GPU {tg.device[t]}" for t in mine)
        assert all(t.startswith("fc6 ") for t in o["text"])
        assert "selected" not in G.gantt_data(g, c, dp.timeline)["overlays"]


class TestGanttFigure:
    def test_traces_by_kind_in_milliseconds(self, alexnet, dp):
        g, c = alexnet
        d = G.gantt_data(g, c, dp.timeline, selected=["fc6"])
        fig = GF.build_gantt_figure(d, title="t")
        assert [tr.name for tr in fig.data] == ["forward", "backward", "optimizer", "collective", "critical path",
                                                "selected"]
        for tr in fig.data[:4]:
            b = d["bars"][tr.name]
            assert tr.orientation == "h" and tr.marker.color == F.KIND_COLOURS[tr.name]
            np.testing.assert_array_equal(tr.base, b["start"] * 1e3)
            np.testing.assert_array_equal(tr.x, (b["end"] - b["start"]) * 1e3)
            np.testing.assert_array_equal(tr.y, b["row"].astype(float))
            assert list(tr.hovertext) == b["text"]
        fwd = d["bars"]["forward"]
        assert fig.data[0].base[0] == fwd["start"][0] * 1e3
        assert fig.data[0].x[0] == (fwd["end"][0] - fwd["start"][0]) * 1e3
        crit = fig.data[4]
        assert crit.marker.line.color == F.CRITICAL_COLOUR
        np.testing.assert_array_equal(crit.base, d["overlays"]["critical path"]["start"] * 1e3)
        assert fig.data[5].marker.line.color == F.SELECTED_COLOUR
        assert fig.layout.xaxis.range == (0.0, dp.timeline.makespan_s * 1e3)
        assert fig.layout.yaxis.ticktext == tuple(d["labels"])
        assert fig.layout.yaxis.tickvals == tuple(range(32))
        assert fig.layout.barmode == "overlay" and fig.layout.title.text == "t"
        assert not fig.layout.annotations

    def test_merged_view_says_so(self, alexnet, ex):
        g, c = alexnet
        d = G.gantt_data(g, c, ex.timeline, links=True, max_bars=300)
        fig = GF.build_gantt_figure(d)
        assert GF.gantt_notes(d).startswith(f"{d['tasks_in_view']:,} tasks in view: neighbours merged")
        assert {tr.name for tr in fig.data} == {"forward", "backward", "optimizer", "transfer", "collective",
                                                "critical path"}

    def test_figure_serialises(self, alexnet, dp):
        g, c = alexnet
        fig = GF.build_gantt_figure(G.gantt_data(g, c, dp.timeline))
        assert '"critical path"' in fig.to_json()


class TestGraphLayout:
    @pytest.mark.parametrize("model", ["alexnet", "inception_v3"])
    @pytest.mark.parametrize("collapse", [False, True])
    def test_members_and_edges(self, model, collapse):
        g = resolve_model(model)
        L = V.graph_layout(g, collapse)
        assert L["collapsed"] is collapse
        assert len(L["nodes"]) == len(set(L["nodes"])) == len(L["x"]) == len(L["y"])
        members = [m for n in L["nodes"] for m in L["members"][n]]
        assert sorted(members) == sorted(op.name for op in g.ops)  # every op in exactly one node
        x = dict(zip(L["nodes"], L["x"]))
        assert L["edges"]
        assert all(x[a] < x[b] for a, b in L["edges"])
        node_of = {m: n for n in L["nodes"] for m in L["members"][n]}
        want = {(node_of[g.ops[p].name], node_of[g.ops[c].name]) for p, _, c, _ in g.edges}
        assert set(L["edges"]) == {e for e in want if e[0] != e[1]}
        if collapse:
            assert L["nodes"] == list(dict.fromkeys(op.block or op.name for op in g.ops))
            assert all(g[m].block == n or (g[m].block is None and m == n)
                       for n in L["nodes"] for m in L["members"][n])
        else:
            assert L["nodes"] == [op.name for op in g.ops]
            assert all(L["members"][n] == [n] for n in L["nodes"])

    def test_alexnet_collapsed_exact(self):
        L = V.graph_layout(resolve_model("alexnet"), True)
        assert L["nodes"] == ["data", "labels", "features", "classifier"]
        assert L["x"] == [0.0, 0.0, 1.0, 2.0]
        assert sorted(L["edges"]) == [("data", "features"), ("features", "classifier"), ("labels", "classifier")]

    def test_layers_are_longest_paths(self):
        g = resolve_model("alexnet")
        L = V.graph_layout(g, False)
        assert L["x"] == [0.0, 0.0] + [float(i) for i in range(1, 22)] + [22.0]

    def test_cached_by_the_page(self):
        """The page draws a model's graph once per mode (kept in the server's Sessions)."""
        from app.tabs.explore import graph_view

        g = resolve_model("alexnet")
        assert graph_view(g, None, False, None) is graph_view(g, None, False, None)
        assert graph_view(g, None, False, None) == V.graph_layout(g, False)


class TestOpGraphFigure:
    def test_nodes_colours_and_selection(self):
        g = resolve_model("inception_v3")
        L = V.graph_layout(g, True)
        blocks = sorted(set(L["nodes"]))
        colour_of = {n: F.CONFIG_PALETTE[i % 3] for i, n in enumerate(L["nodes"])}
        legend = {F.CONFIG_PALETTE[i]: f"config {i}" for i in range(3)}
        hover = {n: f"hover {n}" for n in L["nodes"]}
        selected = {L["nodes"][2], L["nodes"][5]}
        fig = F.build_op_graph_figure(L, colour_of, legend, hover, selected)
        edges, *groups, ring = fig.data
        assert edges.mode == "lines"
        assert len([v for v in edges.x if v is not None and not (isinstance(v, float) and math.isnan(v))]) == \
            2 * len(L["edges"])
        assert sum(len(t.x) for t in groups) == len(L["nodes"]) == len(blocks)
        assert sorted(n for t in groups for n in t.customdata) == sorted(L["nodes"])
        assert {t.name for t in groups} == {"config 0", "config 1", "config 2"}
        for t in groups:
            assert {colour_of[n] for n in t.customdata} == {t.marker.color}
            assert list(t.hovertext) == [hover[n] for n in t.customdata]
        assert ring.name == "selected"
        assert set(ring.customdata) == selected and len(ring.customdata) == 2
        pos = dict(zip(L["nodes"], zip(L["x"], L["y"])))
        assert [(x, y) for x, y in zip(ring.x, ring.y)] == [pos[n] for n in ring.customdata]

    def test_no_selection_no_ring_and_unknown_colour(self):
        L = V.graph_layout(resolve_model("alexnet"), False)
        fig = F.build_op_graph_figure(L, {}, {}, {})
        assert [t.name for t in fig.data][1:] == ["mixed"]
        assert fig.data[1].marker.color == "#999999" and len(fig.data[1].x) == 24
        assert list(fig.data[1].hovertext) == L["nodes"]


class TestTopology:
    def test_p100(self):
        c = preset("p100-4x4")
        values = np.arange(16) / 20
        t = V.topology_data(c, values, "utilization")
        assert t["metric"] == "utilization" and t["nodes"] == ["node0", "node1", "node2", "node3"]
        assert [x["id"] for x in t["gpus"]] == list(range(16))
        assert [x["value"] for x in t["gpus"]] == pytest.approx(values.tolist(), abs=0)
        assert [x["name"] for x in t["gpus"]] == [d.name for d in c.devices]
        assert len({(x["x"], x["y"]) for x in t["gpus"]}) == 16
        kinds = Counter(e["kind"] for e in t["edges"])
        assert kinds == {"nvlink": 24, "pcie": 16, "network": 4}
        bw = {(lk.kind, lk.bw_bytes_per_s) for lk in c.links}
        assert {(e["kind"], e["bw"]) for e in t["edges"]} == bw
        assert {e["bw"] for e in t["edges"] if e["kind"] == "nvlink"} == {20e9}
        gpu_pos = {(x["x"], x["y"]) for x in t["gpus"]}
        assert all(e["from"] in gpu_pos and e["to"] in gpu_pos for e in t["edges"] if e["kind"] == "nvlink")
        assert "fabric" in {h["name"] for h in t["hubs"]}

    def test_figure(self):
        c = preset("p100-4x4")
        t = V.topology_data(c, np.full(16, 0.5), "memory")
        fig = F.build_topology_figure(t)
        gpu = next(tr for tr in fig.data if tr.name == "GPU")
        assert list(gpu.customdata) == list(range(16))
        assert list(gpu.marker.color) == [0.5] * 16
        assert gpu.hovertext[0].endswith("memory used / capacity 50%")
        lines = {tr.name for tr in fig.data if tr.mode == "lines"}
        assert lines == {"nvlink", "pcie", "network"}
        hovers = [h for tr in fig.data if tr.mode == "markers" and tr.hovertext for h in tr.hovertext]
        assert "nvlink link · 20 GB/s per direction" in hovers


class TestMemory:
    def test_memory_data_and_figure(self, dp):
        """GPUs with identical memory are one bar with their count (issue 16: 1,024 bars were
        unreadable); data parallel's GPUs are all alike."""
        used = [0, 3, 7]
        d = V.memory_data(dp.memory, used)
        assert d["devices"] == [0] and d["labels"] == ["GPU 0 (x3)"]
        np.testing.assert_array_equal(d["parts"]["weights"], dp.memory.weights_bytes[[0]])
        np.testing.assert_array_equal(d["parts"]["activations (peak)"], dp.memory.activations_peak_bytes[[0]])
        np.testing.assert_array_equal(d["capacity"], dp.memory.capacity_bytes[[0]])
        fig = F.build_memory_figure(d)
        bars = [tr for tr in fig.data if tr.type == "bar"]
        assert [tr.name for tr in bars] == list(F.MEMORY_COLOURS)
        assert fig.layout.barmode == "stack"
        for tr in bars:
            assert list(tr.y) == ["GPU 0 (x3)"] and tr.orientation == "h"
            np.testing.assert_allclose(tr.x, d["parts"][tr.name] / 1e9, rtol=0, atol=0)
        cap = fig.data[-1]
        assert cap.name == "capacity" and cap.type == "scatter"
        np.testing.assert_array_equal(cap.x, dp.memory.capacity_bytes[[0]] / 1e9)
        assert fig.layout.title.text == "fits in memory"
        # a pipeline's stages differ: one bar each, in device order, summing the parts

        g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
        s = build_layout(g, c, Layout(pp=2, micro_batch=1))
        rep = memory_report(g, s, c, simulate(build_task_graph(g, s, c)))
        d2 = V.memory_data(rep, list(range(8)))
        assert d2["labels"] == ["GPU 0 (x4)", "GPU 4 (x4)"]
        total = sum(v for v in d2["parts"].values())
        np.testing.assert_allclose(total, rep.peak_bytes[[0, 4]])
        # labelled with their stage; at most max_groups bars, the fullest kept and counted
        d3 = V.memory_data(rep, list(range(8)), G.stage_of_devices(s, c.num_devices))
        assert d3["labels"] == ["stage 0 · GPU 0 (x4)", "stage 1 · GPU 4 (x4)"] and d3["hidden"] == 0
        fullest = int(np.argmax(rep.peak_bytes[[0, 4]] / rep.capacity_bytes[[0, 4]]))
        d4 = V.memory_data(rep, list(range(8)), max_groups=1)
        assert d4["devices"] == [[0, 4][fullest]] and d4["hidden"] == 1
        assert F.build_memory_figure(d4).layout.title.text.endswith("· the 1 fullest of 2 groups shown")

    def test_over_capacity_title(self):
        d = {"devices": [0, 1], "parts": {k: np.array([1e9, 2e9]) for k in F.MEMORY_COLOURS},
             "capacity": np.array([16e9, 8e9]), "feasible": False, "over": [(1, 2e9)]}
        fig = F.build_memory_figure(d)
        assert fig.layout.title.text == "OVER CAPACITY on 1 GPU; worst GPU 1 (+2 GB)"
        assert list(fig.data[-1].x) == [16.0, 8.0]

    def test_a_fitting_plan_whose_cache_passes_the_mark_says_so(self):
        """Issue 44: "fits in memory" beside a 202 GB bar past GB200's 186 GB mark. What is
        allocated fits; the allocator's cache (fragmentation) takes the bar past it."""
        d = {"devices": [0, 1], "parts": {k: np.array([1e9, 2e9]) for k in F.MEMORY_COLOURS},
             "capacity": np.array([16e9, 8e9]), "feasible": True, "over": []}
        fig = F.build_memory_figure(d)
        assert fig.layout.title.text == ("fits in memory: allocated within capacity; on 1 bar the allocator's cache "
                                         "goes past it (freed before an out-of-memory)")


class TestTraceAndCompare:
    def test_trace_figure(self):
        rows = [{"iteration": i, "current_cost_s": 0.01 * (5 - i), "best_cost_s": 0.01 * (5 - i) / 2,
                 "elapsed_s": 0.1 * i, "acceptance_rate": 0.5} for i in range(4)]
        fig = F.build_trace_figure(rows, "mcmc")
        current, best = fig.data
        assert (current.name, best.name) == ("current", "best")
        assert list(current.x) == [0, 1, 2, 3] == list(best.x)
        assert list(current.y) == pytest.approx([50.0, 40.0, 30.0, 20.0])
        assert list(best.y) == pytest.approx([25.0, 20.0, 15.0, 10.0])
        assert fig.layout.title.text == "mcmc" and fig.layout.xaxis.title.text == "proposals"

    def test_empty_trace(self):
        fig = F.build_trace_figure([])
        assert len(fig.data) == 2 and len(fig.data[0].x) == 0

    def test_compare_two(self, alexnet, dp, ex):
        g, c = alexnet
        a = G.gantt_data(g, c, dp.timeline)
        b = G.gantt_data(g, c, ex.timeline, links=True)
        fig = GF.build_compare_figure([("dp", a), ("expert", b)])
        assert {tr.yaxis for tr in fig.data} == {"y", "y2"}
        assert [tr.name for tr in fig.data if tr.yaxis == "y"] == list(a["bars"])
        assert [tr.name for tr in fig.data if tr.yaxis == "y2"] == list(b["bars"])
        assert all(tr.xaxis in ("x", "x2") for tr in fig.data)
        assert fig.layout.xaxis.matches == "x2"  # shared time axis
        assert fig.layout.yaxis.ticktext == tuple(a["labels"]) and fig.layout.yaxis2.ticktext == tuple(b["labels"])
        titles = [an.text for an in fig.layout.annotations]
        assert titles == [f"dp · {format_seconds(dp.timeline.makespan_s)}",
                          f"expert · {format_seconds(ex.timeline.makespan_s)}"]
        assert fig.layout.xaxis2.title.text == "time" and fig.layout.xaxis2.ticktext[1].endswith(" ms")
        legend = [tr.name for tr in fig.data if tr.showlegend is not False]
        assert legend == list(a["bars"])  # the legend is shown once
        assert not any(tr.name == "critical path" for tr in fig.data)

    def test_compare_none(self):
        fig = GF.build_compare_figure([])
        assert fig.layout.annotations[0].text.startswith("Keep two or more")

    def test_empty_figure(self):
        assert F.empty_figure().layout.annotations == ()
        assert F.empty_figure("hi").layout.annotations[0].text == "hi"


class TestViewData:
    def test_config_label(self):
        assert V.config_label(Config({"sample": 2, "channel": 2}, (0, 1, 2, 3))) == "channel 2 · sample 2"
        assert V.config_label(Config({}, (0,))) == "none"

    def test_op_details(self, alexnet, dp):
        g, _ = alexnet
        d = V.op_details(g, dp.strategy, dp.timeline, "fc6")
        tg = dp.tasks
        mine = tg.op == g.index["fc6"]
        assert d["name"] == "fc6" and d["kind"] == "linear" and d["block"] == "classifier"
        assert d["partitions"] == 16 and d["label"] == "sample 16"
        assert d["config"] == {"degrees": {"sample": 16}, "devices": list(range(16))}
        assert d["params"] == g["fc6"].param_count
        # data parallel: each GPU runs one sixteenth of the forward; the panel shows one GPU's time
        fwd = mine & (tg.kind == FWD)
        per_gpu = np.bincount(tg.device[fwd], weights=tg.dur_s[fwd])
        assert d["time_s"]["forward"] == float(per_gpu.max()) > 0
        coll = np.nonzero(mine & (tg.kind == COLL))[0]
        assert 0 < d["time_s"]["collective"] <= float(dp.timeline.end_s[coll].max() - dp.timeline.start_s[coll].min())
        assert d["time_s"]["collective"] <= dp.timeline.makespan_s
        assert d["time_s"]["transfer"] == 0.0

    def test_time_in_flight_counts_overlaps_once(self):
        assert V.time_in_flight_s(np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0])) == 4.0
        assert V.time_in_flight_s(np.array([]), np.array([])) == 0.0

    def test_config_diff(self, dp, ex):
        diff = V.config_diff(dp.strategy, ex.strategy)
        changed = [op for op in dp.strategy.configs if dp.strategy[op] != ex.strategy[op]]
        assert [x["op"] for x in diff] == changed and len(changed) == 3
        fc8 = next(x for x in diff if x["op"] == "fc8")
        assert fc8 == {"op": "fc8", "a": "sample 16 on 16 GPU(s)", "b": "feature 10 on 10 GPU(s)"}
        assert V.config_diff(dp.strategy, dp.strategy) == []

    def test_summary_and_why(self, alexnet, dp, ex):
        g, _ = alexnet
        s = V.summary_data(g, ex.timeline, ex.memory, dp.timeline.makespan_s)
        assert s["iteration_time_s"] == ex.timeline.makespan_s
        assert s["throughput_samples_per_s"] == g.batch_size / ex.timeline.makespan_s
        assert s["speedup_vs_data_parallel"] == dp.timeline.makespan_s / ex.timeline.makespan_s > 1
        assert s["tasks"] == ex.tasks.num_tasks and s["comm_bytes"] == ex.timeline.comm_bytes
        assert s["peak_memory_bytes"] == float(ex.memory.peak_bytes.max())
        text = V.why_text(s, {"comm_bytes": dp.timeline.comm_bytes}, ex.timeline)
        assert text.startswith("The critical chain")
        assert f"It is {s['speedup_vs_data_parallel']:.2f}x faster than data parallel" in text
        same = V.summary_data(g, dp.timeline, dp.memory, dp.timeline.makespan_s)
        assert "It is as fast as data parallel." in V.why_text(same, {"comm_bytes": dp.timeline.comm_bytes},
                                                                dp.timeline)
        assert V.summary_data(g, dp.timeline, dp.memory, None)["speedup_vs_data_parallel"] is None


class TestFmt:
    def test_seconds(self):
        assert format_seconds(None) == "–" and format_seconds(float("nan")) == "–"
        assert format_seconds(float("inf")) == "∞"
        assert format_seconds(0.0) == "0 s"
        assert format_seconds(0.05) == "50 ms"
        assert format_seconds(1.5e-9) == "1.5 ns"
        assert format_seconds(250.0) == "4.17 min" and format_seconds(100.0) == "100 s"
        assert format_seconds(7200.0) == "2 h" and format_seconds(1e6) == "278 h"

    def test_others(self):
        assert format_bytes(None) == "–" and format_bytes(2e12) == "2 TB" and format_bytes(999) == "999 B"
        assert format_rate(None) == "–" and format_rate(12.0) == "12 samples/s"
        assert format_rate(2.5e6, "tokens") == "2.5M tokens/s"
        assert format_count(1234567) == "1,234,567"


class TestTimelineRowsAndBubble:
    """Issue 16: rows grouped per pipeline stage / node, a row filter, and the pipeline bubble
    measured against the schedule's formula."""

    @pytest.fixture(scope="class")
    def gpt2_pp(self):
        from app.events import on_event

        s = ST.new_state("gpt2", "dgx-a100-80gb:2")
        s, msg = on_event("layout-apply", s, layout={"kind": "megatron", "tp": 2, "pp": 4, "micro_batch": 1})
        assert msg.startswith("Layout (megatron): tp 2, pp 4, dp 2"), msg
        return SIM.workspace(s)

    def test_stage_rows_one_per_stage_with_their_gpu_counts(self, gpt2_pp):
        ws = gpt2_pp
        stage = G.stage_of_devices(ws.strategy, ws.cluster.num_devices)
        assert sorted(np.unique(stage).tolist()) == [0, 1, 2, 3] and (np.bincount(stage) == 4).all()
        d = G.gantt_data(ws.graph, ws.cluster, ws.timeline, rows="stage", stage_of_device=stage)
        gpu_labels = d["labels"][0::2][:4]
        assert [x.split(" (")[0] for x in gpu_labels] == ["stage 0", "stage 1", "stage 2", "stage 3"]
        assert all("(4 GPUs): GPU" in x for x in gpu_labels) and d["gpus_in_plan"] == 16 and d["gpu_rows"] == 4
        # auto groups by stage past 16 GPU rows only: here the simulated GPUs are few
        auto = G.gantt_data(ws.graph, ws.cluster, ws.timeline, stage_of_device=stage, rows="auto")
        assert auto["rows"] == ("gpu" if auto["gpu_rows"] <= 16 else "stage")
        node = G.gantt_data(ws.graph, ws.cluster, ws.timeline, rows="node", stage_of_device=stage)
        assert [x.split(" (")[0] for x in node["labels"][0::2][:2]] == ["node 0", "node 1"]

    def test_filter_by_stage_gpu_and_text(self, gpt2_pp):
        ws = gpt2_pp
        stage = G.stage_of_devices(ws.strategy, ws.cluster.num_devices)
        kw = dict(rows="stage", stage_of_device=stage)
        one = G.gantt_data(ws.graph, ws.cluster, ws.timeline, row_filter="stage 2", **kw)
        assert one["labels"][0].startswith("stage 2 (") and one["gpu_rows"] == 1
        by_gpu = G.gantt_data(ws.graph, ws.cluster, ws.timeline, row_filter="0", **kw)
        assert by_gpu["gpu_rows"] == 1 and by_gpu["labels"][0].startswith("stage 0 (")
        none = G.gantt_data(ws.graph, ws.cluster, ws.timeline, row_filter="no such row", **kw)
        assert none["gpu_rows"] == 0
        assert G.parse_row_filter("0-7, stage 1-2, Node 3, collectives") == [
            ("gpu", (0, 7)), ("stage", (1, 2)), ("node", (3, 3)), ("text", "collectives")]
        with pytest.raises(ValueError, match="runs backwards"):
            G.parse_row_filter("5-2")

    def test_bubble_measured_near_the_formula_and_drawn(self, gpt2_pp):
        ws = gpt2_pp
        p = ws.strategy.pipeline
        d = G.gantt_data(ws.graph, ws.cluster, ws.timeline, pipeline=(p.stages, p.microbatches, p.virtual_stages))
        b = d["bubble"]
        assert b["formula"] == pytest.approx((p.stages - 1) / (p.microbatches + p.stages - 1))
        # the measured idle share holds the bubble and any wait for a transfer or a collective
        assert b["formula"] - 0.05 <= b["measured"] <= b["formula"] + 0.3, b
        assert len(b["start"]) > 0 and (np.asarray(b["end"]) > np.asarray(b["start"])).all()
        fig = GF.build_gantt_figure(d)
        assert "pipeline bubble (idle)" in [tr["name"] for tr in fig["data"]]
        assert "idle before the last backward (hatched grey)" in GF.gantt_notes(d)
        go.Figure(fig)  # valid Plotly
        # no pipeline: no bubble
        assert G.gantt_data(ws.graph, ws.cluster, ws.timeline)["bubble"] is None


class TestBlockStack:
    """Issue 16: a layered model's op graph as a stack of blocks with per-block configs,
    expandable (774 LLaMA ops were one row of identical dots)."""

    @pytest.fixture(scope="class")
    def llama_pp(self):

        s = ST.new_state("llama2-7b", "dgx-a100-80gb:8")
        s, msg = ACT.apply_layout(s, "megatron", {"tp": 8, "pp": 2, "micro_batch": 1})
        assert msg.startswith("Layout (megatron): tp 8, pp 2"), msg
        return SRC.graph_of(s), ST.page_strategy(s)

    def test_rows_merge_blocks_split_alike_per_stage(self, llama_pp):
        g, s = llama_pp
        b = V.block_stack(g, s)
        assert b["rows"] == ["embedding", "layers.0", "layers.16", "head"] and b["expanded"] is None
        assert b["blocks"] == {"embedding": 1, "layers.0": 16, "layers.16": 16, "head": 1}
        lab = b["labels"]["layers.16"]
        assert lab.startswith("layers.16–31 (16 blocks, same split) · 24 ops each · ") and lab.endswith(
            " · 32 GPUs · stage 1"), lab
        # every op is in exactly one row; rows top to bottom at a fixed pitch
        assert sorted(m for r in b["rows"] for m in b["members"][r]) == sorted(op.name for op in g.ops)
        assert [b["y"][b["nodes"].index(r)] for r in b["rows"]] == [0.0, -1.0, -2.0, -3.0]
        assert set(b["edges"]) == {("embedding", "layers.0"), ("layers.0", "layers.16"), ("layers.16", "head")}

    def test_data_parallel_is_one_row_of_layers(self):
        g = resolve_model("gpt2")
        from engine.search.baselines import data_parallel

        b = V.block_stack(g, data_parallel(g, preset("dgx-a100-80gb:1")))
        assert b["rows"] == ["embedding", "layers.0", "head"] and b["blocks"]["layers.0"] == 12

    def test_selecting_a_row_expands_its_first_block(self, llama_pp):
        g, s = llama_pp
        rows = V.block_stack(g, s)
        b = V.block_stack(g, s, rows["members"]["layers.16"])
        assert b["expanded"] == "layers.16"
        first = [op.name for op in g.ops if op.block == "layers.16"]
        ops = [n for n in b["nodes"] if n not in b["rows"]]
        assert sorted(ops) == sorted(first)
        y = dict(zip(b["nodes"], b["y"]))
        assert all(y["head"] < y[o] < y["layers.16"] for o in ops)  # below its row, above the next
        # one layer of the block's DAG, one text: q, k and v side by side
        assert "attn.q · attn.k · attn.v" in b["op_text"].values()
        # one op of that block selected: still expanded; a selection across rows: none
        assert V.block_stack(g, s, [first[3]])["expanded"] == "layers.16"
        assert V.block_stack(g, s, ["embedding.tok", first[3]] if "embedding.tok" in g.index else
                             [g.ops[0].name, first[3]])["expanded"] is None
        fig = go.Figure(F.build_block_stack_figure(b, {}, {}, {}, {first[3]}))
        texts = [t for tr in fig.data if tr.text is not None for t in tr.text]
        assert any(t.startswith("▾ layers.16–31") for t in texts) and any(t.startswith("▸ head") for t in texts)
        assert fig.layout.height >= F.STACK_ROW_PX * (1 - min(b["y"]))  # rows never closer than the pitch


class TestWhyAdvice:
    """Issue 16: the why-text's advice follows what dominates the critical chain (it advised
    less gradient sync to strategies that had none) and says what to do when over memory."""

    def test_data_parallel_alexnet_is_gradient_sync(self, alexnet, dp):
        g, _ = alexnet
        s = V.summary_data(g, dp.timeline, dp.memory, None)
        text = V.why_text(s, None, dp.timeline, dp.memory)
        tg, crit = dp.timeline.tasks, dp.timeline.critical_tasks
        sync = tg.dur_s[crit][(tg.kind[crit] == COLL) & (tg.mb[crit] < 0)].sum() / tg.dur_s[crit].sum()
        assert sync > 0.3 and f"mostly gradient synchronisation ({sync:.0%} of the chain)" in text, text
        assert "does not fit" not in text

    def test_advice_names_the_largest_share(self, alexnet, ex):
        g, _ = alexnet
        text = V.why_text(V.summary_data(g, ex.timeline, ex.memory, None), None, ex.timeline)
        tg, crit = ex.timeline.tasks, ex.timeline.critical_tasks
        d, k, mb = tg.dur_s[crit], tg.kind[crit], tg.mb[crit]
        shares = {"gradient synchronisation": d[(k == COLL) & (mb < 0)].sum(),
                  "collectives inside the layers": d[(k == COLL) & (mb >= 0)].sum(),  # (AlexNet: no experts)
                  "transfers between ops": d[k == XFER].sum()}
        if sum(shares.values()) / d.sum() > 0.3:
            assert f"mostly {max(shares, key=shares.get)}" in text, text
        else:
            assert "Communication dominates" not in text

    def test_expert_all_to_alls_are_told_apart(self):
        """Issue 44: the advice for "collectives inside the layers" said to lower tp and ZeRO to a
        plan at tp 1 / ZeRO-1 whose inner collectives were the experts' all-to-alls."""
        from engine.sim.report import simulate_strategy
        from engine.taskgraph import COLL_INDEX

        g, c = resolve_model("mixtral-8x7b", batch=16, seq_len=1024), preset("dgx-h100:2")
        r = simulate_strategy(g, build_layout(g, c, Layout(ep=8, micro_batch=1, zero_stage=1)), c)
        text = V.why_text(V.summary_data(g, r.timeline, r.memory, None), None, r.timeline)
        tg, crit = r.timeline.tasks, r.timeline.critical_tasks
        d, k, mb = tg.dur_s[crit], tg.kind[crit], tg.mb[crit]
        a2a = tg.coll[crit] == COLL_INDEX["all_to_all"]
        assert a2a.any()  # the experts' all-to-alls are on the chain
        shares = {"gradient synchronisation": d[(k == COLL) & (mb < 0)].sum(),
                  "collectives inside the layers": d[(k == COLL) & (mb >= 0) & ~a2a].sum(),
                  "the experts' all-to-alls": d[(k == COLL) & (mb >= 0) & a2a].sum(),
                  "transfers between ops": d[k == XFER].sum()}
        assert sum(shares.values()) / d.sum() > 0.3 and f"mostly {max(shares, key=shares.get)}" in text, text

    def test_over_memory_says_what_lowers_the_peak(self):

        s = ST.new_state("llama2-7b", "dgx-a100-80gb:8")  # data parallel: 1.59 TB per GPU
        ws = SIM.workspace(s)
        assert not ws.memory.feasible
        text = V.why_text(V.summary_data(ws.graph, ws.timeline, ws.memory, None), None, ws.timeline, ws.memory)
        assert "It does not fit in memory (64 GPUs over capacity, GPU 0 by " in text
        assert "recomputation, a higher ZeRO stage" in text and "Smallest cluster for this layout" in text


def test_memory_groups_past_the_cap_stay_in_device_order():
    """Review: the fullest groups kept past max_groups came out in byte order (GPU 4, 3, 2 ...)."""

    g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
    s = build_layout(g, c, Layout(pp=4, micro_batch=1))
    rep = memory_report(g, s, c, simulate(build_task_graph(g, s, c)))
    d = V.memory_data(rep, list(range(8)), max_groups=3)
    assert d["devices"] == sorted(d["devices"]) and d["hidden"] == 1 and len(d["devices"]) == 3


def test_time_ticks_past_sixteen_hours_and_not_finite():
    assert GF.time_ticks(0.0, 72_000.0)["ticktext"][1] == "5 h"
    assert GF.time_ticks(0.0, float("inf")) == {}


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 40), st.integers(1, 4))
def test_merge_bar_count_read_from_the_gaps(seed, n, rows):
    """Tasks sorted by row, then start (as :func:`engine.sim.lanes.lanes` gives them: its own
    test checks that order): the merge's bar count read from :func:`app.gantt.gap_before`
    equals the merge's own, at every gap."""
    rng = np.random.default_rng(seed)
    row = rng.integers(0, rows, n)
    start = rng.integers(0, 4, n).astype(float)
    t = np.lexsort((start, row))
    r = row[t]
    end = start + 0.5
    gap = G.gap_before(r, start[t], end[t])
    for eps in (-1.0, 0.0, 0.6, 1.6):
        first = G.merge_bars(r, start[t], end[t], eps)[0]
        assert first.size == (n if eps < 0 else int(np.count_nonzero(gap > eps)))


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 60), st.integers(1, 40_000), st.booleans())
def test_overlay_order_isby_row_then_start(seed, n, rows, in_time_order):
    """The overlays' order (:func:`app.gantt.by_row_then_start`: a stable sort of the rows where
    the tasks come in time order, as a critical chain does) is ``np.lexsort((start, row))``'s,
    ties in row and start kept in their given order, whatever the rows' range."""
    rng = np.random.default_rng(seed)
    row = rng.integers(0, rows, n)
    start = rng.integers(0, 5, n).astype(float)
    if in_time_order:
        start = np.sort(start)
    assert np.array_equal(G.by_row_then_start(row, start), np.lexsort((start, row)))
