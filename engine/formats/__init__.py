"""Versioned JSON formats: loading, validation and saving of models, clusters and strategies.

Every file has a ``format`` field naming its kind and version (``soapbox.model/1``,
``soapbox.cluster/1``, ``soapbox.strategy/1``) and a published JSON Schema in
``engine/formats/schemas/``. Loading checks the schema (reporting *every* violation with its
path in the file), then the meaning (shapes, cycles, divisibility, devices), and raises one
:class:`~engine.errors.ValidationError` listing all problems: never a traceback, never a
half-loaded object. Files are parsed with :func:`json.loads` only; nothing is evaluated or
unpickled. Saving writes a temporary file and renames it, so a failed save never truncates
the file a user already had.
"""

from __future__ import annotations

import json
import os
import tempfile
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import jsonschema_rs

from ..cluster import Cluster, cluster_from_dict, preset
from ..errors import Problem, ValidationError
from ..graph import OpGraph, graph_from_dict
from ..strategy import Strategy, strategy_from_dict, validate_strategy

__all__ = [
    "FORMATS",
    "MAX_FILE_BYTES",
    "read_json",
    "schema",
    "schema_problems",
    "load_model",
    "load_cluster",
    "load_strategy",
    "resolve_model",
    "resolve_cluster",
    "dumps",
    "save_json",
    "validate_file",
]

#: Format id -> schema file. The version after the slash is bumped on incompatible change.
FORMATS = {
    "soapbox.model/1": "model.schema.json",
    "soapbox.cluster/1": "cluster.schema.json",
    "soapbox.strategy/1": "strategy.schema.json",
    "soapbox.profile/1": "profile.schema.json",
}
#: Files larger than this are refused before parsing (a 1536-GPU GPT-3 strategy is ~5 MB).
MAX_FILE_BYTES = 256 * 2**20


@lru_cache(maxsize=None)
def schema(format_id: str) -> dict[str, Any]:
    """The JSON Schema of ``format_id`` (e.g. ``"soapbox.model/1"``)."""
    text = resources.files(__package__).joinpath("schemas", FORMATS[format_id]).read_text("utf-8")
    return json.loads(text)


@lru_cache(maxsize=None)
def _validator(format_id: str):
    # jsonschema-rs (Rust) checks a 1536-GPU strategy (~350k entries) in ~10 ms, where the
    # pure-Python jsonschema takes ~12 s; both implement Draft 2020-12.
    return jsonschema_rs.Draft202012Validator(schema(format_id))


def read_json(path: str | os.PathLike) -> Any:
    """Parse a JSON file; raise :class:`ValidationError` naming the file and the place of
    the first syntax error (a truncated file reports its last line)."""
    p = Path(path)
    src = str(p)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise ValidationError([Problem("", "file not found")], src) from None
    except OSError as exc:
        raise ValidationError([Problem("", f"cannot read: {exc.strerror}")], src) from None
    if p.is_dir():
        raise ValidationError([Problem("", "is a folder, not a JSON file")], src)
    if size > MAX_FILE_BYTES:
        raise ValidationError([Problem("", f"file is {size / 2**20:.0f} MiB; the limit is "
                                           f"{MAX_FILE_BYTES // 2**20} MiB")], src)
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError([Problem("", f"not UTF-8 text (byte {exc.start})")], src) from None
    return parse_json_text(text, src)


def parse_json_text(text: str, source: str = "<input>") -> Any:
    """Parse JSON text with errors that say where (line and column) and what."""
    if not text.strip():
        raise ValidationError([Problem("", "empty file: expected a JSON object")], source)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        hint = " (the file looks truncated)" if exc.pos >= len(text.rstrip()) else ""
        raise ValidationError([Problem(f"line {exc.lineno} column {exc.colno}",
                                       f"invalid JSON: {exc.msg}{hint}")], source) from None


def _render_path(data: Any, path: list[Any]) -> str:
    """``["ops", 3, "attrs", "kernel"]`` -> ``ops[3] (conv1).attrs.kernel``."""
    out = ""
    node = data
    for key in path:
        if isinstance(key, int):
            out += f"[{key}]"
            try:
                node = node[key]
            except (IndexError, KeyError, TypeError):
                node = None
            if isinstance(node, Mapping) and isinstance(node.get("name"), str):
                out += f" ({node['name']})"
        else:
            out += f".{key}" if out else str(key)
            node = node.get(key) if isinstance(node, Mapping) else None
    return out


