"""Session state of the explorer, and the actions on it, as plain Python (no Dash).

The browser keeps one JSON-able *state* dict per session (a ``dcc.Store``): the model and
cluster (a sample/preset name, or an uploaded file's content), the strategy (the engine's
``soapbox.strategy/1`` dict), undo and redo stacks, the strategies kept for comparison and the
selected op. It is the single source of truth. The server keeps, per session id, a
:class:`Workspace` — the parsed graph and cluster and a :class:`engine.delta.DeltaSimulator`
— only as a cache: :func:`workspace` brings it in line with a state, by delta simulation when
a few ops changed, else by a full build. A restarted server loses nothing but time.

Every action takes a state and returns a new one (never mutating its argument) plus a message;
a refused action returns the state unchanged and says why.
"""

from __future__ import annotations

import base64
import copy
import math
import hashlib
import json
import re
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from engine.cluster import PRESETS, Cluster, preset, preset_names
from engine.delta import DeltaSimulator
from engine.errors import Problem, SoapboxError, TooLargeError, ValidationError
from engine.formats import load_cluster, load_model, load_strategy, parse_json_text, resolve_model
from engine.graph import OpGraph
from engine.memory import MemoryReport, memory_report
from engine.models import MAX_SAMPLE_BATCH, MAX_SAMPLE_SEQ, sample_names
from engine.search.baselines import BASELINES, make_baseline
from engine.simulate import Timeline
from engine.strategy import Config, Strategy, compact_strategy_dict, device_runs, devices_of_entry

from . import store
from .cache import IdleCache

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_CLUSTER",
    "Workspace",
    "new_state",
    "workspace",
    "graph_of",
    "cluster_of",
    "apply_edit",
    "undo",
    "redo",
    "select_baseline",
    "import_file",
    "add_to_compare",
    "MODEL_SIZES",
    "workspace_within",
    "check_page_strategy",
    "content_key",
    "fit_start",
    "fit_status",
    "family_sizes",
    "build_status",
    "drop_build",
    "APP_MAX_TASKS",
    "tour",
    "TOUR",
    "share_query",
    "state_from_query",
    "strategy_export",
    "parse_devices",
    "baseline_cost_s",
    "baseline_comm_bytes",
    "baseline_fits",
]

#: the explorer simulates every partition of every op on every device at each edit; beyond
#: these sizes an upload is refused with a pointer to the CLI (which reduces symmetric replicas)
MAX_APP_OPS = 20_000
MAX_APP_DEVICES = 1_024
#: device ids a page's strategy may list in all (GPT-3 175B on 1,024 GPUs: 2.5 M)
MAX_APP_DEVICE_IDS = 4 * 2**20
#: a share link longer than this is refused before decoding (a link names the configs that
#: differ from a baseline: a few KB; a whole 1,024-GPU strategy compresses to well under this)
MAX_LINK_CHARS = 256 * 1024
#: and one that inflates past this is refused while inflating (zlib bombs)
MAX_LINK_INFLATED_BYTES = 8 * 2**20
DEFAULT_MODEL = "inception_v3"
DEFAULT_CLUSTER = "p100-4x4"
#: more ops changed than this between the cached simulation and the state: rebuild instead
_DELTA_LIMIT = 8
#: undo (and redo) steps kept in a session's state
MAX_HISTORY = 100
_MAX_SESSIONS = 32  # workspaces kept in memory (least recently used dropped first)
#: the most tasks (estimated, without symmetry: :func:`engine.taskgraph.estimate_tasks`) the
#: explorer simulates; LLaMA-2 7B under FlexFlow's expert strategy on 64 GPUs is 11.2 M
#: estimated, 9.0 M built, 2.2 GB. Larger strategies are refused with what to do instead
#: (GPT-3 175B's expert strategy on 1,024 GPUs: 5.5 G tasks, which would exhaust the server).
APP_MAX_TASKS = 16_000_000
#: how long a request waits for a simulation before it answers and the simulation goes on in
#: the background (the page polls, shows progress and can go back)
INLINE_WAIT_S = 1.5


# --------------------------------------------------------------------------- models, clusters


@lru_cache(maxsize=16)
def _sample(name: str, batch: int | None = None, seq_len: int | None = None, precision: str | None = None) -> OpGraph:
    if name not in sample_names():  # a name from a request: never a path (see module docstring)
        raise ValueError(f"unknown sample model {str(name)[:80]!r}; samples: {', '.join(sample_names())}")
    return resolve_model(name, batch=batch, seq_len=seq_len, precision=precision)


#: the sizes a session may give a sample model (its state's model reference keeps those set)
MODEL_SIZES = ("batch", "seq_len", "precision")


_PRESET_NAME = re.compile(r"^(?P<base>[a-z0-9-]{1,40})(?::(?P<n>\d{1,12}))?$")


@lru_cache(maxsize=16)
def _preset(name: str) -> Cluster:
    """A cluster preset by name, refused before it is built when it has more devices than the
    explorer simulates (the device count of ``base:N`` is N times that of ``base:1``)."""
    m = _PRESET_NAME.match(str(name))
    if not m or m.group("base") not in PRESETS:
        raise ValueError(f"unknown cluster {str(name)[:80]!r}; presets: {', '.join(preset_names())}")
    if m.group("n") is not None and int(m.group("n")) > 1:
        per_node = _preset(f"{m.group('base')}:1").num_devices
        n = int(m.group("n"))
        if n * per_node > MAX_APP_DEVICES:
            raise ValueError(f"cluster {name}: {n * per_node:,} GPUs is more than the explorer simulates "
                             f"interactively ({MAX_APP_DEVICES:,}); use `soapbox simulate` / `soapbox search`")
    return preset(name)


_uploaded: "OrderedDict[str, Any]" = OrderedDict()  # kind:digest -> parsed graph or cluster
_uploaded_lock = threading.Lock()


def _from_upload(kind: str, sid: str, digest: str) -> Any:
    """The model or cluster session ``sid`` uploaded under ``digest`` (from the store; parsed
    objects are cached by content)."""
    key = f"{kind}:{digest}"
    with _uploaded_lock:
        hit = _uploaded.get(key)
        if hit is not None:
            _uploaded.move_to_end(key)
    st = store.current()
    if hit is not None and st.has_upload(sid, digest, kind):
        return hit
    data = None if hit is not None else st.get_upload(sid, digest, kind)
    if data is None:
        raise ValueError(f"the {kind} this page names ({digest[:12]}...) was not uploaded in this session (or has "
                         f"expired); upload it again")
    obj = load_model(data) if kind == "model" else load_cluster(data)
    with _uploaded_lock:
        _uploaded[key] = obj
        while len(_uploaded) > 16:
            _uploaded.popitem(last=False)
    return obj


def graph_of(state: dict) -> OpGraph:
    """The state's model: a sample, or a model this session uploaded; never a path."""
    m = state["model"]
    return _sample(m["name"], m.get("batch"), m.get("seq_len"), m.get("precision")) if "upload" not in m else \
        _from_upload("model", state["sid"], m["upload"])


def cluster_of(state: dict) -> Cluster:
    """The state's cluster: a preset, or a cluster this session uploaded; never a path."""
    c = state["cluster"]
    return _preset(c["name"]) if "upload" not in c else _from_upload("cluster", state["sid"], c["upload"])


