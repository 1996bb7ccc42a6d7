"""The model's own Megatron-LM flags (``--num-layers``, ``--hidden-size``, ...) for
:mod:`engine.export.megatron`, read from the graph, so that ``pretrain_gpt.py`` builds the
model that was simulated.

Flag names, kinds and defaults are those of Megatron-LM core_v0.19.0 (commit 5be9626709af),
read from its parser (``megatron/training/arguments.py`` ``_add_network_size_args``, and the
flags ``ArgumentGroupFactory`` makes from ``TransformerConfig``'s fields): ``--num-layers``,
``--hidden-size``, ``--ffn-hidden-size``, ``--num-attention-heads``, ``--group-query-attention``
with ``--num-query-groups``, ``--kv-channels``, ``--seq-length``,
``--max-position-embeddings``, ``--position-embedding-type`` (default ``learned_absolute``;
``rope``), ``--normalization`` (default ``LayerNorm``; ``RMSNorm``), ``--swiglu``,
``--disable-bias-linear`` (``add_bias_linear``, default on), ``--add-qkv-bias``,
``--qk-layernorm``, ``--untie-embeddings-and-output-weights`` (tied by default),
``--attention-dropout`` / ``--hidden-dropout`` (default 0.1 each) and ``--attention-backend``
(default ``auto``: a fused kernel). The vocabulary is the tokenizer's, padded by Megatron-LM to a
multiple of ``--make-vocab-size-divisible-by`` (128) x tp (``_vocab_size_with_padding`` in
``megatron/training/tokenizer/tokenizer.py``): said in a comment, not set.

Only soapbox's GPT-style decoders are read (pre-norm layers of ``attn.q/k/v/out`` and
``mlp.fc1/fc2`` or ``mlp.gate/up/down``, or MoE layers whose settings
:mod:`engine.export.moe` writes); for any other graph :func:`megatron_model_flags` says why
and the export asks for the model's flags instead.
"""

from __future__ import annotations

from ..graph import OpGraph
from ..graph.blocks import layer_blocks

__all__ = ["megatron_model_flags"]


def _fmt(rate: float) -> str:
    return f"{rate:g}"


