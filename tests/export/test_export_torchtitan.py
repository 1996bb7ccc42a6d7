"""Issue 27: ``soapbox export --format torchtitan`` writes a torchtitan 0.3.0 launch whose
overrides torchtitan's own ``ConfigManager`` parses (its checks run) and whose run, computed
from the parsed config as torchtitan computes it, is the simulated one: data-parallel degree,
microbatches (accumulation steps x pipeline microbatches), virtual stages, recomputation,
sharding and precision. What torchtitan cannot run as simulated is refused with the reason.

torchtitan 0.3.0's model modules import triton at import time (``models/common/
token_dispatcher.py`` -> ``distributed/minimal_async_ep/kernels.py``), which torch's CUDA wheels
bring and the CPU wheel does not: without triton the framework checks are skipped (``pip install
triton==3.9.0``; importing it needs no GPU).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.cluster import preset
from engine.errors import ValidationError
from engine.layout.build import build_layout
from engine.export import export, infer_layout
from engine.export.torchtitan import PLACEHOLDER, SHIPPED, launch_args, layout_from_torchtitan
from engine.formats import resolve_model
from engine.layout import Layout
from engine.graph.blocks import layer_blocks
from engine.models import build_sample
from engine.models.hf import from_hf_config
from engine.search.baselines import data_parallel
from engine.layout.build import fsdp
from engine.layout import build_layout

G, C = resolve_model("gpt2", batch=32), preset("dgx-a100-80gb:2")  # fp32, tied embeddings; 16 GPUs
L, C64 = build_sample("llama2-7b", batch=64), preset("dgx-h100:8")  # bf16, untied; 64 GPUs
C16 = preset("dgx-h100:2")


def llama3(layers, hidden, heads, ffn, batch, seq=8192):
    """A Llama 3 graph as soapbox import --hf builds it (the shapes of torchtitan's flavors)."""
    return from_hf_config(dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=hidden,
                               intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=heads,
                               num_key_value_heads=8, vocab_size=128256, max_position_embeddings=seq,
                               rms_norm_eps=1e-5, tie_word_embeddings=False, torch_dtype="bfloat16",
                               hidden_act="silu"), batch=batch, seq_len=seq)


L8 = llama3(32, 4096, 32, 14336, batch=32)
MIX = build_sample("mixtral-8x7b", batch=64)

#: name -> (graph, cluster, strategy): at least ten layouts, every knob the export maps
MATRIX = {
    "gpt2-fsdp-zero3-full-accumulate2": lambda: (G, C, fsdp(G, C, Layout(zero_stage=3, micro_batch=1,
                                                                         recompute="full"))),
    "gpt2-hsdp-8-selective-op": lambda: (G, C, fsdp(G, C, Layout(zero_stage=3, micro_batch=1, recompute="selective-op",
                                                                 shard_group=8))),
    "gpt2-ddp": lambda: (G, C, data_parallel(G, C)),
    "gpt2-fsdp-zero2": lambda: (G, C, fsdp(G, C, Layout(zero_stage=2))),
    "gpt2-tp2-sp-cp2-zero3": lambda: (G, C, build_layout(G, C, Layout(tp=2, cp=2, sequence_parallel=True,
                                                                      micro_batch=1, zero_stage=3))),
    "llama2-tp2-pp4-vpp2-zero2": lambda: (L, C64, build_layout(L, C64, Layout(tp=2, pp=4, vpp=2, micro_batch=1,
                                                                              sequence_parallel=True, zero_stage=2,
                                                                              accumulate_unsharded=True))),
    "llama2-tp4-pp2-uneven-ddp-full": lambda: (L, C64, build_layout(L, C64, Layout(tp=4, pp=2, micro_batch=2,
                                                                                   layers_per_stage=[15,
                                                                                                     17], sequence_parallel=True, recompute="full"))),
    "llama2-pp4-gpipe-zero2-hsdp": lambda: (L, C64, build_layout(L, C64, Layout(pp=4, micro_batch=1, schedule="gpipe",
                                                                                    zero_stage=2, shard_group=8,
                                                                                    accumulate_unsharded=True))),
    "llama2-tp2-cp2-zero3-selective-op": lambda: (L, C64, build_layout(L, C64, Layout(tp=2, cp=2,
                                                                                      sequence_parallel=True, micro_batch=1, zero_stage=3, recompute="selective-op"))),
    "llama3-8b-tp2-no-sp-zero3": lambda: (L8, C16, build_layout(L8, C16, Layout(tp=2, micro_batch=1, zero_stage=3))),
    "llama3-8b-zero3-eager": lambda: (L8, C16, fsdp(L8, C16, Layout(zero_stage=3, micro_batch=1, kernels="eager"))),
    "mixtral-ep8-zero3": lambda: (MIX, C64, build_layout(MIX, C64, Layout(tp=2, sequence_parallel=True, ep=8,
                                                                          zero_stage=3, micro_batch=1, recompute="full"))),
}


