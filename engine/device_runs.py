"""An op's devices written as runs of consecutive ids (``"0-7,64-71"``): the compact form
``soapbox.strategy/1`` reads besides plain lists, and the one the explorer keeps in the page (a
1,024-GPU LLM strategy is 9 MB as lists, ~100-200 KB as runs)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["MAX_DEVICES_PER_OP", "device_runs", "parse_device_runs", "devices_of_entry", "compact_strategy_dict"]

#: most device ids a run text may stand for (the schema's list limit)
MAX_DEVICES_PER_OP = 16384


def device_runs(devices: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 8, 9]`` -> ``"0-3,8-9"``: a config's devices as runs of consecutive ids,
    the compact form ``soapbox.strategy/1`` also reads (a 1,024-GPU LLM strategy: 9 MB as
    lists, ~100 KB as runs).

    >>> device_runs([0, 1, 2, 3, 8, 9, 5])
    '0-3,8-9,5'
    """
    d = np.asarray(devices, dtype=np.int64).ravel()  # [device]
    if d.size == 0:
        return ""
    cut = np.flatnonzero(np.diff(d) != 1) + 1
    lo = d[np.concatenate(([0], cut))]
    hi = d[np.concatenate((cut, [d.size])) - 1]
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in zip(lo.tolist(), hi.tolist()))


def parse_device_runs(text: str) -> tuple[int, ...]:
    """The device ids a run text (:func:`device_runs`) stands for; ValueError naming the run
    that counts down or the text that stands for more than :data:`MAX_DEVICES_PER_OP` ids."""
    out: list[int] = []
    for run in str(text).split(","):
        a, _, b = run.partition("-")
        lo, hi = int(a), int(b or a)
        if hi < lo:
            raise ValueError(f"device run {run!r} counts down")
        if len(out) + hi - lo + 1 > MAX_DEVICES_PER_OP:
            raise ValueError(f"device runs stand for more than {MAX_DEVICES_PER_OP} devices")
        out.extend(range(lo, hi + 1))
    return tuple(out)


def devices_of_entry(entry: Mapping[str, Any]) -> tuple[int, ...]:
    """An op entry's devices, written as a list or as runs."""
    devs = entry["devices"]
    return parse_device_runs(devs) if isinstance(devs, str) else tuple(devs)


def compact_strategy_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` (a ``soapbox.strategy/1`` mapping) with every op's devices written as runs
    (ops sharing one devices object, as a layout's blocks do, are written once)."""
    seen: dict[int, tuple[Any, str]] = {}  # id(devices) -> (devices, runs): kept alive, so ids stay unique
    ops = {}
    for name, entry in data["ops"].items():
        devs = entry["devices"]
        hit = seen.get(id(devs))
        if hit is None:
            hit = seen[id(devs)] = (devs, devs if isinstance(devs, str) else device_runs(devs))
        ops[name] = {**entry, "devices": hit[1]}
    return {**data, "ops": ops}
