"""Search algorithms and baselines: functions from (graph, cluster, options) to strategies.

:data:`ALGORITHMS` lists the searches by name, so the CLI and the app offer them without a
hard-coded menu.
"""

from __future__ import annotations

from .mcmc import Budget, Progress, SearchResult, mcmc
from .differentiable import differentiable
from .pase import pase
from .pipeline import pipeline

__all__ = ["ALGORITHMS", "Budget", "Progress", "SearchResult"]

#: name -> (search function, one-line description)
ALGORITHMS = {
    "mcmc": (mcmc, "FlexFlow's MCMC over the SOAP space with delta simulation and successive halving"),
    "pase": (pase, "PaSE's dynamic programming: the exact optimum of a per-op + per-edge cost (Elango IPDPS'21)"),
    "pipeline": (pipeline, "Alpa-style pipeline stages by dynamic programming, intra-op layouts inside, "
                           "stage communication, microbatches and hardware-aware placement"),
    "differentiable": (differentiable, "softmax-relaxed configs (DARTS-style), gradient descent with annealing, "
                                       "then discretised and polished"),
}
