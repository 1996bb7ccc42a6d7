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
import hashlib
import json
import threading
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from engine.cluster import Cluster, preset
from engine.delta import DeltaSimulator
from engine.errors import SoapboxError, ValidationError
from engine.formats import load_cluster, load_model, load_strategy, parse_json_text, resolve_model
from engine.graph import OpGraph
from engine.memory import MemoryReport, memory_report
from engine.models import sample_names
from engine.search.baselines import BASELINES, make_baseline
from engine.simulate import Timeline
from engine.strategy import Config, Strategy, strategy_from_dict

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
    "share_query",
    "state_from_query",
    "strategy_export",
    "parse_devices",
    "baseline_cost_s",
    "baseline_comm_bytes",
]

#: the explorer simulates every partition of every op on every device at each edit; beyond
#: these sizes an upload is refused with a pointer to the CLI (which reduces symmetric replicas)
MAX_APP_OPS = 20_000
MAX_APP_DEVICES = 1_024
DEFAULT_MODEL = "inception_v3"
DEFAULT_CLUSTER = "p100-4x4"
#: more ops changed than this between the cached simulation and the state: rebuild instead
_DELTA_LIMIT = 8
_MAX_SESSIONS = 32  # workspaces kept in memory (least recently used dropped first)


# --------------------------------------------------------------------------- models, clusters


@lru_cache(maxsize=16)
def _sample(name: str) -> OpGraph:
    return resolve_model(name)


@lru_cache(maxsize=16)
def _preset(name: str) -> Cluster:
    return preset(name)


_uploaded: "OrderedDict[str, Any]" = OrderedDict()  # content hash -> parsed graph or cluster
_uploaded_lock = threading.Lock()


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _from_upload(kind: str, data: dict) -> Any:
    key = kind + ":" + _digest(data)
    with _uploaded_lock:
        hit = _uploaded.get(key)
        if hit is not None:
            _uploaded.move_to_end(key)
            return hit
    obj = load_model(data) if kind == "model" else load_cluster(data)
    with _uploaded_lock:
        _uploaded[key] = obj
        while len(_uploaded) > 16:
            _uploaded.popitem(last=False)
    return obj


def graph_of(state: dict) -> OpGraph:
    m = state["model"]
    return _sample(m["name"]) if "data" not in m else _from_upload("model", m["data"])


def cluster_of(state: dict) -> Cluster:
    c = state["cluster"]
    return _preset(c["name"]) if "data" not in c else _from_upload("cluster", c["data"])


@lru_cache(maxsize=64)
def _baseline(model_key: str, cluster_key: str, kind: str, graph: OpGraph, cluster: Cluster
              ) -> tuple[float, float] | None:
    """(iteration time s, communication bytes) of a baseline, simulated once per pair."""
    from engine.report import simulate_strategy

    try:
        r = simulate_strategy(graph, make_baseline(kind, graph, cluster), cluster, check=False)
    except (ValueError, SoapboxError):
        return None
    return r.iteration_time_s, r.timeline.comm_bytes


def _baseline_of(state: dict, kind: str) -> tuple[float, float] | None:
    g, c = graph_of(state), cluster_of(state)
    return _baseline(g.fingerprint, _digest(c.to_dict()), kind, g, c)


def baseline_cost_s(state: dict, kind: str = "data-parallel") -> float | None:
    """Simulated iteration time of a baseline for the state's model and cluster (cached)."""
    hit = _baseline_of(state, kind)
    return hit[0] if hit else None


def baseline_comm_bytes(state: dict, kind: str = "data-parallel") -> float | None:
    """Bytes a baseline moves per iteration (the same cached simulation)."""
    hit = _baseline_of(state, kind)
    return hit[1] if hit else None


# --------------------------------------------------------------------------- state


def new_state(model: str = DEFAULT_MODEL, cluster: str = DEFAULT_CLUSTER, baseline: str = "data-parallel",
              sid: str | None = None) -> dict:
    """A fresh session state: a sample model on a preset cluster under a baseline strategy.

    Raises
    ------
    ValueError
        For an unknown sample, preset or baseline, or a baseline the pair cannot run.
    """
    if model not in sample_names():
        raise ValueError(f"unknown sample model {model!r}; samples: {', '.join(sample_names())}")
    _preset(cluster)  # raises ValueError naming the presets
    state = {"sid": sid or uuid.uuid4().hex, "model": {"name": model}, "cluster": {"name": cluster},
             "strategy": None, "undo": [], "redo": [], "version": 0, "compare": [], "selected": None}
    strategy = make_baseline(baseline, graph_of(state), cluster_of(state))
    state["strategy"] = strategy.to_dict()
    state["baseline"] = baseline
    return state


