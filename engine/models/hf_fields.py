"""What :mod:`engine.models.hf`'s importers share: the bounds on a config's sizes and the
readers of its fields, each refusing a value it cannot take with the field named."""

from __future__ import annotations

import json
from typing import Any, Mapping

from ..moe import MAX_HISTOGRAM_EXPERTS

__all__ = ["MAX_LAYERS", "MAX_SIZE", "MAX_EXPERTS", "MAX_CONTEXT", "DTYPES", "DEFAULT_MAX_SEQ", "int_field", "shown",
           "bool_field", "rate_field", "layer_types"]

#: the most decoder layers an import builds (published decoders have up to ~128; the bound
#: keeps a malformed config from building for ever)
MAX_LAYERS = 1024
#: the largest width, head count or vocabulary an import takes (2^24)
MAX_SIZE = 1 << 24
#: the most routed experts an import takes (as the routing what-if's histograms)
MAX_EXPERTS = MAX_HISTOGRAM_EXPERTS
#: the largest context (max_position_embeddings, n_positions): only compared, never allocated
MAX_CONTEXT = 1 << 40

#: torch_dtype -> soapbox precision
DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

#: the longest sequence an import defaults to when --seq-len is not given (a config's
#: max_position_embeddings can be 128 K or more; training runs set their own)
DEFAULT_MAX_SEQ = 4096


def int_field(cfg: Mapping[str, Any], key: str, default: int | None = None, *, where: str, hi: int = MAX_SIZE,
         lo: int = 1) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise ValueError(f"{where}: {key!r} is missing" + (" (null)" if key in cfg else ""))
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        kind = "a positive integer" if lo == 1 else f"an integer of at least {lo}"
        raise ValueError(f"{where}: {key!r} must be {kind}, got {str(v)[:40]!r}")
    if v > hi:
        raise ValueError(f"{where}: {key!r} is {v}, above the {hi:,} soapbox imports")
    return v


def shown(v: Any) -> str:
    """A config value as its JSON (true, null, "x"), cut to 40 characters."""
    try:
        return json.dumps(v)[:40]
    except (TypeError, ValueError):
        return repr(v)[:40]


def bool_field(cfg: Mapping[str, Any], key: str, default: bool, *, where: str) -> bool:
    v = cfg.get(key, default)
    if not isinstance(v, bool):
        raise ValueError(f"{where}: {key!r} must be true or false, got {str(v)[:40]!r}")
    return v


def rate_field(cfg: Mapping[str, Any], key: str, default: float, *, where: str) -> float:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
        raise ValueError(f"{where}: {key!r} must be a probability below 1, got {str(v)[:40]!r}")
    return float(v)


def layer_types(types: Any, layers: int, where: str) -> list[str]:
    """A config's ``layer_types``, checked: 'sliding_attention' or 'full_attention' for each layer."""
    if not isinstance(types, list) or len(types) != layers or \
            not set(types) <= {"sliding_attention", "full_attention"}:
        raise ValueError(f"{where}: layer_types must list 'sliding_attention' or 'full_attention' for each "
                         f"of the {layers} layers")
    return types
