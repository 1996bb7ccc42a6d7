"""The task graph as arrays: task kinds, collective names and :class:`TaskGraph`, what the
simulator, the memory model and the exporters read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numba as nb
import numpy as np

__all__ = ["TaskGraph", "FWD", "BWD", "XFER", "COLL", "UPDATE", "BARRIER", "OFFLOAD", "KIND_NAMES", "COLL_NAMES",
           "COLL_INDEX"]

FWD, BWD, XFER, COLL, UPDATE, BARRIER, OFFLOAD = 0, 1, 2, 3, 4, 5, 6
KIND_NAMES = ("forward", "backward", "transfer", "collective", "update", "barrier", "offload")
COLL_NAMES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
COLL_INDEX = {n: i for i, n in enumerate(COLL_NAMES)}


@dataclass
class TaskGraph:
    """Tasks as arrays. Resources are numbered devices first (0..D-1), then links
    (D..D+L-1).

    Attributes (all ``[task]`` unless noted)
    ----------
    kind : int8
        FWD, BWD, XFER, COLL, UPDATE, BARRIER or OFFLOAD (a layer's saved activations copied to
        the host after its forward, 0 in ``part``, or back before its backward, 1: no resource,
        beside the compute; :mod:`engine.taskgraph.offload`).
    op : int32
        Op index (FWD/BWD/XFER/COLL of an op; OFFLOAD: the layer's last op), -1 for per-device tasks.
    part : int32
        Partition of the op (FWD/BWD), the direction of an OFFLOAD, -1 otherwise.
    mb : int32
        Microbatch, -1 for per-iteration tasks (gradient sync, update).
    device : int32
        Device of FWD/BWD/UPDATE tasks, -1 otherwise.
    dur_s : float64
        Duration in seconds.
    size_bytes : float64
        Bytes a transfer hop carries, or a collective's buffer size.
    flops : float64
        FLOPs of compute tasks.
    coll : int8
        Index into COLL_NAMES for collectives, -1 otherwise.
    link : int32
        Link of a transfer hop, -1 otherwise.
    res_ptr, res_idx : int64
        CSR resources ([task + 1], [nnz]).
    succ_ptr, succ_idx : int64
        CSR successors ([task + 1], [edges]).
    npred : int64
        Number of predecessors.
    chain_next : int64
        Next hop of a transfer (released ``chain_lag_s`` after this hop starts), -1 if none.
    chain_lag_s : float64
    """

    kind: np.ndarray
    op: np.ndarray
    part: np.ndarray
    mb: np.ndarray
    device: np.ndarray
    dur_s: np.ndarray
    size_bytes: np.ndarray
    flops: np.ndarray
    coll: np.ndarray
    link: np.ndarray
    res_ptr: np.ndarray
    res_idx: np.ndarray
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    npred: np.ndarray
    chain_next: np.ndarray
    chain_lag_s: np.ndarray
    n_devices: int
    n_links: int
    comm_bytes: float = 0.0  # bytes sent over all links in one iteration (collectives counted per rank)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tasks(self) -> int:
        return int(self.kind.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.succ_idx.shape[0])

    @property
    def edge_src(self) -> np.ndarray:
        """[edge] source task of every successor edge (computed once)."""
        src = self.info.get("_edge_src")
        if src is None:
            src = self.info["_edge_src"] = np.repeat(np.arange(self.num_tasks), np.diff(self.succ_ptr))
        return src

    def pred_lists(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR predecessors (``pred_ptr`` [task + 1], ``pred_idx`` [edges]): each task's
        predecessors in increasing id (the successor lists transposed, one counting pass)."""
        ptr = np.zeros(self.num_tasks + 1, np.int64)
        np.cumsum(np.bincount(self.succ_idx, minlength=self.num_tasks), out=ptr[1:])
        return ptr, _transpose(self.succ_ptr, self.succ_idx, ptr)




@nb.njit(cache=True, nogil=True)
def _transpose(succ_ptr, succ_idx, pred_ptr):  # pragma: no cover
    """[edge] the source of every edge grouped by target (``pred_ptr``'s CSR): sources visited
    in increasing id, so each target's list is sorted (a stable sort of the edges by target,
    in O(tasks + edges) instead of a sort's O(edges log edges): 0.2 s on GPT-3's 1 M tasks)."""
    pos = pred_ptr[:-1].copy()
    out = np.empty(succ_idx.shape[0], np.int64)
    for t in range(succ_ptr.shape[0] - 1):
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            v = succ_idx[k]
            out[pos[v]] = t
            pos[v] += 1
    return out
