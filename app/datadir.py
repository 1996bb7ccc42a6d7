"""The server's data directory: its owner's only, one server at a time, its database checked.

:mod:`app.store` keeps the explorer's uploads and searches in one SQLite file in a data
directory (``soapbox serve --data-dir``). This module looks after the directory itself:

* :func:`private_dir` / :func:`private_file`: the folder is made (or tightened to) mode 0700,
  its files 0600; uploads and session ids are nobody else's business on a shared machine.
* :func:`lock_folder`: an exclusive ``flock`` on the folder and on ``soapbox.lock`` in it, held
  by the server for its life (a deleted lock file does not release it). A second server on the folder is refused (:class:`DataDirInUse`)
  instead of marking the first one's searches interrupted. The lock dies with its process,
  so a crash or ``kill -9`` leaves nothing stale.
* :func:`inspect_store` / :func:`set_aside`: what is wrong with a database file before it is
  opened (not SQLite, truncated, a folder, failing ``PRAGMA quick_check``, emptied), and moving
  a damaged one out of the way as ``<name>.damaged-<time>`` so that the server can start.

Nothing here holds state: the lock's open file is kept by the :class:`app.store.Store` that
took it.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from pathlib import Path
from typing import IO, Iterable, Mapping

__all__ = ["DataDirInUse", "FolderLock", "adopt_lock", "default_data_dir", "private_dir", "private_file",
           "lock_folder", "inspect_store", "set_aside", "LOCK_NAME", "EVIDENCE"]

#: the lock's file name in the data directory
LOCK_NAME = "soapbox.lock"
#: files beside the database that show the folder was used before (the key that signs session
#: ids, see :mod:`app.sessions`): an emptied database beside one is news, not a first start
EVIDENCE = ("session.key",)
_SQLITE_MAGIC = b"SQLite format 3\x00"
#: files SQLite keeps beside a database (moved along with it when it is set aside)
_COMPANIONS = ("-wal", "-shm", "-journal")


def default_data_dir() -> Path:
    """The platform's per-user data directory for soapbox (``platformdirs``)."""
    from platformdirs import user_data_dir

    return Path(user_data_dir("soapbox", appauthor=False))


class DataDirInUse(ValueError):
    """Another server holds the data directory (:func:`lock_folder`)."""


def private_dir(folder: Path) -> None:
    """Make ``folder`` (mode 0700) or tighten it to its owner only (a folder someone else owns
    is left as it is).

    Raises
    ------
    ValueError
        For a shared folder (anyone may write in it, or it has the sticky bit: ``/tmp``, mode
        1777): tightening it locked every other user out, and leaving it let them replace the
        store; the message says to give a folder of soapbox's own.
    """
    existed = folder.is_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        st = folder.stat()
    except OSError:
        return
    if existed and st.st_mode & (stat.S_ISVTX | stat.S_IWOTH):
        raise ValueError(f"the data directory {folder} is a shared folder (mode {stat.S_IMODE(st.st_mode):o}: "
                         f"others can write in it); give a folder of soapbox's own, e.g. "
                         f"--data-dir {folder / 'soapbox-data'} (made readable by you only)")
    try:
        if st.st_mode & 0o077 and st.st_uid == os.getuid():
            os.chmod(folder, 0o700)
    except (OSError, AttributeError):  # (os.getuid: not on Windows)
        pass


def private_file(path: Path, create: bool = False) -> None:
    """With ``create``, make ``path`` an empty file of mode 0600 when it is missing; tighten an
    existing regular file to its owner only."""
    if create:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return
        except FileExistsError:
            pass
    try:
        st = path.lstat()  # (a link is left as it is: tightening its target changed a file elsewhere)
        if st.st_mode & 0o077 and stat.S_ISREG(st.st_mode):
            os.chmod(path, st.st_mode & 0o600)
    except OSError:
        pass


