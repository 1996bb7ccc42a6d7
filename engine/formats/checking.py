"""Schemas: each format's published JSON Schema, its violations as problems a user can act on
(path, unit, bound), integers written as ``5.0`` read as ints, and :func:`load_checked`, the
schema gate of every loader. See :mod:`engine.formats`."""

from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib import resources
from typing import Any, Callable, Mapping

import jsonschema_rs

from ..errors import Problem, ValidationError, printable
from .jsonio import check_json_data, read_json, render_path, value_at

__all__ = ["FORMATS", "MAX_SCHEMA_PROBLEMS", "schema", "schema_problems", "check_format", "load_checked", "built"]

#: Format id -> schema file. The version after the slash is bumped on incompatible change.
FORMATS = {
    "soapbox.model/1": "model.schema.json",
    "soapbox.cluster/1": "cluster.schema.json",
    "soapbox.strategy/1": "strategy.schema.json",
    "soapbox.profile/1": "profile.schema.json",
}
#: At most this many schema violations are collected from one file.
MAX_SCHEMA_PROBLEMS = 1000
# Integral floats up to this magnitude are exactly representable, so 5.0 -> 5 is exact.
_EXACT_INT = 2**53


@lru_cache(maxsize=None)
def schema(format_id: str) -> dict[str, Any]:
    """The JSON Schema of ``format_id`` (e.g. ``"soapbox.model/1"``)."""
    text = resources.files(__package__).joinpath("schemas", FORMATS[format_id]).read_text("utf-8")
    return json.loads(text)


@lru_cache(maxsize=None)
def _validator(format_id: str):
    # jsonschema-rs (Rust) checks a 1536-GPU strategy (~350k entries) in ~10 ms, where the
    # pure-Python jsonschema takes ~12 s; both implement Draft 2020-12.
    return jsonschema_rs.Draft202012Validator(schema(format_id))


# --------------------------------------------------------------------------- schemas


def check_format(data: Any, want: str | None) -> str:
    if not isinstance(data, dict):
        raise ValidationError([Problem("", f"expected a JSON object at the top level, got {type(data).__name__}")])
    fmt = data.get("format")
    if fmt is None:
        expected = want or " or ".join(FORMATS)
        raise ValidationError([Problem("format", f"missing; expected {expected!r}")])
    if not isinstance(fmt, str):
        example = want or "soapbox.model/1"
        raise ValidationError([Problem("format", f"must be a string such as {example!r}, got {type(fmt).__name__}")])
    if fmt not in FORMATS:
        kind = fmt.split("/")[0]
        known = [f for f in FORMATS if f.split("/")[0] == kind]
        if known:
            msg = f"version {fmt!r} is not supported; this soapbox reads {', '.join(known)}"
        else:
            msg = f"unknown format {fmt!r}; known: {', '.join(FORMATS)}"
        raise ValidationError([Problem("format", msg)])
    if want and fmt != want:
        raise ValidationError([Problem("format", f"this is a {fmt} file; expected {want}")])
    return fmt


#: Unit of a field, from the suffix of its name (units live in names).
_UNITS = (("_bytes_per_s", "bytes/s"), ("_flops_per_s", "FLOP/s"), ("_bytes", "bytes"), ("_s", "s"))


def _unit_hint(path: list[Any]) -> str:
    """`` (bytes/s)`` for a field named ``..._bytes_per_s`` (or a field inside one, as
    ``peak_flops_per_s.fp16``), and so on."""
    for key in reversed(path):
        if isinstance(key, str):
            for suffix, unit in _UNITS:
                if key.endswith(suffix):
                    return f" ({unit})"
    return ""


