"""What a strategy is made of, below the :class:`engine.strategy.Strategy` record (split from
:mod:`engine.strategy`, which re-exports these names): an op's :class:`Config` (degrees per
dim, a device per partition) and which partition is which, the pipeline settings, the degrees
a dim can take, and ZeRO's shard groups under sequence parallelism."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

import math

import numpy as np

from ..cluster import Cluster
from ..errors import Problem
from ..graph import Op, OpGraph
from ..ops import EXPERT, REPLICA

__all__ = ["microbatch_count", "Config", "PipelineSettings", "partition_grid", "partition_coords", "divisors", "splits_into_microbatches",
           "degree_choices", "zero_shares", "check_config"]


def divisors(n: int, at_most: int) -> list[int]:
    """The divisors of ``n`` up to ``at_most``, ascending: the degrees a dim of size ``n`` can
    be split into on at most ``at_most`` devices."""
    return [k for k in range(1, min(n, at_most) + 1) if n % k == 0]


def microbatch_count(batch: int, dp: int, micro_batch: int) -> int:
    """Microbatches an iteration of ``batch`` samples is cut into on ``dp`` data-parallel
    ranks with ``micro_batch`` samples each: batch / (micro_batch x dp). The one micro-batch
    rule (Megatron-LM ``arguments.py``: the global batch must be a multiple of micro-batch
    size x data-parallel size).

    >>> microbatch_count(32, 4, 2)
    4

    Raises
    ------
    ValueError
        When the batch does not split so.
    """
    if not isinstance(micro_batch, int) or isinstance(micro_batch, bool) or micro_batch < 1:
        raise ValueError(f"micro_batch must be a positive integer, got {micro_batch!r}")
    if batch % (micro_batch * dp):
        raise ValueError(f"global batch {batch} is not a multiple of micro_batch ({micro_batch}) x dp ({dp})")
    return batch // (micro_batch * dp)


def splits_into_microbatches(samples: int, degree: int, microbatches: int) -> bool:
    """Whether ``samples`` (a sample dim; a global batch) split ``degree`` ways (a degree; dp) cut into equal
    ``microbatches``: the one micro-batch x sample rule (Megatron-LM ``arguments.py``; ``layout.microbatch_count``)."""
    return samples % (degree * microbatches) == 0


def degree_choices(dim, n_devices: int, microbatches: int = 1, min_part: int = 1) -> list[int]:
    """The degrees a search may split ``dim`` (an op's :class:`Dim`) into on ``n_devices``,
    ascending: divisors of its size that divide ``n_devices``, that the dim accepts
    (:meth:`Dim.degree_problem`: e.g. whole attention heads), leave at least ``min_part``
    elements a partition, and, for the sample dim cut into ``microbatches``, split every
    microbatch evenly. The one rule of every search's config space."""
    return [k for k in divisors(dim.size, n_devices)
            if n_devices % k == 0 and dim.size // k >= min_part and dim.degree_problem(k) is None
            and (dim.name != "sample" or microbatches <= 1 or splits_into_microbatches(dim.size, k, microbatches))]


def zero_shares(graph: OpGraph, strategy: Any) -> dict[str, int]:
    """Op name -> (of a :class:`engine.strategy.Strategy`) how many of its sequence (``length``) partitions are tensor-parallel ranks
    under sequence parallelism rather than data (context-parallel) ones: ZeRO shards a
    parameter over its data-parallel group only (Megatron-Core's distributed optimizer over
    dp x cp, FSDP2 over its dp mesh dimension), so a sequence-parallel LayerNorm's weights,
    held by tp x cp x dp ranks, are sharded over cp x dp, one copy per tp rank. Only ops whose
    length degree exceeds the context-parallel degree are listed; the context-parallel degree
    is the sequence split of the tensor-parallel (weight-split) ops, which keep their chunk's
    whole sequence. Partition (length l) is tp rank ``l % share`` (Megatron-Core's order, tp
    fastest: :func:`engine.layout.placement.mesh_config`)."""
    if not strategy.sequence_parallel:
        return {}
    cps = []
    for op in graph.ops:
        cfg = strategy.configs.get(op.name)
        if cfg is None or not op.param_count or "length" not in op.dim_names:
            continue
        if any(cfg.degree(d.name) > 1 and any(ax is not None for ax in d.param_axes) for d in op.dims):
            cps.append(cfg.degree("length"))
    cp = min(cps, default=1)
    out = {}
    for op in graph.ops:
        cfg = strategy.configs.get(op.name)
        if cfg is not None and op.param_count and cfg.degree("length") > cp and cfg.degree("length") % cp == 0:
            out[op.name] = cfg.degree("length") // cp
    return out


@dataclass(frozen=True)
class Config:
    """Degrees per parallel dim (only those > 1 are kept) and one device per partition."""

    degrees: Mapping[str, int]
    devices: tuple[int, ...]

    def __post_init__(self) -> None:
        # Values are kept as given (not coerced with int()) so that validation can report a
        # degree of 2.5 instead of silently running 2.
        clean = {k: v for k, v in sorted(self.degrees.items()) if v != 1}
        object.__setattr__(self, "degrees", MappingProxyType(clean))
        object.__setattr__(self, "devices", tuple(self.devices))

    @property
    def num_partitions(self) -> int:
        return math.prod(self.degrees.values())

    def degree(self, dim: str) -> int:
        return self.degrees.get(dim, 1)

    def to_dict(self, devices: Callable[[tuple[int, ...]], Any] = list) -> dict[str, Any]:
        """The config as ``soapbox.strategy/1`` writes it; ``devices`` writes the device tuple
        (a list by default; the explorer's state writes runs such as ``"0-7,16-23"``)."""
        return {"degrees": dict(self.degrees), "devices": devices(self.devices)}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and dict(self.degrees) == dict(other.degrees) \
            and self.devices == other.devices

    def __hash__(self) -> int:
        return hash((tuple(self.degrees.items()), self.devices))

    @classmethod
    def single(cls, device: int) -> "Config":
        """The whole op on one device."""
        return cls({}, (device,))


@dataclass(frozen=True)
class PipelineSettings:
    """Pipeline parallelism (Huang et al. GPipe 2019; Narayanan et al. SC'21 §2.2).

    ``stages`` = 1 with ``microbatches`` > 1 is plain gradient accumulation.
    ``virtual_stages`` > 1 is the interleaved 1F1B schedule (model chunks per device).
    """

    stages: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"stages": self.stages, "microbatches": self.microbatches, "schedule": self.schedule,
                "virtual_stages": self.virtual_stages}


