"""Failure what-ifs of mixture-of-experts strategies (issue 26): mapping a layout onto the
survivors keeps ep and etp, or takes the largest ep that still folds and says so, and carries
the routing what-if (``expert_loads``)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine.cli import main
from engine.cluster import preset
from engine.models.moe import MoEConfig, moe_gpt
from engine.moe import expert_degrees, expert_loads
from engine.search.baselines import data_parallel
from engine.studies.whatif import map_strategy, parse_failure, survivors
from engine.layout import Layout, build_layout

#: two MoE layers of 8 experts (top-2), batch 16: on 16 GPUs dp 16 with tp 1
GRAPH = moe_gpt(MoEConfig(2, 64, 4, 64, 100, 16, 8, 2, 64, name="tiny-moe"))
CLUSTER = preset("dgx-h100:2")
SKEW = tuple(float(x) for x in expert_loads(8, 1.0))


def mapped(strategy, fail: str = "gpu:3"):
    after, _ = survivors(CLUSTER, [parse_failure(fail)])
    return map_strategy(GRAPH, strategy, CLUSTER, after)


@pytest.mark.parametrize("kw", [dict(ep=8), dict(ep=2), dict(tp=2, sequence_parallel=True, ep=8),
                                dict(tp=2, sequence_parallel=True, ep=4, etp=2)])
def test_ep_and_etp_are_kept(kw):
    s = replace(build_layout(GRAPH, CLUSTER, Layout(micro_batch=1, **kw)), expert_loads=SKEW)
    m, rule = mapped(s)
    assert m is not None, rule
    assert expert_degrees(GRAPH, m) == (kw["ep"], kw.get("etp", 1))
    assert m.expert_loads == SKEW
    assert f", ep {kw['ep']}," in rule and rule.endswith("GPUs)"), rule  # (no note of a changed ep)


def test_ep_that_no_longer_folds_becomes_the_largest_that_does():
    # pp 2 x dp 8 on 16 GPUs; 15 survivors hold pp 2 x dp 4: ep 8 neither divides the one
    # sequence shard nor dp 4, ep 4 does
    s = build_layout(GRAPH, CLUSTER, Layout(pp=2, ep=8, micro_batch=1))
    m, rule = mapped(s)
    assert m is not None, rule
    assert expert_degrees(GRAPH, m) == (4, 1)
    assert "ep 8 -> 4, the largest that folds onto dp 4 (ep 8 does not fold onto dp 4" in rule


def test_balanced_strategy_stays_balanced():
    m, _ = mapped(build_layout(GRAPH, CLUSTER, Layout(ep=8, micro_batch=1)))
    assert m.expert_loads is None


def test_data_parallel_carries_the_loads():
    s = replace(data_parallel(GRAPH, CLUSTER), expert_loads=SKEW)
    m, rule = mapped(s)
    assert rule.startswith("data parallel over") and m.expert_loads == SKEW


def test_whatif_command_with_ep_and_skew(capsys, tmp_path):
    """``soapbox whatif`` takes the baseline and routing flags; the mapped strategy keeps ep and
    the skew (slower than balanced on the same survivors)."""
    from engine.formats import save_json

    def run(*flags: str) -> dict:
        rc = main(["whatif", "--model", path, "--cluster", "dgx-h100:2", "--strategy", "megatron", "--ep", "8",
                   "--micro-batch", "1", "--fail", "gpu:3", "--budget", "0", "--json", *flags])
        out, err = capsys.readouterr()
        assert rc == 0, err
        return json.loads(out)

    path = str(tmp_path / "tiny.json")
    save_json(GRAPH.to_dict(), path)
    balanced, skewed = run(), run("--routing-skew", "2")
    assert "ep 8" in balanced["mapped"]["rule"] and "ep 8" in skewed["mapped"]["rule"]
    assert skewed["healthy"]["iteration_time_s"] > balanced["healthy"]["iteration_time_s"]
    assert skewed["mapped"]["iteration_time_s"] > balanced["mapped"]["iteration_time_s"]
