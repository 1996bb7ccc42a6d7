"""The cost model: how long an operator partition, a transfer or a collective takes.

* :mod:`engine.costs.model`: :class:`CostModel` (a roofline, GEMMs by their shape, measured
  profile tables) and :class:`ProfileTable`;
* :mod:`engine.costs.collectives`: transfers and NCCL collectives on a cluster's links.
"""

from .collectives import COLLECTIVES, collective_time_s, group_collective_time_s, transfer_time_s
from .model import GROUPED_GEMM_SHARE, GROUPED_GEMM_TILE_M, MATMUL_KINDS, CostModel, ProfileTable

__all__ = ["CostModel", "ProfileTable", "collective_time_s", "group_collective_time_s", "transfer_time_s",
           "COLLECTIVES", "MATMUL_KINDS", "GROUPED_GEMM_SHARE", "GROUPED_GEMM_TILE_M"]
