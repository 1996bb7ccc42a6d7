"""The task-graph builder: segments of compute, transfer and collective tasks for one training
iteration (see :mod:`engine.taskgraph`)."""

from __future__ import annotations

import gc
import itertools
import math
from typing import Any, Sequence

import numpy as np

from ..cluster import Cluster
from ..costs import CostModel
from ..errors import TooLargeError, check_cancel
from ..graph import OpGraph
from ..strategy import Strategy
from .assembly import SegmentStore, assemble
from .segments import Segment
from .compute import ComputeBuilder
from .context import BuildContext, OpTables
from .dataflow import DataflowBuilder
from .emit import Emitter
from .estimate import count_text, tasks_within
from .offload import OffloadPlan
from .schedule import SchedulePlan
from .symmetry import Symmetry, find_symmetry
from .sync import FsdpPlan, SyncBuilder
from .tasks import UPDATE, TaskGraph
from .twins import Twins

__all__ = ["TaskGraphBuilder", "build_task_graph"]


class TaskGraphBuilder:
    """Builds the task graph of ``strategy`` segment by segment, and rebuilds the segments of
    one op after its config changes (delta simulation).

    The work is split by concern, each part handed the records it needs: the
    :class:`BuildContext` (inputs), the :class:`OpTables` that compute segments publish, the
    :class:`Emitter` (the only place durations are set), the :class:`SegmentStore`, and one
    builder per segment kind: :class:`ComputeBuilder` (``("op", oi)``),
    :class:`DataflowBuilder` (``("tensor", p, o)``), :class:`SyncBuilder` (``("sync", unit)``),
    :class:`~engine.taskgraph.offload.OffloadPlan` (``("offload",)``: activation copies to the host),
    with the :class:`SchedulePlan`'s barriers (``("barriers", device)``) and the optimizer steps
    (``("updates",)``). A first build copies the segments that twin one it made before
    (:class:`~engine.taskgraph.twins.Twins`; ``twins=False`` builds every one: the same arrays).
    ``microbatches``: give tasks to only the first that many of the strategy's microbatches
    (each still its share of the batch; :mod:`engine.sim.steady`)."""

    def __init__(self, graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel,
                 symmetry: Symmetry | None = None, twins: bool = True, microbatches: int | None = None) -> None:
        self.ctx = BuildContext(graph, strategy, cluster, cost, symmetry, microbatches)
        self.tables = OpTables(cluster.num_devices)
        self.emit = Emitter(self.ctx)
        self.store = SegmentStore(cluster.num_devices)
        self.fsdp = FsdpPlan(self.ctx)
        self.schedule = SchedulePlan(self.ctx)
        self.compute = ComputeBuilder(self.ctx, self.tables, self.emit)
        self.dataflow = DataflowBuilder(self.ctx, self.tables, self.emit)
        self.sync = SyncBuilder(self.ctx, self.tables, self.emit, self.fsdp)
        self.offload = OffloadPlan(self.ctx, self.tables)
        #: a first build copies segments that twin earlier ones (:mod:`.twins`); False: builds all
        self.twins = twins
        self.copied = 0  # segments the last first build copied from twins
        #: (segment key, configs of the ops it reads) -> (segment, table rows): :meth:`_reuse`
        self._made: dict[tuple, tuple[Segment, dict | None]] = {}
        self._made_tasks = 0
        self.reused = 0  # segments rebuilds put back so far
        self._graph_tasks = 0  # tasks of the last assembly (bounds what _made keeps)

    @property
    def strategy(self) -> Strategy:
        """The strategy the current graph was built for."""
        return self.ctx.strategy

    def build(self, exact_only: bool = False, cancel: Any = None) -> TaskGraph | None:
        """The whole graph: optimizer steps, every op's compute, every tensor's transfers,
        every parameter unit's synchronisation. With ``exact_only`` (a symmetric build), None
        as soon as a transfer crosses replicas (the reduction would not be exact), before
        the rest is built.

        ``cancel`` (:func:`engine.errors.check_cancel`) is asked before each segment and
        between the assembly's steps: the build ends with :class:`~engine.errors.Cancelled`
        within one segment's (or one assembly step's) work of it being set (the builder is
        then unusable)."""
        D = self.ctx.n_devices
        check_cancel(cancel)
        seg = self.store.begin(("updates",), ())
        self.tables.updates = seg.add(D, UPDATE, device=np.arange(D), res=np.arange(D))
        twins = Twins(self.ctx, self.store, self.tables, self.schedule, self.fsdp,
                      self.compute.scatter_after) if self.twins else None
        for oi in range(len(self.ctx.graph.ops)):
            check_cancel(cancel)
            seg = self.store.begin(("op", oi), (oi,))
            if twins is None or not twins.compute(seg, oi, self.emit.mirror):
                self._build_op(oi, seg)
        self.tables.count_all_rep_devices(lambda oi: self.schedule.meets_barriers(oi, self.tables))
        for (p, o), users in self.ctx.users.items():
            check_cancel(cancel)
            seg = self.store.begin(("tensor", p, o), {p, *(c for c, _ in users)})
            if twins is None or not twins.tensor(seg, p, o):
                self.dataflow.build(seg, p, o)
            if exact_only and seg.cross_replica:
                return None
        for unit in self.fsdp.units:
            check_cancel(cancel)
            seg = self.store.begin(("sync", unit), self.fsdp.refs(unit))
            if twins is None or not twins.sync(seg, unit):
                self.sync.build(seg, unit)
        if self.offload.layers:
            check_cancel(cancel)
            self.offload.build(self.store.begin(("offload",), self.offload.refs))
        self.copied = twins.copied if twins is not None else 0
        return self._assemble(cancel)

    def rebuild(self, strategy: Strategy, ops: str | Sequence[str]) -> TaskGraph:
        """Change ``ops``' configs (an op's name, or several) to ``strategy``'s and rebuild only
        the segments that read them (their compute, the tensors they make or read, their
        parameter units and the units that prefetch after them), each once. The result is
        identical, array for array, to a full build of ``strategy`` (segments keep their
        slots, so the task order is the same).

        A compute or tensor segment a rebuild made before for the same configs of every op it
        reads is put back instead of made again (:meth:`_reuse`): a segment is a function of
        those configs and of what is fixed for the builder (the strategy's settings, the
        symmetry, the cost model). A search tries an op's configs again each round with its
        neighbours mostly unchanged: half of the segments of a 30 s coordinate descent on
        RNNTC / p100-4x4 were remade alike. Parameter units' segments are always made (they
        read which devices hold representatives, which every op's config moves)."""
        ois = self._indices(ops)
        self.ctx.strategy = strategy
        affected = self._reading(ois)
        for oi in ois:
            if not self._reuse(("op", oi)):
                self._build_op(oi)
                self._keep(("op", oi))
            self.tables.count_rep_devices(oi, barriers=self.schedule.meets_barriers(oi, self.tables))
        for key in affected:
            if key[0] == "tensor" and not self._reuse(key):
                self.dataflow.build(self.store.begin(key, self.store.refs[key]), key[1], key[2])
                self._keep(key)
        for key in affected:
            if key[0] == "sync":
                self.sync.build(self.store.begin(key, self.fsdp.refs(key[1])), key[1])
            elif key[0] == "offload":
                self.offload.build(self.store.begin(key, self.offload.refs))
        return self._assemble()

    def _indices(self, ops: str | Sequence[str]) -> list[int]:
        index = self.ctx.graph.index
        return [index[ops]] if isinstance(ops, str) else sorted({index[o] for o in ops})

    def _reading(self, ois: list[int]) -> list[tuple]:
        """Keys of the segments that read any of ops ``ois``, each once, in slot (build) order."""
        st = self.store
        if len(ois) == 1:
            return st.reading(ois[0])
        keys = set().union(*(st.readers.get(oi, ()) for oi in ois))
        return sorted(keys, key=st.slot_of.__getitem__)

    def _made_key(self, key: tuple) -> tuple:
        ops, configs = self.ctx.graph.ops, self.ctx.strategy.configs
        return (key, tuple(configs[ops[o].name] for o in sorted(self.store.refs[key])))

    def _reuse(self, key: tuple) -> bool:
        """Put back the segment made for ``key`` under the current configs, if one was kept
        (with a compute segment, its op's table rows)."""
        hit = self._made.get(self._made_key(key))
        if hit is None:
            return False
        seg, rows = hit
        self.reused += 1
        self.store.put(key, seg, set(self.store.refs[key]))
        if rows is not None:
            self.tables.set_rows(key[1], rows)
        return True

    def _keep(self, key: tuple) -> None:
        """Keep the segment just made for ``key`` for :meth:`_reuse`; at most about one graph's
        tasks are kept (all let go past that)."""
        seg = self.store.segments[key]
        if self._made_tasks + seg.n > max(self._graph_tasks, 1 << 16):
            self._made.clear()
            self._made_tasks = 0
        self._made[self._made_key(key)] = (seg, self.tables.rows(key[1]) if key[0] == "op" else None)
        self._made_tasks += seg.n

    def snapshot(self, ops: str | Sequence[str]) -> dict[str, Any]:
        """What :meth:`rebuild` of ``ops`` replaces, so that :meth:`restore` can undo it."""
        ois = self._indices(ops)
        st = self.store
        return {"ois": ois, "segments": {k: (st.segments[k], st.refs[k]) for k in self._reading(ois)},
                "tables": [self.tables.snapshot(oi) for oi in ois], "strategy": self.ctx.strategy,
                "previous": st.previous}

    def restore(self, snap: dict[str, Any]) -> None:
        for k, (seg, refs) in snap["segments"].items():
            self.store.put(k, seg, refs)
        for oi, saved in zip(snap["ois"], snap["tables"]):  # (each op's counts moved back: any order)
            self.tables.restore(oi, saved)
        self.ctx.strategy = snap["strategy"]
        self.store.previous = snap["previous"]

    def _build_op(self, oi: int, seg: Segment | None = None) -> None:
        """Op ``oi``'s compute segment, into ``seg`` (begun for it, empty) or a new one."""
        seg = seg if seg is not None else self.store.begin(("op", oi), (oi,))
        self.compute.build(seg, oi)
        self.schedule.edges(seg, oi, self.tables, self._barriers_of)

    def _barriers_of(self, device: int) -> np.ndarray:
        return self.store.barriers(device, self.schedule.units - 1)

    def _assemble(self, cancel: Any = None) -> TaskGraph:
        tg = assemble(self.store, self.ctx, self.tables, self.emit, self._device_image(), cancel)
        self._graph_tasks = tg.num_tasks
        return tg

    def _device_image(self) -> np.ndarray:
        """[device] the representative device whose timeline each device mirrors (itself
        without symmetry; -1 for unused devices)."""
        t = self.tables
        image = np.full(self.ctx.n_devices, -1, np.int64)
        if self.ctx.sym is None:  # every partition is a representative: used devices mirror themselves
            used = np.fromiter(t.rep_devices, np.int64, len(t.rep_devices))
            image[used] = used
            return image
        for oi in t.devs:
            image[t.devs[oi]] = t.devs[oi][t.image[oi]]
        return image


