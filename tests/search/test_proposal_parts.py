"""The parts of a proposal made faster for issue 28 (Inception-v3 / 16 GPUs at >= 200 proposals/s):
the memory check's per-op reuse, the assembly's per-segment totals and the segment columns' fill.
Each is pinned against the computation it replaces or a fresh one that has nothing kept."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.cluster import preset
from engine.sim.delta import DeltaSimulator
from engine.formats import resolve_model
from engine.sim.memory import fits_in_memory, memory_report, saved_activation_bytes
from engine.sim.memory_static import graph_cache, static_memory
from engine.search.baselines import data_parallel
from engine.search.chains import random_config
from engine.strategy import Config
from engine.taskgraph.assembly import Live
from engine.taskgraph.segments import Segment, _fill
from engine.layout import Layout, build_layout

STATIC_PARTS = ("weights", "grads", "optim", "comm", "gathered", "logits", "context", "host", "nvme")


# --------------------------------------------------------------------------- segment columns


class TestFill:
    def test_scalars_and_arrays_by_hand(self):
        ns = np.array([2, 3, 1])
        out = _fill([7, np.array([1, 2, 3]), -1], ns, np.cumsum(ns).tolist(), np.int32)
        assert out.dtype == np.int32 and out.tolist() == [7, 7, 1, 2, 3, -1]

    def test_scalars_only_and_empty(self):
        ns = np.array([1, 0, 2])
        assert _fill([0.5, 9.0, 1.5], ns, [1, 1, 3], np.float64).tolist() == [0.5, 1.5, 1.5]
        assert _fill([], np.zeros(0, np.int64), [], np.int8).size == 0

    def test_a_segment_freezes_its_adds_in_order(self):
        sg = Segment(3)
        a = sg.add(2, 1, op=4, dur=np.array([1.0, 2.0]))
        b = sg.add(1, 2, op=5, device=np.array([6]), res=6)
        assert (a >> 32).tolist() == [3, 3] and (a & 0xFFFFFFFF).tolist() == [0, 1] and (b & 0xFFFFFFFF)[0] == 2
        cols = sg.freeze()["cols"]
        assert cols["kind"].tolist() == [1, 1, 2] and cols["op"].tolist() == [4, 4, 5]
        assert cols["dur"].tolist() == [1.0, 2.0, 0.0] and cols["device"].tolist() == [-1, -1, 6]
        assert cols["res"].tolist() == [-1, -1, 6]

    def test_frozen_together_equals_one_by_one(self):
        rng = np.random.default_rng(0)

        def make(slot: int) -> Segment:
            sg = Segment(slot)
            for _ in range(int(rng.integers(0, 5))):
                n = int(rng.integers(0, 4))
                sg.add(n, int(rng.integers(0, 3)), op=rng.integers(0, 9, n), dur=float(rng.random()),
                       size=rng.random(n), res=int(rng.integers(-1, 4)))
            return sg

        rng_state = rng.bit_generator.state
        alone = [make(s) for s in range(6)]
        rng.bit_generator.state = rng_state
        together = [make(s) for s in range(6)]
        whole = Segment.freeze_all(together)
        for key in Segment._DTYPES:
            expect = np.concatenate([sg.freeze()["cols"][key] for sg in alone])
            assert whole["arrays"][key].dtype == expect.dtype and np.array_equal(whole["arrays"][key], expect), key
            assert all(np.array_equal(t.freeze()["cols"][key], a.freeze()["cols"][key]) for t, a in
                       zip(together, alone))


# --------------------------------------------------------------------------- per-segment totals


class _Seg:
    def __init__(self, params):
        self.device_params = params


def _sequential(segs, D):
    out = np.zeros(D)
    for sg in segs:
        if sg.device_params is not None:
            out += sg.device_params
    return out


def test_live_params_add_in_slot_order_bit_for_bit_through_replacements():
    """``Live.params`` (np.add.accumulate) equals adding each segment's parameters one after
    another, as the assembly did, also after segments gain, change and lose parameters."""
    rng = np.random.default_rng(1)
    D = 5
    segs = [_Seg(rng.random(D) * 10 ** rng.integers(0, 12, D) if rng.random() < 0.4 else None) for _ in range(60)]
    live = Live(segs, np.arange(60), np.arange(60), np.zeros(60), np.zeros(60, np.int64), D)
    assert np.array_equal(live.params(), _sequential(segs, D))
    for _ in range(40):
        i = int(rng.integers(0, 60))
        old, before = live, live.params()
        live = Live(list(live.segs), live.serials, live.slots, live.comm_bytes, live.cross_replica, D,
                    live.param_pos, live.param_rows)
        sg = live.segs[i] = _Seg(rng.random(D) * 1e7 if rng.random() < 0.6 else None)
        live.set_params(i, sg.device_params)
        assert np.array_equal(live.param_pos, [k for k, s in enumerate(live.segs) if s.device_params is not None])
        assert np.array_equal(live.params(), _sequential(live.segs, D))
        assert np.array_equal(old.params(), before)  # (the record it came from is never modified)
    empty = Live([_Seg(None)], np.arange(1), np.arange(1), np.zeros(1), np.zeros(1, np.int64), D)
    assert empty.params().tolist() == [0.0] * D


# --------------------------------------------------------------------------- the memory check


def _moves(sim: DeltaSimulator, rng: random.Random, steps: int):
    """``steps`` proposals as MCMC makes them: a change, then a commit or (mostly) a revert."""
    names = [op.name for op in sim.graph.ops if op.kind != "input"]
    for _ in range(steps):
        while True:
            name = rng.choice(names)
            config = random_config(sim.graph[name], sim.cluster.num_devices, rng)
            if config != sim.strategy[name] and not sim.check(name, config):
                break
        sim.change(name, config)
        yield
        sim.commit() if rng.random() < 0.3 else sim.revert()
        yield


CASES = {
    "inception-v3 on 16 GPUs": lambda: (resolve_model("inception_v3"), preset("p100-4x4"), data_parallel),
    "gpt2, sequence parallel, selective-op": lambda: (
        resolve_model("gpt2", batch=8, seq_len=128), preset("dgx-a100-80gb:1"),
        lambda g, c: build_layout(g, c, Layout(tp=2, sequence_parallel=True, recompute="selective-op"))),
    "gpt2, ZeRO-3, fp8": lambda: (
        resolve_model("gpt2", batch=8, seq_len=128), preset("dgx-h100:1"),
        lambda g, c: build_layout(g, c, Layout(tp=2, zero_stage=3, fp8=True))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_memory_check_with_kept_parts_equals_a_fresh_one(case):
    """Through changes, reverts and commits of one simulator (an MCMC chain), the memory check's
    parts (static memory, saved activations, the fit) equal the same computations on a fresh
    copy of the graph, which has nothing kept, bit for bit."""
    g, c, make = CASES[case]()
    sim = DeltaSimulator(g, make(g, c), c)
    rng = random.Random(5)
    seen = 0
    for _ in _moves(sim, rng, 8):
        fresh = CASES[case]()[0]  # (the same model again: a new graph object, nothing cached for it)
        s, tl = sim.strategy, sim.timeline
        got, want = static_memory(g, s, c, sim.tasks), static_memory(fresh, s, c, sim.tasks)
        for part in STATIC_PARTS:
            assert np.array_equal(getattr(got, part), getattr(want, part)), part
        assert np.array_equal(saved_activation_bytes(g, s), saved_activation_bytes(fresh, s))
        assert fits_in_memory(g, s, c, tl) == memory_report(fresh, s, c, tl).feasible
        seen += 1
    assert seen == 16 and graph_cache(g).get("static_last") is not None


def test_saved_bytes_follow_a_config_change():
    """The per-op entries are kept per config object: changing one op's config changes its
    saved bytes and nothing else's; the old strategy gives the old bytes again."""
    g, c = resolve_model("inception_v3"), preset("p100-4x4")
    s = data_parallel(g, c)
    before = saved_activation_bytes(g, s)
    i, op = next((i, o) for i, o in enumerate(g.ops) if o.kind == "conv2d" and before[i] > 0)
    t = s.with_config(op.name, Config({}, (0,)))  # the whole op on device 0: 16x a partition's batch
    after = saved_activation_bytes(g, t)
    assert after[i] == pytest.approx(16 * before[i])
    assert np.array_equal(np.delete(after, i), np.delete(before, i))
    assert np.array_equal(saved_activation_bytes(g, s), before)


