"""The layout panel's Megatron-Core switches for mixture-of-experts and recomputation:
``--recompute-modules`` (a checkbox per module, with recomputation selective) and
``--overlap-moe-expert-parallel-comm`` (the overlap group's "MoE all-to-all overlap").

Each control is enabled where it applies and disabled with the reason otherwise (a dense
model, a model without shared experts or MLA, fsdp, recomputation not selective); each reaches
the strategy and changes the simulation the expected way on a small MoE; an invalid
combination is refused with the reason and the state stays; the page's state, its share link
and a new cluster size keep both. Callbacks called as plain functions."""

from __future__ import annotations

import copy
import json

import pytest

from app import actions as ACT
from app import panel as PNL
from app import events as EV
from app import links as LNK
from app import simulation as SIM
from app import state as ST
from app import uploads as UP
from app.tabs import editor as ED
from engine.models.moe import MoEConfig, moe_gpt
from engine.strategy import RECOMPUTE_MODULES

#: a small MoE (16 experts, top-2, no shared experts, no MLA) on 16 H100s: ep 16, 4 microbatches
SMALL_MOE = MoEConfig(layers=4, hidden=256, heads=8, seq_len=512, vocab=1000, batch=64, experts=16, top_k=2,
                      expert_ffn=512)
EP16 = {"kind": "megatron", "ep": 16, "micro_batch": 1}
#: the modules that need what a dense model lacks (experts, shared experts, MLA)
NOT_DENSE = {"moe", "moe_act", "shared_experts", "mla_up_proj"}


@pytest.fixture(scope="module")
def moe():
    """The small MoE, uploaded into a session on dgx-h100:2."""
    start = ST.new_state("gpt2", "dgx-h100:2", "data-parallel", batch=64)
    state, msg, ok = UP.import_file(start, json.dumps(moe_gpt(SMALL_MOE).to_dict()), "moe.json")
    assert ok, msg
    return state


@pytest.fixture(scope="module")
def ep16(moe):
    new, msg = EV.on_event("layout-apply", moe, layout=dict(EP16))
    assert new is not moe, msg
    return new


@pytest.fixture(scope="module")
def dense():
    return ST.new_state("gpt2", "dgx-h100:2", "data-parallel", batch=32)


def _apply(state, **form):
    return EV.on_event("layout-apply", state, layout={**EP16, **form})


def _cost(state) -> tuple[float, float]:
    """(iteration time in s, the busiest GPU's peak memory in bytes) of the state simulated."""
    ws = SIM.workspace(state)
    return ws.timeline.makespan_s, float(ws.memory.peak_bytes.max())


def _off(options) -> dict[str, str]:
    return {o["value"]: o["title"] for o in options if o["disabled"]}


# --------------------------------------------------------------------------- the panel


