"""``OpGraph``: operators joined by tensor edges, validated, with array and networkx views.

An operator reads tensors produced by earlier operators (a :class:`TensorRef` names the
producer and which of its outputs) and produces one or more tensors. Operators in the same
``param_group`` share one set of parameters (an unrolled LSTM's steps, a language model's
tied input and output embeddings); the group's parameters are counted and synchronised once.

Graphs are built with :class:`GraphBuilder` (shapes are inferred as each op is added, so a
mistake fails at the line that made it) or loaded from a ``soapbox.model/1`` file by
:func:`engine.formats.load_model`, which reports every problem at once.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    import networkx as nx

from .errors import Problem, ValidationError
from .ops import (
    DTYPE_BYTES,
    FLOAT_ATTRS,
    FLOAT_DTYPES,
    MAX_RANK,
    MAX_TENSOR_ELEMENTS,
    OpError,
    ParallelDim,
    ParamInfo,
    TensorInfo,
    op_kind,
    replica_dim,
)

__all__ = ["TensorRef", "Op", "OpGraph", "GraphBuilder", "PRECISIONS", "MAX_OPS", "MAX_MODEL_BYTES",
           "MAX_MODEL_FLOPS"]

PRECISIONS = ("fp32", "fp16", "bf16")
#: Most ops in a model (checked from the file before any op is built). The largest sample,
#: GPT-3 175B, has 2,410; an unrolled RNN of thousands of steps stays well below.
MAX_OPS = 200_000
#: Most bytes all ops of a model read and write in one iteration (forward and backward, each
#: op's tensors counted where it touches them): 2**60 ~ 1.2e18, 400x GPT-3 175B's 2.7e15, so
#: every sum the simulator makes stays inside int64.
MAX_MODEL_BYTES = 2**60
#: Most forward + backward FLOPs of a model: 1e30, 1e11 x GPT-3 175B's 3.4e18 (times stay
#: finite and meaningful at any accepted device speed).
MAX_MODEL_FLOPS = 1e30


@dataclass(frozen=True)
class TensorRef:
    """Output ``index`` of operator ``op``; written ``"op"`` or ``"op:index"`` in files."""

    op: str
    index: int = 0

    @classmethod
    def parse(cls, text: str) -> "TensorRef":
        name, sep, idx = text.rpartition(":")
        if sep and idx.isdigit():
            return cls(name, int(idx))
        return cls(text, 0)

    def __str__(self) -> str:
        return self.op if self.index == 0 else f"{self.op}:{self.index}"


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _integral(value: Any) -> Any:
    """Integral floats (``5.0``) made ints, in lists too: the integers of an op's attrs."""
    if type(value) is float and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