def partition_grid(op: Op, config: Config) -> tuple[list[str], np.ndarray]:
    """The split dims' names (in ``op.dims`` order) and the [part, dim] coordinate matrix,
    row-major: partition ``p`` runs on ``config.devices[p]``. The one definition of which
    partition is which (the builder, the memory model, PaSE and the baselines read it).

    >>> from engine.graph import GraphBuilder
    >>> b = GraphBuilder("m"); x = b.input("x", [4, 6]); _ = b.add("linear", "fc", [x], out_features=2)
    >>> names, grid = partition_grid(b.build()["fc"], Config({"sample": 2, "feature": 2}, (0, 1, 2, 3)))
    >>> names, grid.tolist()
    (['sample', 'feature'], [[0, 0], [0, 1], [1, 0], [1, 1]])
    """
    names = [d.name for d in op.dims if config.degree(d.name) > 1]
    if not names:
        return [], np.zeros((1, 0), np.int64)
    shape = [config.degree(n) for n in names]
    return names, np.indices(shape).reshape(len(shape), -1).T


def partition_coords(op: Op, config: Config) -> list[dict[str, int]]:
    """:func:`partition_grid` as one ``{dim: index}`` per partition.

    >>> from engine.graph import GraphBuilder
    >>> b = GraphBuilder("m"); x = b.input("x", [4, 6]); _ = b.add("linear", "fc", [x], out_features=2)
    >>> partition_coords(b.build()["fc"], Config({"sample": 2, "feature": 2}, (0, 1, 2, 3)))
    [{'sample': 0, 'feature': 0}, {'sample': 0, 'feature': 1}, {'sample': 1, 'feature': 0}, {'sample': 1, 'feature': 1}]
    """
    names, grid = partition_grid(op, config)
    return [dict(zip(names, row)) for row in grid.tolist()]


