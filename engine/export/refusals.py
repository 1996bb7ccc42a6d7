"""What an export says when it will not write a plan, shared by every format: a framework
release that would run the plan otherwise than simulated is refused with what and what to do
instead (:func:`refuse`); a strategy that is no framework layout is refused with the ops and
settings that break it (:func:`not_a_layout`). Both are :class:`engine.errors.ValidationError`
under the source ``export``, so the command line prints them as one error with its problems.
"""

from __future__ import annotations

from ..errors import Problem, ValidationError

__all__ = ["refuse", "not_a_layout"]


def refuse(fmt: str, what: str, instead: str) -> ValidationError:
    """The error of an export that ``fmt`` cannot express: what, and what to do instead.

    >>> str(refuse("deepspeed", "pp 2", "export --format megatron").problems[0])
    'deepspeed: pp 2; export --format megatron'
    """
    return ValidationError([Problem(fmt, f"{what}; {instead}")], "export")


def not_a_layout(problems: list[Problem]) -> ValidationError:
    """The error of a strategy no framework layout expresses: every problem found."""
    return ValidationError(problems, "export")