@dataclass(frozen=True, eq=False)
class Op:
    """One operator with everything the simulator needs to know about it.

    Created by :class:`GraphBuilder`; all fields are derived from ``kind``, ``inputs`` and
    ``attrs`` and are immutable.
    """

    name: str
    kind: str
    inputs: tuple[TensorRef, ...]
    attrs: Mapping[str, Any]
    in_tensors: tuple[TensorInfo, ...]
    out_tensors: tuple[TensorInfo, ...]
    params: tuple[ParamInfo, ...]
    dims: tuple[ParallelDim, ...]
    param_group: str | None = None
    block: str | None = None
    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    param_dtype: str = "fp32"

    # -- parameters -----------------------------------------------------------------
    @property
    def param_count(self) -> int:
        """Elements in this op's parameters (shared ones included)."""
        return sum(p.numel for p in self.params)

    @property
    def param_bytes(self) -> int:
        return self.param_count * DTYPE_BYTES[self.param_dtype]

    # -- dims -------------------------------------------------------------------------
    def dim(self, name: str) -> ParallelDim:
        for d in self.dims:
            if d.name == name:
                return d
        raise KeyError(name)

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    # -- bytes --------------------------------------------------------------------------
    @property
    def is_view(self) -> bool:
        return op_kind(self.kind).is_view

    def _gathered_param_bytes(self) -> int:
        """Parameter bytes a pass touches: the whole tensors, or for a table lookup only the
        gathered rows (one output row per id)."""
        if op_kind(self.kind).gathers_params:
            return sum(t.size_bytes for t in self.out_tensors)
        return self.param_bytes

    @property
    def fwd_bytes_read(self) -> int:
        """Bytes the forward pass reads: inputs and parameters (0 for views)."""
        if self.is_view:
            return 0
        return sum(t.size_bytes for t in self.in_tensors) + self._gathered_param_bytes()

    @property
    def fwd_bytes_written(self) -> int:
        """Bytes the forward pass writes: outputs (0 for views)."""
        if self.is_view:
            return 0
        return sum(t.size_bytes for t in self.out_tensors)

    @property
    def bwd_bytes_read(self) -> int:
        """Bytes the backward pass reads: output gradients, the saved float inputs it needs,
        and the parameters (a lookup's backward needs no table)."""
        if self.is_view or self.kind == "input":
            return 0
        kind = op_kind(self.kind)
        grads = sum(t.size_bytes for t in self.out_tensors if t.dtype in FLOAT_DTYPES)
        saved = sum(t.size_bytes for t in self.in_tensors if t.dtype in FLOAT_DTYPES) if kind.bwd_reads_inputs else 0
        params = 0 if kind.gathers_params else self.param_bytes
        return grads + saved + params

    @property
    def bwd_bytes_written(self) -> int:
        """Bytes the backward pass writes: float input gradients and parameter gradients
        (only the gathered rows for a lookup)."""
        if self.is_view or self.kind == "input":
            return 0
        return sum(t.size_bytes for t in self.in_tensors if t.dtype in FLOAT_DTYPES) + self._gathered_param_bytes()

    # -- partitions ----------------------------------------------------------------------
    def partition_shapes(
        self, degrees: Mapping[str, int]
    ) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]], list[tuple[int, ...]]]:
        """Shapes of one partition's inputs, outputs and parameters under ``degrees``.

        Every degree must divide its dim's size (checked by strategy validation; here a
        ``ValueError`` is raised).
        """
        ins = [list(t.shape) for t in self.in_tensors]
        outs = [list(t.shape) for t in self.out_tensors]
        params = [list(p.shape) for p in self.params]
        for d in self.dims:
            deg = int(degrees.get(d.name, 1))
            if deg == 1 or d.is_replica:
                continue
            why = d.degree_problem(deg)
            if why:
                raise ValueError(f"{self.name}: degree {why}")
            if d.out_axis is not None:
                for o in outs:
                    o[d.out_axis] //= deg
            for i, ax in enumerate(d.in_axes):
                if ax is not None:
                    ins[i][ax] = max(1, ins[i][ax] // deg)
            for i, ax in enumerate(d.param_axes):
                if ax is not None:
                    params[i][ax] //= deg
        return [tuple(s) for s in ins], [tuple(s) for s in outs], [tuple(s) for s in params]

    def partition_param_elements(self, degrees: Mapping[str, int]) -> float:
        """Parameter elements one partition holds under ``degrees`` (all its parameter
        tensors; a shared ``param_group`` is counted by each op that holds it)."""
        _, _, params = self.partition_shapes(degrees)
        return float(sum(math.prod(s) for s in params))

    def partition_flops(self, degrees: Mapping[str, int]) -> tuple[float, float]:
        """(forward, backward) FLOPs of one partition, from the op's formula on its shapes."""
        kind = op_kind(self.kind)
        ins, outs, params = self.partition_shapes(degrees)
        fwd = kind.fwd_flops(ins, outs, params, self.attrs)
        return fwd, fwd * kind.bwd_factor

    # -- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.inputs:
            d["inputs"] = [str(r) for r in self.inputs]
        if self.attrs:
            d["attrs"] = _thaw(self.attrs)
        if self.param_group:
            d["param_group"] = self.param_group
        if self.block:
            d["block"] = self.block
        d["out_shapes"] = [list(t.shape) for t in self.out_tensors]
        return d


class OpGraph:
    """A validated operator graph.

    Attributes
    ----------
    name : str
    precision : str
        Dtype of activations and parameters (``fp32``, ``fp16``, ``bf16``).
    ops : tuple of Op
        In a topological order (producers before consumers), which is file order when the
        file already lists producers first.
    """

    def __init__(self, name: str, precision: str, ops: Sequence[Op], description: str = "",
                 source: str = "") -> None:
        self.name = name
        self.precision = precision
        self.ops = tuple(ops)
        self.description = description
        self.source = source
        self.index = {op.name: i for i, op in enumerate(self.ops)}

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self):
        return iter(self.ops)

    def __getitem__(self, name: str) -> Op:
        return self.ops[self.index[name]]

    def __contains__(self, name: object) -> bool:
        return name in self.index

    def __repr__(self) -> str:
        return f"OpGraph({self.name!r}, {len(self.ops)} ops, {self.param_count:,} params)"

    # -- totals ----------------------------------------------------------------------------
    @cached_property
    def param_count(self) -> int:
        """Trainable parameters, each shared group counted once."""
        seen: set[str] = set()
        total = 0
        for op in self.ops:
            if op.param_group:
                if op.param_group in seen:
                    continue
                seen.add(op.param_group)
            total += op.param_count
        return total

    @property
    def fwd_flops(self) -> float:
        return float(sum(op.fwd_flops for op in self.ops))

    @property
    def bwd_flops(self) -> float:
        return float(sum(op.bwd_flops for op in self.ops))

    @property
    def batch_size(self) -> int:
        """Size of the ``sample`` dim of the graph's inputs (the global batch)."""
        for op in self.ops:
            if op.kind == "input":
                return op.out_tensors[0].shape[0]
        raise ValueError(f"model {self.name!r} has no input op")

    # -- edges --------------------------------------------------------------------------------
    @cached_property
    def edges(self) -> tuple[tuple[int, int, int, int], ...]:
        """(producer op index, output index, consumer op index, input index) per tensor use."""
        out = []
        for j, op in enumerate(self.ops):
            for k, ref in enumerate(op.inputs):
                out.append((self.index[ref.op], ref.index, j, k))
        return tuple(out)

    def consumers(self, name: str) -> list[str]:
        i = self.index[name]
        return [self.ops[j].name for (p, _, j, _) in self.edges if p == i]

    # -- views --------------------------------------------------------------------------------
    @cached_property
    def arrays(self) -> dict[str, np.ndarray]:
        """NumPy views for the simulator.

        Keys: ``fwd_flops`` [op], ``bwd_flops`` [op], ``param_bytes`` [op],
        ``fwd_bytes`` [op] (read + written), ``bwd_bytes`` [op], ``edge_src`` [edge],
        ``edge_dst`` [edge], ``edge_bytes`` [edge] (size of the tensor the edge carries).
        """
        e = np.array(self.edges, dtype=np.int64).reshape(-1, 4)
        edge_bytes = np.array(
            [self.ops[p].out_tensors[o].size_bytes for (p, o, _, _) in self.edges], dtype=np.int64
        )
        arr = {
            "fwd_flops": np.array([op.fwd_flops for op in self.ops], dtype=np.float64),
            "bwd_flops": np.array([op.bwd_flops for op in self.ops], dtype=np.float64),
            "param_bytes": np.array([op.param_bytes for op in self.ops], dtype=np.int64),
            "fwd_bytes": np.array([op.fwd_bytes_read + op.fwd_bytes_written for op in self.ops], dtype=np.int64),
            "bwd_bytes": np.array([op.bwd_bytes_read + op.bwd_bytes_written for op in self.ops], dtype=np.int64),
            "edge_src": e[:, 0].copy(),
            "edge_dst": e[:, 2].copy(),
            "edge_bytes": edge_bytes,
        }
        for a in arr.values():
            a.setflags(write=False)
        return arr

    def to_networkx(self) -> "nx.MultiDiGraph":
        """A networkx view: one node per op (attrs ``kind``, ``block``, FLOPs), one edge per tensor use."""
        import networkx as nx

        g = nx.MultiDiGraph(name=self.name)
        for op in self.ops:
            g.add_node(op.name, kind=op.kind, block=op.block, fwd_flops=op.fwd_flops, params=op.param_count)
        for p, o, c, k in self.edges:
            g.add_edge(self.ops[p].name, self.ops[c].name, output=o, input=k,
                       size_bytes=self.ops[p].out_tensors[o].size_bytes)
        return g

    # -- identity & serialisation -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"format": "soapbox.model/1", "name": self.name}
        if self.description:
            d["description"] = self.description
        if self.source:
            d["source"] = self.source
        d["precision"] = self.precision
        d["ops"] = [op.to_dict() for op in self.ops]
        return d

    @cached_property
    def fingerprint(self) -> str:
        """First 16 hex digits of the SHA-256 of the graph's structure (ops, attrs, edges,
        precision); names and descriptions of the model do not change it."""
        body = {"precision": self.precision, "ops": [op.to_dict() for op in self.ops]}
        blob = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


