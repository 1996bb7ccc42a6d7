"""Issue 25: the layout panel's overlap and offload switches say what the command line says
(``--[no-]overlap-*``, ``--no-overlap``, ``--offload-*``): each switch reaches the strategy, an
invalid combination is refused with the engine's reason and the strategy stays, the panel
shows the page's switches, and a state saved before the switches existed still loads.

The simulator's handling of the switches is not asserted here: the strategy's fields and the
messages are."""

from __future__ import annotations

import copy

import pytest

from app import actions as ACT
from app import panel as PNL
from app import events as EV
from app import links as LNK
from app import simulation as SIM
from app import state as ST
from app.tabs import editor as ED


#: the overlaps on by default, as the panel ticks them
DEFAULT_TICKED = ["overlap_grad_reduce"]
#: every overlap, in the record's order (moe_comm_overlap: mixture-of-experts models only)
ALL = ["tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "moe_comm_overlap"]


@pytest.fixture()
def gpt():
    return ST.new_state("gpt2", "dgx-a100-80gb:2", "data-parallel", batch=32)


def _apply(state, **form):
    return EV.on_event("layout-apply", state, layout={"kind": "megatron", **form})


class TestEachSwitchReachesTheStrategy:
    @pytest.mark.parametrize("form, field, value, said", [
        ({"overlap": []}, "overlap_grad_reduce", False, "grad-reduce overlap off"),
        ({"zero_stage": 1, "overlap": ["overlap_grad_reduce", "overlap_param_gather"]}, "overlap_param_gather", True, "param-gather overlap"),
        ({"tp": 2, "flags": ["sequence_parallel"], "overlap": ["tp_comm_overlap", "overlap_grad_reduce"]}, "tp_comm_overlap", True, "tp comm overlap"),
        ({"zero_stage": 1, "offload_optimizer": "cpu"}, "offload_optimizer", "cpu", "optimizer offloaded to CPU"),
        ({"zero_stage": 2, "offload_optimizer": "nvme"}, "offload_optimizer", "nvme", "optimizer offloaded to NVMe"),
    ])
    def test_megatron(self, gpt, form, field, value, said):
        new, msg = _apply(gpt, **form)
        assert new is not gpt and msg.startswith("Layout (megatron)") and said in msg, msg
        s = ST.page_strategy(new)
        assert getattr(s, field) == value
        assert new["strategy"][field] == value  # (the stored strategy: links, the store, Compare)
        assert ED.panel_values(new)["hint"].count(said) == 1  # the panel's summary says it too

    def test_fsdp_offloads_parameters(self, gpt):
        new, msg = EV.on_event("layout-apply", gpt, layout={"kind": "fsdp", "offload_optimizer": "cpu",
                                                           "offload_params": "nvme"})
        s = ST.page_strategy(new)
        assert (s.zero_stage, s.offload_optimizer, s.offload_params) == (3, "cpu", "nvme"), msg
        assert "optimizer offloaded to CPU, parameters offloaded to NVMe" in msg
        v = ED.panel_values(new)
        assert (v["offload_optimizer"], v["offload_params"]) == ("cpu", "nvme")

    def test_the_optimizer_state_reaches_the_strategy_and_back(self):
        """The panel's optimizer-state drop-down (issue 42) on a bf16 model: the strategy keeps
        it, the stored strategy too, and the panel shows it again."""
        llama = ST.new_state("llama2-7b", "dgx-h100:1", "data-parallel", batch=8)
        new, msg = _apply(llama, zero_stage=1, optimizer_state="bf16-moments")
        assert new is not llama, msg
        assert ST.page_strategy(new).optimizer_state == "bf16-moments"
        assert new["strategy"]["optimizer_state"] == "bf16-moments"
        assert ED.panel_values(new)["optimizer_state"] == "bf16-moments"
        assert ED.panel_values(llama)["optimizer_state"] == "fp32"

    def test_kernels_and_offloaded_layers_reach_the_strategy_and_back(self):
        """The panel's kernels drop-down and offloaded-layers box (issue 42): the strategy keeps
        them, the stored strategy too, and the panel shows them again."""
        llama = ST.new_state("llama2-7b", "dgx-h100:1", "data-parallel", batch=8)
        new, msg = _apply(llama, kernels="eager", offload_activations=4, micro_batch=1)
        assert new is not llama, msg
        s = ST.page_strategy(new)
        assert (s.kernels, s.offload_activations) == ("eager", 4)
        assert (new["strategy"]["kernels"], new["strategy"]["offload_activations"]) == ("eager", 4)
        v = ED.panel_values(new)
        assert (v["kernels"], v["offload_activations"]) == ("eager", 4)
        assert ED.panel_values(llama)["kernels"] == "fused"

    def test_the_fp8_library_reaches_the_strategy_and_back(self):
        """The panel's fp8-library drop-down (issue 42): torchao's fp8 keeps the bf16 inputs,
        and without fp8 the choice is refused with the reason."""
        llama = ST.new_state("llama2-7b", "dgx-h100:1", "data-parallel", batch=8)
        new, msg = _apply(llama, flags=["fp8"], fp8_library="torchao")
        assert new is not llama, msg
        assert ST.page_strategy(new).fp8_library == "torchao"
        assert new["strategy"]["fp8_library"] == "torchao"
        assert ED.panel_values(new)["fp8_library"] == "torchao"
        assert ED.panel_values(llama)["fp8_library"] == "te"
        same, msg = _apply(llama, fp8_library="torchao")
        assert same is llama and "set fp8 too" in msg

    def test_offloading_with_a_pipeline_is_refused_with_megatrons_reason(self):
        llama = ST.new_state("llama2-7b", "dgx-h100:1", "data-parallel", batch=8)
        new, msg = _apply(llama, pp=2, micro_batch=1, offload_activations=2)
        assert new is llama and "without pipeline parallelism" in msg

    def test_all_overlap_off(self, gpt):
        new, msg = _apply(gpt, pp=2, micro_batch=1, overlap=[])
        s = ST.page_strategy(new)
        assert not any(getattr(s, name) for name in PNL.OVERLAPS), msg
        assert ED.panel_values(new)["overlap"] == []

    def test_defaults_when_the_form_does_not_say(self, gpt):
        """A form without the switches (the guided tour's, an older page's) and one with the
        defaults ticked both give the layout's defaults, and no option is recorded for them."""
        for form in ({}, {"overlap": ["overlap_grad_reduce"], "offload_optimizer": "none", "offload_params": None},
                     {"overlap": "junk"}):
            assert PNL.layout_options("megatron", form) == {}
        new, msg = _apply(gpt, tp=2)
        s = ST.page_strategy(new)
        assert all(getattr(s, name) == PNL.SWITCHES[name] for name in PNL.SWITCHES)
        assert (s.overlap_grad_reduce, s.overlap_param_gather, s.offload_optimizer) == (True, False, "none")
        assert "overlap" not in msg and "offload" not in msg
        assert ED.panel_values(new)["overlap"] == DEFAULT_TICKED

    def test_an_unknown_flag_is_refused_by_name(self, gpt):
        """A flag the panel does not have (a crafted form, a script's shorthand) is refused with
        its name: dropped silently, the page would simulate another layout than the one asked."""
        with pytest.raises(ValueError, match="'sp' is not one of sequence_parallel, fp8"):
            PNL.layout_options("megatron", {"tp": 2, "flags": ["sp"]})
        new, msg = _apply(gpt, tp=2, flags=["sp"])
        assert new is gpt and msg.startswith("Layout refused") and "'sp'" in msg

    def test_a_field_the_panel_does_not_have_is_refused_by_name(self, gpt):
        """``mb`` for ``micro_batch`` (the explorer benchmark's own slip: its micro-batch was the
        builder's default, silently) is refused with the panel's field names."""
        with pytest.raises(ValueError, match="no field 'mb'.*micro_batch"):
            PNL.layout_options("megatron", {"tp": 2, "mb": 2})
        new, msg = _apply(gpt, tp=2, mb=2)
        assert new is gpt and msg.startswith("Layout refused") and "'mb'" in msg

    def test_a_switch_alone_is_a_new_simulation(self, gpt):
        """Same configs, one switch changed: the page's strategy differs in its settings, so the
        session's simulation is not reused for it, nor an undo step recorded as op edits."""
        a, _ = _apply(gpt, tp=2)
        b, _ = _apply(a, tp=2, overlap=[])
        sa, sb = ST.page_strategy(a), ST.page_strategy(b)
        assert sa.configs == sb.configs and not ST.same_settings(sa, sb)
        assert b["undo"] == []
        assert SIM.workspace(b).strategy.overlap_grad_reduce is False


class TestInvalidCombinationsAreRefused:
    @pytest.mark.parametrize("kind, form, match", [
        ("megatron", {"offload_optimizer": "cpu"}, "offload_optimizer cpu: offloading the optimizer needs ZeRO stage 1 "
                                             "or above (DeepSpeed's rule), got 0"),
        ("fsdp", {"zero_stage": 2, "offload_params": "cpu"}, "offload_params cpu: offloading parameters needs ZeRO stage 3"),
        ("megatron", {"zero_stage": 3, "offload_params": "cpu"}, "megatron does not take offload params (pick fsdp for it)"),
        ("megatron", {"offload_optimizer": "disk", "zero_stage": 1}, "offload_optimizer: 'disk' is not one of none, cpu, nvme"),
        ("megatron", {"tp": 2, "overlap": ["tp_comm_overlap"]}, "needs sequence parallel"),
        ("megatron", {"zero_stage": 3, "overlap": ["overlap_param_gather"]}, "parameter gather overlap applies to the ZeRO 1 or 2"),
        ("fsdp", {"zero_stage": 1, "overlap": ["overlap_param_gather"]},
         "fsdp does not take overlap param gather (pick megatron for it)"),
        ("fsdp", {"tp": 2, "overlap": ["tp_comm_overlap"]}, "needs sequence parallel"),
        ("fsdp", {"vpp": 2, "pp": 2}, "fsdp does not take vpp"),
    ])
    def test_the_reason_and_nothing_changes(self, gpt, kind, form, match):
        before, _ = _apply(gpt, tp=2)
        kept = copy.deepcopy(before)
        new, msg = EV.on_event("layout-apply", before, layout={"kind": kind, **form})
        assert new is before and new == kept, msg
        assert msg.startswith("Layout refused: ") and match in msg and "Traceback" not in msg, msg


class TestThePanel:
    def test_overlaps_disabled_with_the_reason_where_they_do_not_apply(self):
        options, ticked = ED.overlap_choices("megatron", [], None, None, ALL)
        off = {o["value"]: o["title"] for o in options if o["disabled"]}
        assert set(off) == {"tp_comm_overlap", "overlap_param_gather", "moe_comm_overlap"}
        assert "needs sequence parallel" in off["tp_comm_overlap"] and "ZeRO 1 or 2" in off["overlap_param_gather"]
        assert ticked == DEFAULT_TICKED
        options, ticked = ED.overlap_choices("megatron", ["sequence_parallel"], 1, 4, ALL, moe_why=None)
        assert not any(o["disabled"] for o in options) and ticked == ALL
        options, _ = ED.overlap_choices("fsdp", [], None, 2, [])  # fsdp: ZeRO 3 by default
        assert [o["value"] for o in options if o["disabled"]] == ["tp_comm_overlap", "overlap_param_gather",
                                                                 "moe_comm_overlap"]

    def test_all_overlap_off_unticks_all(self):
        _, ticked = ED.overlap_choices("megatron", ["sequence_parallel"], 1, 4, ALL, all_off=True)
        assert ticked == []

    def test_the_four_overlaps(self):
        assert [o["value"] for o in ED.overlap_choices("megatron", [], 0, 1, [])[0]] == ALL

    @pytest.mark.parametrize("junk", [None, "x", 3.5, {"a": 1}, [None, 1, ["p2p"]], float("nan"), True])
    def test_any_value_from_the_page(self, junk):
        options, ticked = ED.overlap_choices(junk, junk, junk, junk, junk)
        assert len(options) == len(ALL) and set(ticked) <= set(DEFAULT_TICKED)

    def test_the_panel_starts_at_the_layout_s_defaults(self):
        panel = ED.layout_panel()
        found = {}

        def walk(c):
            if getattr(c, "id", None) in ("layout-overlap", "layout-offload-optimizer", "layout-offload-params"):
                found[c.id] = c.value
            for ch in (getattr(c, "children", None) or []) if isinstance(getattr(c, "children", None), list) else []:
                walk(ch)

        walk(panel)
        assert found == {"layout-overlap": DEFAULT_TICKED, "layout-offload-optimizer": "none",
                         "layout-offload-params": "none"}


class TestSavedStates:
    def test_an_old_state_without_the_switches_loads_with_the_defaults(self, gpt):
        new, _ = _apply(gpt, tp=2, zero_stage=1)
        old = copy.deepcopy(new)
        for k in PNL.SWITCHES:
            old["strategy"].pop(k, None)
            old["strategy"]["found_by"]["options"].pop(k, None)
            old["strategy"]["found_by"]["options"]["given"].pop(k, None)
        ST.check_state(old)
        s = ST.page_strategy(old)
        assert all(getattr(s, k) == v for k, v in PNL.SWITCHES.items())
        v = ED.panel_values(old)
        assert (v["overlap"], v["offload_optimizer"], v["offload_params"], v["tp"]) == (DEFAULT_TICKED, "none", "none", 2)
        assert SIM.workspace(old).timeline.makespan_s > 0

    def test_a_state_with_the_switches_passes_the_schema(self, gpt):
        new, _ = EV.on_event("layout-apply", gpt, layout={"kind": "fsdp", "overlap": [], "offload_optimizer": "cpu",
                                                         "offload_params": "cpu"})
        ST.check_state(new)
        assert {"overlap_grad_reduce", "offload_optimizer", "offload_params"} <= set(new["strategy"])

    def test_a_share_link_keeps_the_switches(self, gpt):
        new, _ = _apply(gpt, tp=2, zero_stage=1, overlap=[], **{"offload_optimizer": "nvme"})
        t, _ = LNK.state_from_query(LNK.share_query(new))
        s = ST.page_strategy(t)
        assert (s.overlap_grad_reduce, s.offload_optimizer, s.zero_stage) == (False, "nvme", 1)

    def test_another_cluster_keeps_the_switches(self, gpt):
        new, _ = _apply(gpt, tp=2, zero_stage=1, overlap=[], **{"offload_optimizer": "cpu"})
        moved, msg = EV.on_event("pick-cluster", new, cluster="dgx-a100-80gb:4")
        s = ST.page_strategy(moved)
        assert (s.overlap_grad_reduce, s.offload_optimizer) == (False, "cpu"), msg
        assert "grad-reduce overlap off, optimizer offloaded to CPU) (kept)" in msg


def test_fsdp_takes_tensor_parallelism_with_sequence_parallel_and_its_overlap(gpt):
    """torchtitan's 2-D layout: FSDP with tp, sequence-parallel norms and async TP."""
    new, msg = EV.on_event("layout-apply", gpt, layout={"kind": "fsdp", "tp": 2, "flags": ["sequence_parallel"],
                                                           "overlap": ["tp_comm_overlap", "overlap_grad_reduce"]})
    assert "refused" not in msg, msg
    s = ST.page_strategy(new)
    assert (s.zero_stage, s.sequence_parallel, s.tp_comm_overlap) == (3, True, True)
