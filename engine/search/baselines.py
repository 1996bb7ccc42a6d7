"""Baseline strategies: data parallel, model parallel, FlexFlow's expert, Megatron and FSDP.

Every baseline is registered in :data:`BASELINES`, so the CLI and the app list them without a
hard-coded menu. The simple ones are functions ``(graph, cluster, **options) -> Strategy``;
Megatron and FSDP are layouts (:class:`engine.layout.record.Layout`), built whole by
:mod:`engine.layout.build`, and take the record's fields their builder takes. Options a
baseline does not take are refused with the list of those it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping

from ..cluster import Cluster
from ..graph import Op, OpGraph
from ..layout.build import baseline_strategy, build_layout, fsdp
from ..layout.record import ON_BY_DEFAULT, Layout, options_for
from ..strategy.config import microbatch_count
from ..strategy import Config, PipelineSettings, Strategy

__all__ = ["BASELINES", "Baseline", "make_baseline", "data_parallel", "model_parallel", "expert"]


def _largest_divisor(size: int, at_most: int) -> int:
    """Largest d <= at_most dividing size (1 when size is 0, the replica dim)."""
    for d in range(min(size, at_most), 0, -1):
        if size % d == 0:
            return d
    return 1


@lru_cache(maxsize=256)
def _device_range(first: int, count: int) -> tuple[int, ...]:
    """The devices ``first .. first + count - 1``, one tuple shared by every op given them: a
    strategy's check then reads it once (by identity, :func:`engine.strategy.checks`), and
    GPT-3 175B's data-parallel strategy on 1,024 GPUs holds one tuple of 1,024 ids instead of
    2,410: 1.0 MiB instead of 52.8 (tracemalloc), built in 20 ms instead of 445."""
    return tuple(range(first, first + count))


def _range_config(op: Op, dim: str, n: int, first_device: int = 0) -> Config:
    """Split ``op`` along ``dim`` over up to ``n`` consecutive devices."""
    if dim not in op.dim_names:
        return Config.single(first_device)
    d = _largest_divisor(op.dim(dim).size, n)
    return Config({dim: d} if d > 1 else {}, _device_range(first_device, d))


def _microbatches(graph: OpGraph, dp: int, micro_batch: int | None) -> int:
    """Gradient-accumulation steps (1 without a micro-batch; :func:`engine.layout.microbatch_count`)."""
    return 1 if micro_batch is None else microbatch_count(graph.batch_size, dp, micro_batch)

# --------------------------------------------------------------------------- simple ones


def data_parallel(graph: OpGraph, cluster: Cluster, micro_batch: int | None = None) -> Strategy:
    """Every op split along its sample dim over all devices (fewer when the batch is not
    divisible by the device count: the largest divisor of the batch is used).

    ``micro_batch`` adds gradient accumulation: batch / (micro_batch x devices) steps.
    """
    n = _largest_divisor(graph.batch_size, cluster.num_devices)
    configs = {op.name: _range_config(op, "sample", n) for op in graph.ops}
    m = _microbatches(graph, n, micro_batch)
    return baseline_strategy(graph, cluster, configs, "data-parallel", {"micro_batch": micro_batch},
                   pipeline=PipelineSettings(1, m))


def model_parallel(graph: OpGraph, cluster: Cluster) -> Strategy:
    """Each op whole on one device; the op sequence (topological order) is cut into one
    contiguous run per device with about equal forward + backward FLOPs."""
    n = cluster.num_devices
    work = [op.fwd_flops + op.bwd_flops for op in graph.ops]
    total = sum(work) or 1.0
    configs, done = {}, 0.0
    for op, w in zip(graph.ops, work):
        centre = done + w / 2
        configs[op.name] = Config.single(min(n - 1, int(centre / total * n)))
        done += w
    return baseline_strategy(graph, cluster, configs, "model-parallel", {})


#: Op kinds FlexFlow's expert strategy treats as fully-connected layers (model parallel). An
#: embedding is a fully-connected layer applied to one-hot inputs, and model-parallel
#: embeddings are what keep the expert strategy's traffic for NMT well below data
#: parallelism's (FlexFlow §8.2: 24.2 GB against 65.8 GB per iteration).
_FC_KINDS = ("linear", "embedding")


def expert(graph: OpGraph, cluster: Cluster) -> Strategy:
    """FlexFlow's expert-designed baseline (Jia et al. SysML'19 §8.1, after Krizhevsky's
    "one weird trick", 2014): data parallelism for convolutional, recurrent and all other
    layers, model parallelism (split output features over the devices) for fully-connected
    layers and embeddings."""
    n = cluster.num_devices
    dp = _largest_divisor(graph.batch_size, n)
    configs = {}
    for op in graph.ops:
        if op.kind in _FC_KINDS:
            configs[op.name] = _range_config(op, "feature", n)
        else:
            configs[op.name] = _range_config(op, "sample", dp)
    return baseline_strategy(graph, cluster, configs, "expert", {})


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Baseline:
    """A registered baseline: ``build(graph, cluster, **options)``, or for a layout kind
    (``layout=True``) ``build(graph, cluster, Layout)``; ``options`` are the names it takes
    (a layout kind's: the :class:`engine.layout.record.Layout` fields its builder takes) and
    ``defaults`` what it sets when they are not given."""

    name: str
    build: Callable[..., Strategy]
    summary: str
    options: tuple[str, ...]
    layout: bool = False
    defaults: tuple[tuple[str, Any], ...] = ()

    def given(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options that say something (None is "not given"; so is a False switch, unless it
        turns off one that is on by default).

        Raises
        ------
        ValueError
            For an option this baseline does not take, listing those it does (as flags).
        """
        given = {k: v for k, v in options.items() if v is not None and (v is not False or k in ON_BY_DEFAULT)}
        extra = sorted(set(given) - set(self.options))
        if extra:
            flags = ", ".join("--" + e.replace("_", "-") for e in extra)
            takes = ", ".join("--" + o.replace("_", "-") for o in self.options) or "no options"
            raise ValueError(f"{self.name} does not take {flags}; it takes {takes}")
        return given

    def layout_of(self, options: Mapping[str, Any]) -> Layout:
        """The layout a layout kind builds from ``options`` (field names; text or typed values)
        with its defaults for what they do not give: the one typed record that goes to the
        builder (:func:`make_baseline`'s ``layout``).

        >>> BASELINES["fsdp"].layout_of({"tp": 2, "micro_batch": None}).zero_stage
        3
        """
        if not self.layout:
            raise ValueError(f"{self.name} is not a layout; layout kinds: "
                             f"{', '.join(b.name for b in BASELINES.values() if b.layout)}")
        return Layout.from_options({**dict(self.defaults), **self.given(options)})


BASELINES: dict[str, Baseline] = {
    b.name: b
    for b in [
        Baseline("data-parallel", data_parallel, "sample dim split over all devices", ("micro_batch",)),
        Baseline("model-parallel", model_parallel, "ops placed on devices in order, balanced by FLOPs", ()),
        Baseline("expert", expert, "FlexFlow's expert: data-parallel conv/recurrent, model-parallel FC", ()),
        Baseline("megatron", build_layout, "Megatron-LM tensor x pipeline x data parallelism",
                 options_for("megatron"), layout=True),
        Baseline("fsdp", fsdp, "FSDP / ZeRO sharded data parallelism (optionally with tp and pp)",
                 options_for("fsdp"), layout=True, defaults=(("zero_stage", 3),)),
    ]
}


def make_baseline(kind: str, graph: OpGraph, cluster: Cluster, layout: Layout | None = None,
                  **options: Any) -> Strategy:
    """Build baseline ``kind``: a layout kind from ``layout`` (the record whole: the command
    line's and the page's way, :meth:`Baseline.layout_of`) or from ``options`` (field names);
    another kind from ``options``. Options left as ``None`` are ignored (a False switch too,
    unless it turns off one that is on by default).

    Raises
    ------
    ValueError
        For an unknown kind, an option (or a layout field set away from its default) the kind
        does not take, or options it cannot honour.
    """
    if kind not in BASELINES:
        raise ValueError(f"unknown strategy kind {kind!r}; kinds: {', '.join(BASELINES)}")
    b = BASELINES[kind]
    if layout is not None:
        if not b.layout or options:
            raise ValueError(f"{kind}: a layout is given to a layout kind (megatron, fsdp), and alone")
        b.given(layout.to_options())  # (a field the kind does not take, set: refused with what it takes)
        return b.build(graph, cluster, layout)
    if b.layout:
        return b.build(graph, cluster, b.layout_of(options))
    return b.build(graph, cluster, **b.given(options))
