"""Transformer sample models: parameter counts and FLOPs against published figures."""

from __future__ import annotations


import pytest

from engine.models import SAMPLE_MODELS, build_sample
from engine.models.transformer import GPTConfig, bert_large, gpt, gpt2, llama2_7b, pase_transformer, swiglu_ffn_hidden


@pytest.fixture(scope="module")
def gpt3():
    return build_sample("gpt3-175b")


def megatron_flops_per_iteration(B, s, l, h, V):
    """Narayanan et al. SC'21 Eq. 3 without recomputation: 3 passes (forward + 2x backward)
    = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) FLOPs; their Eq. 3 (96, with recompute) is 4/3 of it."""
    return 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))


class TestGPT2:
    def test_parameters(self):
        # HF `gpt2` (124M): wte 50257*768 + wpe 1024*768 + 12 x 7,087,872 + ln_f 1536,
        # output layer tied to wte: 124,439,808 (the count HF's GPT2LMHeadModel reports).
        assert gpt2().param_count == 124_439_808

    def test_shapes(self):
        g = gpt2()
        assert g["layers.0.attn.scores"].out_tensors[0].shape == (8, 12, 1024, 1024)
        assert g["lm_head"].out_tensors[0].shape == (8, 1024, 50257)
        assert g["loss"].out_tensors[0].shape == (8, 1024)


class TestGPT3:
    def test_parameters(self, gpt3):
        # Brown et al. 2020 Table 2.1: 175.0B. Megatron's padded vocabulary (51,200) adds
        # 943 x 12288 = 11.6M; the count stays within 0.3% of the published 175.0B.
        assert abs(gpt3.param_count / 175.0e9 - 1) < 0.003
        # exact: 12 l h^2 + 13 l h + (V + s) h + 2h
        l, h, V, s = 96, 12288, 51200, 2048
        assert gpt3.param_count == 12 * l * h * h + 13 * l * h + (V + s) * h + 2 * h

    def test_flops_match_megatron_formula(self, gpt3):
        # Our count adds pointwise ops (norms, GeLU, softmax, dropout, loss) to the matmuls
        # Eq. 3 counts; they are well under 1% at h = 12288.
        want = megatron_flops_per_iteration(1536, 2048, 96, 12288, 51200)
        got = gpt3.fwd_flops + gpt3.bwd_flops
        assert want <= got < want * 1.01


class TestLlama2:
    def test_parameters(self):
        # Touvron et al. 2023 (7B): embed 32000*4096, 32 x (4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096),
        # final norm 4096, untied output 32000*4096 = 6,738,415,616.
        assert llama2_7b().param_count == 6_738_415_616

    def test_swiglu_width(self):
        assert swiglu_ffn_hidden(4096) == 11008  # LLaMA's FeedForward rule

    def test_structure(self):
        g = llama2_7b()
        kinds = {op.kind for op in g.ops}
        assert {"rmsnorm", "silu", "mul"} <= kinds and "layernorm" not in kinds and "gelu" not in kinds
        assert "positions" not in g  # rotary: no position table


class TestBert:
    def test_parameters(self):
        g = bert_large()
        head = {"mlm.dense", "mlm.norm"}
        encoder = sum(op.param_count for op in g.ops if op.name not in head and op.name != "mlm.decoder")
        # HF bert-large-uncased BertModel (embeddings + 24 layers + pooler): 335,141,888
        assert encoder == 335_141_888
        # + MLM transform (1024^2 + 1024 + LayerNorm 2048); decoder tied to the word embeddings
        assert g.param_count == 335_141_888 + 1_051_648


class TestPaseTransformer:
    def test_parameters(self):
        # 2 embeddings 50000*1024; encoder layer 4(h^2+h) + 2(h*f) + f + h + 2*2h; decoder adds
        # cross-attention 4(h^2+h) + 2h; output layer h*V + V.
        h, f, V = 1024, 4096, 50000
        enc = 4 * (h * h + h) + h * f + f + f * h + h + 4 * h
        dec = enc + 4 * (h * h + h) + 2 * h
        assert pase_transformer().param_count == 2 * V * h + 6 * enc + 6 * dec + h * V + V

    def test_cross_attention_reads_the_encoder(self):
        g = pase_transformer()
        assert g["decoder.0.cross_attn.k"].inputs[0].op == "encoder.5.norm2"


class TestGPTBuilder:
    def test_grouped_query_attention(self):
        g = gpt(GPTConfig(2, 64, 8, 16, 100, 2, kv_heads=2, swiglu=True, norm="rmsnorm", positions="rotary",
                          bias=False, tie_embeddings=False, dropout=0.0))
        assert g["layers.0.attn.k"].out_tensors[0].shape == (2, 16, 16)  # 2 kv heads x 8 dims
        assert g["layers.0.attn.scores"].out_tensors[0].shape == (2, 8, 16, 16)
        ffn = swiglu_ffn_hidden(64)
        per_layer = 64 * 64 * 2 + 64 * 16 * 2 + 3 * 64 * ffn + 2 * 64
        assert g.param_count == 100 * 64 * 2 + 2 * per_layer + 64

    @pytest.mark.parametrize("kwargs, message", [
        ({"heads": 5}, "heads \\(5\\) must divide hidden \\(64\\)"),
        ({"kv_heads": 3}, "kv_heads \\(3\\) must divide heads \\(4\\)"),
        ({"layers": 0}, "layers must be a positive integer, got 0"),
        ({"norm": "batchnorm"}, "norm must be 'layernorm' or 'rmsnorm'"),
        ({"max_positions": 8}, "max_positions \\(8\\) is below seq_len \\(16\\)"),
    ])
    def test_bad_shapes(self, kwargs, message):
        base = dict(layers=2, hidden=64, heads=4, seq_len=16, vocab=100, batch=2)
        base.update(kwargs)
        with pytest.raises(ValueError, match=message):
            gpt(GPTConfig(**base))


def test_sample_registry_batches():
    # FlexFlow's benchmarks: AlexNet batch 256, the others 64 (the project's issue)
    for name in ("alexnet", "inception_v3", "resnet101", "rnntc", "rnnlm", "nmt", "transformer"):
        expected = 256 if name == "alexnet" else 64
        assert build_sample(name).batch_size == expected, name
    assert set(SAMPLE_MODELS) == {"alexnet", "inception_v3", "resnet101", "rnntc", "rnnlm", "nmt", "transformer",
                                  "gpt2", "gpt3-175b", "bert-large", "llama2-7b", "mixtral-8x7b", "deepseek-v3",
                                  "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b"}


def test_unknown_sample():
    with pytest.raises(ValueError, match="unknown sample model 'vgg'; samples: alexnet"):
        build_sample("vgg")


def test_flash_attention_replaces_the_attention_core():
    base = dict(layers=2, hidden=64, heads=4, seq_len=16, vocab=100, batch=2)
    plain = gpt(GPTConfig(**base))
    fused = gpt(GPTConfig(**base, flash_attention=True))
    assert "layers.0.attn.core" in fused and "layers.0.attn.scores" not in fused
    assert fused.param_count == plain.param_count
    core = fused["layers.0.attn.core"]
    assert core.attrs["causal"] is True
    # the causal fused op does half the two matmuls' FLOPs
    assert core.fwd_flops == (plain["layers.0.attn.scores"].fwd_flops + plain["layers.0.attn.context"].fwd_flops) / 2