def refs(state: dict) -> dict:
    """What names the state's model and cluster (for a search worker to resolve the same way)."""
    return {"sid": state["sid"], "model": dict(state["model"]), "cluster": dict(state["cluster"])}


@lru_cache(maxsize=64)
def _baseline(model_key: str, cluster_key: str, kind: str, graph: OpGraph, cluster: Cluster
              ) -> tuple[float, float, bool] | None:
    """(iteration time s, communication bytes, fits in memory) of a baseline, simulated once
    per pair."""
    from engine.report import simulate_strategy

    try:
        r = simulate_strategy(graph, make_baseline(kind, graph, cluster), cluster, check=False)
    except (ValueError, SoapboxError):
        return None
    return r.iteration_time_s, r.timeline.comm_bytes, bool(r.memory.feasible)


def _baseline_of(state: dict, kind: str) -> tuple[float, float, bool] | None:
    g, c = graph_of(state), cluster_of(state)
    key = (g.fingerprint, store.digest_of(c.to_dict()), kind)
    hit = _known_baselines.get(key)
    if hit is not None:
        return hit
    if state.get("baseline") == kind and state["strategy"].get("found_by", {}).get("algorithm") == f"baseline:{kind}" \
            and not state.get("undo"):
        # the page shows the baseline itself: its simulation is the workspace's (no second one)
        ws = workspace(state)
        hit = (ws.timeline.makespan_s, ws.timeline.comm_bytes, bool(ws.memory.feasible))
        if len(_known_baselines) > 256:
            _known_baselines.clear()
        _known_baselines[key] = hit
        return hit
    return _baseline(*key, g, c)


_known_baselines: dict[tuple, tuple[float, float, bool]] = {}


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


# --------------------------------------------------------------------------- state


def new_state(model: str = DEFAULT_MODEL, cluster: str = DEFAULT_CLUSTER, baseline: str = "data-parallel",
              sid: str | None = None, batch: int | None = None, seq_len: int | None = None,
              precision: str | None = None) -> dict:
    """A fresh session state: a sample model (at its default global batch, sequence length
    and precision, or ``batch`` samples, ``seq_len`` tokens, ``precision``) on a preset cluster
    under a baseline strategy.

    Raises
    ------
    ValueError
        For an unknown sample, preset or baseline, or a baseline the pair cannot run.
    """
    if model not in sample_names():
        raise ValueError(f"unknown sample model {model!r}; samples: {', '.join(sample_names())}")
    _preset(cluster)  # raises ValueError naming the presets
    ref = {"name": model, **{k: v for k, v in (("batch", batch), ("seq_len", seq_len), ("precision", precision))
                             if v is not None}}
    state = {"sid": sid or uuid.uuid4().hex, "model": ref, "cluster": {"name": cluster},
             "strategy": None, "undo": [], "redo": [], "version": 0, "compare": [], "selected": None}
    strategy = make_baseline(baseline, graph_of(state), cluster_of(state))
    state["strategy"] = _sdict(strategy)
    state["baseline"] = baseline
    return state


_NAME = {"type": "string", "minLength": 1, "maxLength": 200}
_REF = {"type": "object", "required": ["name"], "additionalProperties": False,
        "properties": {"name": _NAME, "upload": {"type": "string", "pattern": "^[0-9a-f]{32}$"}}}
#: a sample model, optionally at another global batch (samples), or an uploaded model
_MODEL_REF = {"type": "object", "required": ["name"], "additionalProperties": False,
              "properties": {**_REF["properties"], "batch": {"type": "integer", "minimum": 1,
                                                             "maximum": MAX_SAMPLE_BATCH},
                             "seq_len": {"type": "integer", "minimum": 1, "maximum": MAX_SAMPLE_SEQ},
                             "precision": {"enum": ["fp32", "fp16", "bf16"]}}}
_CONFIG = {"type": "object"}
_EDIT = {"type": "array", "maxItems": MAX_APP_OPS, "items": {
    "type": "object", "required": ["op", "before", "after"],
    "properties": {"op": {"type": "string", "maxLength": 1000}, "before": _CONFIG, "after": _CONFIG}}}
#: the shape of a session state as the browser sends it back (checked before any use: the
#: browser's storage may hold a state from an older soapbox, or a crafted one)
STATE_SCHEMA = {
    "type": "object",
    "required": ["sid", "model", "cluster", "strategy", "undo", "redo", "version", "compare"],
    "properties": {
        "sid": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "model": _MODEL_REF, "cluster": _REF,
        "strategy": {"type": "object", "required": ["format", "ops"]},
        "undo": {"type": "array", "maxItems": MAX_HISTORY, "items": _EDIT},
        "redo": {"type": "array", "maxItems": MAX_HISTORY, "items": _EDIT},
        "version": {"type": "integer", "minimum": 0, "maximum": 2**53},
        "compare": {"type": "array", "maxItems": 6, "items": {
            "type": "object", "required": ["name", "strategy"],
            "properties": {"name": _NAME, "strategy": {"type": "object"}, "cost_s": {"type": ["number", "null"]}}}},
        "selected": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": MAX_APP_OPS,
                                                  "items": {"type": "string", "maxLength": 1000}}]},
        "baseline": {"enum": list(BASELINES)},
        "collapse": {"type": "boolean"},
    },
}


@lru_cache(maxsize=1)
def _state_validator():
    import jsonschema_rs

    return jsonschema_rs.Draft202012Validator(STATE_SCHEMA)


def check_state(state: Any) -> None:
    """Raise :class:`ValidationError` naming the first thing wrong with a session state that
    came from the browser (its shape only; the strategy is checked against the model and
    cluster when it is simulated)."""
    try:
        json.dumps(state, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError) as e:
        raise ValidationError([Problem("", f"not a JSON state ({type(e).__name__})")], "the page's state") from None
    v = _state_validator()
    if not v.is_valid(state):
        e = next(iter(v.iter_errors(state)))
        where = ".".join(str(k) for k in e.instance_path) or "(top level)"
        raise ValidationError([Problem(where, e.message[:300])], "the page's state")


_parsed = IdleCache(64)  # strategy content digest -> Strategy


def check_page_strategy(data: Any, source: str = "the page's strategy") -> None:
    """The explorer's own bound on a strategy a page sends (the state's, or one kept for
    Compare), checked before it is parsed: at most :data:`MAX_APP_OPS` ops, and device runs
    standing for at most :data:`MAX_APP_DEVICES` devices an op and :data:`MAX_APP_DEVICE_IDS`
    in all (counted, never listed)."""
    from engine.device_runs import check_runs

    ops = data.get("ops") if isinstance(data, dict) else None
    if isinstance(ops, dict):
        if len(ops) > MAX_APP_OPS:
            raise ValueError(f"{source} has {len(ops):,} ops; the explorer takes up to {MAX_APP_OPS:,}")
        bad = check_runs(ops, MAX_APP_DEVICE_IDS, per_op=MAX_APP_DEVICES)
        if bad:
            raise ValidationError([Problem(p, m) for p, m in bad[:5]], source)


