"""Issue 26 item 6: mixture-of-experts strategies export. Megatron-LM gets the expert-parallel
degrees and the MoE / MLA settings under their real flag names (checked against a table read
from Megatron-LM's arguments.py) with Megatron-LM's own rules holding; infer_layout recovers ep
and etp; DeepSpeed (AutoEP) and torchtitan say what their configs can and refuse the rest."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from engine.cluster import preset
from engine.errors import ValidationError
from engine.layout.build import build_layout
from engine.export import (export, infer_layout, layout_from_deepspeed, layout_from_megatron, layout_from_torchtitan,
    to_megatron)
from engine.export.moe import megatron_layer_freq, megatron_pipeline_layout, moe_shape
from engine.export.torchtitan import launch_args
from engine.graph import GraphBuilder
from engine.layout import Layout
from engine.graph.blocks import layer_blocks
from engine.models import build_sample
from engine.models.moe import MoEConfig, moe_gpt
from engine.export.megatron import megatron_flags
# Megatron-LM's recorded flags and validate_args checks (core_v0.19.0): tests/megatron_args.py
from megatron_args import environment, eval_layer_freq, megatron_parse, megatron_rules, parse_pipeline_layout
from engine.layout import build_layout

# ----------------------------------------------------------------------------- Megatron-LM

MIXTRAL = ("mixtral-8x7b", "dgx-h100:8", dict(tp=1, pp=4, vpp=8, ep=8, micro_batch=1, zero_stage=1))
DEEPSEEK = ("deepseek-v3", "dgx-h100:128", dict(tp=2, pp=8, vpp=4, ep=64, sequence_parallel=True, micro_batch=1,
                                                 zero_stage=1))


def case(spec):
    name, cluster, kw = spec
    g, c = build_sample(name), preset(cluster)
    return g, c, build_layout(g, c, Layout(**kw))


def test_mixtral_8x7b_ep8_reads_as_megatron_cores_reference_mapping():
    """Megatron-Core's MoE README (core_v0.15.3) maps Mixtral 8x7B on 64 H100s as TP 1, EP 8,
    PP 4, VP 8, MBS 1, GBS 256, dropless, all-to-all, bf16."""
    g, c, s = case(MIXTRAL)
    text = export("megatron", g, s, c)
    assert megatron_flags(text) == [
        "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "4",
        "--num-virtual-stages-per-pipeline-rank", "8", "--use-distributed-optimizer", "--overlap-grad-reduce",
        "--bf16", "--micro-batch-size", "1", "--global-batch-size", "256",
        "--num-experts", "8", "--expert-model-parallel-size", "8", "--expert-tensor-parallel-size", "1",
        "--moe-ffn-hidden-size", "14336", "--moe-router-topk", "2", "--moe-router-score-function", "softmax",
        "--moe-router-dtype", "fp32", "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm",
        # the model (engine.export.megatron_model): Mixtral's shape as its model card has it
        "--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--swiglu",
        "--group-query-attention", "--num-query-groups", "8", "--seq-length", "4096", "--max-position-embeddings",
        "4096", "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--disable-bias-linear",
        "--untie-embeddings-and-output-weights", "--attention-dropout", "0", "--hidden-dropout", "0"]
    args = megatron_parse(text)
    megatron_rules(args, c.num_devices, 32)
    assert args.moe_expert_capacity_factor is None  # dropless


def test_deepseek_v3_tp2_pp8_vpp4_ep64():
    g, c, s = case(DEEPSEEK)
    text = export("megatron", g, s, c)
    flags = megatron_flags(text)
    assert flags == [
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "8",
        "--pipeline-model-parallel-layout", "Et|t|(tt|)*29,tL", "--sequence-parallel",
        "--use-distributed-optimizer", "--overlap-grad-reduce", "--bf16", "--micro-batch-size", "1",
        "--global-batch-size", "8192",
        "--multi-latent-attention", "--q-lora-rank", "1536", "--kv-lora-rank", "512", "--qk-head-dim", "128",
        "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128",
        "--num-experts", "256", "--expert-model-parallel-size", "64", "--expert-tensor-parallel-size", "1",
        "--moe-ffn-hidden-size", "2048", "--moe-router-topk", "8", "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias", "--moe-router-dtype", "fp32", "--moe-token-dispatcher-type", "alltoall",
        "--moe-grouped-gemm", "--moe-shared-expert-intermediate-size", "2048", "--moe-layer-freq", "([0]*3+[1]*58)",
        # the model: its first 3 layers dense (ffn 18432), MLA's widths above
        "--num-layers", "61", "--hidden-size", "7168", "--num-attention-heads", "128", "--ffn-hidden-size", "18432",
        "--swiglu", "--seq-length", "4096", "--max-position-embeddings", "4096", "--position-embedding-type", "rope",
        "--normalization", "RMSNorm", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
        "--attention-dropout", "0", "--hidden-dropout", "0"]
    assert "'Et|t|(tt|)*29,tL'" in text and "'([0]*3+[1]*58)'" in text  # quoted for the shell
    args = megatron_parse(text)
    megatron_rules(args, c.num_devices, 61, env=environment(text))
    assert eval_layer_freq(args.moe_layer_freq) == [0] * 3 + [1] * 58


def test_the_pipeline_layout_string_places_the_layers_as_simulated():
    g, c, s = case(DEEPSEEK)
    chunks = parse_pipeline_layout(megatron_parse(export("megatron", g, s, c)).pipeline_model_parallel_layout)
    assert len(chunks) == 8 * 4 and chunks[0].startswith("E") and chunks[-1].endswith("L")
    simulated = Counter(s.stage_of[f"{b}.norm1"] for b in layer_blocks(g))  # chunk c on rank c % pp
    assert [x.count("t") for x in chunks] == [simulated[k] for k in range(32)]


def test_pipeline_layout_and_layer_freq_helpers():
    assert megatron_pipeline_layout([2, 2, 2, 2], 2) == "Ett|(tt|)*2,ttL"
    assert parse_pipeline_layout(megatron_pipeline_layout([1, 3, 3, 1], 2)) == ["Et", "ttt", "ttt", "tL"]
    assert megatron_layer_freq((True,) * 4) is None
    assert eval_layer_freq(megatron_layer_freq((False, True, True, False))) == [0, 1, 1, 0]


@pytest.mark.parametrize("spec", [MIXTRAL, DEEPSEEK], ids=["mixtral", "deepseek"])
def test_round_trip_recovers_ep(spec):
    g, c, s = case(spec)
    lay = infer_layout(g, s, c)
    assert (lay.ep, lay.etp) == (spec[2]["ep"], 1)
    back = layout_from_megatron(megatron_flags(export("megatron", g, s, c)), lay)
    assert (back.ep, back.etp, back.vpp) == (lay.ep, 1, spec[2]["vpp"])
    rebuilt = build_layout(g, c, back)
    assert all(rebuilt.configs[op.name] == s.configs[op.name] for op in g.ops)


def test_etp_round_trips_and_is_told_from_tp():
    g, c = build_sample("qwen3-30b-a3b"), preset("dgx-h100:2")
    s = build_layout(g, c, Layout(tp=4, ep=8, etp=2, sequence_parallel=True, micro_batch=1, zero_stage=1))
    lay = infer_layout(g, s, c)
    assert (lay.tp, lay.ep, lay.etp) == (4, 8, 2)
    args = megatron_parse(text := export("megatron", g, s, c))
    assert (args.expert_model_parallel_size, args.expert_tensor_parallel_size) == (8, 2)
    megatron_rules(args, 16, 48, env=environment(text))


def tiny(**kw):
    cfg = dict(layers=2, hidden=64, heads=4, seq_len=16, vocab=100, batch=8, experts=8, top_k=2, expert_ffn=32)
    return moe_gpt(MoEConfig(**{**cfg, **kw}))


C8 = preset("dgx-h100:1")


def test_capacity_factor_is_said_and_inputs_are_not_padded():
    g = tiny(capacity_factor=1.25)
    args = megatron_parse(export("megatron", g, build_layout(g, C8, Layout(ep=8)), C8))
    assert args.moe_expert_capacity_factor == 1.25 and not args.moe_pad_expert_input_to_capacity
    assert megatron_parse(export("megatron", tiny(top_k=1), build_layout(tiny(top_k=1), C8, Layout(ep=8)),
                                 C8)).moe_router_pre_softmax


def test_megatron_refusals_name_the_rule():
    g = tiny(precision="fp32")
    with pytest.raises(ValidationError, match="grouped GEMM.*bf16 only.*build the model in bf16"):
        export("megatron", g, build_layout(g, C8, Layout(ep=8)), C8)
    g = tiny(bias=True)
    s = build_layout(g, C8, Layout(tp=2, sequence_parallel=True, ep=4, etp=2))
    with pytest.raises(ValidationError, match="biases in MoE layers need etp 1"):
        export("megatron", g, s, C8)
    with pytest.raises(ValidationError, match="needs sequence parallelism"):
        to_megatron(Layout(tp=2, dp=4, ep=8, micro_batch=1, global_batch=8), tiny())
    with pytest.raises(ValidationError, match="ep 3 does not divide the 8 experts"):
        to_megatron(Layout(dp=6, ep=3, micro_batch=1, global_batch=6), tiny())
    with pytest.raises(ValueError, match="need the model"):
        to_megatron(Layout(dp=8, ep=8, micro_batch=1, global_batch=8))


def test_layers_that_differ_are_refused():
    b = GraphBuilder("odd", "bf16")
    x = b.input("x", [2, 4, 16], axes=["sample", "length", "feature"])
    for i, k in enumerate((2, 4)):
        b.block = f"layers.{i}"
        p = b.add("router", f"layers.{i}.router", [x], num_experts=8, top_k=k)
        x = b.add("experts", f"layers.{i}.experts", [x, p], num_experts=8, top_k=k, ffn_hidden=8)
    with pytest.raises(ValidationError, match="layers.1.experts has top-k 4 where layers.0.experts has 2"):
        moe_shape(b.build())


def test_dense_exports_carry_no_moe_flags():
    g, c = build_sample("gpt2"), preset("dgx-a100-80gb:2")
    text = export("megatron", g, build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1)), c)
    assert not any(f.startswith(("--moe", "--num-experts", "--expert", "--bf16")) for f in megatron_flags(text))
    assert "'" not in text


# ----------------------------------------------------------------------------- DeepSpeed

def test_deepspeed_autoep_section():
    from dataclasses import replace
    g = tiny()
    s = replace(build_layout(g, C8, Layout(ep=4, zero_stage=3)),
                gather_unit="op")  # (DeepSpeed's ZeRO-3 gathers per op)
    cfg = json.loads(export("deepspeed", g, s, C8))
    assert cfg["expert_parallel"] == {"enabled": True, "autoep_size": 4}
    back = layout_from_deepspeed(cfg, infer_layout(g, s, C8))
    assert all(build_layout(g, C8, back).configs[op.name] == s.configs[op.name] for op in g.ops)
    assert "expert_parallel" not in json.loads(export("deepspeed", g, replace(build_layout(g, C8, Layout(zero_stage=3)),
                                                                              gather_unit="op"), C8))


def test_deepspeed_reads_the_autoep_section():
    """The keys are the installed DeepSpeed's (0.19.8: deepspeed/module_inject/auto_ep_config.py)
    and its folding rules accept the layout."""
    auto_ep = pytest.importorskip("deepspeed.module_inject.auto_ep_config")
    g = tiny()
    cfg = json.loads(export("deepspeed", g, build_layout(g, C8, Layout(ep=4, zero_stage=2)), C8))
    parsed = auto_ep.parse_autoep_config(cfg["expert_parallel"])
    assert (parsed.enabled, parsed.autoep_size, parsed.expert_tensor_parallel_size) == (True, 4, 1)
    auto_ep.validate_autoep_config(parsed, world_size=8, pp_size=1, tp_size=1, sp_size=1, zero_stage=2)


@pytest.mark.parametrize("fmt", ["deepspeed", "torchtitan"])
def test_dropping_and_allgather_are_refused_outside_megatron(fmt):
    for kw, why in ((dict(capacity_factor=1.0), "token dropping.*dropless.*moe-expert-capacity-factor"),
                    (dict(dispatcher="allgather"), "the allgather token dispatcher.*all-to-all")):
        g = tiny(**kw)
        with pytest.raises(ValidationError, match=f"{fmt}: {why}"):
            export(fmt, g, build_layout(g, C8, Layout(ep=8, zero_stage=3)), C8)


# ----------------------------------------------------------------------------- torchtitan

def test_torchtitan_expert_degrees_round_trip():
    g = tiny()
    s = build_layout(g, C8, Layout(tp=2, sequence_parallel=True, ep=4, zero_stage=3))
    text = export("torchtitan", g, s, C8)
    args = launch_args(text)
    assert args[args.index("--parallelism.expert_parallel_degree") + 1] == "4"
    assert not any("expert_tensor" in a for a in args)  # (0.3.0 has no expert tensor parallelism)
    back = layout_from_torchtitan(text, infer_layout(g, s, C8))
    assert all(build_layout(g, C8, back).configs[op.name] == s.configs[op.name] for op in g.ops)


def test_torchtitan_refusals():
    g = tiny()
    with pytest.raises(ValidationError, match="torchtitan:.*folds ep onto data-parallel replicas"):
        export("torchtitan", g, build_layout(g, C8, Layout(ep=8)), C8)  # (no ZeRO: dp_shard 1)
    with pytest.raises(ValidationError, match="torchtitan: etp 2: torchtitan 0.3.0 has no expert tensor"):
        export("torchtitan", g, build_layout(g, C8, Layout(tp=4, sequence_parallel=True, ep=2, etp=2, zero_stage=3)),
               C8)


def test_moe_all_to_all_overlap_with_pp_needs_virtual_stages():
    """Issue 44: DeepSeek-V3 with the MoE all-to-all overlap at pp 8 without virtual stages was
    simulated and exported, and Megatron-Core refuses it (TransformerConfig: vpp with pp > 1).
    Now the layout is refused with the rule named; with vpp 4 it exports and passes the
    recorded rules."""
    name, cluster, kw = DEEPSEEK
    with pytest.raises(ValueError, match="moe_comm_overlap: .* requires virtual_pipeline_model_parallel_size"):
        Layout(**{**kw, "vpp": 1}, moe_comm_overlap=True)
    with pytest.raises(ValueError, match="moe_comm_overlap: .* full recomputation off"):
        Layout(**kw, moe_comm_overlap=True, recompute="full")
    g, c, s = case((name, cluster, {**kw, "moe_comm_overlap": True}))
    text = export("megatron", g, s, c)
    assert "--overlap-moe-expert-parallel-comm" in megatron_flags(text)
    args = megatron_parse(text)
    megatron_rules(args, c.num_devices, 61, env=environment(text))
    assert args.overlap_moe_expert_parallel_comm and args.virtual_pipeline_model_parallel_size == 4
