"""Mixture-of-experts decoders from a Hugging Face ``config.json`` (Mixtral, Qwen3-MoE,
DeepSeek-V3, GPT-OSS, Llama 4 Scout and Maverick), built by :func:`engine.models.moe.moe_gpt`
as the MoE samples; :func:`engine.models.hf.from_hf_config` reads the family and calls
:func:`moe_from_hf` (see it for the fields each family reads and what it refuses)."""

from __future__ import annotations

from typing import Any, Mapping

from ..graph import OpGraph
from .hf_fields import DEFAULT_MAX_SEQ, MAX_CONTEXT, MAX_EXPERTS, MAX_LAYERS, bool_field, int_field, layer_types, shown
from .moe import MoEConfig, moe_gpt

__all__ = ["MOE_DEFAULTS", "EXPERT_FIELDS", "llama4_moe_layers", "moe_from_hf"]

MOE_DEFAULTS: dict[str, dict[str, Any]] = {
    "mixtral": {"num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 131072},
    "qwen3_moe": {"num_key_value_heads": 4, "vocab_size": 151936, "max_position_embeddings": 32768,
                  "intermediate_size": 6144, "sliding_window": 4096},
    "deepseek_v3": {"vocab_size": 129280, "max_position_embeddings": 4096, "intermediate_size": 18432,
                    "first_k_dense_replace": 3, "n_shared_experts": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
                    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
    "gpt_oss": {"num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088, "max_position_embeddings": 131072,
                "sliding_window": 128},
    "llama4": {"num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "max_position_embeddings": 131072,
               "num_local_experts": 16, "num_experts_per_tok": 1, "intermediate_size": 8192,
               "attention_chunk_size": 8192, "intermediate_size_mlp": 16384},
}
#: family -> the fields naming the routed experts' count (aliases: transformers 5 maps
#: num_experts to num_local_experts) and one expert's intermediate width
EXPERT_FIELDS = {"mixtral": (("num_local_experts",), "intermediate_size"),
                  "qwen3_moe": (("num_experts", "num_local_experts"), "moe_intermediate_size"),
                  "deepseek_v3": (("n_routed_experts",), "moe_intermediate_size"),
                  "gpt_oss": (("num_local_experts", "num_experts"), "intermediate_size"),
                  "llama4": (("num_local_experts",), "intermediate_size")}


def llama4_moe_layers(cfg: Mapping[str, Any], layers: int, where: str) -> tuple[int, ...]:
    """Llama 4's layers with experts: ``moe_layers`` as given, else every
    ``interleave_moe_layer_step``-th layer counting from step - 1 (transformers'
    ``Llama4TextConfig``: Scout 1, every layer; Maverick 2, layers 1, 3, 5, ...)."""
    given = cfg.get("moe_layers")
    if given is None:
        step = int_field(cfg, "interleave_moe_layer_step", 1, where=where, hi=layers)
        return tuple(range(step - 1, layers, step))
    if not isinstance(given, list) or len(given) > layers or \
            not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers for i in given) or \
            given != sorted(set(given)):
        raise ValueError(f"{where}: moe_layers {shown(given)}: distinct layer numbers 0..{layers - 1} in order")
    return tuple(given)


def moe_from_hf(cfg: Mapping[str, Any], family: str, *, batch: int, seq_len: int | None, precision: str,
         name: str | None, source: str, notes: list[str] | None) -> OpGraph:
    """A mixture-of-experts decoder through :func:`engine.models.moe.moe_gpt` (the fields read
    are listed in :func:`from_hf_config`'s notes)."""
    where, d = source, MOE_DEFAULTS[family]

    def num(key: str, **kw) -> int:
        return int_field(cfg, key, d.get(key), where=where, **kw)

    def only(key: str, allowed: Any, default: Any, what: str) -> None:
        v = cfg.get(key, default)
        if v != allowed or isinstance(v, bool) != isinstance(allowed, bool):
            raise ValueError(f"{where}: {key} {shown(v)} is not modelled; soapbox models {what}")

    layers, hidden, heads = num("num_hidden_layers", hi=MAX_LAYERS), num("hidden_size"), num("num_attention_heads")
    vocab, context = num("vocab_size"), num("max_position_embeddings", hi=MAX_CONTEXT)
    seq = seq_len or min(context, DEFAULT_MAX_SEQ)
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"{where}: hidden_act {str(act)[:40]!r}: soapbox models SwiGLU (silu) experts only")
    keys, width = EXPERT_FIELDS[family]
    given = [k for k in keys if cfg.get(k) is not None]
    if len(given) > 1 and cfg[given[0]] != cfg[given[1]]:
        raise ValueError(f"{where}: {given[0]!r} and {given[1]!r} disagree ({str(cfg[given[0]])[:20]} vs "
                         f"{str(cfg[given[1]])[:20]})")
    experts = num(given[0] if given else keys[0], hi=MAX_EXPERTS)
    top_k = num("num_experts_per_tok", hi=MAX_EXPERTS)
    if top_k > experts:
        raise ValueError(f"{where}: 'num_experts_per_tok' ({top_k}) exceeds the {experts} routed experts")
    kw: dict[str, Any] = {}
    found: list[str] = []  # what is priced differently from the config

    def window(w: int, windowed: tuple[int, ...] | None) -> None:
        if w < seq and windowed != ():
            kw.update(sliding_window=w, window_layers=windowed)

    if family == "deepseek_v3":
        only("attention_bias", False, False, "DeepSeek-V3's attention without biases")
        only("moe_layer_freq", 1, 1, "an experts layer after every dense one (moe_layer_freq 1)")
        only("scoring_func", "sigmoid", "sigmoid", "DeepSeek-V3's sigmoid router")
        only("topk_method", "noaux_tc", "noaux_tc", "DeepSeek-V3's bias-balanced top-k (noaux_tc)")
        q_lora = 0 if "q_lora_rank" in cfg and cfg["q_lora_rank"] is None else num("q_lora_rank")
        dense = num("first_k_dense_replace", lo=0, hi=layers)
        kw = dict(attention="mla", q_lora=q_lora, kv_lora=num("kv_lora_rank"), qk_nope=num("qk_nope_head_dim"),
                  qk_rope=num("qk_rope_head_dim"), v_head=num("v_head_dim"), score="sigmoid",
                  shared_experts=num("n_shared_experts", lo=0, hi=MAX_EXPERTS), dense_layers=dense,
                  dense_ffn=num("intermediate_size") if dense else None)
        mtp = int_field(cfg, "num_nextn_predict_layers", 0, where=where, lo=0, hi=MAX_LAYERS)
        if mtp:
            found.append(f"num_nextn_predict_layers {mtp}: the multi-token-prediction module is not built (nor "
                         "by transformers' DeepseekV3ForCausalLM)")
    else:
        head_dim = None if cfg.get("head_dim", d.get("head_dim")) is None else num("head_dim")
        kw = dict(kv_heads=num("num_key_value_heads"), head_dim=head_dim)
        if family == "qwen3_moe":
            only("attention_bias", False, False, "Qwen3-MoE's attention without biases")
            only("decoder_sparse_step", 1, 1, "experts on every layer but the leading mlp_only_layers")
            dense = cfg.get("mlp_only_layers") or []
            if not isinstance(dense, list) or len(dense) > layers or dense != list(range(len(dense))):
                raise ValueError(f"{where}: mlp_only_layers {str(dense)[:40]}: soapbox models dense layers before "
                                 "the experts layers only (0, 1, .., k-1)")
            kw.update(qk_norm=True, dense_layers=len(dense), dense_ffn=num("intermediate_size") if dense else None)
            if bool_field(cfg, "use_sliding_window", False, where=where):
                window(num("sliding_window", hi=MAX_CONTEXT), None)
        elif family == "llama4":
            only("attention_bias", False, False, "Llama 4's attention without biases")
            ids = llama4_moe_layers(cfg, layers, where)
            if len(ids) < layers:  # (Maverick: experts on every second layer, dense MLPs between)
                kw.update(moe_layer_ids=ids, dense_ffn=num("intermediate_size_mlp"))
            chunk = num("attention_chunk_size", hi=MAX_CONTEXT)
            if seq > chunk:
                raise ValueError(f"{where}: sequence {seq:,} is longer than attention_chunk_size ({chunk:,}): chunked "
                                 "attention (each query sees its own chunk) is not modelled; use --seq-len up to it")
            kw.update(shared_experts=1, shared_ffn=num(width), score="sigmoid")
            if bool_field(cfg, "use_qk_norm", True, where=where):
                found.append("use_qk_norm: Llama 4's L2 norm of queries and keys has no parameters and is not priced")
        elif family == "mixtral":
            if cfg.get("sliding_window") is not None:
                window(num("sliding_window", hi=MAX_CONTEXT), None)
        else:  # gpt_oss
            only("attention_bias", True, True, "GPT-OSS's attention with biases")
            alias = cfg.get("experts_per_token")
            if alias is not None and alias != top_k:
                raise ValueError(f"{where}: 'experts_per_token' ({str(alias)[:20]}) and 'num_experts_per_tok' "
                                 f"({top_k}) disagree")
            types = cfg.get("layer_types")
            types = ["sliding_attention", "full_attention"] * (layers // 2) + ["sliding_attention"] * (layers % 2) \
                if types is None else layer_types(types, layers, where)
            if "sliding_attention" in types:
                window(num("sliding_window", hi=MAX_CONTEXT),
                       tuple(i for i, t in enumerate(types) if t == "sliding_attention"))
            found.append(f"the attention sinks (one logit a head a layer, {heads * layers:,} parameters) are not "
                         "modelled")
            kw["bias"] = True
    shape = MoEConfig(layers, hidden, heads, seq, vocab, batch, experts, top_k, num(width), **kw,
                      tie_embeddings=bool_field(cfg, "tie_word_embeddings", False, where=where), precision=precision,
                      name=name or str(cfg.get("_name_or_path") or family)[:80] or family)
    try:
        g = moe_gpt(shape, source=f"imported from a Hugging Face config ({family}): {source}", notes=found)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if notes is not None:
        notes.extend(found)
    return g