def build_task_graph(graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel | None = None,
                     symmetry: str = "auto", max_tasks: int | None = None, cancel: Any = None,
                     microbatches: int | None = None) -> TaskGraph:
    """Build the task graph of one training iteration of ``graph`` under ``strategy``.

    Parameters
    ----------
    graph, strategy, cluster
        ``strategy`` must be valid for them (:func:`engine.strategy.validate_strategy`).
    cost : CostModel, optional
        Defaults to the roofline of measured kernel rates (nothing fitted on training runs).
    symmetry : {"auto", "off", "only"}
        ``auto`` simulates one representative per set of identical replicas when
        :func:`find_symmetry` finds an exact symmetry (and no transfer crosses replicas);
        the timeline then holds the representatives' tasks, and ``info["device_image"]``
        maps every device to the representative it mirrors. ``only``: the same, but without
        an exact symmetry :class:`~engine.errors.TooLargeError` instead of a full build.
    max_tasks : int, optional
        Refuse (:class:`~engine.errors.TooLargeError`) a full build that
        :func:`estimate_tasks` puts above this many tasks; a symmetric build is not limited.
    cancel : threading.Event or callable, optional
        Asked before any work and between segments (:func:`engine.errors.check_cancel`).
    microbatches : int, optional
        Simulate only the first that many microbatches (each still 1/m of the batch): the
        iteration cut short that :mod:`engine.sim.steady` extrapolates. Default: all of them.

    Returns
    -------
    TaskGraph

    Raises
    ------
    TooLargeError
        See ``max_tasks``.
    Cancelled
        When ``cancel`` is set before the build ends (nothing is returned).
    """
    check_cancel(cancel)
    cost = cost or CostModel()
    # The builder makes few Python objects but many arrays; pausing the cyclic garbage
    # collector avoids its full passes over a large heap (no reference cycles are made).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        sym = find_symmetry(graph, strategy, cluster) if symmetry in ("auto", "only") else None
        if sym is not None:
            tg = TaskGraphBuilder(graph, strategy, cluster, cost, sym, microbatches=microbatches).build(
                exact_only=True, cancel=cancel)
            if tg is not None:
                return tg
            # Some transfer crosses replicas along an axis (a FlexFlow-style split whose ranks
            # exchange regions point to point; sequence and context parallelism's gathers are
            # collectives, which do not): keep the largest subsets of
            # the axes, most replicas first, until one is exact (at most 6 more tries, each
            # of representatives only and stopped at the first crossing transfer).
            subsets = [keep for k in range(len(sym.axes) - 1, 0, -1)
                       for keep in itertools.combinations(sym.axes, k)]
            subsets.sort(key=lambda keep: -math.prod(d for d, _ in keep))
            for keep in subsets[:6]:
                sub = find_symmetry(graph, strategy, cluster, axes=keep)
                if sub is None:
                    continue
                tg = TaskGraphBuilder(graph, strategy, cluster, cost, sub, microbatches=microbatches).build(
                    exact_only=True, cancel=cancel)
                if tg is not None:
                    return tg
        if symmetry == "only":
            raise TooLargeError("not simulated: the strategy has no exact symmetry (symmetry='only')")
        if max_tasks is not None:
            n = tasks_within(graph, strategy, max_tasks, cluster)
            if n > max_tasks:
                raise TooLargeError(f"not simulated: {count_text(n, max_tasks)} tasks without symmetry, more than the "
                                    f"{max_tasks:,} allowed")
        return TaskGraphBuilder(graph, strategy, cluster, cost, microbatches=microbatches).build(cancel=cancel)
    finally:
        if was_enabled:
            gc.enable()
