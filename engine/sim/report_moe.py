"""The mixture-of-experts part of a simulation's report: the ``moe`` block of
:meth:`engine.sim.report.SimulationResult.summary` and its lines in
:func:`engine.sim.report.format_summary`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..moe import active_parameters, expert_table
from ..taskgraph import COLL, COLL_INDEX

__all__ = ["BALANCED_NOTE", "moe_fields", "moe_lines"]


#: what the summary says of a mixture-of-experts model's routing
BALANCED_NOTE = "published MoE runs are measured with balanced routing"


def moe_fields(r: Any) -> dict[str, Any] | None:
    """The ``moe`` block of :meth:`engine.sim.report.SimulationResult.summary` (None for a dense model):
    parameters (total, and active a token: :func:`engine.moe.active_parameters`), ep x etp,
    the seconds an all-to-all (dispatch or combine) is in flight somewhere and their share of
    the iteration, and the routing: balanced, or the what-if's per-rank loads and their
    max / mean (the gate, :func:`engine.moe.gate_factor`)."""
    table = expert_table(r.graph, r.strategy)
    if table is None:
        return None
    tg, tl = r.tasks, r.timeline
    sel = np.nonzero((tg.kind == COLL) & (tg.coll == COLL_INDEX["all_to_all"]))[0]
    a2a_s = 0.0
    if sel.size:  # the union of the all-to-alls' intervals
        order = sel[np.argsort(tl.start_s[sel], kind="stable")]
        start, end = tl.start_s[order], np.maximum.accumulate(tl.end_s[order])
        gaps = np.maximum(start[1:] - end[:-1], 0.0)
        a2a_s = float(end[-1] - start[0] - gaps.sum())
    t = r.iteration_time_s
    out: dict[str, Any] = {
        "total_parameters": int(r.graph.param_count), "active_parameters": active_parameters(r.graph),
        "num_experts": table.num_experts, "top_k": table.top_k, "ep": table.ep, "etp": table.etp,
        "alltoall_in_flight_s": a2a_s, "alltoall_share": a2a_s / t if t > 0 else None,
        "routing": "balanced" if table.balanced else "what-if",
        "rank_load_max_over_mean": table.gate, "note": BALANCED_NOTE,
    }
    if not table.balanced:
        out["rank_loads"] = list(table.rank_shares)
    return out


def moe_lines(s: dict[str, Any]) -> list[str]:
    """The mixture-of-experts lines of :func:`engine.sim.report.format_summary` (none for a dense model)."""
    m = s.get("moe")
    if not m:
        return []
    def count(n: float) -> str:
        return next((f"{n / k:,.1f} {unit}" for unit, k in (("B", 1e9), ("M", 1e6)) if n >= k), f"{n:,.0f}")

    lines = [f"  mixture of experts {count(m['total_parameters'])} parameters, {count(m['active_parameters'])} "
             f"active a token (top-{m['top_k']} of {m['num_experts']} experts); ep {m['ep']} x etp {m['etp']}"]
    if m["alltoall_share"] is not None and m["alltoall_in_flight_s"] > 0:
        lines.append(f"  all-to-all         in flight {m['alltoall_in_flight_s'] * 1e3:,.3f} ms, "
                     f"{m['alltoall_share']:.1%} of the iteration (token dispatch and combine)")
    if m["routing"] == "balanced":
        lines.append(f"  routing            balanced ({BALANCED_NOTE})")
    else:
        loads = m["rank_loads"]
        lines.append(f"  routing            what-if: the busiest of {len(loads)} expert-parallel rank(s) gets "
                     f"{max(loads):.1%} of the tokens, max/mean {m['rank_load_max_over_mean']:.2f} (the gate: every "
                     f"rank waits for it); {BALANCED_NOTE}")
    return lines