class GraphBuilder:
    """Builds an :class:`OpGraph` op by op, inferring shapes as it goes.

    Examples
    --------
    >>> b = GraphBuilder("mlp", precision="fp32")
    >>> x = b.input("x", [8, 16])
    >>> h = b.add("linear", "fc1", [x], out_features=32)
    >>> y = b.add("relu", "act", [h])
    >>> g = b.build()
    >>> g["fc1"].out_tensors[0].shape, g.param_count
    ((8, 32), 544)
    """

    def __init__(self, name: str, precision: str = "fp32", description: str = "", source: str = "") -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.name = name
        self.precision = precision
        self.description = description
        self.source = source
        self._ops: list[Op] = []
        self._index: dict[str, int] = {}
        self.block: str | None = None  # label applied to ops added while set

    def input(self, name: str, shape: Sequence[int], dtype: str | None = None,
              axes: Sequence[str] | None = None) -> TensorRef:
        attrs: dict[str, Any] = {"shape": list(shape)}
        if dtype:
            attrs["dtype"] = dtype
        if axes:
            attrs["axes"] = list(axes)
        return self.add("input", name, [], **attrs)

    def add(self, kind: str, name: str, inputs: Iterable[TensorRef | str], *,
            param_group: str | None = None, block: str | None = None, **attrs: Any):
        """Add an op; return a :class:`TensorRef` to its output (a list if it has several)."""
        op = self.make_op(kind, name, [r if isinstance(r, TensorRef) else TensorRef.parse(r) for r in inputs],
                          attrs, param_group, block if block is not None else self.block)
        self._index[name] = len(self._ops)
        self._ops.append(op)
        refs = [TensorRef(name, i) for i in range(len(op.out_tensors))]
        return refs[0] if len(refs) == 1 else refs

    def make_op(self, kind: str, name: str, inputs: list[TensorRef], attrs: Mapping[str, Any],
                param_group: str | None, block: str | None) -> Op:
        """Infer one op from already-added producers; raises :class:`OpError` on bad input."""
        if name in self._index:
            raise OpError(f"duplicate op name {name!r}", "name")
        spec = op_kind(kind)
        attrs = {k: _thaw(v) if k in FLOAT_ATTRS else _integral(_thaw(v)) for k, v in attrs.items()}
        unknown = sorted(set(attrs) - set(spec.attrs))
        if unknown:
            valid = ", ".join(spec.attrs) or "none"
            raise OpError(f"unknown attribute(s) {', '.join(unknown)} for {spec.name}; valid: {valid}",
                          f"attrs.{unknown[0]}")
        in_tensors = []
        for i, ref in enumerate(inputs):
            if ref.op not in self._index:
                raise OpError(f"refers to {str(ref)!r}, which is not an earlier op", f"inputs[{i}]")
            producer = self._ops[self._index[ref.op]]
            if ref.index >= len(producer.out_tensors):
                raise OpError(f"{ref.op!r} has {len(producer.out_tensors)} output(s); "
                              f"output {ref.index} does not exist", f"inputs[{i}]")
            in_tensors.append(producer.out_tensors[ref.index])
        outs = spec.infer(in_tensors, attrs, self.precision)
        params = spec.params(in_tensors, attrs)
        for what, tensors in (("output", outs), ("parameter", params)):
            for i, t in enumerate(tensors):
                if len(t.shape) > MAX_RANK or t.numel > MAX_TENSOR_ELEMENTS:
                    raise OpError(f"{what} {i} of shape {list(t.shape)} has {t.numel:,} elements in {len(t.shape)} "
                                  f"axes; the limits are {MAX_TENSOR_ELEMENTS:,} (2**44) elements and {MAX_RANK} axes",
                                  "attrs" if attrs else "inputs")
        dims = list(spec.dims(in_tensors, outs, attrs)) + [replica_dim(len(in_tensors), len(params))]
        shapes = ([t.shape for t in in_tensors], [t.shape for t in outs], [p.shape for p in params])
        fwd = float(spec.fwd_flops(*shapes, attrs))
        return Op(
            name=name, kind=spec.name, inputs=tuple(inputs), attrs=_freeze(attrs),
            in_tensors=tuple(in_tensors), out_tensors=tuple(outs), params=tuple(params),
            dims=tuple(dims), param_group=param_group, block=block, fwd_flops=fwd,
            bwd_flops=fwd * spec.bwd_factor, param_dtype=self.precision,
        )

    def build(self) -> OpGraph:
        """Check parameter groups and the model's size and return the graph; raises
        :class:`ValidationError`."""
        problems = check_param_groups(self._ops) + check_model_size(self._ops, must_compute=False)
        if problems:
            raise ValidationError(problems, self.name)
        return OpGraph(self.name, self.precision, self._ops, self.description, self.source)


