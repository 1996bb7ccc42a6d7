"""Share links: a URL query that reproduces a page's state (the configs that differ from a
baseline, compressed), and the state a link encodes, every part of it checked."""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any

from engine.errors import ValidationError
from engine.formats import load_strategy, parse_json_text
from engine.search.baselines import BASELINES, make_baseline
from engine.strategy import Config
from engine.strategy.runs import devices_of_entry

from .sources import DEFAULT_CLUSTER, DEFAULT_MODEL, MODEL_SIZES, cluster_of, graph_of
from .state import config_dict, new_state, page_strategy, same_settings, strategy_dict

__all__ = ["share_query", "state_from_query", "MAX_LINK_CHARS", "MAX_LINK_INFLATED_BYTES"]

#: a share link longer than this is refused before decoding (a link names the configs that
#: differ from a baseline: a few KB; a whole 1,024-GPU strategy compresses to well under this)
MAX_LINK_CHARS = 256 * 1024
#: and one that inflates past this is refused while inflating (zlib bombs)
MAX_LINK_INFLATED_BYTES = 8 * 2**20


def share_query(state: dict) -> str:
    """A URL query (``?model=..&cluster=..&s=..``) that reproduces the state: the configs that
    differ from the baseline, zlib-compressed and base64url-encoded. Uploaded models and
    clusters are not in the link (raises ValueError saying so)."""
    if "upload" in state["model"] or "upload" in state["cluster"]:
        raise ValueError("a model or cluster loaded from a file cannot be shared by link; export the files instead")
    kind = state.get("baseline", "data-parallel")
    base = make_baseline(kind, graph_of(state), cluster_of(state))
    s = page_strategy(state)
    diff = {op: config_dict(c) for op, c in s.configs.items() if base.configs.get(op) != c}
    payload: dict[str, Any] = {"b": kind, "d": diff}
    if not same_settings(base, s):
        payload["s"] = state["strategy"]
        payload.pop("d")
    blob = base64.urlsafe_b64encode(zlib.compress(json.dumps(payload, separators=(",", ":")).encode(), 9))
    sizes = "".join(f"&{k}={state['model'][k]}" for k in MODEL_SIZES if k in state["model"])
    return f"?model={state['model']['name']}{sizes}&cluster={state['cluster']['name']}&s={blob.decode().rstrip('=')}"


def _payload(blob: str) -> Any:
    try:
        raw = blob + "=" * (-len(blob) % 4)
        inflater = zlib.decompressobj()
        text = inflater.decompress(base64.urlsafe_b64decode(raw), MAX_LINK_INFLATED_BYTES)
        if inflater.unconsumed_tail:
            raise ValueError(f"it inflates to more than {MAX_LINK_INFLATED_BYTES // 2**20} MiB")
        if not inflater.eof:
            raise ValueError("it is cut short")
        return parse_json_text(text.decode("utf-8"), "link")
    except ValidationError as e:
        raise ValueError(f"link: the strategy part ('s') is damaged ({e.problems[0]})") from None
    except (ValueError, zlib.error, UnicodeDecodeError) as e:
        raise ValueError(f"link: the strategy part ('s') is damaged ({e})") from None


def state_from_query(query: str, sid: str | None = None) -> tuple[dict, str]:
    """The state a share link encodes (see :func:`share_query`); raises ValueError naming
    what is wrong with the link."""
    from urllib.parse import parse_qs

    query = query if isinstance(query, str) else ""
    if len(query) > MAX_LINK_CHARS:
        raise ValueError(f"link: {len(query):,} characters is longer than a soapbox share link can be "
                         f"({MAX_LINK_CHARS:,})")
    q = {k: v[0] for k, v in parse_qs(query.lstrip("?")).items()}
    sizes: dict[str, Any] = {}
    for k in MODEL_SIZES:  # the sample model's batch, sequence length and precision, when the link sets them
        if k in q:
            v = q[k][:20]
            if k != "precision" and not (v.isascii() and v.isdigit()):
                raise ValueError(f"link: {k} {v!r} is not a whole number")
            sizes[k] = v if k == "precision" else int(v)
    state = new_state(q.get("model", DEFAULT_MODEL), q.get("cluster", DEFAULT_CLUSTER), sid=sid, **sizes)
    if "s" not in q:
        return state, ""
    payload = _payload(q["s"])
    if not isinstance(payload, dict):
        raise ValueError("link: the strategy part ('s') is not a soapbox share")
    try:
        if "s" in payload:
            s = load_strategy(payload["s"], graph_of(state), cluster_of(state))
        else:
            kind = payload.get("b", "data-parallel")
            if kind not in BASELINES:
                raise ValueError(f"the baseline {str(kind)[:40]!r} is not one of {', '.join(BASELINES)}")
            s = make_baseline(kind, graph_of(state), cluster_of(state))
            state["baseline"] = kind
            diff = payload.get("d", {})
            if not isinstance(diff, dict):
                raise ValueError("its configs ('d') are not a mapping of op to config")
            for op, c in diff.items():
                if op not in s.configs:
                    raise ValueError(f"op {str(op)[:80]!r} is not in {state['model']['name']}")
                if not isinstance(c, dict):
                    raise ValueError(f"op {str(op)[:80]!r}: its config is not an object")
                s = s.with_config(op, Config(c.get("degrees", {}), devices_of_entry(c)))
            s = load_strategy(s.to_dict(), graph_of(state), cluster_of(state))  # validates every config
    except (AttributeError, KeyError, TypeError) as e:
        raise ValueError(f"link: the strategy part ('s') is not a soapbox share ({type(e).__name__}: {e})") from None
    except (ValidationError, ValueError) as e:
        raise ValueError(f"link: {e}") from None
    state["strategy"] = strategy_dict(s)
    return state, "Loaded the shared strategy."