def _strategy(state: dict) -> Strategy:
    """The state's strategy, schema-checked (the state comes from the browser); parsed once per
    content (an edit's callbacks all ask for the same one)."""
    key = store.digest_of(state["strategy"])
    hit = _parsed.get(key)
    if hit is not None:
        return hit
    check_page_strategy(state["strategy"])
    try:
        s = load_strategy(state["strategy"])
    except ValidationError as e:
        raise e.with_source("the page's strategy") from None
    _parsed.put(key, s)
    return s


def trim_parsed(max_idle_s: float) -> int:
    """Forget parsed strategies unused for ``max_idle_s`` seconds; how many."""
    return _parsed.trim(max_idle_s)


def _bump(state: dict) -> dict:
    state["version"] = state.get("version", 0) + 1
    return state


# --------------------------------------------------------------------------- workspaces


@dataclass
class Workspace:
    """The server's cache for one session: what the state's strategy simulates to."""

    graph: OpGraph
    cluster: Cluster
    sim: DeltaSimulator | None
    version: int = -1
    _memory: MemoryReport | None = field(default=None, repr=False)
    used_at: float = field(default_factory=time.monotonic, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: (strategy, timeline) of a symmetric simulation (one representative per set of identical
    #: replicas, as the engine's symmetry reduction allows): no delta simulator is built until
    #: a hand edit needs one
    static: tuple[Strategy, Timeline] | None = field(default=None, repr=False)

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
            _check_size(self.graph, self.static[0], "a hand edit needs the full simulation (no symmetry): it")
            self.sim = DeltaSimulator(self.graph, self.static[0], self.cluster)
            self.static = None
            self._memory = None
        return self.sim

    def check(self, op: str, config: Config) -> list:
        """Problems with giving ``op`` ``config`` (the loader's verdict on the changed strategy)."""
        if self.sim is not None:
            return self.sim.check(op, config)
        from engine.strategy import validate_strategy

        return validate_strategy(self.strategy.with_config(op, config), self.graph, self.cluster)

    @property
    def memory(self) -> MemoryReport:
        if self._memory is None:
            self._memory = memory_report(self.graph, self.strategy, self.cluster, self.timeline)
        return self._memory


_workspaces: "OrderedDict[str, Workspace]" = OrderedDict()
_ws_lock = threading.RLock()  # (re-entered when a build's future completes inside it: cancel(), a build done at once)


def _same_settings(a: Strategy, b: Strategy) -> bool:
    return (a.pipeline == b.pipeline and a.recompute == b.recompute and a.zero_stage == b.zero_stage
            and a.sequence_parallel == b.sequence_parallel and set(a.configs) == set(b.configs))


def workspace(state: dict) -> Workspace:
    """The session's workspace, brought in line with ``state`` (delta simulation when at most
    a few ops differ from what it last simulated, else a full build). The state's strategy is
    checked against the model and cluster first (the state comes from the browser: it may be
    stale or crafted); an invalid one raises :class:`ValidationError`, one too large to
    simulate :class:`TooLargeError`. A build of the same state already running in the
    background (:func:`workspace_within`) is waited for, not repeated."""
    with _ws_lock:
        b = _builds.get(state["sid"])
    if b is not None and b.key == content_key(state):
        return b.future.result()
    return _workspace_now(state)


@dataclass
class _Build:
    """A workspace being built off the request path, for one session's state."""

    sid: str
    key: str
    started: float
    future: Future | None = None
    phase: str = "queued behind other simulations"


_builds: dict[str, _Build] = {}  # sid -> its running build
_dropped: dict[tuple[str, str], _Build] = {}  # (sid, content key) -> a build "Cancel" left running
#: background builds of every session (a queued build a session has moved on from is cancelled
#: before it starts); the smallest-cluster scans have a pool of their own
_build_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="soapbox-build")
_scan_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="soapbox-scan")


def content_key(state: dict) -> str:
    """A digest of what the state simulates: its model, cluster and strategy."""
    return hashlib.sha256(json.dumps([state["model"], state["cluster"], state["strategy"]], sort_keys=True)
                          .encode()).hexdigest()


def _forget_build(b: _Build) -> None:
    """(A build's future is done: no session waits for it any more.)"""
    with _ws_lock:
        if _builds.get(b.sid) is b:
            del _builds[b.sid]
        if _dropped.get((b.sid, b.key)) is b:
            del _dropped[(b.sid, b.key)]


def workspace_within(state: dict, wait_s: float = INLINE_WAIT_S) -> Workspace | None:
    """The session's workspace if it is ready within ``wait_s`` seconds, else None: the build
    goes on in the background (:func:`build_status` tells how far; :func:`workspace` waits for
    it). Errors (an invalid or too large strategy) are raised as by :func:`workspace`."""
    sid = state["sid"]
    key = content_key(state)
    with _ws_lock:
        ws = _workspaces.get(sid)
        b = _builds.get(sid)
    if b is None and ws is not None and ws.version == state.get("version") and ws.graph is graph_of(state) \
            and ws.cluster is cluster_of(state):
        return _workspace_now(state)  # drawn before: no simulation (a cheap check)
    with _ws_lock:
        b = _builds.get(sid)
        if b is None or b.key != key:
            if b is not None:
                b.future.cancel()  # (only one not started yet: the session has moved on from it)
            old = _dropped.pop((sid, key), None)  # this session's build that "Cancel" left running
            if old is not None and not old.future.done():
                b = _builds[sid] = old
            else:
                b = _builds[sid] = _Build(sid, key, time.monotonic())
                b.future = _build_pool.submit(_workspace_now, state, b)
                b.future.add_done_callback(lambda _f, b=b: _forget_build(b))
    try:
        return b.future.result(timeout=wait_s)
    except FutureTimeout:
        return None


def build_status(state: dict) -> dict[str, Any] | None:
    """What the session's background build of ``state`` is doing: ``phase`` and
    ``elapsed_s``; None when none is running for it."""
    with _ws_lock:
        b = _builds.get(state.get("sid", ""))
    if b is None or b.key != content_key(state):
        return None
    return {"phase": b.phase, "elapsed_s": time.monotonic() - b.started}


def drop_build(sid: str) -> bool:
    """Stop waiting for the session's background build (one not started is cancelled; one
    running cannot be interrupted: it finishes, and its result is kept for the state it was
    made for); whether one was queued or running."""
    with _ws_lock:
        b = _builds.pop(str(sid), None)
        if b is None:
            return False
        if not b.future.cancel() and not b.future.done():
            _dropped[(b.sid, b.key)] = b
        return True


def _too_large(n: int, what: str) -> TooLargeError:
    return TooLargeError(
        f"{what} would take about {n:,} tasks, more than the explorer simulates ({APP_MAX_TASKS:,}). "
        "Simulate it with the command line (soapbox simulate --strategy FILE), or use a layout whose "
        "replicas are alike (the layout panel's megatron or fsdp), which the explorer simulates once per "
        "set of identical GPUs, with fewer microbatches")


