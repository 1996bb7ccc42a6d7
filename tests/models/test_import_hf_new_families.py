"""Issue 44: ``import --hf`` of Qwen3 (dense, QK-norm), Gemma-2 (norms on the attention's and
the MLP's outputs too, every other layer windowed), Gemma-3 (both, five windowed layers in six;
its image-text config's language model), Llama 4 Scout (experts on every layer with a shared
expert, its image-text config's language model) and Maverick (experts on every second layer,
dense MLPs between): parameters equal to transformers' own models of
the published configs (built on the meta device; the counts are pinned as transformers 5.24
gives them), windows on the layers transformers windows, and small versions' forward GEMM FLOPs
equal to transformers' eager models'."""

from __future__ import annotations

import pytest

from engine.models.hf import from_hf_config
from test_import_hf_families import BATCH, SEQ, TINY, soapbox_forward_flops, torch_forward_flops, transformers_count

QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False,
            "attention_bias": False, "rms_norm_eps": 1e-6, "rope_theta": 1000000, "torch_dtype": "bfloat16",
            "use_sliding_window": False, "max_window_layers": 36}
GEMMA2_9B = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584,
             "intermediate_size": 14336, "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192, "sliding_window": 4096,
             "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
             "hidden_activation": "gelu_pytorch_tanh", "torch_dtype": "float32"}
GEMMA3_27B_TEXT = {"model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504,
                   "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
                   "vocab_size": 262208, "sliding_window": 1024, "query_pre_attn_scalar": 168,
                   "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}
GEMMA3_27B = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
              "text_config": GEMMA3_27B_TEXT, "vision_config": {"model_type": "siglip_vision_model"},
              "torch_dtype": "bfloat16"}
LLAMA4_SCOUT_TEXT = {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                     "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                     "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "num_local_experts": 16,
                     "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "use_qk_norm": True,
                     "attention_chunk_size": 8192, "max_position_embeddings": 10485760}
LLAMA4_SCOUT = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                "text_config": LLAMA4_SCOUT_TEXT, "vision_config": {}, "torch_dtype": "bfloat16"}

#: Llama 4 Maverick's language model (HF meta-llama/Llama-4-Maverick-17B-128E text_config):
#: Scout's shapes with 128 experts on every second layer and dense MLPs of 16,384 between
LLAMA4_MAVERICK_TEXT = {**LLAMA4_SCOUT_TEXT, "num_local_experts": 128, "interleave_moe_layer_step": 2,
                        "use_qk_norm": False, "max_position_embeddings": 1048576}

#: name -> (config imported, the language model's config as transformers builds it, its parameters)
PUBLISHED = {
    "qwen3-8b": (QWEN3_8B, QWEN3_8B, 8_190_735_360),
    "gemma-2-9b": (GEMMA2_9B, GEMMA2_9B, 9_241_705_984),
    "gemma-3-27b": (GEMMA3_27B, GEMMA3_27B_TEXT, 27_009_346_304),
    "llama-4-scout": (LLAMA4_SCOUT, LLAMA4_SCOUT_TEXT, 107_769_861_120),
    "llama-4-maverick": (LLAMA4_MAVERICK_TEXT, LLAMA4_MAVERICK_TEXT, 400_711_848_960),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameters_equal_transformers(name):
    cfg, text, count = PUBLISHED[name]
    notes: list[str] = []
    g = from_hf_config(cfg, batch=1, seq_len=4096, notes=notes)
    assert g.param_count == count
    if cfg is not text:
        assert any("the vision encoder and its projector are not modelled" in n for n in notes)
    try:
        import transformers  # noqa: F401
    except ImportError:
        return  # the pinned count stands
    assert transformers_count(text) == count


@pytest.mark.parametrize("cfg, layers", [(GEMMA2_9B, 42), (GEMMA3_27B_TEXT, 62)])
def test_the_windowed_layers_are_transformers(cfg, layers):
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(**cfg)
    want = [i for i, t in enumerate(config.layer_types) if t == "sliding_attention"]
    g = from_hf_config(cfg, batch=1, seq_len=8192)
    got = [i for i in range(layers) if g[f"layers.{i}.attn.core"].attrs.get("window")]
    assert got == want and len(want) == (21 if layers == 42 else 52)


def test_llama4_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match="chunked attention .* is not modelled"):
        from_hf_config(LLAMA4_SCOUT, batch=1, seq_len=16384)
    for bad in ([3, 1], [1, 1], [48], "1,3", [True]):
        with pytest.raises(ValueError, match="moe_layers .*: distinct layer numbers 0..47 in order"):
            from_hf_config({**LLAMA4_SCOUT_TEXT, "moe_layers": bad}, batch=1)


@pytest.mark.parametrize("given", [{"interleave_moe_layer_step": 2}, {"interleave_moe_layer_step": 3},
                                   {"moe_layers": [0, 5, 6, 47]}])
def test_llama4s_experts_layers_are_transformers(given):
    """Maverick interleaves dense and experts layers (transformers' ``moe_layers``: every
    ``interleave_moe_layer_step``-th from step - 1, or as listed); the dense ones have the
    ``intermediate_size_mlp`` MLP."""
    cfg = {**LLAMA4_SCOUT_TEXT, **given}
    g = from_hf_config(cfg, batch=1, seq_len=4096)
    got = [i for i in range(48) if f"layers.{i}.mlp.experts" in g.index]
    step = given.get("interleave_moe_layer_step")
    assert got == (list(range(step - 1, 48, step)) if step else given["moe_layers"])
    dense = next(i for i in range(48) if i not in got)
    assert max(p.shape[-1] for op in g.ops if op.name.startswith(f"layers.{dense}.mlp") for p in op.params
               if len(p.shape) == 2) == 16384
    transformers = pytest.importorskip("transformers")
    assert transformers.AutoConfig.for_model(**cfg).moe_layers == got


SMALL = {
    "qwen3": {**QWEN3_8B, **TINY, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96},
    "gemma2": {**GEMMA2_9B, **TINY, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
               "sliding_window": 4096, "query_pre_attn_scalar": 16},
    "gemma3": {**GEMMA3_27B_TEXT, **TINY, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
               "sliding_window": 4096, "query_pre_attn_scalar": 16},
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_versions_equal_transformers(name):
    """Parameters and forward GEMM FLOPs (eager attention: windows of 4,096 cover the sequence)."""
    pytest.importorskip("transformers")
    cfg = SMALL[name]
    assert from_hf_config(cfg, batch=BATCH, seq_len=SEQ).param_count == transformers_count(cfg)
    assert soapbox_forward_flops(cfg) == torch_forward_flops(cfg)
