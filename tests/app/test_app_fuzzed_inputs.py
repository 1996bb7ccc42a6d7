"""Inputs a fuzzing review of the page found mishandled (2026-12-01): each is refused with its
reason, or told as it is, and the user's state is kept."""

from __future__ import annotations

import pytest

from app import events as EV
from app import planjob
from app import simulation as SIM
from app import state as ST
from app.gantt_figure import gantt_notes
from app.fmt import parse_count
from app.tabs import timeline as TL


def test_a_decimal_comma_is_refused_not_read_as_a_separator():
    """"1,5T" was read as 15T: days, GPU-hours and cost ten times what was meant."""
    assert parse_count("1,000,000") == 1e6 and parse_count("12,345.5B") == 12_345.5e9 and parse_count("1.5T") == 1.5e12
    for text in ("1,5T", "0,5T", "1,00", "12,34,567"):
        with pytest.raises(ValueError, match="decimal point, not a comma"):
            parse_count(text)
    with pytest.raises(ValueError, match="at most 40 characters"):
        parse_count(" " * 40 + "1T")


def test_long_gpu_counts_and_prices_are_refused_not_cut():
    """Cut to their limit, " " x 198 + "160" read as 16 GPUs and a price 4.99 as 4."""
    with pytest.raises(ValueError, match="at most 200 characters"):
        planjob.plan_clusters(["dgx-h100"], " " * 198 + "160")
    assert planjob.plan_clusters(["dgx-h100"], "16")[0] == ["dgx-h100:2"]
    with pytest.raises(ValueError, match="at most 400 characters"):
        planjob.parse_price_text("dgx-h100=2.49," + " " * 375 + "dgx-b200=4.99")
    with pytest.raises(ValueError, match="from 0 to 1,000,000"):  # (its cost overflowed to a dash)
        planjob.parse_price_text("dgx-h100=1e308")


@pytest.mark.parametrize("layout, says", [
    ({"flags": "sequence_parallel"}, "flags: a list of the ticked flags"),
    ({"recompute": "selective", "recompute_modules": "mlp"}, "recompute modules: a list of names"),
    ({"tp": True}, "is not a whole number"),
    (None, "must be fields and values"),
    (["tp", 2], "must be fields and values"),
])
def test_a_crafted_layout_form_is_refused_and_the_state_kept(layout, says):
    """A flag sent as one string was dropped (another layout simulated); a form that is not a
    dict was read as empty (the default layout replaced the user's)."""
    s = ST.new_state("gpt2", "dgx-h100:2", batch=16)
    new, msg = EV.on_event("layout-apply", s, layout=layout)
    assert new is s and msg.startswith("Layout refused") and says in msg


def test_an_undo_history_of_another_strategy_is_cleared():
    """It answered the same error at every undo and stayed on the stack."""
    s = dict(ST.new_state("gpt2", "dgx-h100:2", batch=16), undo=[[{"op": "conv1", "before": {}, "after": {}}]])
    new, msg = EV.on_event("undo", s)
    assert "edit history was cleared" in msg and new["undo"] == [] and new["redo"] == []
    assert EV.on_event("undo", new)[1] == "Nothing to undo."


def test_the_timeline_says_why_rows_are_missing():
    """Rows cut at the row cap or hidden by a filter were put down to identical GPUs, and link
    rows a filter hid to an unticked option."""
    s = ST.new_state("gpt2", "dgx-h100:2", "megatron", batch=16)
    s, _ = EV.on_event("layout-apply", s, layout={"pp": 2})
    ws = SIM.workspace(s)
    note = TL.gantt_view(ws, [], None, {"links": "on", "filter": "0-3"})[1]
    assert "1 row hidden by the filter" in note and "link rows hidden by the filter" in note
    assert "tick 'link rows'" not in note
    assert "identical GPUs drawn once" in TL.gantt_view(ws, [], None, {"rows": "gpu"})[1]
    base = dict(merged=False, tasks_in_view=10, rows="gpu", gpu_rows=128, gpus_in_plan=256, gpus_mirrored=0,
                rows_filtered=0, rows_cut=128, links_filtered=0, links_hidden=0, bubble=None)
    note = gantt_notes(base)
    assert "the first 128 rows drawn, 128 more left out" in note and "identical" not in note


def test_a_comparison_row_opens_under_the_clusters_own_name():
    """"dgx-h100:0002" opened the page on a cluster named so, not dgx-h100:2."""
    s = ST.new_state("gpt2", "dgx-h100:1", batch=16)
    row = {"cluster": "dgx-h100:0002", "options": {"tp": 1, "pp": 1}, "model": s["model"]}
    new, msg = EV.on_event("plan-open", s, plan=row)
    assert new["cluster"]["name"] == "dgx-h100:2" and "dgx-h100:2" in msg
    new, msg = EV.on_event("plan-open", s, plan=dict(row, cluster="dgx-h100:0"))
    assert new is s and "not a cluster a comparison prices" in msg


def test_time_ticks_never_repeat_a_label():
    """A window too narrow for its offset's digits (a zoom far past any iteration) gave the same
    label at every tick; huge ranges, 300-digit labels: Plotly's own ticks then."""
    from app.gantt_figure import time_ticks

    assert time_ticks(1e10, 1e10 + 1e-6) == {} and time_ticks(1e13, 1e13 + 10) == {}
    assert time_ticks(-1.7e308, 1.7e308) == {}  # (its step overflowed: an OverflowError)
    text = time_ticks(1e4, 1e4 + 1e-3)["ticktext"]
    assert len(set(text)) == len(text) > 1
    assert time_ticks(12.1, 12.4)["ticktext"][:3] == ["12.10 s", "12.15 s", "12.20 s"]