# ----------------------------------------------------------------------------- the framework's view

def _framework():
    pytest.importorskip("torchtitan", reason="torchtitan 0.3.0 is a test extra")
    pytest.importorskip("triton", reason="torchtitan 0.3.0's model modules import triton (pip install "
                                         "triton==3.9.0; no GPU needed)")
    import torchtitan

    assert torchtitan.__version__ == "0.3.0"


def parse(text: str, moe: bool = False):
    """torchtitan's own ConfigManager on the export's arguments (a placeholder module replaced
    by a shipped debug config, whose overrides then say everything parallel)."""
    from torchtitan.config import ConfigManager

    args = launch_args(text)
    if PLACEHOLDER[0] in args:
        fill = ("deepseek_v3", "deepseek_v3_debugmodel") if moe else ("llama3", "llama3_debugmodel")
        args = [fill[PLACEHOLDER.index(a)] if a in PLACEHOLDER else a for a in args]
    return ConfigManager().parse_args(args)


def what_torchtitan_runs(cfg, world: int) -> dict:
    """What torchtitan 0.3.0 would run with config ``cfg`` on ``world`` ranks, computed as its
    code computes it."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class
    from torchtitan.components.quantization.utils import has_quantization
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.distributed.fsdp import get_fsdp_reshard_after_forward_policy

    p, t = cfg.parallelism, cfg.training
    pd = ParallelDims.from_config(p, world)  # (its _validate: the degrees multiply to the world size)
    dp = pd.dp_replicate * pd.dp_shard  # trainer.py: the "batch" mesh
    accumulation = t.global_batch_size // (t.local_batch_size * dp)  # trainer.py
    assert accumulation * t.local_batch_size * dp == t.global_batch_size
    pp_microbatches = t.local_batch_size // p.pipeline_parallel_microbatch_size if pd.pp_enabled else 1
    vpp, split = 1, None
    if pd.pp_enabled:
        parts = p.module_fqns_per_model_part
        assert len(parts) % pd.pp == 0  # (pipeline_parallel.py: stages per rank = chunks / pp)
        vpp = len(parts) // pd.pp
        looped = issubclass(get_schedule_class(p.pipeline_parallel_schedule), PipelineScheduleMulti)
        assert looped == (vpp > 1)
        split = [sum(m.startswith("layers.") for m in part) for part in parts]
    ac = cfg.activation_checkpoint
    recompute = ("none" if ac is None else "full" if type(ac) is FullAC.Config
                 else "selective-op" if type(ac) is SelectiveAC.Config else type(ac).__name__)
    if not pd.fsdp_enabled:
        zero = 0  # (dp_shard 1, cp 1: parameters replicated over dp_replicate)
    elif pd.pp_enabled:
        zero = 2  # torch's pipelining: no reshard, one gradient reduce-scatter per step
    else:
        zero = 3 if get_fsdp_reshard_after_forward_policy(p.fsdp_reshard_after_forward, False) else 2
    return dict(dp=dp, tp=pd.tp, cp=pd.cp, pp=pd.pp, ep=pd.ep, microbatches=accumulation * pp_microbatches,
                vpp=vpp, split=split, recompute=recompute, zero=zero,
                shard_group=pd.dp_shard * pd.cp if zero and pd.dp_replicate > 1 else 0,
                precision={"bfloat16": "bf16", "float32": "fp32"}[t.mixed_precision_param], seq=t.seq_len,
                sequence_parallel=pd.tp > 1 and p.enable_sequence_parallel,
                fp8=cfg.model_spec is not None and has_quantization(cfg.model_spec.model),
                kernels="fused" if cfg.compile.enable and "model" in cfg.compile.components else "eager")


def simulated(graph, s) -> dict:
    """The same facts of the strategy ``s`` as simulated."""
    layers = layer_blocks(graph)
    lin = next(op for op in graph.ops if op.kind == "linear" and op.block in layers)
    cfg = s.configs[lin.name]
    pp, vpp = s.pipeline.stages, s.pipeline.virtual_stages
    split = None
    if pp > 1:
        chunk = {}
        for b in layers:
            first = next(op for op in graph.ops if op.block == b)
            chunk.setdefault(s.stage_of.get(first.name, 0), []).append(b)
        split = [len(v) for _, v in sorted(chunk.items())] if vpp == 1 else None
    moe = next((s.configs[op.name] for op in graph.ops if op.kind == "experts"), None)
    return dict(dp=cfg.degree("sample"), pp=pp, vpp=vpp, microbatches=max(1, s.pipeline.microbatches), split=split,
                recompute=s.recompute, zero=s.zero_stage, shard_group=s.shard_group, precision=graph.precision,
                fp8=s.fp8, sequence_parallel=s.sequence_parallel, kernels=s.kernels,
                ep=moe.degree("expert") * moe.degree("expert_seq") if moe is not None else 1,
                seq=next(op.dim("length").size for op in graph.ops if "length" in op.dim_names))


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_torchtitan_runs_what_was_simulated(name):
    _framework()
    graph, cluster, s = MATRIX[name]()
    text = export("torchtitan", graph, s, cluster)
    assert "torchtitan 0.3.0" in text.splitlines()[0]
    ran = what_torchtitan_runs(parse(text, moe=graph is MIX), cluster.num_devices)
    want = simulated(graph, s)
    if want["split"] is None or ran["split"] is None:  # (interleaved: chunk sizes checked by the round trip)
        want.pop("split"), ran.pop("split")
    assert {k: ran[k] for k in want} == want


def test_a_shipped_model_gets_its_config_and_torchtitan_builds_that_shape():
    _framework()
    from torchtitan.models.llama3 import model_registry

    text = export("torchtitan", L8, fsdp(L8, C16, Layout(zero_stage=3, micro_batch=1)), C16)
    args = launch_args(text)
    assert args[:4] == ["--module", "llama3", "--config", "llama3_8b"]
    cfg = parse(text)
    assert cfg.model_spec.flavor == "8B" and cfg.training.seq_len == 8192
    for (layers, dim, heads, kv, ffn, vocab), (module, fn, _) in SHIPPED.items():
        m = model_registry(fn.split("_")[1].upper()).model
        att, ff = m.layers[0].attention, m.layers[0].feed_forward
        assert (len(m.layers), m.dim, att.n_heads, att.n_kv_heads, ff.w1.out_features, m.vocab_size) == \
            (layers, dim, heads, kv, ffn, vocab), fn


def test_fp8_goes_out_only_with_a_config_function_that_converts_to_float8():
    big = llama3(126, 16384, 128, 53248, batch=16, seq=8192)
    c = preset("dgx-h100:16")
    s = build_layout(big, c, Layout(tp=8, pp=8, micro_batch=1, sequence_parallel=True, zero_stage=2, fp8=True,
                                    accumulate_unsharded=True, fp8_library="torchao"))
    text = export("torchtitan", big, s, c)
    assert launch_args(text)[:4] == ["--module", "llama3", "--config", "llama3_405b"]
    # without fp8 the 405B config (which converts to float8) is not named
    plain = export("torchtitan", big, replace(s, fp8=False, fp8_library="te"), c)
    assert launch_args(plain)[:4] == ["--module", PLACEHOLDER[0], "--config", PLACEHOLDER[1]]
    _framework()
    try:  # (llama3_405b builds its Float8LinearConverter when loaded: torchao and an SM89+ GPU)
        cfg = parse(text)
    except (ImportError, ValueError) as e:
        pytest.skip(f"llama3_405b's float8 converter cannot be built here: {e}")
    ran = what_torchtitan_runs(cfg, c.num_devices)
    assert ran == dict(ran, fp8=True, zero=2, dp=2, microbatches=8, tp=8, pp=8, precision="bf16")


# ----------------------------------------------------------------------------- round trips, text

@pytest.mark.parametrize("name", sorted(MATRIX))
def test_round_trip(name):
    graph, cluster, s = MATRIX[name]()
    lay = infer_layout(graph, s, cluster)
    back = layout_from_torchtitan(export("torchtitan", graph, s, cluster), lay)
    rebuilt = build_layout(graph, cluster, back)
    assert rebuilt.pipeline == s.pipeline and rebuilt.zero_stage == s.zero_stage
    assert rebuilt.shard_group == s.shard_group and dict(rebuilt.stage_of) == dict(s.stage_of)
    assert all(rebuilt.configs[op.name] == s.configs[op.name] for op in graph.ops)


def test_the_launch_says_the_release_what_to_add_and_is_complete():
    text = export("torchtitan", G, fsdp(G, C, Layout(zero_stage=3, micro_batch=1, recompute="full")), C)
    assert "# soapbox export --format torchtitan: for torchtitan 0.3.0" in text
    assert f"replace {PLACEHOLDER[0]} and {PLACEHOLDER[1]}" in text and "--hf_assets_path" in text
    args = launch_args(text)
    assert "torchrun --nnodes 2 --nproc-per-node 8" in text
    for key in ("data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                "tensor_parallel_degree", "context_parallel_degree", "pipeline_parallel_degree"):
        assert f"--parallelism.{key}" in args
    assert args[-1] == "activation-checkpoint:full"
    i = args.index("--training.local_batch_size")
    assert args[i:i + 4] == ["--training.local_batch_size", "1", "--training.global_batch_size", "32"]


# ----------------------------------------------------------------------------- refusals

def refused(graph, s, cluster, why):
    with pytest.raises(ValidationError, match=f"torchtitan: {why}"):
        export("torchtitan", graph, s, cluster)


def test_zero1_is_refused():
    refused(G, build_layout(G, C, Layout(tp=2, sequence_parallel=True, zero_stage=1)), C,
            "ZeRO-1.*use-distributed-optimizer")


def test_optimizer_state_other_than_fp32_is_refused():
    for state in ("bf16", "bf16-moments"):
        refused(L, fsdp(L, C64, Layout(zero_stage=3, micro_batch=1, optimizer_state=state)), C64,
                f"optimizer state {state}: .*sharded parameters in float32")


def test_fp16_is_refused():
    b = resolve_model("bert-large", batch=16)
    refused(b, fsdp(b, C, Layout(zero_stage=3, micro_batch=1)), C, "fp16 training.*bfloat16 or float32")


def test_megatron_selective_recompute_is_refused():
    refused(L, build_layout(L, C64, Layout(tp=2, sequence_parallel=True, recompute="selective", micro_batch=1,
                                           zero_stage=3)),
            C64, "Megatron's selective recomputation.*per-op.*selective-op or full")


def test_tp_comm_overlap_is_refused():
    s = build_layout(L, C64, Layout(tp=2, sequence_parallel=True, tp_comm_overlap=True, micro_batch=1, zero_stage=3))
    refused(L, s, C64, "tensor-parallel communication overlap.*async TP needs torch.compile")
    s = build_layout(L, C64, Layout(tp=2, micro_batch=1, sequence_parallel=True, offload_activations=2))
    refused(L, s, C64, "activation offloading.*torchtitan 0.3.0 has no setting")


def test_cp_without_zero_is_refused():
    refused(L, build_layout(L, C64, Layout(tp=2, cp=2, sequence_parallel=True, micro_batch=4)), C64,
            "cp 2 without ZeRO: .*always FSDP-shards")


def test_zero3_with_pipelines_is_refused():
    refused(L, build_layout(L, C64, Layout(pp=2, micro_batch=1, zero_stage=3)), C64,
            "ZeRO-3 with pipeline parallelism.*backward_maybe_with_nosync")


def test_zero2_with_pipelines_needs_unsharded_accumulation():
    """torch's pipelining under FSDP2 keeps every microbatch's gradients unsharded to the step's
    one reduce-scatter: a ZeRO-2 pipeline whose gradients are sharded per microbatch is not
    what torchtitan runs; without pp, unsharded accumulation is not either."""
    refused(L, build_layout(L, C64, Layout(pp=2, micro_batch=1, zero_stage=2)), C64,
            "ZeRO-2 with pp and gradients reduce-scattered.*turn accumulate_unsharded on")
    refused(G, fsdp(G, C, Layout(zero_stage=3, micro_batch=1, accumulate_unsharded=True)), C,
            "unsharded gradient accumulation.*without pp")


def test_accumulation_with_zero0_or_2_is_refused():
    refused(G, data_parallel(G, C, micro_batch=1), C, "2 accumulated microbatches with ZeRO-0.*every accumulation")
    refused(G, fsdp(G, C, Layout(zero_stage=2, micro_batch=1)), C, "2 accumulated microbatches with ZeRO-2")


def test_tied_weights_with_pipelines_are_refused():
    refused(G, build_layout(G, C, Layout(pp=2, micro_batch=1)), C, "tied embedding.*weight tying under pp")


def test_fp8_without_a_float8_config_is_refused():
    refused(L, build_layout(L, C64, Layout(tp=2, sequence_parallel=True, micro_batch=1, zero_stage=3, fp8=True,
                                           fp8_library="torchao")), C64,
            "fp8 GEMMs.*model converter.*Float8LinearConverter")


def test_fp8_by_transformer_engine_is_refused():
    """torchtitan's float8 is torchao's, which keeps the bf16 input where Transformer Engine keeps
    the fp8 one: a strategy simulated with Transformer Engine's memory is not what it runs."""
    refused(L, build_layout(L, C64, Layout(tp=2, sequence_parallel=True, micro_batch=1, zero_stage=3, fp8=True)), C64,
            "fp8 GEMMs by te: torchtitan's float8 is torchao's.*fp8_library torchao")


