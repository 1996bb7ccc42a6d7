"""Accuracy guard: the simulator's predictions of the public published runs must not regress.

Every row of ``tests/data/published_runs_public.csv`` (the rows of
``validation/published_runs_public.csv`` before row 3000, byte for byte: Megatron-LM SC'21 and
2019, MosaicML's MPT runs on A100-40GB and H100-80GB) is predicted by ``benchmarks/validate_published.py`` from
what the row states. The in-sample rows are those ``benchmarks/calibrate.py`` fits its
constants on; the others are held out. The bounds are on aggregates, computed here from the
simulator, never per row; they sit a little above today's figures (BENCHMARKS.md) so that
noise-free changes of physics that make predictions worse fail here.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/
sys.path.insert(0, str(HERE.parent / "benchmarks"))

from validate_published import Predictor, calibration_rows  # noqa: E402

CSV = HERE / "data" / "published_runs_public.csv"

#: (today's figure) -> bound. Issue 25 moved them: the sustained share of the H100 is fitted on
#: today's stacks (Megatron-Bridge / NeMo, 2024-25: 0.89), which MosaicML's 2023 H100 runs on
#: early Hopper kernels do not reach (alone they want 0.57): those rows are now predicted
#: too fast (docs/benchmarks/2026-11-26-issue-25-training-stacks.md). Before issue 25:
#: 2.5 / 5.2 / 49.5 / 71.
IN_SAMPLE_MEDIAN_PCT = 16.0  # 13.9 (34 rows; SC'21 and MosaicML's 1-2 node runs, not all fitted now)
HELD_OUT_MEDIAN_PCT = 23.0  # 20.5
MAX_PCT = 75.0  # 71.3 (row 42, GPT-2 1.2B on one V100, Megatron 2019)
MIN_WITHIN_10_PCT = 28  # of 92 rows (30 today)


@pytest.fixture(scope="module")
def results():
    rows = list(csv.DictReader(CSV.open(newline="")))
    pred = Predictor(rows)
    fitted = {rid for ids in calibration_rows(rows).values() for rid in ids}
    out = [pred.run(r) for r in rows]
    return out, fitted


def errors(results, keep) -> list[float]:
    return [abs(r.error_pct) for r in results if keep(r)]


def test_every_public_row_is_predicted(results):
    out, _ = results
    assert [(r.row_id, r.skipped) for r in out if r.skipped or r.error_pct is None] == []
    assert len(out) == 92


def test_in_sample_median(results):
    out, fitted = results
    assert statistics.median(errors(out, lambda r: r.row_id in fitted)) <= IN_SAMPLE_MEDIAN_PCT


def test_held_out_median(results):
    out, fitted = results
    assert statistics.median(errors(out, lambda r: r.row_id not in fitted)) <= HELD_OUT_MEDIAN_PCT


def test_worst_row_and_rows_within_10_percent(results):
    out, _ = results
    errs = errors(out, lambda r: True)
    assert max(errs) <= MAX_PCT
    assert sum(e <= 10 for e in errs) >= MIN_WITHIN_10_PCT


def test_the_calibration_sets_are_named_rows_of_the_file(results):
    """calibrate.py fits on rows the file has: 24 for A100, 10 for H100 (one and two nodes)."""
    out, fitted = results
    ids = {r.row_id for r in out}
    assert fitted <= ids and len(fitted) == 34


def test_the_guard_rows_are_the_in_repository_rows():
    """tests/data holds the older rows of validation/published_runs_public.csv unchanged (no
    test reads the shared folder outside the repository)."""
    ours = {r["row_id"]: r for r in csv.DictReader((HERE.parent / "validation" / CSV.name).open(newline=""))}
    rows = list(csv.DictReader(CSV.open(newline="")))
    assert all(ours.get(r["row_id"]) == r for r in rows)


#: Today's stacks (rows from 3000 on): family -> bound on the median |error| of its predicted
#: rows (today's figure in the comment), and on the runs that ran but are predicted out of memory
TODAY_MEDIAN_PCT = {"torchtitan": 8.0,  # 6.3
                    "torchtitan-community": 3.0,  # 0.9
                    "KempnerForge": 14.0,  # 12.0
                    "NeMo long-seq": 28.0,  # 25.0
                    "Megatron-Bridge": 15.0,  # 12.3
                    "Sailor": 52.0,  # 48.5 (small runs dominated by per-kernel host overhead, not modelled)
                    # mixture of experts (issue 26; no constant fitted on these rows: all held out)
                    "Megatron-Bridge MoE": 28.0,  # 26.2 (DeepSeek-V3 and Qwen3-235B 2-15%; the small
                    # fine-grained Qwen3-30B-A3B and GPT-OSS 12-258% too fast: see BENCHMARKS.md)
                    "Megatron-Core MoE": 8.0}  # 6.7 (Mixtral 8x7B)
TODAY_OOM_BUT_RAN = 8  # 3 Megatron-Bridge, 3 NeMo long-seq, 1 KempnerForge, 1 Megatron-Bridge MoE (GPT-OSS at
# the page's micro-batch 4; its config at that release says 1)


@pytest.fixture(scope="module")
def today():
    rows = [r for r in csv.DictReader((HERE.parent / "validation" / CSV.name).open(newline=""))
            if int(r["row_id"]) >= 3000]
    pred = Predictor(rows)
    return [pred.run(r) for r in rows]


def test_today_stacks_per_family(today):
    by: dict[str, list[float]] = {}  # (a result's source is its family)
    for r in today:
        if r.error_pct is not None:
            by.setdefault(r.source, []).append(abs(r.error_pct))
    medians = {f: statistics.median(v) for f, v in by.items() if f in TODAY_MEDIAN_PCT}
    assert set(medians) == set(TODAY_MEDIAN_PCT)
    assert {f: m for f, m in medians.items() if m > TODAY_MEDIAN_PCT[f]} == {}


def test_today_runs_called_out_of_memory(today):
    assert sum(1 for r in today if r.error_pct is not None and r.feasible is False) <= TODAY_OOM_BUT_RAN
