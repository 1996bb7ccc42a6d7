"""benchmarks/validate_published.py reads a row from its columns, whatever its source: published
runs from sources it has never seen (DeepSpeed ZeRO-3, Megatron-Core with context parallelism,
H200 nodes) are modelled, not skipped; what cannot be modelled is skipped with the reason.
The source families of ``validation/published_runs_public.csv`` (the in-repository copy; no
test reads outside the repository) each map to their preset, layout and ZeRO stage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/
sys.path.insert(0, str(HERE.parent / "benchmarks"))

from published import ROOT, default_csv, in_sample, load_rows  # noqa: E402
from published_rows import memory_counter  # noqa: E402
from validate_published import Predictor, Skip, setup_for, spearman  # noqa: E402

from engine.cluster import preset  # noqa: E402
from engine.cluster.presets import PRESETS  # noqa: E402
from engine.models.transformer import gpt  # noqa: E402
from engine.ops import DTYPE_BYTES  # noqa: E402
from engine.sim.report import model_flops  # noqa: E402


def row(**kw) -> dict[str, str]:
    base = dict(row_id="9000", source="A lab's blog, 2025", source_url="", table_or_figure="", model="GPT 1.3B",
                params_b="", layers="24", hidden="2048", ffn_hidden="", heads="16", kv_heads="", seq_len="2048",
                vocab="50304", global_batch="256", micro_batch="", gpus="16", gpu_type="A100-SXM4-80GB", nodes="",
                gpus_per_node="", intra_node_link="", inter_node_link="", tp="", pp="", dp="", cp="", vpp="",
                sharding="", recompute="", precision="bf16", metric_name="tokens_per_s_per_gpu",
                metric_value="10000", metric2_name="", metric2_value="", quality="A", notes="")
    base.update({k: str(v) for k, v in kw.items()})
    return base


def built(r):
    st = setup_for(r)
    g, c = gpt(st.cfg), preset(st.cluster_name)
    return st, st.build(g, c)


def test_deepspeed_zero3_gathers_per_op():
    st, s = built(row(sharding="DeepSpeed ZeRO-3", micro_batch=4))
    assert s.zero_stage == 3 and s.gather_unit == "op" and st.layout.startswith("deepspeed-zero3")


def test_fsdp_full_shard_with_tp_and_cp_on_h200():
    st, s = built(row(model="Llama 3 8B", layers=8, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8,
                      seq_len=8192, vocab=128256, global_batch=32, micro_batch=1, gpus=32, gpu_type="H200-SXM-141GB",
                      tp=2, cp=2, sharding="FSDP FULL_SHARD", recompute="full"))
    assert st.cluster_name == "dgx-h200:4" and st.cfg.swiglu and st.cfg.flash_attention
    assert s.zero_stage == 3 and s.gather_unit == "block" and s.found_by["options"]["cp"] == 2
    assert "cp2" in st.layout


def test_megatron_distributed_optimizer_with_sequence_parallel():
    st, s = built(row(gpus=16, tp=2, pp=2, dp=4, micro_batch=1, sharding="Megatron distributed optimizer",
                      recompute="selective", notes="sequence parallel enabled"))
    assert s.zero_stage == 1 and s.sequence_parallel and s.pipeline.stages == 2
    assert st.layout.startswith("tp2/pp2/dp4/vpp1 zero1 sp")


@pytest.mark.parametrize("kw, reason", [
    (dict(layers="24 layers"), "column layers is not a number"),
    (dict(gpu_type="MI300X"), "no cluster preset"),
    (dict(tp=2, cp=2, dp=2), "tp\\*cp\\*pp\\*dp = 8 does not equal the row's 16 GPUs"),
])
def test_what_cannot_be_modelled_is_skipped_with_why(kw, reason):
    with pytest.raises(Skip, match=reason):
        setup_for(row(**kw))


def test_a_bad_metric_cell_is_reported_not_raised():
    res = Predictor([]).run(row(metric_value="n/a", layers="x"))
    assert res.published is None and "column layers is not a number" in res.skipped


def test_fp8_rows_run_their_gemms_in_fp8():
    st, s = built(row(gpu_type="H100-80GB", tp=2, dp=8, micro_batch=1, precision="fp8 (Transformer Engine)"))
    assert s.fp8 and st.cfg.precision == "bf16" and st.layout.startswith("fp8 tp2")
    with pytest.raises(Exception, match="fp8 tensor cores"):
        built(row(gpu_type="A100-SXM4-80GB", tp=2, dp=8, micro_batch=1, precision="fp8"))


def test_hybrid_shard_shards_within_a_node():
    st, s = built(row(gpus=32, sharding="PyTorch FSDP HYBRID_SHARD", micro_batch=2))
    assert s.zero_stage == 3 and s.shard_group == 8 and "hybrid8" in st.layout


def test_tp_comm_overlap_from_the_notes():
    st, s = built(row(gpu_type="H100-80GB", gpus=16, tp=4, dp=4, micro_batch=1,
                      notes="sequence parallel, --tp-comm-overlap"))
    assert s.tp_comm_overlap and s.sequence_parallel and " sp overlap " in st.layout


# --------------------------------------------------------------------------- the in-repository CSV (issue 25 item 7)

SCRIPT = ROOT / "benchmarks" / "validate_published.py"


@pytest.fixture(scope="module")
def rows_by_id():
    return {int(r["row_id"]): r for r in load_rows()}


def test_the_default_csv_is_inside_the_repository():
    """Regression (validate_published.py failed with a traceback on a fresh clone: its default
    CSV was outside the repository): the default is the committed copy under validation/."""
    p = default_csv().resolve()
    assert p.is_relative_to(ROOT.resolve()) and p.parent.name == "validation" and p.is_file()
    assert "shared" not in p.relative_to(ROOT.resolve()).parts
    rows = load_rows()
    assert rows and len({r["row_id"] for r in rows}) == len(rows)


def _run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_a_missing_csv_is_a_one_line_error():
    out = _run_script("--csv", "/nonexistent/runs.csv")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "/nonexistent/runs.csv" in out.stderr


def test_a_malformed_csv_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    out = _run_script("--csv", str(bad))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and str(bad) in out.stderr and "missing column" in out.stderr


def _expected(base: str, **kw):
    """kw, or the Skip a row gives while its cluster preset is missing."""
    return kw if base in PRESETS else {"skip": f"no cluster preset for GPU type .*no '{base}' preset"}


# row id -> what setup_for must give: cluster preset, degrees, ZeRO stage (or the Skip reason)
FAMILY_ROWS = {
    3001: dict(skip="layer-wise selective checkpointing"),  # torchtitan: every N-th layer, N not stated
    3003: dict(cluster="dgx-a100-80gb:8", tp=1, pp=1, dp=64, cp=1, zero=3),  # torchtitan, FSDP2 on A100
    3012: _expected("grand-teton", cluster="grand-teton:1", tp=1, pp=1, dp=8, cp=1, zero=3),  # torchtitan GT
    3019: _expected("grand-teton", cluster="grand-teton:1", tp=1, pp=1, dp=4, cp=2, zero=3),  # FSDP x CP
    # 3-D: FSDP2 under torch's pipelining is ZeRO-2 with unsharded gradient accumulation (issue 42)
    3024: _expected("grand-teton", cluster="grand-teton:64", tp=8, pp=8, dp=8, cp=1, zero=2, mbs=4),
    3025: dict(skip="interleaved 1F1B with an unstated number of stages"),
    3038: dict(cluster="dgx-h200:4", tp=1, pp=1, dp=32, cp=1, zero=3),  # torchtitan-community
    3149: dict(cluster="dgx-h200:1", tp=1, pp=1, dp=2, cp=1, zero=3),  # KempnerForge FSDP2 on 2 GPUs
    3150: dict(cluster="dgx-h200:1", tp=2, pp=1, dp=1, cp=1, zero=0),  # KempnerForge pure TP
    3136: dict(cluster="dgx-h100:1", tp=1, pp=1, dp=4, cp=1, zero=1, batch=4),  # NeMo long-seq
    3139: dict(cluster="dgx-h100:4", tp=2, pp=1, dp=8, cp=2, zero=1, batch=8),
    3137: dict(skip="global and micro batch not published, and with pp > 1"),
    3120: dict(cluster="dgx-h100:1", tp=1, pp=1, dp=8, cp=1, zero=3),  # Megatron-Bridge, Megatron FSDP
    3121: dict(cluster="dgx-h100:8", tp=4, pp=8, dp=2, cp=1, zero=1),  # distributed optimizer
    3145: dict(cluster="dgx-h100:8", tp=1, pp=4, dp=16, cp=1, zero=1),  # Megatron-Core MoE (Mixtral, ep 8)
    3040: (dict(skip="no tf32 precision") if "tf32" not in DTYPE_BYTES
           else _expected("gh200", cluster="gh200:1", tp=4, pp=1, dp=1, cp=1, zero=0)),  # Sailor
}


@pytest.mark.parametrize("rid", sorted(FAMILY_ROWS))
def test_each_source_family_maps(rows_by_id, rid):
    want = FAMILY_ROWS[rid]
    if "skip" in want:
        with pytest.raises(Skip, match=want["skip"]):
            setup_for(rows_by_id[rid])
        return
    st = setup_for(rows_by_id[rid])
    assert st.cluster_name == want["cluster"]
    assert (st.tp, st.pp, st.dp, st.cp, st.zero_stage) == tuple(want[k] for k in ("tp", "pp", "dp", "cp", "zero"))
    if "mbs" in want:
        assert f"mbs{want['mbs']} " in st.layout
    if "batch" in want:
        assert st.cfg.batch == want["batch"]


def test_a_row_on_part_of_a_node_uses_only_its_gpus(rows_by_id):
    """KempnerForge's 2-GPU FSDP2 row: the fsdp baseline alone would spread over all 8 GPUs of
    the preset node; the row's dp 2 is kept."""
    st, s = built(rows_by_id[3149])
    assert len(s.devices_used()) == 2 and s.zero_stage == 3


