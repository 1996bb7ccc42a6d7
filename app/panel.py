"""The layout panel's form, made from the engine's one layout record: which
:class:`engine.layout.record.Layout` fields the panel shows and how
(:attr:`engine.layout.record.Option.panel`), the id of each component, and the form's values
read back into layout options.

The panel keeps no list of its own: a field the record gains with a ``panel`` group appears on
the page, is read by :func:`layout_options` and set by :func:`app.tabs.editor.panel_values`.
A form is a mapping of field names (the component of each is ``layout-<name with dashes>``)
plus ``kind`` (the builder), ``flags`` and ``overlap`` (check boxes whose values are field
names).
"""

from __future__ import annotations

from typing import Any

from engine.layout.record import BUILDERS, OPTION_NAMES, Layout, option_of, options_for, value_kind

__all__ = ["PANEL_FIELDS", "DEGREES", "CHOICES", "FLAGS", "OVERLAPS", "OFFLOADS", "EXPERT_DEGREES", "LAYOUT_FORM",
           "SWITCHES", "component_id", "placeholder", "layout_options"]


def _group(group: str) -> tuple[str, ...]:
    return tuple(n for n in OPTION_NAMES if option_of(n).panel == group)


#: every field the panel shows, in the record's order
PANEL_FIELDS = tuple(n for n in OPTION_NAMES if option_of(n).panel)
#: number boxes (degrees, the micro-batch, the shard group)
DEGREES = _group("degree")
#: drop-downs of a field's values (recomputation, ZeRO stage, schedule)
CHOICES = _group("choice")
#: the parallelism flags' check boxes (sequence parallelism, fp8)
FLAGS = _group("flag")
#: the communication overlaps' check boxes
OVERLAPS = _group("overlap")
#: the offload drop-downs (each none, cpu or nvme)
OFFLOADS = _group("offload")
#: the mixture-of-experts degrees (off for a dense model)
EXPERT_DEGREES = tuple(n for n in DEGREES if option_of(n).experts)
#: the form's entries in the order the page sends them: the builder, then a component per field
#: (the check boxes of flags and overlaps as one entry each)
LAYOUT_FORM = ("kind",) + tuple(n for n in PANEL_FIELDS if n not in FLAGS + OVERLAPS) + ("flags", "overlap")
#: the overlap and offload switches and their defaults (the layout's)
SWITCHES = {n: getattr(Layout(), n) for n in OVERLAPS + OFFLOADS}


def component_id(name: str) -> str:
    """The page component of a form entry: ``layout-micro-batch`` for ``micro_batch``.

    >>> component_id("micro_batch"), component_id("overlap")
    ('layout-micro-batch', 'layout-overlap')
    """
    return "layout-" + name.replace("_", "-")


def placeholder(name: str) -> str:
    """What an empty number box says it takes: its default (``auto`` where the builder picks
    one, ``-`` where zero means none).

    >>> [placeholder(n) for n in ("tp", "micro_batch", "shard_group")]
    ['1', 'auto', '-']
    """
    default = getattr(Layout(), name)
    return "auto" if default is None else "-" if default == 0 else str(default)


def _whole(v: Any) -> int | None:
    if isinstance(v, bool):  # (a crafted true is not tp 1)
        return None
    try:
        f = float(v)
        return int(f) if f == int(f) and 0 <= f <= 1 << 20 else None
    except (TypeError, ValueError, OverflowError):
        return None


