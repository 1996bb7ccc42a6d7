"""Issue 14: decoder-only models from a Hugging Face config.json, read offline, through the same
builder as the sample models (parameter counts exact, refusals that name the field)."""

from __future__ import annotations

import json

import pytest

from engine.cli import main
from engine.formats import load_model, resolve_model
from engine.models.hf import from_hf_config

# the config.json files as published on the Hugging Face hub (fields soapbox reads and some it
# ignores, e.g. rope_theta, rms_norm_eps)
GPT2 = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "embd_pdrop": 0.1, "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
        "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "vocab_size": 50257}
LLAMA2_7B = {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
             "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
             "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-05,
             "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32000}
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
              "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
              "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
              "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16", "vocab_size": 32000}
QWEN2_05B = {"architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 896,
             "intermediate_size": 4864, "max_position_embeddings": 32768, "model_type": "qwen2",
             "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
             "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 151936}


def test_attention_is_fused_unless_asked_or_the_config_says_eager():
    """Issue 44: Llama-3 8B imported eager was 364 GB in one layout against 61.9 GB fused, while
    its torchtitan export names fused attention. Fused by default; eager on request or when the
    config's attn_implementation says so (with a note); the parameters are the same."""
    fused = from_hf_config(LLAMA2_7B, batch=8)
    assert any(o.kind == "attention" for o in fused.ops) and not any(o.kind == "softmax" for o in fused.ops)
    notes: list[str] = []
    eager = from_hf_config({**LLAMA2_7B, "_attn_implementation": "eager"}, batch=8, notes=notes)
    assert not any(o.kind == "attention" for o in eager.ops) and eager.param_count == fused.param_count
    assert notes == ["attention imported eager (its matmuls, softmax and dropout, the scores kept for the backward) "
                     "as the config's attn_implementation says"]
    assert from_hf_config(LLAMA2_7B, batch=8, attention="eager").fingerprint == eager.fingerprint
    with pytest.raises(ValueError, match="sliding window is priced on fused attention ops only"):
        from_hf_config(MISTRAL_7B, batch=2, seq_len=8192, attention="eager")


def test_gpt2_equals_the_sample_model():
    g = from_hf_config(GPT2, batch=8, seq_len=1024, precision="fp32", name="gpt2", attention="eager")
    sample = resolve_model("gpt2")
    assert g.param_count == sample.param_count == 124_439_808
    assert g.fingerprint == sample.fingerprint  # the same ops, shapes and FLOPs


def test_llama2_7b_equals_the_sample_model():
    g = from_hf_config(LLAMA2_7B, batch=1024, precision="bf16", name="llama2-7b", attention="eager")
    sample = resolve_model("llama2-7b")
    assert g.param_count == sample.param_count == 6_738_415_616
    assert g.fingerprint == sample.fingerprint
    assert g.batch_size == 1024 and g["layers.0.attn.scores"].out_tensors[0].shape[-1] == 4096


def test_grouped_query_attention_counts_exactly():
    """Mistral 7B (8 key/value heads): 7,241,732,096 parameters (its published size, 7.24 B:
    embeddings 2 x 32000 x 4096, per layer q/o 4096^2, k/v 4096 x 1024, SwiGLU 3 x 4096 x 14336,
    two RMSNorms, and a final norm)."""
    g = from_hf_config(MISTRAL_7B, batch=64, attention="eager")
    assert g.param_count == 7_241_732_096
    assert g.precision == "bf16" and g["layers.0.attn.k"].out_tensors[0].shape[-1] == 1024
    assert g["layers.0.attn.scores"].out_tensors[0].shape[-1] == 4096  # context capped at 4,096 by default


def test_qwen2_has_biases_on_qkv_only():
    g = from_hf_config(QWEN2_05B, batch=16)
    assert g.param_count == 494_032_768  # Qwen2-0.5B's published count (tied embeddings)
    assert g["layers.0.attn.q"].param_count == 896 * 896 + 896
    assert g["layers.0.attn.out"].param_count == 896 * 896


@pytest.mark.parametrize("change, match", [
    ({"model_type": "bert"}, "model_type 'bert' is not one soapbox imports"),
    ({"model_type": None}, "model_type None"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"head_dim": 0}, "'head_dim' must be a positive integer"),
    ({"hidden_size": "4096"}, "'hidden_size' must be a positive integer"),
    ({"num_hidden_layers": 0}, "'num_hidden_layers' must be a positive integer"),
    ({"num_key_value_heads": 5}, "kv_heads"),
    ({"tie_word_embeddings": "yes"}, "'tie_word_embeddings' must be true or false"),
    ({"intermediate_size": None}, "'intermediate_size' is missing"),
])
def test_refusals_name_the_field(change, match):
    cfg = {**MISTRAL_7B, **change}
    with pytest.raises(ValueError, match=match):
        from_hf_config(cfg, batch=8, source="mistral/config.json")


def test_gpt2_sequence_beyond_its_position_table_is_refused():
    with pytest.raises(ValueError, match="exceeds n_positions"):
        from_hf_config(GPT2, batch=8, seq_len=2048)


def test_not_an_object():
    with pytest.raises(ValueError, match="JSON object"):
        from_hf_config([1, 2], batch=1)


def test_cli_writes_a_model_that_loads_and_simulates(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN2_05B))
    out = tmp_path / "qwen.json"
    assert main(["import", "--hf", str(cfg), "--batch", "32", "--seq-len", "1024", "-o", str(out)]) == 0
    assert "494,032,768 parameters" in capsys.readouterr().out
    g = load_model(str(out))
    assert g.param_count == 494_032_768 and g.batch_size == 32
    assert main(["simulate", "--model", str(out), "--cluster", "dgx-a100-80gb:1", "--strategy", "megatron",
                 "--tp", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] > 0


def test_cli_refusal_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "t5"}))
    assert main(["import", "--hf", str(cfg), "--batch", "4", "-o", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("soapbox: error: ") and "t5" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()