def _shape_key(op: Op) -> list[tuple[int, ...]]:
    return [p.shape for p in op.params]


def check_param_groups(ops: Sequence[Op]) -> list[Problem]:
    """Ops sharing a ``param_group`` must hold parameters of exactly the same shapes, so that
    their partitions' parameter regions line up axis by axis (a linear's weight is stored
    (out, in), so a language model's output layer matches the token embedding's (V, h))."""
    problems = []
    first: dict[str, Op] = {}
    for i, op in enumerate(ops):
        if not op.param_group:
            continue
        ref = first.setdefault(op.param_group, op)
        if ref is not op and _shape_key(ref) != _shape_key(op):
            problems.append(Problem(
                f"ops[{i}] ({op.name}).param_group",
                f"shares {op.param_group!r} with {ref.name!r}, but its parameters have shapes "
                f"{[list(p.shape) for p in op.params]} against {[list(p.shape) for p in ref.params]}",
            ))
        if op.param_count == 0:
            problems.append(Problem(f"ops[{i}] ({op.name}).param_group",
                                    f"{op.kind} has no parameters to share"))
    return problems


def check_model_size(ops: Sequence[Op], must_compute: bool = True) -> list[Problem]:
    """A model stays within :data:`MAX_OPS`, :data:`MAX_MODEL_BYTES` and
    :data:`MAX_MODEL_FLOPS`, and (``must_compute``, for files) computes something: an op
    other than inputs and views, else an iteration takes no time and its throughput is
    infinite. (Graphs built in code may hold a single reshape to look at.)"""
    problems = []
    if len(ops) > MAX_OPS:
        problems.append(Problem("ops", f"{len(ops):,} ops; the limit is {MAX_OPS:,}"))
    if must_compute and ops and all(op.kind == "input" or op.is_view for op in ops):
        problems.append(Problem("ops", "the model computes nothing: every op is an input or a reshape; add the "
                                       "layers that use the inputs"))
    total_bytes = sum(op.fwd_bytes_read + op.fwd_bytes_written + op.bwd_bytes_read + op.bwd_bytes_written
                      + op.param_bytes for op in ops)
    if total_bytes > MAX_MODEL_BYTES:
        problems.append(Problem("ops", f"the ops read and write {total_bytes:.3g} bytes per iteration; the limit is "
                                       f"{MAX_MODEL_BYTES:.3g} (2**60)"))
    flops = sum(op.fwd_flops + op.bwd_flops for op in ops)
    if not flops <= MAX_MODEL_FLOPS:
        problems.append(Problem("ops", f"{flops:.3g} FLOPs per iteration; the limit is {MAX_MODEL_FLOPS:.0e}"))
    return problems


