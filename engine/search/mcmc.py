"""MCMC strategy search (FlexFlow, Jia et al. SysML'19 §6): the entry point the registry runs
(``engine.search.ALGORITHMS["mcmc"]``), which picks how the chains run.

The chains share one base (:mod:`engine.search.chains`: a chain, its proposals and the
Metropolis-Hastings rule) and run either in one process with successive halving
(:mod:`engine.search.serial_chains`) or as tasks on a backend in rounds of a fixed number of
proposals, sharing a cache of priced strategies (:mod:`engine.search.parallel_chains`). Both
end with the same greedy polish (:func:`engine.search.polish.local_polish`).

Progress is one stream of :class:`Progress` rows that the CLI renders as a progress bar and
the app as a live trace; the callback may return ``False`` to cancel, and the best strategy
so far is returned.
"""

from __future__ import annotations

from ..cluster import Cluster
from ..costs import CostModel
from ..graph import OpGraph
from ..strategy import Strategy
from .api import Budget, MCMCOptions, Progress, ProgressFn, SearchResult
from .parallel_chains import parallel_chains
from .serial_chains import serial_chains

__all__ = ["mcmc", "Progress"]


def mcmc(graph: OpGraph, cluster: Cluster, budget: Budget | None, *, seed: int = 0,
         progress: ProgressFn | None = None, initial: Strategy | None = None, cost: CostModel | None = None,
         options: MCMCOptions | None = None) -> SearchResult:
    """Search FlexFlow's SOAP space for a fast strategy of ``graph`` on ``cluster``.

    Parameters
    ----------
    budget : Budget
        Proposals, seconds, or both.
    seed : int
        Makes an iteration-budget search exactly reproducible.
    progress : callable, optional
        Called with a :class:`Progress` row every few proposals; returning ``False`` cancels.
    initial : Strategy, optional
        An extra starting point (e.g. a strategy being edited in the app).
    options : MCMCOptions
        Chains, inverse temperature, memory check, final polish; ``backend``: the chains as
        tasks on a backend in rounds (:mod:`engine.search.parallel_chains`), else in one
        process (:mod:`engine.search.serial_chains`).

    Returns
    -------
    SearchResult
        The best strategy (never slower than the best baseline), its cost, the baselines'
        costs, the progress trace.
    """
    opts = options or MCMCOptions()
    run = serial_chains if opts.backend is None else parallel_chains
    return run(graph, cluster, budget, seed=seed, progress=progress, initial=initial, cost=cost, options=opts)
