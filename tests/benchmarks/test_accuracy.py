"""Accuracy guard: the simulator's predictions of the public published runs must not regress.

Every row of ``tests/data/published_runs_public.csv`` (the rows of
``validation/published_runs_public.csv`` before row 3000, byte for byte: Megatron-LM SC'21 and
2019, MosaicML's MPT runs on A100-40GB and H100-80GB) is predicted by ``benchmarks/validate_published.py`` from
what the row states. Since issue 42 nothing in the engine is fitted on end-to-end rows (the
per-device share was: its leave-one-source-out error was 25-53% against 2-16% in sample), so
every figure here is out of sample: the guard is leave-one-source-out by construction. The
bounds are on aggregates, computed here from the simulator, never per row; they sit a little
above today's figures (BENCHMARKS.md) so that noise-free changes of physics that make
predictions worse fail here; a mechanism that makes them better lowers them.
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

#: (today's figure) -> bound. Issue 42 removed the per-device share fitted on in-sample rows:
#: every stack is now predicted from the kernels' measured rates alone, and 89 of the 92 rows
#: too fast (what is not modelled: docs/benchmarks/2026-11-28-issue-42-out-of-sample.md).
#: With the share they were 13.9 / 20.5 / 71.3 / 30 rows (in sample / held out / max / <=10%).
ALL_MEDIAN_PCT = 40.0  # 38.2 over the 92 rows
FAMILY_MEDIAN_PCT = {"Megatron SC'21": 17.0, "Megatron 2019": 11.0, "MosaicML": 42.0}  # 14.7, 9.8, 39.9
#: (Megatron 2019: its rows now checkpoint every layer, as the 2019 GPT-2 recipe did; 6.9 before.
#: Issue 42, third round: the recomputed forward redoes its tensor-parallel all-reduces, as
#: Korthikanti et al.'s Table 4 measures (a layer's backward +7.6 ms for a 7.7 ms forward):
#: SC'21 22.3 -> 14.7; Megatron 2019 1.4 -> 9.8, its three 8.3B runs on one DGX-2H now 7-10% too
#: slow where they were 0.5-2% (on V100 something else is too slow: no V100 GEMM measurement))
MAX_PCT = 90.0  # 87.4 (row 218, MPT-760m on 8 H100s: a small model on 2023 Hopper software)
MIN_WITHIN_10_PCT = 5  # of 92 rows (7 today)


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


def test_median_over_every_row(results):
    out, _ = results
    assert statistics.median(errors(out, lambda r: True)) <= ALL_MEDIAN_PCT


@pytest.mark.parametrize("family", sorted(FAMILY_MEDIAN_PCT))
def test_median_per_source_family(results, family):
    out, _ = results
    assert statistics.median(errors(out, lambda r: r.source == family)) <= FAMILY_MEDIAN_PCT[family]


def test_nothing_is_fitted_per_device_type():
    """The engine's default cost model carries no share per device type (issue 42)."""
    from engine.costs import CostModel
    from engine.cluster import DEVICE_TYPES

    cost = CostModel()
    assert cost.sustained_fractions == ()
    assert {cost.sustained(d) for d in DEVICE_TYPES.values()} == {1.0}


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
#: rows (today's figure in the comment), and on the runs that ran but are predicted out of memory.
#: Issue 42: no share per device type (with the shares fitted in sample the figures were
#: torchtitan 6.3, community 0.9, KempnerForge 12.0, NeMo long-seq 25.0, Megatron-Bridge 12.3,
#: Sailor 48.5, Bridge MoE 26.2, Core MoE 6.7; predicted without their own family's rows,
#: torchtitan 53.2, KempnerForge 30.4, NeMo long-seq 24.5, Megatron-Bridge 26.9).
TODAY_MEDIAN_PCT = {"torchtitan": 50.0,  # 47.2 (PyTorch-native FSDP2 stacks: too fast, eager and compiled;
                    # 52.5 before the recomputed forward's collectives and sequence parallelism's second
                    # all-gather, issue 42)
                    "torchtitan-community": 40.0,  # 37.6
                    "KempnerForge": 28.0,  # 25.4 (30.7 before its loss ran on gathered logits, 29.8 before
                    # the recomputed forward's all-reduces, issue 42)
                    "NeMo long-seq": 16.0,  # 13.9 (13.4 before sequence parallelism's second all-gather)
                    "Megatron-Bridge": 14.0,  # 11.4 (13.6 before the 405B runs fit: issue 42)
                    "Sailor": 40.0,  # 36.6 (small runs dominated by per-kernel host overhead, not modelled;
                    # 47.3 before its attention was unfused and its OPT without dropout, as its fork runs them)
                    # mixture of experts (issue 26; no constant fitted on these rows: all held out)
                    "Megatron-Bridge MoE": 38.0,  # 35.5 (the small fine-grained Qwen3-30B-A3B and GPT-OSS
                    # far too fast: see BENCHMARKS.md; 30.1 while every link was taken at 0.85 of its line
                    # rate: with InfiniBand at its measured 0.96 the Qwen3-235B runs' expert all-to-alls
                    # over the network got faster and those runs, already too fast, more so)
                    "Megatron-Core MoE": 20.0}  # 18.2 (Mixtral 8x7B; 16.5 before the links' measured shares)
TODAY_OOM_BUT_RAN = 2  # NeMo long-seq's Llama 2 7B on 4 GPUs (8 GiB over), Megatron-Bridge MoE's GPT-OSS at
# the page's micro-batch 4 (its config at that release says 1). Issue 42: 7 before context parallelism's
# activations were counted per rank (the 405B and long-sequence runs) and a fused SwiGLU's
# kept tensors were those Megatron-Core keeps


