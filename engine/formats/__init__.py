"""Versioned JSON formats: loading, validation and saving of models, clusters and strategies.

Every file has a ``format`` field naming its kind and version (``soapbox.model/1``,
``soapbox.cluster/1``, ``soapbox.strategy/1``, ``soapbox.profile/1``) and a published JSON
Schema in ``engine/formats/schemas/``. Loading checks the schema (reporting *every* violation
with its path in the file), then the meaning (shapes, cycles, divisibility, devices), and
raises one :class:`~engine.errors.ValidationError` listing all problems: never a traceback,
never a half-loaded object. Files are parsed with :func:`json.loads` only; nothing is
evaluated or unpickled.

Every input, a file or a mapping already in memory, passes the same gate before its schema
is checked (:func:`check_json_data`):

* a file is opened only when it is a regular file (a FIFO, a device such as ``/dev/zero``,
  a socket or a folder is refused without blocking on it), and read up to
  :data:`MAX_FILE_BYTES` while reading (its size as the file system reports it is not
  trusted);
* arrays and objects nest at most :data:`MAX_JSON_DEPTH` deep (checked on the bytes, before
  parsing, so deep nesting never reaches a recursive parser);
* numbers are finite (``NaN``, ``Infinity`` and ``1e999`` are refused) and strings are
  encodable (a lone surrogate such as ``"\\ud800"`` is refused with its path);
* a number written ``5.0`` where the schema says integer is read as ``5`` (JSON Schema's
  ``integer`` accepts it); ``5.5`` is refused by the schema.

Names resolve to files only when asked: :func:`resolve_model` and :func:`resolve_cluster`
open a path only with ``allow_path=True``, which the CLI passes for what a user typed on its
command line; a name found inside a file or sent by a browser resolves only to the sample
library and the presets.

Saving writes a temporary file beside the target (its name holds the writer's process id)
and renames it, so a failed or interrupted save never truncates the file a user already had
and leaves no temporary file behind.
"""

from __future__ import annotations

import os
from typing import Any

from ..cluster import Cluster, cluster_from_dict, preset
from ..costs import ProfileTable
from ..errors import Problem, ValidationError, first_line, printable
from ..graph import PRECISIONS, OpGraph, graph_from_dict
from ..strategy import Strategy, strategy_from_dict, validate_strategy
from .checking import FORMATS, built, check_format, load_checked, schema, schema_problems
from .jsonio import MAX_FILE_BYTES, MAX_JSON_DEPTH, check_json_data, parse_json_text, read_json, too_deep_at
from .writing import atomic_writer, dumps, save_json

__all__ = [
    "FORMATS",
    "MAX_FILE_BYTES",
    "MAX_JSON_DEPTH",
    "too_deep_at",
    "MAX_NAME_CHARS",
    "read_json",
    "parse_json_text",
    "check_json_data",
    "schema",
    "schema_problems",
    "load_model",
    "load_cluster",
    "load_strategy",
    "load_profile",
    "load_checked",
    "resolve_model",
    "resolve_cluster",
    "is_cluster_path",
    "dumps",
    "save_json",
    "atomic_writer",
    "validate_file",
]

#: Longest name (of a model, an op, a node, a device type) the schemas accept: names are
#: repeated per device and per task in reports and traces.
MAX_NAME_CHARS = 256


def load_model(data_or_path: Any) -> OpGraph:
    """Load a ``soapbox.model/1`` file (path) or mapping into a validated :class:`OpGraph`."""
    data, source = load_checked(data_or_path, "soapbox.model/1")
    return built(graph_from_dict, data, source)


def load_cluster(data_or_path: Any) -> Cluster:
    """Load a ``soapbox.cluster/1`` file (path) or mapping into a :class:`Cluster`."""
    data, source = load_checked(data_or_path, "soapbox.cluster/1")
    return built(cluster_from_dict, data, source)


