"""Search algorithms and baselines: functions from (graph, cluster, budget, options) to strategies,
all following one protocol (:mod:`engine.search.api`).

:data:`ALGORITHMS` lists the searches by name, so the CLI and the app offer them without a
hard-coded menu; an algorithm's module is imported when it first runs, so listing them (or
simulating a strategy) loads none.
"""

from .api import (AutoOptions, Budget, DifferentiableOptions, MCMCOptions, PaseOptions, PipelineOptions, Progress,
                  SearchResult)
from .registry import ALGORITHMS, Algorithm, run_search

__all__ = ["ALGORITHMS", "Algorithm", "run_search", "Budget", "Progress", "SearchResult", "AutoOptions",
           "MCMCOptions", "PaseOptions", "PipelineOptions", "DifferentiableOptions"]
