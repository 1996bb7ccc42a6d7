"""Issue 26, item 5: the explorer and mixture-of-experts models — the layout panel's ep / etp
(checked by the engine's rules, the reason shown), MoE ops named in the block stack and the op
panel, the all-to-alls on the timeline, the Experts panel (tokens and time per expert and per
expert-parallel rank, the routing what-if re-simulated, histogram uploads), memory, and the
Learn tab's guided step. Callbacks and figures called as plain functions."""

from __future__ import annotations

import base64
import collections
import json

import numpy as np
import plotly.graph_objects as go
import pytest

from app import actions as ACT
from app import panel as PNL
from app import events as EV
from app import state as ST
from app.figures import KIND_COLOURS, build_expert_figure, build_memory_figure
from app.gantt_figure import build_gantt_figure
from app.gantt import A2A_LABEL, gantt_data
from app.learn import TOPICS
from app.simulation import workspace
from app.sources import graph_of
from app.tabs import editor as ED
from app.tabs import experts as XP
from app.tabs import explore as EXP
from app.tabs import learn as LRN
from app.views import block_stack, expert_param_share, memory_data, op_details
from engine.moe import expert_loads

#: Mixtral 8x7B small enough to simulate in a second: 64 samples of 1,024 tokens on 64 H100s
MODEL, CLUSTER, BATCH, SEQ = "mixtral-8x7b", "dgx-h100:8", 64, 1024
#: the layout panel's form for tp 2 (sequence parallel) x ep 8 with the distributed optimizer
EP8 = {"kind": "megatron", "tp": 2, "ep": 8, "zero_stage": 1, "flags": ["sequence_parallel"]}


def data_url(text: str) -> str:
    return "data:text/plain;base64," + base64.b64encode(text.encode()).decode()


@pytest.fixture(scope="module")
def fresh():
    return ST.new_state(MODEL, CLUSTER, "data-parallel", batch=BATCH, seq_len=SEQ)


@pytest.fixture(scope="module")
def ep8(fresh):
    new, msg = EV.on_event("layout-apply", fresh, layout=dict(EP8))
    assert new is not fresh, msg
    return new


def experts_config(state):
    s = ST.page_strategy(state)
    g = graph_of(state)
    op = next(o for o in g.ops if o.kind == "experts")
    return op, s[op.name]


# --------------------------------------------------------------------------- layout panel


class TestLayoutPanel:
    def test_ep_reaches_the_experts_ops_and_the_panel_shows_it(self, ep8):
        op, cfg = experts_config(ep8)
        assert cfg.degree("expert") * cfg.degree("expert_seq") == 8
        assert cfg.degree("ffn") == 1
        values = ED.panel_values(ep8)
        assert values["ep"] == 8 and values["etp"] is None and values["tp"] == 2

    def test_etp_splits_the_experts_ffn(self, fresh):
        new, msg = EV.on_event("layout-apply", fresh, layout={**EP8, "ep": 4, "etp": 2})
        assert "ep 4" in msg and "etp 2" in msg, msg
        op, cfg = experts_config(new)
        assert cfg.degree("ffn") == 2 and cfg.degree("expert") * cfg.degree("expert_seq") == 4
        assert ED.panel_values(new)["etp"] == 2

    @pytest.mark.parametrize("form, reason", [
        ({"ep": 3}, "ep 3 does not divide the 8 experts"),
        ({"ep": 8, "flags": []}, "needs sequence parallelism"),
        ({"ep": 4, "etp": 4}, "etp 4 must divide tp 2"),
    ])
    def test_an_invalid_ep_is_refused_with_the_engines_reason_and_nothing_changes(self, ep8, form, reason):
        new, msg = EV.on_event("layout-apply", ep8, layout={**EP8, **form})
        assert new is ep8
        assert msg.startswith("Layout refused") and reason in msg, msg
        disabled, hint = ED.moe_fields(ep8, "megatron", {**EP8, **form})
        assert not disabled and reason in hint, hint

    def test_the_hint_says_what_a_valid_layout_makes(self, ep8):
        disabled, hint = ED.moe_fields(ep8, "megatron", dict(EP8))
        assert not disabled
        assert "8 experts over ep 8: 1 per rank" in hint and "expert data parallel 8" in hint, hint

    def test_dense_models_disable_ep_with_the_reason_and_fsdp_takes_it(self, ep8):
        dense = ST.new_state("gpt2", CLUSTER, "data-parallel")
        disabled, hint = ED.moe_fields(dense, "megatron", {})
        assert disabled and "needs a mixture-of-experts model" in hint and "gpt2" in hint
        disabled, hint = ED.moe_fields(ep8, "fsdp", {"ep": 8})
        assert not disabled and "8 experts over ep 8" in hint, hint
        # torchtitan's FSDP + EP: the experts folded as megatron folds them, ZeRO-3 over the rest
        new, msg = EV.on_event("layout-apply", ep8, layout={"kind": "fsdp", "ep": 8})
        assert new is not ep8, msg
        op, cfg = experts_config(new)
        assert cfg.degree("expert") * cfg.degree("expert_seq") == 8 and new["strategy"]["zero_stage"] == 3

    @pytest.mark.parametrize("bad", [0, 2.5, "x"])
    def test_a_degree_that_is_not_a_whole_number_is_named(self, bad):
        with pytest.raises(ValueError, match="ep"):
            PNL.layout_options("megatron", {"ep": bad})

    def test_a_new_batch_keeps_the_expert_layout(self, ep8):
        new, msg = EV.on_event("pick-batch", ep8, batch=128)
        assert "kept" in msg and "ep 8" in msg, msg
        op, cfg = experts_config(new)
        assert cfg.degree("expert") * cfg.degree("expert_seq") == 8


