"""Measured op costs in the explorer: a ``soapbox.profile/1`` table (``soapbox profile``'s
output) attached to a session prices the ops it measured (:class:`engine.costs.CostModel`
with the table); the summary says which share of the compute came from it
(:func:`engine.studies.profiling.coverage`) and the op panel marks each op's cost measured or modelled.

A table comes through the page's upload box (the same size cap, and the engine's loader checks
it against the format's schema); it is kept in the store for the session that uploaded it, as
its models and clusters are, and the state names it by digest only. The command line's local
measurement cache (:class:`engine.studies.profiling.MeasurementCache`) is not offered: the explorer
has no configured place to read one from, and never opens a path a request names.
"""

from __future__ import annotations

import copy
from typing import Any

from engine.costs import ProfileTable
from engine.formats import load_profile

from .clients import client_address
from . import store
from .simulation import Workspace
from .state import bump

__all__ = ["attach_profile", "detach_profile", "coverage_note", "op_cost_mark", "profile_status", "ROOFLINE"]

#: what the op panel says of a cost the roofline model priced
ROOFLINE = "modelled (roofline)"


def attach_profile(state: dict, data: dict, filename: str) -> tuple[dict, str, bool]:
    """Attach a ``soapbox.profile/1`` mapping (already parsed from JSON) to the session: the
    simulation prices the ops it measured. Returns (state, message, ok); a table the loader
    refuses raises :class:`engine.errors.ValidationError` (every problem, with its path) and
    the state is left as it was."""
    table = load_profile(data, filename)
    if not len(table):
        return state, f"{filename}: the profile table has no entries (nothing measured to price ops with)", False
    types = sorted({k[5] for k in table.entries})
    digest = store.current().put_upload(state["sid"], "profile", filename[:200], data, client=client_address())
    new = copy.deepcopy(state)
    new["profile"] = {"name": filename[:200] or "profile", "upload": digest}
    shown = ", ".join(types[:3]) + (f" and {len(types) - 3} more" if len(types) > 3 else "")
    return bump(new), (f"Attached profile table {filename} ({len(table):,} measured entries on {shown}): ops it "
                       "measured are priced from it, the rest by the roofline."), True


def detach_profile(state: dict) -> tuple[dict, str]:
    """The state without its profile table (every op priced by the roofline again)."""
    if not state.get("profile"):
        return state, "No profile table is attached."
    new = copy.deepcopy(state)
    name = new.pop("profile")["name"]
    return bump(new), f"Detached profile table {name}: every op is priced by the roofline again."


def _op_marks(ws: Workspace, names: list[str] | None = None) -> dict[str, tuple[set[str], bool]]:
    """Per op (all, or ``names``): (device types whose partition was measured, whether every
    partition was)."""
    g, s, c, table = ws.graph, ws.strategy, ws.cluster, ws.profile
    out = {}
    for op in (g.ops if names is None else [g[n] for n in names]):
        if op.kind == "input":
            continue
        cfg = s.configs[op.name]
        ins, outs, params = op.partition_shapes(cfg.degrees)
        prec = "fp8" if s.fp8 and op.kind in ("linear", "experts") else g.precision  # (as CostModel keys it)
        hit, every = set(), True
        for t in sorted({c.device_type(d).name for d in cfg.devices}):
            if table is not None and table.get(ProfileTable.key(op.kind, ins, outs, params, prec, t)) is not None:
                hit.add(t)
            else:
                every = False
        out[op.name] = (hit, every)
    return out


def op_cost_mark(ws: Workspace, name: str) -> str:
    """How the op panel labels one op's cost: ``measured (A100-SXM4-80GB)``, ``modelled
    (roofline)``, or both where only some of its GPUs' types were measured."""
    hit, every = _op_marks(ws, [name]).get(name, (set(), False))
    if not hit:
        return ROOFLINE
    measured = f"measured ({', '.join(sorted(hit))})"
    return measured if every else f"{measured}; other GPUs {ROOFLINE}"


def coverage_note(ws: Workspace) -> str:
    """The summary's line on where op costs came from: '' without a table, else how many ops
    and what share of the compute time (forward and backward, :func:`engine.studies.profiling.coverage`)
    the table measured."""
    if ws.profile is None:
        return ""
    from engine.studies.profiling import coverage

    cov = coverage(ws.graph, ws.strategy, ws.cluster, ws.cost)
    marks = _op_marks(ws)
    measured = sum(1 for hit, every in marks.values() if hit and every)
    partly = sum(1 for hit, every in marks.values() if hit and not every)
    part = f" ({partly:,} more partly)" if partly else ""
    return (f"Measured op costs: {measured:,} of {len(marks):,} ops{part} priced from the profile table, "
            f"{cov['measured_share_of_compute']:.0%} of the compute time ({cov['measured_partitions']:,} of "
            f"{cov['partitions']:,} partitions); the rest modelled (roofline).")


def profile_status(state: Any) -> str:
    """The Explore tab's line naming the attached table (or saying how to attach one)."""
    p = state.get("profile") if isinstance(state, dict) else None
    if p:
        return f"Profile table: {p['name']} (measured op costs)."
    return "No profile table: op costs are modelled (roofline). Drop a soapbox profile file in the upload box."