def graph_from_dict(data: Mapping[str, Any]) -> OpGraph:
    """Build an :class:`OpGraph` from a schema-valid ``soapbox.model/1`` mapping.

    Collects every semantic problem (unknown inputs, cycles, duplicate names, shape
    mismatches, ``out_shapes`` that disagree with inference) before raising one
    :class:`ValidationError`. Ops whose inputs already failed are not re-reported.
    """
    ops_data = list(data["ops"])
    if len(ops_data) > MAX_OPS:  # before anything is built
        raise ValidationError([Problem("ops", f"{len(ops_data):,} ops; the limit is {MAX_OPS:,}")])
    problems: list[Problem] = []

    def where(i: int, fld: str = "") -> str:
        name = ops_data[i].get("name", "?")
        return f"ops[{i}] ({name})" + (f".{fld}" if fld else "")

    names: dict[str, int] = {}
    for i, od in enumerate(ops_data):
        if od["name"] in names:
            problems.append(Problem(where(i, "name"),
                                    f"duplicate op name {od['name']!r} (first used by ops[{names[od['name']]}])"))
        else:
            names[od["name"]] = i

    import networkx as nx  # (loaded with the first model file: samples are built without it)

    # Dependency graph for ordering and cycle detection.
    dep = nx.DiGraph()
    dep.add_nodes_from(range(len(ops_data)))
    for i, od in enumerate(ops_data):
        for k, text in enumerate(od.get("inputs", [])):
            ref = TensorRef.parse(text)
            if ref.op not in names:
                problems.append(Problem(where(i, f"inputs[{k}]"),
                                        f"refers to unknown op {ref.op!r}"))
            else:
                dep.add_edge(names[ref.op], i)
    try:
        cycle = nx.find_cycle(dep)
        path = " -> ".join(ops_data[u]["name"] for u, _ in cycle) + f" -> {ops_data[cycle[0][0]]['name']}"
        problems.append(Problem("ops", f"the graph has a cycle: {path}"))
        raise ValidationError(problems)
    except nx.NetworkXNoCycle:
        pass

    order = list(nx.lexicographical_topological_sort(dep))
    builder = GraphBuilder(data["name"], data.get("precision", "fp32"), data.get("description", ""),
                           data.get("source", ""))
    failed: set[str] = set()
    for i in order:
        od = ops_data[i]
        if names.get(od["name"]) != i:
            continue  # duplicate already reported
        refs = [TensorRef.parse(t) for t in od.get("inputs", [])]
        if any(r.op in failed or r.op not in names for r in refs):
            failed.add(od["name"])
            continue
        try:
            op = builder.make_op(od["kind"], od["name"], refs, od.get("attrs", {}),
                                 od.get("param_group"), od.get("block"))
        except OpError as exc:
            problems.append(Problem(where(i, exc.field), str(exc)))
            failed.add(od["name"])
            continue
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            # An attribute of a type no check above anticipated: still a problem report,
            # never a traceback.
            problems.append(Problem(where(i, "attrs"), f"invalid attributes for {od['kind']}: {exc!r}"))
            failed.add(od["name"])
            continue
        expected = od.get("out_shapes")
        if expected is not None:
            got = [list(t.shape) for t in op.out_tensors]
            if [list(s) for s in expected] != got:
                problems.append(Problem(where(i, "out_shapes"),
                                        f"file says {expected}, but the inputs and attributes give {got}"))
        builder._index[op.name] = len(builder._ops)
        builder._ops.append(op)
    problems += check_param_groups(builder._ops)
    if not problems:  # (sizes of a graph with failed ops would mislead)
        problems += check_model_size(builder._ops)
    if problems:
        raise ValidationError(problems)
    return OpGraph(builder.name, builder.precision, builder._ops, builder.description, builder.source)
