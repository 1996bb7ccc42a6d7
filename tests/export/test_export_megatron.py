"""Issue 27 (Megatron-LM): the export is what Megatron-LM core_v0.19.0 accepts and would run as
simulated. Each export is parsed with a recorded copy of Megatron-LM's parser and the
validate_args checks that concern its flags (tests/megatron_args.py); what Megatron would then run
(dp, microbatches, virtual stages, recomputation, sharding, precision), computed from the parsed
arguments, equals the strategy. What it cannot run is refused with the reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.cluster import preset
from engine.errors import ValidationError
from engine.layout.build import build_layout
from engine.export import export, infer_layout
from engine.export.megatron import MEGATRON_RELEASE, layout_from_megatron, megatron_flags, to_megatron
from engine.formats import resolve_model
from engine.layout import Layout
from engine.graph.blocks import layer_blocks
from engine.models import build_sample
from engine.search.baselines import data_parallel
from engine.layout.build import fsdp
from megatron_args import environment, megatron_parse, megatron_rules, parse_pipeline_layout, what_megatron_runs
from engine.layout import build_layout

GPT2 = lambda: resolve_model("gpt2", batch=32)  # noqa: E731 (fp32, 12 layers, sequence 1024)
A100, H100, B200 = "dgx-a100-80gb:2", "dgx-h100:8", "dgx-b200:1"

#: name -> (model, cluster, strategy builder)
MATRIX = {
    "tp2-pp2-sp-selective-zero1": (GPT2, A100, lambda g, c: build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1,
                                                                                      sequence_parallel=True, recompute="selective", zero_stage=1))),
    "tp4-pp4-first-last": (GPT2, A100, lambda g, c: build_layout(g, c, Layout(tp=4, pp=4, micro_batch=1,
                                                                              layers_per_stage=[2, 4, 4, 2]))),
    "tp4-pp4-any-split": (GPT2, A100, lambda g, c: build_layout(g, c, Layout(tp=4, pp=4, micro_batch=1,
                                                                             layers_per_stage=[2, 3, 5, 2]))),
    "pp2-vpp2": (GPT2, A100, lambda g, c: build_layout(g, c, Layout(pp=2, vpp=2, micro_batch=1))),
    "fsdp-zero3-full": (GPT2, A100, lambda g, c: fsdp(g, c, Layout(zero_stage=3, micro_batch=1, recompute="full"))),
    "fsdp-zero2": (GPT2, A100, lambda g, c: fsdp(g, c, Layout(zero_stage=2))),
    "dp-accumulate": (GPT2, A100, lambda g, c: data_parallel(g, c, micro_batch=1)),
    "tp2-sp-cp2": (GPT2, A100, lambda g, c: build_layout(g, c, Layout(tp=2, cp=2, sequence_parallel=True,
                                                                      micro_batch=1))),
    "llama-bf16-tp4-pp4-vpp2-fp8": (lambda: build_sample("llama2-7b"), H100,
                                    lambda g, c: build_layout(g, c, Layout(tp=4, pp=4, vpp=2, micro_batch=1,
                                                                           sequence_parallel=True, zero_stage=1, fp8=True, overlap_param_gather=True))),
    "llama-bf16-hsdp": (lambda: build_sample("llama2-7b"), H100,
                        lambda g, c: fsdp(g, c, Layout(zero_stage=3, micro_batch=1, shard_group=8))),
    "llama-bf16-grads-bf16-b200": (lambda: build_sample("llama2-7b"), B200,
                                   lambda g, c: build_layout(g, c, Layout(tp=2, micro_batch=2, sequence_parallel=True,
                                                                          zero_stage=1, grad_reduce_in_fp32=False))),
    "llama-bf16-zero1-bf16-moments": (lambda: build_sample("llama2-7b"), H100,
                                      lambda g, c: build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1, zero_stage=1,
                                                                             optimizer_state="bf16-moments"))),
    "llama-offload4-eager": (lambda: build_sample("llama2-7b"), H100,
                             lambda g, c: build_layout(g, c, Layout(tp=2, micro_batch=1, sequence_parallel=True,
                                                                    zero_stage=1, offload_activations=4,
                                                                    kernels="eager"))),
    "mixtral-ep8-vpp8": (lambda: build_sample("mixtral-8x7b"), H100,
                         lambda g, c: build_layout(g, c, Layout(tp=1, pp=4, vpp=8, ep=8, micro_batch=1, zero_stage=1))),
}

_BUILT: dict = {}


def built(name):
    if name not in _BUILT:
        model, cluster, make = MATRIX[name]
        g, c = model(), preset(cluster)
        _BUILT[name] = g, c, make(g, c)
    return _BUILT[name]


def gsc(name):
    """(graph, strategy, cluster): export's argument order."""
    g, c, s = built(name)
    return g, s, c


