"""Issue 44: ``soapbox plan`` -- the best layout on each cluster for a token budget, with
tokens/s per GPU, MFU, days, GPU-hours and cost at a given price per GPU-hour."""

from __future__ import annotations

import json

import pytest

from engine.cli import main
from engine.cluster import preset
from engine.formats import resolve_model
from engine.sim.report import model_flops
from engine.studies.plan import best_per_cluster, parse_prices, plan_rows, plan_table


def _row(cluster, gpus, tps, feasible=True, t=2.0, why=None, tp=1):
    return {"cluster": cluster, "gpus": gpus, "tp": tp, "pp": 1, "cp": 1, "dp": gpus // tp, "mb": 1, "zero": 1,
            "recompute": "selective", "sp": tp > 1, "ep": 1, "etp": 1, "feasible": feasible, "iteration_time_s": t,
            "throughput_per_s": tps, "peak_memory_bytes": 40e9, "why": why}


def test_each_cluster_gets_its_fastest_feasible_layout_priced_by_hand():
    rows = [_row("dgx-h100:1", 8, 8_000.0), _row("dgx-h100:1", 8, 9_000.0, feasible=False, why="over"),
            _row("dgx-h100:1", 8, 6_000.0, tp=2), _row("dgx-a100-80gb:2", 16, 5_000.0, t=3.0),
            _row("dgx-b200:1", 8, 1.0, feasible=False, why="needs 200 GB on a GPU")]
    plans = best_per_cluster("gpt2", rows, ["dgx-h100:1", "dgx-a100-80gb:2", "dgx-b200:1"], 1.44e9,
                             {"dgx-h100": 2.0, "dgx-a100-80gb": 1.0})
    h100, a100, b200 = (next(p for p in plans if p["cluster"] == c) for c in ("dgx-h100:1", "dgx-a100-80gb:2",
                                                                              "dgx-b200:1"))
    # 1.44e9 tokens at 8,000 tokens/s: 180,000 s = 50 h = 2.0833 days; 8 GPUs: 400 GPU-hours, at 2.0: 800
    assert h100["tokens_per_s_per_gpu"] == 1_000.0 and h100["days"] == pytest.approx(50 / 24)
    assert h100["gpu_hours"] == pytest.approx(400.0) and h100["cost"] == pytest.approx(800.0)
    assert h100["layout"] == "tp 1, pp 1, dp 8, mb 1, selective recompute, ZeRO-1"
    assert h100["feasible_layouts"] == 2 and h100["layouts"] == 3
    # 5,000 tokens/s on 16 GPUs: 288,000 s = 80 h; 1,280 GPU-hours at 1.0
    assert a100["gpu_hours"] == pytest.approx(1280.0) and a100["cost"] == pytest.approx(1280.0)
    g, c = resolve_model("gpt2"), preset("dgx-h100:1")
    assert h100["mfu"] == pytest.approx(model_flops(g) / (2.0 * 8 * c.device_type(0).peak(g.precision)))
    assert b200["days"] is None and b200["why"].startswith("no layout fits (1 tried; e.g. needs 200 GB")
    assert [p["cluster"] for p in plans] == ["dgx-h100:1", "dgx-a100-80gb:2", "dgx-b200:1"]  # cheapest first
    table = plan_table(plans, 1.44e9)
    assert "| dgx-h100:1 | 8 | tp 1, pp 1, dp 8" in table and "| 800 |" in table


def test_prices_are_checked():
    assert parse_prices(["dgx-h100:8=2.5"]) == {"dgx-h100": 2.5}
    for bad in ("dgx-h100", "dgx-h100=-1", "dgx-h100=nan", "=2", "dgx-h100=inf", "dgx-h100=abc"):
        with pytest.raises(ValueError, match="GPU_TYPE=PRICE"):
            parse_prices([bad])


def test_a_model_without_tokens_is_refused():
    with pytest.raises(ValueError, match="not a language model"):
        best_per_cluster("alexnet", [], ["p100-4x4"], 1e9)


def test_plan_rows_fall_back_to_full_recomputation_only_where_selective_does_not_fit():
    rows = plan_rows("gpt2", ["dgx-a100-80gb:1"], batch=16, backend="serial")
    assert rows and all(r["zero"] == 1 and r["sp"] == (r["tp"] > 1) for r in rows)
    selective = [r for r in rows if r["recompute"] == "selective"]
    full = [r for r in rows if r["recompute"] == "full"]
    over = [r for r in selective if not r["feasible"] and (r["iteration_time_s"] or r["memory_floor_bytes"])]
    assert len(full) == len(over)


def test_a_layout_sure_not_to_fit_with_selective_recomputation_is_tried_with_full():
    """A row its memory floor refused (not simulated) was built and does not fit: the plan tries
    it again with full recomputation, as it does a simulated one."""
    from engine.studies.plan import _retry_full

    assert _retry_full({"feasible": False, "iteration_time_s": None, "memory_floor_bytes": 9e10})
    assert _retry_full({"feasible": False, "iteration_time_s": 1.5, "memory_floor_bytes": None})
    assert not _retry_full({"feasible": False, "iteration_time_s": None, "memory_floor_bytes": None})  # (not built)
    assert not _retry_full({"feasible": True, "iteration_time_s": 1.5, "memory_floor_bytes": None})


def test_the_cli_prints_the_table_and_json(capsys, tmp_path):
    fig = tmp_path / "plan.html"
    assert main(["plan", "--model", "gpt2", "--batch", "16", "--clusters", "dgx-a100-80gb:1 dgx-h100:1",
                 "--tokens", "1e9", "--price", "dgx-h100=2.5", "--backend", "serial", "--figure", str(fig)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Training 1e+09 tokens:") and "| dgx-h100:1 | 8 |" in out and "| 2.50 |" in out
    assert fig.read_text().count("plotly") > 0
    assert main(["plan", "--model", "gpt2", "--batch", "16", "--clusters", "dgx-h100:1", "--tokens", "1e9",
                 "--backend", "serial", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (p,) = data["plans"]
    assert p["cluster"] == "dgx-h100:1" and p["cost"] is None and p["days"] > 0 and 0 < p["mfu"] < 1
