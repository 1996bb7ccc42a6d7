"""Versioned JSON formats: loading, validation and saving of models, clusters and strategies.

Every file has a ``format`` field naming its kind and version (``soapbox.model/1``,
``soapbox.cluster/1``, ``soapbox.strategy/1``, ``soapbox.profile/1``) and a published JSON
Schema in ``engine/formats/schemas/``. Loading checks the schema (reporting *every* violation
with its path in the file), then the meaning (shapes, cycles, divisibility, devices), and
raises one :class:`~engine.errors.ValidationError` listing all problems: never a traceback,
never a half-loaded object. Files are parsed with :func:`json.loads` only; nothing is
evaluated or unpickled.

Every input, a file or a mapping already in memory, passes the same gate before its schema
is checked (:func:`check_json_data`):

* a file is opened only when it is a regular file (a FIFO, a device such as ``/dev/zero``,
  a socket or a folder is refused without blocking on it), and read up to
  :data:`MAX_FILE_BYTES` while reading (its size as the file system reports it is not
  trusted);
* arrays and objects nest at most :data:`MAX_JSON_DEPTH` deep (checked on the bytes, before
  parsing, so deep nesting never reaches a recursive parser);
* numbers are finite (``NaN``, ``Infinity`` and ``1e999`` are refused) and strings are
  encodable (a lone surrogate such as ``"\\ud800"`` is refused with its path);
* a number written ``5.0`` where the schema says integer is read as ``5`` (JSON Schema's
  ``integer`` accepts it); ``5.5`` is refused by the schema.

Names resolve to files only when asked: :func:`resolve_model` and :func:`resolve_cluster`
open a path only with ``allow_path=True``, which the CLI passes for what a user typed on its
command line; a name found inside a file or sent by a browser resolves only to the sample
library and the presets.

Saving writes a temporary file beside the target (its name holds the writer's process id)
and renames it, so a failed or interrupted save never truncates the file a user already had
and leaves no temporary file behind.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import tempfile
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, TextIO

import jsonschema_rs
import numpy as np

from ..cluster import Cluster, cluster_from_dict, preset
from ..costs import ProfileTable
from ..errors import OutputError, Problem, ValidationError, printable
from ..graph import OpGraph, graph_from_dict
from ..strategy import Strategy, strategy_from_dict, validate_strategy

__all__ = [
    "FORMATS",
    "MAX_FILE_BYTES",
    "MAX_JSON_DEPTH",
    "too_deep_at",
    "MAX_NAME_CHARS",
    "read_json",
    "parse_json_text",
    "check_json_data",
    "schema",
    "schema_problems",
    "load_model",
    "load_cluster",
    "load_strategy",
    "load_profile",
    "load_checked",
    "resolve_model",
    "resolve_cluster",
    "dumps",
    "save_json",
    "atomic_writer",
    "validate_file",
]

#: Format id -> schema file. The version after the slash is bumped on incompatible change.
FORMATS = {
    "soapbox.model/1": "model.schema.json",
    "soapbox.cluster/1": "cluster.schema.json",
    "soapbox.strategy/1": "strategy.schema.json",
    "soapbox.profile/1": "profile.schema.json",
}
#: Files larger than this are refused while reading (a 1536-GPU GPT-3 strategy is ~1.9 MB;
#: a strategy for every op of GPT-3 split over 16,384 GPUs would be ~20 MB).
MAX_FILE_BYTES = 64 * 2**20
#: Arrays and objects nest at most this deep (soapbox's own files need 6 levels).
MAX_JSON_DEPTH = 64
#: Longest name (of a model, an op, a node, a device type) the schemas accept: names are
#: repeated per device and per task in reports and traces.
MAX_NAME_CHARS = 256
#: At most this many schema violations are collected from one file.
MAX_SCHEMA_PROBLEMS = 1000
# Integral floats up to this magnitude are exactly representable, so 5.0 -> 5 is exact.
_EXACT_INT = 2**53
_SCAN_CHUNK = 1 << 22  # bytes scanned at a time by the depth check (bounds its memory)
_HUGE_INT = 10**4300
_TOO_DEEP = f"arrays and objects are nested more than {MAX_JSON_DEPTH} deep (soapbox files need a few levels)"


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


# --------------------------------------------------------------------------- reading


def _file_kind(mode: int) -> str:
    for test, what in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def _read_capped(path: str | os.PathLike, source: str) -> bytes:
    """The bytes of the regular file ``path``, at most :data:`MAX_FILE_BYTES`.

    The file's type is checked before it is opened (opening a FIFO for reading blocks until
    a writer comes) and again on the open descriptor (the path may have been replaced in
    between); it is opened non-blocking, and read in pieces up to one byte past the limit,
    so a file whose size the file system misreports (``/dev/zero``, ``/proc``) cannot make
    it read without end.
    """
    def fail(message: str) -> ValidationError:
        return ValidationError([Problem("", message)], source)

    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise fail("file not found") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise fail(f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise fail("is a folder, not a JSON file")
    if not stat.S_ISREG(st.st_mode):
        raise fail(f"is {_file_kind(st.st_mode)}, not a JSON file; give the path of a regular file")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise fail(f"cannot read: {exc.strerror or exc}") from None
    chunks: list[bytes] = []
    size = 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise fail(f"is {_file_kind(st.st_mode)}, not a JSON file; give the path of a regular file")
        while size <= MAX_FILE_BYTES:
            piece = os.read(fd, min(1 << 20, MAX_FILE_BYTES + 1 - size))
            if not piece:
                break
            chunks.append(piece)
            size += len(piece)
    except OSError as exc:
        raise fail(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > MAX_FILE_BYTES:
        raise fail(f"the file is larger than the limit of {MAX_FILE_BYTES // 2**20} MiB")
    return b"".join(chunks)


def read_json(path: str | os.PathLike) -> Any:
    """Parse a JSON file; raise :class:`ValidationError` naming the file and what is wrong:
    not a regular file, too large, not UTF-8, too deeply nested, or the place (line and
    column) of the first syntax error (a truncated file reports its last line)."""
    src = str(path)
    raw = _read_capped(path, src)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError([Problem("", f"not UTF-8 text (byte {exc.start})")], src) from None
    return _loads(raw, text, src, surrogates="\\u" in text)


def parse_json_text(text: str | bytes, source: str = "<input>") -> Any:
    """Parse JSON text (an upload's content) with the checks :func:`read_json` makes:
    errors say where (line and column) and what."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_FILE_BYTES:
            raise ValidationError([Problem("", f"larger than the limit of {MAX_FILE_BYTES // 2**20} MiB")], source)
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValidationError([Problem("", f"not UTF-8 text (byte {exc.start})")], source) from None
    if not isinstance(text, str):
        raise ValidationError([Problem("", f"expected JSON text, got {type(text).__name__}")], source)
    if len(text) > MAX_FILE_BYTES:
        raise ValidationError([Problem("", f"larger than the limit of {MAX_FILE_BYTES // 2**20} MiB")], source)
    try:
        raw = text.encode("utf-8")
        surrogates = "\\u" in text
    except UnicodeEncodeError:  # a lone surrogate in the text itself
        raw = text.encode("utf-8", "surrogatepass")
        surrogates = True
    if len(raw) > MAX_FILE_BYTES:
        raise ValidationError([Problem("", f"larger than the limit of {MAX_FILE_BYTES // 2**20} MiB")], source)
    return _loads(raw, text, source, surrogates)


class _BadNumber(ValueError):
    def __init__(self, token: str) -> None:
        super().__init__(token)
        self.token = token


def _refuse_constant(token: str) -> Any:
    raise _BadNumber(token)  # NaN, Infinity, -Infinity: not JSON


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):  # 1e999
        raise _BadNumber(token)
    return value


