"""Mixture-of-experts decoders: Mixtral, DeepSeek-V3, Qwen3-MoE and GPT-OSS from their
published shapes.

A MoE decoder layer is a GPT-style layer (:mod:`engine.models.transformer`) whose MLP is
replaced by a ``router`` (token scores over the experts, top-k) and an ``experts`` op (the
routed experts as grouped GEMMs, with the token dispatch and combine), plus optional shared
experts that every token passes through (an ordinary SwiGLU MLP, DeepSeek's shared expert;
Dai et al. 2024, DeepSeekMoE §3.2). The first ``dense_layers`` layers keep a dense MLP
(DeepSeek-V3: 3).

Attention is grouped-query attention with an explicit head width (Qwen3: 128 with hidden
2048; GPT-OSS: 64 with hidden 2880), or DeepSeek's multi-head latent attention (MLA, DeepSeek-V2
§2.1, Liu et al. 2024): queries through a low-rank projection (q_lora), keys and values
through a shared compressed latent (kv_lora) plus a decoupled rotary key, expanded per head;
q.k head width nope + rope (192), values 128. Qwen3's QK-norm (an RMSNorm over each query and
key head's width, Qwen3 technical report 2025 §2) is an ``rmsnorm`` op on the heads. FLOPs and
parameters follow the weights; the few FLOPs of rotary embeddings are not modelled.

Sources of the shapes (each sample's docstring):
Mixtral 8x7B (Jiang et al. 2024 Table 1; HF ``mistralai/Mixtral-8x7B-v0.1`` config),
DeepSeek-V3 (DeepSeek-AI 2024 §4.2; HF ``deepseek-ai/DeepSeek-V3`` config),
Qwen3-30B-A3B and Qwen3-235B-A22B (Qwen3 technical report 2025 Table 2; HF configs),
GPT-OSS-120B (OpenAI gpt-oss model card 2025, Table 1; HF ``openai/gpt-oss-120b`` config).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..graph import GraphBuilder, OpGraph, TensorRef
from .transformer import Blocks

__all__ = ["MoEConfig", "moe_gpt", "mixtral_8x7b", "deepseek_v3", "qwen3_30b_a3b", "qwen3_235b_a22b",
           "gpt_oss_120b", "MOE_SAMPLES"]


@dataclass(frozen=True)
class MoEConfig:
    """Shape of a mixture-of-experts decoder. Sizes in elements."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    batch: int
    experts: int
    top_k: int
    expert_ffn: int  # intermediate width of one routed expert
    kv_heads: int | None = None  # None: = heads
    head_dim: int | None = None  # None: hidden / heads
    shared_experts: int = 0  # experts every token passes through (their widths add: one MLP)
    shared_ffn: int | None = None  # one shared expert's width; None: expert_ffn
    dense_layers: int = 0  # leading layers with a dense MLP instead of experts
    dense_ffn: int | None = None  # their width; None: expert_ffn
    #: the layers with experts, ascending (None: every layer from ``dense_layers`` on); the
    #: others have a dense MLP of ``dense_ffn`` (Llama 4 Maverick: experts on every second layer,
    #: HF ``interleave_moe_layer_step`` 2)
    moe_layer_ids: tuple[int, ...] | None = None
    score: str = "softmax"  # router score: softmax, or sigmoid with a balancing bias (DeepSeek-V3)
    capacity_factor: float = 0.0  # 0: dropless
    dispatcher: str = "alltoall"
    attention: str = "gqa"  # or "mla"
    q_lora: int = 0  # MLA: query compression rank (0: a full query projection)
    kv_lora: int = 512  # MLA: key/value latent width
    qk_nope: int = 128  # MLA: per-head q.k width without rotary
    qk_rope: int = 64  # MLA: per-head rotary q.k width (the rotary key is shared by the heads)
    v_head: int = 128  # MLA: per-head value width
    qk_norm: bool = False  # RMSNorm over each query and key head (Qwen3; a gain of head_dim each)
    bias: bool = False  # biases on the attention projections and the experts (GPT-OSS)
    sliding_window: int | None = None  # keys a query sees in windowed layers (GPT-OSS: 128)
    window_layers: tuple[int, ...] | None = None  # the windowed layers; None: every layer
    tie_embeddings: bool = False
    precision: str = "bf16"
    name: str = "moe"

    def check(self) -> None:
        """Raise ``ValueError`` naming the first inconsistent field."""
        for f in ("layers", "hidden", "heads", "seq_len", "vocab", "batch", "experts", "top_k", "expert_ffn"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{f} must be a positive integer, got {v!r}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds the {self.experts} experts")
        if not 0 <= self.dense_layers <= self.layers:
            raise ValueError(f"dense_layers must be 0..{self.layers}, got {self.dense_layers}")
        ids = self.moe_layer_ids
        if ids is not None:
            if self.dense_layers:
                raise ValueError("give the experts' layers (moe_layer_ids) or the leading dense layers "
                                 "(dense_layers), not both")
            if list(ids) != sorted(set(ids)) or not all(isinstance(i, int) and 0 <= i < self.layers for i in ids):
                raise ValueError(f"moe_layer_ids must be distinct layers 0..{self.layers - 1} in order, got "
                                 f"{str(ids)[:60]}")
        if self.attention not in ("gqa", "mla"):
            raise ValueError(f"attention must be 'gqa' or 'mla', got {self.attention!r}")
        kv = self.kv_heads or self.heads
        if kv <= 0 or self.heads % kv:
            raise ValueError(f"kv_heads ({kv}) must divide heads ({self.heads})")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
            raise ValueError(f"sliding_window must be a positive integer, got {self.sliding_window!r}")
        if self.window_layers is not None and not all(0 <= i < self.layers for i in self.window_layers):
            raise ValueError(f"window_layers must name layers 0..{self.layers - 1}")
        if self.attention == "gqa" and self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden ({self.hidden}) unless head_dim is given")

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.moe_layer_ids is None else len(self.moe_layer_ids)

    def has_experts(self, layer: int) -> bool:
        """Whether numbered layer ``layer`` has the experts (else a dense MLP)."""
        return layer >= self.dense_layers if self.moe_layer_ids is None else layer in self.moe_layer_ids


class _MoEBlocks(Blocks):
    """Blocks with the mixture-of-experts MLP and multi-head latent attention."""

    def __init__(self, b: GraphBuilder, cfg: MoEConfig) -> None:
        super().__init__(b, cfg.batch, cfg.hidden, cfg.heads, cfg.kv_heads or cfg.heads, cfg.bias, "rmsnorm", 0.0,
                         flash=True, causal=True, head_dim=cfg.head_dim)
        self.cfg = cfg
        self.qk_norm = cfg.qk_norm  # (Blocks._heads normalises each query and key head)

    def moe(self, name: str, x: TensorRef) -> TensorRef:
        c = self.cfg
        extra = {"bias": True} if c.bias else {}
        probs = self.b.add("router", f"{name}.router", [x], num_experts=c.experts, top_k=c.top_k, score=c.score,
                           **extra)
        attrs = {"num_experts": c.experts, "top_k": c.top_k, "ffn_hidden": c.expert_ffn, **extra}
        if c.capacity_factor:
            attrs["capacity_factor"] = c.capacity_factor
        if c.dispatcher != "alltoall":
            attrs["dispatcher"] = c.dispatcher
        y = self.b.add("experts", f"{name}.experts", [x, probs], **attrs)
        if c.shared_experts:
            shared = self.mlp(f"{name}.shared", x, c.shared_experts * (c.shared_ffn or c.expert_ffn), True)
            y = self.b.add("add", f"{name}.shared_sum", [y, shared])
        return y

    def split_heads(self, name: str, x: TensorRef, seq: int, heads: int, width: int) -> TensorRef:
        """[b, s, heads*width] -> [b, heads, s, width]"""
        r = self.b.add("reshape", f"{name}.split_heads", [x], shape=[self.batch, seq, heads, width],
                       axes=["sample", "length", "head", "head_dim"])
        return self.b.add("transpose", f"{name}.to_bhsd", [r], perm=[0, 2, 1, 3])

    def mla(self, name: str, x: TensorRef, seq: int) -> TensorRef:
        """Multi-head latent attention (DeepSeek-V2 §2.1.2-2.1.3) with a FlashAttention core:
        queries through the q_lora bottleneck, keys and values expanded per head from the
        kv_lora latent, and a rotary key one head wide shared by every head (broadcast)."""
        c, b, n = self.cfg, self.b, self.heads
        qk = c.qk_nope + c.qk_rope
        if c.q_lora:
            q = self.linear(f"{name}.q_down", x, c.q_lora, bias=False)
            q = self.linear(f"{name}.q_up", self.norm(f"{name}.q_norm", q), n * qk, bias=False)
        else:
            q = self.linear(f"{name}.q", x, n * qk, bias=False)
        kv = self.linear(f"{name}.kv_down", x, c.kv_lora + c.qk_rope, bias=False)
        latent, rope = b.add("split", f"{name}.kv_split", [kv], axis=2, sizes=[c.kv_lora, c.qk_rope])
        kv = self.linear(f"{name}.kv_up", self.norm(f"{name}.kv_norm", latent), n * (c.qk_nope + c.v_head),
                         bias=False)
        kv = b.add("reshape", f"{name}.kv_heads", [kv], shape=[c.batch, seq, n, c.qk_nope + c.v_head],
                   axes=["sample", "length", "head", "head_dim"])
        k_nope, v = b.add("split", f"{name}.k_v_split", [kv], axis=3, sizes=[c.qk_nope, c.v_head])
        rope = b.add("reshape", f"{name}.k_rope_head", [rope], shape=[c.batch, seq, 1, c.qk_rope],
                     axes=["sample", "length", "head", "head_dim"])
        rope = b.add("broadcast", f"{name}.k_rope_heads", [rope], axis=2, size=n)
        k = b.add("concat", f"{name}.k_cat", [k_nope, rope], axis=3)
        q = self.split_heads(f"{name}.q", q, seq, n, qk)
        k = b.add("transpose", f"{name}.k.to_bhsd", [k], perm=[0, 2, 1, 3])
        v = b.add("transpose", f"{name}.v.to_bhsd", [v], perm=[0, 2, 1, 3])
        ctx = b.add("attention", f"{name}.core", [q, k, v], causal=True)
        return self.merge(name, ctx, seq)


def moe_gpt(cfg: MoEConfig, description: str = "", source: str = "", notes: Sequence[str] = ()) -> OpGraph:
    """Build a mixture-of-experts decoder from its shape: token embedding, ``layers`` pre-norm
    blocks (attention, then a dense MLP for the first ``dense_layers`` and router + experts
    (+ shared experts) for the rest), a final RMSNorm, the output layer and the loss.
    ``notes`` (what the shape leaves out, e.g. an importer's approximations) are appended to
    the description.

    >>> g = moe_gpt(MoEConfig(layers=2, hidden=64, heads=4, seq_len=16, vocab=100, batch=2, experts=8,
    ...                       top_k=2, expert_ffn=32))
    >>> g["layers.1.mlp.experts"].params[0].shape
    (8, 64, 64)
    """
    cfg.check()
    description = " ".join([description or _describe(cfg), *(f"Note: {n}." for n in notes)])
    b = GraphBuilder(cfg.name, cfg.precision, description, source)
    blk = _MoEBlocks(b, cfg)
    bs = [cfg.batch, cfg.seq_len]
    b.block = "embedding"
    tokens = b.input("tokens", bs, dtype="int64", axes=["sample", "length"])
    x = b.add("embedding", "embed.tokens", [tokens], num_embeddings=cfg.vocab, embedding_dim=cfg.hidden,
              param_group="embed.tokens" if cfg.tie_embeddings else None)
    for i in range(cfg.layers):
        b.block = n = f"layers.{i}"
        h = blk.norm(f"{n}.norm1", x)
        w = cfg.sliding_window if cfg.window_layers is None or i in cfg.window_layers else None
        a = blk.mla(f"{n}.attn", h, cfg.seq_len) if cfg.attention == "mla" else \
            blk.attention(f"{n}.attn", h, cfg.seq_len, window=w)
        x = blk.residual(f"{n}.attn_residual", x, a)
        h = blk.norm(f"{n}.norm2", x)
        m = blk.moe(f"{n}.mlp", h) if cfg.has_experts(i) else blk.mlp(f"{n}.mlp", h, cfg.dense_ffn or cfg.expert_ffn, True)
        x = blk.residual(f"{n}.mlp_residual", x, m)
    b.block = "head"
    x = blk.norm("final_norm", x)
    logits = blk.linear("lm_head", x, cfg.vocab, bias=False, param_group="embed.tokens" if cfg.tie_embeddings else None)
    labels = b.input("labels", bs, dtype="int64", axes=["sample", "length"])
    b.add("softmax_cross_entropy", "loss", [logits, labels])
    return b.build()


def _describe(cfg: MoEConfig) -> str:
    shared = f" + {cfg.shared_experts} shared" if cfg.shared_experts else ""
    dense = f", first {cfg.dense_layers} dense (FFN {cfg.dense_ffn})" if cfg.dense_layers else ""
    if cfg.moe_layer_ids is not None and cfg.moe_layers < cfg.layers:
        dense = f", experts on {cfg.moe_layers} of the layers, the others dense (FFN {cfg.dense_ffn})"
    attn = "MLA" if cfg.attention == "mla" else f"{cfg.heads} heads" + (
        f" ({cfg.kv_heads} kv)" if cfg.kv_heads and cfg.kv_heads != cfg.heads else "")
    if cfg.sliding_window is not None:
        n_win = cfg.layers if cfg.window_layers is None else len(cfg.window_layers)
        attn += f", {cfg.sliding_window}-token sliding window on {n_win} layers"
    return (f"Mixture-of-experts decoder: {cfg.layers} layers, hidden {cfg.hidden}, {attn}, {cfg.experts} experts"
            f"{shared} top-{cfg.top_k} (expert FFN {cfg.expert_ffn}){dense}, seq {cfg.seq_len}, vocab {cfg.vocab}, "
            f"batch {cfg.batch}, {cfg.precision}")


def mixtral_8x7b(batch: int = 256, seq_len: int = 4096, precision: str = "bf16") -> OpGraph:
    """Mixtral 8x7B (Jiang et al. 2024, Table 1; HF ``mistralai/Mixtral-8x7B-v0.1``): 32 layers,
    hidden 4096, 32 heads (8 kv), 8 experts of SwiGLU 14336, top-2, vocabulary 32,000, untied;
    46.7 B parameters, 12.9 B active. Batch 256 of 4,096 tokens as Megatron-Core's MoE README's
    reference run."""
    return moe_gpt(MoEConfig(32, 4096, 32, seq_len, 32000, batch, 8, 2, 14336, kv_heads=8, precision=precision,
                             name="mixtral-8x7b"), source=f"engine.models.moe.mixtral_8x7b(batch={batch})")


def deepseek_v3(batch: int = 8192, seq_len: int = 4096, precision: str = "bf16") -> OpGraph:
    """DeepSeek-V3 (DeepSeek-AI 2024, §4.2; HF ``deepseek-ai/DeepSeek-V3`` config): 61 layers,
    hidden 7168, MLA with 128 heads (q_lora 1536, kv_lora 512, q.k 128 + 64 rotary, v 128), the
    first 3 layers dense (SwiGLU 18432), then 256 routed experts of 2048 and 1 shared, top-8,
    sigmoid scores with a balancing bias; vocabulary 129,280, untied. 671 B parameters, 37 B
    active (the multi-token-prediction module's 14 B are not built). Batch 8192 of 4,096
    tokens as Megatron-Bridge's DGX-H100 table."""
    return moe_gpt(MoEConfig(61, 7168, 128, seq_len, 129280, batch, 256, 8, 2048, shared_experts=1,
                             dense_layers=3, dense_ffn=18432, score="sigmoid", attention="mla", q_lora=1536,
                             kv_lora=512, qk_nope=128, qk_rope=64, v_head=128, precision=precision,
                             name="deepseek-v3"), source=f"engine.models.moe.deepseek_v3(batch={batch})")


def qwen3_30b_a3b(batch: int = 512, seq_len: int = 4096, precision: str = "bf16") -> OpGraph:
    """Qwen3-30B-A3B (Qwen3 technical report 2025, Table 2; HF ``Qwen/Qwen3-30B-A3B``): 48
    layers, hidden 2048, 32 heads of 128 (4 kv) with QK-norm, 128 experts of SwiGLU 768, top-8,
    vocabulary 151,936, untied; 30.5 B parameters (30,532,122,624, as transformers counts the HF
    config), 3.3 B active."""
    return moe_gpt(MoEConfig(48, 2048, 32, seq_len, 151936, batch, 128, 8, 768, kv_heads=4, head_dim=128,
                             qk_norm=True, precision=precision, name="qwen3-30b-a3b"),
                   source=f"engine.models.moe.qwen3_30b_a3b(batch={batch})")


def qwen3_235b_a22b(batch: int = 2048, seq_len: int = 4096, precision: str = "bf16") -> OpGraph:
    """Qwen3-235B-A22B (Qwen3 technical report 2025, Table 2; HF ``Qwen/Qwen3-235B-A22B``): 94
    layers, hidden 4096, 64 heads of 128 (4 kv) with QK-norm, 128 experts of SwiGLU 1536, top-8,
    vocabulary 151,936, untied; 235 B parameters (235,093,634,560, as transformers counts the HF
    config), 22 B active."""
    return moe_gpt(MoEConfig(94, 4096, 64, seq_len, 151936, batch, 128, 8, 1536, kv_heads=4, head_dim=128,
                             qk_norm=True, precision=precision, name="qwen3-235b-a22b"),
                   source=f"engine.models.moe.qwen3_235b_a22b(batch={batch})")


def gpt_oss_120b(batch: int = 512, seq_len: int = 4096, precision: str = "bf16") -> OpGraph:
    """GPT-OSS-120B (OpenAI gpt-oss model card 2025, Table 1; HF ``openai/gpt-oss-120b``): 36
    layers, hidden 2880, 64 heads of 64 (8 kv), 128 experts of SwiGLU 2880 with biases, top-4,
    vocabulary 201,088, untied; 116.8 B parameters, 5.1 B active. Even layers attend within a
    128-token sliding window, odd layers over the whole sequence (the config's ``layer_types``).
    Not modelled: the attention sinks (64 scalars a layer)."""
    return moe_gpt(MoEConfig(36, 2880, 64, seq_len, 201088, batch, 128, 4, 2880, kv_heads=8, head_dim=64,
                             bias=True, sliding_window=128, window_layers=tuple(range(0, 36, 2)),
                             precision=precision, name="gpt-oss-120b"),
                   source=f"engine.models.moe.gpt_oss_120b(batch={batch})")


#: sample name -> builder
MOE_SAMPLES = {"mixtral-8x7b": mixtral_8x7b, "deepseek-v3": deepseek_v3, "qwen3-30b-a3b": qwen3_30b_a3b,
               "qwen3-235b-a22b": qwen3_235b_a22b, "gpt-oss-120b": gpt_oss_120b}