class TestTheControls:
    def test_dense_model(self, dense):
        reasons, moe_why = ED.model_reasons(dense)
        assert {m for m, why in reasons.items() if why} == NOT_DENSE
        assert reasons["moe"] == "gpt2 has no mixture-of-experts layers"
        options, value, hint = ED.module_choices("selective", "megatron", reasons, list(RECOMPUTE_MODULES))
        off = _off(options)
        assert set(off) == NOT_DENSE and "not here: gpt2 has no multi-head latent attention" in off["mla_up_proj"]
        assert value == ["core_attn", "mlp", "layernorm"]
        assert "Not for this model: moe, moe_act, shared_experts, mla_up_proj" in hint
        assert [o["label"].strip() for o in options] == list(RECOMPUTE_MODULES)  # Megatron's names
        options, ticked = ED.overlap_choices("megatron", [], 0, 1, ["overlap_grad_reduce", "moe_comm_overlap"], moe_why=moe_why)
        assert "gpt2 has no mixture-of-experts layers" in _off(options)["moe_comm_overlap"]
        assert "--overlap-moe-expert-parallel-comm" in _off(options)["moe_comm_overlap"]
        assert ticked == ["overlap_grad_reduce"]

    def test_moe_model(self, moe):
        reasons, moe_why = ED.model_reasons(moe)
        assert moe_why is None
        options, value, _ = ED.module_choices("selective", "megatron", reasons, ["moe", "moe_act", "mla_up_proj"])
        assert set(_off(options)) == {"mlp", "shared_experts", "mla_up_proj"}  # (every layer is MoE; no MLA)
        assert value == ["moe", "moe_act"]
        options, ticked = ED.overlap_choices("megatron", [], 0, 1, ["overlap_grad_reduce", "moe_comm_overlap"],
                                             moe_why=moe_why)
        moe_box = next(o for o in options if o["value"] == "moe_comm_overlap")
        assert not moe_box["disabled"] and "MoE all-to-all overlap" in moe_box["label"]
        assert "another microbatch" in moe_box["title"] and ticked == ["overlap_grad_reduce", "moe_comm_overlap"]

    def test_mla_and_shared_experts_apply_where_the_model_has_them(self):
        g = moe_gpt(MoEConfig(layers=2, hidden=256, heads=8, seq_len=128, vocab=1000, batch=8, experts=8, top_k=2,
                              expert_ffn=256, attention="mla", kv_lora=64, q_lora=64, qk_nope=16, qk_rope=16,
                              v_head=16, shared_experts=1, dense_layers=1))
        assert not any(ACT.module_reasons(g).values())

    @pytest.mark.parametrize("recompute, kind, said", [
        ("none", "megatron", "only with recomputation selective"),
        ("full", "megatron", "only with recomputation selective"),
        ("selective", "fsdp", "pick megatron"),
    ])
    def test_every_module_off_with_the_reason(self, moe, recompute, kind, said):
        options, value, hint = ED.module_choices(recompute, kind, ED.model_reasons(moe)[0], ["moe"])
        assert all(o["disabled"] for o in options) and value == [] and said in hint

    def test_fsdp_and_all_overlap_off(self):
        options, _ = ED.overlap_choices("fsdp", [], None, 1, ["moe_comm_overlap"], moe_why=None)
        assert "pick megatron" in _off(options)["moe_comm_overlap"]
        _, ticked = ED.overlap_choices("megatron", ["sequence_parallel"], 1, 4, ["tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "moe_comm_overlap"], all_off=True,
                                       moe_why=None)
        assert ticked == []

    @pytest.mark.parametrize("junk", [None, "x", 3.5, {"a": 1}, [None, 1, ["moe"]], True])
    def test_any_value_from_the_page(self, junk):
        options, value, hint = ED.module_choices(junk, junk, junk, junk)
        assert len(options) == len(RECOMPUTE_MODULES) and value == [] and hint
        assert ED.model_reasons(junk) == ({}, ED.NO_MOE)

    def test_the_panel_starts_with_no_module_and_no_moe_overlap(self):
        found = {}

        def walk(c):
            if getattr(c, "id", None) in ("layout-recompute-modules", "layout-overlap"):
                found[c.id] = c
            kids = getattr(c, "children", None)
            for ch in kids if isinstance(kids, list) else []:
                walk(ch)

        walk(ED.layout_panel())
        mods = found["layout-recompute-modules"]
        assert mods.value == [] and all(o["disabled"] for o in mods.options)
        assert "moe_comm_overlap" not in found["layout-overlap"].value


# --------------------------------------------------------------------------- applying


class TestApplying:
    def test_recompute_moe_trades_time_for_memory(self, ep16):
        new, msg = _apply(ep16, recompute="selective", **{"recompute_modules": ["moe"]})
        assert "recompute selective (moe)" in msg, msg
        s = ST.page_strategy(new)
        assert (s.recompute, s.recompute_modules) == ("selective", ("moe",))
        assert new["strategy"]["recompute_modules"] == ["moe"]  # (the stored strategy: links, Compare)
        plain, _ = _apply(ep16, recompute="selective")  # Megatron's default: core_attn
        (t0, m0), (t1, m1) = _cost(plain), _cost(new)
        assert t1 > t0 and m1 < m0  # the MoE layers run their forward again and keep nothing

    def test_recompute_moe_act_saves_memory_at_no_time(self, ep16):
        new, msg = _apply(ep16, recompute="selective", **{"recompute_modules": ["moe_act"]})
        assert ST.page_strategy(new).recompute_modules == ("moe_act",), msg
        plain, _ = _apply(ep16, recompute="selective")
        (t0, m0), (t1, m1) = _cost(plain), _cost(new)
        assert t1 == t0 and m1 < m0  # (the activation's recomputation, a pointwise kernel, is not timed)

    def test_moe_overlap_hides_the_all_to_alls(self, ep16):
        new, msg = _apply(ep16, overlap=["overlap_grad_reduce", "moe_comm_overlap"])
        assert "MoE all-to-all overlap" in msg, msg
        s = ST.page_strategy(new)
        assert s.moe_comm_overlap is True and new["strategy"]["moe_comm_overlap"] is True
        assert s.pipeline.microbatches == 4
        (t0, m0), (t1, m1) = _cost(ep16), _cost(new)
        assert t1 < t0 and m1 == m0
        assert "moe_comm_overlap" in ED.panel_values(new)["overlap"]

    def test_all_overlap_off_turns_it_off(self, ep16):
        on, _ = _apply(ep16, overlap=["overlap_grad_reduce", "moe_comm_overlap"])
        off, msg = _apply(on, overlap=[])
        s = ST.page_strategy(off)
        assert not s.moe_comm_overlap and not s.overlap_grad_reduce, msg
        assert ED.panel_values(off)["overlap"] == []

    def test_the_defaults_record_nothing(self):
        assert PNL.layout_options("megatron", {"recompute_modules": [], "overlap": ["overlap_grad_reduce"]}) == {}


class TestInvalidCombinationsAreRefused:
    @pytest.mark.parametrize("form, match", [
        ({"recompute_modules": ["moe"]}, "recompute_modules moe: needs recompute selective"),
        ({"recompute": "full", "recompute_modules": ["moe"]}, "needs recompute selective (Megatron's "
                                                             "--recompute-granularity selective), got 'full'"),
        ({"recompute": "selective", "recompute_modules": ["attn"]}, "is not a list of core_attn, mlp, moe"),
        ({"recompute": "selective", "recompute_modules": ["mla_up_proj"]},
         "recompute module mla_up_proj: moe has no multi-head latent attention (MLA)"),
        ({"kind": "fsdp", "ep": None, "recompute": "selective", "recompute_modules": ["moe"]},
         "fsdp does not take recompute modules"),
        ({"kind": "fsdp", "ep": None, "overlap": ["overlap_grad_reduce", "moe_comm_overlap"]}, "fsdp does not take moe comm overlap (pick megatron for it)"),
    ])
    def test_moe_model(self, ep16, form, match):
        kept = copy.deepcopy(ep16)
        new, msg = _apply(ep16, **form)
        assert new is ep16 and new == kept, msg
        assert msg.startswith("Layout refused: ") and match in msg and "Traceback" not in msg, msg

    @pytest.mark.parametrize("form, match", [
        ({"recompute": "selective", "recompute_modules": ["moe"]},
         "recompute module moe: gpt2 has no mixture-of-experts layers"),
        ({"overlap": ["overlap_grad_reduce", "moe_comm_overlap"]}, "MoE all-to-all overlap (--overlap-moe-expert-parallel-comm): gpt2 has no "
                                       "mixture-of-experts layers"),
    ])
    def test_dense_model(self, dense, form, match):
        kept = copy.deepcopy(dense)
        new, msg = EV.on_event("layout-apply", dense, layout={"kind": "megatron", **form})
        assert new is dense and new == kept, msg
        assert msg.startswith("Layout refused: ") and match in msg, msg


# --------------------------------------------------------------------------- the page's state


class TestRoundTrips:
    FORM = {"recompute": "selective", "recompute_modules": ["moe", "moe_act"],
            "overlap": ["overlap_grad_reduce", "moe_comm_overlap"]}

    def test_the_stored_state_and_the_panel(self, ep16):
        new, msg = _apply(ep16, **self.FORM)
        stored = json.loads(json.dumps(new))  # (what the browser keeps and sends back)
        ST.check_state(stored)
        s = ST.page_strategy(stored)
        assert (s.recompute_modules, s.moe_comm_overlap) == (("moe", "moe_act"), True), msg
        v = ED.panel_values(stored)
        assert (v["recompute"], v["recompute_modules"], v["overlap"]) == ("selective", ["moe", "moe_act"],
                                                                          self.FORM["overlap"])
        assert "recompute modules moe,moe_act" in v["hint"] and "MoE all-to-all overlap" in v["hint"]
        again, _ = _apply(ep16, **{k: v[k] for k in ("recompute", "recompute_modules", "overlap")})
        assert again["strategy"] == new["strategy"]  # the panel's values apply to the same strategy

    def test_a_share_link_and_another_cluster_size_keep_them(self):
        """A share link names a sample model (an upload is not shared): Mixtral, tp 2 x ep 8."""
        start = ST.new_state("mixtral-8x7b", "dgx-h100:8", "data-parallel", batch=64, seq_len=1024)
        new, msg = EV.on_event("layout-apply", start, layout={"kind": "megatron", "tp": 2, "ep": 8, "zero_stage": 1,
                                                              "flags": ["sequence_parallel"], **self.FORM})
        assert new is not start, msg
        linked, said = LNK.state_from_query(LNK.share_query(new))
        s = ST.page_strategy(linked)
        assert (s.recompute_modules, s.moe_comm_overlap) == (("moe", "moe_act"), True), said
        assert ED.panel_values(linked)["recompute_modules"] == ["moe", "moe_act"]
        bigger, msg = EV.on_event("pick-cluster", new, cluster="dgx-h100:16")
        s = ST.page_strategy(bigger)
        assert s.cluster_devices == 128 and "(kept)" in msg, msg
        assert (s.recompute_modules, s.moe_comm_overlap) == (("moe", "moe_act"), True)
