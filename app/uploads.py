"""Files a user brings: a model, cluster, strategy or profile table (soapbox JSON, told apart
by its ``format``; a profile table: :mod:`app.profiles`) or an ONNX model. A model, cluster or
profile table is kept in the store for the session that uploaded it (and is drawn for that
session only: :mod:`app.sources`); a strategy must fit the current model and cluster. Sizes are checked before anything is parsed further.
"""

from __future__ import annotations

import base64
import binascii
import copy

from engine.errors import SoapboxError, ValidationError
from engine.formats import load_cluster, load_model, load_strategy, parse_json_text
from engine.graph import OpGraph
from engine.search.baselines import make_baseline
from engine.sim.report import tokens_per_sample

from .clients import client_address
from . import store
from .actions import problems_summary, set_strategy
from .fmt import format_bytes
from .components import first_line
from .sources import HF_UPLOAD, MAX_APP_OPS, cheap_size_problem, cluster_of, graph_of, hf_model
from .state import bump, strategy_dict

__all__ = ["decode_upload", "import_file", "import_hf_config", "import_onnx_file", "MAX_UPLOAD_BYTES", "ONNX_BATCH", "ONNX_SEQ_LEN"]

#: largest file accepted by the upload box (a GPT-3 model file is ~1 MB, a 20,000-op model ~6 MB)
MAX_UPLOAD_BYTES = 16_000_000
#: symbolic ONNX dimensions the explorer binds (the command line's --batch / --seq-len / --dim
#: set them otherwise)
ONNX_BATCH, ONNX_SEQ_LEN = 32, 512


def decode_upload(contents: str, filename: str, binary: bool = False) -> str | bytes:
    """The text (or with ``binary`` the bytes) of a ``dcc.Upload`` data URL; raises ValueError
    saying what is wrong."""
    if not isinstance(contents, str) or "," not in contents:
        raise ValueError(f"{filename}: empty upload")
    payload = contents.split(",", 1)[1]
    if len(payload) * 3 // 4 > MAX_UPLOAD_BYTES:
        raise ValueError(f"{filename}: larger than {format_bytes(MAX_UPLOAD_BYTES)}; soapbox files are far smaller")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{filename}: the upload is not valid base64 data") from None
    if binary:
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{filename}: not a UTF-8 text file (byte {e.start} is not text); "
                         "soapbox reads JSON files") from None


def _adopt_model(state: dict, g: OpGraph, data: dict, filename: str, extra: str,
                 head: str | None = None) -> tuple[dict, str, bool]:
    """The state with model ``g`` (kept in the store as ``data``) under data parallel; refused,
    keeping nothing, when data parallel cannot run it on the state's cluster (a precision its GPUs
    lack: the message says what to pick). ``head``: what the message says was loaded."""
    try:
        s = make_baseline("data-parallel", g, cluster_of(state))
    except ValidationError as e:
        hint = (" Pick a cluster whose GPUs have it first (the A100, H100, H200 and B200 presets)."
                if any("peak" in p.message for p in e.problems) else "")
        return state, (f"{filename}: {g.name} cannot run on {state['cluster'].get('name', 'this cluster')}: "
                       f"{'; '.join(p.message for p in e.problems[:3])}.{hint}"), False
    digest = store.current().put_upload(state["sid"], "model", g.name, data, client=client_address())
    new = copy.deepcopy(state)
    new["model"] = {"name": g.name[:200] or "model", "upload": digest}
    new["strategy"] = strategy_dict(s)
    new.update(undo=[], redo=[], selected=None, baseline="data-parallel", compare=[])
    head = head or f"Loaded model {g.name} ({len(g.ops)} ops) from {filename}"
    return bump(new), f"{head}; strategy: data parallel.{extra}", True


def import_onnx_file(state: dict, raw: bytes, filename: str) -> tuple[dict, str, bool]:
    """Import an ONNX model (``engine.models.onnx_import``): symbolic dimensions bound to batch
    32 and sequence 512, ops without a soapbox kind imported as elementwise when they keep
    their shape; the message says both."""
    try:
        from engine.models.onnx_import import import_onnx

        # sizes checked before anything is parsed: the bytes, then the nodes counted in the raw
        # file (constant and shape nodes fold away: 3 nodes an op), then the ops as they are built
        g, notes = import_onnx(raw, batch=ONNX_BATCH, seq_len=ONNX_SEQ_LEN, unknown="elementwise", fixed_batch="keep",
                               source=filename[:200], max_bytes=MAX_UPLOAD_BYTES, max_nodes=3 * MAX_APP_OPS,
                               max_ops=MAX_APP_OPS)
        data = g.to_dict()
        too_big = cheap_size_problem("model", data)
        if too_big:
            return state, f"{filename}: {too_big}", False
        extra = "".join(f" Note: {n}." for n in notes)
        if any(n.startswith("symbolic") for n in notes):
            extra += " (The command line's soapbox import --batch/--seq-len/--dim set other sizes.)"
        return _adopt_model(state, g, data, filename, extra)
    except (ValidationError, SoapboxError, ValueError) as e:
        return state, f"{filename}: {e}", False


