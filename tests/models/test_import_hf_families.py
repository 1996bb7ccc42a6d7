"""Issue 27: the dense families Gemma, Phi-3 and Falcon, an explicit ``head_dim``
(Mistral-Nemo) and sliding-window attention (Mistral 7B v0.1, Qwen2) from a Hugging Face
config.json. Parameters are counted against transformers' own model of the config (built on
the meta device: no weights allocated; shared weights once), and the forward GEMM FLOPs of
small versions against ``torch.utils.flop_counter.FlopCounterMode`` running the model on CPU.

Conventions: soapbox counts a linear layer's FLOPs as 2 x tokens x in x out (its bias adds
none, as torch's counter counts ``addmm``); unfused attention (``batch_matmul`` scores and
context) over the whole s x s matrix, as transformers' eager attention computes it; fused
causal attention at half of that (the blocks FlashAttention skips), windowed attention as
:func:`engine.ops.attention._attention_flops` states. Each comparison says which it compares.
"""

from __future__ import annotations

import pytest

from engine.models.hf import from_hf_config
from engine.ops import op_kind

# The config.json files as published on the Hugging Face hub, every field but auto_map.
# https://huggingface.co/google/gemma-2b/blob/main/config.json
GEMMA_2B = {
    "architectures": ["GemmaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 2,
    "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 16384, "max_position_embeddings": 8192, "model_type": "gemma", "num_attention_heads": 8,
    "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 10000.0, "torch_dtype": "bfloat16", "transformers_version": "4.38.0.dev0",
    "use_cache": True, "vocab_size": 256000}
# https://huggingface.co/google/gemma-7b/blob/main/config.json
GEMMA_7B = {**GEMMA_2B, "hidden_size": 3072, "intermediate_size": 24576, "num_attention_heads": 16,
            "num_hidden_layers": 28, "num_key_value_heads": 16}
# https://huggingface.co/microsoft/Phi-3-mini-4k-instruct/blob/main/config.json
PHI3_MINI_4K = {
    "_name_or_path": "Phi-3-mini-4k-instruct", "architectures": ["Phi3ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096,
    "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
    "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": True, "vocab_size": 32064}
# https://huggingface.co/tiiuae/falcon-7b/blob/main/config.json
FALCON_7B = {
    "alibi": False, "apply_residual_connection_post_layernorm": False, "architectures": ["FalconForCausalLM"],
    "attention_dropout": 0.0, "bias": False, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0,
    "hidden_size": 4544, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon",
    "multi_query": True, "new_decoder_architecture": False, "num_attention_heads": 71, "num_hidden_layers": 32,
    "parallel_attn": True, "torch_dtype": "bfloat16", "transformers_version": "4.27.4", "use_cache": True,
    "vocab_size": 65024}
# https://huggingface.co/mistralai/Mistral-Nemo-Base-2407/blob/main/config.json
MISTRAL_NEMO = {
    "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 1024000, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 131072}
# https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000}

#: name -> config and its parameters as transformers 5.24 counts its model of it (pinned, so the
#: counts are checked where transformers is not installed too)
PUBLISHED = {
    "gemma-2b": (GEMMA_2B, 2_506_172_416),
    "gemma-7b": (GEMMA_7B, 8_537_680_896),
    "phi-3-mini-4k": (PHI3_MINI_4K, 3_821_079_552),
    "falcon-7b": (FALCON_7B, 6_921_720_704),
    "mistral-nemo": (MISTRAL_NEMO, 12_247_782_400),
    "mistral-7b-v0.1": (MISTRAL_7B, 7_241_732_096),
}


def transformers_count(cfg: dict) -> int:
    """Parameters of transformers' model of ``cfg`` built on the meta device (tied weights once)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a shared tensor once


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameters_equal_transformers(name):
    cfg, count = PUBLISHED[name]
    assert from_hf_config(cfg, batch=1, seq_len=128).param_count == count
    try:
        import transformers  # noqa: F401
    except ImportError:
        return  # the pinned count stands
    assert transformers_count(cfg) == count


#: small versions: 2 layers, vocabulary 128, widths of tens (Gemma's heads of 32 with hidden 64;
#: Phi-3's pad and end ids moved inside the small vocabulary)
TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128,
        "max_position_embeddings": 64, "torch_dtype": "float32"}
SMALL = {
    "gemma": {**GEMMA_2B, **TINY, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 96},
    "phi3": {**PHI3_MINI_4K, **TINY, "pad_token_id": 0, "eos_token_id": 2, "num_key_value_heads": 2,
             "intermediate_size": 96, "sliding_window": None},
    "falcon-mqa": {**FALCON_7B, **TINY},
    "falcon-new": {**FALCON_7B, **TINY, "new_decoder_architecture": True, "num_kv_heads": 2, "bias": True},
    "falcon-sequential": {**FALCON_7B, **TINY, "parallel_attn": False, "multi_query": False},
    "mistral-nemo": {**MISTRAL_NEMO, **TINY, "num_key_value_heads": 2, "head_dim": 24, "intermediate_size": 96},
    # windowed: the attention is fused, so only the linear layers are compared
    "mistral-window": {**MISTRAL_7B, **TINY, "num_key_value_heads": 2, "intermediate_size": 96, "sliding_window": 8},
    "phi3-window": {**PHI3_MINI_4K, **TINY, "pad_token_id": 0, "eos_token_id": 2, "num_key_value_heads": 4,
                    "intermediate_size": 96, "sliding_window": 8},
}
BATCH, SEQ = 2, 16


def torch_forward_flops(cfg: dict) -> tuple[int, int]:
    """(linear, attention) forward FLOPs of transformers' model of ``cfg`` on CPU with eager
    attention, as FlopCounterMode counts them: mm / addmm (the linear layers; a bias adds no
    FLOPs) and bmm (the attention's scores and context, over the whole s x s matrix)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    config = transformers.AutoConfig.for_model(**cfg)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    tokens = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=tokens)
    counts = {str(k).split(".")[-1]: v for k, v in counter.get_flop_counts()["Global"].items()}
    return counts.get("mm", 0) + counts.get("addmm", 0), counts.get("bmm", 0)


def soapbox_forward_flops(cfg: dict, windowed: bool = False) -> tuple[float, float]:
    """(linear, attention) forward FLOPs of the import: ``linear`` ops and ``batch_matmul`` (unfused)
    or ``attention`` (fused) ops."""
    g = from_hf_config(cfg, batch=BATCH, seq_len=SEQ, attention="fused" if windowed else "eager")
    return (sum(o.fwd_flops for o in g.ops if o.kind == "linear"),
            sum(o.fwd_flops for o in g.ops if o.kind in ("batch_matmul", "attention")))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_parameters_and_forward_flops_of_small_versions_equal_transformers(name):
    cfg = SMALL[name]
    assert from_hf_config(cfg, batch=BATCH, seq_len=SEQ).param_count == transformers_count(cfg)
    linear, attention = torch_forward_flops(cfg)
    mine_linear, mine_attention = soapbox_forward_flops(cfg, "window" in name)
    assert mine_linear == linear
    if "window" not in name:  # unfused: the whole score matrix, as eager attention computes it
        assert mine_attention == attention


# sliding windows ---------------------------------------------------------------------------
def test_a_windowed_layer_against_a_full_one_by_hand():
    """b 2, h 4, s 16, d_q = d_v = 16, window 8: the causal layer sees s^2 / 2 = 128 keys a
    (batch, head) pair, the windowed one s w - w^2 / 2 = 128 - 32 = 96."""
    cfg = {**SMALL["mistral-window"], "num_hidden_layers": 1}
    windowed = from_hf_config(cfg, batch=BATCH, seq_len=SEQ)["layers.0.attn.core"]
    full = from_hf_config({**cfg, "sliding_window": None}, batch=BATCH, seq_len=SEQ, attention="eager")
    assert windowed.attrs == {"causal": True, "window": 8}
    assert windowed.fwd_flops == 2 * 2 * 4 * (16 + 16) * (16 * 8 - 8 * 8 / 2) == 49_152
    # without a window, imported eager: scores and context over the whole matrix (as eager
    # attention computes them), 131,072; fused causal attention would count half, 65,536, and the
    # window keeps 96 of its 128 keys a (batch, head) pair: 3/4 of it
    assert sum(o.fwd_flops for o in full.ops if o.kind == "batch_matmul") == 2 * (2 * 2 * 4 * 16 * 16 * 16) == 131_072
    assert windowed.fwd_flops == 0.75 * 131_072 / 2


def test_window_at_least_the_sequence_changes_nothing():
    g = from_hf_config(MISTRAL_7B, batch=2, seq_len=4096)  # window 4096: every key a query sees
    assert {o.attrs.get("window") for o in g.ops if o.kind == "attention"} == {None}
    notes: list[str] = []
    g = from_hf_config(MISTRAL_7B, batch=2, seq_len=8192, notes=notes)
    assert {o.attrs.get("window") for o in g.ops if o.kind == "attention"} == {4096}
    assert notes == ["32 of the 32 layers attend within a 4096-token sliding window (sliding_window): priced on "
                     "fused (FlashAttention) attention ops, which skip the keys outside it"]
    assert g.param_count == 7_241_732_096


def test_phi3_mini_attends_within_its_published_2047_token_window():
    g = from_hf_config(PHI3_MINI_4K, batch=1)  # its 4,096-token context
    assert {o.attrs.get("window") for o in g.ops if o.kind == "attention"} == {2047}


def test_qwen2_windows_the_layers_from_max_window_layers_on():
    cfg = {"model_type": "qwen2", **TINY, "num_hidden_layers": 4, "intermediate_size": 96,
           "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2}
    g = from_hf_config(cfg, batch=BATCH, seq_len=SEQ)
    assert [g[f"layers.{i}.attn.core"].attrs.get("window") for i in range(4)] == [None, None, 8, 8]
    g = from_hf_config({**cfg, "layer_types": ["sliding_attention", "full_attention"] * 2}, batch=BATCH, seq_len=SEQ)
    assert [g[f"layers.{i}.attn.core"].attrs.get("window") for i in range(4)] == [8, None, 8, None]
    g = from_hf_config({**cfg, "use_sliding_window": False}, batch=BATCH, seq_len=SEQ)
    assert {o.attrs.get("window") for o in g.ops if o.kind == "attention"} == {None}


def test_windowed_flops_of_length_partitions_add_up():
    """A context-parallel split divides the queries, never the keys: each partition is priced
    at the average keys a query, so p partitions add up to the op's FLOPs."""
    flops = op_kind("attention").fwd_flops
    whole, attrs = (2, 4, 64, 16), {"causal": True, "window": 24}
    op = flops([whole] * 3, [whole], [], attrs)
    assert op == 2 * 2 * 4 * 32 * (64 * 24 - 24 * 24 / 2)
    for p in (2, 4, 8):
        part = (2, 4, 64 // p, 16)
        assert p * flops([part, whole, whole], [part], [], attrs) == pytest.approx(op)
    assert flops([whole] * 3, [whole], [], {"causal": True, "window": 64}) == flops([whole] * 3, [whole], [],
                                                                                      {"causal": True})


@pytest.mark.parametrize("attrs, match", [
    ({"causal": True, "window": 0}, "positive integer"),
    ({"causal": True, "window": "8"}, "positive integer"),
    ({"causal": False, "window": 8}, "needs causal"),
])
def test_window_attribute_errors(attrs, match):
    from engine.graph import GraphBuilder
    from engine.ops import OpError

    b = GraphBuilder("g", "fp32")
    qkv = [b.input(n, [2, 4, 16, 8], axes=["sample", "head", "length", "head_dim"]) for n in "qkv"]
    with pytest.raises(OpError, match=match):
        b.add("attention", "a", qkv, **attrs)


# refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg, match", [
    ({**GEMMA_2B, "hidden_act": "relu"}, "hidden_activation \"relu\""),
    ({**FALCON_7B, "activation": "relu"}, "activation \"relu\""),
    ({**FALCON_7B, "new_decoder_architecture": True, "parallel_attn": False}, "parallel_attn false"),
    ({**FALCON_7B, "num_ln_in_parallel_attn": 3}, "num_ln_in_parallel_attn 3"),
    ({**FALCON_7B, "num_attention_heads": 70}, "heads \\(70\\) must divide hidden"),
    ({**PHI3_MINI_4K, "sliding_window": 0}, "'sliding_window' must be a positive integer"),
    ({**MISTRAL_NEMO, "head_dim": "128"}, "'head_dim' must be a positive integer"),
])
def test_refusals_name_the_field(cfg, match):
    with pytest.raises(ValueError, match=match):
        from_hf_config(cfg, batch=1, seq_len=128)


def test_falcon_and_gemma_shapes():
    falcon = from_hf_config(FALCON_7B, batch=1, seq_len=128)
    assert falcon["layers.0.attn.k"].param_count == 4544 * 64  # multi-query: one key head
    assert "layers.0.norm2" not in falcon  # one LayerNorm feeds attention and MLP
    gemma = from_hf_config(GEMMA_7B, batch=1, seq_len=128)
    assert gemma["layers.0.attn.q"].param_count == 3072 * 16 * 256  # 16 heads of 256 on hidden 3072
    assert gemma["layers.0.mlp.act"].kind == "gelu"
