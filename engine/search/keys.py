"""Canonical keys of strategies, the same in every process: what the searches' caches of priced
strategies (:class:`engine.search.parallel_chains.PricedCache`, :func:`engine.search.api.price`'s memo)
are keyed by."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from ..strategy import Config, Strategy

__all__ = ["strategy_key", "op_key", "KEY_MASK"]

#: keys are 64-bit
KEY_MASK = (1 << 64) - 1


def _h64(text: str) -> int:
    """A 64-bit hash that is the same in every process (Python's ``hash`` of a str is salted
    per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def op_key(op: str, config: Config, _devices_text: str | None = None) -> int:
    """The hash of one op's config (a term of :func:`strategy_key`; ``_devices_text``: the
    config's devices as text, when the caller has it)."""
    devices = f"{config.devices}" if _devices_text is None else _devices_text
    return _h64(f"op|{op}|{sorted(config.degrees.items())}|{devices}")


def _rest_key(strategy: Strategy) -> int:
    """The hash of everything but the ops' configs: the pipeline and the settings that span
    ops, and the stage of each op (labels ``found_by`` and ``cost`` and the names of the model
    and cluster left out)."""
    d = replace(strategy, configs={}, stage_of={}, found_by={}, cost={}, model_name="", model_fingerprint="",
                cluster_name="", cluster_devices=0).to_dict()
    d["stage_of"] = sorted(strategy.stage_of.items())
    return _h64("rest|" + json.dumps(d, sort_keys=True, default=str))


def strategy_key(strategy: Strategy) -> int:
    """A canonical 64-bit key of ``strategy``: the sum (mod 2^64) of :func:`op_key` over its
    ops plus the hash of its other settings (Zobrist-style hashing, Zobrist 1970: changing one
    op's config updates the key in O(1), ``key - op_key(op, old) + op_key(op, new)``). Equal
    strategies have equal keys in every process; two different ones share a key with
    probability about 2^-64 per pair.

    >>> from engine.formats import resolve_model
    >>> from engine.cluster import preset
    >>> from engine.search.baselines import data_parallel
    >>> from engine.strategy import strategy_from_dict
    >>> g, c = resolve_model("alexnet"), preset("p100-4x4")
    >>> s = data_parallel(g, c)
    >>> strategy_key(s) == strategy_key(strategy_from_dict(s.to_dict()))
    True
    """
    total = _rest_key(strategy)
    # ops of repeated layers share device tuples (FSDP on 512 GPUs: one tuple of 512 ids for
    # all 2,410 ops of GPT-3): each tuple written as text once (0.1 s -> 0.01 s a key there)
    texts: dict[int, str] = {}
    for name, config in strategy.configs.items():
        text = texts.get(id(config.devices))
        if text is None:
            text = texts[id(config.devices)] = f"{config.devices}"
        total += op_key(name, config, text)
    return total & KEY_MASK
