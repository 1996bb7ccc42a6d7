"""Every operator kind by name: the catalogue the graph, the importers and the cost model read."""

from __future__ import annotations

from . import attention, dense, experts, pointwise, shape
from .base import OpError, OpKind

__all__ = ["OP_KINDS", "OP_ALIASES", "MOE_KINDS", "op_kind"]

#: Every operator kind, by name.
OP_KINDS: dict[str, OpKind] = {k.name: k for part in (shape, dense, pointwise, attention, experts)
                               for k in part.kinds()}
#: The mixture-of-experts kinds.
MOE_KINDS = ("router", "experts")
#: Alias accepted for ``reshape``.
OP_ALIASES = {"flatten": "reshape", "matmul": "linear"}


def op_kind(name: str) -> OpKind:
    """Return the :class:`OpKind` called ``name``.

    Raises
    ------
    OpError
        When no kind has that name; the message lists the valid ones.
    """
    kind = OP_KINDS.get(OP_ALIASES.get(name, name))
    if kind is None:
        raise OpError(f"unknown op kind {name!r}; valid: {', '.join(sorted(OP_KINDS))}", "kind")
    return kind