# --------------------------------------------------------------------------- model views


class TestModelViews:
    def test_block_rows_name_experts_top_k_and_ep(self, ep8):
        g, s = graph_of(ep8), ST.page_strategy(ep8)
        layer0 = [op.name for op in g.ops if op.block == "layers.0"]
        stack = block_stack(g, s, layer0)
        row = next(stack["labels"][r] for r in stack["rows"] if r.startswith("layers.0"))
        assert "MoE 8 experts top-2 · ep 8" in row, row
        texts = " ".join(stack["op_text"].values())
        assert "mlp.router [top-2 of 8]" in texts
        assert "mlp.experts [8 experts top-2 · ep 8 · all-to-all in and out]" in texts

    def test_the_op_panel_describes_the_experts_op(self, ep8):
        ws = workspace(ep8)
        d = op_details(ws.graph, ws.strategy, ws.timeline, "layers.3.mlp.experts")
        assert d["moe"].startswith("8 experts, top-2, ep 8 (1 expert per rank;"), d["moe"]
        assert "dispatched" in d["moe"] and "all-to-all" in d["moe"]
        assert op_details(ws.graph, ws.strategy, ws.timeline, "layers.3.attn.core")["moe"] == ""
        html = str(ED.op_panel(ws.graph, ws.strategy, ws.timeline, ["layers.3.mlp.experts"]))
        assert "mixture of experts" in html


# --------------------------------------------------------------------------- timeline


class TestTimeline:
    def test_all_to_alls_are_drawn_apart_and_named(self, ep8):
        ws = workspace(ep8)
        d = gantt_data(ws.graph, ws.cluster, ws.timeline, max_bars=100_000)
        assert A2A_LABEL in d["bars"] and "collective" in d["bars"]
        roles = collections.Counter(t.split(" all_to_all ")[1].split(" · ")[0] for t in d["bars"][A2A_LABEL]["text"])
        # four per MoE layer and microbatch, each on every GPU row it joins: as many of each
        assert set(roles) == {"dispatch", "combine", "dispatch (backward)", "combine (backward)"}
        assert len(set(roles.values())) == 1, roles
        layers, m = 32, ws.strategy.pipeline.microbatches
        assert sum(roles.values()) % (4 * layers * m) == 0
        fig = go.Figure(build_gantt_figure(d))
        colours = {tr.name: tr.marker.color for tr in fig.data if tr.type == "bar"}
        assert colours[A2A_LABEL] == KIND_COLOURS[A2A_LABEL] != KIND_COLOURS["collective"]

    def test_a_dense_model_has_no_all_to_all_bars(self):
        dense = ST.new_state("gpt2", "dgx-h100:1", "data-parallel")
        ws = workspace(dense)
        assert A2A_LABEL not in gantt_data(ws.graph, ws.cluster, ws.timeline)["bars"]