def megatron_model_flags(graph: OpGraph, tp: int) -> tuple[list[str], list[str], str | None]:
    """(flags, comment lines, why not): the model's flags, or empty lists and the reason they
    cannot be read from ``graph``."""
    layers = layer_blocks(graph)
    ops = {op.name: op for op in graph.ops}
    emb, tokens = ops.get("embed.tokens"), ops.get("tokens")
    first = layers[0] if layers else ""
    q, out = ops.get(f"{first}.attn.q") or ops.get(f"{first}.attn.q_up"), ops.get(f"{first}.attn.out")
    mla = ops.get(f"{first}.attn.kv_down") is not None  # (its widths: export_moe's MLA flags)
    if emb is None or tokens is None or q is None or out is None:
        return [], [], "not a GPT-style decoder soapbox builds (embed.tokens, layers.N.attn.q/k/v/out)"
    lay0 = [o for o in graph.ops if o.block == first]
    norms = [o for o in lay0 if o.kind in ("layernorm", "rmsnorm") and o.name.split(".", 2)[-1] in ("norm1", "norm2")]
    if not norms or lay0.index(norms[0]) > lay0.index(q):
        return [], [], "post-norm layers (Megatron-LM's GPT normalises before attention and MLP)"
    if any(o.kind == "attention" and (o.attrs.get("window") or not o.attrs.get("causal", True)) for o in graph.ops):
        return [], [], "windowed or non-causal attention (soapbox does not write --window-size)"
    if any(o.name.endswith(".sinks") or "sink" in o.name for o in lay0):
        return [], [], "attention sinks"
    qs, ks = ops.get(f"{first}.attn.q.split_heads"), ops.get(f"{first}.attn.k.split_heads")
    if qs is None or (ks is None and not mla):
        return [], [], "attention heads not found (layers.N.attn.q.split_heads)"
    heads, head_dim = qs.attrs["shape"][2], qs.attrs["shape"][3]
    kv_heads = heads if mla else ks.attrs["shape"][2]
    hidden, vocab = emb.attrs["embedding_dim"], emb.attrs["num_embeddings"]
    seq = tokens.attrs["shape"][1]
    f = ["--num-layers", str(len(layers)), "--hidden-size", str(hidden), "--num-attention-heads", str(heads)]
    mlp = {x: ops.get(f"{first}.mlp.{x}") for x in ("fc1", "fc2", "gate", "up", "down")}
    moe = any(o.kind == "experts" for o in graph.ops)
    if mlp["gate"] is not None and mlp["up"] is not None:
        act = next((o for o in lay0 if o.name.startswith(f"{first}.mlp.") and o.kind in ("silu", "gelu")), None)
        if act is None or act.kind != "silu":
            return [], [], "a gated MLP whose activation is not SiLU (Megatron-LM's --swiglu)"
        f += ["--ffn-hidden-size", str(mlp["gate"].attrs["out_features"]), "--swiglu"]
    elif mlp["fc1"] is not None:
        act = next((o for o in lay0 if o.name.startswith(f"{first}.mlp.") and o.kind in ("gelu", "relu", "silu")), None)
        if act is None or act.kind != "gelu":
            return [], [], "an MLP whose activation is not GeLU (Megatron-LM's default)"
        f += ["--ffn-hidden-size", str(mlp["fc1"].attrs["out_features"])]
    elif moe:  # (every layer routed: the experts' own width is --moe-ffn-hidden-size)
        f += ["--swiglu"] if any(o.kind == "experts" and o.attrs.get("gated", True) for o in graph.ops) else []
    else:
        return [], [], "an MLP soapbox does not recognise (mlp.fc1/fc2 or mlp.gate/up/down)"
    if kv_heads != heads:
        f += ["--group-query-attention", "--num-query-groups", str(kv_heads)]
    if head_dim * heads != hidden and not mla:
        f += ["--kv-channels", str(head_dim)]
    pos = ops.get("embed.positions")
    f += ["--seq-length", str(seq), "--max-position-embeddings", str(pos.attrs["num_embeddings"] if pos else seq)]
    if pos is None:
        f += ["--position-embedding-type", "rope"]
    if norms[0].kind == "rmsnorm":
        f += ["--normalization", "RMSNorm"]
    if ops.get(f"{first}.attn.q.norm") is not None:
        f.append("--qk-layernorm")
    if not out.attrs.get("bias"):
        f.append("--disable-bias-linear")
        if q.attrs.get("bias"):
            f.append("--add-qkv-bias")
    head = ops.get("lm_head")
    if head is None or head.param_group != emb.param_group or head.param_group is None:
        f.append("--untie-embeddings-and-output-weights")
    drops = {o.name.split(".", 2)[-1]: o.attrs.get("rate", 0.0) for o in lay0 if o.kind == "dropout"}
    f += ["--attention-dropout", _fmt(drops.get("attn.attn_dropout", 0.0)),
          "--hidden-dropout", _fmt(drops.get("attn_residual.dropout", 0.0))]
    notes = []
    if ops.get(f"{first}.attn.scores") is not None:  # (scores, softmax and context as separate kernels)
        f += ["--attention-backend", "unfused"]
        notes.append("# attention: this model was simulated unfused (score matrix kept), so --attention-backend "
                     "unfused; a fused-attention model simulates and exports the default of Megatron-LM (auto)")
    pad = 128 * tp
    padded = -(-vocab // pad) * pad
    notes.append(f"# vocabulary: set by the tokenizer (simulated: {vocab:,}); Megatron-LM pads it to a multiple of "
                 f"128 x tp = {pad}" + (f" ({padded:,} here)" if padded != vocab else ""))
    return f, notes, None