def _line_col(raw: bytes, pos: int) -> str:
    line = raw.count(b"\n", 0, pos) + 1
    column = pos - raw.rfind(b"\n", 0, pos)  # 1-based: rfind gives -1 on the first line
    return f"line {line} column {column}"


_ESCAPE = re.compile(rb"\\.", re.DOTALL)


def too_deep_at(raw: bytes, limit: int = MAX_JSON_DEPTH) -> int | None:
    """Offset of the first ``[`` or ``{`` nested deeper than ``limit`` in JSON text, or None.

    Runs at array speed (~1 ms per MB): escapes are blanked (``\\"`` no longer counts as a
    quote), a bracket is outside every string when an even number of quotes precede it, and
    the depth is the running sum of +1 per opening and -1 per closing bracket. Text that is
    not valid JSON gets some answer; the parser reports its syntax.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return None
    if b"\\" in raw:
        raw = _ESCAPE.sub(b"__", raw)
    a = np.frombuffer(raw, np.uint8)
    quotes = 0  # quotes before the chunk
    depth = 0  # depth at the start of the chunk
    for lo in range(0, a.size, _SCAN_CHUNK):
        c = a[lo:lo + _SCAN_CHUNK]
        q = np.flatnonzero(c == 0x22)  # "
        folded = c | 0x20  # [ -> {, ] -> }
        opens = folded == 0x7B
        br = np.flatnonzero(opens | (folded == 0x7D))
        outside = ((np.searchsorted(q, br) + quotes) & 1) == 0
        br = br[outside]
        if br.size:
            d = depth + np.cumsum(np.where(opens[br], 1, -1))
            over = np.flatnonzero(d > limit)
            if over.size:
                return lo + int(br[over[0]])
            depth = int(d[-1])
        quotes += q.size
    return None


def _loads(raw: bytes, text: str, source: str, surrogates: bool) -> Any:
    def fail(where: str, message: str) -> ValidationError:
        return ValidationError([Problem(where, message)], source)

    if not text.strip():
        raise fail("", "empty file: expected a JSON object")
    at = too_deep_at(raw)
    if at is not None:
        raise fail(_line_col(raw, at), _TOO_DEEP)
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        hint = " (the file looks truncated)" if exc.pos >= len(text.rstrip()) else ""
        raise fail(f"line {exc.lineno} column {exc.colno}", f"invalid JSON: {exc.msg}{hint}") from None
    except _BadNumber as exc:
        pos = raw.find(exc.token.encode("ascii"))
        raise fail(_line_col(raw, pos) if pos >= 0 else "",
                   f"{exc.token} is not a finite number; write a number within +-1.8e308") from None
    except RecursionError:  # (the depth check above should have caught it)
        raise fail("", _TOO_DEEP) from None
    except ValueError:  # an integer of more than 4,300 digits (Python's limit)
        m = re.search(rb"[0-9]{4301}", raw)
        raise fail(_line_col(raw, m.start()) if m else "",
                   "invalid JSON: a number of more than 4,300 digits") from None
    if surrogates:
        _check_strings(data, source)
    return data


# --------------------------------------------------------------------------- data in memory


def _find(data: Any, bad: Callable[[Any], bool] | None = None,
          bad_key: Callable[[Any], bool] | None = None) -> list[Any] | None:
    """Path to the first value for which ``bad`` is true or key for which ``bad_key`` is,
    or to the first container nested deeper than :data:`MAX_JSON_DEPTH` (a cycle
    included); None when there is none. Iterative, so any depth is safe."""
    stack: list[tuple[Any, list[Any]]] = [(data, [])]
    while stack:
        node, path = stack.pop()
        if bad is not None and bad(node):
            return path
        if isinstance(node, Mapping):
            if len(path) >= MAX_JSON_DEPTH:
                return path
            items = list(node.items())
            for k, _ in items:
                if bad_key is not None and bad_key(k):
                    return path + [k]
            stack.extend((v, path + [k]) for k, v in reversed(items))
        elif isinstance(node, (list, tuple)):
            if len(path) >= MAX_JSON_DEPTH:
                return path
            stack.extend((node[i], path + [i]) for i in reversed(range(len(node))))
    return None


def _has_surrogate(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _check_strings(data: Any, source: str) -> None:
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        path = _find(data, _has_surrogate, _has_surrogate) or []
        raise ValidationError([Problem(_render_path(data, path) or "(top level)",
                                       "text with a lone surrogate (such as \\ud800), which is not a character; "
                                       "write text as valid UTF-8")], source) from None


def _not_json(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) >= _HUGE_INT  # Python writes integers of at most 4,300 digits
    return not isinstance(value, (str, bool, type(None), Mapping, list, tuple))


def check_json_data(data: Any, source: str = "<data>") -> Any:
    """``data`` as a file holding it would read: a fresh copy made only of dicts, lists,
    strings, finite numbers, booleans and None, after the checks :func:`read_json` makes
    (nesting depth, finite numbers, encodable strings); raises :class:`ValidationError`
    with the path of the first offending value."""
    def fail(path: list[Any] | None, message: str) -> ValidationError:
        where = _render_path(data, path) if path else ""
        return ValidationError([Problem(where or "(top level)", message)], source)

    try:
        text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    except RecursionError:
        raise fail(_find(data), _TOO_DEEP) from None
    except (ValueError, TypeError):  # NaN/inf, a cycle, a set or another non-JSON value or key
        path = _find(data, _not_json)
        if path is None:
            path = _find(data, bad_key=lambda k: not isinstance(k, (str, int, float, bool, type(None))))
            if path is not None:
                raise fail(path, f"a key must be a string, got a {type(path[-1]).__name__}") from None
        value = _at(data, path) if path is not None else None
        if isinstance(value, float):
            raise fail(path, f"{value!r} is not a finite number") from None
        if isinstance(value, int) and not isinstance(value, bool):
            raise fail(path, "an integer of more than 4,300 digits") from None
        if path is not None and value is not None and not isinstance(value, (Mapping, list, tuple)):
            raise fail(path, f"a {type(value).__name__} is not JSON data (objects, arrays, strings, numbers, "
                             "true, false and null are)") from None
        raise fail(path, f"arrays and objects are nested more than {MAX_JSON_DEPTH} deep, or a value contains "
                         "itself") from None
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        _check_strings(data, source)
        raise  # (not reached: _check_strings raises)
    if len(raw) > MAX_FILE_BYTES:
        raise fail(None, f"larger than the limit of {MAX_FILE_BYTES // 2**20} MiB as JSON")
    at = too_deep_at(raw)
    if at is not None:
        raise fail(_find(data), _TOO_DEEP)
    return json.loads(text)


def _at(data: Any, path: list[Any]) -> Any:
    """The node at ``path`` in ``data`` (a file or a schema), or None where there is none."""
    node = data
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _render_path(data: Any, path: list[Any]) -> str:
    """``["ops", 3, "attrs", "kernel"]`` -> ``ops[3] (conv1).attrs.kernel``."""
    out = ""
    node = data
    for key in path:
        if isinstance(key, int) and not isinstance(key, bool):
            out += f"[{key}]"
            try:
                node = node[key]
            except (IndexError, KeyError, TypeError):
                node = None
            if isinstance(node, Mapping) and isinstance(node.get("name"), str):
                out += f" ({node['name']})"
        else:
            out += f".{key}" if out else str(key)
            node = node.get(key) if isinstance(node, Mapping) else None
    return out


# --------------------------------------------------------------------------- schemas


def _check_format(data: Any, want: str | None) -> str:
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
    limit = _at(root, spath)
    if keyword in _BOUND_WORDS:
        return f"must be {_BOUND_WORDS[keyword]} {_number(limit)}{_unit_hint(list(e.instance_path))}, got {e.instance!r}"
    if keyword == "maxItems":
        return f"has {len(e.instance):,} items; at most {limit:,} are allowed"
    if keyword == "maxProperties":
        return f"has {len(e.instance):,} entries; at most {limit:,} are allowed"
    if keyword == "maxLength":
        return f"is {len(e.instance):,} characters long; at most {limit:,} are allowed"
    msg = e.message
    if keyword == "additionalProperties":
        allowed = sorted((_at(root, spath[:-1]) or {}).get("properties", {}))
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
        where = _render_path(data, list(e.instance_path)) or "(top level)"
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
        node = _at(root, node["$ref"].removeprefix("#/").split("/"))
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
        _check_format(data, format_id)
        problems = _schema_problems(data, format_id)
        if problems:
            raise ValidationError(problems)
    except ValidationError as exc:
        raise exc.with_source(source) from None
    return _normalise_integers(data, format_id), source


def _built(make: Callable[[dict[str, Any]], Any], data: dict[str, Any], source: str) -> Any:
    try:
        return make(data)
    except ValidationError as exc:
        raise exc.with_source(source) from None


def load_model(data_or_path: Any) -> OpGraph:
    """Load a ``soapbox.model/1`` file (path) or mapping into a validated :class:`OpGraph`."""
    data, source = load_checked(data_or_path, "soapbox.model/1")
    return _built(graph_from_dict, data, source)


def load_cluster(data_or_path: Any) -> Cluster:
    """Load a ``soapbox.cluster/1`` file (path) or mapping into a :class:`Cluster`."""
    data, source = load_checked(data_or_path, "soapbox.cluster/1")
    return _built(cluster_from_dict, data, source)


def load_strategy(data_or_path: Any, graph: OpGraph | None = None, cluster: Cluster | None = None) -> Strategy:
    """Load a ``soapbox.strategy/1`` file; with ``graph`` and ``cluster``, also check that
    it is a valid strategy for them (every problem listed)."""
    data, source = load_checked(data_or_path, "soapbox.strategy/1")
    strategy = _built(strategy_from_dict, data, source)
    if graph is not None and cluster is not None:
        problems = validate_strategy(strategy, graph, cluster)
        if problems:
            raise ValidationError(problems, source)
    return strategy


def load_profile(data_or_path: Any, source: str | None = None) -> ProfileTable:
    """Load a ``soapbox.profile/1`` file (path) or mapping into a :class:`ProfileTable`; every
    bad entry is reported with its path (``entries[3].inputs: ...``)."""
    data, source = load_checked(data_or_path, "soapbox.profile/1", source)
    return _built(ProfileTable.from_checked, data, source)


def resolve_model(spec: str, *, allow_path: bool = False) -> OpGraph:
    """A sample model by name (``alexnet``); with ``allow_path``, also a model file's path.

    Without ``allow_path`` the file system is never touched beyond the sample library: a
    name that came from a file or a request cannot make soapbox open a path (pass
    ``allow_path=True`` only for what a user typed on a command line).
    """
    from ..models import SAMPLE_MODELS, build_sample, sample_dir

    if not isinstance(spec, str):
        raise ValueError(f"a model name must be a string, got {type(spec).__name__}")
    if spec in SAMPLE_MODELS:
        path = sample_dir() / f"{spec}.json"
        return load_model(path) if path.exists() else build_sample(spec)
    samples = ", ".join(SAMPLE_MODELS)
    if allow_path:
        if os.path.exists(spec) or spec.endswith(".json"):
            return load_model(spec)
        raise ValueError(f"unknown model {printable(spec)!r}: not a sample ({samples}) nor a file")
    raise ValueError(f"unknown model {printable(spec)!r}: not a sample model ({samples})")


def resolve_cluster(spec: str, *, allow_path: bool = False) -> Cluster:
    """A preset by name (``p100-4x4``, ``dgx-a100-80gb:16``); with ``allow_path``, also a
    cluster file's path (see :func:`resolve_model` for when to allow paths)."""
    if not isinstance(spec, str):
        raise ValueError(f"a cluster name must be a string, got {type(spec).__name__}")
    if allow_path:
        if os.path.exists(spec) or spec.endswith(".json"):
            return load_cluster(spec)
        try:
            return preset(spec)
        except ValidationError:
            raise
        except ValueError as exc:
            if str(exc).startswith("unknown cluster"):
                raise ValueError(f"{exc} (or a cluster file)") from None
            raise
    return preset(spec)


