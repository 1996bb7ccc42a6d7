"""Issue 44: what an iteration's time is made of, on its critical chain, by kind of work
(``engine.sim.breakdown``), in ``soapbox simulate`` (text and ``--json``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.cli import main
from engine.cluster import preset
from engine.formats import resolve_model
from engine.layout import Layout
from engine.layout.build import build_layout
from engine.sim.breakdown import BREAKDOWN_KINDS, chain_seconds, critical_breakdown
from engine.sim.report import simulate_strategy
from engine.taskgraph import BWD, COLL, FWD


def test_shares_sum_to_one_and_match_the_chain_by_hand():
    g, c = resolve_model("gpt2", batch=16), preset("dgx-a100-80gb:1")
    r = simulate_strategy(g, build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1, sequence_parallel=True)), c)
    shares = critical_breakdown(r.timeline)
    assert list(shares) == list(BREAKDOWN_KINDS) and sum(shares.values()) == pytest.approx(1.0)
    tg, crit = r.timeline.tasks, r.timeline.critical_tasks
    k, dur = tg.kind[crit], tg.dur_s[crit]
    assert chain_seconds(r.timeline)["compute"] == pytest.approx(float(dur[(k == FWD) | (k == BWD)].sum()))
    inside = float(dur[(k == COLL) & (tg.mb[crit] >= 0)].sum())  # (no experts: every inner collective is tp/sp)
    assert chain_seconds(r.timeline)["tensor / sequence / context-parallel collectives"] == pytest.approx(inside)
    # (shares are over the iteration; scaled down only where a transfer's hops overlap on the chain)
    assert shares["tensor / sequence / context-parallel collectives"] == pytest.approx(inside / r.timeline.makespan_s,
                                                                                       rel=1e-3)
    assert shares["compute"] > 0.3 and shares["tensor / sequence / context-parallel collectives"] > 0
    assert all(v >= 0 for v in shares.values())


def test_experts_all_to_alls_have_their_own_share(capsys):
    args = ["simulate", "--model", "mixtral-8x7b", "--batch", "16", "--seq-len", "1024", "--cluster", "dgx-h100:2",
            "--strategy", "megatron", "--ep", "8", "--micro-batch", "1"]
    assert main(args + ["--json"]) in (0, 3)  # (3: it does not fit in memory, which does not matter here)
    data = json.loads(capsys.readouterr().out)
    shares = data["critical_chain_shares"]
    assert shares["expert all-to-alls"] > 0 and sum(shares.values()) == pytest.approx(1.0)
    assert main(args) in (0, 3)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("critical chain "))
    assert "compute" in line and "expert all-to-alls" in line


def test_an_empty_timeline_has_no_shares():
    class Empty:
        critical_tasks = np.zeros(0, np.int64)

    assert critical_breakdown(Empty()) == dict.fromkeys(BREAKDOWN_KINDS, 0.0)