def layout_options(kind: str, form: dict[str, Any]) -> dict[str, Any]:
    """The builder options a layout panel's form describes (names of the record's fields,
    checked by it): an empty entry takes the builder's default; a field ``kind``'s builder does
    not take (:func:`engine.layout.record.options_for`) is refused when it is set.

    Raises
    ------
    ValueError
        Naming the field that is not valid (a fraction, 0, text) and what would be.

    >>> layout_options("megatron", {"tp": "2", "flags": ["sequence_parallel"], "overlap": []})
    {'tp': 2, 'sequence_parallel': True, 'overlap_grad_reduce': False}
    """
    if kind not in BUILDERS:
        raise ValueError(f"kind must be {' or '.join(BUILDERS)}, got {str(kind)[:30]!r}")
    unknown = sorted(str(k)[:40] for k in form if k not in LAYOUT_FORM)
    if unknown:  # (a crafted form or a script's own name: a field dropped silently gives another layout)
        raise ValueError(f"the layout panel has no field {unknown[0]!r} (its fields: {', '.join(LAYOUT_FORM[1:])})")
    opts: dict[str, Any] = {}
    for name in PANEL_FIELDS:
        if name in FLAGS + OVERLAPS + OFFLOADS:  # (check boxes and switches: below)
            continue
        v = form.get(name)
        if v in (None, "", []):
            continue
        if value_kind(name) == "int":
            n = _whole(v)
            if n is None or (n < 1 and name != "zero_stage"):
                raise ValueError(f"{option_of(name).label} {str(v)[:20]!r} is not a whole number from "
                                 f"{0 if name == 'zero_stage' else 1}")
            opts[name] = n
        elif value_kind(name) == "names":
            if not isinstance(v, (list, tuple)):  # (a crafted form: dropped, it would simulate another layout)
                raise ValueError(f"{option_of(name).label}: a list of names, got {str(v)[:40]!r}")
            opts[name] = [str(m)[:40] for m in v[:2 * len(option_of(name).choices)]]
        else:
            opts[name] = str(v)[:40]
    flags = form.get("flags") or []
    if not isinstance(flags, (list, tuple)):  # (a crafted form: a flag dropped would simulate another layout)
        raise ValueError(f"flags: a list of the ticked flags, got {str(flags)[:40]!r}")
    ticked = {str(f)[:40] for f in flags}
    unknown = sorted(ticked - set(FLAGS))
    if unknown:  # (a crafted form or an old script: a flag silently dropped would simulate another layout)
        raise ValueError(f"flags: {unknown[0]!r} is not one of {', '.join(FLAGS)}")
    opts.update({n: True for n in FLAGS if n in ticked})
    opts.update(_switches(form))
    default = Layout()
    taken = options_for(kind)
    for name in [n for n in opts if n not in taken]:
        if opts[name] == getattr(default, name):
            del opts[name]  # (left at its default: nothing asked of this builder)
        else:
            other = [k for k in BUILDERS if name in options_for(k)]
            raise ValueError(f"{kind} does not take {name.replace('_', ' ')}"
                             + (f" (pick {other[0]} for it)" if other else ""))
    if kind == "fsdp":
        opts.setdefault("zero_stage", 3)
    Layout.from_options(opts)  # (the one layout record checks every field: its name and valid values)
    if opts.get("tp_comm_overlap") and not opts.get("sequence_parallel"):
        raise ValueError("tensor-parallel comm overlap (Transformer Engine's userbuffers) needs sequence parallel: "
                         "tick it too, or untick the overlap")
    if opts.get("overlap_param_gather") and opts.get("zero_stage") not in (1, 2):
        raise ValueError("parameter gather overlap applies to the ZeRO 1 or 2 distributed optimizer (megatron, "
                         f"ZeRO stage 1 or 2; this layout: {kind}, ZeRO {opts.get('zero_stage', 0)})")
    return opts


def _switches(form: dict[str, Any]) -> dict[str, Any]:
    """The overlap and offload options a panel's form sets away from their defaults: the
    overlap check boxes' ticked fields (absent or not a list: every default) and the offload
    drop-downs (absent or empty: none)."""
    out: dict[str, Any] = {}
    ticked = form.get("overlap")
    if isinstance(ticked, (list, tuple)):
        on = {str(x) for x in ticked}
        for name in OVERLAPS:
            if (name in on) != SWITCHES[name]:
                out[name] = name in on
    for name in OFFLOADS:
        where = form.get(name)
        if where not in (None, "", SWITCHES[name]):
            out[name] = str(where)[:20]
    return out