def _strategy(state: dict) -> Strategy:
    return strategy_from_dict(state["strategy"])


def _bump(state: dict) -> dict:
    state["version"] = state.get("version", 0) + 1
    return state


# --------------------------------------------------------------------------- workspaces


@dataclass
class Workspace:
    """The server's cache for one session: what the state's strategy simulates to."""

    graph: OpGraph
    cluster: Cluster
    sim: DeltaSimulator
    version: int = -1
    _memory: MemoryReport | None = field(default=None, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def strategy(self) -> Strategy:
        return self.sim.strategy

    @property
    def timeline(self) -> Timeline:
        return self.sim.timeline

    @property
    def memory(self) -> MemoryReport:
        if self._memory is None:
            self._memory = memory_report(self.graph, self.sim.strategy, self.cluster, self.sim.timeline)
        return self._memory


_workspaces: "OrderedDict[str, Workspace]" = OrderedDict()
_ws_lock = threading.Lock()


def _same_settings(a: Strategy, b: Strategy) -> bool:
    return (a.pipeline == b.pipeline and a.recompute == b.recompute and a.zero_stage == b.zero_stage
            and a.sequence_parallel == b.sequence_parallel and set(a.configs) == set(b.configs))


def workspace(state: dict) -> Workspace:
    """The session's workspace, brought in line with ``state`` (delta simulation when at most
    a few ops differ from what it last simulated, else a full build)."""
    graph, cluster = graph_of(state), cluster_of(state)
    strategy = _strategy(state)
    sid = state["sid"]
    with _ws_lock:
        ws = _workspaces.get(sid)
        if ws is not None:
            _workspaces.move_to_end(sid)
    if ws is not None and ws.graph is graph and ws.cluster is cluster and _same_settings(ws.strategy, strategy):
        with ws.lock:
            if ws.version == state.get("version") and ws.strategy.configs == strategy.configs:
                return ws
            changed = [op for op, c in strategy.configs.items() if ws.strategy.configs[op] != c]
            if len(changed) <= _DELTA_LIMIT:
                for op in changed:
                    ws.sim.change(op, strategy.configs[op])
                ws.sim._undo = None  # changes here are not undone one by one
                ws.version = state.get("version", 0)
                ws._memory = None
                return ws
    ws = Workspace(graph, cluster, DeltaSimulator(graph, strategy, cluster), state.get("version", 0))
    with _ws_lock:
        _workspaces[sid] = ws
        while len(_workspaces) > _MAX_SESSIONS:
            _workspaces.popitem(last=False)
    return ws


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
        for p in ws.sim.check(op, config):
            problems.append(str(p))
    if problems:
        return state, "Edit refused: " + "; ".join(problems)
    entries = [{"op": op, "before": strategy[op].to_dict(), "after": config.to_dict()}
               for op in ops if strategy[op] != config]
    if not entries:
        return state, "No change: the op already has that config."
    new = _with_configs(state, entries, "after")
    new["strategy"]["found_by"] = {"algorithm": "hand-edited", "from": state["strategy"].get("found_by", {})}
    new["strategy"]["cost"] = {}
    new["undo"] = state["undo"] + [entries]
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
    new[dst] = state[dst] + [entries]
    what = entries[0]["op"] if len(entries) == 1 else f"{len(entries)} ops"
    return _bump(new), f"{verb} the change to {what}."


def undo(state: dict) -> tuple[dict, str]:
    return _step(state, back=True)


def redo(state: dict) -> tuple[dict, str]:
    return _step(state, back=False)


def _set_strategy(state: dict, strategy: Strategy, message: str) -> tuple[dict, str]:
    """Replace the whole strategy as one undoable edit."""
    old = _strategy(state)
    new = copy.deepcopy(state)
    new["strategy"] = strategy.to_dict()
    entries = [{"op": op, "before": old[op].to_dict(), "after": c.to_dict()}
               for op, c in strategy.configs.items() if op in old.configs and old[op] != c]
    if _same_settings(old, strategy) and entries:
        new["undo"] = state["undo"] + [entries]
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
    new["baseline"] = kind
    return new, msg


def adopt_strategy(state: dict, strategy: Strategy, message: str) -> tuple[dict, str]:
    return _set_strategy(state, strategy, message)


def import_file(state: dict, text: str, filename: str) -> tuple[dict, str, bool]:
    """Import a model, cluster or strategy file (told apart by its ``format`` field).

    Returns (state, message, ok). A model or cluster replaces the current one (the strategy
    becomes data parallel on it); a strategy must fit the current model and cluster. On any
    problem the state is returned unchanged with every problem and where it is.
    """
    try:
        data = parse_json_text(text, filename)
    except (ValidationError, ValueError) as e:
        return state, str(e), False  # (the parser's message starts with the file name)
    fmt = data.get("format", "") if isinstance(data, dict) else ""
    kind = fmt.split("/")[0].removeprefix("soapbox.") if fmt.startswith("soapbox.") else ""
    try:
        if kind == "model":
            g = load_model(data)
            if len(g.ops) > MAX_APP_OPS:
                return state, (f"{filename}: {len(g.ops):,} ops is more than the explorer simulates interactively "
                               f"({MAX_APP_OPS:,}); use `soapbox simulate` / `soapbox search` for it"), False
            new = copy.deepcopy(state)
            new["model"] = {"name": g.name, "data": data}
            new["strategy"] = make_baseline("data-parallel", g, cluster_of(new)).to_dict()
            new.update(undo=[], redo=[], selected=None, baseline="data-parallel")
            return _bump(new), f"Loaded model {g.name} ({len(g.ops)} ops) from {filename}; strategy: data parallel.", True
        if kind == "cluster":
            c = load_cluster(data)
            if c.num_devices > MAX_APP_DEVICES:
                return state, (f"{filename}: {c.num_devices:,} devices is more than the explorer simulates "
                               f"interactively ({MAX_APP_DEVICES:,}); use `soapbox simulate` / `soapbox search`"), False
            new = copy.deepcopy(state)
            new["cluster"] = {"name": c.name, "data": data}
            new["strategy"] = make_baseline("data-parallel", graph_of(new), c).to_dict()
            new.update(undo=[], redo=[], baseline="data-parallel")
            return _bump(new), f"Loaded cluster {c.name} ({c.num_devices} GPUs) from {filename}; strategy: data parallel.", True
        if kind == "strategy":
            s = load_strategy(data, graph_of(state), cluster_of(state))
            new, _ = _set_strategy(state, s, "")
            return new, f"Imported strategy from {filename}.", True
    except (ValidationError, SoapboxError, ValueError) as e:
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
    if "data" in state["model"] or "data" in state["cluster"]:
        raise ValueError("a model or cluster loaded from a file cannot be shared by link; export the files instead")
    kind = state.get("baseline", "data-parallel")
    base = make_baseline(kind, graph_of(state), cluster_of(state))
    s = _strategy(state)
    diff = {op: c.to_dict() for op, c in s.configs.items() if base.configs.get(op) != c}
    payload = {"b": kind, "d": diff}
    if not _same_settings(base, s):
        payload["s"] = state["strategy"]
        payload.pop("d")
    blob = base64.urlsafe_b64encode(zlib.compress(json.dumps(payload, separators=(",", ":")).encode(), 9))
    return f"?model={state['model']['name']}&cluster={state['cluster']['name']}&s={blob.decode().rstrip('=')}"


def state_from_query(query: str, sid: str | None = None) -> tuple[dict, str]:
    """The state a share link encodes (see :func:`share_query`); raises ValueError naming
    what is wrong with the link."""
    from urllib.parse import parse_qs

    q = {k: v[0] for k, v in parse_qs(query.lstrip("?")).items()}
    state = new_state(q.get("model", DEFAULT_MODEL), q.get("cluster", DEFAULT_CLUSTER), sid=sid)
    if "s" not in q:
        return state, ""
    try:
        raw = q["s"] + "=" * (-len(q["s"]) % 4)
        payload = json.loads(zlib.decompress(base64.urlsafe_b64decode(raw)))
    except (ValueError, zlib.error) as e:
        raise ValueError(f"link: the strategy part ('s') is damaged ({e})") from None
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
                s = s.with_config(op, Config(c.get("degrees", {}), tuple(c["devices"])))
            s = load_strategy(s.to_dict(), graph_of(state), cluster_of(state))  # validates every config
    except (AttributeError, KeyError, TypeError) as e:
        raise ValueError(f"link: the strategy part ('s') is not a soapbox share ({type(e).__name__}: {e})") from None
    except (ValidationError, ValueError) as e:
        raise ValueError(f"link: {e}") from None
    state["strategy"] = s.to_dict()
    return state, "Loaded the shared strategy."