def import_hf_config(state: dict, config: dict, filename: str) -> tuple[dict, str, bool]:
    """Import a Hugging Face ``config.json`` as ``soapbox import --hf`` does
    (:func:`app.sources.hf_model`): the config is kept, so the page's batch, sequence length and
    precision apply to it; it starts at :data:`~app.sources.HF_BATCH` sequences."""
    notes: list[str] = []
    try:
        g = hf_model(config, notes=notes)
    except (ValidationError, SoapboxError, ValueError) as e:
        return state, (f"{filename}: a Hugging Face config soapbox cannot import ({first_line(e)[:300]}); "
                       "the model types it reads are listed under soapbox import --hf in the README"), False
    if len(g.ops) > MAX_APP_OPS:
        return state, (f"{filename}: {len(g.ops):,} ops, more than the explorer takes ({MAX_APP_OPS:,}); "
                       "use soapbox import --hf and the command line"), False
    head = (f"Loaded model {g.name} ({len(g.ops)} ops, {g.param_count / 1e9:.2f} B parameters) from {filename}, a "
            f"Hugging Face config imported as soapbox import --hf does: {g.batch_size:,} sequences of "
            f"{tokens_per_sample(g) or 0:,} tokens in {g.precision} (set them in the header)")
    try:
        return _adopt_model(state, g, {"format": HF_UPLOAD, "config": config}, filename,
                            "".join(f" Note: {n}." for n in notes), head)
    except (SoapboxError, ValueError) as e:  # (the store full: said, nothing kept)
        return state, f"{filename}: {first_line(e)}", False


def import_file(state: dict, text: str, filename: str) -> tuple[dict, str, bool]:
    """Import a model, cluster or strategy file (told apart by its ``format`` field), or a
    Hugging Face ``config.json`` (it has a ``model_type`` and no ``format``).

    Returns (state, message, ok). A model or cluster replaces the current one (the strategy
    becomes data parallel on it) and is kept in the store for this session, the state naming it
    by digest; a strategy must fit the current model and cluster. On any problem the state is
    returned unchanged with every problem and where it is.
    """
    try:
        data = parse_json_text(text, filename)
    except (ValidationError, ValueError) as e:
        return state, str(e), False  # (the parser's message starts with the file name)
    if isinstance(data, dict) and "format" not in data and "model_type" in data:
        return import_hf_config(state, data, filename)
    fmt = data.get("format", "") if isinstance(data, dict) else ""
    fmt = fmt if isinstance(fmt, str) else ""
    kind = fmt.split("/")[0].removeprefix("soapbox.") if fmt.startswith("soapbox.") else ""
    try:
        if kind in ("model", "cluster"):
            too_big = cheap_size_problem(kind, data)
            if too_big:
                return state, f"{filename}: {too_big}", False
        if kind == "model":
            return _adopt_model(state, load_model(data), data, filename, "")
        if kind == "cluster":
            c = load_cluster(data)  # (its size was checked above, from the file)
            digest = store.current().put_upload(state["sid"], "cluster", c.name, data, client=client_address())
            new = copy.deepcopy(state)
            new["cluster"] = {"name": c.name[:200] or "cluster", "upload": digest}
            new["strategy"] = strategy_dict(make_baseline("data-parallel", graph_of(new), c))
            new.update(undo=[], redo=[], baseline="data-parallel", compare=[])
            return bump(new), f"Loaded cluster {c.name} ({c.num_devices} GPUs) from {filename}; strategy: data parallel.", True
        if kind == "profile":
            from .profiles import attach_profile

            return attach_profile(state, data, filename)
        if kind == "strategy":
            s = load_strategy(data, graph_of(state), cluster_of(state))
            new, msg = set_strategy(state, s, f"Imported strategy from {filename}.")
            return new, msg, new is not state
    except ValidationError as e:
        return state, f"{filename}: {problems_summary(e.with_source('') if e.source == '<data>' else e)}", False
    except (SoapboxError, ValueError) as e:
        return state, f"{filename}: {e}", False
    return state, (f"{filename}: not a soapbox file (its 'format' is {fmt[:40]!r}; expected soapbox.model/1, "
                   "soapbox.cluster/1, soapbox.strategy/1 or soapbox.profile/1, or a Hugging Face config.json "
                   "with its model_type)"), False
