"""Cooperative cancellation (issue 24 part 4): a ``cancel`` (a ``threading.Event`` or a
callable) threaded through the builder, the event loop, the memory report, the delta
simulator and the entry point. These tests pin behaviour, not speed (how soon a cancel
stops a 9 M-task build: benchmarks/bench_cancel.py): a set cancel raises before any work; a
cancel set from another thread mid-way ends the work with ``Cancelled``; a cancel never set
changes nothing, array for array."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import engine.sim.full as sim_mod
import engine.taskgraph.builder as builder_mod
from engine.cluster import preset
from engine.sim.delta import DeltaSimulator
from engine.errors import Cancelled, check_cancel
from engine.formats import resolve_model
from engine.sim.memory import memory_report
from engine.sim.report import simulate_strategy
from engine.search.baselines import data_parallel, expert
from engine.sim.full import run_schedule, simulate
from engine.taskgraph import build_task_graph
from engine.layout import Layout, build_layout

TASK_ARRAYS = ("kind", "op", "part", "mb", "device", "dur_s", "size_bytes", "flops", "coll", "link", "res_ptr",
               "res_idx", "succ_ptr", "succ_idx", "npred", "chain_next", "chain_lag_s")


@pytest.fixture(scope="module")
def alexnet():
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    return g, expert(g, c), c


@pytest.fixture(scope="module")
def gpt2_pipeline():
    g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
    return g, build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1)), c


class MidwayCancel:
    """A cancel that another thread sets while the work is under way, deterministically: on
    its ``after``-th check the worker signals ``reached`` and waits until the main thread has
    set the event (so the set falls between two checks of the running work)."""

    def __init__(self, after: int) -> None:
        self.after, self.calls = after, 0
        self.event, self.reached = threading.Event(), threading.Event()

    def is_set(self) -> bool:
        self.calls += 1
        if self.calls == self.after:
            self.reached.set()
            assert self.event.wait(30), "the main thread never set the cancel"
        return self.event.is_set()


def run_in_thread(work, cancel: MidwayCancel) -> list:
    """Run ``work(cancel)`` in a thread, set the cancel from this thread when the work asks
    for the ``after``-th time; the outcome ('finished' or the exception)."""
    out: list = []

    def run() -> None:
        try:
            work(cancel)
            out.append("finished")
        except BaseException as e:  # noqa: BLE001 (reported to the test)
            out.append(e)

    th = threading.Thread(target=run)
    th.start()
    assert cancel.reached.wait(60), "the work ended before its cancel was asked that often"
    cancel.event.set()
    th.join(60)
    assert not th.is_alive()
    return out


def same_tasks(a, b) -> None:
    for name in TASK_ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


# --------------------------------------------------------------------------- check_cancel


class TestCheckCancel:
    def test_none_event_and_callable(self):
        check_cancel(None)
        check_cancel(threading.Event())
        check_cancel(lambda: False)
        ev = threading.Event()
        ev.set()
        with pytest.raises(Cancelled):
            check_cancel(ev)
        with pytest.raises(Cancelled):
            check_cancel(lambda: True)

    def test_cancelled_is_a_soapbox_error_not_a_value_error(self):
        # (callers catch ValueError for layouts that cannot be built: a cancel must pass through them)
        from engine.errors import SoapboxError
        assert issubclass(Cancelled, SoapboxError) and not issubclass(Cancelled, ValueError)


# --------------------------------------------------------------------------- already set: before any work


class TestAlreadySet:
    def test_build_raises_before_any_work(self, alexnet, monkeypatch):
        g, s, c = alexnet

        def no_work(*a, **k):
            raise AssertionError("work started although the cancel was set")

        monkeypatch.setattr(builder_mod, "find_symmetry", no_work)
        monkeypatch.setattr(builder_mod, "TaskGraphBuilder", no_work)
        with pytest.raises(Cancelled):
            build_task_graph(g, s, c, cancel=lambda: True)

    def test_entry_point_raises_before_checking_or_building(self, alexnet, monkeypatch):
        import engine.sim.report as report_mod
        g, s, c = alexnet

        def no_work(*a, **k):
            raise AssertionError("work started although the cancel was set")

        for name in ("check_strategy", "build_task_graph", "tasks_within", "simulate", "memory_report"):
            monkeypatch.setattr(report_mod, name, no_work)
        ev = threading.Event()
        ev.set()
        with pytest.raises(Cancelled):
            simulate_strategy(g, s, c, max_tasks=10, cancel=ev)

    def test_simulate_memory_and_delta_raise(self, alexnet):
        g, s, c = alexnet
        tg = build_task_graph(g, s, c)
        tl = simulate(tg)
        for policy in ("fifo", "static"):
            with pytest.raises(Cancelled):
                simulate(tg, policy, cancel=lambda: True)
        with pytest.raises(Cancelled):
            memory_report(g, s, c, tl, cancel=lambda: True)
        with pytest.raises(Cancelled):
            DeltaSimulator(g, s, c, cancel=lambda: True)


# --------------------------------------------------------------------------- set from another thread


class TestSetMidway:
    def test_build_ends_with_cancelled(self, gpt2_pipeline):
        g, s, c = gpt2_pipeline
        cancel = MidwayCancel(after=50)  # (gpt2 has 310 ops: the 50th check is in the ops' segments)
        out = run_in_thread(lambda ev: build_task_graph(g, s, c, symmetry="off", cancel=ev), cancel)
        assert isinstance(out[0], Cancelled), out
        assert cancel.calls == 50  # stopped at the check during which it was set: no further work

    def test_event_loop_ends_with_cancelled(self, gpt2_pipeline, monkeypatch):
        g, s, c = gpt2_pipeline
        tg = build_task_graph(g, s, c, symmetry="off")
        monkeypatch.setattr(sim_mod, "CANCEL_CHECK_EVENTS", 64)  # many chunks in a small graph
        assert tg.num_tasks > 64 * 10
        cancel = MidwayCancel(after=5)
        out = run_in_thread(lambda ev: simulate(tg, cancel=ev), cancel)
        assert isinstance(out[0], Cancelled), out
        assert cancel.calls == 5

    def test_entry_point_ends_with_cancelled_in_each_phase(self, gpt2_pipeline, monkeypatch):
        g, s, c = gpt2_pipeline
        monkeypatch.setattr(sim_mod, "CANCEL_CHECK_EVENTS", 64)
        counter = MidwayCancel(after=10 ** 9)  # never reached: counts the checks of a whole run
        simulate_strategy(g, s, c, symmetry="off", cancel=counter)
        total = counter.calls
        assert total > 50
        for after in (1, total // 3, total // 2, total - 1, total):  # build, event loop, memory report
            cancel = MidwayCancel(after=after)
            out = run_in_thread(lambda ev: simulate_strategy(g, s, c, symmetry="off", cancel=ev), cancel)
            assert isinstance(out[0], Cancelled), (after, out)

    def test_delta_simulator_builds_edits_without_asking_again(self, alexnet):
        g, s, c = alexnet
        ev = threading.Event()
        sim = DeltaSimulator(g, s, c, cancel=ev)
        ev.set()  # (a background build superseded after it finished: its edits go on)
        op = g.ops[-3].name
        sim.change(op, s.configs[op])
        assert sim.timeline.makespan_s > 0


# --------------------------------------------------------------------------- never set: nothing changes


class TestNeverSet:
    @pytest.mark.parametrize("case", ["alexnet", "gpt2_pipeline"])
    @pytest.mark.parametrize("symmetry", ["auto", "off"])
    def test_identical_task_graph_and_timeline(self, case, symmetry, request, monkeypatch):
        g, s, c = request.getfixturevalue(case)
        ev = threading.Event()
        a = build_task_graph(g, s, c, symmetry=symmetry)
        b = build_task_graph(g, s, c, symmetry=symmetry, cancel=ev)
        same_tasks(a, b)
        monkeypatch.setattr(sim_mod, "CANCEL_CHECK_EVENTS", 7)  # the loop resumed thousands of times
        for policy in ("fifo", "static"):
            x, y = run_schedule(a, policy), run_schedule(a, policy, cancel=ev)
            for u, v in zip(x, y):
                np.testing.assert_array_equal(u, v)

    def test_identical_entry_point_result(self, gpt2_pipeline, monkeypatch):
        g, s, c = gpt2_pipeline
        monkeypatch.setattr(sim_mod, "CANCEL_CHECK_EVENTS", 100)
        a = simulate_strategy(g, s, c)
        b = simulate_strategy(g, s, c, cancel=threading.Event())
        assert a.iteration_time_s == b.iteration_time_s
        same_tasks(a.tasks, b.tasks)
        np.testing.assert_array_equal(a.timeline.start_s, b.timeline.start_s)
        np.testing.assert_array_equal(a.memory.peak_bytes, b.memory.peak_bytes)

    def test_delta_simulator_identical(self, alexnet):
        g, s, c = alexnet
        a, b = DeltaSimulator(g, s, c), DeltaSimulator(g, s, c, cancel=threading.Event())
        same_tasks(a.tasks, b.tasks)
        np.testing.assert_array_equal(a.timeline.end_s, b.timeline.end_s)

    def test_smallest_fit_stop_ends_a_running_simulation(self, monkeypatch):
        """The scan's ``stop`` is its simulations' cancel: asked during a build, a stopped
        scan returns the rows so far (none here) instead of finishing the cluster."""
        from engine.studies.sweep import smallest_fit
        g = resolve_model("gpt2")
        calls = [0]

        def stop() -> bool:
            calls[0] += 1
            return calls[0] > 3  # (false before the first cluster: the scan starts)

        rows = smallest_fit(g, "data-parallel", {}, [preset("dgx-a100-80gb:1")], stop=stop)
        assert rows == [] and calls[0] == 4
