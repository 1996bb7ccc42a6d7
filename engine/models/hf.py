"""Decoder-only models from a Hugging Face ``config.json`` (read offline from a local file):
GPT-2, LLaMA / Mistral (grouped-query attention, SwiGLU, RMSNorm, rotary positions) and Qwen2
(the same with biases on the query, key and value projections), built by the same
:func:`engine.models.transformer.gpt` as ``soapbox model gpt`` and the sample models.

The fields read are those of the ``transformers`` configuration classes (``GPT2Config``:
``n_layer``, ``n_embd``, ``n_head``, ``n_inner``, ``n_positions``, ``vocab_size``,
``tie_word_embeddings``; ``LlamaConfig`` / ``MistralConfig`` / ``Qwen2Config``:
``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
``intermediate_size``, ``vocab_size``, ``max_position_embeddings``, ``hidden_act``,
``attention_bias``, ``mlp_bias``, ``tie_word_embeddings``, ``torch_dtype``), with those classes'
defaults where a field is absent. Anything that would change the parameter count or the
computation and is not modelled (another activation, MLP biases, a head dimension that is not
hidden / heads) is refused with the field named, not approximated.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..graph import OpGraph
from .transformer import GPTConfig, gpt

__all__ = ["FAMILIES", "from_hf_config"]

#: ``model_type`` -> family
FAMILIES = {"gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen2": "qwen2"}

#: torch_dtype -> soapbox precision
_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

#: the longest sequence an import defaults to when --seq-len is not given (a config's
#: max_position_embeddings can be 128 K or more; training runs set their own)
DEFAULT_MAX_SEQ = 4096


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None, *, where: str) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise ValueError(f"{where}: {key!r} is missing")
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 1 << 40:
        raise ValueError(f"{where}: {key!r} must be a positive integer, got {str(v)[:40]!r}")
    return v


def _bool(cfg: Mapping[str, Any], key: str, default: bool, *, where: str) -> bool:
    v = cfg.get(key, default)
    if not isinstance(v, bool):
        raise ValueError(f"{where}: {key!r} must be true or false, got {str(v)[:40]!r}")
    return v


def _rate(cfg: Mapping[str, Any], key: str, default: float, *, where: str) -> float:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
        raise ValueError(f"{where}: {key!r} must be a probability below 1, got {str(v)[:40]!r}")
    return float(v)


def from_hf_config(cfg: Mapping[str, Any], *, batch: int, seq_len: int | None = None, precision: str | None = None,
                   name: str | None = None, source: str = "config.json") -> OpGraph:
    """The model a Hugging Face config describes, for a global batch of ``batch`` sequences of
    ``seq_len`` tokens (default: the config's context, at most 4,096), in ``precision``
    (default: the config's ``torch_dtype``, else bf16).

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
    dtype = cfg.get("torch_dtype")
    if precision is None:
        precision = _DTYPES.get(dtype, "bf16") if isinstance(dtype, str) else "bf16"
    if family == "gpt2":
        layers = _int(cfg, "n_layer", where=where)
        hidden = _int(cfg, "n_embd", where=where)
        heads = _int(cfg, "n_head", where=where)
        positions = _int(cfg, "n_positions", 1024, where=where)
        ffn = cfg.get("n_inner")
        ffn = 4 * hidden if ffn is None else _int(cfg, "n_inner", where=where)
        act = cfg.get("activation_function", "gelu_new")
        if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
            raise ValueError(f"{where}: activation_function {str(act)[:40]!r}: soapbox models GPT-2's GELU only")
        seq = seq_len or min(positions, DEFAULT_MAX_SEQ)
        if seq > positions:
            raise ValueError(f"{where}: sequence length {seq} exceeds n_positions ({positions}), the learned "
                             "position table's rows")
        shape = GPTConfig(layers, hidden, heads, seq, _int(cfg, "vocab_size", 50257, where=where), batch,
                          ffn_hidden=ffn, max_positions=positions,
                          tie_embeddings=_bool(cfg, "tie_word_embeddings", True, where=where),
                          dropout=_rate(cfg, "resid_pdrop", 0.1, where=where),
                          precision=precision, name=name or str(cfg.get("_name_or_path") or "gpt2")[:80] or "gpt2")
    else:
        layers = _int(cfg, "num_hidden_layers", where=where)
        hidden = _int(cfg, "hidden_size", where=where)
        heads = _int(cfg, "num_attention_heads", where=where)
        kv = _int(cfg, "num_key_value_heads", heads, where=where)
        ffn = _int(cfg, "intermediate_size", where=where)
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"{where}: hidden_act {str(act)[:40]!r}: soapbox models the SwiGLU (silu) MLP only")
        head_dim = cfg.get("head_dim")
        if head_dim is not None and head_dim != hidden // heads:
            raise ValueError(f"{where}: head_dim {head_dim!r} differs from hidden_size / num_attention_heads "
                             f"({hidden // heads}); soapbox's attention uses hidden / heads")
        if _bool(cfg, "mlp_bias", False, where=where):
            raise ValueError(f"{where}: mlp_bias true is not modelled (biases on the MLP's projections)")
        context = _int(cfg, "max_position_embeddings", 2048, where=where)
        seq = seq_len or min(context, DEFAULT_MAX_SEQ)
        attn_bias = _bool(cfg, "attention_bias", False, where=where)
        qwen = family == "qwen2"
        shape = GPTConfig(layers, hidden, heads, seq, _int(cfg, "vocab_size", 32000, where=where), batch,
                          kv_heads=kv, ffn_hidden=ffn, swiglu=True, norm="rmsnorm", positions="rotary",
                          bias=attn_bias and not qwen, qkv_bias=True if qwen else None,
                          tie_embeddings=_bool(cfg, "tie_word_embeddings", False, where=where), dropout=0.0,
                          precision=precision, name=name or str(cfg.get("_name_or_path") or mt)[:80] or mt)
    try:
        return gpt(shape, source=f"imported from a Hugging Face config ({family}): {source}")
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
