"""Chrome trace export (engine.sim.trace): the file is valid Trace Event Format JSON,
every event is well formed, tracks and flows line up with the task graph, memory counters
follow the memory report, and all times are microseconds."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pytest

from engine.cluster import preset
from engine.formats import resolve_model
from engine.sim.trace import COLLECTIVE_TID, COMPUTE_TID, LINKS_PID, trace_events, write_chrome_trace
from engine.sim.report import simulate_strategy
from engine.search.baselines import data_parallel, expert
from engine.taskgraph import BWD, COLL, FWD, UPDATE, XFER

#: Rounding of the exporter: times to 1e-3 us, counters to 1e-6 GB.
TS_ATOL_US = 2e-3
GB_ATOL = 1e-6


@pytest.fixture(scope="module")
def result():
    """AlexNet under FlexFlow's expert strategy on 4 nodes x 4 P100: data-parallel convs,
    model-parallel FC layers, so there are transfers over NVLink and the NICs as well as
    collectives."""
    g = resolve_model("alexnet")
    c = preset("p100-4x4")
    return simulate_strategy(g, expert(g, c), c)


@pytest.fixture(scope="module")
def trace(result, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "alexnet.json"
    n = write_chrome_trace(path, result.graph, result.cluster, result.timeline, result.memory)
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return n, data


@pytest.fixture(scope="module")
def events(trace):
    return trace[1]["traceEvents"]


def by_phase(events, ph):
    return [e for e in events if e["ph"] == ph]


# --------------------------------------------------------------------------- file


class TestFile:
    def test_valid_json_object_with_trace_events(self, trace):
        n, data = trace
        assert isinstance(data, dict)
        assert isinstance(data["traceEvents"], list)
        assert len(data["traceEvents"]) == n > 0

    def test_no_temporary_file_left(self, result, tmp_path):
        path = tmp_path / "t.json"
        write_chrome_trace(path, result.graph, result.cluster, result.timeline, result.memory)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]

    def test_streamed_events_equal_the_file(self, result, events):
        streamed = list(trace_events(result.graph, result.cluster, result.timeline, result.memory))
        assert json.loads(json.dumps(streamed)) == events

    def test_without_memory_there_are_no_counters(self, result, tmp_path):
        path = tmp_path / "t.json"
        write_chrome_trace(path, result.graph, result.cluster, result.timeline)
        with open(path, encoding="utf-8") as f:
            evs = json.load(f)["traceEvents"]
        assert not by_phase(evs, "C")
        assert by_phase(evs, "X")


# --------------------------------------------------------------------------- complete events


class TestCompleteEvents:
    def test_every_x_event_is_well_formed(self, events):
        xs = by_phase(events, "X")
        assert xs
        for e in xs:
            for key in ("name", "ph", "ts", "dur", "pid", "tid"):
                assert key in e, (key, e)
            assert isinstance(e["name"], str) and e["name"]
            assert e["dur"] >= 0 and e["ts"] >= 0

    def test_compute_events_match_the_compute_tasks(self, result, events):
        tg = result.tasks
        D = result.cluster.num_devices
        compute = [e for e in by_phase(events, "X") if e["pid"] < D and e["tid"] == COMPUTE_TID]
        n_fwd_bwd = int(np.count_nonzero((tg.kind == FWD) | (tg.kind == BWD)))
        n_update = int(np.count_nonzero(tg.kind == UPDATE))
        assert len(compute) == n_fwd_bwd + n_update
        assert sum(e["name"] == "optimizer step" for e in compute) == n_update
        assert sum(e.get("cat") == "fwd" for e in compute) == int(np.count_nonzero(tg.kind == FWD))
        # per device, too
        want = Counter(tg.device[(tg.kind == FWD) | (tg.kind == BWD) | (tg.kind == UPDATE)].tolist())
        assert Counter(e["pid"] for e in compute) == want

    def test_collective_events_one_per_rank(self, result, events):
        tg = result.tasks
        ptr, _, tasks = tg.info["coll_devices"]
        coll = [e for e in by_phase(events, "X") if e.get("cat") == "collective"]
        assert np.count_nonzero(tg.kind == COLL) == tasks.size > 0
        assert len(coll) == int(ptr[-1])
        assert all(e["tid"] == COLLECTIVE_TID and e["pid"] < result.cluster.num_devices for e in coll)

    def test_transfer_events_one_per_hop_on_the_links_process(self, result, events):
        tg = result.tasks
        hops = [e for e in by_phase(events, "X") if e["pid"] == LINKS_PID]
        assert len(hops) == int(np.count_nonzero(tg.kind == XFER)) > 0
        assert Counter(e["tid"] for e in hops) == Counter(tg.link[tg.kind == XFER].tolist())

    def test_times_are_microseconds(self, result, events):
        xs = by_phase(events, "X")
        last = max(e["ts"] + e["dur"] for e in xs)
        assert last == pytest.approx(result.timeline.makespan_s * 1e6, abs=TS_ATOL_US)
        assert min(e["ts"] for e in xs) == pytest.approx(0.0, abs=TS_ATOL_US)

    def test_an_event_has_its_task_duration(self, result, events):
        tg, tl = result.tasks, result.timeline
        t = int(np.argmax(np.where(tg.kind == FWD, tg.dur_s, -1)))  # longest forward task
        name = f"{result.graph.ops[tg.op[t]].name} fwd"
        hit = [e for e in by_phase(events, "X") if e["name"] == name and e["pid"] == tg.device[t]
               and e["args"]["partition"] == tg.part[t] and e["args"]["microbatch"] == tg.mb[t]]
        assert len(hit) == 1
        assert hit[0]["ts"] == pytest.approx(tl.start_s[t] * 1e6, abs=TS_ATOL_US)
        assert hit[0]["dur"] == pytest.approx(tg.dur_s[t] * 1e6, abs=TS_ATOL_US)


# --------------------------------------------------------------------------- metadata


class TestMetadata:
    def test_one_process_name_per_device_plus_links(self, result, events):
        names = [e for e in by_phase(events, "M") if e["name"] == "process_name"]
        pids = [e["pid"] for e in names]
        D = result.cluster.num_devices
        assert len(pids) == D + 1
        assert sorted(pids) == list(range(D)) + [LINKS_PID]
        assert all(e["args"]["name"] for e in names)

    def test_every_used_thread_has_a_name(self, events):
        named = {(e["pid"], e["tid"]) for e in by_phase(events, "M") if e["name"] == "thread_name"}
        used = {(e["pid"], e["tid"]) for e in events if e["ph"] in ("X", "s", "f")}
        assert used
        assert used <= named

    def test_link_tracks_are_named_after_their_link(self, result, events):
        names = {e["tid"]: e["args"]["name"] for e in by_phase(events, "M")
                 if e["name"] == "thread_name" and e["pid"] == LINKS_PID}
        assert names
        for tid, text in names.items():
            link = result.cluster.links[tid]
            assert text.startswith(f"{link.src} -> {link.dst}")


# --------------------------------------------------------------------------- flows


class TestFlows:
    def test_flows_come_in_pairs_with_matching_ids(self, events):
        starts = Counter(e["id"] for e in by_phase(events, "s"))
        ends = Counter(e["id"] for e in by_phase(events, "f"))
        assert starts
        assert starts == ends
        assert set(starts.values()) == {1}

    def test_a_flow_never_ends_before_it_starts(self, events):
        start = {e["id"]: e["ts"] for e in by_phase(events, "s")}
        for e in by_phase(events, "f"):
            assert start[e["id"]] <= e["ts"], e

    def test_flows_start_on_a_device_compute_track(self, result, events):
        D = result.cluster.num_devices
        assert all(e["pid"] < D and e["tid"] == COMPUTE_TID for e in by_phase(events, "s"))
        assert all(e.get("bp") == "e" for e in by_phase(events, "f"))


# --------------------------------------------------------------------------- memory counters


class TestMemoryCounters:
    def test_one_counter_track_per_device(self, result, events):
        pids = {e["pid"] for e in by_phase(events, "C")}
        assert pids == set(range(result.cluster.num_devices))
        assert all(e["name"] == "memory" and "GB" in e["args"] for e in by_phase(events, "C"))

    def test_timestamps_are_monotone(self, result, events):
        for d in range(result.cluster.num_devices):
            ts = [e["ts"] for e in by_phase(events, "C") if e["pid"] == d]
            assert ts[0] == 0.0
            assert all(a <= b for a, b in itertools.pairwise(ts)), d

    def test_values_never_below_static_memory(self, result, events):
        static_gb = result.memory.static_bytes / 1e9
        for e in by_phase(events, "C"):
            assert e["args"]["GB"] >= static_gb[e["pid"]] - GB_ATOL, e

    def test_peak_counter_is_the_reported_peak(self, result, events):
        peak_gb = result.memory.peak_bytes / 1e9
        for d in range(result.cluster.num_devices):
            top = max(e["args"]["GB"] for e in by_phase(events, "C") if e["pid"] == d)
            assert top == pytest.approx(peak_gb[d], abs=GB_ATOL)

    def test_counters_end_within_the_iteration(self, result, events):
        end_us = result.timeline.makespan_s * 1e6
        assert max(e["ts"] for e in by_phase(events, "C")) <= end_us + TS_ATOL_US


# --------------------------------------------------------------------------- degenerate


def test_data_parallel_has_no_transfers_or_flows(tmp_path):
    """Pure data parallelism moves no activations: no transfer events and no flows, only
    gradient collectives; the links process is still declared."""
    g = resolve_model("alexnet")
    c = preset("p100-4x4")
    s = data_parallel(g, c)
    r = simulate_strategy(g, s, c)
    path = tmp_path / "t.json"
    write_chrome_trace(path, g, c, r.timeline, r.memory)
    with open(path, encoding="utf-8") as f:
        evs = json.load(f)["traceEvents"]
    assert not any(e["ph"] == "X" and e["pid"] == LINKS_PID for e in evs)
    assert not by_phase(evs, "s") and not by_phase(evs, "f")
    assert any(e["ph"] == "M" and e["name"] == "process_name" and e["pid"] == LINKS_PID for e in evs)
    assert sum(e.get("cat") == "collective" for e in evs) > 0
