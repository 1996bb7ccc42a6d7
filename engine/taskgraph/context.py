"""The records the segment builders share: what they read (:class:`BuildContext`) and what the
compute segments publish for the others (:class:`OpTables`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..cluster import Cluster
from ..costs import CostModel
from ..graph import OpGraph
from ..strategy import Strategy
from .symmetry import Symmetry

__all__ = ["BuildContext", "OpTables"]


@dataclass(eq=False)
class BuildContext:
    """The inputs of one build and facts derived from them; no segment builder writes here
    (a rebuild replaces ``strategy``)."""

    graph: OpGraph
    strategy: Strategy
    cluster: Cluster
    cost: CostModel
    sym: Symmetry | None  # None: every partition is simulated
    #: microbatches given tasks, when fewer than the strategy's (:mod:`engine.sim.steady`: a
    #: pipeline's steady state is simulated for a few and extrapolated); each is still
    #: 1/``split`` of the batch. None: all of them.
    simulated: int | None = None
    #: (producer op, output index) -> [(consumer op, input index)], in edge order
    users: dict[tuple[int, int], list[tuple[int, int]]] = field(init=False)
    n_devices: int = field(init=False)

    def __post_init__(self) -> None:
        self.n_devices = self.cluster.num_devices
        self.users = {}
        for (p, o, c, i) in self.graph.edges:
            self.users.setdefault((p, o), []).append((c, i))

    @property
    def split(self) -> int:
        """Microbatches the batch is cut into (what one microbatch's sizes are a share of)."""
        return max(1, self.strategy.pipeline.microbatches)

    @property
    def microbatches(self) -> int:
        """Microbatches given tasks: :attr:`split`, or fewer (``simulated``)."""
        m = self.split
        return m if self.simulated is None else max(1, min(m, self.simulated))


@dataclass(eq=False)
class OpTables:
    """Per op, what its compute segment made and the transfer, synchronisation and schedule
    segments read: task handles (``[mb, part]``), partition geometry, and which partitions
    are simulated (representatives, under symmetry).

    Also the handles of the optimizer steps (``updates``, ``[device]``), the devices that run
    a representative partition of some op (``rep_devices``; counted per op so that a rebuild
    of one op updates it in O(devices of the op)), and of those the devices where an op whose
    tasks meet the schedule's barriers runs one (``bar_devices``, counted the same way: a
    full build makes a device's barrier chain exactly there, so an assembly after rebuilds
    leaves out a chain an earlier config made and no op uses now)."""

    n_devices: int
    fwd: dict[int, np.ndarray] = field(default_factory=dict)  # op -> [mb, part] forward task handles
    bwd: dict[int, np.ndarray] = field(default_factory=dict)  # op -> [mb, part] (ops with a backward)
    fwd_ready: dict[int, np.ndarray] = field(default_factory=dict)  # op -> [mb, part] output readable after
    # where an op's inputs arrive and its gradients leave, when not its own forward and
    # backward tasks: a mixture-of-experts layer's dispatch all-to-alls (op -> [mb, part])
    fwd_in: dict[int, np.ndarray] = field(default_factory=dict)
    bwd_in: dict[int, np.ndarray] = field(default_factory=dict)
    bwd_out: dict[int, np.ndarray] = field(default_factory=dict)
    grid: dict[int, tuple[list[str], np.ndarray]] = field(default_factory=dict)  # op -> split dims, [part, dim]
    devs: dict[int, np.ndarray] = field(default_factory=dict)  # op -> [part] device
    rep: dict[int, np.ndarray] = field(default_factory=dict)  # op -> [part] True for representatives
    image: dict[int, np.ndarray] = field(default_factory=dict)  # op -> [part] the representative it mirrors
    fwd_s: dict[int, np.ndarray] = field(default_factory=dict)  # op -> [part] forward seconds (one microbatch)
    updates: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [device] optimizer steps
    rep_devices: set[int] = field(default_factory=set)
    bar_devices: set[int] = field(default_factory=set)
    _rep_count: np.ndarray = field(init=False)  # [device] ops with a representative partition there
    _bar_count: np.ndarray = field(init=False)  # [device] the same, of the ops that meet the barriers
    _rep_devs_of: dict[int, np.ndarray] = field(default_factory=dict)  # op -> its representative devices
    _bar_ops: set[int] = field(default_factory=set)  # the ops counted in _bar_count

    _PER_OP = ("fwd", "bwd", "fwd_ready", "fwd_in", "bwd_in", "bwd_out", "devs", "grid", "rep", "image", "fwd_s")

    def __post_init__(self) -> None:
        self._rep_count = np.zeros(self.n_devices, np.int64)
        self._bar_count = np.zeros(self.n_devices, np.int64)

    def count_all_rep_devices(self, barriers: Callable[[int], bool] = lambda oi: False) -> None:
        """Count every op's representative devices (after the first build's compute);
        ``barriers(op)``: whether the op's tasks meet the schedule's barriers."""
        self._rep_count[:] = 0
        self._bar_count[:] = 0
        self._rep_devs_of, self._bar_ops = {}, set()
        seen: dict[tuple[int, int], np.ndarray] = {}  # ops share their device and representative arrays
        for oi, devs in self.devs.items():
            rep = self.rep[oi]
            new = seen.get((id(devs), id(rep)))
            if new is None:
                new = seen[(id(devs), id(rep))] = np.unique(devs[rep])
            self.count_rep_devices(oi, new, barriers(oi))
        self._recount()

    def count_rep_devices(self, oi: int, new: np.ndarray | None = None, barriers: bool = False) -> None:
        """Recount op ``oi``'s representative devices (after its compute was rebuilt; ``new``:
        them, when already known; ``barriers``: whether its tasks meet the schedule's barriers)."""
        old = self._rep_devs_of.get(oi)
        was = oi in self._bar_ops
        if new is None:
            new = np.unique(self.devs[oi][self.rep[oi]])
        if old is not None:
            if was == barriers and np.array_equal(old, new):
                return
            self._rep_count[old] -= 1
            if was:
                self._bar_count[old] -= 1
        self._rep_count[new] += 1
        if barriers:
            self._bar_count[new] += 1
            self._bar_ops.add(oi)
        else:
            self._bar_ops.discard(oi)
        self._rep_devs_of[oi] = new
        if old is not None:
            self._recount()

    def _recount(self) -> None:
        self.rep_devices = set(np.flatnonzero(self._rep_count).tolist())
        self.bar_devices = set(np.flatnonzero(self._bar_count).tolist())

    def snapshot(self, oi: int) -> dict[str, Any]:
        """Op ``oi``'s rows and the device counts, for :meth:`restore`."""
        return {"rows": self.rows(oi), "rep_devices": set(self.rep_devices), "bar_devices": set(self.bar_devices),
                "rep_devs_of": self._rep_devs_of[oi], "bar": oi in self._bar_ops}

    def rows(self, oi: int) -> dict[str, Any]:
        """Op ``oi``'s rows of every per-op table (what its compute segment publishes)."""
        return {name: getattr(self, name).get(oi) for name in self._PER_OP}

    def set_rows(self, oi: int, rows: dict[str, Any]) -> None:
        """Put back rows :meth:`rows` returned (the device counts are :meth:`count_rep_devices`')."""
        for name, value in rows.items():
            table = getattr(self, name)
            if value is None:
                table.pop(oi, None)
            else:
                table[oi] = value

    def restore(self, oi: int, saved: dict[str, Any]) -> None:
        self.set_rows(oi, saved["rows"])
        now = self._rep_devs_of[oi]
        self._rep_count[now] -= 1
        if oi in self._bar_ops:
            self._bar_count[now] -= 1
        self._rep_count[saved["rep_devs_of"]] += 1
        if saved["bar"]:
            self._bar_count[saved["rep_devs_of"]] += 1
            self._bar_ops.add(oi)
        else:
            self._bar_ops.discard(oi)
        self._rep_devs_of[oi] = saved["rep_devs_of"]
        self.rep_devices, self.bar_devices = saved["rep_devices"], saved["bar_devices"]
