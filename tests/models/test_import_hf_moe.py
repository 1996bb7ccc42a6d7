"""Issue 26: mixture-of-experts decoders from a Hugging Face config.json (Mixtral, Qwen3-MoE,
DeepSeek-V3, GPT-OSS), built by the MoE samples' builder; their parameters counted against
transformers' own model of the same config (built on the meta device: no weights allocated),
against the published totals, and refusals that name the field."""

from __future__ import annotations

import json

import pytest

from engine.cli import main
from engine.formats import load_model, resolve_model
from engine.models.hf import MAX_EXPERTS, MAX_LAYERS, from_hf_config
from engine.moe import active_parameters

# The config.json files as published on the Hugging Face hub, every field.
# https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0",
    "use_cache": True, "vocab_size": 32000}
# https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}
# https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json (the fields that differ)
QWEN3_235B_A22B = {**QWEN3_30B_A3B, "hidden_size": 4096, "intermediate_size": 12288, "max_window_layers": 94,
                   "moe_intermediate_size": 1536, "num_attention_heads": 64, "num_hidden_layers": 94}
# https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json (auto_map left out)
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "pretraining_tp": 1,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280}
# https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "max_position_embeddings": 131072,
    "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "num_local_experts": 128, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088}

#: config, the sample it equals, published total and active parameters (billions), and the
#: parameters soapbox leaves out (GPT-OSS's attention sinks: 64 heads x 36 layers).
#: Published: Mixtral (Mistral AI's announcement, Dec. 2023: 46.7 B, 12.9 B a token); Qwen3 cards (30.5 B /
#: 3.3 B; 235 B / 22 B); DeepSeek-V3 model card (671 B / 37 B, the main model without the 14 B
#: multi-token-prediction module); gpt-oss model card Table 1 (116.83 B / 5.13 B, whose active
#: count leaves out the input embedding table).
PUBLISHED = {
    "mixtral": (MIXTRAL_8X7B, "mixtral-8x7b", 46.7, 12.9, 0),
    "qwen3-30b": (QWEN3_30B_A3B, "qwen3-30b-a3b", 30.5, 3.3, 0),
    "qwen3-235b": (QWEN3_235B_A22B, "qwen3-235b-a22b", 235, 22, 0),
    "deepseek-v3": (DEEPSEEK_V3, "deepseek-v3", 671, 37, 0),
    "gpt-oss-120b": (GPT_OSS_120B, "gpt-oss-120b", 116.83, 5.13, 64 * 36),
}