# --------------------------------------------------------------------------- writing


def dumps(data: Mapping[str, Any]) -> str:
    """JSON text with one line per top-level field and per entry of ``ops`` (readable,
    diff-friendly, and compact for graphs of thousands of ops). Non-finite numbers are
    refused (``ValueError``): they are not JSON."""
    def enc(v: Any, **kw: Any) -> str:
        return json.dumps(v, allow_nan=False, **kw)

    lines = []
    items = list(data.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key == "ops" and isinstance(value, list) and value:
            body = ",\n".join("  " + enc(v, separators=(", ", ": ")) for v in value)
            lines.append(f' "ops": [\n{body}\n ]{comma}')
        elif key == "ops" and isinstance(value, dict) and value:
            body = ",\n".join(f"  {enc(k)}: " + enc(v, separators=(", ", ": ")) for k, v in value.items())
            lines.append(f' "ops": {{\n{body}\n }}{comma}')
        else:
            lines.append(f" {enc(key)}: {enc(value)}{comma}")
    return "{\n" + "\n".join(lines) + "\n}\n"


_TMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return True  # someone else's process, or unknowable: keep its file
    return True


def _sweep_stale(folder: Path, name: str) -> None:
    """Remove temporary files of ``name`` left by writers that died (``kill -9``) on this
    machine; a live writer's file is kept. (Not on Windows, where ``os.kill(pid, 0)``
    would end the process instead of asking whether it runs.)"""
    if os.name == "nt":
        return
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for entry in entries:
        m = _TMP_RE.match(entry)
        if m and m.group("name") == name and int(m.group("pid")) != os.getpid() \
                and not _pid_alive(int(m.group("pid"))):
            with contextlib.suppress(OSError):
                os.unlink(folder / entry)


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, make_parents: bool = False) -> Iterator[TextIO]:
    """A text file to write ``path`` through: a temporary file beside it, named
    ``.NAME.PID.RANDOM.tmp`` (unique, never an existing file), renamed over ``path`` once the
    block ends without an exception, removed on any exception (``KeyboardInterrupt``
    included). Temporary files of ``path`` left by dead processes are removed first.

    Raises
    ------
    OutputError
        ``cannot write PATH: reason`` when the folder is missing (and not ``make_parents``),
        not writable, ``path`` is a folder, or the disk is full.
    """
    p = Path(path)
    src = str(path)
    if p.is_dir():
        raise OutputError(src, "is a folder; give a file name")
    folder = p.parent
    try:
        if make_parents:
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                blocker = next((a for a in [folder, *folder.parents] if a.exists() and not a.is_dir()), folder)
                raise OutputError(src, f"{str(blocker)!r} is a file, not a folder") from None
        elif not folder.is_dir():
            raise OutputError(src, f"no such folder {str(folder)!r}")
        _sweep_stale(folder, p.name)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.{os.getpid()}.", suffix=".tmp", dir=folder)
    except OutputError:
        raise
    except OSError as exc:
        raise OutputError(src, _reason(exc)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, p)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OutputError):
            raise
        raise OutputError(src, _reason(exc)) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def save_json(data: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write ``data`` as JSON (see :func:`dumps`) atomically (see :func:`atomic_writer`),
    creating missing folders. Raises :class:`~engine.errors.OutputError` when ``path``
    cannot be written."""
    text = dumps(data)  # before touching the disk: unserialisable data leaves nothing behind
    with atomic_writer(path, make_parents=True) as f:
        f.write(text)


def validate_file(path: str | os.PathLike, model: str | None = None, cluster: str | None = None) -> str:
    """Validate any soapbox file; return a one-line summary or raise :class:`ValidationError`.

    A strategy file is checked against the model and cluster it names, which resolve only
    to sample models and presets (a name inside a file never opens a path), unless
    ``model``/``cluster`` say otherwise: those may be paths (a user typed them). When they
    cannot be found, only its structure is checked and the summary says so.
    """
    source = str(path)
    data = read_json(path)
    try:
        fmt = _check_format(data, None)
    except ValidationError as exc:
        raise exc.with_source(source) from None
    if fmt == "soapbox.profile/1":
        table = load_profile(data, source)
        return f"{source}: valid {fmt}: {len(table)} entries"
    data, _ = load_checked(data, fmt, source)
    if fmt == "soapbox.model/1":
        g = _built(graph_from_dict, data, source)
        return f"{source}: valid {fmt}: {printable(g.name)}, {len(g)} ops, {g.param_count:,} parameters"
    if fmt == "soapbox.cluster/1":
        c = _built(cluster_from_dict, data, source)
        return f"{source}: valid {fmt}: {printable(c.name)}, {c.summary()}"
    s = _built(strategy_from_dict, data, source)
    try:
        g = resolve_model(model, allow_path=True) if model else \
            resolve_model(s.model_name) if s.model_name else None
        c = resolve_cluster(cluster, allow_path=True) if cluster else \
            resolve_cluster(s.cluster_name) if s.cluster_name else None
    except (ValueError, ValidationError) as exc:
        return (f"{source}: valid {fmt} structure ({len(s.configs)} ops); not checked against a model and "
                f"cluster: {str(exc).splitlines()[0]}")
    if g is None or c is None:
        return f"{source}: valid {fmt} structure ({len(s.configs)} ops); no model/cluster named to check against"
    problems = validate_strategy(s, g, c)
    if problems:
        raise ValidationError(problems, source)
    return f"{source}: valid {fmt} for {printable(g.name)} on {printable(c.name)} ({len(s.configs)} ops)"
