"""Errors a user can act on: what was wrong, where, and what would be valid.

Every loader and validator in the engine collects *all* the problems it finds as
:class:`Problem` records (a location path such as ``ops[3] (conv1).attrs.kernel`` and a
message) and raises one :class:`ValidationError` holding them, so a user fixes a file in
one pass instead of one traceback at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Problem", "SoapboxError", "ValidationError"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: ``path`` says where, ``message`` says what."""

    path: str
    message: str

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
        head = f"{self.source}: " if self.source else ""
        n = len(self.problems)
        lines = [f"{head}{n} problem{'s' if n != 1 else ''} found:"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)

    def with_source(self, source: str) -> "ValidationError":
        """Return a copy that names ``source`` (e.g. the file path) in its message."""
        return ValidationError(self.problems, source)
