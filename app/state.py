"""The page's state: its schema, a fresh one, and the strategy it holds.

The browser keeps one JSON-able *state* dict per session (a ``dcc.Store``): the model and
cluster (a sample/preset name, or an uploaded file's digest), the strategy (the engine's
``soapbox.strategy/1`` dict, devices written as runs), undo and redo stacks, the strategies
kept for comparison and the selected op. It is the single source of truth: every action
(:mod:`app.actions`) takes a state and returns a new one, never mutating its argument, and
every callback checks what it is sent against :data:`STATE_SCHEMA` first (the browser's
storage may hold a state from an older soapbox, or a crafted one).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import fields
from functools import lru_cache
from typing import Any, Mapping

import orjson
from engine.errors import Problem, ValidationError
from engine.formats import load_strategy
from engine.layout import option_of
from engine.models import MAX_SAMPLE_BATCH, MAX_SAMPLE_SEQ, sample_names
from engine.search.baselines import BASELINES, make_baseline
from engine.strategy import Config, Strategy
from engine.strategy.runs import device_runs

from .panel import SWITCHES
from .sessions import current
from .sources import (DEFAULT_CLUSTER, DEFAULT_MODEL, MAX_APP_DEVICE_IDS, MAX_APP_DEVICES, MAX_APP_OPS, cluster_of,
                      graph_of, preset_cluster)

__all__ = ["STATE_SCHEMA", "MAX_HISTORY", "MAX_COMPARED", "new_state", "blank_state", "check_state",
           "check_page_strategy", "page_strategy", "remember_strategy", "content_key", "memo_key", "strategy_dict",
           "config_dict", "bump", "same_settings", "new_sid", "issued", "switch_notes"]

#: undo (and redo) steps kept in a session's state
MAX_HISTORY = 100
#: strategies kept for Compare
MAX_COMPARED = 6

_NAME = {"type": "string", "minLength": 1, "maxLength": 200}
_REF = {"type": "object", "required": ["name"], "additionalProperties": False,
        "properties": {"name": _NAME, "upload": {"type": "string", "pattern": "^[0-9a-f]{32}$"}}}
#: a sample model, optionally at another global batch (samples), or an uploaded model
_MODEL_REF = {"type": "object", "required": ["name"], "additionalProperties": False,
              "properties": {**_REF["properties"], "batch": {"type": "integer", "minimum": 1,
                                                             "maximum": MAX_SAMPLE_BATCH},
                             "seq_len": {"type": "integer", "minimum": 1, "maximum": MAX_SAMPLE_SEQ},
                             "precision": {"enum": ["fp32", "tf32", "fp16", "bf16"]}}}
_RUNS = {"anyOf": [{"type": "string", "maxLength": 1 << 20},
                   {"type": "array", "maxItems": MAX_APP_DEVICES, "items": {"type": "integer"}}]}
_CONFIG = {"type": "object", "properties": {"degrees": {"type": "object", "maxProperties": 16,
                                                        "additionalProperties": {"type": "integer"}},
                                            "devices": _RUNS}}
_EDIT = {"type": "array", "maxItems": MAX_APP_OPS, "items": {
    "type": "object", "required": ["op", "before", "after"],
    "properties": {"op": {"type": "string", "maxLength": 1000}, "before": _CONFIG, "after": _CONFIG}}}
#: the shape of a session state as the browser sends it back (checked before any use)
STATE_SCHEMA = {
    "type": "object",
    "required": ["sid", "model", "cluster", "strategy", "undo", "redo", "version", "compare"],
    "properties": {
        "sid": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "model": _MODEL_REF, "cluster": _REF,
        "strategy": {"type": "object", "required": ["format", "ops"],
                     "properties": {"ops": {"type": "object", "maxProperties": MAX_APP_OPS}}},
        "undo": {"type": "array", "maxItems": MAX_HISTORY, "items": _EDIT},
        "redo": {"type": "array", "maxItems": MAX_HISTORY, "items": _EDIT},
        "version": {"type": "integer", "minimum": 0, "maximum": 2**53},
        "compare": {"type": "array", "maxItems": MAX_COMPARED, "items": {
            "type": "object", "required": ["name", "strategy"],
            "properties": {"name": _NAME, "strategy": {"type": "object", "required": ["format", "ops"]},
                           "cost_s": {"type": ["number", "null"]}}}},
        "selected": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": MAX_APP_OPS,
                                                  "items": {"type": "string", "maxLength": 1000}}]},
        "baseline": {"enum": list(BASELINES)},
        "collapse": {"type": "boolean"},
        #: an uploaded soapbox.profile/1 table pricing the ops it measured (absent: the roofline)
        "profile": {"type": "object", "required": ["name", "upload"], "additionalProperties": False,
                    "properties": {"name": _NAME, "upload": {"type": "string", "pattern": "^[0-9a-f]{32}$"}}},
    },
}


@lru_cache(maxsize=1)
def _state_validator():
    import jsonschema_rs

    return jsonschema_rs.Draft202012Validator(STATE_SCHEMA)


def check_state(state: Any) -> None:
    """Raise :class:`ValidationError` naming the first thing wrong with a session state that
    came from the browser (its shape only; the strategy is checked against the model and
    cluster when it is simulated).

    The same content is checked once: an edit's five views each send the new state, and the
    check (0.7 ms on a 25 kB state) was ~7% of a loaded server's time. Content that passed is
    remembered by :func:`memo_key`, which writes NaN as null: a request's JSON cannot hold NaN
    (:class:`app.guard.StrictJSONProvider`), so only a state made in process could pass as a
    twin that passed."""
    try:
        key = "state:" + memo_key(state)
    except (TypeError, ValueError, RecursionError):  # (not JSON-able: the check below says so)
        key = None
    passed = current().checked
    if key is not None and passed.get(key):
        return
    try:
        json.dumps(state, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError) as e:
        raise ValidationError([Problem("", f"not a JSON state ({type(e).__name__})")], "the page's state") from None
    v = _state_validator()
    if not v.is_valid(state):
        e = next(iter(v.iter_errors(state)))
        where = ".".join(str(k) for k in e.instance_path) or "(top level)"
        raise ValidationError([Problem(where, e.message[:300])], "the page's state")
    if not issued(state["sid"]):
        raise ValidationError([Problem("sid", "this session was not started by this server (reload the page)")],
                              "the page's state")
    if key is not None:
        passed.put(key, True)


def _signature(nonce: str) -> str:
    return hmac.new(current().secret(), nonce.encode("ascii"), hashlib.sha256).hexdigest()[:16]


def new_sid() -> str:
    """A fresh session id, issued by the server: 16 random hex digits and 16 of their HMAC
    (SHA-256) under the server's key. A page cannot invent one (:func:`issued`): what a
    session owns (its uploads, its searches) is reachable only from an id the server gave."""
    nonce = secrets.token_hex(8)
    return nonce + _signature(nonce)


def issued(sid: Any) -> bool:
    """Whether ``sid`` is a session id this server issued (:func:`new_sid`)."""
    if not isinstance(sid, str) or len(sid) != 32 or not sid.isascii():
        return False
    return hmac.compare_digest(sid[16:], _signature(sid[:16]))


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
    ref = {"name": model, **{k: v for k, v in (("batch", batch), ("seq_len", seq_len), ("precision", precision))
                             if v is not None}}
    state = blank_state(sid or new_sid(), ref, {"name": cluster})
    state["strategy"] = strategy_dict(make_baseline(baseline, graph_of(state), cluster_of(state)))
    state["baseline"] = baseline
    return state


def blank_state(sid: str, model: dict, cluster: dict) -> dict:
    """A session state on the model and cluster references ``model`` and ``cluster`` (a sample
    or preset by name, or this session's upload by digest), with no history and no strategy yet
    (``None``: the caller sets one).

    Raises
    ------
    ValueError
        For a name that is neither a sample model nor a preset cluster.
    """
    if "upload" not in model and model.get("name") not in sample_names():
        raise ValueError(f"unknown sample model {str(model.get('name'))[:80]!r}; samples: {', '.join(sample_names())}")
    if "upload" not in cluster:
        preset_cluster(cluster.get("name"))  # raises ValueError naming the presets
    return {"sid": sid, "model": dict(model), "cluster": dict(cluster), "strategy": None, "undo": [], "redo": [],
            "version": 0, "compare": [], "selected": None}


def check_page_strategy(data: Any, source: str = "the page's strategy") -> None:
    """The explorer's own bound on a strategy a page sends (the state's, or one kept for
    Compare), checked before it is parsed: at most :data:`MAX_APP_OPS` ops, and device runs
    standing for at most :data:`MAX_APP_DEVICES` devices an op and :data:`MAX_APP_DEVICE_IDS`
    in all (counted, never listed)."""
    from engine.strategy.runs import check_runs

    ops = data.get("ops") if isinstance(data, dict) else None
    if isinstance(ops, dict):
        if len(ops) > MAX_APP_OPS:
            raise ValueError(f"{source} has {len(ops):,} ops; the explorer takes up to {MAX_APP_OPS:,}")
        bad = check_runs(ops, MAX_APP_DEVICE_IDS, per_op=MAX_APP_DEVICES)
        if bad:
            raise ValidationError([Problem(p, m) for p, m in bad[:5]], source)


def page_strategy(state: dict) -> Strategy:
    """The state's strategy, schema-checked (the state comes from the browser); parsed once per
    content (an edit's callbacks all ask for the same one)."""
    key = memo_key(state["strategy"])
    cache = current().parsed
    hit = cache.get(key)
    if hit is not None:
        return hit
    check_page_strategy(state["strategy"])
    try:
        s = load_strategy(state["strategy"])
    except ValidationError as e:
        raise e.with_source("the page's strategy") from None
    cache.put(key, s)
    return s


def remember_strategy(state: dict, strategy: Strategy) -> None:
    """Keep ``strategy`` as what :func:`page_strategy` parses ``state``'s strategy into (an edit
    made the Strategy before its page form: the views of the edit need not parse it again,
    ~30 ms of an Inception-v3 edit's 90)."""
    current().parsed.put(memo_key(state["strategy"]), strategy)


def memo_key(data: Any) -> str:
    """A digest of a JSON-able value for the server's caches (SHA-256 of its JSON with sorted
    keys, 32 hex digits; never stored): orjson's, ~12x faster than ``json.dumps`` on a 25 kB
    state (0.06 against 0.77 ms), which every request of a page computes a few times. What orjson
    cannot write (an integer past 64 bits, a key that is not text, a lone surrogate) is written
    by ``json.dumps`` under another prefix. orjson writes NaN as null, so a value with NaN where
    another has null gets that one's key: a request's JSON cannot hold NaN
    (:class:`app.guard.StrictJSONProvider`)."""
    try:
        text = b"o" + orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # (orjson.JSONEncodeError is a TypeError)
        text = b"j" + json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8", "surrogatepass")
    return hashlib.sha256(text).hexdigest()[:32]


def content_key(state: dict) -> str:
    """A digest of what the state simulates: its model, cluster, strategy and profile table
    (and, for anything the session uploaded, the session: an upload is drawn for its owner only)."""
    profile = state.get("profile")
    owner = state["sid"] if "upload" in state["model"] or "upload" in state["cluster"] or profile else ""
    return memo_key([state["model"], state["cluster"], state["strategy"], owner] + ([profile] if profile else []))


def config_dict(config: Config) -> dict:
    """A config as the state keeps it: its devices as runs (:func:`engine.strategy.runs`)."""
    return {"degrees": dict(config.degrees), "devices": device_runs(config.devices)}


def strategy_dict(strategy: Strategy) -> dict:
    """A strategy as the state keeps it: ``soapbox.strategy/1`` with devices as runs (the page
    sends the state with every action: GPT-3 on 1,024 GPUs was 9.2 MB as lists, past what a
    browser's sessionStorage holds). A layout's ops share devices: each set is written once."""
    runs: dict[int, tuple[tuple[int, ...], str]] = {}  # id of a device tuple -> (it, its runs)

    def text(devices: tuple[int, ...]) -> str:
        # (by identity: a layout's ops share their tuples, and hashing 64 ints each is not free)
        hit = runs.get(id(devices))
        if hit is None or hit[0] is not devices:
            hit = runs[id(devices)] = (devices, device_runs(devices))
        return hit[1]
    return strategy.to_dict(text)  # (not lists replaced after: GPT-3 on 1,024 GPUs made 154,240 ints for nothing)


def bump(state: dict) -> dict:
    """``state`` with its version one higher (the page redraws a state whose version moved)."""
    state["version"] = state.get("version", 0) + 1
    return state


#: a strategy's settings beside its op configs: what op edits cannot change (two strategies
#: that differ in one of them are different simulations)
_SETTINGS = tuple(f.name for f in fields(Strategy) if f.name not in (
    "configs", "stage_of", "model_name", "model_fingerprint", "cluster_name", "cluster_devices", "found_by", "cost"))


def same_settings(a: Strategy, b: Strategy) -> bool:
    """Whether two strategies differ only in op configs (same pipeline, recomputation, ZeRO,
    sequence parallelism, fp8, overlap and offload switches, and ops): the one can be reached
    from the other by op edits."""
    return all(getattr(a, k, None) == getattr(b, k, None) for k in _SETTINGS) and set(a.configs) == set(b.configs)


_DEVICE_WORDS = {"cpu": "CPU", "nvme": "NVMe"}


def switch_notes(settings: Strategy | Mapping[str, Any]) -> list[str]:
    """The overlap and offload switches of a strategy (or of layout options; a missing one
    takes its default) that differ from the defaults, in words (each switch's
    :attr:`engine.layout.record.Option.short`), in :data:`app.panel.SWITCHES` order.

    >>> switch_notes({"overlap_grad_reduce": False, "offload_optimizer": "cpu", "zero_stage": 1})
    ['grad-reduce overlap off', 'optimizer offloaded to CPU']
    """
    get = settings.get if isinstance(settings, Mapping) else (lambda k, d: getattr(settings, k, d))
    out = []
    for name, default in SWITCHES.items():
        v = get(name, default)
        if v == default or v is None:
            continue
        words = option_of(name).short
        if isinstance(default, bool):
            out.append(words if v else f"{words} off")
        else:
            out.append(f"{words} {_DEVICE_WORDS.get(v, str(v)[:20])}")
    return out