def _check_size(graph: OpGraph, strategy: Strategy, what: str = "its simulation", cluster: Cluster | None = None) -> None:
    """Raise :class:`TooLargeError` when the simulation of ``strategy`` would be larger than
    the explorer's :data:`APP_MAX_TASKS`: without symmetry, or (``cluster`` given) with the
    engine's symmetry where it finds one (a plan of 500,000 microbatches is too large however
    alike its replicas). The estimate first (milliseconds); the symmetry search only when the
    full estimate is over the cap."""
    from engine.taskgraph import estimate_symmetric_tasks, estimate_tasks

    n = estimate_tasks(graph, strategy)
    if n <= APP_MAX_TASKS:
        return
    if cluster is None:
        raise _too_large(n, what)
    sym_n = estimate_symmetric_tasks(graph, strategy, cluster)  # (n itself when no symmetry holds)
    if sym_n > APP_MAX_TASKS:
        raise _too_large(sym_n, f"it has no exact symmetry: {what}" if sym_n == n else
                         f"{what}, one GPU per set of identical ones,")


def _workspace_now(state: dict, build: _Build | None = None) -> Workspace:
    if build is not None:
        build.phase = "checking the strategy"
    graph, cluster = graph_of(state), cluster_of(state)
    strategy = _strategy(state)
    sid = state["sid"]
    with _ws_lock:
        ws = _workspaces.get(sid)
        if ws is not None:
            _workspaces.move_to_end(sid)
            ws.used_at = time.monotonic()
    if ws is not None and ws.graph is graph and ws.cluster is cluster and _same_settings(ws.strategy, strategy):
        with ws.lock:
            if ws.strategy.configs == strategy.configs:  # (the same strategy under a new version)
                ws.version = state.get("version", 0)
                return ws
            changed = [op for op, c in strategy.configs.items() if ws.strategy.configs[op] != c]
            if len(changed) <= _DELTA_LIMIT:
                problems = [p for op in changed for p in ws.check(op, strategy.configs[op])]
                if problems:
                    raise ValidationError(problems, "the page's strategy")
                _check_size(graph, strategy, "this strategy's full simulation (an edit breaks its symmetry)")
                sim = ws.editable()
                for op in changed:
                    sim.change(op, strategy.configs[op])
                sim._undo = None  # changes here are not undone one by one
                ws.version = state.get("version", 0)
                ws._memory = None
                return ws
    from engine.strategy import validate_strategy

    problems = validate_strategy(strategy, graph, cluster)  # every problem, with where (parsed once above)
    if problems:
        raise ValidationError(problems, "the page's strategy")
    ws = _full_workspace(graph, cluster, strategy, state.get("version", 0), build)
    with _ws_lock:
        _workspaces[sid] = ws
        while len(_workspaces) > _MAX_SESSIONS:
            _workspaces.popitem(last=False)
    return ws


def _full_workspace(graph: OpGraph, cluster: Cluster, strategy: Strategy, version: int,
                    build: _Build | None = None) -> Workspace:
    """A workspace simulated from scratch: with the engine's symmetry reduction when the
    strategy has an exact symmetry (an LLM layout on 64 GPUs: a few representatives instead of
    millions of tasks), else a delta simulator ready for edits (refused past
    :data:`APP_MAX_TASKS`). ``build``: where a background build says what it is doing."""
    from engine.simulate import simulate
    from engine.taskgraph import build_task_graph, estimate_tasks

    def phase(text: str) -> None:
        if build is not None:
            build.phase = text

    _check_size(graph, strategy, "this strategy's simulation", cluster)  # (with its symmetry, if any)
    phase("simulating one GPU per set of identical ones")
    try:  # (max_tasks 0: no full build when no exact symmetry holds; the delta simulator makes it)
        tg = build_task_graph(graph, strategy, cluster, max_tasks=0)
    except TooLargeError:
        tg = None
    if tg is not None and tg.info.get("device_image") is not None:
        return Workspace(graph, cluster, None, version, static=(strategy, simulate(tg)))
    n = estimate_tasks(graph, strategy)
    if n > APP_MAX_TASKS:
        raise _too_large(n, "this strategy has no exact symmetry: its simulation")
    phase(f"simulating every GPU (no exact symmetry), about {n / 1e6:.1f} M tasks")
    return Workspace(graph, cluster, DeltaSimulator(graph, strategy, cluster), version)


_forgotten = [0]  # workspaces dropped by forget() since the last evict_idle()


def forget(sid: str) -> bool:
    """Drop session ``sid``'s workspace (its tab was closed); whether there was one."""
    with _ws_lock:
        gone = _workspaces.pop(str(sid), None) is not None
        _forgotten[0] += gone
    return gone


def evict_idle(max_idle_s: float) -> int:
    """Drop workspaces unused for ``max_idle_s`` seconds; how many were dropped, counting
    those :func:`forget` dropped since the last call."""
    now = time.monotonic()
    with _ws_lock:
        old = [sid for sid, ws in _workspaces.items() if now - ws.used_at > max_idle_s]
        for sid in old:
            del _workspaces[sid]
        n, _forgotten[0] = len(old) + _forgotten[0], 0
    return n


def has_workspace(sid: str) -> bool:
    with _ws_lock:
        return sid in _workspaces


# --------------------------------------------------------------------------- actions


def parse_devices(text: str, n_devices: int) -> list[int]:
    """``"0-3, 8, 10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]``.

    Raises
    ------
    ValueError
        Naming the part that is not a device id or range, or a device the cluster lacks.
    """
    out: list[int] = []
    for part in (p.strip() for p in str(text).replace(";", ",").split(",")):
        if not part:
            continue
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                if b < a:
                    raise ValueError
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ValueError(f"devices: {part!r} is not a device id or a range like 0-3") from None
    if not out:
        raise ValueError("devices: none given (e.g. 0-3)")
    bad = [d for d in out if not 0 <= d < n_devices]
    if bad:
        raise ValueError(f"devices: {bad[0]} does not exist; this cluster has devices 0..{n_devices - 1}")
    return out


def apply_edit(state: dict, ops: list[str], degrees: dict[str, int], devices: list[int]) -> tuple[dict, str]:
    """Give every op in ``ops`` the config (``degrees``, ``devices``): one undoable edit.

    Returns the new state and a message; an invalid edit (for any of the ops) returns the
    state unchanged and every reason, with the op and field it concerns.
    """
    if not ops:
        return state, "Select an op first (click one in the graph or pick it in the editor)."
    graph = graph_of(state)
    strategy = _strategy(state)
    ws = workspace(state)
    config = Config({k: int(v) for k, v in degrees.items() if int(v) != 1}, tuple(devices))
    problems = []
    for op in ops:
        if op not in graph.index:
            problems.append(f"{op}: no such op in {graph.name}")
            continue
        for p in ws.check(op, config):
            problems.append(str(p))
    if problems:
        return state, "Edit refused: " + "; ".join(problems)
    edited = strategy
    for op in ops:
        edited = edited.with_config(op, config)
    try:  # (an edited strategy is simulated in full: an edit breaks the symmetry)
        _check_size(graph, edited, "a hand edit needs the full simulation (no symmetry): it")
    except TooLargeError as e:
        return state, f"Edit refused: {e}."
    entries = [{"op": op, "before": _cfg(strategy[op]), "after": _cfg(config)}
               for op in ops if strategy[op] != config]
    if not entries:
        return state, "No change: the op already has that config."
    new = _with_configs(state, entries, "after")
    origin = state["strategy"].get("found_by", {})
    if origin.get("algorithm") == "hand-edited":  # one level: what the hand edits started from
        origin = origin.get("from", {})
    new["strategy"]["found_by"] = {"algorithm": "hand-edited", "from": origin}
    new["strategy"]["cost"] = {}
    new["undo"] = (state["undo"] + [entries])[-MAX_HISTORY:]
    new["redo"] = []
    what = entries[0]["op"] if len(entries) == 1 else f"{len(entries)} ops"
    return _bump(new), f"Changed {what} to {_describe(config)}."