# --------------------------------------------------------------------------- the expert panel


class TestExpertTable:
    def test_balanced_every_rank_alike(self, ep8):
        ws = workspace(ep8)
        t = XP.expert_table(ws.graph, ws.strategy, ws.timeline, "layers.0.mlp.experts")
        copies = BATCH * SEQ * 2  # tokens x top-2, dropless
        assert t["gate"] == 1.0 and t["ep"] == 8 and t["etp"] == 1 and t["edp"] == 8
        assert sum(t["expert_tokens"]) == pytest.approx(copies)
        assert t["expert_tokens"] == pytest.approx([copies / 8] * 8)
        assert t["rank_tokens"] == pytest.approx([copies / 8 / 8] * 8)  # one group's share: 1 / edp
        assert np.ptp(t["rank_own_s"]) == pytest.approx(0.0, abs=1e-15)
        assert t["rank_own_s"][0] == pytest.approx(t["balanced_rank_s"]) and t["balanced_rank_s"] > 0
        assert t["a2a_s"] > 0

    def test_skew_gates_on_the_busiest_rank(self, ep8):
        ws = workspace(ep8)
        loads = expert_loads(8, 1.0)
        t = XP.expert_table(ws.graph, ws.strategy, ws.timeline, "layers.0.mlp.experts", loads)
        share0 = 1.0 / sum(1.0 / k for k in range(1, 9))  # Zipf 1 over 8: expert 0's share
        assert t["busiest_rank"] == 0 and t["busiest_experts"] == (0, 0)
        assert t["gate"] == pytest.approx(8 * share0)
        assert t["expert_tokens"][0] == pytest.approx(BATCH * SEQ * 2 * share0)
        assert max(t["rank_own_s"]) == pytest.approx(t["gate"] * t["balanced_rank_s"])
        assert min(t["rank_own_s"]) < t["balanced_rank_s"] < max(t["rank_own_s"])

    def test_the_figure_draws_both_panels_and_marks_the_busiest(self, ep8):
        ws = workspace(ep8)
        t = XP.expert_table(ws.graph, ws.strategy, ws.timeline, "layers.0.mlp.experts", expert_loads(8, 1.0))
        fig = go.Figure(build_expert_figure(t))
        names = [tr.name for tr in fig.data]
        assert "rank 0's experts (busiest)" in names and "waiting for the busiest rank" in names
        a, b = fig.layout.xaxis.domain, fig.layout.xaxis2.domain
        assert a[1] < b[0]  # side by side, apart
        wait = next(tr for tr in fig.data if tr.name == "waiting for the busiest rank")
        assert wait.y[0] == 0 and min(wait.y[1:]) > 0  # the busiest waits for nobody