def stage_counts(graph, strategy) -> list[int]:
    """Layers on each pipeline chunk of the strategy (chunk order)."""
    per = [0] * (strategy.pipeline.stages * strategy.pipeline.virtual_stages)
    for b in layer_blocks(graph):
        first = next(op for op in graph.ops if op.block == b)
        per[strategy.stage_of.get(first.name, 0)] += 1
    return per


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_megatron_would_run_the_strategy(name):
    g, c, s = built(name)
    lay = infer_layout(g, s, c)
    text = export("megatron", g, s, c)
    args = megatron_parse(text)
    arch = 10 if c.name.startswith("dgx-b200") else 9 if "h100" in c.name else 8
    seq = max(op.dim("length").size for op in g.ops if "length" in op.dim_names)
    megatron_rules(args, c.num_devices, len(layer_blocks(g)), seq=seq, env=environment(text), arch=arch)
    run = what_megatron_runs(args)
    assert run["dp"] == lay.dp == s.configs[next(op.name for op in g.ops if op.kind == "linear")].degree("sample")
    assert run["microbatches"] == s.pipeline.microbatches
    assert run["vpp"] == s.pipeline.virtual_stages
    assert run["recompute"] == s.recompute and run["recompute_modules"] == s.recompute_modules
    assert run["zero_stage"] == s.zero_stage
    assert run["shard_group"] == (s.shard_group if s.shard_group < lay.dp * lay.cp else 0)
    assert run["precision"] == g.precision and run["fp8"] == s.fp8
    assert run["sequence_parallel"] == (s.sequence_parallel and lay.tp > 1)
    if g.precision == "bf16" and s.zero_stage < 2:
        assert run["grad_reduce_in_fp32"] == s.grad_reduce_in_fp32
    assert run["offload_activations"] == s.offload_activations and run["kernels"] == s.kernels
    if args.pipeline_model_parallel_layout is not None:
        chunks = parse_pipeline_layout(args.pipeline_model_parallel_layout)
        assert [x.count("t") for x in chunks] == stage_counts(g, s)
    elif args.decoder_first_pipeline_num_layers is not None:
        counts = stage_counts(g, s)
        assert (counts[0], counts[-1]) == (args.decoder_first_pipeline_num_layers,
                                           args.decoder_last_pipeline_num_layers)
        assert len(set(counts[1:-1])) == 1
    elif s.pipeline.stages > 1:
        assert len(set(stage_counts(g, s))) == 1
    # and the flags give the layout back
    back = layout_from_megatron(text, lay)
    assert build_layout(g, c, back).configs == s.configs
    assert (back.zero_stage, back.shard_group, back.vpp, back.recompute, back.optimizer_state,
            back.offload_activations, back.kernels) == \
        (lay.zero_stage, lay.shard_group if lay.shard_group < lay.dp * lay.cp else 0, lay.vpp, lay.recompute,
         lay.optimizer_state, lay.offload_activations, lay.kernels)
    moments = "bf16" if s.optimizer_state == "bf16-moments" else "fp32"
    assert args.use_precision_aware_optimizer == (moments == "bf16")
    assert (args.exp_avg_dtype, args.exp_avg_sq_dtype, args.main_params_dtype) == (moments, moments, "fp32")


def test_the_text_names_the_release_then_the_environment_then_one_line_of_flags():
    g, c, s = built("tp2-sp-cp2")
    text = export("megatron", g, s, c)
    lines = text.splitlines()
    assert lines[0].startswith("# Megatron-LM core_v0.19.0 (commit 5be9626709af), megatron/training/arguments.py")
    assert MEGATRON_RELEASE in lines[0]
    assert lines[-2] == "export CUDA_DEVICE_MAX_CONNECTIONS=1" and lines[-1].startswith("--tensor-model")
    assert all(x.startswith("#") for x in lines[:-2])
    assert megatron_flags(text)[:2] == ["--tensor-model-parallel-size", "2"]


