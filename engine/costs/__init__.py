"""The cost model: how long an operator partition, a transfer, a collective or a host-side
optimizer step takes.

* :mod:`engine.costs.model`: :class:`CostModel` (a roofline, GEMMs by their shape, grouped
  GEMMs, fused attention, the kernels beside them);
* :mod:`engine.costs.profile`: :class:`ProfileTable`, measured operator times read first;
* :mod:`engine.costs.collectives`: transfers and NCCL collectives on a cluster's links;
* :mod:`engine.costs.offload`: ZeRO-Offload's and ZeRO-Infinity's host-side optimizer step.
"""

from .collectives import COLLECTIVES, collective_time_s, group_collective_time_s, transfer_time_s
from .model import GROUPED_GEMM_SHARE, GROUPED_GEMM_TILE_M, MATMUL_KINDS, CostModel
from .offload import host_optimizer_time_s
from .profile import ProfileTable

__all__ = ["CostModel", "ProfileTable", "collective_time_s", "group_collective_time_s", "transfer_time_s",
           "host_optimizer_time_s", "COLLECTIVES", "MATMUL_KINDS", "GROUPED_GEMM_SHARE", "GROUPED_GEMM_TILE_M"]
