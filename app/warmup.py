"""The server's first steps before it takes a visitor: draw the default page once and edit it
once (compiles the simulator's kernels, the delta simulation's included, and fills the
caches), so that neither the first visitor nor the first edit waits for it, and what the server
holds after start-up is what it holds when idle."""

from __future__ import annotations

from .actions import apply_edit, undo
from .events import on_event
from .layout import make_layout
from .sessions import current
from .simulation import workspace_within
from .sources import graph_of
from .state import new_sid
from .tabs.compare import render_compare
from .tabs.editor import render_editor
from .tabs.explore import pin_default, render_explore

__all__ = ["settle_heap", "warm_up"]

#: how long warm-up waits for each of its builds (s): on the background pool, as a visitor's are
WAIT_S = 600.0


def warm_up() -> None:
    make_layout()  # (the page itself: its cluster menu reads every preset)
    state, _ = on_event("url", None)
    render_explore(state, True, "utilization")
    pin_default(state)
    render_editor(state)
    render_compare(state)
    g = graph_of(state)
    op = next(o for o in g.ops if o.kind != "input")
    edited, _ = apply_edit(dict(state, sid=new_sid()), [op.name], {}, [0])
    for s in (edited, undo(edited)[0]):  # a delta change each way
        workspace_within(s, WAIT_S)  # (as a visitor's edit is built: a view that gave up waiting would leave it undone)
        render_explore(s, True, "utilization")
        render_editor(s)
    sessions = current()
    for sid in (state["sid"], edited["sid"]):  # (sessions no visitor has: an idle server holds no simulation)
        sessions.forget(sid)
    sessions.trim(0.0)


def settle_heap() -> None:
    """Collect what start-up left and move every object that survived into the collector's
    permanent generation (``gc.freeze``; Python docs, "gc — Garbage Collector interface": "freeze
    all the objects tracked by gc ... ignore them for all future collections"). The imports
    (Dash, Plotly, numba, the engine) and warm-up leave ~260,000 tracked objects that live as
    long as the server, and a full collection holds the interpreter lock while it walks them.
    Measured (``benchmarks/bench_load_ab.py --same-client --gc-log``, 20 sessions, 5 minutes,
    two pairs): the longest full collection 0.34 / 0.36 s before, 0.14 / 0.19 s after; they come
    about three times as often, so their total is not less (9.1 / 9.3 s before, 10.2 / 11.1 s
    after); edit -> figures p95 the same within the runs' spread (BENCHMARKS.md). Called once,
    by ``soapbox serve`` after :func:`warm_up`; objects made later are collected as before. A
    frozen object is never collected: what start-up keeps (the pinned default page, the presets,
    the modules) stays for the server's life anyway, and warm-up's own sessions are forgotten and
    collected before the freeze."""
    import gc

    gc.collect()
    gc.freeze()
