"""Tensor references, operators and the :class:`OpGraph` with its array and networkx views.
See :mod:`engine.graph`."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    import networkx as nx

from ..ops import DTYPE_BYTES, FLOAT_DTYPES, ParallelDim, ParamInfo, TensorInfo, op_kind

__all__ = ["TensorRef", "Op", "OpGraph", "PRECISIONS", "MAX_OPS", "MAX_MODEL_BYTES", "MAX_MODEL_FLOPS", "freeze",
           "thaw", "as_integral"]

#: Training precisions: fp32 (matmuls on the CUDA cores, PyTorch's default since 1.12), tf32
#: (fp32 tensors with matmuls on TF32 tensor cores: torch.backends.cuda.matmul.allow_tf32,
#: Ampere and later), fp16 and bf16 mixed precision.
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
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


def freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def as_integral(value: Any) -> Any:
    """Integral floats (``5.0``) made ints, in lists too: the integers of an op's attrs."""
    if type(value) is float and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, list):
        return [as_integral(v) for v in value]
    return value


#: one partition's shapes, by what they depend on (:meth:`Op._shapes_key`) and degrees: shared
#: by the identical layers of a deep model (GPT-3's 96), and kept across models and strategies
_PARTITIONS: dict[tuple, tuple] = {}
#: the token of each distinct :meth:`Op._shapes_key`, emptied past :data:`SHAPES_KEPT` entries
_SHAPES: dict[tuple, object] = {}
SHAPES_KEPT = 100_000
#: the most entries :data:`_PARTITIONS` keeps (emptied past it: a long search meets many degrees)
PARTITIONS_KEPT = 200_000


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

    @cached_property
    def signature(self) -> tuple:
        """What the op's partitions depend on, apart from its name and neighbours: kind, input
        and output shapes, attributes (identical layers of a deep model share it, and so share
        the task-graph builder's tables). Computed once (the op is immutable)."""
        return (self.kind, tuple(t.shape for t in self.in_tensors), tuple(t.shape for t in self.out_tensors),
                tuple(sorted((k, str(v)) for k, v in self.attrs.items())))

    # -- dims -------------------------------------------------------------------------
    def dim(self, name: str) -> ParallelDim:
        try:
            return self._dims_by_name[name]
        except KeyError:
            raise KeyError(name) from None

    @cached_property
    def _dims_by_name(self) -> dict[str, ParallelDim]:
        return {d.name: d for d in self.dims}

    @cached_property
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
        ``ValueError`` is raised). Computed once per shapes and degrees, for every op with
        those shapes (an op never changes; a search asks for the same few configs of an op
        over and over: delta simulation of one RNN op's change read its parameter unit's 40
        ops' shapes each time; a sweep's points ask the same of every layer).
        """
        ins, outs, params, _ = self._partition(degrees)
        return list(ins), list(outs), list(params)

    @cached_property
    def _shapes_key(self) -> object:
        """What one partition's shapes depend on (the tensors' and parameters' shapes and the
        dims), as a token compared by identity: ops of identical layers share it, and so share
        :data:`_PARTITIONS`' entries. (A token, not a number: when :data:`_SHAPES` is emptied,
        ops made after get new tokens and never meet an old op's entries.)"""
        key = (tuple(t.shape for t in self.in_tensors), tuple(t.shape for t in self.out_tensors),
               tuple(p.shape for p in self.params), self.dims)
        token = _SHAPES.get(key)
        if token is None:
            if len(_SHAPES) >= SHAPES_KEPT:
                _SHAPES.clear()
            token = _SHAPES[key] = object()
        return token

    def _partition(self, degrees: Mapping[str, int]) -> tuple:
        """(inputs, outputs, parameters, parameter elements) of one partition, kept per shapes
        and degrees for every op (:data:`_PARTITIONS`)."""
        key = (self._shapes_key, *(int(degrees.get(d.name, 1)) for d in self.dims))
        hit = _PARTITIONS.get(key)
        if hit is None:
            hit = self._partition_shapes(key[1:])
            if len(_PARTITIONS) >= PARTITIONS_KEPT:
                _PARTITIONS.clear()
            _PARTITIONS[key] = hit
        return hit

    def _partition_shapes(self, key: tuple[int, ...]) -> tuple:
        ins = [list(t.shape) for t in self.in_tensors]
        outs = [list(t.shape) for t in self.out_tensors]
        params = [list(p.shape) for p in self.params]
        for d, deg in zip(self.dims, key):
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
        params_t = tuple(tuple(s) for s in params)
        return (tuple(tuple(s) for s in ins), tuple(tuple(s) for s in outs), params_t,
                float(sum(math.prod(s) for s in params_t)))

    def partition_param_elements(self, degrees: Mapping[str, int]) -> float:
        """Parameter elements one partition holds under ``degrees`` (all its parameter
        tensors; a shared ``param_group`` is counted by each op that holds it)."""
        return self._partition(degrees)[3]

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
            d["attrs"] = thaw(self.attrs)
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

    def dim_sizes(self, dim: str) -> tuple[tuple[int, str], ...]:
        """(size, the first op that has it) of each distinct size of dim ``dim`` among the ops,
        in the order the ops first have it (what a layout's rules read: the heads a tensor-
        parallel degree must divide, the sequence lengths a context-parallel one must). Read
        once per graph and dim."""
        got = self._dim_sizes.get(dim)
        if got is None:
            first: dict[int, str] = {}
            for op in self.ops:
                if dim in op.dim_names:
                    first.setdefault(op.dim(dim).size, op.name)
            got = self._dim_sizes[dim] = tuple(first.items())
        return got

    @cached_property
    def _dim_sizes(self) -> dict[str, tuple[tuple[int, str], ...]]:
        return {}

    @cached_property
    def expert_counts(self) -> frozenset[int]:
        """The expert counts of the graph's mixture-of-experts layers (empty for a dense model)."""
        return frozenset(op.attrs["num_experts"] for op in self.ops if op.kind == "experts")

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
        """Names of the ops that read ``name``'s outputs, once per use, in edge order."""
        return list(self._consumer_names[self.index[name]])

    @cached_property
    def _consumer_names(self) -> tuple[tuple[str, ...], ...]:
        """[op] :meth:`consumers` of every op (one pass over the edges, not one per call)."""
        out: list[list[str]] = [[] for _ in self.ops]
        for (p, _, j, _) in self.edges:
            out[p].append(self.ops[j].name)
        return tuple(tuple(x) for x in out)

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