def test_offload_and_bf16_reduction_are_refused():
    refused(L, fsdp(L, C64, Layout(zero_stage=2, micro_batch=1, offload_optimizer="cpu")), C64, "ZeRO-Offload")
    refused(L, replace(fsdp(L, C64, Layout(zero_stage=3, micro_batch=1)), grad_reduce_in_fp32=False), C64,
            "bf16 gradient reduction.*float32 only")


def test_expert_tensor_parallelism_is_refused():
    s = build_layout(MIX, C64, Layout(tp=2, sequence_parallel=True, ep=4, etp=2, zero_stage=3, micro_batch=1))
    refused(MIX, s, C64, "etp 2: torchtitan 0.3.0 has no expert tensor parallelism")


@pytest.mark.parametrize("sample, cluster, sinks", [("qwen3-30b-a3b", "dgx-h100:8", 0),
                                                    ("deepseek-v3", "dgx-h100:16", 0),
                                                    ("gpt-oss-120b", "dgx-h100:8", 2304)])
def test_shipped_mixture_of_experts_configs_are_named(sample, cluster, sinks):
    """Issue 44: the exports wrote a placeholder for Qwen3, DeepSeek-V3 and gpt-oss although
    torchtitan 0.3.0 ships them; now the shipped config function is named where it builds the
    simulated model (the parameters, counted on the meta device, equal: GPT-OSS's attention
    sinks apart, which the export says)."""
    import torch

    from engine.export.torchtitan import SHIPPED_MOE
    from engine.models import build_sample

    g, c = build_sample(sample), preset(cluster)
    s = fsdp(g, c, Layout(zero_stage=3, ep=8, micro_batch=1))
    text = export("torchtitan", g, s, c)
    module = next(e for k, v in SHIPPED_MOE.items() if k[0] == g.param_count for e in v if not e[2])
    assert launch_args(text)[:4] == ["--module", module[0], "--config", module[1]]
    assert ("attention sinks" in text) == bool(sinks)
    _framework()
    cfg = parse(text)
    with torch.device("meta"):
        model = cfg.model_spec.model.build()
    assert sum(p.numel() for p in model.parameters()) == g.param_count + sinks
    ran = what_torchtitan_runs(cfg, c.num_devices)
    assert ran == dict(ran, zero=3, microbatches=s.pipeline.microbatches)


def test_fp8_deepseek_v3_names_the_shipped_float8_config():
    """torchtitan 0.3.0 ships deepseek_v3_671b_float8 (its experts and linears in float8 by
    torchao); a DeepSeek-V3 layout with fp8 GEMMs by torchao names it, and the refusal of fp8
    elsewhere lists both shipped float8 configs (it said llama3_405b only)."""
    from engine.models import build_sample

    g, c = build_sample("deepseek-v3"), preset("dgx-h100:16")
    s = fsdp(g, c, Layout(zero_stage=3, ep=8, micro_batch=1, fp8=True, fp8_library="torchao"))
    text = export("torchtitan", g, s, c)
    assert launch_args(text)[:4] == ["--module", "deepseek_v3", "--config", "deepseek_v3_671b_float8"]
    assert "keeps lm_head and the routers' gates in bf16" in text
    with pytest.raises(ValidationError, match="ships it for llama3_405b and deepseek_v3_671b_float8"):
        small, h = resolve_model("gpt2", batch=16, precision="bf16"), preset("dgx-h100:1")
        export("torchtitan", small, fsdp(small, h, Layout(zero_stage=3, micro_batch=1, fp8=True,
                                                         fp8_library="torchao")), h)