def _check_format(data: Any, want: str | None) -> str:
    if not isinstance(data, dict):
        raise ValidationError([Problem("", f"expected a JSON object at the top level, got {type(data).__name__}")])
    fmt = data.get("format")
    if fmt is None:
        expected = want or " or ".join(FORMATS)
        raise ValidationError([Problem("format", f"missing; expected {expected!r}")])
    if not isinstance(fmt, str):
        example = want or "soapbox.model/1"
        raise ValidationError([Problem("format", f"must be a string such as {example!r}, got {type(fmt).__name__}")])
    if fmt not in FORMATS:
        kind = fmt.split("/")[0]
        known = [f for f in FORMATS if f.split("/")[0] == kind]
        if known:
            msg = f"version {fmt!r} is not supported; this soapbox reads {', '.join(known)}"
        else:
            msg = f"unknown format {fmt!r}; known: {', '.join(FORMATS)}"
        raise ValidationError([Problem("format", msg)])
    if want and fmt != want:
        raise ValidationError([Problem("format", f"this is a {fmt} file; expected {want}")])
    return fmt


def _schema_at(root: Mapping[str, Any], path: list[Any]) -> Any:
    node: Any = root
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _unit_hint(path: list[Any]) -> str:
    """`` (bytes/s)`` for a field named ``..._bytes_per_s`` and so on: units live in names."""
    name = next((k for k in reversed(path) if isinstance(k, str)), "")
    for suffix, unit in (("_bytes_per_s", " bytes/s"), ("_bytes", " bytes"), ("_s", " s"), ("_per_s", " per s")):
        if name.endswith(suffix):
            return f" ({unit.strip()})"
    return ""


def schema_problems(data: Any, format_id: str) -> list[Problem]:
    """Every JSON Schema violation of ``data`` against ``format_id``, in file order."""
    validator = _validator(format_id)
    if validator.is_valid(data):
        return []
    root = schema(format_id)
    problems = []
    for e in validator.iter_errors(data):
        msg = e.message
        spath = list(e.schema_path)
        keyword = spath[-1] if spath else ""
        if keyword in ("minimum", "exclusiveMinimum"):
            limit = _schema_at(root, spath)
            unit = _unit_hint(list(e.instance_path))
            msg = (f"must be {'greater than' if keyword == 'exclusiveMinimum' else 'at least'} {limit}{unit}, "
                   f"got {e.instance!r}")
        if keyword == "additionalProperties":
            allowed = sorted((_schema_at(root, spath[:-1]) or {}).get("properties", {}))
            msg += f"; allowed: {', '.join(allowed)}" if allowed else ""
        problems.append((list(e.instance_path), Problem(_render_path(data, list(e.instance_path)) or "(top level)",
                                                        msg)))
    problems.sort(key=lambda pp: [str(k).zfill(12) if isinstance(k, int) else str(k) for k in pp[0]])
    return [p for _, p in problems]


def _parse(data_or_path: Any, want: str) -> tuple[dict[str, Any], str]:
    if isinstance(data_or_path, (str, os.PathLike)):
        source = str(data_or_path)
        data = read_json(data_or_path)
    else:
        source = "<data>"
        data = data_or_path
    try:
        _check_format(data, want)
        problems = schema_problems(data, want)
        if problems:
            raise ValidationError(problems)
    except ValidationError as exc:
        raise exc.with_source(source) from None
    return data, source


def load_model(data_or_path: Any) -> OpGraph:
    """Load a ``soapbox.model/1`` file (path) or mapping into a validated :class:`OpGraph`."""
    data, source = _parse(data_or_path, "soapbox.model/1")
    try:
        return graph_from_dict(data)
    except ValidationError as exc:
        raise exc.with_source(source) from None


def load_cluster(data_or_path: Any) -> Cluster:
    """Load a ``soapbox.cluster/1`` file (path) or mapping into a :class:`Cluster`."""
    data, source = _parse(data_or_path, "soapbox.cluster/1")
    try:
        return cluster_from_dict(data)
    except ValidationError as exc:
        raise exc.with_source(source) from None


