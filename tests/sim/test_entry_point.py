"""The engine's one simulation entry point (issue 24 part 3): ``simulate_strategy`` with its
``symmetry``, ``max_tasks`` and ``account_memory`` options, and the metrics defined once in
``engine.sim.report`` (tokens per sample, model FLOPs, tokens/s, MFU), with the callers that now
read them (the sweep, the searches' pricing)."""

from __future__ import annotations

import pytest

import engine.sim.report as report_mod
from engine.cluster import preset
from engine.errors import TooLargeError
from engine.formats import resolve_model
from engine.sim.memory import fits_in_memory
from engine.models.transformer import GPTConfig, gpt
from engine.sim.report import mfu, model_flops, peak_flops_per_s, simulate_strategy, tokens_per_s, tokens_per_sample
from engine.search.api import price
from engine.search.baselines import data_parallel, expert
from engine.sim.full import simulate
from engine.taskgraph import build_task_graph, estimate_symmetric_tasks, estimate_tasks
from engine.layout import Layout, build_layout

TINY = dict(layers=2, hidden=64, heads=4, seq_len=32, vocab=128, batch=8)


class TestTokensPerSample:
    def test_language_models_count_their_token_ids(self):
        assert tokens_per_sample(resolve_model("gpt2")) == 1024
        assert tokens_per_sample(resolve_model("llama2-7b")) == 4096
        assert tokens_per_sample(resolve_model("nmt")) == 40  # encoder-decoder: the source sequence

    def test_float_features_along_a_length_are_not_tokens(self):
        """The rule the page used and the sweep did not (it counted any input with a length
        dim): audio frames or embeddings have a length axis but are not token ids."""
        from engine.graph.building import GraphBuilder
        b = GraphBuilder("frames", precision="fp32")
        x = b.input("frames", [4, 50, 16], dtype="fp32", axes=("sample", "length", "feature"))
        b.add("linear", "proj", [x], out_features=8)
        g = b.build()
        assert "length" in g["frames"].dim_names
        assert tokens_per_sample(g) is None

    def test_a_cnn_has_none(self):
        assert tokens_per_sample(resolve_model("alexnet")) is None
        assert tokens_per_s(resolve_model("alexnet"), 1.0) is None

    def test_tokens_per_s(self):
        g = resolve_model("gpt2")  # batch 8 x 1,024 tokens
        assert tokens_per_s(g, 2.0) == 8 * 1024 / 2.0
        assert tokens_per_s(g, 0.0) is None


class TestModelFlops:
    def test_unfused_model_is_the_graphs_total(self):
        g = gpt(GPTConfig(**TINY))
        assert model_flops(g) == g.fwd_flops + g.bwd_flops

    def test_fused_attention_backward_counts_twice_its_forward(self):
        """FlashAttention's backward is priced at 2.5x its forward (it recomputes the scores);
        model FLOPs count 2x (PaLM: no rematerialisation)."""
        g = gpt(GPTConfig(**TINY, flash_attention=True))
        att = [op for op in g.ops if op.kind == "attention"]
        assert len(att) == TINY["layers"]
        fwd = sum(op.fwd_flops for op in att)
        assert sum(op.bwd_flops for op in att) == pytest.approx(2.5 * fwd)
        assert model_flops(g) == pytest.approx(g.fwd_flops + g.bwd_flops - 0.5 * fwd)
        # attention is counted: causal, half of 4 b h s^2 d forward per layer
        b, s, h = TINY["batch"], TINY["seq_len"], TINY["hidden"]
        assert fwd == pytest.approx(TINY["layers"] * 4 * b * s * s * h / 2)


class TestMfu:
    def test_palm_definition_by_hand(self):
        g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")  # fp32: 19.5 TFLOP/s a GPU
        assert peak_flops_per_s(c, range(8), "fp32") == 8 * 19.5e12
        assert mfu(g, 2.0, c, range(4)) == pytest.approx(model_flops(g) / (2.0 * 4 * 19.5e12))
        assert mfu(g, 0.0, c, range(4)) is None and mfu(g, 1.0, c, []) is None

    def test_a_precision_the_device_lacks_has_no_mfu(self):
        g, c = resolve_model("llama2-7b"), preset("p100-4x4")  # bf16 on P100s
        assert peak_flops_per_s(c, [0], "bf16") is None and mfu(g, 1.0, c, [0]) is None

    def test_result_counts_only_the_gpus_used(self):
        g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
        s = build_layout(g, c, Layout(tp=2, dp=1))  # 2 of 8 GPUs
        r = simulate_strategy(g, s, c)
        assert r.devices_used == [0, 1]
        assert r.mfu == pytest.approx(model_flops(g) / (r.iteration_time_s * 2 * 19.5e12))
        assert r.tokens_per_s == pytest.approx(g.batch_size * 1024 / r.iteration_time_s)
        summary = r.summary()
        assert summary["mfu"] == r.mfu and summary["tokens_per_s"] == r.tokens_per_s
        assert summary["model_flops_per_iteration"] == model_flops(g)


