"""Issue 15: failures and goodput. A failed GPU or node leaves the survivors; the strategy is
mapped onto them by its layout's rule (or only re-planned); a slow GPU stretches its compute;
Young's and Daly's checkpoint intervals against their closed forms."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from engine.cli import main
from engine.cluster import preset
from engine.formats import resolve_model
from engine.search.baselines import data_parallel
from engine.sim.full import simulate
from engine.taskgraph import build_task_graph
from engine.studies.whatif import (checkpoint_bytes, daly_interval_s, goodput, map_strategy, parse_failure,
    simulate_with_slow, survivors, young_interval_s)
from engine.layout import Layout, build_layout


def test_failing_a_gpu_in_data_parallel_on_16_gives_the_rules_layout():
    g, c = resolve_model("inception_v3"), preset("p100-4x4")  # batch 64
    healthy = simulate(build_task_graph(g, data_parallel(g, c), c)).makespan_s
    after, kept = survivors(c, [parse_failure("gpu:3")])
    assert after.num_devices == 15 and 3 not in kept and kept[3] == 4
    s, rule = map_strategy(g, data_parallel(g, c), c, after)
    assert len(s.devices_used()) == 8 and "8 GPUs" in rule  # 15 does not divide 64: the rule takes 8
    assert simulate(build_task_graph(g, s, after)).makespan_s >= healthy
    g60 = resolve_model("inception_v3", batch=60)  # 15 divides 60: all survivors
    s60, _ = map_strategy(g60, data_parallel(g60, c), c, after)
    assert len(s60.devices_used()) == 15


def test_a_node_failure_shrinks_data_parallelism_of_a_megatron_layout():
    g, c = resolve_model("gpt2", batch=32), preset("dgx-a100-80gb:4")
    s = build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1))
    after, _ = survivors(c, [parse_failure("node:2")])
    assert after.num_devices == 24 and len(after.node_specs) == 1  # one spec again: symmetry holds
    m, rule = map_strategy(g, s, c, after)
    assert "dp 8 -> 4" in rule and m.pipeline.stages == 2 and m.pipeline.microbatches == 8
    assert max(len(cfg.devices) for cfg in m.configs.values()) <= 24


def test_a_per_op_strategy_is_only_replanned():
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    s = data_parallel(g, c)
    odd = s.with_config("fc6", type(s.configs["fc6"])({"feature": 4}, (0, 1, 2, 3)))
    after, _ = survivors(c, [parse_failure("node:0")])
    m, rule = map_strategy(g, odd, c, after)
    assert m is None and "re-planned only" in rule


def test_a_lost_nic_leaves_the_gpus_and_slows_the_network():
    c = preset("dgx-a100-80gb:2")
    after, kept = survivors(c, [parse_failure("link:dgx0/nic3")])
    assert after.num_devices == 16 and after.node_specs[0].nics == 7 and after.node_specs[1].nics == 8


def test_a_slow_gpu_stretches_its_compute_and_the_iteration():
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    s = data_parallel(g, c)
    fast, _ = simulate_with_slow(g, s, c, [])
    slow, _ = simulate_with_slow(g, s, c, [parse_failure("gpu:5=0.5", slow=True)])
    assert slow.makespan_s > fast.makespan_s


@pytest.mark.parametrize("text", ["gpu", "gpu:x", "node:-1", "link:eth0", "disk:1"])
def test_bad_failures(text):
    with pytest.raises(ValueError):
        parse_failure(text)
    with pytest.raises(ValueError, match="0 < F <= 1"):
        parse_failure("gpu:1=1.5", slow=True)


def test_out_of_range_targets():
    c = preset("p100-4x4")
    with pytest.raises(ValueError, match="GPUs 0..15"):
        survivors(c, [parse_failure("gpu:16")])
    with pytest.raises(ValueError, match="no such network interface"):
        survivors(c, [parse_failure("link:node9/nic0")])


def test_young_and_daly_against_their_closed_forms():
    delta, m = 60.0, 3600.0 * 5
    assert young_interval_s(delta, m) == pytest.approx(math.sqrt(2 * 60 * 18000))  # 1469.7 s
    x = delta / (2 * m)
    assert daly_interval_s(delta, m) == pytest.approx(math.sqrt(2 * delta * m) * (1 + math.sqrt(x) / 3 + x / 9) - delta)
    assert daly_interval_s(50_000.0, 20_000.0) == 20_000.0  # delta >= 2M: M
    gp = goodput(1.0, 1000, 1000 * 18000.0, 60e9, 1e9, 600.0)  # job MTBF 5 h, 60 s checkpoints
    tau = round(daly_interval_s(60.0, 18000.0))
    assert gp["checkpoint_every_iterations"] == tau
    assert gp["share_lost"] == pytest.approx(60 / (tau + 60) + (tau + 60) / 36000 + 600 / 18000)


def test_checkpoint_bytes():
    g = resolve_model("gpt2")  # fp32: weights 4 + Adam 8
    assert checkpoint_bytes(g) == g.param_count * 12
    assert checkpoint_bytes(resolve_model("llama2-7b")) == 6_738_415_616 * 14  # bf16 + fp32 master + Adam


def test_cli_json(capsys):
    assert main(["whatif", "--model", "gpt2", "--batch", "32", "--cluster", "dgx-a100-80gb:2", "--strategy",
                 "data-parallel", "--fail", "node:1", "--budget", "2s", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["after"]["gpus"] == 8 and out["mapped"]["gpus_used"] == 8
    assert out["mapped"]["iteration_time_s"] >= out["healthy"]["iteration_time_s"]
    assert out["replan"]["feasible"] and 0 < out["replan"]["goodput"]["goodput"] <= 1
    assert main(["whatif", "--model", "gpt2", "--cluster", "p100-4x4"]) == 2
    assert "at least one --fail or --slow" in capsys.readouterr().err


class TestReplanHonest:
    """Issue 28: the re-plan did not start from the mapped layout and, under load, wrote a plan
    that does not fit with exit status 0 while the mapped layout fit. The re-plan is seeded with
    the mapped layout, priced as it is, and never offered when it does not fit or is slower."""

    ARGS = ["whatif", "--model", "gpt2", "--batch", "16", "--cluster", "rtx2080ti:2", "--fail", "node:1",
            "--budget", "2s", "--json"]

    @staticmethod
    def one_gpu_plan():
        """GPT-2 with its batch of 16 on one 11 GB GPU: does not fit in memory."""
        g = resolve_model("gpt2", batch=16)
        one, _ = survivors(preset("rtx2080ti:1"), [parse_failure(f"gpu:{k}") for k in range(1, 8)])
        return g, data_parallel(g, one)  # (every op on GPU 0, which the survivors keep)

    @pytest.fixture()
    def search_returns(self, monkeypatch):
        """Replace auto by a search that returns ``plan`` and claims it fits (as a search whose
        pricing and the what-if's disagree would); records what it was started from."""
        import engine.search.auto
        from engine.search.api import SearchResult

        seen = {}

        def install(plan):
            def fake(graph, cluster, budget, *, seed=0, progress=None, initial=None, cost=None, options=None):
                seen["initial"] = initial
                best = dataclasses.replace(plan, found_by={"algorithm": "auto", "source": "mcmc"})
                return SearchResult(best, 0.001, {}, 1, 0.01, algorithm="auto")
            monkeypatch.setattr(engine.search.auto, "auto", fake)
            return seen
        return install

    def test_a_plan_that_does_not_fit_falls_back_to_the_mapped_layout(self, search_returns, capsys, tmp_path):
        g, plan = self.one_gpu_plan()
        seen = search_returns(plan)
        out_file = tmp_path / "plan.json"
        assert main(self.ARGS + ["-o", str(out_file)]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["mapped"]["feasible"] and out["replan"]["kept"] == "mapped" and out["replan"]["feasible"]
        assert out["replan"]["iteration_time_s"] == out["mapped"]["iteration_time_s"]
        assert "the mapped layout is kept" in out["replan"]["note"] and "does not fit" in out["replan"]["note"]
        after, _ = survivors(preset("rtx2080ti:2"), [parse_failure("node:1")])
        written = json.loads(out_file.read_text())
        mapped = data_parallel(g, after)
        assert {k: v["devices"] for k, v in written["ops"].items()} == \
            {k: list(c.devices) for k, c in mapped.configs.items()}
        assert dict(seen["initial"].configs) == dict(mapped.configs)  # (seeded with the mapped layout)

    def test_nothing_fits_is_not_a_success(self, search_returns, capsys, tmp_path):
        g, plan = self.one_gpu_plan()
        search_returns(plan)
        out_file = tmp_path / "plan.json"
        args = [a if a != "16" else "256" for a in self.ARGS]  # (data parallel no longer fits either)
        assert main([a for a in args if a != "--json"] + ["-o", str(out_file)]) == 3
        text = capsys.readouterr().out
        assert "nothing fits in memory on the survivors" in text and f"nothing written to {out_file}" in text
        assert not out_file.exists()

    def test_a_faster_plan_that_fits_is_kept(self):
        g = resolve_model("gpt2", batch=16)
        c = preset("rtx2080ti:1")
        from engine.search.api import SearchResult

        slow_plan = data_parallel(g, c)
        fast = build_layout(g, c, Layout(tp=1, pp=1, dp=8, micro_batch=2))

        def fake(graph, cluster, budget, *, seed=0, initial=None):
            return SearchResult(dataclasses.replace(fast, found_by={"source": "mcmc"}), 0.1, {}, 1, 0.0)

        from engine.studies.whatif import replan
        t_fast = simulate_with_slow(g, fast, c, [])[0].makespan_s
        rp = replan(g, c, slow_plan, [], None, search=fake, mapped_priced=(t_fast * 2, True))
        assert rp.kept == "search" and rp.feasible and rp.iteration_time_s == t_fast and rp.source == "mcmc"
        rp = replan(g, c, slow_plan, [], None, search=fake, mapped_priced=(t_fast / 2, True))
        assert rp.kept == "mapped" and rp.strategy is slow_plan and rp.iteration_time_s == t_fast / 2

    def test_with_a_slow_gpu_the_real_replan_is_never_slower_than_the_mapped_layout(self, capsys):
        assert main(["whatif", "--model", "gpt2", "--batch", "32", "--cluster", "dgx-a100-80gb:2", "--fail",
                     "node:1", "--slow", "gpu:0=0.25", "--budget", "2s", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["replan"]["feasible"] and out["replan"]["kept"] in ("search", "mapped")
        assert out["replan"]["iteration_time_s"] <= out["mapped"]["iteration_time_s"]


def test_fsdp_maps_with_its_sharding_and_recomputation():
    """Issue 28: FSDP shares data parallel's configs, so it was mapped as plain data parallel
    (ZeRO-3 and recomputation dropped: 87.6 GB on 11.8 GB GPUs where FSDP needs 5.8 GB)."""
    g, c = resolve_model("gpt2", batch=256), preset("rtx2080ti:2")
    from engine.layout.build import fsdp

    s = fsdp(g, c, Layout(zero_stage=3, recompute="full"))
    after, _ = survivors(c, [parse_failure("node:1")])
    m, rule = map_strategy(g, s, c, after)
    assert rule.startswith("the same layout (tp 1, pp 1, cp 1, micro-batch 16) with dp 16 -> 8")
    assert (m.zero_stage, m.recompute, len(m.devices_used())) == (3, "full", 8)
    assert simulate_with_slow(g, m, after, [])[1].feasible
    d, rule = map_strategy(g, data_parallel(g, c), c, after)  # (plain data parallel keeps its own rule)
    assert rule.startswith("data parallel over 8 GPUs") and d.zero_stage == 0
