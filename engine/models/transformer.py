"""Transformer model builders: GPT-style decoders, LLaMA, BERT and PaSE's Transformer.

One decoder-layer builder serves every GPT-style model; its options cover the variants the
sample library needs:

* GPT-2 / GPT-3 (Radford et al. 2019; Brown et al. 2020, Table 2.1): pre-LayerNorm, learned
  position embeddings, GeLU MLP of 4h, biases, output layer tied to the token embedding.
* LLaMA-2 (Touvron et al. 2023, §2.2): RMSNorm, SwiGLU MLP (Shazeer 2020), rotary position
  embeddings (no parameters; their few FLOPs are not modelled), no biases, untied output
  layer, optional grouped-query attention (Ainslie et al. 2023): ``kv_heads`` < ``heads``.
* BERT (Devlin et al. 2019): post-LayerNorm encoder, token-type embeddings, pooler and a
  masked-LM head whose decoder is tied to the word embeddings.
* PaSE's Transformer benchmark (Elango, IPDPS'21; baidu-research/PaSE ``graph.py``):
  Vaswani et al. (2017) encoder-decoder, 6 + 6 layers, d_model 1024, 8 heads, d_ff 4096,
  sequence 256, vocabulary 50,000.

Attention is modelled as its matmuls (scores ``Q K^T`` and context ``P V``), a softmax and
dropout over the full ``s x s`` matrix, as Megatron's FLOPs formula counts it (Narayanan et
al. SC'21, Eq. 3); the causal mask is not a separate op. A sliding window (Mistral, Jiang et
al. 2023 §2) is priced on the fused ``attention`` op only (its ``window`` attribute, as
FlashAttention's ``window_size`` skips the blocks outside it); unfused matmuls compute the
whole score matrix and mask it, as eager implementations do.

Variants for imported families (:mod:`engine.models.hf`): an explicit ``head_dim`` (Gemma,
Mistral-Nemo: heads x head_dim need not equal hidden), a GeLU-gated MLP (GeGLU, Gemma;
Shazeer 2020) and parallel attention and MLP blocks (GPT-J, Falcon: both read the layer's
input, one LayerNorm shared or one each, and add into the same residual).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import GraphBuilder, OpGraph, TensorRef

__all__ = [
    "GPTConfig",
    "gpt",
    "gpt2",
    "gpt3_175b",
    "llama2_7b",
    "bert_large",
    "pase_transformer",
    "swiglu_ffn_hidden",
    "Blocks",
]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT-style decoder-only model. Sizes in elements, not bytes."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    batch: int
    kv_heads: int | None = None  # None: = heads (multi-head attention)
    ffn_hidden: int | None = None  # None: 4 * hidden, or the LLaMA rule with swiglu
    swiglu: bool = False
    norm: str = "layernorm"  # or "rmsnorm"
    positions: str = "learned"  # learned embeddings, or "rotary" (no parameters)
    max_positions: int | None = None  # rows of the learned position table; None: seq_len
    bias: bool = True
    qkv_bias: bool | None = None  # biases on the query/key/value projections only (Qwen2); None: = bias
    tie_embeddings: bool = True
    dropout: float = 0.1  # 0 removes the dropout ops
    flash_attention: bool = False  # one fused causal attention op instead of its matmuls and softmax
    head_dim: int | None = None  # width of one head; None: hidden / heads
    gated_act: str = "silu"  # the gated MLP's activation: silu (SwiGLU) or gelu (GeGLU, Gemma)
    parallel: int = 0  # parallel attention and MLP: 1 norm shared (Falcon-7B), 2 one each; 0 sequential
    sliding_window: int | None = None  # keys a query sees in windowed layers (fused attention only)
    window_layers: tuple[int, ...] | None = None  # the windowed layers; None: every layer
    qk_norm: bool = False  # RMSNorm over each query and key head, a gain of head_dim each (Qwen3, Gemma-3)
    sandwich: bool = False  # a norm on the attention's and the MLP's outputs too (Gemma-2, Gemma-3)
    precision: str = "fp16"
    name: str = "gpt"

    def check(self) -> None:
        """Raise ``ValueError`` naming the first inconsistent field."""
        for field_ in ("layers", "hidden", "heads", "seq_len", "vocab", "batch"):
            v = getattr(self, field_)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{field_} must be a positive integer, got {v!r}")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden ({self.hidden}) unless head_dim is given")
        if self.head_dim is not None and (not isinstance(self.head_dim, int) or self.head_dim <= 0):
            raise ValueError(f"head_dim must be a positive integer, got {self.head_dim!r}")
        if self.gated_act not in ("silu", "gelu"):
            raise ValueError(f"gated_act must be 'silu' or 'gelu', got {self.gated_act!r}")
        if self.parallel not in (0, 1, 2):
            raise ValueError(f"parallel must be 0, 1 or 2 (LayerNorms a parallel layer), got {self.parallel!r}")
        if self.sliding_window is not None:
            if not isinstance(self.sliding_window, int) or self.sliding_window <= 0:
                raise ValueError(f"sliding_window must be a positive integer, got {self.sliding_window!r}")
            if not self.flash_attention:
                raise ValueError("sliding_window needs flash_attention (the window is the fused attention op's)")
        if self.window_layers is not None and not all(0 <= i < self.layers for i in self.window_layers):
            raise ValueError(f"window_layers must name layers 0..{self.layers - 1}")
        kv = self.kv_heads or self.heads
        if kv <= 0 or self.heads % kv:
            raise ValueError(f"kv_heads ({kv}) must divide heads ({self.heads})")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {self.norm!r}")
        if self.positions not in ("learned", "rotary"):
            raise ValueError(f"positions must be 'learned' or 'rotary', got {self.positions!r}")
        if self.max_positions is not None and self.max_positions < self.seq_len:
            raise ValueError(f"max_positions ({self.max_positions}) is below seq_len ({self.seq_len})")


def swiglu_ffn_hidden(hidden: int, multiple_of: int = 256) -> int:
    """LLaMA's SwiGLU width: 2/3 of 4h rounded up to a multiple of 256 (LLaMA ``model.py``
    ``FeedForward``; 11008 for h = 4096)."""
    f = int(2 * 4 * hidden / 3)
    return multiple_of * ((f + multiple_of - 1) // multiple_of)


class Blocks:
    """Shared layer pieces over one :class:`GraphBuilder`."""

    def __init__(self, b: GraphBuilder, batch: int, hidden: int, heads: int, kv_heads: int,
                 bias: bool, norm: str, dropout: float, flash: bool = False, causal: bool = False,
                 head_dim: int | None = None) -> None:
        self.b = b
        self.flash, self.causal = flash, causal
        self.batch, self.hidden, self.heads, self.kv_heads = batch, hidden, heads, kv_heads
        #: width of one head; None: hidden / heads (Qwen3 and GPT-OSS set their own)
        self.head_dim = head_dim or hidden // heads
        self.bias, self.norm_kind, self.rate = bias, norm, dropout
        self.qkv_bias: bool | None = None  # None: as ``bias``
        self.gated_act = "silu"  # the gated MLP's activation op (silu or gelu)
        self.qk_norm = False  # each query and key head normalised over its width (Qwen3, Gemma-3)

    def norm(self, name: str, x: TensorRef) -> TensorRef:
        return self.b.add(self.norm_kind, name, [x])

    def drop(self, name: str, x: TensorRef) -> TensorRef:
        return self.b.add("dropout", name, [x], rate=self.rate) if self.rate else x

    def linear(self, name: str, x: TensorRef, out: int, bias: bool | None = None, **kw) -> TensorRef:
        return self.b.add("linear", name, [x], out_features=out, bias=self.bias if bias is None else bias, **kw)

    def _heads(self, name: str, x: TensorRef, seq: int, n_heads: int) -> TensorRef:
        """[b, s, n*d] -> [b, n, s, d], with QK-norm on the queries and keys when set (Qwen3 and
        Gemma-3 normalise each head over its width before the rotary embedding)."""
        r = self.b.add("reshape", f"{name}.split_heads", [x], shape=[self.batch, seq, n_heads, self.head_dim],
                       axes=["sample", "length", "head", "head_dim"])
        y = self.b.add("transpose", f"{name}.to_bhsd", [r], perm=[0, 2, 1, 3])
        if self.qk_norm and name.rsplit(".", 1)[-1] in ("q", "k"):
            y = self.norm(f"{name}.norm", y)  # [b, n, s, d], gain [d]
        return y

    def attention(self, name: str, x: TensorRef, seq: int, memory: TensorRef | None = None,
                  mem_seq: int | None = None, window: int | None = None) -> TensorRef:
        """Multi-head (or grouped-query) attention; ``memory`` gives cross-attention; ``window``
        a causal sliding window (fused attention only; below ``seq`` to matter)."""
        kv_src = memory if memory is not None else x
        kv_seq = mem_seq if memory is not None else seq
        kv_width = self.kv_heads * self.head_dim
        qkv = self.qkv_bias
        q = self._heads(f"{name}.q", self.linear(f"{name}.q", x, self.heads * self.head_dim, bias=qkv), seq,
                        self.heads)
        k = self._heads(f"{name}.k", self.linear(f"{name}.k", kv_src, kv_width, bias=qkv), kv_seq, self.kv_heads)
        v = self._heads(f"{name}.v", self.linear(f"{name}.v", kv_src, kv_width, bias=qkv), kv_seq, self.kv_heads)
        if self.flash:
            extra = {"window": window} if window is not None and window < kv_seq else {}
            ctx = self.b.add("attention", f"{name}.core", [q, k, v], causal=self.causal and memory is None, **extra)
        else:
            scores = self.b.add("batch_matmul", f"{name}.scores", [q, k], transpose_b=True)  # [b, h, s, s_kv]
            probs = self.drop(f"{name}.attn_dropout", self.b.add("softmax", f"{name}.softmax", [scores], axis=-1))
            ctx = self.b.add("batch_matmul", f"{name}.context", [probs, v])  # [b, h, s, d]
        return self.merge(name, ctx, seq)

    def merge(self, name: str, ctx: TensorRef, seq: int) -> TensorRef:
        """[b, h, s, d] attention context -> [b, s, h*d] -> the output projection to hidden."""
        ctx = self.b.add("transpose", f"{name}.to_bshd", [ctx], perm=[0, 2, 1, 3])
        width = self.b.shape_of(ctx)[2] * self.b.shape_of(ctx)[3]
        ctx = self.b.add("reshape", f"{name}.merge_heads", [ctx], shape=[self.batch, seq, width],
                         axes=["sample", "length", "feature"])
        return self.linear(f"{name}.out", ctx, self.hidden)

    def mlp(self, name: str, x: TensorRef, ffn: int, swiglu: bool) -> TensorRef:
        if swiglu:
            gate = self.b.add(self.gated_act, f"{name}.act", [self.linear(f"{name}.gate", x, ffn)])
            up = self.linear(f"{name}.up", x, ffn)
            return self.linear(f"{name}.down", self.b.add("mul", f"{name}.glu", [gate, up]), self.hidden)
        h = self.b.add("gelu", f"{name}.act", [self.linear(f"{name}.fc1", x, ffn)])
        return self.linear(f"{name}.fc2", h, self.hidden)

    def residual(self, name: str, x: TensorRef, y: TensorRef) -> TensorRef:
        return self.b.add("add", name, [x, self.drop(f"{name}.dropout", y)])


def gpt(cfg: GPTConfig, description: str = "", source: str = "") -> OpGraph:
    """Build a GPT-style decoder-only language model from its shape.

    Parameters
    ----------
    cfg : GPTConfig
    description, source : str
        Stored in the graph (and model file).

    Returns
    -------
    OpGraph
        Inputs ``tokens`` and ``labels`` ([batch, seq] int64), ``layers`` pre-norm decoder
        blocks, a final norm, the output layer and a per-token softmax cross-entropy.

    Raises
    ------
    ValueError
        When the shape is inconsistent (see :meth:`GPTConfig.check`).

    Examples
    --------
    >>> g = gpt(GPTConfig(layers=2, hidden=64, heads=4, seq_len=16, vocab=100, batch=2))
    >>> g["layers.0.attn.scores"].out_tensors[0].shape
    (2, 4, 16, 16)
    """
    cfg.check()
    kv = cfg.kv_heads or cfg.heads
    ffn = cfg.ffn_hidden or (swiglu_ffn_hidden(cfg.hidden) if cfg.swiglu else 4 * cfg.hidden)
    b = GraphBuilder(cfg.name, cfg.precision, description or _describe(cfg, kv, ffn), source)
    blk = Blocks(b, cfg.batch, cfg.hidden, cfg.heads, kv, cfg.bias, cfg.norm, cfg.dropout, cfg.flash_attention,
                  causal=True, head_dim=cfg.head_dim)
    blk.qkv_bias, blk.gated_act, blk.qk_norm = cfg.qkv_bias, cfg.gated_act, cfg.qk_norm
    bs = [cfg.batch, cfg.seq_len]
    b.block = "embedding"
    tokens = b.input("tokens", bs, dtype="int64", axes=["sample", "length"])
    x = b.add("embedding", "embed.tokens", [tokens], num_embeddings=cfg.vocab, embedding_dim=cfg.hidden,
              param_group="embed.tokens" if cfg.tie_embeddings else None)
    if cfg.positions == "learned":
        pos = b.input("positions", bs, dtype="int64", axes=["sample", "length"])
        p = b.add("embedding", "embed.positions", [pos], num_embeddings=cfg.max_positions or cfg.seq_len,
                  embedding_dim=cfg.hidden)
        x = b.add("add", "embed.sum", [x, p])
    x = blk.drop("embed.dropout", x)
    for i in range(cfg.layers):
        b.block = f"layers.{i}"
        n = f"layers.{i}"
        w = cfg.sliding_window if cfg.window_layers is None or i in cfg.window_layers else None
        if cfg.parallel:  # x + attn(norm1(x)) + mlp(norm2(x) or norm1(x)) (GPT-J, Falcon)
            h = blk.norm(f"{n}.norm1", x)
            a = blk.attention(f"{n}.attn", h, cfg.seq_len, window=w)
            m = blk.mlp(f"{n}.mlp", blk.norm(f"{n}.norm2", x) if cfg.parallel == 2 else h, ffn, cfg.swiglu)
            x = blk.residual(f"{n}.residual", x, b.add("add", f"{n}.attn_mlp_sum", [a, m]))
            continue
        a = blk.attention(f"{n}.attn", blk.norm(f"{n}.norm1", x), cfg.seq_len, window=w)
        if cfg.sandwich:
            a = blk.norm(f"{n}.attn_out_norm", a)
        x = blk.residual(f"{n}.attn_residual", x, a)
        m = blk.mlp(f"{n}.mlp", blk.norm(f"{n}.norm2", x), ffn, cfg.swiglu)
        if cfg.sandwich:
            m = blk.norm(f"{n}.mlp_out_norm", m)
        x = blk.residual(f"{n}.mlp_residual", x, m)
    b.block = "head"
    x = blk.norm("final_norm", x)
    logits = blk.linear("lm_head", x, cfg.vocab, bias=False,
                        param_group="embed.tokens" if cfg.tie_embeddings else None)
    labels = b.input("labels", bs, dtype="int64", axes=["sample", "length"])
    b.add("softmax_cross_entropy", "loss", [logits, labels])
    return b.build()


def _describe(cfg: GPTConfig, kv: int, ffn: int) -> str:
    attn = f"{cfg.heads} heads" + (f" ({kv} kv heads)" if kv != cfg.heads else "")
    mlp = (f"{'GeGLU' if cfg.gated_act == 'gelu' else 'SwiGLU'} {ffn}" if cfg.swiglu else f"MLP {ffn}") \
        + (" in parallel" if cfg.parallel else "")
    fused = ", FlashAttention" if cfg.flash_attention else ""
    if cfg.head_dim is not None:
        attn += f" of {cfg.head_dim}"
    if cfg.sliding_window is not None:
        n_win = cfg.layers if cfg.window_layers is None else len(cfg.window_layers)
        fused += f", {cfg.sliding_window}-token sliding window on {n_win} layers"
    return (f"GPT-style decoder: {cfg.layers} layers, hidden {cfg.hidden}, {attn}{fused}, {mlp}, "
            f"{cfg.norm}, seq {cfg.seq_len}, vocab {cfg.vocab}, batch {cfg.batch}, {cfg.precision}")


def gpt2(batch: int = 8, seq_len: int = 1024, precision: str = "fp32") -> OpGraph:
    """GPT-2 small, 124M (Radford et al. 2019; HF ``gpt2`` config: 12 layers, 768 hidden,
    12 heads, 1024 positions, vocabulary 50,257, tied output layer)."""
    return gpt(GPTConfig(12, 768, 12, seq_len, 50257, batch, max_positions=1024, precision=precision,
                         name="gpt2"), source=f"engine.models.transformer.gpt2(batch={batch})")


def gpt3_175b(batch: int = 1536, seq_len: int = 2048, precision: str = "fp16", vocab: int = 51200) -> OpGraph:
    """GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads, context
    2048). Batch 1536 sequences as in Megatron's 175B run (Narayanan et al. SC'21, Table 2).
    The vocabulary is GPT-2's 50,257 padded to 51,200 as Megatron-LM does
    (``--make-vocab-size-divisible-by 128`` x tensor-parallel 8; the SC'21 runs list 51,200)
    so that vocabulary-parallel layers split evenly."""
    return gpt(GPTConfig(96, 12288, 96, seq_len, vocab, batch, precision=precision, name="gpt3-175b"),
               source=f"engine.models.transformer.gpt3_175b(batch={batch})")


def llama2_7b(batch: int = 1024, seq_len: int = 4096, precision: str = "bf16") -> OpGraph:
    """LLaMA-2 7B (Touvron et al. 2023: 32 layers, 4096 hidden, 32 heads, SwiGLU 11008,
    RMSNorm, rotary positions, vocabulary 32,000, untied output, no biases; context 4096,
    4M-token batches = 1024 sequences)."""
    return gpt(GPTConfig(32, 4096, 32, seq_len, 32000, batch, ffn_hidden=11008, swiglu=True, norm="rmsnorm",
                         positions="rotary", bias=False, tie_embeddings=False, dropout=0.0,
                         precision=precision, name="llama2-7b"),
               source=f"engine.models.transformer.llama2_7b(batch={batch})")


def bert_large(batch: int = 32, seq_len: int = 512, precision: str = "fp16") -> OpGraph:
    """BERT-large (Devlin et al. 2019; HF ``bert-large-uncased`` config: 24 layers, 1024
    hidden, 16 heads, 4096 intermediate, vocabulary 30,522, 512 positions, 2 token types),
    post-LayerNorm, with the pooler and a masked-LM head (dense + GeLU + LayerNorm, decoder
    tied to the word embeddings; the decoder's bias and the next-sentence head are left out).
    """
    h, heads, layers, vocab = 1024, 16, 24, 30522
    b = GraphBuilder("bert-large", precision,
                     f"BERT-large encoder with masked-LM head: 24 layers, hidden 1024, 16 heads, seq {seq_len}, "
                     f"batch {batch}, {precision}", f"engine.models.transformer.bert_large(batch={batch})")
    blk = Blocks(b, batch, h, heads, heads, True, "layernorm", 0.1)
    bs = [batch, seq_len]
    b.block = "embedding"
    ids = [b.input(n, bs, dtype="int64", axes=["sample", "length"]) for n in ("tokens", "positions", "token_types")]
    x = b.add("embedding", "embed.tokens", [ids[0]], num_embeddings=vocab, embedding_dim=h, param_group="embed.tokens")
    x = b.add("add", "embed.sum1", [x, b.add("embedding", "embed.positions", [ids[1]], num_embeddings=512,
                                              embedding_dim=h)])
    x = b.add("add", "embed.sum2", [x, b.add("embedding", "embed.token_types", [ids[2]], num_embeddings=2,
                                              embedding_dim=h)])
    x = blk.drop("embed.dropout", blk.norm("embed.norm", x))
    for i in range(layers):
        b.block = n = f"layers.{i}"
        x = blk.norm(f"{n}.norm1", blk.residual(f"{n}.attn_residual", x, blk.attention(f"{n}.attn", x, seq_len)))
        x = blk.norm(f"{n}.norm2", blk.residual(f"{n}.mlp_residual", x, blk.mlp(f"{n}.mlp", x, 4 * h, False)))
    b.block = "head"
    cls = b.add("split", "pooler.take_cls", [x], axis=1, sizes=[1, seq_len - 1])[0]
    cls = b.add("reshape", "pooler.squeeze", [cls], shape=[batch, h], axes=["sample", "feature"])
    b.add("tanh", "pooler.act", [blk.linear("pooler.dense", cls, h)])
    t = blk.norm("mlm.norm", b.add("gelu", "mlm.act", [blk.linear("mlm.dense", x, h)]))
    logits = blk.linear("mlm.decoder", t, vocab, bias=False, param_group="embed.tokens")
    labels = b.input("labels", bs, dtype="int64", axes=["sample", "length"])
    b.add("softmax_cross_entropy", "loss", [logits, labels])
    return b.build()


def pase_transformer(batch: int = 64, seq_len: int = 256, layers: int = 6, hidden: int = 1024, heads: int = 8,
                     ffn: int = 4096, vocab: int = 50000, precision: str = "fp32") -> OpGraph:
    """PaSE's Transformer benchmark (Elango, IPDPS'21; baidu-research/PaSE ``graph.py`` and
    ``benchmarks/transformer.py``): a Vaswani et al. (2017) encoder-decoder with 6 + 6
    post-LayerNorm layers, d_model 1024, 8 heads, d_ff 4096, sequence 256, vocabulary 50,000,
    batch 64. Sinusoidal positions (no parameters, not modelled); output layer untied.
    """
    b = GraphBuilder("transformer", precision,
                     f"PaSE's Transformer: {layers}+{layers} layers, d_model {hidden}, {heads} heads, d_ff {ffn}, "
                     f"seq {seq_len}, vocab {vocab}, batch {batch}, {precision}",
                     f"engine.models.transformer.pase_transformer(batch={batch})")
    blk = Blocks(b, batch, hidden, heads, heads, True, "layernorm", 0.1)
    bs = [batch, seq_len]
    b.block = "encoder.embedding"
    src = b.input("source_tokens", bs, dtype="int64", axes=["sample", "length"])
    x = blk.drop("encoder.embed.dropout", b.add("embedding", "encoder.embed", [src], num_embeddings=vocab,
                                                  embedding_dim=hidden))
    for i in range(layers):
        b.block = n = f"encoder.{i}"
        x = blk.norm(f"{n}.norm1", blk.residual(f"{n}.attn_residual", x, blk.attention(f"{n}.attn", x, seq_len)))
        x = blk.norm(f"{n}.norm2", blk.residual(f"{n}.mlp_residual", x, blk.mlp(f"{n}.mlp", x, ffn, False)))
    memory = x
    b.block = "decoder.embedding"
    tgt = b.input("target_tokens", bs, dtype="int64", axes=["sample", "length"])
    y = blk.drop("decoder.embed.dropout", b.add("embedding", "decoder.embed", [tgt], num_embeddings=vocab,
                                                  embedding_dim=hidden))
    for i in range(layers):
        b.block = n = f"decoder.{i}"
        y = blk.norm(f"{n}.norm1", blk.residual(f"{n}.self_residual", y, blk.attention(f"{n}.self_attn", y, seq_len)))
        y = blk.norm(f"{n}.norm2", blk.residual(f"{n}.cross_residual", y,
                                                 blk.attention(f"{n}.cross_attn", y, seq_len, memory, seq_len)))
        y = blk.norm(f"{n}.norm3", blk.residual(f"{n}.mlp_residual", y, blk.mlp(f"{n}.mlp", y, ffn, False)))
    b.block = "head"
    logits = blk.linear("output", y, vocab)
    labels = b.input("labels", bs, dtype="int64", axes=["sample", "length"])
    b.add("softmax_cross_entropy", "loss", [logits, labels])
    return b.build()