def _describe(config: Config) -> str:
    deg = " x ".join(f"{k} {v}" for k, v in config.degrees.items()) or "no split"
    devs = config.devices
    span = f"device {devs[0]}" if len(devs) == 1 else (
        f"devices {devs[0]}-{devs[-1]}" if list(devs) == list(range(devs[0], devs[-1] + 1)) else
        f"devices {', '.join(map(str, devs))}")
    return f"{deg} on {span}"


def _cfg(config: Config) -> dict:
    """A config as the state keeps it: its devices as runs (:func:`engine.strategy.device_runs`)."""
    return {"degrees": dict(config.degrees), "devices": device_runs(config.devices)}


def _sdict(strategy: Strategy) -> dict:
    """A strategy as the state keeps it: ``soapbox.strategy/1`` with devices as runs (the page
    sends the state with every action: GPT-3 on 1,024 GPUs was 9.2 MB as lists, past what a
    browser's sessionStorage holds, and the model dropdown snapped back). A layout's ops share
    devices: each set is written once."""
    data = strategy.to_dict()
    runs: dict[tuple[int, ...], str] = {}  # devices -> runs
    for name, cfg in strategy.configs.items():
        text = runs.get(cfg.devices)
        if text is None:
            text = runs[cfg.devices] = device_runs(cfg.devices)
        data["ops"][name]["devices"] = text
    return data


def _with_configs(state: dict, entries: list[dict], key: str) -> dict:
    """A copy of ``state`` whose strategy has each entry's ``key`` config; only what changes
    is copied (the state is never mutated: earlier states stay valid for undo)."""
    new = dict(state)
    new["strategy"] = dict(state["strategy"])
    ops = new["strategy"]["ops"] = dict(state["strategy"]["ops"])
    for e in entries:
        entry = {k: v for k, v in ops[e["op"]].items() if k not in ("degrees", "devices")}
        ops[e["op"]] = {**entry, **copy.deepcopy(e[key])}
    new["strategy"]["cost"] = {}
    return new


def _step(state: dict, back: bool) -> tuple[dict, str]:
    """Undo (``back``) or redo the last edit: move it from one stack to the other."""
    src, dst, key, verb = ("undo", "redo", "before", "Undid") if back else ("redo", "undo", "after", "Redid")
    if not state[src]:
        return state, f"Nothing to {src}."
    entries = state[src][-1]
    new = _with_configs(state, entries, key)
    new[src] = state[src][:-1]
    new[dst] = (state[dst] + [entries])[-MAX_HISTORY:]
    what = entries[0]["op"] if len(entries) == 1 else f"{len(entries)} ops"
    return _bump(new), f"{verb} the change to {what}."


def undo(state: dict) -> tuple[dict, str]:
    return _step(state, back=True)


def redo(state: dict) -> tuple[dict, str]:
    return _step(state, back=False)


def _set_strategy(state: dict, strategy: Strategy, message: str) -> tuple[dict, str]:
    """Replace the whole strategy as one undoable edit (refused, nothing changed, when the
    explorer could not simulate it: :data:`APP_MAX_TASKS`)."""
    try:
        _check_size(graph_of(state), strategy, cluster=cluster_of(state))
    except TooLargeError as e:
        return state, f"Not set: {e}."
    old = _strategy(state)
    new = copy.deepcopy(state)
    new["strategy"] = _sdict(strategy)
    entries = [{"op": op, "before": _cfg(old[op]), "after": _cfg(c)}
               for op, c in strategy.configs.items() if op in old.configs and old[op] != c]
    if _same_settings(old, strategy) and entries:
        new["undo"] = (state["undo"] + [entries])[-MAX_HISTORY:]
    else:  # settings (pipeline, ZeRO, ...) changed too: the history no longer applies
        new["undo"] = []
    new["redo"] = []
    return _bump(new), message


def select_baseline(state: dict, kind: str) -> tuple[dict, str]:
    if kind not in BASELINES:
        return state, f"Unknown baseline {kind!r}; baselines: {', '.join(BASELINES)}."
    try:
        s = make_baseline(kind, graph_of(state), cluster_of(state))
    except (ValueError, SoapboxError) as e:
        return state, f"{kind} cannot run here: {e}"
    new, msg = _set_strategy(state, s, f"Strategy set to the {kind} baseline.")
    if new is not state:  # (refused: the state stays as it was)
        new["baseline"] = kind
    return new, msg


#: the layout panel's integer fields (form name -> baseline option) and its choices
LAYOUT_INTS = {"tp": "tp", "pp": "pp", "cp": "cp", "vpp": "vpp", "mb": "micro_batch", "shard": "shard_group"}
LAYOUT_KINDS = ("megatron", "fsdp")


def apply_layout(state: dict, kind: str, form: dict[str, Any]) -> tuple[dict, str]:
    """The strategy a layout panel describes (Megatron or FSDP with tp / pp / cp / vpp /
    micro-batch / recomputation / ZeRO / sequence parallelism / fp8 / schedule), through the
    same baseline builders as the command line; refused with the builder's reason (nothing
    changes then). An empty field takes the builder's default; 0 or a fraction is refused."""
    if kind not in LAYOUT_KINDS:
        return state, f"Layout refused: kind must be {' or '.join(LAYOUT_KINDS)}, got {str(kind)[:30]!r}."
    opts: dict[str, Any] = {}
    for name, opt in LAYOUT_INTS.items():
        v = form.get(name)
        if v in (None, ""):
            continue
        try:
            f = float(v)
            ok = math.isfinite(f) and f == int(f) and 1 <= f <= 1 << 20
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            return state, f"Layout refused: {name} {str(v)[:20]!r} is not a whole number from 1."
        opts[opt] = int(f)
    if form.get("recompute") not in (None, ""):
        opts["recompute"] = str(form["recompute"])
    if form.get("zero") not in (None, ""):
        opts["zero_stage"] = int(form["zero"]) if str(form["zero"]).isdigit() else form["zero"]
    flags = set(form.get("flags") or [])
    if "sp" in flags:
        opts["sequence_parallel"] = True
    if "fp8" in flags:
        opts["fp8"] = True
    if form.get("schedule") not in (None, "") and kind == "megatron":
        opts["schedule"] = str(form["schedule"])
    if kind == "fsdp":
        opts.setdefault("zero_stage", 3)
        for k in ("vpp", "sequence_parallel", "schedule"):
            if opts.pop(k, None) not in (None, 1, False):
                return state, f"Layout refused: fsdp does not take {k.replace('_', ' ')} (pick megatron for it)."
    elif "shard_group" in opts:
        return state, "Layout refused: a shard group (hybrid sharding) applies to fsdp."
    try:
        s = make_baseline(kind, graph_of(state), cluster_of(state), **opts)
    except (ValueError, SoapboxError) as e:
        return state, f"Layout refused: {str(e).splitlines()[0][:300]}"
    o = s.found_by.get("options", {})
    parts = [f"{k} {o.get(k, 1)}" for k in ("tp", "pp", "cp", "dp", "vpp", "micro_batch")
             if o.get(k) not in (None, 1) or k in ("tp", "pp", "dp")]
    extra = [x for x in (f"ZeRO {s.zero_stage}" if s.zero_stage else "", f"recompute {s.recompute}"
                         if s.recompute != "none" else "", "sequence parallel" if s.sequence_parallel else "",
                         "fp8" if s.fp8 else "") if x]
    # the options the user gave, so that another cluster size rebuilds the layout from them (a
    # micro-batch the builder chose for 64 GPUs does not fit 512)
    s = replace(s, found_by={**s.found_by, "options": {**s.found_by.get("options", {}), "given": dict(opts)}})
    new, msg = _set_strategy(state, s, f"Layout ({kind}): {', '.join(parts + extra)}; "
                                       f"{s.pipeline.microbatches} microbatches.".replace("micro_batch", "micro-batch"))
    if new is state:  # (refused: the state stays as it was)
        return state, msg
    new["baseline"] = kind
    return new, msg


