"""Issue 24, part 6: the page's state says what it shows — a layout survives a change of
cluster (or says why it cannot), the layout panel shows the page's layout whatever set it,
idle GPUs are named and paid for, the pipeline's idle time is split into the schedule's bubble
and the rest, and the timeline filter's own examples match rows."""

from __future__ import annotations

import re

from app import actions as ACT
from app import events as EV
from app import state as ST
from app.tabs import editor as ED
from app.tabs import explore as EXP
from app.tabs import learn as LRN
from app.tabs import timeline as TL
from app import simulation as SIM


def _layout(model="gpt2", cluster="dgx-a100-80gb:2", **form):
    s = ST.new_state(model, cluster, batch=64)
    s, msg = ACT.apply_layout(s, "megatron", form)
    assert msg.startswith("Layout (megatron)"), msg
    return s


class TestClusterChange:
    def test_the_layout_is_built_again_on_the_new_cluster(self):
        s = _layout(tp=4, pp=2)
        new, msg = EV.on_event("pick-cluster", s, cluster="dgx-a100-80gb:4")
        assert msg == "Cluster: dgx-a100-80gb:4, under the layout megatron (tp 4, pp 2) (kept)."
        strat = ST.page_strategy(new)
        assert strat.pipeline.stages == 2 and new["baseline"] == "megatron"
        assert strat.found_by["options"]["tp"] == 4 and strat.found_by["options"]["dp"] == 4  # 32 GPUs

    def test_a_layout_that_cannot_run_there_says_why(self):
        s = _layout(tp=4, pp=4)  # 16 GPUs
        new, msg = EV.on_event("pick-cluster", s, cluster="dgx-a100-80gb:1")  # 8 GPUs
        assert msg.startswith("Cluster: dgx-a100-80gb:1, under data-parallel: megatron (tp 4, pp 4) cannot run here (")
        assert new["baseline"] == "data-parallel" and ST.page_strategy(new).pipeline.stages == 1
        assert ED.panel_values(new)["pp"] is None  # the panel follows: no stale pp 2

    def test_a_plain_baseline_is_kept_by_name(self, alex):
        new, msg = EV.on_event("pick-cluster", alex, cluster="dgx-a100-80gb:1")
        assert msg == "Cluster: dgx-a100-80gb:1." and new["baseline"] == "data-parallel"


class TestLayoutPanel:
    def test_shows_the_layout_after_the_tour(self):
        s, _ = LRN.tour(None, "pipeline")
        v = ED.panel_values(s)
        assert v["kind"] == "megatron" and v["pp"] == 4 and v["micro_batch"] == 1 and v["schedule"] == "1f1b"
        assert "32 microbatches" in v["hint"]

    def test_shows_the_layout_of_a_shared_link(self):
        from app import links as LNK

        s = _layout(tp=2, pp=2, vpp=2)
        t, _ = LNK.state_from_query(LNK.share_query(s))
        v = ED.panel_values(t)
        assert (v["tp"], v["pp"], v["vpp"], v["schedule"]) == (2, 2, 2, "interleaved")

    def test_a_strategy_without_a_layout_empties_it_and_says_why(self, alex):
        edited, _ = ACT.apply_edit(alex, ["fc6"], {"feature": 4}, [0, 1, 2, 3])
        v = ED.panel_values(edited)
        assert all(v[k] is None for k in ("tp", "pp", "cp", "vpp", "micro_batch"))
        assert v["hint"].startswith("The strategy shown (hand-edited) is not a layout")


class TestWhatTheSummarySays:
    def test_idle_gpus_are_named_and_counted_in_gpu_hours(self):
        s = ST.new_state("alexnet", batch=12)  # data parallel: 12 of the 16 GPUs
        out = EXP.render_explore(s, True)
        assert "4 of the cluster's 16 GPUs are left idle" in out["why"]
        assert out["rate"]["gpus"] == 12 and out["rate"]["cluster_gpus"] == 16
        est = EXP.train_estimate(out["rate"], "1M")
        hours = float(re.search(r"\(([\d,.]+) GPU-hours\)", est).group(1).replace(",", ""))
        seconds = 1e6 / out["rate"]["per_s"]
        assert "on 12 GPUs of 16 (4 idle, counted in the GPU-hours)" in est
        assert abs(hours - seconds * 16 / 3600) <= 0.5 + 1e-9  # (shown rounded to whole hours)

    def test_bubble_and_imbalance_apart(self):
        s, _ = LRN.tour(None, "pipeline")
        out = EXP.render_explore(s, True)
        m = re.search(r"GPUs idle (\d+)% of the time before the last backward: the pipeline schedule's bubble "
                      r"accounts for (\d+)%, stage imbalance and waits for transfers for the other (\d+)%", out["why"])
        assert m, out["why"]
        idle, bubble, rest = (int(x) for x in m.groups())
        assert bubble == 9 and abs(idle - bubble - rest) <= 1 and rest > bubble  # GPT-2: mostly imbalance
        assert "more from stage imbalance" in out["gantt-notes"]


def test_the_filter_placeholder_s_examples_match_rows():
    """Each example the filter box shows matches rows of a 2-node pipeline plan."""
    s = _layout(tp=4, pp=2)
    ws = SIM.workspace(s)
    placeholder = TL.layout().children[1].children[-1].placeholder
    examples = [x.strip() for x in placeholder.split(":", 1)[1].split(",")]
    assert len(examples) == 4
    for ex in examples:
        _, notes = TL.gantt_view(ws, [], None, {"filter": ex})
        assert "No row matches" not in notes and "Filter ignored" not in notes, ex
