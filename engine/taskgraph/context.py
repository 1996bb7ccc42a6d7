"""The records the segment builders share: what they read (:class:`BuildContext`) and what the
compute segments publish for the others (:class:`OpTables`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

    Also the handles of the optimizer steps (``updates``, ``[device]``) and the devices that run
    a representative partition of some op (``rep_devices``; counted per op so that a rebuild
    of one op updates it in O(devices of the op))."""

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
    _rep_count: np.ndarray = field(init=False)  # [device] ops with a representative partition there
    _rep_devs_of: dict[int, np.ndarray] = field(default_factory=dict)  # op -> its representative devices

    _PER_OP = ("fwd", "bwd", "fwd_ready", "fwd_in", "bwd_in", "bwd_out", "devs", "grid", "rep", "image", "fwd_s")

    def __post_init__(self) -> None:
        self._rep_count = np.zeros(self.n_devices, np.int64)

    def count_all_rep_devices(self) -> None:
        """Count every op's representative devices (after the first build's compute)."""
        self._rep_count[:] = 0
        self._rep_devs_of = {}
        seen: dict[tuple[int, int], np.ndarray] = {}  # ops share their device and representative arrays
        for oi, devs in self.devs.items():
            rep = self.rep[oi]
            new = seen.get((id(devs), id(rep)))
            if new is None:
                new = seen[(id(devs), id(rep))] = np.unique(devs[rep])
            self.count_rep_devices(oi, new)
        self.rep_devices = set(np.flatnonzero(self._rep_count).tolist())

    def count_rep_devices(self, oi: int, new: np.ndarray | None = None) -> None:
        """Recount op ``oi``'s representative devices (after its compute was rebuilt; ``new``:
        them, when already known)."""
        old = self._rep_devs_of.get(oi)
        if new is None:
            new = np.unique(self.devs[oi][self.rep[oi]])
        if old is not None:
            if np.array_equal(old, new):
                return
            self._rep_count[old] -= 1
        self._rep_count[new] += 1
        self._rep_devs_of[oi] = new
        if old is not None:
            self.rep_devices = set(np.flatnonzero(self._rep_count).tolist())

    def snapshot(self, oi: int) -> dict[str, Any]:
        """Op ``oi``'s rows and the device counts, for :meth:`restore`."""
        return {"rows": self.rows(oi),
                "rep_devices": set(self.rep_devices), "rep_devs_of": self._rep_devs_of[oi]}

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
        self._rep_count[self._rep_devs_of[oi]] -= 1
        self._rep_count[saved["rep_devs_of"]] += 1
        self._rep_devs_of[oi] = saved["rep_devs_of"]
        self.rep_devices = saved["rep_devices"]