class TestEntryPoint:
    def test_same_as_building_by_hand(self):
        g, c = resolve_model("alexnet"), preset("p100-4x4")
        s = expert(g, c)
        r = simulate_strategy(g, s, c)
        tl = simulate(build_task_graph(g, s, c))
        assert r.iteration_time_s == tl.makespan_s and r.tasks.num_tasks == tl.tasks.num_tasks

    def test_symmetry_off_builds_every_gpu_with_the_same_time(self):
        g, c = resolve_model("alexnet"), preset("dgx-a100-80gb:1")
        s = data_parallel(g, c)
        auto, off = simulate_strategy(g, s, c), simulate_strategy(g, s, c, symmetry="off")
        assert auto.tasks.num_tasks < off.tasks.num_tasks
        assert auto.iteration_time_s == pytest.approx(off.iteration_time_s, rel=1e-12)
        with pytest.raises(ValueError, match="symmetry"):
            simulate_strategy(g, s, c, symmetry="on")

    def test_symmetry_only_refuses_a_strategy_without_an_exact_symmetry(self, monkeypatch):
        import engine.taskgraph.builder as builder_mod
        g, c = resolve_model("alexnet"), preset("dgx-a100-80gb:1")
        dp = data_parallel(g, c)  # replicas: exact
        r = simulate_strategy(g, dp, c, symmetry="only")
        assert r.tasks.info["symmetry"] is not None
        assert r.iteration_time_s == simulate_strategy(g, dp, c).iteration_time_s
        built = []
        real = builder_mod.TaskGraphBuilder.build

        def spy(self, exact_only=False, cancel=None):
            built.append(exact_only)
            return real(self, exact_only, cancel)

        monkeypatch.setattr(builder_mod.TaskGraphBuilder, "build", spy)
        one = expert(g, preset("p100-4x4"))  # FlexFlow's expert plan on 16 P100s: no symmetry the builder keeps
        with pytest.raises(TooLargeError, match="no exact symmetry"):
            simulate_strategy(g, one, preset("p100-4x4"), symmetry="only")
        assert False not in built  # no full build was started

    def test_max_tasks_refuses_before_building(self, monkeypatch):
        g, c = resolve_model("alexnet"), preset("p100-4x4")
        s = expert(g, c)
        n = estimate_tasks(g, s, c)

        def no_build(*a, **k):
            raise AssertionError("built although refused")

        monkeypatch.setattr(report_mod, "build_task_graph", no_build)
        with pytest.raises(TooLargeError, match=f"{n:,} tasks"):
            simulate_strategy(g, s, c, max_tasks=n - 1, symmetry="off")

    def test_max_tasks_counts_the_symmetric_build(self):
        """Data parallel on 8 GPUs: the full estimate is over the cap, the symmetric one under
        it, so it runs (with symmetry) and is refused without."""
        g, c = resolve_model("alexnet"), preset("dgx-a100-80gb:1")
        s = data_parallel(g, c)
        full, sym = estimate_tasks(g, s, c), estimate_symmetric_tasks(g, s, c)
        assert sym < full
        cap = (sym + full) // 2
        assert simulate_strategy(g, s, c, max_tasks=cap).tasks.num_tasks <= sym
        with pytest.raises(TooLargeError):
            simulate_strategy(g, s, c, max_tasks=cap, symmetry="off")

    def test_lazy_memory_gives_the_same_feasibility(self):
        g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
        s = data_parallel(g, c)
        lazy = simulate_strategy(g, s, c, account_memory=False)
        assert lazy.feasible == fits_in_memory(g, s, c, lazy.timeline)
        assert lazy.memory.feasible == lazy.feasible  # made when read

    def test_price_is_the_entry_points(self):
        g, c = resolve_model("alexnet"), preset("p100-4x4")
        s = expert(g, c)
        p = price(g, s, c)
        tl = simulate(build_task_graph(g, s, c))
        assert p.time_s == tl.makespan_s and p.feasible == fits_in_memory(g, s, c, tl)


def test_sweep_throughput_is_tokens_per_s_for_a_language_model():
    from engine.studies.sweep import evaluate
    row = evaluate("gpt2", {"cluster": "dgx-a100-80gb:1", "tp": 2})
    assert row["throughput_per_s"] == pytest.approx(8 * 1024 / row["iteration_time_s"])
    row = evaluate("alexnet", {"cluster": "dgx-a100-80gb:1"})
    assert row["throughput_per_s"] == pytest.approx(256 / row["iteration_time_s"])
