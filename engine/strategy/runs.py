"""An op's devices written as runs of consecutive ids (``"0-7,64-71"``): the compact form
``soapbox.strategy/1`` reads besides plain lists, and the one the explorer keeps in the page (a
1,024-GPU LLM strategy is 9 MB as lists, ~100-200 KB as runs)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["MAX_DEVICES_PER_OP", "MAX_RUN_DEVICES", "device_runs", "parse_device_runs", "count_device_runs",
           "check_runs", "devices_of_entry", "compact_strategy_dict"]

#: most device ids a run text may stand for (the schema's list limit)
MAX_DEVICES_PER_OP = 16384
#: most device ids the run texts of one strategy may stand for together: about what a 64 MiB
#: file of plain lists can hold (a few characters an id), so runs cannot make a small file stand
#: for more than a large one could (GPT-3 175B on 1,024 GPUs: 2.5 M)
MAX_RUN_DEVICES = 1 << 24


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


def count_device_runs(text: str) -> int:
    """How many device ids a run text stands for, without listing them; ValueError as
    :func:`parse_device_runs` for a run that counts down or a text it cannot read.

    >>> count_device_runs("0-1023,2048")
    1025
    """
    n = 0
    for run in str(text).split(","):
        a, _, b = run.partition("-")
        lo, hi = int(a), int(b or a)
        if hi < lo:
            raise ValueError(f"device run {run!r} counts down")
        n += hi - lo + 1
    return n


def check_runs(ops: Mapping[str, Mapping[str, Any]], limit: int = MAX_RUN_DEVICES,
               per_op: int = MAX_DEVICES_PER_OP) -> list[tuple[str, str]]:
    """(path, message) for each op entry whose run text cannot be read or stands for more than
    ``per_op`` ids, and for the entry at which the run texts together pass ``limit`` device ids
    (the check stops there): counted without listing a single id, so a few bytes cannot make
    the reader build millions."""
    out: list[tuple[str, str]] = []
    total = 0
    for name, entry in ops.items():
        devs = entry.get("devices") if isinstance(entry, Mapping) else None
        if not isinstance(devs, str):
            continue
        try:
            n = count_device_runs(devs)
        except ValueError as e:
            out.append((f"ops.{name}.devices", str(e)))
            continue
        if n > per_op:
            out.append((f"ops.{name}.devices", f"device runs stand for {n:,} devices, more than {per_op:,}"))
            continue
        total += n
        if total > limit:
            out.append((f"ops.{name}.devices", f"the strategy's device runs stand for more than {limit:,} device ids"))
            break
    return out


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