def test_max_connections_only_where_validate_args_asks_for_it():
    """tp or cp > 1 before Blackwell, not under Megatron-FSDP (which asserts it is not 1)."""
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" not in export("megatron", *_tp1_dp())
    assert "export CUDA_DEVICE_MAX_CONNECTIONS" not in export("megatron", *gsc("llama-bf16-grads-bf16-b200"))
    g, c = build_sample("llama2-7b"), preset(B200)
    hopper = preset("dgx-h100:1")
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in export("megatron", g, build_layout(g, hopper, Layout(tp=2,
                                                                                                          micro_batch=2, sequence_parallel=True)), hopper)
    fs = export("megatron", g, fsdp(g, c, Layout(zero_stage=3, tp=2, sequence_parallel=True, micro_batch=2)), c)
    assert "export CUDA" not in fs and "leave CUDA_DEVICE_MAX_CONNECTIONS unset" in fs


def _tp1_dp():
    g, c = GPT2(), preset(A100)
    return g, data_parallel(g, c), c


def test_precision_flags_follow_the_model():
    g, c, s = built("llama-bf16-grads-bf16-b200")
    args = megatron_parse(export("megatron", g, s, c))
    assert args.bf16 and not args.fp16 and args.grad_reduce_in_bf16
    g16, c = resolve_model("gpt2", batch=32, precision="fp16"), preset(A100)
    assert megatron_parse(export("megatron", g16, data_parallel(g16, c), c)).fp16
    g32, c = GPT2(), preset(A100)
    args = megatron_parse(export("megatron", g32, data_parallel(g32, c), c))
    assert not args.bf16 and not args.fp16
    fp8 = megatron_parse(export("megatron", *gsc("llama-bf16-tp4-pp4-vpp2-fp8")))
    assert fp8.fp8 == "hybrid" and fp8.fp8_recipe == "delayed"


def test_arbitrary_splits_go_out_as_a_layout_string_and_come_back():
    g, c, s = built("tp4-pp4-any-split")
    lay = infer_layout(g, s, c)
    flags = to_megatron(lay, g, c)
    assert flags[flags.index("--pipeline-model-parallel-layout") + 1] == "Ett|ttt|ttttt|ttL"
    assert layout_from_megatron(flags, replace(lay, layers_per_stage=None)).layers_per_stage == (2, 3, 5, 2)
    # an empty first stage is a layout string too (Megatron's first/last counts must be positive)
    flags = to_megatron(replace(lay, layers_per_stage=(0, 4, 4, 4)), g, c)
    assert parse_pipeline_layout(flags[flags.index("--pipeline-model-parallel-layout") + 1]) == \
        ["E", "tttt", "tttt", "ttttL"]


def test_zero_2_and_3_are_megatron_fsdp():
    for name, strategy in (("fsdp-zero2", "optim_grads"), ("fsdp-zero3-full", "optim_grads_params")):
        args = megatron_parse(export("megatron", *gsc(name)))
        assert args.use_megatron_fsdp and args.data_parallel_sharding_strategy == strategy
        assert args.ckpt_format == "fsdp_dtensor"
    hsdp = megatron_parse(export("megatron", *gsc("llama-bf16-hsdp")))
    assert hsdp.num_distributed_optimizer_instances == 8  # 64 ranks, shards within 8


def test_refusals_name_the_reason():
    g, c = GPT2(), preset(A100)
    base = infer_layout(g, build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1, sequence_parallel=True, zero_stage=1)),
                        c)
    cases = {
        "per-op selective": replace(base, recompute="selective-op"),
        "ZeRO-Offload": replace(base, offload_optimizer="cpu"),
        "GPipe schedule": replace(base, schedule="gpipe"),
        "always overlaps the gradient reduce-scatter": replace(base, zero_stage=3, overlap_grad_reduce=False),
        "gathers a transformer layer at once": replace(base, zero_stage=3, gather_unit="op"),
        "needs --overlap-grad-reduce": replace(base, overlap_param_gather=True, overlap_grad_reduce=False),
        "multiple of 2 x cp": replace(base, tp=1, cp=1024, sequence_parallel=False, pp=1),
        "groups of pp": replace(base, vpp=2, schedule="interleaved", dp=4, micro_batch=3, global_batch=36),
    }
    for why, lay in cases.items():
        with pytest.raises(ValidationError, match=why):
            to_megatron(lay, g, c)
    llama = build_sample("llama2-7b")
    lay = Layout(tp=1, dp=8, micro_batch=1, global_batch=8, fp8=True, zero_stage=0)
    with pytest.raises(ValidationError, match="fp8 GEMMs on a fp32 model"):
        to_megatron(lay, g, c)
    with pytest.raises(ValidationError, match="Hopper or later"):
        to_megatron(lay, llama, preset("dgx-a100-80gb:1"))
    with pytest.raises(ValidationError, match=r"need the distributed optimizer or FSDP"):
        to_megatron(replace(lay, fp8_params=True), llama, preset("dgx-h100:1"))
    with pytest.raises(ValidationError, match="delayed scaling"):
        to_megatron(replace(lay, recompute="selective", recompute_modules=("layernorm",)), llama, preset("dgx-h100:1"))
    with pytest.raises(ValidationError, match="fp8 GEMMs by torchao: Megatron-LM runs them through Transformer Engine"):
        to_megatron(replace(lay, fp8_library="torchao"), llama, preset("dgx-h100:1"))
    with pytest.raises(ValidationError, match="keeps a master copy"):
        to_megatron(replace(lay, fp8=False, zero_stage=1, optimizer_state="bf16"), llama, preset("dgx-h100:1"))
    with pytest.raises(ValidationError, match=r"need the distributed optimizer \(OptimizerConfig\)"):
        to_megatron(replace(lay, fp8=False, optimizer_state="bf16-moments"), llama, preset("dgx-h100:1"))
    with pytest.raises(ValidationError, match="no switch for TF32"):
        to_megatron(Layout(dp=8, micro_batch=1, global_batch=32), resolve_model("gpt2", batch=32, precision="tf32"),
                    preset("dgx-h100:1"))