@pytest.fixture(scope="module")
def today():
    rows = [r for r in csv.DictReader((HERE.parent / "validation" / CSV.name).open(newline=""))
            if 3000 <= int(r["row_id"]) < 5000]
    pred = Predictor(rows)
    return [pred.run(r) for r in rows]


#: Peak memory of today's stacks where the rows publish it: family -> bound on the median
#: |error| (today's figure). Issue 42: KempnerForge casts its model to bf16 (no fp32 master
#: copy) and accumulates unsharded gradients between reduce-scatters (FSDP no_sync): 34.8 ->
#: 20.8; its output head gathers the logits to every tensor-parallel rank for the loss
#: (loss_parallel off): 20.8 -> 3.0; torchtitan's loss ran eagerly in fp32 (its fp32 log-softmax
#: and gradients): 45.6 -> 24.5 and 40.4 -> 13.2 (its fp8 rows keep torchao's bf16 inputs, not
#: modelled). Third round: KempnerForge's "GB" read as what its logger prints, GiB of
#: max_memory_allocated, and the unsharded gradients accumulated in FSDP2's fp32 reduce dtype:
#: 3.0 -> 5.2 (the rows without FSDP 18-22% under); torchtitan's 405B pipelines as torch's
#: pipelining runs FSDP2 (ZeRO-2, unsharded fp32 gradients to the step's one reduce-scatter):
#: 24.5 -> 8.7; Sailor's attention unfused (its fork has no flash path), its OPT without
#: dropout, softmax's output kept once with the matmul that reads it: 39.5 -> 30.4 (micro-batch 1-2
#: OPT runs 22-40% under, a fixed ~3 GB of nvidia-smi memory not modelled; GPT-Neo 21-315%
#: over at micro-batch 4, as if its unpublished launch script checkpointed activations).
TODAY_MEMORY_MEDIAN_PCT = {"KempnerForge": 7.0,  # 5.2
                           "torchtitan": 11.0,  # 8.7
                           "torchtitan-community": 16.0,  # 13.2
                           "Sailor": 33.0}  # 30.4


def test_today_peak_memory_per_family(today):
    medians = family_medians(today, "memory_error_pct")
    assert set(medians) == set(TODAY_MEMORY_MEDIAN_PCT)
    assert {f: m for f, m in medians.items() if m > TODAY_MEMORY_MEDIAN_PCT[f]} == {}


#: Megatron-Bridge on Blackwell (rows from 5000 on: B200, B300, GB200, GB300 NVL72; issue 42),
#: nothing fitted on them: family -> bound on the median |error| of its predicted rows (today's
#: figure), the nvfp4 rows and Kimi-K2 skipped; and the runs that ran but are called out of
#: memory (DeepSeek-V3 and GPT-OSS at their pages' micro-batches; the 70B Megatron-FSDP recipes'
#: 20-40 layers of activations offloaded to the host fit since issue 42 modelled it)
BLACKWELL_MEDIAN_PCT = {"Megatron-Bridge": 24.0,  # 21.9 over 8 dense rows (24.2 before issue 42's second round)
                        "Megatron-Bridge MoE": 44.0}  # 41.8 over 25 (45.9 before the DeepSeek-V3 rows took their
# configs' recompute modules and the links their measured shares); 48.2 before the 256-GPU NVL72 runs were
# given the 64-GPU NVLink domains their launcher asks Slurm for (DeepSeek-V3 there went from 52-62%
# too slow, its expert groups straddling racks, to 6-23% too fast and 15% too slow)
BLACKWELL_OOM_BUT_RAN = 1  # DeepSeek-V3 on 256 B200s (its page's layout differs from the config at its
# release); 9 before issue 42's offloading, context-parallel and fused-SwiGLU memory and the MoE rows'
# recompute modules read from their configs


@pytest.fixture(scope="module")
def blackwell():
    rows = [r for r in csv.DictReader((HERE.parent / "validation" / CSV.name).open(newline=""))
            if int(r["row_id"]) >= 5000]
    pred = Predictor(rows)
    return [pred.run(r) for r in rows]


def test_blackwell_per_family(blackwell):
    medians = family_medians(blackwell)
    assert set(medians) == set(BLACKWELL_MEDIAN_PCT)
    assert {f: m for f, m in medians.items() if m > BLACKWELL_MEDIAN_PCT[f]} == {}
    assert sum(1 for r in blackwell if r.error_pct is not None and r.feasible is False) <= BLACKWELL_OOM_BUT_RAN
    assert sorted(r.row_id for r in blackwell if r.skipped) == [5003, 5007, 5024]


def family_medians(results, attr: str = "error_pct") -> dict[str, float]:
    """Source family (a result's source) -> the median |``attr``| of its rows that have one."""
    by: dict[str, list[float]] = {}
    for r in results:
        if getattr(r, attr) is not None:
            by.setdefault(r.source, []).append(abs(getattr(r, attr)))
    return {f: statistics.median(v) for f, v in by.items()}


def test_today_stacks_per_family(today):
    medians = {f: m for f, m in family_medians(today).items() if f in TODAY_MEDIAN_PCT}
    assert set(medians) == set(TODAY_MEDIAN_PCT)
    assert {f: m for f, m in medians.items() if m > TODAY_MEDIAN_PCT[f]} == {}


def test_today_runs_called_out_of_memory(today):
    assert sum(1 for r in today if r.error_pct is not None and r.feasible is False) <= TODAY_OOM_BUT_RAN
