"""JSON in: reading files with limits (regular files only, a size cap while reading, a depth
check before parsing), and the one gate every input passes, a file or data already in memory
(finite numbers, encodable strings, bounded depth). See :mod:`engine.formats`."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from itertools import accumulate
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import Problem, ValidationError

__all__ = ["MAX_FILE_BYTES", "MAX_JSON_DEPTH", "read_json", "read_bytes", "parse_json_text", "too_deep_at", "check_json_data",
           "value_at", "render_path"]

#: Files larger than this are refused while reading (a 1536-GPU GPT-3 strategy is ~1.9 MB;
#: a strategy for every op of GPT-3 split over 16,384 GPUs would be ~20 MB).
MAX_FILE_BYTES = 64 * 2**20
#: Arrays and objects nest at most this deep (soapbox's own files need 6 levels).
MAX_JSON_DEPTH = 64
_SCAN_CHUNK = 1 << 22  # bytes scanned at a time by the depth check (bounds its memory)
_HUGE_INT = 10**4300
_TOO_DEEP = f"arrays and objects are nested more than {MAX_JSON_DEPTH} deep (soapbox files need a few levels)"


# --------------------------------------------------------------------------- reading


def _file_kind(mode: int) -> str:
    for test, what in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def _read_capped(path: str | os.PathLike, source: str, limit: int | None = None, what: str = "a JSON file") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` (:data:`MAX_FILE_BYTES`).

    The file's type is checked before it is opened (opening a FIFO for reading blocks until
    a writer comes) and again on the open descriptor (the path may have been replaced in
    between); it is opened non-blocking, and read in pieces up to one byte past the limit,
    so a file whose size the file system misreports (``/dev/zero``, ``/proc``) cannot make
    it read without end.
    """
    def fail(message: str) -> ValidationError:
        return ValidationError([Problem("", message)], source)

    cap = MAX_FILE_BYTES if limit is None else limit

    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise fail("file not found") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise fail(f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise fail(f"is a folder, not {what}")
    if not stat.S_ISREG(st.st_mode):
        raise fail(f"is {_file_kind(st.st_mode)}, not {what}; give the path of a regular file")
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
            raise fail(f"is {_file_kind(st.st_mode)}, not {what}; give the path of a regular file")
        if st.st_size > cap:
            raise fail(f"the file is larger than the limit of {cap // 2**20:,} MiB")
        while size <= cap:
            piece = os.read(fd, min(1 << 20, cap + 1 - size))
            if not piece:
                break
            chunks.append(piece)
            size += len(piece)
    except OSError as exc:
        raise fail(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > cap:
        raise fail(f"the file is larger than the limit of {cap // 2**20:,} MiB")
    return b"".join(chunks)


def read_bytes(path: str | os.PathLike, source: str, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path`` (a path the user typed), at most ``limit``,
    read as :func:`read_json` reads (no FIFO, device or /proc file; ``what``: how the file is
    named in errors, e.g. "an ONNX file")."""
    return _read_capped(path, source, limit, what)


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


_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [{ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}.get(b, 0) for b in range(256)]
#: texts up to this size are checked by :func:`_deepest` (bytes methods and C iterators: the
#: interpreter's lock held throughout); larger ones by the array scan
_SMALL_TEXT = 1 << 20


def _deepest(raw: bytes) -> int:
    """The largest running sum of +1 per opening and -1 per closing bracket outside strings
    in ``raw`` (escapes blanked), as :func:`too_deep_at`'s array scan counts it: the pieces between
    quotes dropped in turn (an unclosed string's to the end), everything but brackets dropped,
    the sum's maximum taken.

    Why not the array scan for a request's body: each of its NumPy calls lets go of the
    interpreter's lock, and under load a request thread then waits for it again, up to the
    switch interval (5 ms) each time. Under 20 sessions editing and searching, the server's
    threads were found in the depth check in 11.5% of py-spy's samples (docs/benchmarks,
    2026-11-30, issue 45); one check of a 25 kB body takes 0.1 ms alone."""
    outside = b"".join(raw.split(b'"')[::2])  # (every other piece between quotes; an unclosed string's last)
    return max(accumulate(map(_STEP.__getitem__, outside.translate(None, _NOT_BRACKET))), default=0)


def too_deep_at(raw: bytes, limit: int = MAX_JSON_DEPTH) -> int | None:
    """Offset of the first ``[`` or ``{`` nested deeper than ``limit`` in JSON text, or None.

    Runs at array speed (~1 ms per MB): escapes are blanked (``\\"`` no longer counts as a
    quote), a bracket is outside every string when an even number of quotes precede it, and
    the depth is the running sum of +1 per opening and -1 per closing bracket. Text that is
    not valid JSON gets some answer; the parser reports its syntax. Up to
    :data:`_SMALL_TEXT` bytes, :func:`_deepest` decides first (the array scan then runs only
    to find where a text too deep is).
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return None
    if b"\\" in raw:
        raw = _ESCAPE.sub(b"__", raw)
    if len(raw) <= _SMALL_TEXT and _deepest(raw) <= limit:
        return None
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
        raise ValidationError([Problem(render_path(data, path) or "(top level)",
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
        where = render_path(data, path) if path else ""
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
        value = value_at(data, path) if path is not None else None
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


def value_at(data: Any, path: list[Any]) -> Any:
    """The node at ``path`` in ``data`` (a file or a schema), or None where there is none."""
    node = data
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def render_path(data: Any, path: list[Any]) -> str:
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