class TestWhatIf:
    def test_apply_resimulates_slower_and_balanced_goes_back(self, ep8):
        ep8 = dict(ep8, undo=[[{"op": "layers.0.norm1", "before": {}, "after": {}}]])  # (an edit to keep)
        balanced_s = workspace(ep8).timeline.makespan_s
        new, msg = EV.on_event("expert-apply", ep8, whatif={"source": "skew", "skew": 1.0})
        assert "Routing what-if applied (Zipf skew 1)" in msg
        assert new["strategy"]["expert_loads"] == pytest.approx(expert_loads(8, 1.0).tolist())
        assert new["undo"] == ep8["undo"]  # (the op edits' history stays)
        skewed_s = workspace(new).timeline.makespan_s
        assert skewed_s > balanced_s
        fig, options, shown, text = XP.expert_view(new, None, {"source": "skew", "skew": 1.0})
        said = " ".join(p.children for p in text)
        assert "Published MoE runs are measured with balanced routing" in str(XP.layout())
        assert f"({skewed_s / balanced_s - 1:+.0%})" in said, said
        assert shown == "layers.0.mlp.experts" and len(options) == 32
        # the balanced time the panel computes is the balanced strategy's own simulation
        ws = workspace(new)
        t_applied = XP.expert_table(ws.graph, ws.strategy, ws.timeline, "layers.0.mlp.experts")
        ws = workspace(ep8)
        t_balanced = XP.expert_table(ws.graph, ws.strategy, ws.timeline, "layers.0.mlp.experts")
        assert t_applied["balanced_rank_s"] == pytest.approx(t_balanced["balanced_rank_s"], rel=1e-9)
        back, msg = EV.on_event("expert-balanced", new)
        assert "balanced" in msg and "expert_loads" not in back["strategy"]
        assert workspace(back).timeline.makespan_s == pytest.approx(balanced_s)

    @pytest.mark.parametrize("layer", [["layers.1.mlp.experts"], {"a": 1}, 5, "layers.0.attn.qkv"])
    def test_a_crafted_layer_shows_the_first(self, ep8, layer):
        """Issue 45: a list or dict as the picked layer was a 500 (a dict lookup of a list)."""
        _, _, shown, _ = XP.expert_view(ep8, layer, {"source": "skew", "skew": 0.0})
        assert shown == "layers.0.mlp.experts"

    def test_a_what_if_survives_a_new_layout(self, ep8):
        new, _ = EV.on_event("expert-apply", ep8, whatif={"source": "skew", "skew": 2.0})
        again, msg = EV.on_event("layout-apply", new, layout={**EP8, "ep": 4, "etp": 2})
        assert "routing what-if kept" in msg
        assert again["strategy"]["expert_loads"] == pytest.approx(new["strategy"]["expert_loads"])

    def test_skew_zero_is_balanced_and_a_preview_says_to_apply(self, ep8):
        same, msg = EV.on_event("expert-apply", ep8, whatif={"source": "skew", "skew": 0.0})
        assert same is ep8 and "balanced already" in msg
        fig, _, _, text = XP.expert_view(ep8, "layers.5.mlp.experts", {"source": "skew", "skew": 1.5})
        said = " ".join(p.children for p in text)
        assert "Simulated now: balanced routing" in said and "Press 'Apply what-if'" in said
        assert "token copies per expert (layers.5)" in json.dumps(fig["layout"]["annotations"])

    @pytest.mark.parametrize("whatif, reason", [
        ({"source": "histogram"}, "no histogram uploaded yet"),
        ({"source": "skew", "skew": 9.0}, "from 0 (balanced) to 4"),
        ({"source": "skew", "skew": "much"}, "must be a number"),
    ])
    def test_a_what_if_that_cannot_apply_is_refused(self, ep8, whatif, reason):
        same, msg = EV.on_event("expert-apply", ep8, whatif=whatif)
        assert same is ep8 and msg.startswith("Routing what-if refused") and reason in msg, msg

    def test_dense_model_refuses_the_what_if(self):
        dense = ST.new_state("gpt2", CLUSTER, "data-parallel")
        same, msg = EV.on_event("expert-apply", dense, whatif={"skew": 1.0})
        assert same is dense and "no mixture-of-experts layers" in msg
        assert XP.moe_layers(graph_of(dense)) == []