def load_strategy(data_or_path: Any, graph: OpGraph | None = None, cluster: Cluster | None = None) -> Strategy:
    """Load a ``soapbox.strategy/1`` file; with ``graph`` and ``cluster``, also check that
    it is a valid strategy for them (every problem listed)."""
    data, source = load_checked(data_or_path, "soapbox.strategy/1")
    strategy = built(strategy_from_dict, data, source)
    if graph is not None and cluster is not None:
        problems = validate_strategy(strategy, graph, cluster)
        if problems:
            raise ValidationError([_why_another_model(p, strategy, graph) for p in problems], source)
    return strategy


#: Batches tried, besides a sample's default, to name the batch a strategy was made for
#: (its file records the model's fingerprint, not its sizes): the common ones
_BATCHES_TRIED = tuple(2**k for k in range(17))


def _why_another_model(problem: Problem, strategy: Strategy, graph: OpGraph) -> Problem:
    """``problem`` itself, or, when it is the fingerprint mismatch of a strategy made for a
    sample model, the same problem saying which batch (or precision) of which sample it was
    made for: the sample is built at its default batch and at the common batches in the
    model's precision, then in each other precision at the default batch and the model's,
    until one has the strategy's fingerprint.
    A fingerprint is a hash of the whole graph, so a match names the model exactly; a
    model file, or a size not tried, keeps the message that names the fingerprints."""
    from ..models import SAMPLE_MODELS, build_sample

    if problem.path != "model.fingerprint" or strategy.model_name not in SAMPLE_MODELS:
        return problem
    batch = graph.batch_size
    tries = [(graph.precision, b) for b in (None, *_BATCHES_TRIED)]  # another batch: the usual cause
    tries += [(p, b) for p in PRECISIONS if p != graph.precision for b in (None, batch)]
    for precision, b in tries:
        try:
            made = build_sample(strategy.model_name, b, precision=precision)
        except ValueError:  # (a batch or precision this sample cannot take)
            continue
        if made.fingerprint != strategy.model_fingerprint:
            continue
        prints = f"(fingerprint {strategy.model_fingerprint}; this model's is {graph.fingerprint})"
        what = f"batch {made.batch_size}" + (f", {made.precision}" if made.precision != graph.precision else "")
        if strategy.model_name != graph.name:
            text = f"made for model {strategy.model_name!r} ({what}), not for {graph.name!r} (batch {batch})"
        elif made.batch_size != batch:
            text = f"made for model {graph.name!r} with {what}; this model has batch {batch}"
        elif made.precision != graph.precision:
            text = f"made for model {graph.name!r} in {made.precision}; this model is in {graph.precision}"
        else:  # (the same batch and precision: another sequence length, or a file with other layers)
            text = f"made for model {graph.name!r} with batch {batch} but another shape (sequence length, layers)"
        return Problem(problem.path, f"the strategy was {text} {prints}")
    return problem


def load_profile(data_or_path: Any, source: str | None = None) -> ProfileTable:
    """Load a ``soapbox.profile/1`` file (path) or mapping into a :class:`ProfileTable`; every
    bad entry is reported with its path (``entries[3].inputs: ...``)."""
    data, source = load_checked(data_or_path, "soapbox.profile/1", source)
    return built(ProfileTable.from_checked, data, source)