def load_strategy(data_or_path: Any, graph: OpGraph | None = None, cluster: Cluster | None = None) -> Strategy:
    """Load a ``soapbox.strategy/1`` file; with ``graph`` and ``cluster``, also check that
    it is a valid strategy for them (every problem listed)."""
    data, source = _parse(data_or_path, "soapbox.strategy/1")
    strategy = strategy_from_dict(data)
    if graph is not None and cluster is not None:
        problems = validate_strategy(strategy, graph, cluster)
        if problems:
            raise ValidationError(problems, source)
    return strategy


def resolve_model(spec: str) -> OpGraph:
    """A sample model name (``alexnet``) or a model file path."""
    from ..models import SAMPLE_MODELS, build_sample, sample_dir

    if spec in SAMPLE_MODELS:
        path = sample_dir() / f"{spec}.json"
        return load_model(path) if path.exists() else build_sample(spec)
    if os.path.exists(spec) or spec.endswith(".json"):
        return load_model(spec)
    raise ValueError(f"unknown model {spec!r}: not a sample ({', '.join(SAMPLE_MODELS)}) nor a file")


def resolve_cluster(spec: str) -> Cluster:
    """A preset name (``p100-4x4``, ``dgx-a100-80gb:16``) or a cluster file path."""
    if os.path.exists(spec) or spec.endswith(".json"):
        return load_cluster(spec)
    return preset(spec)


def dumps(data: Mapping[str, Any]) -> str:
    """JSON text with one line per top-level field and per entry of ``ops`` (readable,
    diff-friendly, and compact for graphs of thousands of ops)."""
    lines = []
    items = list(data.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key == "ops" and isinstance(value, list) and value:
            body = ",\n".join("  " + json.dumps(v, separators=(", ", ": ")) for v in value)
            lines.append(f' "ops": [\n{body}\n ]{comma}')
        elif key == "ops" and isinstance(value, dict) and value:
            body = ",\n".join(f"  {json.dumps(k)}: " + json.dumps(v, separators=(", ", ": "))
                              for k, v in value.items())
            lines.append(f' "ops": {{\n{body}\n }}{comma}')
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}{comma}")
    return "{\n" + "\n".join(lines) + "\n}\n"


def save_json(data: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write ``data`` as JSON (see :func:`dumps`) atomically: a temporary file in the same
    folder, renamed over the target only once fully written."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(dumps(data))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def validate_file(path: str | os.PathLike, model: str | None = None, cluster: str | None = None) -> str:
    """Validate any soapbox file; return a one-line summary or raise :class:`ValidationError`.

    A strategy file is checked against the model and cluster it names (sample models and
    presets) unless ``model``/``cluster`` say otherwise; when they cannot be found, only its
    structure is checked and the summary says so.
    """
    source = str(path)
    data = read_json(path)
    try:
        fmt = _check_format(data, None)
    except ValidationError as exc:
        raise exc.with_source(source) from None
    if fmt == "soapbox.model/1":
        g = load_model(path)
        return f"{source}: valid {fmt}: {g.name}, {len(g)} ops, {g.param_count:,} parameters"
    if fmt == "soapbox.cluster/1":
        c = load_cluster(path)
        return f"{source}: valid {fmt}: {c.name}, {c.summary()}"
    s = load_strategy(path)
    model = model or s.model_name
    cluster = cluster or s.cluster_name
    try:
        g = resolve_model(model) if model else None
        c = resolve_cluster(cluster) if cluster else None
    except (ValueError, ValidationError) as exc:
        return (f"{source}: valid {fmt} structure ({len(s.configs)} ops); not checked against a model and "
                f"cluster: {str(exc).splitlines()[0]}")
    if g is None or c is None:
        return f"{source}: valid {fmt} structure ({len(s.configs)} ops); no model/cluster named to check against"
    problems = validate_strategy(s, g, c)
    if problems:
        raise ValidationError(problems, source)
    return f"{source}: valid {fmt} for {g.name} on {c.name} ({len(s.configs)} ops)"
