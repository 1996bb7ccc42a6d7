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

__all__ = ["warm_up"]

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