def resolve_model(spec: str, *, allow_path: bool = False, batch: int | None = None, seq_len: int | None = None,
                  precision: str | None = None) -> OpGraph:
    """A sample model by name (``alexnet``); with ``allow_path``, also a model file's path.
    ``batch``: a sample model's global batch in samples, ``seq_len`` its sequence length,
    ``precision`` its training precision (a model file states its own).

    Without ``allow_path`` the file system is never touched beyond the sample library: a
    name that came from a file or a request cannot make soapbox open a path (pass
    ``allow_path=True`` only for what a user typed on a command line).
    """
    from ..models import SAMPLE_MODELS, build_sample

    if not isinstance(spec, str):
        raise ValueError(f"a model name must be a string, got {type(spec).__name__}")
    if spec in SAMPLE_MODELS:
        # its builder, the source of sample_models/<name>.json (tests keep them equal): three
        # times faster than reading and validating the file (GPT-3 175B: 0.06 s against 0.18 s)
        return build_sample(spec, batch, seq_len=seq_len, precision=precision)
    samples = ", ".join(SAMPLE_MODELS)
    if seq_len is not None or precision is not None:
        raise ValueError(f"a sequence length or precision can be set for a sample model ({samples}), not for "
                         f"{printable(spec)!r}: a model file states its own")
    if batch is not None:
        raise ValueError(f"a batch can be set for a sample model ({samples}), not for {printable(spec)!r}: a model "
                         "file states its own (write one with another batch: soapbox model gpt --batch N)")
    if allow_path:
        if os.path.exists(spec) or spec.endswith(".json"):
            return load_model(spec)
        raise ValueError(f"unknown model {printable(spec)!r}: not a sample ({samples}) nor a file")
    raise ValueError(f"unknown model {printable(spec)!r}: not a sample model ({samples})")


def is_cluster_path(spec: str) -> bool:
    """Whether :func:`resolve_cluster` with ``allow_path`` reads ``spec`` as a cluster file's
    path (one that exists, or any name ending ``.json``) rather than a preset's name."""
    return os.path.exists(spec) or spec.endswith(".json")


def resolve_cluster(spec: str, *, allow_path: bool = False) -> Cluster:
    """A preset by name (``p100-4x4``, ``dgx-a100-80gb:16``); with ``allow_path``, also a
    cluster file's path (see :func:`resolve_model` for when to allow paths)."""
    if not isinstance(spec, str):
        raise ValueError(f"a cluster name must be a string, got {type(spec).__name__}")
    if allow_path:
        if is_cluster_path(spec):
            return load_cluster(spec)
        try:
            return preset(spec)
        except ValidationError:
            raise
        except ValueError as exc:
            if str(exc).startswith("unknown cluster"):
                raise ValueError(f"{exc} (or a cluster file)") from None
            raise
    return preset(spec)


def validate_file(path: str | os.PathLike, model: str | None = None, cluster: str | None = None) -> str:
    """Validate any soapbox file; return a one-line summary or raise :class:`ValidationError`.

    A strategy file is checked against the model and cluster it names, which resolve only
    to sample models and presets (a name inside a file never opens a path), unless
    ``model``/``cluster`` say otherwise: those may be paths (a user typed them). When they
    cannot be found, only its structure is checked and the summary says so.
    """
    source = str(path)
    data = read_json(path)
    try:
        fmt = check_format(data, None)
    except ValidationError as exc:
        raise exc.with_source(source) from None
    if fmt == "soapbox.profile/1":
        table = load_profile(data, source)
        return f"{source}: valid {fmt}: {len(table)} entries"
    data, _ = load_checked(data, fmt, source)
    if fmt == "soapbox.model/1":
        g = built(graph_from_dict, data, source)
        return f"{source}: valid {fmt}: {printable(g.name)}, {len(g)} ops, {g.param_count:,} parameters"
    if fmt == "soapbox.cluster/1":
        c = built(cluster_from_dict, data, source)
        return f"{source}: valid {fmt}: {printable(c.name)}, {c.summary()}"
    s = built(strategy_from_dict, data, source)
    try:
        g = resolve_model(model, allow_path=True) if model else \
            resolve_model(s.model_name) if s.model_name else None
        c = resolve_cluster(cluster, allow_path=True) if cluster else \
            resolve_cluster(s.cluster_name) if s.cluster_name else None
    except (ValueError, ValidationError) as exc:
        return (f"{source}: valid {fmt} structure ({len(s.configs)} ops); not checked against a model and "
                f"cluster: {first_line(exc)}")
    if g is None or c is None:
        return f"{source}: valid {fmt} structure ({len(s.configs)} ops); no model/cluster named to check against"
    problems = validate_strategy(s, g, c)
    if problems:
        raise ValidationError(problems, source)
    return f"{source}: valid {fmt} for {printable(g.name)} on {printable(c.name)} ({len(s.configs)} ops)"