def test_software_is_recorded(rows_by_id):
    sw = setup_for(rows_by_id[3038]).software
    assert sw == {"framework": "torchtitan", "compile": True, "async_tp": False, "fp8": True, "fp8_all_gather": True,
                  "tp_comm_overlap": None}
    assert setup_for(rows_by_id[3011]).software["async_tp"] is True
    assert setup_for(rows_by_id[3003]).software["compile"] is False
    assert setup_for(rows_by_id[3121]).software["framework"] == "megatron"


def test_every_mixture_of_experts_row_builds_its_sample(rows_by_id):
    """MoE rows (notes ``ep=...``) read as their model card's sample with the row's expert
    parallelism; the row's shape columns agree with the sample (else a Skip says which)."""
    moe = [r for r in rows_by_id.values() if r["notes"].lstrip().startswith("ep=")]
    assert len(moe) == 37  # 11 on Hopper, 26 on Blackwell (from row 5000); Kimi-K2 has no sample
    kimi = [r for r in moe if "kimi" in r["model"].lower()]
    assert [int(r["row_id"]) for r in kimi] == [5024]
    with pytest.raises(Skip, match="Kimi_K2.* has no sample"):
        setup_for(kimi[0])
    for r in (r for r in moe if r not in kimi):
        setup = setup_for(r)
        assert setup.make_graph is not None and setup.ep == int(r["notes"].lstrip()[3:].split(";")[0])
        assert f"ep{setup.ep}" in setup.layout
    ds = setup_for(rows_by_id[3123])
    g = ds.make_graph()
    assert g.name == "deepseek-v3" and ds.top_k == 8 and (ds.tp, ds.pp, ds.dp) == (2, 8, 64)