def transformers_counts(cfg: dict) -> tuple[int, int]:
    """(total, active) parameters of transformers' model of ``cfg``, built on the meta device:
    active = total less the routed experts' share that a token does not use, (E - k) / E."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    routed = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg["num_experts"]
    assert routed % experts == 0
    return total, total - routed // experts * (experts - cfg["num_experts_per_tok"])


def imported(cfg: dict, **kw):
    return from_hf_config(cfg, batch=kw.pop("batch", 8), seq_len=kw.pop("seq_len", 4096), **kw)


# ------------------------------------------------------------------ the published configs


@pytest.mark.parametrize("key", list(PUBLISHED))
def test_counts_equal_transformers(key):
    cfg, _, _, _, left_out = PUBLISHED[key]
    g = imported(cfg)
    total, active = transformers_counts(cfg)
    assert g.param_count == total - left_out
    assert active_parameters(g) == active - left_out


@pytest.mark.parametrize("key", list(PUBLISHED))
def test_counts_equal_the_published_sizes(key):
    cfg, _, total_b, active_b, _ = PUBLISHED[key]
    g = imported(cfg)
    digits = len(str(total_b).partition(".")[2])  # as many decimals as the source gives
    assert round(g.param_count / 1e9, digits) == total_b
    active = active_parameters(g)
    if key == "gpt-oss-120b":  # the card's active count leaves out the input embedding table
        active -= cfg["vocab_size"] * cfg["hidden_size"]
        assert round(active / 1e9, 2) == active_b
    else:  # the cards round their active counts loosely (Qwen3-30B-A3B: 3.35 B as "3.3 B"): within 2%
        assert abs(active / 1e9 - active_b) < 0.02 * active_b


@pytest.mark.parametrize("key", list(PUBLISHED))
def test_equals_the_sample_model(key):
    cfg, sample, _, _, _ = PUBLISHED[key]
    g = imported(cfg, batch=8, seq_len=512)
    s = resolve_model(sample)  # the sample as shipped: its defaults' batch and sequence
    assert g.param_count == s.param_count
    assert active_parameters(g) == active_parameters(s)
    from engine.models.moe import MOE_SAMPLES
    assert g.fingerprint == MOE_SAMPLES[sample](batch=8, seq_len=512).fingerprint  # same ops, shapes and FLOPs


def test_gpt_oss_notes_what_it_prices_differently():
    notes: list[str] = []
    g = imported(GPT_OSS_120B, notes=notes)
    assert notes == ["the attention sinks (one logit a head a layer, 2,304 parameters) are not modelled"]
    assert all(n in g.description for n in notes)
    # issue 27: the even layers attend within GPT-OSS's 128-token window, the odd ones causally
    assert g["layers.0.attn.core"].attrs["window"] == 128 and "window" not in g["layers.1.attn.core"].attrs
    assert g["layers.0.attn.q"].param_count == 2880 * 64 * 64 + 64 * 64  # attention biases
    assert g["layers.0.mlp.router"].param_count == 128 * 2880 + 128
    assert g["layers.0.mlp.experts"].param_count == 128 * (2880 * 2 * 2880 + 2 * 2880 + 2880 * 2880 + 2880)
    g = imported({**GPT_OSS_120B, "layer_types": ["full_attention"] * 36})
    assert not any("window" in o.attrs for o in g.ops if o.kind == "attention")


def test_deepseek_notes_the_multi_token_prediction_module():
    notes: list[str] = []
    imported(DEEPSEEK_V3, notes=notes)
    assert len(notes) == 1 and notes[0].startswith("num_nextn_predict_layers 1: the multi-token-prediction module")
    notes.clear()
    imported({**DEEPSEEK_V3, "num_nextn_predict_layers": 0}, notes=notes)
    assert notes == []


def test_sliding_window_is_modelled_only_when_it_is_shorter_than_the_sequence():
    cfg = {**MIXTRAL_8X7B, "sliding_window": 4096}

    def windows(g):
        return {o.attrs.get("window") for o in g.ops if o.kind == "attention"}

    assert windows(imported(cfg, seq_len=4096)) == {None}
    assert windows(imported(cfg, seq_len=8192)) == {4096}
    assert windows(imported({**QWEN3_30B_A3B, "use_sliding_window": True, "sliding_window": 1024})) == {1024}


def test_qwen3_norms_each_query_and_key_head():
    g = imported(QWEN3_30B_A3B)
    assert g["layers.0.attn.q.norm"].params[0].shape == (128,)
    assert g["layers.0.attn.k.norm"].out_tensors[0].shape == (8, 4, 4096, 128)  # [b, kv heads, s, d]


@pytest.mark.parametrize("dtype, precision", [({"dtype": "float32"}, "fp32"),
                                              ({"dtype": "float16", "torch_dtype": "bfloat16"}, "fp16"),
                                              ({"torch_dtype": "float16"}, "fp16"), ({}, "bf16")])
def test_precision_from_dtype_or_torch_dtype(dtype, precision):
    cfg = {k: v for k, v in MIXTRAL_8X7B.items() if k != "torch_dtype"}
    assert imported({**cfg, **dtype}).precision == precision


def test_default_sequence_is_the_context_up_to_4096():
    g = imported(DEEPSEEK_V3, seq_len=None)
    assert g["layers.0.attn.core"].out_tensors[0].shape[2] == 4096


# ------------------------------------------------------------------ variants, against transformers

TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4, "vocab_size": 1000}
VARIANTS = {
    "mixtral-head-dim": {**MIXTRAL_8X7B, **TINY, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96},
    # head_dim left out: hidden / heads (transformers' Qwen3-MoE takes no null there)
    "qwen3-dense-first": {**{k: v for k, v in QWEN3_30B_A3B.items() if k != "head_dim"}, **TINY,
                          "num_key_value_heads": 2, "moe_intermediate_size": 48, "intermediate_size": 160,
                          "mlp_only_layers": [0, 1], "num_experts": 16},
    "deepseek-full-q": {**DEEPSEEK_V3, **TINY, "q_lora_rank": None, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
                        "qk_rope_head_dim": 8, "v_head_dim": 24, "n_routed_experts": 16, "n_group": 4,
                        "topk_group": 2, "n_shared_experts": 2, "first_k_dense_replace": 1,
                        "intermediate_size": 128, "moe_intermediate_size": 32},
    "deepseek-all-moe": {**DEEPSEEK_V3, **TINY, "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
                         "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 16, "n_group": 4,
                         "topk_group": 2, "first_k_dense_replace": 0, "moe_intermediate_size": 32},
    # (token ids inside the tiny vocabulary, as transformers checks)
    "gpt-oss-full": {**GPT_OSS_120B, **TINY, "pad_token_id": None, "eos_token_id": None, "head_dim": 32,
                     "num_key_value_heads": 2, "intermediate_size": 48, "num_local_experts": 8,
                     "layer_types": ["full_attention"] * 4},
}


@pytest.mark.parametrize("key", list(VARIANTS))
def test_variants_count_as_transformers(key):
    cfg = VARIANTS[key]
    g = imported(cfg, seq_len=64)
    total, active = transformers_counts(cfg)
    sinks = cfg["num_attention_heads"] * cfg["num_hidden_layers"] if key.startswith("gpt-oss") else 0
    assert (g.param_count, active_parameters(g)) == (total - sinks, active - sinks)


def test_deepseek_q_lora_null_is_a_full_query_projection():
    g = imported(VARIANTS["deepseek-full-q"], seq_len=64)
    assert g["layers.0.attn.q"].param_count == 64 * 4 * (16 + 8)
    assert "layers.0.attn.q_down" not in {op.name for op in g.ops}
    assert [op.name for op in g.ops if op.kind == "experts"][0] == "layers.1.mlp.experts"
    assert g["layers.1.mlp.shared.gate"].param_count == 64 * 2 * 32  # two shared experts of 32


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize("base, change, match", [
    (MIXTRAL_8X7B, {"hidden_act": "gelu"}, "hidden_act 'gelu': soapbox models SwiGLU"),
    (MIXTRAL_8X7B, {"num_experts_per_tok": 9}, r"'num_experts_per_tok' \(9\) exceeds the 8 routed experts"),
    (MIXTRAL_8X7B, {"num_local_experts": None}, r"'num_local_experts' is missing \(null\)"),
    (MIXTRAL_8X7B, {"num_local_experts": MAX_EXPERTS + 1}, "'num_local_experts' is 4097, above the 4,096"),
    (MIXTRAL_8X7B, {"num_hidden_layers": 1 << 40}, "'num_hidden_layers' is 1099511627776, above the 1,024"),
    (MIXTRAL_8X7B, {"hidden_size": "4096"}, "'hidden_size' must be a positive integer"),
    (MIXTRAL_8X7B, {"num_key_value_heads": 5}, "kv_heads"),
    (QWEN3_30B_A3B, {"decoder_sparse_step": 2}, "decoder_sparse_step 2 is not modelled"),
    (QWEN3_30B_A3B, {"mlp_only_layers": [1, 3]}, r"mlp_only_layers \[1, 3\]: soapbox models dense layers before"),
    (QWEN3_30B_A3B, {"attention_bias": True}, "attention_bias true is not modelled"),
    (QWEN3_30B_A3B, {"num_local_experts": 64}, "'num_experts' and 'num_local_experts' disagree"),
    (DEEPSEEK_V3, {"moe_layer_freq": 2}, "moe_layer_freq 2 is not modelled"),
    (DEEPSEEK_V3, {"scoring_func": "softmax"}, "scoring_func \"softmax\" is not modelled; soapbox models DeepSeek"),
    (DEEPSEEK_V3, {"topk_method": "greedy"}, "topk_method \"greedy\" is not modelled"),
    (DEEPSEEK_V3, {"n_shared_experts": None}, r"'n_shared_experts' is missing \(null\)"),
    (DEEPSEEK_V3, {"first_k_dense_replace": 62}, "'first_k_dense_replace' is 62, above the 61"),
    (DEEPSEEK_V3, {"first_k_dense_replace": -1}, "'first_k_dense_replace' must be an integer of at least 0"),
    (DEEPSEEK_V3, {"attention_bias": True}, "attention_bias true"),
    (GPT_OSS_120B, {"attention_bias": False}, "attention_bias false is not modelled; soapbox models GPT-OSS"),
    (GPT_OSS_120B, {"layer_types": ["full_attention"] * 35}, "layer_types must list"),
    (GPT_OSS_120B, {"layer_types": ["chunked_attention"] * 36}, "layer_types must list"),
    (GPT_OSS_120B, {"experts_per_token": 2}, "'experts_per_token' \\(2\\) and 'num_experts_per_tok' \\(4\\) disagree"),
])
def test_refusals_name_the_field(base, change, match):
    with pytest.raises(ValueError, match=match) as e:
        imported({**base, **change}, source="moe/config.json")
    assert str(e.value).startswith("moe/config.json: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("cfg", [
    {"model_type": "mixtral", "num_hidden_layers": 1 << 40, "hidden_size": 64, "num_attention_heads": 4,
     "intermediate_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2},
    {"model_type": "llama", "num_hidden_layers": 1 << 40, "hidden_size": 64, "num_attention_heads": 4,
     "intermediate_size": 64},
    {"model_type": "gpt2", "n_layer": 1 << 40, "n_embd": 64, "n_head": 4},
])
def test_huge_layer_counts_are_refused_before_building(cfg, monkeypatch):
    """A 200-byte config must not build for ever: the bound is checked before any op exists
    (the model builders fail the test if they are reached)."""
    import engine.models.hf as hf
    import engine.models.hf_moe as hf_moe

    assert len(json.dumps(cfg)) < 200

    def reached(*a, **k):
        pytest.fail("a model builder ran before the layer count was checked")

    monkeypatch.setattr(hf, "gpt", reached)
    monkeypatch.setattr(hf_moe, "moe_gpt", reached)
    with pytest.raises(ValueError, match=f"above the {MAX_LAYERS:,} soapbox imports"):
        from_hf_config(cfg, batch=1)


# ------------------------------------------------------------------ soapbox import --hf


def test_cli_imports_a_moe_config_that_loads_and_simulates(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**MIXTRAL_8X7B, "num_hidden_layers": 2}))
    out = tmp_path / "mixtral.json"
    assert main(["import", "--hf", str(cfg), "--batch", "16", "--seq-len", "1024", "-o", str(out)]) == 0
    total, _ = transformers_counts({**MIXTRAL_8X7B, "num_hidden_layers": 2})
    assert f"{total:,} parameters" in capsys.readouterr().out
    g = load_model(str(out))
    assert g.param_count == total and g.batch_size == 16
    assert main(["simulate", "--model", str(out), "--cluster", "dgx-a100-80gb:1", "--strategy", "megatron",
                 "--tp", "2", "--sequence-parallel", "--ep", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] > 0


def test_cli_refusal_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**DEEPSEEK_V3, "moe_layer_freq": 2}))
    assert main(["import", "--hf", str(cfg), "--batch", "4", "-o", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("soapbox: error: ") and "moe_layer_freq 2" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()