# --------------------------------------------------------------------------- MCMC's judgement


def test_judge_takes_the_moves_the_old_rule_took_where_everything_fits():
    """Time first, memory only for a move the time would take (:func:`judge`): where every
    strategy fits, the same decisions and the same random draws as pricing every proposal
    (``_cost``) then :func:`metropolis`."""
    from engine.search.chains import Chain, _cost, judge, metropolis

    g, c = resolve_model("inception_v3"), preset("p100-4x4")
    sim = DeltaSimulator(g, data_parallel(g, c), c)
    start = sim.timeline.makespan_s
    old = Chain("old", sim.strategy, None, random.Random(9), 100.0 / start, start)
    new = Chain("new", sim.strategy, None, random.Random(9), 100.0 / start, start)
    rng, decided = random.Random(2), []
    names = [op.name for op in g.ops if op.kind != "input"]
    while len(decided) < 40:
        name = rng.choice(names)
        config = random_config(g[name], c.num_devices, rng)
        if config == sim.strategy[name] or sim.check(name, config):
            continue
        sim.change(name, config)
        cost = _cost(sim, g, c, True)
        assert cost < float("inf")
        a = metropolis(old, cost)
        b = judge(new, sim, g, c, True)
        assert a == (b is not None) and old.rng.getstate() == new.rng.getstate()
        if a:
            assert b == cost
            old.cost = new.cost = cost
            sim.commit()
        else:
            sim.revert()
        decided.append(a)
    assert True in decided and False in decided  # (both outcomes were exercised)


