"""Where a page's model, cluster and profile table come from: a sample model or a preset cluster by name, or
a file this session uploaded, by content digest. Never a path: a name from a request is
looked up among the samples and presets only, and an upload is found only under the session
that uploaded it (:meth:`app.store.Store.get_upload` takes the session id and the digest).

Also the explorer's size bounds (what it simulates interactively; the command line has none of
these) and the cheap checks that apply them before any parse or build.
"""

from __future__ import annotations

import re
from typing import Any

from engine.cluster import PRESETS, Cluster, preset, preset_names
from engine.costs import CostModel, ProfileTable
from engine.formats import load_cluster, load_model, load_profile, resolve_model
from engine.graph import OpGraph
from engine.models import sample_names

from . import store
from .sessions import current

__all__ = ["graph_of", "cluster_of", "profile_of", "cost_of", "refs", "sample", "preset_cluster", "family_sizes", "cheap_size_problem",
           "hf_upload", "hf_model", "HF_UPLOAD", "HF_BATCH",
           "MODEL_SIZES", "DEFAULT_MODEL", "DEFAULT_CLUSTER", "MAX_APP_OPS", "MAX_APP_DEVICES", "MAX_APP_DEVICE_IDS",
           "APP_MAX_TASKS", "FAMILY_NODES"]

#: the explorer simulates every partition of every op on every device at each edit; beyond
#: these sizes an upload is refused with a pointer to the CLI (which reduces symmetric replicas)
MAX_APP_OPS = 20_000
MAX_APP_DEVICES = 1_024
#: device ids a page's strategy may list in all (GPT-3 175B on 1,024 GPUs: 2.5 M)
MAX_APP_DEVICE_IDS = 4 * 2**20
#: the most tasks (estimated, without symmetry: :func:`engine.taskgraph.estimate_tasks`) the
#: explorer simulates; LLaMA-2 7B under FlexFlow's expert strategy on 64 GPUs is 11.2 M
#: estimated, 9.0 M built, 2.2 GB. Larger strategies are refused with what to do instead
#: (GPT-3 175B's expert strategy on 1,024 GPUs: 5.5 G tasks, which would exhaust the server).
APP_MAX_TASKS = 16_000_000
DEFAULT_MODEL = "inception_v3"
DEFAULT_CLUSTER = "p100-4x4"
#: the sizes a session may give a sample model (its state's model reference keeps those set)
MODEL_SIZES = ("batch", "seq_len", "precision")
#: how an uploaded Hugging Face config.json is kept in the store: ``{"format": HF_UPLOAD,
#: "config": {...}}`` (the config, so that the page's batch, sequence and precision apply to it)
HF_UPLOAD = "soapbox.hf-config-upload"
#: the global batch (sequences) an uploaded Hugging Face config is imported at until the page
#: sets another: 1,024 sequences of 4,096 tokens is 4 M tokens, Llama 3's first global batch
HF_BATCH = 1024
#: node counts of a preset family the explorer offers (up to :data:`MAX_APP_DEVICES` GPUs)
FAMILY_NODES = (1, 2, 4, 8, 16, 32, 64, 128)

_PRESET_NAME = re.compile(r"^(?P<base>[a-z0-9-]{1,40})(?::(?P<n>\d{1,12}))?$")


def sample(name: str, batch: int | None = None, seq_len: int | None = None,
           precision: str | None = None) -> OpGraph:
    """A sample model by name (at another global batch in samples, sequence length in tokens or
    precision), the same object for the same arguments while it is cached.

    Raises
    ------
    ValueError
        For a name that is not a sample (never read as a path).
    """
    key = (str(name), batch, seq_len, precision)
    cache = current().samples
    hit = cache.get(key)
    if hit is not None:
        return hit
    if name not in sample_names():  # a name from a request: never a path
        raise ValueError(f"unknown sample model {str(name)[:80]!r}; samples: {', '.join(sample_names())}")
    g = resolve_model(name, batch=batch, seq_len=seq_len, precision=precision)
    cache.put(key, g)
    return cache.get(key)


def preset_cluster(name: str) -> Cluster:
    """A cluster preset by name, refused before it is built when it has more devices than the
    explorer simulates (the device count of ``base:N`` is N times that of ``base:1``).

    Raises
    ------
    ValueError
        For an unknown preset, or one past :data:`MAX_APP_DEVICES` GPUs.
    """
    cache = current().presets
    hit = cache.get(str(name))
    if hit is not None:
        return hit
    # (a preset with another network, ``dgx-h100:8+nics=4``: engine.cluster.network; the size
    # checked on the preset before anything is built)
    head, plus, _ = str(name)[:201].partition("+")
    if plus:
        if len(str(name)) > 200:
            raise ValueError(f"cluster {str(name)[:80]!r}...: a name of at most 200 characters")
        preset_cluster(head)
        cache.put(str(name), preset(str(name)))
        return cache.get(str(name))
    m = _PRESET_NAME.match(str(name))
    if not m or m.group("base") not in PRESETS:
        raise ValueError(f"unknown cluster {str(name)[:80]!r}; presets: {', '.join(preset_names())}")
    if m.group("n") is not None and int(m.group("n")) > 1:
        per_node = preset_cluster(f"{m.group('base')}:1").num_devices
        n = int(m.group("n"))
        if n * per_node > MAX_APP_DEVICES:
            raise ValueError(f"cluster {name}: {n * per_node:,} GPUs is more than the explorer simulates "
                             f"interactively ({MAX_APP_DEVICES:,}); use `soapbox simulate` / `soapbox search`")
    cache.put(str(name), preset(name))
    return cache.get(str(name))


