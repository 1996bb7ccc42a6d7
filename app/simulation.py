"""A page's strategy simulated: the session's :class:`Workspace`, brought in line with a state
by delta simulation when a few ops changed, else by a full build, in the background when it
takes longer than a request should wait.

The workspaces and builds are kept by :class:`app.sessions.Sessions`; this module says how one
is made. Every simulation goes through the engine's symmetry reduction where the strategy has
an exact symmetry (an LLM layout on 64 GPUs: a few representative GPUs instead of millions of
tasks), and is refused before it starts past :data:`app.sources.APP_MAX_TASKS`.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError, TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from engine.cluster import Cluster
from engine.costs import CostModel, ProfileTable
from engine.sim.delta import DeltaSimulator
from engine.errors import Cancelled, SoapboxError, TooLargeError, ValidationError
from engine.graph import OpGraph
from engine.sim.memory import MemoryReport, memory_report
from engine.search.baselines import make_baseline
from engine.sim.full import Timeline
from engine.strategy import Config, Strategy, validate_strategy

from . import store
from .sessions import Build, Busy, current
from .sources import APP_MAX_TASKS, cluster_of, graph_of, profile_of
from .state import content_key, page_strategy, same_settings

__all__ = ["Workspace", "workspace", "workspace_within", "workspace_shown", "build_status", "cancel_build", "check_size",
           "baseline_cost_s", "baseline_fits", "baseline_comm_bytes", "size_checked_key", "valid_checked_key", "paths_in_background", "INLINE_WAIT_S", "MAX_WAIT_S", "DELTA_LIMIT",
           "Busy"]

#: how long a request waits for a simulation before it answers and the simulation goes on in
#: the background (the page polls, shows progress and can go back)
INLINE_WAIT_S = 1.5
#: the longest any request waits for a simulation (a background build of the same state); past
#: it the request answers that the simulation is still running
MAX_WAIT_S = 120.0
#: more ops changed than this between the cached simulation and the state: rebuild instead
DELTA_LIMIT = 8


@dataclass
class Workspace:
    """The server's cache for one session: what the state's strategy simulates to."""

    graph: OpGraph
    cluster: Cluster
    sim: DeltaSimulator | None
    version: int = -1
    memory_cache: MemoryReport | None = field(default=None, repr=False)
    used_at: float = field(default_factory=time.monotonic, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: (strategy, timeline) of a symmetric simulation (one representative per set of identical
    #: replicas, as the engine's symmetry reduction allows): no delta simulator is built until
    #: a hand edit needs one
    static: tuple[Strategy, Timeline] | None = field(default=None, repr=False)
    #: the uploaded profile table that priced the ops it measured (None: the roofline alone)
    profile: ProfileTable | None = field(default=None, repr=False)

    @property
    def cost(self) -> CostModel:
        """The cost model this workspace simulates with."""
        return self.sim.cost if self.sim is not None else CostModel(profile=self.profile)

    @property
    def strategy(self) -> Strategy:
        return self.sim.strategy if self.sim is not None else self.static[0]

    @property
    def timeline(self) -> Timeline:
        return self.sim.timeline if self.sim is not None else self.static[1]

    def editable(self) -> DeltaSimulator:
        """The delta simulator hand edits change (a full build the first time, from a
        symmetric workspace)."""
        if self.sim is None:
            check_size(self.graph, self.static[0], "a hand edit needs the full simulation (no symmetry): it")
            self.sim = DeltaSimulator(self.graph, self.static[0], self.cluster, CostModel(profile=self.profile))
            self.static = None
            self.memory_cache = None
        return self.sim

    def check(self, op: str, config: Config) -> list:
        """Problems with giving ``op`` ``config`` (the loader's verdict on the changed strategy)."""
        if self.sim is not None:
            return self.sim.check(op, config)
        return validate_strategy(self.strategy.with_config(op, config), self.graph, self.cluster)

    @property
    def memory(self) -> MemoryReport:
        if self.memory_cache is None:
            self.memory_cache = memory_report(self.graph, self.strategy, self.cluster, self.timeline)
        return self.memory_cache


def paths_in_background(timeline: Timeline) -> threading.Thread:
    """Start a thread that computes ``timeline``'s dependency-only earliest starts and its
    critical chain (what the summary and the Gantt chart read): compiled loops that release
    the interpreter lock, so on a machine with a free core they run while the caller makes the
    memory report (LLaMA-2 7B on 64 GPUs: a 212,000-task chain walked in ~30 ms, ~45 ms on
    GPT-3 175B's 1 M tasks). Join it before reading them; a property read meanwhile waits for it
    or computes the same value."""
    def run() -> None:  # (the chain first: the Gantt's overlay reads it before the summary reads the starts)
        timeline.critical_tasks  # noqa: B018 (cached on the timeline)
        timeline.earliest_starts_s  # noqa: B018

    t = threading.Thread(target=run, name="soapbox-paths", daemon=True)
    t.start()
    return t


def _too_large(n: int, what: str) -> TooLargeError:
    from engine.taskgraph import count_text

    return TooLargeError(
        f"{what} would take {count_text(n, APP_MAX_TASKS)} tasks, more than the explorer simulates "
        f"({APP_MAX_TASKS:,}). "
        "Simulate it with the command line (soapbox simulate --strategy FILE), or use a layout whose "
        "replicas are alike (the layout panel's megatron or fsdp), which the explorer simulates once per "
        "set of identical GPUs, with fewer microbatches")


def check_size(graph: OpGraph, strategy: Strategy, what: str = "its simulation", cluster: Cluster | None = None) -> None:
    """Raise :class:`TooLargeError` when the simulation of ``strategy`` would be larger than
    the explorer's :data:`APP_MAX_TASKS`: without symmetry, or (``cluster`` given) with the
    engine's symmetry where it finds one (a plan of 500,000 microbatches is too large however
    alike its replicas). The quick bound first (microseconds); past the cap the symmetric bound
    (a layout on 1,024 GPUs: its one pipeline, ~25 ms), then the full estimate (~80 ms there)
    only when that is over the cap or no symmetry holds."""
    from engine.taskgraph import estimate_symmetric_tasks, quick_task_bound, symmetric_task_bound, tasks_within

    if cluster is not None and quick_task_bound(graph, strategy) > APP_MAX_TASKS:
        sym_n = symmetric_task_bound(graph, strategy, cluster)  # (a layout on many GPUs: its symmetry first)
        if sym_n is not None and sym_n <= APP_MAX_TASKS:
            return
    n = tasks_within(graph, strategy, APP_MAX_TASKS, cluster)
    if n <= APP_MAX_TASKS:
        return
    if cluster is None:
        raise _too_large(n, what)
    sym_n = estimate_symmetric_tasks(graph, strategy, cluster, full=n)  # (n itself when no symmetry holds)
    if sym_n > APP_MAX_TASKS:
        raise _too_large(sym_n, f"it has no exact symmetry: {what}" if sym_n == n else
                         f"{what}, one GPU per set of identical ones,")


def size_checked_key(state: dict) -> str:
    """The key under which ``app.sessions.Sessions.checked`` remembers that ``state``'s
    strategy passed :func:`check_size` with its cluster (set where the strategy was set, so
    that drawing it does not estimate it again: ~0.2 s on GPT-3 175B's 2,410 ops)."""
    return "size:" + content_key(state)


def valid_checked_key(state: dict) -> str:
    """The key under which ``app.sessions.Sessions.checked`` remembers that ``state``'s
    strategy was validated against its model and cluster where it was made (a layout or a
    baseline: the builder validates what it returns), so that drawing it does not validate it
    again (~10 ms on LLaMA-2 7B's 774 ops, ~40 ms on GPT-3 175B's 2,410)."""
    return "valid:" + content_key(state)


def workspace(state: dict, wait_s: float = MAX_WAIT_S) -> Workspace:
    """The session's workspace, brought in line with ``state`` (delta simulation when at most
    :data:`DELTA_LIMIT` ops differ from what it last simulated, else a full build). The
    state's strategy is checked against the model and cluster first (the state comes from the
    browser: it may be stale or crafted); an invalid one raises :class:`ValidationError`, one
    too large to simulate :class:`TooLargeError`. A build of the same state already running in
    the background (:func:`workspace_within`) is waited for (at most ``wait_s`` seconds, then
    :class:`TimeoutError`), not repeated."""
    b = current().build(state["sid"])
    if b is not None and b.key == content_key(state):
        try:
            return b.future.result(timeout=wait_s)
        except FutureTimeout:
            raise TimeoutError(f"this strategy is still being simulated ({b.phase}); try again in a moment") from None
        except CancelledError:
            pass  # (cancelled while we waited: build it here)
    return _workspace_now(state, None)


def workspace_shown(state: dict, wait_s: float = MAX_WAIT_S) -> Workspace | None:
    """The session's workspace for ``state`` when the page's views were last drawn for it,
    else None: while a simulation runs for the session, or when the views were last drawn for
    another version (a late request for an older state, or a newer one the Explore views are
    about to draw, with the options the page has then). A redraw of one view (the timeline's
    zoom or rows) goes through here: building an older state replaced the session's newer
    workspace, and its answer, arriving last, showed the older strategy's timeline; building
    the newer one here repeated the Explore views' build."""
    sessions = current()
    sid = state["sid"]
    if sessions.build(sid) is not None:
        return None
    last = sessions.last_drawn.get(sid)
    if isinstance(last, dict) and last.get("version") != state.get("version"):
        return None
    return workspace(state, wait_s)  # (drawn for this state, or drawn so long ago it was forgotten)


def workspace_within(state: dict, wait_s: float = INLINE_WAIT_S) -> Workspace | None:
    """The session's workspace if it is ready within ``wait_s`` seconds, else None: the build
    goes on in the background (:func:`build_status` tells how far; :func:`cancel_build` stops
    it). Errors (an invalid or too large strategy) are raised as by :func:`workspace`;
    :class:`app.sessions.Busy` when the server has too many simulations queued."""
    sid = state["sid"]
    sessions = current()
    ws = sessions.workspace(sid)
    if sessions.build(sid) is None and ws is not None and ws.version == state.get("version") \
            and ws.graph is graph_of(state) and ws.cluster is cluster_of(state) and ws.profile is profile_of(state):
        return _workspace_now(state, None)  # drawn before: no simulation (a cheap check)
    b = sessions.submit(sid, content_key(state), lambda b: _workspace_now(state, b))
    try:
        return b.future.result(timeout=wait_s)
    except FutureTimeout:
        return None
    except CancelledError:
        raise Cancelled("the simulation was cancelled") from None


def build_status(state: dict) -> dict[str, Any] | None:
    """What the session's background build of ``state`` is doing: ``phase`` and
    ``elapsed_s``; None when none is running for it."""
    b = current().build(str(state.get("sid", "")))
    if b is None or b.key != content_key(state):
        return None
    return {"phase": b.phase, "elapsed_s": time.monotonic() - b.started}


def cancel_build(sid: str) -> bool:
    """Stop the session's background build (one not started never starts; one running stops
    at its next check, within about a second); whether there was one."""
    return current().cancel(str(sid))


def _workspace_now(state: dict, build: Build | None) -> Workspace:
    def phase(text: str) -> None:
        if build is not None:
            if build.cancel.is_set():
                raise Cancelled("the simulation was cancelled")
            build.phase = text

    phase("checking the strategy")
    graph, cluster, profile = graph_of(state), cluster_of(state), profile_of(state)
    strategy = page_strategy(state)
    sid = state["sid"]
    sessions = current()
    ws = sessions.workspace(sid)
    if ws is not None and ws.graph is graph and ws.cluster is cluster and ws.profile is profile \
            and same_settings(ws.strategy, strategy):
        with ws.lock:
            if ws.strategy.configs == strategy.configs:  # (the same strategy under a new version)
                ws.version = state.get("version", 0)
                return ws
            changed = [op for op, c in strategy.configs.items() if ws.strategy.configs[op] != c]
            if len(changed) <= DELTA_LIMIT:
                key = content_key(state)
                if key not in sessions.checked:  # (an edit checked it already: apply_edit)
                    problems = [p for op in changed for p in ws.check(op, strategy.configs[op])]
                    if problems:
                        raise ValidationError(problems, "the page's strategy")
                    check_size(graph, strategy, "this strategy's full simulation (an edit breaks its symmetry)")
                sim = ws.editable()
                for op in changed:
                    sim.change(op, strategy.configs[op])
                sim.commit()  # (changes here are not undone one by one)
                ws.version = state.get("version", 0)
                ws.memory_cache = None
                return ws
    problems = [] if valid_checked_key(state) in sessions.checked else \
        validate_strategy(strategy, graph, cluster)  # every problem, with where (parsed once above)
    if problems:
        raise ValidationError(problems, "the page's strategy")
    ws = _full_workspace(graph, cluster, strategy, state.get("version", 0), build, phase, profile,
                         sized=size_checked_key(state) in sessions.checked)
    sessions.keep(sid, ws)
    return ws


def _full_workspace(graph: OpGraph, cluster: Cluster, strategy: Strategy, version: int,
                    build: Build | None, phase, profile: ProfileTable | None = None, sized: bool = False) -> Workspace:
    """A workspace simulated from scratch: with the engine's symmetry reduction when the
    strategy has an exact symmetry, else a delta simulator ready for edits (refused past
    :data:`APP_MAX_TASKS`). ``build``: the background build whose cancel event the engine's
    loops poll and where it says what it is doing. ``profile``: a measured table pricing the ops
    it has (the roofline prices the rest). ``sized``: :func:`check_size` with the cluster
    passed for this content already (:func:`size_checked_key`)."""
    from engine.sim.unfold import simulate_drawn
    from engine.taskgraph import tasks_within

    cancel = build.cancel if build is not None else None
    cost = CostModel(profile=profile)
    if not sized:
        check_size(graph, strategy, "this strategy's simulation", cluster)  # (with its symmetry, if any)
    phase("simulating one GPU per set of identical ones")
    try:  # the engine's one entry point, symmetric only: without an exact symmetry the delta simulator builds it;
        # a long pipeline's first microbatches simulated, every task drawn from their repeat (engine.sim.unfold)
        r, timeline = simulate_drawn(graph, strategy, cluster, cost, symmetry="only", cancel=cancel,
                                     account_memory=False)
    except TooLargeError:
        r = None
    if r is not None and r.tasks.info.get("device_image") is not None:
        return Workspace(graph, cluster, None, version, static=(strategy, timeline), profile=profile)
    n = tasks_within(graph, strategy, APP_MAX_TASKS, cluster)
    if n > APP_MAX_TASKS:
        raise _too_large(n, "this strategy has no exact symmetry: its simulation")
    phase(f"simulating every GPU (no exact symmetry), about {n / 1e6:.1f} M tasks")
    return Workspace(graph, cluster, DeltaSimulator(graph, strategy, cluster, cost, cancel=cancel), version,
                     profile=profile)


# --------------------------------------------------------------------------- baselines


def _baseline_of(state: dict, kind: str) -> tuple[float, float, bool] | None:
    """(iteration time s, communication bytes, fits in memory) of a baseline on the state's
    model and cluster, simulated once per pair (None when it cannot be built)."""
    from engine.sim.report import simulate_strategy

    g, c, p = graph_of(state), cluster_of(state), state.get("profile")
    key = (g.fingerprint, store.digest_of(c.to_dict()), kind, p["upload"] if p else "")
    cache = current().baselines
    hit = cache.get(key)
    if hit is not None:
        return hit or None
    if state.get("baseline") == kind and state["strategy"].get("found_by", {}).get("algorithm") == f"baseline:{kind}" \
            and not state.get("undo"):
        # the page shows the baseline itself: its simulation is the workspace's (no second one)
        ws = workspace(state)
        hit = (ws.timeline.makespan_s, ws.timeline.comm_bytes, bool(ws.memory.feasible))
    else:
        try:
            r = simulate_strategy(g, make_baseline(kind, g, c), c, CostModel(profile=profile_of(state)), check=False,
                                  symmetry="auto",
                                  max_tasks=APP_MAX_TASKS)
            hit = (r.iteration_time_s, r.timeline.comm_bytes, bool(r.memory.feasible))
        except (ValueError, SoapboxError):
            hit = ()
    cache.put(key, hit)
    return hit or None


def baseline_cost_s(state: dict, kind: str = "data-parallel") -> float | None:
    """Simulated iteration time of a baseline for the state's model and cluster (cached); None
    when it cannot be built or does not fit in memory (a speedup over it would mean nothing)."""
    hit = _baseline_of(state, kind)
    return hit[0] if hit and hit[2] else None


def baseline_fits(state: dict, kind: str = "data-parallel") -> bool | None:
    """Whether the baseline fits in memory (None when it cannot be built)."""
    hit = _baseline_of(state, kind)
    return hit[2] if hit else None


def baseline_comm_bytes(state: dict, kind: str = "data-parallel") -> float | None:
    """Bytes a baseline moves per iteration (the same cached simulation)."""
    hit = _baseline_of(state, kind)
    return hit[1] if hit else None

