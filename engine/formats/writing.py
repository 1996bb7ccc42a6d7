"""JSON out: deterministic text, written atomically (a temporary file beside the target, then
a rename), with stale temporary files of dead writers swept. See :mod:`engine.formats`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping, TextIO

from ..errors import OutputError

__all__ = ["dumps", "atomic_writer", "save_json"]


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
def atomic_writer(path: str | os.PathLike, make_parents: bool = False,
                  binary: bool = False) -> Iterator[TextIO]:
    """A text file (``binary``: a binary one) to write ``path`` through: a temporary file beside
    it, named ``.NAME.PID.RANDOM.tmp`` (unique, never an existing file), renamed over ``path`` once the
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
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")) as f:
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