class TestHistogram:
    @pytest.mark.parametrize("text, counts", [
        ("[8, 4, 2, 2, 1, 1, 1, 1]", [8, 4, 2, 2, 1, 1, 1, 1]),
        ('{"counts": [1, 1, 1, 1, 1, 1, 1, 9]}', [1, 1, 1, 1, 1, 1, 1, 9]),
        ("expert,tokens\n" + "\n".join(f"{i},{i + 1}" for i in range(8)), list(range(1, 9))),
        ("5 5 5 5 5 5 5 25", [5] * 7 + [25]),
    ])
    def test_formats_read(self, fresh, text, counts):
        kept, note = XP.read_histogram(data_url(text), "h.txt", graph_of(fresh))
        assert kept == {"counts": [float(c) for c in counts], "filename": "h.txt"}, note
        assert "8 experts" in note

    @pytest.mark.parametrize("text, reason", [
        ("[1, 2, 3]", "lists 3 experts; mixtral-8x7b has 8"),
        ("[1, 2, 3, 4, 5, 6, 7, -8]", "h.json, line 1: '-8': a token count cannot be negative"),
        ("[1, 2, 3, 4, 5, 6, 7, \"x\"]", "h.json, line 1: '\"x\"' is not a token count"),
        ('{"counts": [1, 2, 3, 4, 5, 6, 7, "x"]}', "h.json, item 8 of 'counts': '\"x\"' is not a token count"),
        ("[0, 0, 0, 0, 0, 0, 0, 0]", "the token counts are all zero"),
        ("{\"tokens\": [1]}", "needs a 'counts' list"),
        ("[1, 2", "not valid JSON"),
        ("", "no token counts"),
        ("1," * 600_000, "h.json: the file is larger than the limit of 1 MiB"),
    ])
    def test_bad_files_are_refused_and_the_kept_one_stays(self, fresh, text, reason):
        kept, note = XP.read_histogram(data_url(text), "h.json", graph_of(fresh))
        assert kept is None and reason in note and "The what-if is unchanged" in note, note

    def test_an_uploaded_histogram_applies(self, ep8):
        counts = [1, 1, 1, 1, 1, 1, 1, 13]
        kept, _ = XP.read_histogram(data_url(json.dumps(counts)), "measured.json", graph_of(ep8))
        new, msg = EV.on_event("expert-apply", ep8, whatif={"source": "histogram", "histogram": kept})
        assert "histogram measured.json" in msg
        assert new["strategy"]["expert_loads"] == pytest.approx([c / 20 for c in counts])
        ws = workspace(new)
        t = XP.expert_table(ws.graph, ws.strategy, ws.timeline, "layers.0.mlp.experts", ws.strategy.expert_loads)
        assert t["busiest_rank"] == 7 and t["gate"] == pytest.approx(8 * 13 / 20)


# --------------------------------------------------------------------------- memory, learn


def test_memory_bars_say_the_routed_experts_share(ep8):
    ws = workspace(ep8)
    share = expert_param_share(ws.graph, ws.strategy, ws.cluster.num_devices)
    assert share.shape == (64,) and np.all((share > 0.8) & (share < 1.0))  # Mixtral: 45 B of 46.7 B in experts
    used = sorted(ws.strategy.devices_used())
    data = memory_data(ws.memory, used, expert_share=share)
    fig = go.Figure(build_memory_figure(data))
    weights = next(tr for tr in fig.data if tr.name == "weights")
    assert "routed experts" in weights.hovertemplate and weights.customdata[0] == pytest.approx(share[0])
    assert expert_param_share(graph_of(ST.new_state("gpt2", CLUSTER)), ST.page_strategy(ST.new_state("gpt2", CLUSTER)),
                              64) is None
    views = EXP.render_explore(ep8, True)
    assert "routed experts" in json.dumps(views["memory"]["data"][0].get("hovertemplate", ""))


def test_learn_explains_expert_parallelism_and_the_guided_step_sets_it_up(fresh):
    title, text = TOPICS["experts"]
    for words in ("ep", "etp", "edp", "all-to-all", "slowest expert gates the step", "balanced routing"):
        assert words in text
    assert "experts" in LRN.TOUR and LRN.TOUR["experts"][2] == "explore"
    state, msg = LRN.tour(fresh, "experts")
    assert msg.startswith("Guided comparison 3 · Expert parallelism")
    assert [c["name"] for c in state["compare"]] == ["ep 8 (balanced)", "ep 4 x etp 2 (balanced)",
                                                     "ep 8, skewed routing (Zipf 1)"]
    assert state["strategy"]["expert_loads"] == pytest.approx(expert_loads(8, LRN.MOE_SKEW).tolist())
    op, cfg = experts_config(state)
    assert len(cfg.devices) == 64 and cfg.degree("expert") * cfg.degree("expert_seq") == 8
    balanced, etp, skewed = (c["cost_s"] for c in state["compare"])
    assert skewed > balanced
