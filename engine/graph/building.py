"""Making graphs: :class:`GraphBuilder` (shapes inferred as each op is added) and
:func:`graph_from_dict` (a ``soapbox.model/1`` mapping, every problem reported at once).
See :mod:`engine.graph`."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ..errors import Problem, ValidationError
from ..ops import FLOAT_ATTRS, MAX_RANK, MAX_TENSOR_ELEMENTS, OpError, op_kind, replica_dim
from .core import (MAX_MODEL_BYTES, MAX_MODEL_FLOPS, MAX_OPS, PRECISIONS, Op, OpGraph, TensorRef, as_integral, freeze,
    thaw)

__all__ = ["GraphBuilder", "graph_from_dict", "check_param_groups", "check_model_size"]


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

    def shape_of(self, ref: TensorRef) -> tuple[int, ...]:
        """The shape of an output already added."""
        return self._ops[self._index[ref.op]].out_tensors[ref.index].shape

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
        attrs = {k: thaw(v) if k in FLOAT_ATTRS else as_integral(thaw(v)) for k, v in attrs.items()}
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
            name=name, kind=spec.name, inputs=tuple(inputs), attrs=freeze(attrs),
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