def adopt_strategy(state: dict, strategy: Strategy, message: str) -> tuple[dict, str]:
    return _set_strategy(state, strategy, message)


#: the problems a message shows (the rest are counted)
SHOWN_PROBLEMS = 5


def problems_summary(e: ValidationError) -> str:
    """A ValidationError in a few lines for the page: the root cause alone when there is one (a
    strategy for another model or cluster: every op's problem follows from it), else the first
    few problems and how many more."""
    head = f"{e.source}: " if e.source else ""
    root = [p for p in e.problems if p.path in ("model.fingerprint", "cluster.devices")]
    if root:
        rest = len(e.problems) - len(root)
        return head + "; ".join(str(p) for p in root) + (f" ({rest:,} other problems follow from it)" if rest else "")
    shown = "; ".join(str(p)[:300] for p in e.problems[:SHOWN_PROBLEMS])
    more = len(e.problems) - SHOWN_PROBLEMS
    return (f"{head}{len(e.problems):,} problem{'s' if len(e.problems) != 1 else ''}: {shown}"
            + (f" (+{more:,} more)" if more > 0 else ""))


def _cheap_size_problem(kind: str, data: dict) -> str | None:
    """A model with too many ops or a cluster with too many GPUs, told from the parsed file
    before any schema check or build (a 60,000-op file is refused in milliseconds)."""
    if kind == "model":
        ops = data.get("ops")
        if isinstance(ops, list) and len(ops) > MAX_APP_OPS:
            return (f"{len(ops):,} ops is more than the explorer simulates interactively ({MAX_APP_OPS:,}); "
                    f"use `soapbox simulate` / `soapbox search` for it")
    if kind == "cluster":
        total = 0
        for nd in data.get("nodes") or []:
            if isinstance(nd, dict):
                g, r = nd.get("gpus", 1), nd.get("repeat", 1)
                if isinstance(g, (int, float)) and isinstance(r, (int, float)) and g > 0 and r > 0:
                    total += g * r
        if total > MAX_APP_DEVICES:
            return (f"{total:,.0f} devices is more than the explorer simulates interactively ({MAX_APP_DEVICES:,}); "
                    f"use `soapbox simulate` / `soapbox search`")
    return None


def _adopt_model(state: dict, g: OpGraph, data: dict, filename: str, extra: str) -> tuple[dict, str, bool]:
    digest = store.current().put_upload(state["sid"], "model", g.name, data)
    new = copy.deepcopy(state)
    new["model"] = {"name": g.name, "upload": digest}
    new["strategy"] = _sdict(make_baseline("data-parallel", g, cluster_of(new)))
    new.update(undo=[], redo=[], selected=None, baseline="data-parallel", compare=[])
    return _bump(new), (f"Loaded model {g.name} ({len(g.ops)} ops) from {filename}; strategy: data parallel."
                        + extra), True


#: symbolic ONNX dimensions the explorer binds (the command line's --batch / --seq-len / --dim
#: set them otherwise)
ONNX_BATCH, ONNX_SEQ_LEN = 32, 512


def import_onnx_file(state: dict, raw: bytes, filename: str) -> tuple[dict, str, bool]:
    """Import an ONNX model (``engine.models.onnx_import``): symbolic dimensions bound to batch
    32 and sequence 512, ops without a soapbox kind imported as elementwise when they keep
    their shape; the message says both."""
    try:
        from engine.models.onnx_import import import_onnx

        g, notes = import_onnx(raw, batch=ONNX_BATCH, seq_len=ONNX_SEQ_LEN, unknown="elementwise",
                               source=filename[:200])
        data = g.to_dict()
        too_big = _cheap_size_problem("model", data)
        if too_big:
            return state, f"{filename}: {too_big}", False
        extra = "".join(f" Note: {n}." for n in notes)
        if any(n.startswith("symbolic") for n in notes):
            extra += " (The command line's soapbox import --batch/--seq-len/--dim set other sizes.)"
        return _adopt_model(state, g, data, filename, extra)
    except (ValidationError, SoapboxError, ValueError) as e:
        return state, f"{filename}: {e}", False


def import_file(state: dict, text: str, filename: str) -> tuple[dict, str, bool]:
    """Import a model, cluster or strategy file (told apart by its ``format`` field).

    Returns (state, message, ok). A model or cluster replaces the current one (the strategy
    becomes data parallel on it) and is kept in the store for this session, the state naming it
    by digest; a strategy must fit the current model and cluster. On any problem the state is
    returned unchanged with every problem and where it is.
    """
    try:
        data = parse_json_text(text, filename)
    except (ValidationError, ValueError) as e:
        return state, str(e), False  # (the parser's message starts with the file name)
    fmt = data.get("format", "") if isinstance(data, dict) else ""
    fmt = fmt if isinstance(fmt, str) else ""
    kind = fmt.split("/")[0].removeprefix("soapbox.") if fmt.startswith("soapbox.") else ""
    try:
        if kind in ("model", "cluster"):
            too_big = _cheap_size_problem(kind, data)
            if too_big:
                return state, f"{filename}: {too_big}", False
        if kind == "model":
            return _adopt_model(state, load_model(data), data, filename, "")
        if kind == "cluster":
            c = load_cluster(data)  # (its size was checked above, from the file)
            digest = store.current().put_upload(state["sid"], "cluster", c.name, data)
            new = copy.deepcopy(state)
            new["cluster"] = {"name": c.name, "upload": digest}
            new["strategy"] = _sdict(make_baseline("data-parallel", graph_of(new), c))
            new.update(undo=[], redo=[], baseline="data-parallel", compare=[])
            return _bump(new), f"Loaded cluster {c.name} ({c.num_devices} GPUs) from {filename}; strategy: data parallel.", True
        if kind == "strategy":
            s = load_strategy(data, graph_of(state), cluster_of(state))
            new, _ = _set_strategy(state, s, "")
            return new, f"Imported strategy from {filename}.", True
    except ValidationError as e:
        return state, f"{filename}: {problems_summary(e.with_source('') if e.source == '<data>' else e)}", False
    except (SoapboxError, ValueError) as e:
        return state, f"{filename}: {e}", False
    return state, (f"{filename}: not a soapbox file (its 'format' is {fmt!r}; expected soapbox.model/1, "
                   "soapbox.cluster/1 or soapbox.strategy/1)"), False