def _number(x: Any) -> str:
    """A limit as a reader takes it in: ``1,048,576``, ``1e+15``, ``0.5``."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        x = int(x)
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


_BOUND_WORDS = {"minimum": "at least", "exclusiveMinimum": "greater than", "maximum": "at most",
                "exclusiveMaximum": "less than"}


def _schema_message(e: Any, root: Mapping[str, Any]) -> str:
    spath = list(e.schema_path)
    keyword = spath[-1] if spath else ""
    limit = value_at(root, spath)
    if keyword in _BOUND_WORDS:
        return f"must be {_BOUND_WORDS[keyword]} {_number(limit)}{_unit_hint(list(e.instance_path))}, got {e.instance!r}"
    if keyword == "maxItems":
        return f"has {len(e.instance):,} items; at most {limit:,} are allowed"
    if keyword == "maxProperties":
        return f"has {len(e.instance):,} entries; at most {limit:,} are allowed"
    if keyword == "maxLength":
        return f"is {len(e.instance):,} characters long; at most {limit:,} are allowed"
    if keyword == "enum" and isinstance(limit, list) and len(limit) <= 20:
        # (jsonschema shortens a long list to "or N other candidates": name them all)
        shown = printable(json.dumps(e.instance, default=str), 60)
        names = [json.dumps(v) for v in limit]
        return f"{shown} is not one of {', '.join(names[:-1]) + ' or ' + names[-1] if len(names) > 1 else names[0]}"
    msg = e.message
    if keyword == "additionalProperties":
        allowed = sorted((value_at(root, spath[:-1]) or {}).get("properties", {}))
        msg += f"; allowed: {', '.join(allowed)}" if allowed else ""
    return msg


def _schema_problems(data: Any, format_id: str) -> list[Problem]:
    validator = _validator(format_id)
    if validator.is_valid(data):
        return []
    root = schema(format_id)
    found = []
    for k, e in enumerate(validator.iter_errors(data)):
        if k == MAX_SCHEMA_PROBLEMS:
            found.append(([], Problem("(top level)", f"more than {MAX_SCHEMA_PROBLEMS:,} problems; "
                                                      "the first ones are listed")))
            break
        where = render_path(data, list(e.instance_path)) or "(top level)"
        found.append((list(e.instance_path), Problem(where, _schema_message(e, root))))
    found.sort(key=lambda pp: [str(k).zfill(12) if isinstance(k, int) else str(k) for k in pp[0]])
    return [p for _, p in found]


def schema_problems(data: Any, format_id: str) -> list[Problem]:
    """Every JSON Schema violation of ``data`` against ``format_id``, in file order (the
    first :data:`MAX_SCHEMA_PROBLEMS`); data that is not JSON (too deep, NaN, a lone
    surrogate) is one problem."""
    try:
        data = check_json_data(data)
    except ValidationError as exc:
        return exc.problems
    return _schema_problems(data, format_id)


def _wants_int(node: Mapping[str, Any]) -> bool:
    t = node.get("type")
    if t == "integer" or (isinstance(t, list) and "integer" in t):
        return True
    enum = node.get("enum")
    return bool(enum) and all(type(v) is int for v in enum)


def _deref(node: Any, root: Mapping[str, Any]) -> Any:
    while isinstance(node, Mapping) and "$ref" in node:
        node = value_at(root, node["$ref"].removeprefix("#/").split("/"))
    return node


def _holds_int(node: Any, root: Mapping[str, Any], memo: dict[int, bool]) -> bool:
    """Whether the schema ``node`` or anything below it is an integer."""
    node = _deref(node, root)
    if not isinstance(node, Mapping):
        return False
    key = id(node)
    if key not in memo:
        memo[key] = False  # (a recursive schema)
        subs = list(node.get("properties", {}).values())
        for k in ("items", "additionalProperties"):
            if isinstance(node.get(k), Mapping):
                subs.append(node[k])
        memo[key] = _wants_int(node) or any(_holds_int(s, root, memo) for s in subs)
    return memo[key]


def _as_int(v: Any) -> Any:
    return int(v) if type(v) is float and v.is_integer() and abs(v) <= _EXACT_INT else v


def _normalise(value: Any, node: Any, root: Mapping[str, Any], memo: dict[int, bool]) -> Any:
    """``value`` with every integral float where ``node`` wants an integer made an int;
    containers are copied only where something changed."""
    node = _deref(node, root)
    if not isinstance(node, Mapping) or not _holds_int(node, root, memo):
        return value
    if type(value) is float:
        return _as_int(value) if _wants_int(node) else value
    if isinstance(value, dict):
        props = node.get("properties", {})
        extra = node.get("additionalProperties")
        out = None
        for k, v in value.items():
            sub = props.get(k, extra if isinstance(extra, Mapping) else None)
            if sub is None:
                continue
            new = _normalise(v, sub, root, memo)
            if new is not v:
                out = dict(value) if out is None else out
                out[k] = new
        return value if out is None else out
    if isinstance(value, list) and isinstance(node.get("items"), Mapping):
        items = _deref(node["items"], root)
        if _wants_int(items):  # a list of integers (devices): one quick pass
            return [_as_int(v) for v in value] if any(type(v) is float for v in value) else value
        new = [_normalise(v, items, root, memo) for v in value]
        return value if all(a is b for a, b in zip(new, value)) else new
    return value


_INT_MEMO: dict[str, dict[int, bool]] = {}


def _normalise_integers(data: Any, format_id: str) -> Any:
    return _normalise(data, schema(format_id), schema(format_id), _INT_MEMO.setdefault(format_id, {}))


def load_checked(data_or_path: Any, format_id: str, source: str | None = None) -> tuple[dict[str, Any], str]:
    """The schema-valid mapping of a ``format_id`` file (a path) or mapping, and where it
    came from; integers written as ``5.0`` are ints. Raises :class:`ValidationError` with
    every schema violation."""
    if isinstance(data_or_path, (str, os.PathLike)):
        source = source or str(data_or_path)
        data = read_json(data_or_path)
    else:
        source = source or "<data>"
        data = check_json_data(data_or_path, source)
    try:
        check_format(data, format_id)
        problems = _schema_problems(data, format_id)
        if problems:
            raise ValidationError(problems)
    except ValidationError as exc:
        raise exc.with_source(source) from None
    return _normalise_integers(data, format_id), source


def built(make: Callable[[dict[str, Any]], Any], data: dict[str, Any], source: str) -> Any:
    try:
        return make(data)
    except ValidationError as exc:
        raise exc.with_source(source) from None


