"""benchmarks/validate_published.py reads a row from its columns, whatever its source: published
runs from sources it has never seen (DeepSpeed ZeRO-3, Megatron-Core with context parallelism,
H200 nodes) are modelled, not skipped; what cannot be modelled is skipped with the reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "benchmarks"))

from validate_published import Predictor, Skip, setup_for  # noqa: E402

from engine.cluster import preset  # noqa: E402
from engine.models.transformer import gpt  # noqa: E402


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