def add_to_compare(state: dict, name: str | None = None) -> tuple[dict, str]:
    ws = workspace(state)
    name = (name or "").strip() or f"#{len(state['compare']) + 1} {state['strategy'].get('found_by', {}).get('algorithm', 'strategy')}"
    if any(c["name"] == name for c in state["compare"]):
        return state, f"A compared strategy is already called {name!r}."
    if len(state["compare"]) >= 6:
        return state, "At most 6 strategies are compared at once; remove one first."
    new = copy.deepcopy(state)
    new["compare"].append({"name": name, "strategy": state["strategy"], "cost_s": ws.timeline.makespan_s})
    return new, f"Kept {name!r} for comparison ({len(new['compare'])} kept)."


def strategy_export(state: dict) -> dict:
    """The strategy file to download: self-describing, with its simulated cost."""
    ws = workspace(state)
    s = ws.strategy
    d = s.to_dict()
    g, c = ws.graph, ws.cluster
    d["model"] = {**d.get("model", {}), "name": g.name, "fingerprint": g.fingerprint}
    d["cluster"] = {**d.get("cluster", {}), "name": c.name, "devices": c.num_devices}
    d["cost"] = {"iteration_time_s": ws.timeline.makespan_s}
    return d


# --------------------------------------------------------------------------- share links


def share_query(state: dict) -> str:
    """A URL query (``?model=..&cluster=..&s=..``) that reproduces the state: the configs that
    differ from the baseline, zlib-compressed and base64url-encoded. Uploaded models and
    clusters are not in the link (the message says so)."""
    if "upload" in state["model"] or "upload" in state["cluster"]:
        raise ValueError("a model or cluster loaded from a file cannot be shared by link; export the files instead")
    kind = state.get("baseline", "data-parallel")
    base = make_baseline(kind, graph_of(state), cluster_of(state))
    s = _strategy(state)
    diff = {op: _cfg(c) for op, c in s.configs.items() if base.configs.get(op) != c}
    payload = {"b": kind, "d": diff}
    if not _same_settings(base, s):
        payload["s"] = state["strategy"]
        payload.pop("d")
    blob = base64.urlsafe_b64encode(zlib.compress(json.dumps(payload, separators=(",", ":")).encode(), 9))
    sizes = "".join(f"&{k}={state['model'][k]}" for k in MODEL_SIZES if k in state["model"])
    return f"?model={state['model']['name']}{sizes}&cluster={state['cluster']['name']}&s={blob.decode().rstrip('=')}"


def state_from_query(query: str, sid: str | None = None) -> tuple[dict, str]:
    """The state a share link encodes (see :func:`share_query`); raises ValueError naming
    what is wrong with the link."""
    from urllib.parse import parse_qs

    if len(query) > MAX_LINK_CHARS:
        raise ValueError(f"link: {len(query):,} characters is longer than a soapbox share link can be "
                         f"({MAX_LINK_CHARS:,})")
    q = {k: v[0] for k, v in parse_qs(query.lstrip("?")).items()}
    sizes: dict[str, Any] = {}
    for k in MODEL_SIZES:  # the sample model's batch, sequence length and precision, when the link sets them
        if k in q:
            v = q[k][:20]
            if k != "precision" and not v.isdigit():
                raise ValueError(f"link: {k} {v!r} is not a whole number")
            sizes[k] = v if k == "precision" else int(v)
    state = new_state(q.get("model", DEFAULT_MODEL), q.get("cluster", DEFAULT_CLUSTER), sid=sid, **sizes)
    if "s" not in q:
        return state, ""
    try:
        raw = q["s"] + "=" * (-len(q["s"]) % 4)
        inflater = zlib.decompressobj()
        text = inflater.decompress(base64.urlsafe_b64decode(raw), MAX_LINK_INFLATED_BYTES)
        if inflater.unconsumed_tail:
            raise ValueError(f"it inflates to more than {MAX_LINK_INFLATED_BYTES // 2**20} MiB")
        if not inflater.eof:
            raise ValueError("it is cut short")
        payload = parse_json_text(text.decode("utf-8"), "link")
    except ValidationError as e:
        raise ValueError(f"link: the strategy part ('s') is damaged ({e.problems[0]})") from None
    except (ValueError, zlib.error, UnicodeDecodeError) as e:
        raise ValueError(f"link: the strategy part ('s') is damaged ({e})") from None
    if not isinstance(payload, dict):
        raise ValueError("link: the strategy part ('s') is not a soapbox share")
    try:
        if "s" in payload:
            s = load_strategy(payload["s"], graph_of(state), cluster_of(state))
        else:
            kind = payload.get("b", "data-parallel")
            s = make_baseline(kind, graph_of(state), cluster_of(state))
            state["baseline"] = kind
            for op, c in payload.get("d", {}).items():
                if op not in s.configs:
                    raise ValueError(f"op {op!r} is not in {state['model']['name']}")
                s = s.with_config(op, Config(c.get("degrees", {}), devices_of_entry(c)))
            s = load_strategy(s.to_dict(), graph_of(state), cluster_of(state))  # validates every config
    except (AttributeError, KeyError, TypeError) as e:
        raise ValueError(f"link: the strategy part ('s') is not a soapbox share ({type(e).__name__}: {e})") from None
    except (ValidationError, ValueError) as e:
        raise ValueError(f"link: {e}") from None
    state["strategy"] = _sdict(s)
    return state, "Loaded the shared strategy."


# --------------------------------------------------------------------------- the guided comparison

#: the Learn tab's guided comparison: step -> (title, what it sets up, the tab it opens)
TOUR: dict[str, tuple[str, str, str]] = {
    "soap": ("1 · Data, model and expert parallelism on AlexNet",
             "AlexNet on FlexFlow's 16 P100s under data parallel, model parallel and the expert strategy "
             "(data parallel for the convolutions, model parallel for the large linear layers), kept side by "
             "side in Compare: see which moves the least data and why the expert split wins.", "compare"),
    "pipeline": ("2 · A pipeline and its bubble on GPT-2",
                 "GPT-2 (batch 64) on one DGX A100 as a 4-stage pipeline (x 2 data parallel), once with 4 "
                 "microbatches and once with 32, kept in Compare. Explore shows the 32-microbatch plan, a "
                 "timeline row per stage and its idle time hatched: the schedule's bubble (p−1)/(m+p−1) "
                 "shrinks from 43% to 9%; what idles beyond it is imbalance (the last stage also computes "
                 "the 50,257-word output layer) and waiting for transfers.", "explore"),
}


def tour(state: dict | None, step: str) -> tuple[dict, str]:
    """The state a guided-comparison step sets up (:data:`TOUR`), in the session of ``state``:
    its model, cluster and strategies, the ones to compare kept. Replaces what the page shows
    (the button says so)."""
    if step not in TOUR:
        return state or new_state(), f"Unknown step {str(step)[:30]!r}; steps: {', '.join(TOUR)}."
    sid = state.get("sid") if isinstance(state, dict) else None
    if step == "soap":
        s = new_state("alexnet", "p100-4x4", "data-parallel", sid=sid)
        s, _ = add_to_compare(s, "data parallel")
        for kind, name in (("model-parallel", "model parallel"), ("expert", "expert")):
            s, _ = select_baseline(s, kind)
            s, _ = add_to_compare(s, name)
    else:
        s = new_state("gpt2", "dgx-a100-80gb:1", "data-parallel", sid=sid, batch=64)
        for mb, name in ((8, "pp 4 · 4 microbatches"), (1, "pp 4 · 32 microbatches")):
            s, msg = apply_layout(s, "megatron", {"pp": 4, "mb": mb})
            if not msg.startswith("Layout"):
                raise ValueError(f"the guided step {step!r} could not be set up: {msg}")
            s, _ = add_to_compare(s, name)
    s = dict(s, undo=[], redo=[])
    return s, f"Guided comparison {TOUR[step][0]}: {TOUR[step][1]}"


