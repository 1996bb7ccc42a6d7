"""Search algorithms and baselines: functions from (graph, cluster, options) to strategies.

:data:`ALGORITHMS` lists the searches by name, so the CLI and the app offer them without a
hard-coded menu.
"""

from __future__ import annotations

from .mcmc import Budget, Progress, SearchResult, mcmc

__all__ = ["ALGORITHMS", "Budget", "Progress", "SearchResult"]

#: name -> (search function, one-line description)
ALGORITHMS = {
    "mcmc": (mcmc, "FlexFlow's MCMC over the SOAP space with delta simulation and successive halving"),
}