def _nested_problems(op: Op, config: Config, at: str) -> list[Problem]:
    """A mixture-of-experts op's expert dims: together they must divide the experts, and
    nested in a token axis the product of the degrees on it must divide it."""
    experts = [d for d in op.dims if d.kind == EXPERT]
    if not experts or not all(isinstance(config.degree(d.name), int) and config.degree(d.name) >= 1 for d in op.dims):
        return []
    out = []
    ep = math.prod(config.degree(d.name) for d in experts)
    if experts[0].size % ep:
        out.append(Problem(f"{at}.degrees.expert", f"the expert degrees ({' x '.join(str(config.degree(d.name)) for d in experts)} "
                                                    f"= ep {ep}) do not divide the {experts[0].size} experts"))
    for d in experts:
        on_axis = [e for e in op.dims if e.out_axis == d.out_axis and e.kind != REPLICA]
        deg = math.prod(config.degree(e.name) for e in on_axis)
        size = op.out_tensors[0].shape[d.out_axis]
        if config.degree(d.name) > 1 and size % deg:
            out.append(Problem(f"{at}.degrees.{d.name}",
                               f"{' x '.join(e.name for e in on_axis)} = {deg} does not divide the "
                               f"{size} {op.out_tensors[0].axes[d.out_axis]} positions"))
    return out


def check_config(op: Op, config: Config, cluster: Cluster, at: str, microbatches: int,
                 checked: set[int] | None = None) -> list[Problem]:
    """Every problem of ``config`` for ``op`` (``at`` names it). ``checked``: ids of device
    tuples already found valid in this strategy, skipped (a 16,384-GPU layout repeats a few
    tuples of 16,384 ids over thousands of ops)."""
    problems: list[Problem] = []
    dims = {d.name: d for d in op.dims}
    for dim, deg in config.degrees.items():
        where = f"{at}.degrees.{dim}"
        if dim not in dims:
            valid = ", ".join(d.name for d in op.dims)
            problems.append(Problem(where, f"{op.kind} {op.name!r} has no dim {dim!r}; valid: {valid}"))
            continue
        if not isinstance(deg, int) or deg < 1:
            problems.append(Problem(where, f"degree must be a positive integer, got {deg!r}"))
            continue
        why = dims[dim].degree_problem(deg)
        if why:
            problems.append(Problem(where, why))
    problems += _nested_problems(op, config, at)
    deg = config.degree("sample") * math.prod(config.degree(d.name) for d in op.dims
                                              if d.kind == EXPERT and d.out_axis == 0)
    if "sample" in dims and microbatches > 1 and isinstance(deg, int) and deg >= 1:
        size = dims["sample"].size
        if not splits_into_microbatches(size, deg, microbatches) and size % deg == 0:
            problems.append(Problem(f"{at}.degrees.sample",
                                    f"{microbatches} microbatches of {size // deg} samples per partition do not divide "
                                    f"evenly (batch {size}, sample degree {deg})"))
    want = config.num_partitions
    if len(config.devices) != want:
        problems.append(Problem(f"{at}.devices",
                                f"{len(config.devices)} device(s) for {want} partition(s) (the product of the degrees)"))
    devs, n = config.devices, cluster.num_devices
    if checked is not None and id(devs) in checked:
        return problems
    if all(type(d) is int for d in devs) and len(set(devs)) == len(devs) and \
            (not devs or (min(devs) >= 0 and max(devs) < n)):
        if checked is not None:
            checked.add(id(devs))
        return problems  # (the common case, without the per-device messages below)
    seen: set[int] = set()
    for k, dev in enumerate(config.devices):
        if not isinstance(dev, int) or isinstance(dev, bool):
            problems.append(Problem(f"{at}.devices[{k}]", f"a device id must be an integer, got {dev!r}"))
        elif not 0 <= dev < cluster.num_devices:
            problems.append(Problem(f"{at}.devices[{k}]",
                                    f"device {dev} does not exist; {cluster.name} has devices 0..{cluster.num_devices - 1}"))
        elif dev in seen:
            problems.append(Problem(f"{at}.devices[{k}]", f"device {dev} runs two partitions of this op"))
        seen.add(dev)
    return problems