#: the published shapes of the samples (model cards), as Megatron-LM's parser reads the export
MODEL_SHAPES = {
    "gpt2": dict(num_layers=12, hidden_size=768, ffn_hidden_size=3072, num_attention_heads=12, num_query_groups=None,
                 kv_channels=None, normalization=None, swiglu=False, disable_bias_linear=False, qk_layernorm=False,
                 position_embedding_type=None, max_position_embeddings=1024, untie_embeddings_and_output_weights=False,
                 attention_dropout=0.1, hidden_dropout=0.1),
    "llama2-7b": dict(num_layers=32, hidden_size=4096, ffn_hidden_size=11008, num_attention_heads=32,
                      num_query_groups=None, kv_channels=None, normalization="RMSNorm", swiglu=True,
                      disable_bias_linear=True, qk_layernorm=False, position_embedding_type="rope",
                      max_position_embeddings=4096, untie_embeddings_and_output_weights=True, attention_dropout=0.0,
                      hidden_dropout=0.0),
    "qwen3-30b-a3b": dict(num_layers=48, hidden_size=2048, ffn_hidden_size=None, num_attention_heads=32,
                          num_query_groups=4, kv_channels=128, normalization="RMSNorm", swiglu=True,
                          disable_bias_linear=True, qk_layernorm=True, position_embedding_type="rope",
                          max_position_embeddings=4096, untie_embeddings_and_output_weights=True,
                          attention_dropout=0.0, hidden_dropout=0.0),
}


@pytest.mark.parametrize("name", sorted(MODEL_SHAPES))
def test_the_model_flags_build_the_simulated_model(name):
    """The export carries the model's own flags, so pretrain_gpt.py builds what was simulated
    (checked once against core_v0.19.0's own parse_args, validate_args and TransformerConfig)."""
    g = build_sample(name, batch=64)
    c = preset("dgx-h100:4")
    moe = {"ep": 8} if "qwen" in name else {}
    s = build_layout(g, c, Layout(tp=2, sequence_parallel=True, micro_batch=1, zero_stage=1, **moe))
    text = export("megatron", g, s, c)
    args = megatron_parse(text)
    assert {k: getattr(args, k) for k in MODEL_SHAPES[name]} == MODEL_SHAPES[name]
    assert args.seq_length == max(op.dim("length").size for op in g.ops if "length" in op.dim_names)
    assert args.attention_backend == ("unfused" if any(o.kind == "softmax" for o in g.ops) else None)
    assert "# vocabulary: set by the tokenizer" in text and "add the flags of the model" not in text


@pytest.mark.parametrize("name,why", [("gpt-oss-120b", "windowed or non-causal attention"),
                                      ("bert-large", "post-norm layers")])
def test_models_it_cannot_describe_ask_for_their_flags(name, why):
    g = build_sample(name, batch=128)
    c = preset("dgx-h100:8")
    kw = {"ep": 8, "zero_stage": 1} if name.startswith("gpt-oss") else {}
    text = export("megatron", g, build_layout(g, c, Layout(micro_batch=1, **kw)), c)
    assert f"soapbox does not write them for {why}" in text and "--num-layers" not in megatron_flags(text)
