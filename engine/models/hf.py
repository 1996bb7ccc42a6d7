"""Decoder-only models from a Hugging Face ``config.json`` (read offline from a local file):
GPT-2, LLaMA / Mistral / Phi-3 (grouped-query attention, SwiGLU, RMSNorm, rotary positions),
Qwen2 (the same with biases on the query, key and value projections), Gemma (GeGLU, heads of
256) and Falcon (multi-query attention, parallel attention and MLP, LayerNorm), built by the same
:func:`engine.models.transformer.gpt` as ``soapbox model gpt`` and the sample models; and the
mixture-of-experts decoders Mixtral, Qwen3-MoE, DeepSeek-V3 and GPT-OSS, built by
:func:`engine.models.moe.moe_gpt` as the MoE samples (see :func:`from_hf_config` for the
fields each reads and what it refuses or approximates).

The fields read are those of the ``transformers`` configuration classes (``GPT2Config``:
``n_layer``, ``n_embd``, ``n_head``, ``n_inner``, ``n_positions``, ``vocab_size``,
``tie_word_embeddings``; ``LlamaConfig`` / ``MistralConfig`` / ``Qwen2Config``:
``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
``intermediate_size``, ``vocab_size``, ``max_position_embeddings``, ``hidden_act``,
``head_dim``, ``attention_bias``, ``mlp_bias``, ``tie_word_embeddings``, ``torch_dtype``,
the sliding-window fields; Phi-3, Gemma and Falcon: see :func:`_dense`), with those classes'
defaults where a field is absent. Anything that would change the parameter count or the
computation and is not modelled (another activation, MLP biases, another norm placement) is
refused with the field named, not approximated. Sliding windows shorter than the sequence
are priced on fused attention ops with a ``window`` (:func:`engine.ops._attention_flops`). Sizes are bounded before
anything is built (at most :data:`MAX_LAYERS` layers, :data:`MAX_SIZE` for a width and
:data:`MAX_EXPERTS` experts), so a malformed config fails at once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..graph import OpGraph
from .hf_fields import (DEFAULT_MAX_SEQ, DTYPES, MAX_CONTEXT, MAX_EXPERTS, MAX_LAYERS, MAX_SIZE, bool_field, int_field,
                        layer_types, rate_field, shown)
from .hf_moe import moe_from_hf
from .transformer import GPTConfig, gpt

__all__ = ["FAMILIES", "MOE_FAMILIES", "MAX_LAYERS", "MAX_SIZE", "MAX_EXPERTS", "from_hf_config"]

#: ``model_type`` -> family
FAMILIES = {"gpt2": "gpt2", "llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "phi3": "phi3",
            "gemma": "gemma", "falcon": "falcon", "mixtral": "mixtral", "qwen3_moe": "qwen3_moe",
            "deepseek_v3": "deepseek_v3", "gpt_oss": "gpt_oss", "qwen3": "qwen3", "gemma2": "gemma2",
            "gemma3_text": "gemma3", "gemma3": "gemma3", "llama4_text": "llama4", "llama4": "llama4"}
#: the mixture-of-experts families
MOE_FAMILIES = ("mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "llama4")
#: multimodal configs whose language model is their ``text_config`` (imported alone, with a note)
MULTIMODAL = {"gemma3": "gemma3_text", "llama4": "llama4_text"}

def from_hf_config(cfg: Mapping[str, Any], *, batch: int, seq_len: int | None = None, precision: str | None = None,
                   name: str | None = None, source: str = "config.json", notes: list[str] | None = None,
                   attention: str | None = None) -> OpGraph:
    """The model a Hugging Face config describes, for a global batch of ``batch`` sequences of
    ``seq_len`` tokens (default: the config's context, at most 4,096), in ``precision``
    (default: the config's ``dtype`` or ``torch_dtype``, else bf16).

    ``attention``: "fused" (one FlashAttention-style op a layer, what training stacks run:
    transformers' default ``sdpa``, Megatron-LM, torchtitan) or "eager" (the matmuls, softmax
    and dropout, the score matrix kept for the backward). Default: fused, unless the config's
    ``attn_implementation`` says "eager". A mixture-of-experts import is fused always.

    What an import prices differently from the config (GPT-OSS's attention sinks, DeepSeek-V3's
    multi-token-prediction layer; a dense import's sliding window, priced on fused attention
    ops) is appended to ``notes`` when given; a mixture-of-experts import's notes also go to
    the graph's description.

    Raises
    ------
    ValueError
        Naming the field: an unknown ``model_type``, a missing or malformed size, or a feature
        soapbox does not model.

    Examples
    --------
    >>> g = from_hf_config({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
    ...                     "vocab_size": 100, "n_positions": 32}, batch=2)
    >>> g.name, g.param_count
    ('gpt2', 108544)

    Notes
    -----
    Mixture-of-experts configs (Mixtral, Qwen3-MoE, DeepSeek-V3, GPT-OSS; parameter counts
    equal those of transformers' own models of the config, tests/models/test_import_hf_moe.py) are
    read as transformers 5's modelling code uses them, absent fields taking its config classes'
    defaults: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
    ``vocab_size``, ``max_position_embeddings``, ``hidden_act`` (silu only),
    ``tie_word_embeddings``, ``num_experts_per_tok``, the experts' count and width (Mixtral
    ``num_local_experts`` / ``intermediate_size``; Qwen3-MoE ``num_experts`` /
    ``moe_intermediate_size``; DeepSeek-V3 ``n_routed_experts`` / ``moe_intermediate_size``;
    GPT-OSS ``num_local_experts`` / ``intermediate_size``) and per family:

    * Mixtral: ``num_key_value_heads``, ``head_dim``, ``sliding_window``.
    * Qwen3-MoE: the same, QK-norm on every layer, ``attention_bias`` (false only),
      ``decoder_sparse_step`` (1 only), ``mlp_only_layers`` (leading layers only: they become
      dense MLPs of ``intermediate_size``), ``use_sliding_window``.
    * DeepSeek-V3: MLA's ``q_lora_rank`` (null: a full query projection), ``kv_lora_rank``,
      ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``; ``first_k_dense_replace``
      (dense layers of ``intermediate_size``), ``n_shared_experts`` (of
      ``moe_intermediate_size`` each), ``moe_layer_freq`` (1 only), ``scoring_func`` (sigmoid
      only), ``topk_method`` (noaux_tc only), ``attention_bias`` (false only),
      ``num_nextn_predict_layers`` (not built, as transformers does not build it: a note).
    * GPT-OSS: ``num_key_value_heads``, ``head_dim``, ``attention_bias`` (true only: biases on
      the attention, the router and the experts), ``layer_types`` and ``sliding_window``.

    Not read because they change neither the parameters nor the priced computation:
    ``norm_topk_prob``, ``routed_scaling_factor``, ``n_group`` / ``topk_group`` (the
    group-limited choice of experts), aux-loss coefficients, ``swiglu_limit``, rotary
    settings, ``quantization_config`` (the checkpoint's storage; ``--precision`` sets the
    training precision). Sliding windows shorter than the sequence are modelled (the ``window``
    of the layers' fused attention: all layers for Mixtral and Qwen3-MoE, GPT-OSS's
    ``layer_types``). Left out, with a note: GPT-OSS's attention sinks (one logit a head a
    layer: ``heads x layers`` parameters, 2,304 for gpt-oss-120b).
    """
    where = source
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{where}: a Hugging Face config is a JSON object, got {type(cfg).__name__}")
    mt = cfg.get("model_type")
    family = FAMILIES.get(mt) if isinstance(mt, str) else None
    if family is None:
        shown = repr(mt[:40]) if isinstance(mt, str) else repr(mt)[:40]
        raise ValueError(f"{where}: model_type {shown} is not one soapbox imports; it imports "
                         f"{', '.join(sorted(FAMILIES))} (decoder-only families)")
    dtype = cfg.get("dtype") or cfg.get("torch_dtype")  # transformers 5 writes "dtype", 4 "torch_dtype"
    if mt in MULTIMODAL:  # the language model of an image-text model: its text_config
        cfg, dtype = _language_model(cfg, mt, where, notes)
    if precision is None:
        precision = DTYPES.get(dtype, "bf16") if isinstance(dtype, str) else "bf16"
    if family == "gpt2":
        layers = int_field(cfg, "n_layer", where=where, hi=MAX_LAYERS)
        hidden = int_field(cfg, "n_embd", where=where)
        heads = int_field(cfg, "n_head", where=where)
        positions = int_field(cfg, "n_positions", 1024, where=where, hi=MAX_CONTEXT)
        ffn = cfg.get("n_inner")
        ffn = 4 * hidden if ffn is None else int_field(cfg, "n_inner", where=where)
        act = cfg.get("activation_function", "gelu_new")
        if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
            raise ValueError(f"{where}: activation_function {str(act)[:40]!r}: soapbox models GPT-2's GELU only")
        seq = seq_len or min(positions, DEFAULT_MAX_SEQ)
        if seq > positions:
            raise ValueError(f"{where}: sequence length {seq} exceeds n_positions ({positions}), the learned "
                             "position table's rows")
        shape = GPTConfig(layers, hidden, heads, seq, int_field(cfg, "vocab_size", 50257, where=where), batch,
                          ffn_hidden=ffn, max_positions=positions,
                          tie_embeddings=bool_field(cfg, "tie_word_embeddings", True, where=where),
                          dropout=rate_field(cfg, "resid_pdrop", 0.1, where=where),
                          precision=precision, name=name or str(cfg.get("_name_or_path") or "gpt2")[:80] or "gpt2")
    elif family in MOE_FAMILIES:
        return moe_from_hf(cfg, family, batch=batch, seq_len=seq_len, precision=precision, name=name, source=source,
                    notes=notes)
    else:
        shape = _dense(cfg, family, batch=batch, seq_len=seq_len, precision=precision, name=name, where=where,
                       notes=notes)
    shape = _attention(cfg, shape, attention, where, notes)
    try:
        return gpt(shape, source=f"imported from a Hugging Face config ({family}): {source}")
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _language_model(cfg: Mapping[str, Any], mt: str, where: str,
                    notes: list[str] | None) -> tuple[dict[str, Any], Any]:
    """An image-text config's language model (its ``text_config``, named as the text family)
    and the dtype to train it in; a note says the vision encoder is left out."""
    text = cfg.get("text_config")
    if not isinstance(text, Mapping):
        raise ValueError(f"{where}: a {mt} config holds its language model in text_config, an object")
    if notes is not None:
        notes.append(f"{mt}: the language model (text_config) is imported; the vision encoder and its projector "
                     "are not modelled")
    dtype = cfg.get("dtype") or cfg.get("torch_dtype") or text.get("dtype") or text.get("torch_dtype")
    named = {"_name_or_path": cfg["_name_or_path"]} if cfg.get("_name_or_path") else {}
    return {**text, "model_type": MULTIMODAL[mt], **named}, dtype


def _attention(cfg: Mapping[str, Any], shape: GPTConfig, attention: str | None, where: str,
               notes: list[str] | None) -> GPTConfig:
    """``shape`` with fused or eager attention (:func:`from_hf_config`'s ``attention``)."""
    impl = cfg.get("attn_implementation", cfg.get("_attn_implementation"))
    if attention is None:
        attention = "eager" if impl == "eager" else "fused"
    if attention not in ("fused", "eager"):
        raise ValueError(f"attention must be 'fused' or 'eager', got {attention!r}")
    if shape.sliding_window is not None and attention == "eager":
        raise ValueError(f"{where}: a sliding window is priced on fused attention ops only; import it with fused "
                         "attention")
    if attention == "eager" and notes is not None:
        notes.append("attention imported eager (its matmuls, softmax and dropout, the scores kept for the backward)"
                     + (" as the config's attn_implementation says" if impl == "eager" else ""))
    return replace(shape, flash_attention=attention == "fused")


#: transformers 5's config-class defaults (MixtralConfig, Qwen3MoeConfig, DeepseekV3Config,
#: GptOssConfig) for the fields an import reads when a config leaves them out; the sizes that
#: make the model (layers, hidden, heads, experts, top-k, expert width) must be given
#: transformers 5's config-class defaults (LlamaConfig, MistralConfig, Qwen2Config, Phi3Config,
#: GemmaConfig, FalconConfig) for the fields a dense import reads when a config leaves them out
_DENSE_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"vocab_size": 32000, "max_position_embeddings": 2048, "tie_word_embeddings": False},
    "mistral": {"vocab_size": 32000, "max_position_embeddings": 131072, "tie_word_embeddings": False,
                "sliding_window": 4096},
    "qwen2": {"vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": False,
              "sliding_window": 4096, "max_window_layers": 28},
    "phi3": {"vocab_size": 32064, "max_position_embeddings": 4096, "tie_word_embeddings": False},
    "gemma": {"vocab_size": 256000, "max_position_embeddings": 8192, "tie_word_embeddings": True, "head_dim": 256},
    "qwen3": {"vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": False,
              "sliding_window": 4096, "max_window_layers": 28, "head_dim": 128},
    "gemma2": {"vocab_size": 256000, "max_position_embeddings": 8192, "tie_word_embeddings": True, "head_dim": 256,
               "sliding_window": 4096},
    "gemma3": {"vocab_size": 262208, "max_position_embeddings": 131072, "tie_word_embeddings": True, "head_dim": 256,
               "sliding_window": 4096, "sliding_window_pattern": 6},
    "falcon": {"vocab_size": 65024, "max_position_embeddings": 2048, "tie_word_embeddings": True,
               "num_hidden_layers": 32, "hidden_size": 4544, "num_attention_heads": 71},
}
_GELUS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def _dense(cfg: Mapping[str, Any], family: str, *, batch: int, seq_len: int | None, precision: str,
           name: str | None, where: str, notes: list[str] | None) -> GPTConfig:
    """The shape of a dense decoder other than GPT-2 (LLaMA, Mistral, Qwen2, Phi-3, Gemma, Falcon).

    * LLaMA / Mistral / Qwen2 / Phi-3: SwiGLU, RMSNorm, rotary; ``head_dim`` when given (Mistral-Nemo:
      32 heads of 128 with hidden 5120); Qwen2 biases on q, k, v; Phi-3's fused ``qkv_proj`` and
      ``gate_up_proj`` hold the same weights as separate projections.
    * Gemma: GeGLU (``hidden_activation`` / ``hidden_act``, a GeLU), ``head_dim`` (256), tied embeddings;
      its RMSNorm scales by 1 + w (the same gain) and its embedding by sqrt(hidden) (no parameters).
    * Falcon: LayerNorm, GeLU MLP of ``ffn_hidden_size`` (4 h), ``bias`` on every projection, multi-query
      attention (``multi_query``: one key/value head) or ``num_kv_heads`` (``new_decoder_architecture``),
      attention and MLP in parallel (``parallel_attn``) after one LayerNorm or two
      (``num_ln_in_parallel_attn``, 2 by default with the new architecture); ALiBi or rotary (no parameters).

    Sliding windows (Mistral ``sliding_window``; Qwen2 ``use_sliding_window`` on the layers from
    ``max_window_layers`` on; Phi-3 ``sliding_window``) shorter than the sequence are priced on fused
    attention ops (FlashAttention's window), with a note.
    """
    d = _DENSE_DEFAULTS[family]

    def num(key: str, **kw) -> int:
        return int_field(cfg, key, d.get(key), where=where, **kw)

    layers, hidden, heads = num("num_hidden_layers", hi=MAX_LAYERS), num("hidden_size"), num("num_attention_heads")
    context = num("max_position_embeddings", hi=MAX_CONTEXT)
    seq = seq_len or min(context, DEFAULT_MAX_SEQ)
    kw: dict[str, Any] = dict(swiglu=True, norm="rmsnorm", positions="rotary", bias=False, dropout=0.0)
    if family == "falcon":
        parallel, new_arch = bool_field(cfg, "parallel_attn", True, where=where), \
            bool_field(cfg, "new_decoder_architecture", False, where=where)
        if new_arch and not parallel:
            raise ValueError(f"{where}: new_decoder_architecture with parallel_attn false is not modelled")
        n_ln = cfg.get("num_ln_in_parallel_attn") or (2 if new_arch else 1)
        if n_ln not in (1, 2):
            raise ValueError(f"{where}: num_ln_in_parallel_attn {shown(n_ln)}: soapbox models 1 or 2 LayerNorms")
        kv = num("num_kv_heads", hi=MAX_SIZE) if cfg.get("num_kv_heads") is not None else heads
        if not new_arch and bool_field(cfg, "multi_query", True, where=where):
            kv = 1
        act = cfg.get("activation", "gelu")
        if act not in _GELUS:
            raise ValueError(f"{where}: activation {shown(act)}: soapbox models Falcon's GeLU MLP only")
        ffn = int_field(cfg, "ffn_hidden_size", 4 * hidden, where=where)
        kw = dict(swiglu=False, norm="layernorm", positions="rotary", bias=bool_field(cfg, "bias", False, where=where),
                  dropout=rate_field(cfg, "hidden_dropout", 0.0, where=where), parallel=n_ln if parallel else 0)
        head_dim = None
    else:
        kv = int_field(cfg, "num_key_value_heads", heads, where=where)
        ffn = num("intermediate_size")
        gemma = family in ("gemma", "gemma2", "gemma3")
        act = (cfg.get("hidden_activation") or cfg.get("hidden_act", "gelu_pytorch_tanh")) if gemma \
            else cfg.get("hidden_act", "silu")
        if gemma and act not in _GELUS:
            raise ValueError(f"{where}: hidden_activation {shown(act)}: soapbox models Gemma's GeGLU (a GeLU) only")
        if not gemma and act not in ("silu", "swish"):
            raise ValueError(f"{where}: hidden_act {str(act)[:40]!r}: soapbox models the SwiGLU (silu) MLP only")
        head_dim = None if cfg.get("head_dim", d.get("head_dim")) is None else num("head_dim")
        if head_dim == hidden // heads and hidden % heads == 0:
            head_dim = None
        if bool_field(cfg, "mlp_bias", False, where=where):
            raise ValueError(f"{where}: mlp_bias true is not modelled (biases on the MLP's projections)")
        attn_bias = bool_field(cfg, "attention_bias", False, where=where)
        qwen = family == "qwen2"
        kw.update(bias=attn_bias and not qwen, qkv_bias=True if qwen else None, gated_act="gelu" if gemma else "silu",
                  qk_norm=family in ("qwen3", "gemma3"), sandwich=family in ("gemma2", "gemma3"))
    window, windowed, field = None, None, ""
    if family in ("mistral", "phi3") and cfg.get("sliding_window", d.get("sliding_window")) is not None:
        window, field = num("sliding_window", hi=MAX_CONTEXT), "sliding_window"
    elif family in ("gemma2", "gemma3") and cfg.get("sliding_window", d["sliding_window"]) is not None:
        window, field = num("sliding_window", hi=MAX_CONTEXT), "sliding_window"
        types = cfg.get("layer_types")
        if types is None:  # transformers' rule: Gemma-2 alternates from a windowed layer; Gemma-3 has one global
            # layer in each sliding_window_pattern (6: five local layers, then a global one)
            every = 2 if family == "gemma2" else int_field(cfg, "sliding_window_pattern", d["sliding_window_pattern"],
                                                      where=where, lo=1, hi=MAX_LAYERS)
            windowed = tuple(i for i in range(layers) if (i + 1) % every)
        else:
            windowed = tuple(i for i, t in enumerate(layer_types(types, layers, where)) if t == "sliding_attention")
    elif family in ("qwen2", "qwen3") and bool_field(cfg, "use_sliding_window", False, where=where) and \
            cfg.get("sliding_window", d["sliding_window"]) is not None:
        window, field = num("sliding_window", hi=MAX_CONTEXT), "use_sliding_window"
        types = cfg.get("layer_types")
        if types is None:
            first = int_field(cfg, "max_window_layers", d["max_window_layers"], where=where, lo=0, hi=MAX_LAYERS)
            windowed = tuple(range(min(first, layers), layers))
        else:
            windowed = tuple(i for i, t in enumerate(layer_types(types, layers, where)) if t == "sliding_attention")
    if window is not None and window < seq and windowed != ():
        n = layers if windowed is None else len(windowed)
        kw.update(sliding_window=window, window_layers=windowed, flash_attention=True)
        found = (f"{n} of the {layers} layers attend within a {window}-token sliding window ({field}): priced on "
                 "fused (FlashAttention) attention ops, which skip the keys outside it")
        if notes is not None:
            notes.append(found)
    return GPTConfig(layers, hidden, heads, seq, num("vocab_size"), batch, kv_heads=kv, ffn_hidden=ffn,
                     head_dim=head_dim, tie_embeddings=bool_field(cfg, "tie_word_embeddings", d["tie_word_embeddings"],
                                                             where=where),
                     precision=precision, name=name or str(cfg.get("_name_or_path") or family)[:80] or family, **kw)