class FolderLock:
    """A data directory held by this process: ``flock`` on the folder itself (deleting the lock
    file does not let another server in) and on ``soapbox.lock`` (which names the holder's
    process); :meth:`close` lets go of both."""

    def __init__(self, folder_fd: int, file: IO[str]) -> None:
        self.folder_fd, self.file = folder_fd, file

    def descriptors(self) -> list[int]:
        """Its two descriptors (folder, file), for a server starting again in place
        (:mod:`app.recycle`) to keep across the exec and :func:`adopt_lock`."""
        return [self.folder_fd, self.file.fileno()] if self.file is not None and self.folder_fd >= 0 else []

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None  # type: ignore[assignment]
        if self.folder_fd >= 0:
            os.close(self.folder_fd)
            self.folder_fd = -1


_handed: list[int] = []  # a lock's descriptors kept across this process's exec (adopt_lock)


def adopt_lock(descriptors: list[int]) -> None:
    """The next :func:`lock_folder` takes these descriptors ([folder, file], held by this
    process's image before an exec: :mod:`app.recycle`) instead of opening the folder again,
    when they are that folder's: a second open of the lock file could not take its ``flock``."""
    _handed[:] = descriptors


def _adopted(folder: Path) -> FolderLock | None:
    """The handed-over lock when it is ``folder``'s and still held; else its descriptors closed."""
    import fcntl

    dfd, ffd = _handed
    _handed.clear()
    try:
        a, b = os.fstat(dfd), os.stat(folder)
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (the same open file: already ours)
            fcntl.flock(ffd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.set_inheritable(dfd, False)
            os.set_inheritable(ffd, False)
            return FolderLock(dfd, open(ffd, "r+", encoding="ascii", errors="replace"))
    except OSError:
        pass
    for fd in (dfd, ffd):
        try:
            os.close(fd)
        except OSError:
            pass
    return None


def lock_folder(folder: Path) -> FolderLock | None:
    """Take ``folder`` for this process alone: an exclusive ``flock`` on the folder and on
    ``folder/soapbox.lock`` (mode 0600), which then holds this process's id. The lock lasts
    until the returned :class:`FolderLock` is closed or the process ends. None where ``fcntl``
    is missing (Windows: nothing is locked).

    Raises
    ------
    DataDirInUse
        When another process holds it: naming the folder and that process's id.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on Linux / macOS
        return None
    if _handed:
        kept = _adopted(folder)
        if kept is not None:
            return kept
    path = folder / LOCK_NAME
    dfd = os.open(folder, os.O_RDONLY)
    f = open(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+", encoding="ascii", errors="replace")
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = f.read(40).strip()
        f.close()
        os.close(dfd)
        # Dash's debug mode runs the app again in a child of the process that took the folder
        # (werkzeug's reloader): the parent holds it for both
        if os.environ.get("WERKZEUG_RUN_MAIN") == "true" and holder == str(os.getppid()):
            return None
        raise DataDirInUse(
            f"the data directory {folder} is in use by another soapbox server"
            + (f" (process {holder})" if holder.isdigit() else "")
            + "; stop that one first, or give this one another --data-dir") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    private_file(path)
    return FolderLock(dfd, f)


def _what_it_is(head: bytes) -> str:
    """How the start of a file that is not an SQLite database reads, for the message."""
    try:
        text = head.decode("utf-8")
        if all(c.isprintable() or c in "\r\n\t" for c in text):
            return f"is a text file, not an SQLite database (it starts {text[:24]!r})"
    except UnicodeDecodeError:
        pass
    return f"is not an SQLite database (it starts with the bytes {head[:8].hex(' ')})"


def inspect_store(path: Path, tables: Iterable[str],
                  columns: Mapping[str, Iterable[str]] | None = None) -> tuple[str | None, str | None]:
    """What is wrong with the database file at ``path``, which should hold ``tables``.

    Returns (why it must be set aside, or None; a notice that it lost its content, or None):
    (None, None) for a sound store or no file. Set aside: a folder or other non-file, a file
    that is not SQLite (text or garbage), one shorter than its header says (truncated), one
    SQLite cannot read or whose ``PRAGMA quick_check`` fails, an SQLite database of someone
    else's tables, or one where a table of ``tables`` lacks the ``columns`` it needs (another
    program's ``uploads``: opened, it stopped the server at its first query). Emptied: 0 bytes, or some of ``tables`` missing where others are there or
    where the folder shows earlier use (:data:`EVIDENCE`).
    """
    tables = tuple(tables)
    if not os.path.lexists(path):
        return None, None
    if path.is_dir():
        return "is a folder, not a database file", None
    if not path.is_file():
        return "is not a regular file (a socket, a device or a broken link)", None
    size = path.stat().st_size
    used_before = [n for n in EVIDENCE if (path.parent / n).exists()]
    gone = "the uploads and searches it held are gone"
    if size == 0:
        return None, f"is empty (0 bytes): {gone} (if you keep a copy, stop the server and put it back)"
    with open(path, "rb") as f:
        head = f.read(100)
    if not head.startswith(_SQLITE_MAGIC):
        return _what_it_is(head), None
    if len(head) < 100:
        return f"is truncated ({size} bytes, shorter than an SQLite header)", None
    page_bytes = int.from_bytes(head[16:18], "big")
    page_bytes = 65536 if page_bytes == 1 else page_bytes
    pages = int.from_bytes(head[28:32], "big")
    # the header's page count is valid when its change counter matches "version-valid-for"
    # (https://www.sqlite.org/fileformat2.html#in_header_database_size)
    if head[24:28] == head[92:96] and pages and size < pages * page_bytes:
        return f"is truncated ({size:,} bytes where its header counts {pages:,} pages of {page_bytes:,} bytes)", None
    try:
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        try:
            rows = [r[0] for r in conn.execute("PRAGMA quick_check")]
            found = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            lacking = {t: sorted(set(need) - {r[1] for r in conn.execute(f'PRAGMA table_info("{t}")')})
                       for t, need in (columns or {}).items() if t in found}
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        return f"cannot be read as a database ({e})", None
    if rows != ["ok"]:
        return "fails SQLite's integrity check (" + "; ".join(str(r)[:200] for r in rows[:3]) + ")", None
    foreign = {t: cols for t, cols in lacking.items() if cols}
    if foreign:
        t, cols = next(iter(foreign.items()))
        return (f"is an SQLite database whose table {t!r} is not soapbox's (it lacks the column"
                f"{'s' if len(cols) > 1 else ''} {', '.join(cols[:5])})"), None
    ours, others = found & set(tables), found - set(tables) - {"sqlite_sequence"}
    if not ours and others:
        return f"is an SQLite database but not soapbox's (its tables: {', '.join(sorted(others)[:5])})", None
    missing = [t for t in tables if t not in found]
    if missing and (ours or used_before):
        return None, (f"has lost its table{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
                      + ("" if ours else f" although this folder was used before ({', '.join(used_before)})")
                      + f": {gone}")
    return None, None


def set_aside(path: Path, why: str) -> Path:
    """Rename the damaged database ``path`` (and its -wal / -shm / -journal files) to
    ``<name>.damaged-<time>``, readable by its owner only; the new path.

    Raises
    ------
    ValueError
        When it cannot be renamed, saying what to do.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, k = path.with_name(f"{path.name}.damaged-{stamp}"), 1
    while os.path.lexists(target):
        k += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{k}")
    try:
        os.rename(path, target)
        for suffix in _COMPANIONS:
            side = path.with_name(path.name + suffix)
            if os.path.lexists(side):
                os.rename(side, target.with_name(target.name + suffix))
    except OSError as e:
        raise ValueError(f"the store {path} {why}, and it cannot be set aside ({e.strerror or e}): move it away "
                         "and start the server again") from None
    private_file(target)
    return target
