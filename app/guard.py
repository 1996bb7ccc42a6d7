"""What the server checks of a request before Dash reads it: a callback request's envelope
(``/_dash-update-component``: its outputs, inputs and state slots shaped as Dash sends them).
A crafted envelope is answered 400 with what is wrong and where, instead of failing inside Dash
with a 500; the values in the slots are each callback's own to check."""

from __future__ import annotations

from typing import Any

import orjson
from flask.json.provider import DefaultJSONProvider

__all__ = ["callback_envelope_problem", "not_json", "StrictJSONProvider"]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class StrictJSONProvider(DefaultJSONProvider):
    """Flask's JSON, reading request bodies as JSON defines it, with orjson (RFC 8259; 0.11
    against 0.25 ms for a page's 25 kB state): ``NaN``, ``Infinity``, a number past a double's
    range and a lone surrogate escape (``"\\ud800"``), which Python's parser takes, are refused
    (a browser's ``JSON.stringify`` never writes them); an integer past 64 bits reads as a
    float. A state from a request then holds no value ``json.dumps`` with ``allow_nan=False``
    would refuse, which :func:`app.state.check_state` relies on to check the same content once."""

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        if kwargs:  # (options only Python's parser has)
            kwargs.setdefault("parse_constant", _refuse_constant)
            return super().loads(s, **kwargs)
        return orjson.loads(s)  # (orjson.JSONDecodeError is a ValueError, as Python's)


def _slot_problem(slot: Any, where: str) -> str | None:
    if isinstance(slot, list):  # a pattern-matching (ALL) slot: one entry per component
        for i, x in enumerate(slot[:10_000]):
            p = _slot_problem(x, f"{where}[{i}]")
            if p or isinstance(x, list):
                return p or f"{where}[{i}]: a component, not a list"
        return None if len(slot) <= 10_000 else f"{where}: more than 10,000 components"
    if not isinstance(slot, dict):
        return f"{where}: not a component (an object with 'id' and 'property')"
    if not isinstance(slot.get("id"), (str, dict)) or not isinstance(slot.get("property"), str):
        return f"{where}: a component needs an 'id' (text or object) and a 'property' (text)"
    if isinstance(slot["id"], dict) and not all(isinstance(k, str) and isinstance(v, (str, int, float, bool))
                                                for k, v in slot["id"].items()):
        return f"{where}.id: a pattern id maps names to text or numbers"
    return None


def not_json(raw: bytes) -> str:
    """Why ``raw`` is not a JSON request body, and where (orjson's message: what it met, its
    line and column); called only once a parse failed."""
    try:
        orjson.loads(raw)
    except ValueError as e:
        return f"the request is not JSON ({str(e)[:200]})"
    return "the request is not JSON"


def callback_envelope_problem(body: Any) -> str | None:
    """What is wrong with a ``/_dash-update-component`` body's envelope (None when Dash can
    read it): the JSON, ``output``, ``outputs``, ``inputs``, ``state`` and ``changedPropIds``.
    ``body`` is the body parsed (the request's own cached parse, which Dash then reads: one
    parse a request, not two; :func:`not_json` says why one did not parse)."""
    if not isinstance(body, dict):
        return "the request is not a JSON object"
    if not isinstance(body.get("output"), str):
        return "'output' is not text"
    outs = body.get("outputs")
    for i, o in enumerate(outs if isinstance(outs, list) else [outs]):
        if not isinstance(o, dict) or not isinstance(o.get("id"), (str, dict)) or not isinstance(o.get("property"), str):
            return f"outputs[{i}]: not a component"
    for key in ("inputs", "state"):
        slots = body.get(key, [])
        if not isinstance(slots, list):
            return f"'{key}' is not a list"
        for i, slot in enumerate(slots):
            p = _slot_problem(slot, f"{key}[{i}]")
            if p:
                return p
    changed = body.get("changedPropIds", [])
    if not isinstance(changed, list) or not all(isinstance(c, str) for c in changed):
        return "'changedPropIds' is not a list of text"
    return None