def test_judge_rejects_a_faster_move_over_memory():
    from engine.search.chains import Chain, judge

    g, c = resolve_model("gpt2", batch=64, seq_len=1024), preset("rtx2080ti:1")  # data parallel does not fit
    sim = DeltaSimulator(g, data_parallel(g, c), c)
    chain = Chain("c", sim.strategy, sim, random.Random(0), 1.0, float("inf"))
    state = chain.rng.getstate()
    assert judge(chain, sim, g, c, True) is None  # faster than inf: taken on time, refused on memory
    assert chain.rng.getstate() == state  # (no draw: a better time needs none)
    assert judge(chain, sim, g, c, False) == sim.timeline.makespan_s  # without the memory check it is taken


# --------------------------------------------------------------------------- the resumed simulation


def _task_map_numpy(old_segs, new_segs, n_old):
    """The NumPy form :func:`engine.sim.delta._task_map` had before it was compiled (the reference)."""
    o_slot, o_start, o_n, o_serial = old_segs
    n_slot, n_start, _, n_serial = new_segs
    size = int(max(o_slot.max(initial=0), n_slot.max(initial=0))) + 1
    where = np.full(size, -1, np.int64)
    where[n_slot] = np.arange(n_slot.size)
    j = where[o_slot]
    shared = (j >= 0) & (n_serial[np.maximum(j, 0)] == o_serial)
    shift = np.where(shared, n_start[np.maximum(j, 0)] - o_start, -1 - n_old)
    out = np.arange(n_old, dtype=np.int64) + np.repeat(shift, o_n)
    out[out < 0] = -1
    return out


@pytest.mark.parametrize("seed", range(6))
def test_task_map_equals_its_numpy_form(seed):
    """Random segment layouts: slots dropped, added and moved, serials kept or renewed, empty
    segments; the compiled map equals the NumPy one."""
    from engine.sim.delta import _task_map

    rng = np.random.default_rng(seed)

    def layout(slots, serials):
        n = rng.integers(0, 5, slots.size)
        start = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
        return (slots.astype(np.int64), start, n.astype(np.int64), serials.astype(np.int64)), int(n.sum())

    o_slots = rng.permutation(30)[:20]
    old, n_old = layout(o_slots, np.arange(20) + 100)
    keep = rng.random(20) < 0.7
    n_slots = np.concatenate([o_slots[keep], 30 + np.arange(rng.integers(0, 5))])
    serials = np.concatenate([np.where(rng.random(keep.sum()) < 0.8, (np.arange(20) + 100)[keep], 999),
                              500 + np.arange(n_slots.size - keep.sum())])
    new, _ = layout(n_slots, serials)
    assert np.array_equal(_task_map(old, new, n_old), _task_map_numpy(old, new, n_old))
