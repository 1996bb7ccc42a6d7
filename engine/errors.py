"""Errors a user can act on: what was wrong, where, and what would be valid.

Every loader and validator in the engine collects *all* the problems it finds as
:class:`Problem` records (a location path such as ``ops[3] (conv1).attrs.kernel`` and a
message) and raises one :class:`ValidationError` holding them, so a user fixes a file in
one pass instead of one traceback at a time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Problem", "first_line", "SoapboxError", "ValidationError", "OutputError", "Cancelled", "check_cancel", "printable",
           "problems_summary", "MAX_MESSAGE_CHARS", "MAX_PROBLEMS_SHOWN", "ROOT_CAUSE_PATHS", "SUMMARY_PROBLEMS"]

#: A problem's path or message longer than this is cut (a hostile file can hold a name of
#: megabytes, and schema messages quote the offending value).
MAX_MESSAGE_CHARS = 500
#: At most this many problems are printed; the rest are counted (all stay in ``problems``).
MAX_PROBLEMS_SHOWN = 200
#: Where a strategy's problem is a root cause: made for another model (or another batch of
#: it) or another cluster size, every op's problem follows from it.
ROOT_CAUSE_PATHS = ("model.fingerprint", "cluster.devices")
#: Problems :func:`problems_summary` shows before it counts the rest.
SUMMARY_PROBLEMS = 5

# Control characters (terminal escapes and line breaks that could forge a line of the report
# among them) and lone surrogates (which cannot be encoded, so printing them raises) are
# shown as escapes.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` safe to print: control characters and lone surrogates escaped
    (``\\x1b``, ``\\ud800``), cut to ``limit`` characters with a note of how much was left out.

    >>> printable("a\\x1b[31mb"), printable("x" * 20, limit=10)
    ('a\\\\x1b[31mb', 'xxxxxxxxxx... (10 more characters)')
    """
    text = _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit:,} more characters)"
    return text


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: ``path`` says where, ``message`` says what.

    Both are made printable (see :func:`printable`) when the problem is created, so that a
    file's hostile names never reach a terminal raw.
    """

    path: str
    message: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", printable(str(self.path)))
        object.__setattr__(self, "message", printable(str(self.message)))

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class SoapboxError(Exception):
    """Base class of every error the engine raises on purpose."""


class ValidationError(SoapboxError, ValueError):
    """An input (file, graph, strategy, cluster) failed validation.

    Parameters
    ----------
    problems : list of Problem
        Every problem found, in file order.
    source : str, optional
        Where the input came from (a file path or a preset name), prefixed to the message.
    """

    def __init__(self, problems: list[Problem], source: str | None = None) -> None:
        if not problems:
            raise ValueError("ValidationError needs at least one problem")
        self.problems = list(problems)
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        head = f"{printable(self.source)}: " if self.source else ""
        n = len(self.problems)
        lines = [f"{head}{n} problem{'s' if n != 1 else ''} found:"]
        lines += [f"  - {p}" for p in self.problems[:MAX_PROBLEMS_SHOWN]]
        if n > MAX_PROBLEMS_SHOWN:
            lines.append(f"  ... and {n - MAX_PROBLEMS_SHOWN:,} more")
        return "\n".join(lines)

    def with_source(self, source: str) -> "ValidationError":
        """Return a copy that names ``source`` (e.g. the file path) in its message."""
        return ValidationError(self.problems, source)

    def __reduce__(self) -> tuple:
        # rebuilt from its problems when it crosses processes (a sweep's or search's worker):
        # Exception's default passes the rendered text as ``problems``, one "problem" a character
        return type(self), (self.problems, self.source)


def problems_summary(error: ValidationError, shown: int = SUMMARY_PROBLEMS) -> str:
    """``error`` in a few lines, for a command's one error: the root cause first where there
    is one (:data:`ROOT_CAUSE_PATHS`: a strategy made for another model, batch or cluster),
    then at most ``shown`` of the other problems and how many more there are. With no root
    cause and at most ``shown`` problems, the error's own listing. (``soapbox validate``
    prints every problem.)

    Examples
    --------
    >>> ops = [Problem(f"ops.op{i}", "no op named so") for i in range(9)]
    >>> root = Problem("model.fingerprint", "made for batch 64; this model has batch 128")
    >>> print(problems_summary(ValidationError([root] + ops, "s.json"), shown=2))
    s.json: made for batch 64; this model has batch 128
      9 other problems follow from it, e.g.:
      - ops.op0: no op named so
      - ops.op1: no op named so
      ... and 7 more
    >>> print(problems_summary(ValidationError(ops, "s.json"), shown=2))
    s.json: 9 problems found:
      - ops.op0: no op named so
      - ops.op1: no op named so
      ... and 7 more
    """
    head = f"{printable(error.source)}: " if error.source else ""
    root = [p for p in error.problems if p.path in ROOT_CAUSE_PATHS]
    rest = [p for p in error.problems if p.path not in ROOT_CAUSE_PATHS]
    if not root and len(rest) <= shown:
        return str(error)
    n = len(rest)
    if root:
        lines = [head + "; ".join(p.message for p in root)]
        if n:
            lines.append(f"  {n:,} other problem{'s follow' if n != 1 else ' follows'} from it, e.g.:")
    else:
        lines = [f"{head}{n:,} problems found:"]
    lines += [f"  - {p}" for p in rest[:shown]]
    if n > shown:
        lines.append(f"  ... and {n - shown:,} more")
    return "\n".join(lines)


class TooLargeError(SoapboxError, ValueError):
    """A simulation was refused before it started because its task graph would be larger than
    the caller allows (a search's candidates; :func:`engine.taskgraph.estimate_tasks`)."""


class Cancelled(SoapboxError):
    """A build or simulation stopped because its caller cancelled it (a ``cancel`` event set:
    the explorer's Cancel, a superseded background build); nothing was returned."""


def check_cancel(cancel: Any) -> None:
    """Raise :class:`Cancelled` when ``cancel`` says so; return at once otherwise.

    ``cancel`` is None (never cancelled), an object with ``is_set()`` (a
    :class:`threading.Event`) or a callable returning true when the work should stop. The
    builder, the event loop and the memory report call this between their phases (the event
    loop every :data:`engine.sim.full.CANCEL_CHECK_EVENTS` tasks), so a cancel set from another
    thread ends the work within a fraction of a second.

    >>> import threading
    >>> ev = threading.Event(); check_cancel(ev); check_cancel(None); ev.set()
    >>> check_cancel(ev)
    Traceback (most recent call last):
    ...
    engine.errors.Cancelled: cancelled
    """
    if cancel is None:
        return
    is_set = getattr(cancel, "is_set", None)
    if is_set() if is_set is not None else cancel():
        raise Cancelled("cancelled")


class OutputError(SoapboxError, OSError):
    """A result could not be written: ``cannot write PATH: reason``."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot write {printable(str(path))}: {reason}")

    def __str__(self) -> str:
        return self.args[0]


def first_line(e: BaseException) -> str:
    """An error in one line: its message's first line, or, for a list of problems (a
    :class:`ValidationError`, or a message that is one), where it came from and its first
    problem, never the bare "N problems found:" head.

    >>> print(first_line(ValidationError([Problem("tp", "8 does not divide 12 heads"), Problem("pp", "x")], "megatron")))
    megatron: tp: 8 does not divide 12 heads (and 1 more problem)
    >>> first_line(ValueError("one\\ntwo"))
    'one'
    """
    if isinstance(e, ValidationError):
        head = f"{printable(e.source)}: " if e.source else ""
        more = len(e.problems) - 1
        return f"{head}{e.problems[0]}" + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    if len(lines) > 1 and lines[0].endswith("found:"):
        return lines[0].rsplit(":", 2)[0] + ": " + lines[1].lstrip("- ")
    return lines[0][:500] if lines else type(e).__name__
