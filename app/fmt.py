"""Number formatting shared by every view, so each prints times, sizes and rates the same way."""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["format_seconds", "format_bytes", "format_rate", "format_count", "format_amount", "parse_count"]


def format_seconds(s: float | None) -> str:
    """``0.0123`` -> ``"12.3 ms"``; ns, µs, ms, s, then min from 2 minutes and h from 2 hours
    (three significant digits); ``None``/NaN -> ``"–"``.

    >>> format_seconds(0.0123), format_seconds(2.5e-6), format_seconds(75.0)
    ('12.3 ms', '2.5 µs', '75 s')
    >>> format_seconds(689.0), format_seconds(19_000.0), format_seconds(260_000.0)
    ('11.5 min', '5.28 h', '72.2 h')
    """
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "–"
    if math.isinf(s):
        return "∞"
    a = abs(s)
    if a >= 7200:
        return f"{s / 3600:.3g} h" if a < 360_000 else f"{s / 3600:,.0f} h"
    if a >= 120:
        return f"{s / 60:.3g} min"
    if a >= 1:
        return f"{s:.3g} s" if a < 100 else f"{s:.0f} s"
    if a >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    if a >= 1e-6:
        return f"{s * 1e6:.3g} µs"
    return f"{s * 1e9:.3g} ns" if a > 0 else "0 s"


def format_bytes(b: float | None) -> str:
    """Decimal units (as bandwidths and GPU memories are quoted): ``23.6e9`` -> ``"23.6 GB"``.

    >>> format_bytes(23.6e9), format_bytes(512), format_bytes(1.5e6)
    ('23.6 GB', '512 B', '1.5 MB')
    """
    if b is None:
        return "–"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def format_rate(per_s: float | None, unit: str = "samples") -> str:
    """``1234.5`` -> ``"1.23k samples/s"``."""
    if per_s is None:
        return "–"
    for prefix, scale in (("M", 1e6), ("k", 1e3)):
        if per_s >= scale:
            return f"{per_s / scale:.3g}{prefix} {unit}/s"
    return f"{per_s:.3g} {unit}/s"


def format_count(n: int) -> str:
    """``40701`` -> ``"40,701"``."""
    return f"{n:,}"


def format_amount(n: float) -> str:
    """A large count as it is typed (:func:`parse_count` reads it back).

    >>> format_amount(1e12), format_amount(3e11), format_amount(2.5e10), format_amount(4096)
    ('1T', '300B', '25B', '4,096')
    """
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:,.4g}{unit}"
    return f"{n:,.0f}"


_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}


def parse_count(text: Any) -> float:
    """A count typed as ``1T``, ``300B``, ``2e12`` or ``1,000,000``; ValueError saying how to
    write one (a comma that does not separate groups of three digits, as in ``1,5T``, is
    refused, not read as a separator), or that it is not above 0 and below 1e18.

    >>> parse_count("1T"), parse_count("300b"), parse_count("2e12")
    (1000000000000.0, 300000000000.0, 2000000000000.0)
    """
    full = str(text or "")
    raw = full[:40].strip().lower().replace("_", "")
    # commas only between groups of three digits (1,000,000): a decimal comma ("1,5T") read as a
    # separator was ten times the count meant
    if len(full) > 40:
        raise ValueError(f"'{full[:20]}...': a count is at most 40 characters (1T, 300B, 2e12)")
    if ("," in raw and not re.fullmatch(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?(?:e\d+)?\s*[kmbgtp]?", raw)):
        raise ValueError(f"'{full[:20]}': give a count like 1T, 300B, 2e12 or 1,000,000 (a decimal point, "
                         "not a comma)")
    raw = raw.replace(",", "")
    m = re.fullmatch(r"(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmbgtp]?)", raw)
    if not m:
        raise ValueError(f"'{full[:20]}': give a count like 1T, 300B or 2e12")
    n = float(m.group(1)) * _SUFFIX[m.group(2)]
    if not 0 < n < 1e18:
        raise ValueError("give a count above 0 and below 1e18")
    return n
