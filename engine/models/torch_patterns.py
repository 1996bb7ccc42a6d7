"""Patterns in a ``torch.export`` graph that map to one soapbox op, and shared parameters.

Used by :mod:`engine.models.torch_import`. Eager implementations spell some layers out in
ATen pieces; transformers' ``LlamaRMSNorm`` is::

    y = x.to(float32)                                   # pass-through
    y = y * rsqrt(pow(y, 2).mean(-1, keepdim=True) + eps)
    return weight * y.to(dtype)                         # the gain

which :func:`rms_norms` finds, so that it imports as one ``rmsnorm`` (its gain counted once) rather
than as a reduction soapbox cannot express. Preconditions (not checked): the graph's nodes carry
``meta["val"]`` as ``torch.export`` leaves them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["aten_name", "PASS_THROUGH", "rms_norms", "shared_parameters"]

#: ATen calls that only relabel or copy their first input (no soapbox op of their own)
PASS_THROUGH = {"contiguous", "clone", "alias", "detach", "_to_copy", "to", "lift_fresh_copy", "type_as"}


def aten_name(target: Any) -> str:
    """The ATen call's name without namespace or overload; an in-place variant (``relu_``,
    ``add_``, ``hardtanh_``) is named as its out-of-place op, which computes the same values.

    >>> import torch
    >>> aten_name(torch.ops.aten.relu_.default), aten_name(torch.ops.aten.__and__.Tensor)
    ('relu', '__and__')
    """
    op = getattr(getattr(target, "_overloadpacket", None), "__name__", str(target)).split(".")[-1]
    return op[:-1] if op.endswith("_") and not op.startswith("_") else op


def _through(n):
    """The node ``n`` copies, following pass-through calls back to the first real producer."""
    while getattr(n, "op", None) == "call_function" and aten_name(n.target) in PASS_THROUGH and n.args:
        n = n.args[0]
    return n


def _users(n) -> list:
    """The calls reading ``n``, less torch.export's metadata checks."""
    return [u for u in n.users if not aten_name(u.target).startswith("_assert")]


def _is(n, name: str) -> bool:
    return getattr(n, "op", None) == "call_function" and aten_name(n.target) == name


def _single_user_chain(start, stop) -> list:
    """The nodes from ``start`` back to ``stop`` (exclusive) if each has exactly one user."""
    chain, n = [], start
    while n is not stop:
        if len(_users(n)) != 1:
            return []
        chain.append(n)
        n = n.args[0]
    return chain


def rms_norms(graph, params: set[str]) -> tuple[set[str], dict[str, str], dict[str, str]]:
    """RMSNorms spelled out in ATen pieces (Zhang & Sennrich 2019, eq. 4: ``x / RMS(x) * g``).

    Returns
    -------
    absorbed : set of str
        Nodes (pow, mean, add, rsqrt) that the norm replaces; they import as nothing.
    norms : dict
        The normalising ``mul`` node's name -> the name of the node it normalises.
    gains : dict
        The gain's ``mul`` node's name (``weight * y`` with ``weight`` a parameter) -> the
        activation operand's node name; it imports as a pass-through, the gain being the
        ``rmsnorm`` op's parameter. A norm without a gain is not matched (soapbox's rmsnorm
        always has one).
    """
    absorbed: set[str] = set()
    norms: dict[str, str] = {}
    gains: dict[str, str] = {}
    for n in graph.nodes:
        if not _is(n, "mul") or len(n.args) != 2 or not all(hasattr(a, "name") for a in n.args):
            continue
        for x, r in (n.args, n.args[::-1]):
            if not _is(r, "rsqrt") or not _is(r.args[0], "add") or hasattr(r.args[0].args[1], "name"):
                continue
            mean = r.args[0].args[0]
            if not _is(mean, "mean") or list(mean.args[1]) not in ([-1], [len(mean.meta["val"].shape) - 1]) \
                    or not (len(mean.args) > 2 and mean.args[2]):
                continue
            pw = mean.args[0]
            if not _is(pw, "pow") or pw.args[1] != 2 or _through(pw.args[0]) is not _through(x):
                continue
            users = _users(n)
            gain = _through_user(users[0]) if len(users) == 1 else None
            if not _is(gain, "mul"):
                continue
            w = next((a for a in gain.args if hasattr(a, "name") and a.name in params), None)
            act = next((a for a in gain.args if a is not w), None)
            if w is None or act is None or tuple(w.meta["val"].shape) != tuple(x.meta["val"].shape[-1:]):
                continue
            chain = _single_user_chain(r, pw.args[0])
            if not chain:
                continue
            absorbed.update(c.name for c in chain)
            norms[n.name] = x.name
            gains[gain.name] = act.name
            break
    return absorbed, norms, gains


def _through_user(n):
    """Follow single-user pass-through calls forward from ``n``."""
    while getattr(n, "op", None) == "call_function" and aten_name(n.target) in PASS_THROUGH and len(_users(n)) == 1:
        n = _users(n)[0]
    return n


def shared_parameters(ep, module) -> dict[str, str]:
    """Parameter placeholders of the exported program that name one tensor held under several
    names (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``) -> the first name, used as
    the soapbox ``param_group`` so that the tensor is counted and synchronised once."""
    by_id: dict[int, list[str]] = {}
    for fqn, p in module.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(fqn)
    first = {fqn: names[0] for names in by_id.values() if len(names) > 1 for fqn in names}
    return {ph: first[fqn] for ph, fqn in ep.graph_signature.inputs_to_parameters.items() if fqn in first}