def hf_upload(data: Any) -> bool:
    """Whether an upload's stored content is a Hugging Face config (:func:`hf_model`)."""
    return isinstance(data, dict) and data.get("format") == HF_UPLOAD and isinstance(data.get("config"), dict)


def hf_model(config: dict, sizes: tuple = (None, None, None), notes: list[str] | None = None) -> OpGraph:
    """The model a Hugging Face ``config.json`` describes, imported as ``soapbox import --hf``
    does (:func:`engine.models.hf.from_hf_config`), at ``sizes`` (global batch in sequences,
    sequence length in tokens, precision; None: :data:`HF_BATCH` sequences, the config's
    context up to 4,096 tokens, its dtype)."""
    from engine.models.hf import from_hf_config

    batch, seq_len, precision = sizes
    return from_hf_config(config, batch=batch or HF_BATCH, seq_len=seq_len, precision=precision,
                          name=str(config.get("model_type", "hf"))[:80], source="config.json", notes=notes)


def _from_upload(kind: str, sid: str, digest: str, sizes: tuple = (None, None, None)) -> Any:
    """The model or cluster session ``sid`` uploaded under ``digest`` (parsed objects are
    cached by content, but handed only to a session the store says uploaded it). A model kept
    as a Hugging Face config is built at ``sizes`` (batch, sequence length, precision)."""
    key = f"{kind}:{digest}:{sizes}"
    cache = current().uploads
    st = store.current()
    if not st.has_upload(sid, digest, kind):
        raise ValueError(f"the {kind} this page names ({digest[:12]}...) was not uploaded in this session (or has "
                         f"expired); upload it again")
    hit = cache.get(key)
    if hit is not None:
        return hit
    data = st.get_upload(sid, digest, kind)
    if data is None:
        raise ValueError(f"the {kind} this page names ({digest[:12]}...) has expired; upload it again")
    if kind == "model" and hf_upload(data):
        cache.put(key, hf_model(data["config"], sizes))
    else:
        cache.put(key, load_model(data) if kind == "model" else load_cluster(data) if kind == "cluster"
                  else load_profile(data))
    return cache.get(key)


def graph_of(state: dict) -> OpGraph:
    """The state's model: a sample, or a model this session uploaded (a Hugging Face config at
    the state's sizes); never a path."""
    m = state["model"]
    if "upload" in m:
        return _from_upload("model", state["sid"], m["upload"], tuple(m.get(k) for k in MODEL_SIZES))
    return sample(m["name"], m.get("batch"), m.get("seq_len"), m.get("precision"))


def cluster_of(state: dict) -> Cluster:
    """The state's cluster: a preset, or a cluster this session uploaded; never a path."""
    c = state["cluster"]
    return _from_upload("cluster", state["sid"], c["upload"]) if "upload" in c else preset_cluster(c["name"])


def profile_of(state: dict) -> ProfileTable | None:
    """The profile table the state names (one this session uploaded), or None (the roofline)."""
    p = state.get("profile")
    return _from_upload("profile", state["sid"], p["upload"]) if p else None


def cost_of(state: dict) -> CostModel | None:
    """The cost model the state's simulation uses: the profile table's measured times where it
    has them, else the roofline (None: the engine's default)."""
    table = profile_of(state)
    return CostModel(profile=table) if table is not None else None


def refs(state: dict) -> dict:
    """What names the state's model and cluster (for a search worker to resolve the same way)."""
    return {"sid": state["sid"], "model": dict(state["model"]), "cluster": dict(state["cluster"])}


def family_sizes(cluster_name: str) -> list[str]:
    """The preset clusters of ``cluster_name``'s family, smallest first, from one node up to
    the explorer's 1,024 GPUs (``dgx-a100-80gb:8`` -> ``dgx-a100-80gb:1`` ... ``:128``; a
    network after a ``+`` kept on each); empty for a preset without a node count or an
    uploaded cluster."""
    head, plus, net = str(cluster_name).partition("+")
    family, _, count = head.partition(":")
    entry = PRESETS.get(family)
    if not count or entry is None or not entry[1]:
        return []
    per_node = preset_cluster(f"{family}:1").gpus_per_node  # (a sized preset's N is its node count)
    return [f"{family}:{n}{plus}{net}" for n in FAMILY_NODES if n * per_node <= MAX_APP_DEVICES]


def cheap_size_problem(kind: str, data: dict) -> str | None:
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