# --------------------------------------------------------------------------- the smallest cluster that fits

@dataclass
class _FitScan:
    key: str
    layout: str
    rows: list = field(default_factory=list)
    done: bool = False
    error: str | None = None
    cancelled: bool = False


_fit_scans: dict[str, _FitScan] = {}  # sid -> the session's latest scan


#: the options a layout carries to another cluster size (the layout panel's, as the builders name them)
_GIVEN = ("tp", "pp", "cp", "vpp", "micro_batch", "shard_group", "recompute", "zero_stage", "sequence_parallel",
          "fp8", "schedule")


def _layout_options(strategy: Strategy) -> tuple[str, dict[str, Any], str] | None:
    """(baseline kind, the options that rebuild the strategy's layout on another cluster size,
    a description) for a strategy made by a baseline builder or the layout panel; None for a
    hand-edited or searched one (it has no layout to carry over)."""
    found = strategy.found_by or {}
    algo = str(found.get("algorithm", ""))
    if not algo.startswith("baseline:"):
        return None
    kind = algo.split(":", 1)[1]
    o = dict(found.get("options") or {})
    given = o.pop("given", None)
    if kind not in BASELINES:
        return None
    if isinstance(given, dict):  # the layout panel's: exactly what the user set (the builder's defaults else)
        o = {k: v for k, v in given.items() if k in _GIVEN and isinstance(v, (bool, int, str))}
    elif kind in ("megatron", "fsdp"):  # a file's or a starting baseline's: its degrees, not the micro-batch
        o = {k: v for k, v in o.items() if k in _GIVEN and k != "micro_batch" and isinstance(v, (bool, int, str))}
        o["zero_stage"] = strategy.zero_stage
        if kind == "megatron":
            o["fp8"] = strategy.fp8
            if strategy.pipeline.stages > 1:
                o["schedule"] = "interleaved" if strategy.pipeline.virtual_stages > 1 else strategy.pipeline.schedule
    else:
        o = {}
    shown = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in o.items()
                      if v not in (None, False, "none", 0, 1) or k in ("tp", "pp", "micro_batch"))
    return kind, o, f"{kind}" + (f" ({shown})" if shown else "")


def family_sizes(cluster_name: str) -> list[str]:
    """The preset clusters of ``cluster_name``'s family, smallest first, from one node up to
    the explorer's 1,024 GPUs (``dgx-a100-80gb:8`` -> ``dgx-a100-80gb:1`` ... ``:128``); empty
    for a preset without a node count or an uploaded cluster."""
    family, _, count = str(cluster_name).partition(":")
    entry = PRESETS.get(family)
    if not count or entry is None or not entry[1]:
        return []
    per_node = getattr(entry[0], "gpus_per_node", 8)
    return [f"{family}:{n}" for n in (1, 2, 4, 8, 16, 32, 64, 128) if n * per_node <= MAX_APP_DEVICES]


def fit_start(state: dict) -> str:
    """Start scanning the cluster family for the smallest size on which the state's layout fits
    (in the background: each size is a simulation); the message to show."""
    sid = state["sid"]
    if "data" in state["cluster"] or state["cluster"].get("upload"):
        return "The smallest cluster is found among presets with a node count (dgx-a100-80gb:N, ...), not for an uploaded cluster."
    sizes = family_sizes(state["cluster"].get("name", ""))
    if not sizes:
        return (f"{state['cluster'].get('name')} has no sizes to try: pick a preset with a node count "
                "(dgx-a100-80gb:N, dgx-h100:N, ...).")
    layout = _layout_options(_strategy(state))
    if layout is None:
        return ("This strategy was edited by hand or found by a search: it has no layout to carry to other sizes. "
                "Set one in the Layout panel (or pick a starting strategy) first.")
    kind, opts, text = layout
    key = content_key(state)
    with _ws_lock:
        old = _fit_scans.get(sid)
        if old is not None and old.key == key and not old.error:
            return f"Looking for the smallest cluster for {old.layout}." if not old.done else ""
        if old is not None:
            old.cancelled = True
            del _fit_scans[sid]
        scan = _fit_scans[sid] = _FitScan(key, text)
        while len(_fit_scans) > 64:  # (the oldest sessions' results go first)
            _fit_scans[next(iter(_fit_scans))].cancelled = True
            del _fit_scans[next(iter(_fit_scans))]
    graph = graph_of(state)

    def run() -> None:
        from engine.sweep import smallest_fit

        try:
            smallest_fit(graph, kind, opts, [preset(n) for n in sizes], max_tasks=APP_MAX_TASKS,
                         stop=lambda: scan.cancelled, progress=scan.rows.append)
        except Exception as e:  # (reported on the page, never raised into a request)
            scan.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        finally:
            scan.done = True

    _scan_pool.submit(run)
    return f"Looking for the smallest cluster for {text}…"


def fit_status(state: dict) -> tuple[str, bool] | None:
    """(text, done) of the session's scan for the state shown; None when it has none."""
    with _ws_lock:
        scan = _fit_scans.get(state.get("sid", ""))
    if scan is None or scan.key != content_key(state):
        return None
    tried = []
    found = None
    for r in scan.rows:
        name = r["cluster"]
        if r["feasible"]:
            found = r
        elif r["peak_memory_bytes"] is not None:
            tried.append(f"{name} ({r['gpus']:,} GPUs): {r['peak_memory_bytes'] / 1e9:,.1f} GB, over")
        else:
            tried.append(f"{name}: {r['why']}")
    head = f"Smallest cluster for {scan.layout}: "
    if found is not None:
        text = (f"{found['cluster']} ({found['gpus']:,} GPUs) fits, peak {found['peak_memory_bytes'] / 1e9:,.1f} GB of "
                f"{found['capacity_bytes'] / 1e9:,.1f} GB, {found['iteration_time_s']:.3g} s per iteration.")
    elif scan.error:
        text = f"stopped: {scan.error}."
    elif scan.done and scan.rows and all(r["peak_memory_bytes"] is None for r in scan.rows):
        text = f"it cannot be built on any size of this family up to 1,024 GPUs ({scan.rows[-1]['why']})."
    elif scan.done:
        text = ("none of this family's sizes up to 1,024 GPUs fits (try recomputation, ZeRO, more pipeline stages "
                "or a smaller micro-batch).")
    else:
        text = f"trying ({len(scan.rows)} size{'s' if len(scan.rows) != 1 else ''} so far)…"
    shown = tried[:4] + ([f"+{len(tried) - 4} more"] if len(tried) > 4 else [])
    return head + text + (" Tried: " + "; ".join(shown) + "." if shown else ""), scan.done