def test_a_mixture_of_experts_row_that_disagrees_with_its_sample_is_skipped(rows_by_id):
    bad = {**rows_by_id[3145], "hidden": "5120"}
    with pytest.raises(Skip, match="hidden 5120 .the sample has 4096. disagree with sample mixtral-8x7b"):
        setup_for(bad)


def test_memory_counters():
    assert memory_counter(row(source="torchtitan (PyTorch team) published benchmarks")) == "reserved"
    assert memory_counter(row(metric2_name="peak_alloc_gib")) == "allocated"
    assert memory_counter(row(notes="peak mem 80 GB/GPU")) is None


def test_in_sample_rule(rows_by_id):
    rows = list(rows_by_id.values())
    sets = in_sample(rows)
    assert len(sets["A100"]) + len(sets["H100"]) == 34  # calibrate.py's rows, unchanged
    fam = [r for r in rows if r["source"].startswith("torchtitan (PyTorch")]
    picked = sets["torchtitan"]
    assert picked == sorted(picked) and len(picked) <= len(fam) // 3 and picked[0] == 3001
    assert 3002 not in picked  # same model, GPU and software as 3001: one sweep, its first row only
    assert not any(rows_by_id[i]["notes"].startswith("ep=") for ids in sets.values() for i in ids)
    assert "torchtitan-community" not in sets  # fewer than 6 rows


class TestSpearman:
    def test_perfect_and_reversed(self):
        assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
        assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)

    def test_ties_take_the_average_rank(self):
        # ranks [1, 2, 3, 4] and [1, 4, 2.5, 2.5]: r = 1.5 / sqrt(5 * 4.5) = 1 / sqrt(10)
        assert spearman([1, 2, 3, 4], [1, 3, 2, 2]) == pytest.approx(10 ** -0.5, abs=1e-12)

    def test_degenerate(self):
        assert spearman([1], [2]) is None
        assert spearman([1, 2, 3], [5, 5, 5]) is None


def test_a_kempnerforge_row_is_predicted_with_time_mfu_and_memory(rows_by_id):
    """Row 3148 (one H200): iteration_time_s is the simulated time; its MFU divides the model
    FLOPs by the H200's dense bf16 peak (the note states no peak); its peak memory comes from
    the notes, in GiB of max_memory_allocated (KempnerForge's logger prints GiB as "GB")."""
    res = Predictor(list(rows_by_id.values())).run(rows_by_id[3148])
    assert res.skipped is None and res.predicted == res.iteration_time_s
    st = setup_for(rows_by_id[3148])
    mfu = 100 * model_flops(gpt(st.cfg)) / (res.iteration_time_s * 1 * 989.4e12)
    assert res.predicted2 == pytest.approx(mfu)
    assert res.published_memory_gib == pytest.approx(80.7)
    assert res.memory_counter == "allocated"
    assert res.predicted_memory_gib is not None and res.memory_error_pct is not None
