"""Pipeline schedules: the order of forward and backward units on each stage."""

from __future__ import annotations

from .tasks import BWD, FWD

__all__ = ["schedule_order"]


def schedule_order(schedule: str, p: int, v: int, m: int, stage: int) -> list[tuple[int, int, int]]:
    """Order of (model chunk on this stage, microbatch, phase) units on pipeline ``stage``.

    GPipe: all forwards, then all backwards (Huang et al. 2019). 1F1B: ``p - stage - 1``
    warm-up forwards, then one forward and one backward alternately, then the remaining
    backwards (PipeDream-Flush; Narayanan et al. SC'21 §2.2.1). Interleaved: Megatron-LM's
    schedule over ``v`` chunks per stage (SC'21 §2.2.2), warm-up of
    ``(p - stage - 1) * 2 + (v - 1) * p`` forward units.

    >>> schedule_order("1f1b", 2, 1, 3, 0)
    [(0, 0, 0), (0, 1, 0), (0, 0, 1), (0, 2, 0), (0, 1, 1), (0, 2, 1)]
    """
    if schedule == "gpipe":
        return [(0, mb, FWD) for mb in range(m)] + [(0, mb, BWD) for mb in range(m)]
    if schedule == "1f1b" or v == 1:
        warm = min(p - stage - 1, m)
        out = [(0, mb, FWD) for mb in range(warm)]
        for i in range(m - warm):
            out += [(0, warm + i, FWD), (0, i, BWD)]
        out += [(0, mb, BWD) for mb in range(m - warm, m)]
        return out
    total = m * v

    def unit(k: int, forward: bool) -> tuple[int, int, int]:
        group = k // (p * v)
        chunk = (k % (p * v)) // p
        if not forward:
            chunk = v - 1 - chunk
        return (chunk, group * p + k % p, FWD if forward else BWD)

    warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
    out = [unit(k, True) for k in range(warm)]
    for i in range(total - warm):
        out += [unit(warm + i, True), unit(i, False)]
    out += [unit(k, False) for k in range(total - warm, total)]
    return out
