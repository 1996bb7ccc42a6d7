"""Search algorithms and baselines: functions from (graph, cluster, budget, options) to strategies,
all following one protocol (:mod:`engine.search.api`: budget, progress, result, typed options,
one memory-checked price).

* :mod:`engine.search.registry`: :data:`ALGORITHMS`, the searches by name (the CLI and the app
  offer them without a hard-coded menu; an algorithm's module is imported when it first runs);
* :mod:`engine.search.baselines`: data parallel, model parallel, FlexFlow's expert, and the
  layout kinds (Megatron, FSDP) built by :mod:`engine.layout.build`;
* MCMC (FlexFlow §6): :mod:`engine.search.chains` (the base: a chain, its proposals, the
  Metropolis-Hastings rule), run by :mod:`engine.search.serial_chains` (one process, successive
  halving) or :mod:`engine.search.parallel_chains` (rounds on a backend, a shared cache), picked
  by :mod:`engine.search.mcmc`; :mod:`engine.search.moves` (global moves),
  :mod:`engine.search.keys` (canonical strategy keys);
* :mod:`engine.search.polish`: greedy coordinate descent (auto's step and MCMC's final polish);
* :mod:`engine.search.pase` (with :mod:`engine.search.pase_placement`): PaSE's dynamic
  programming; :mod:`engine.search.pipeline`: Alpa-style stage planning;
  :mod:`engine.search.differentiable`: the softmax-relaxed search;
* :mod:`engine.search.auto` (with :mod:`engine.search.seed_layouts`,
  :mod:`engine.search.seed_runs`): the fast searches as seeds, the polish, then MCMC;
* :mod:`engine.search.processes`: the backends (one process, a process pool, Ray).
"""

from .api import (AutoOptions, Budget, DifferentiableOptions, LayoutOptions, MCMCOptions, PaseOptions, PipelineOptions, Progress,
                  SearchResult)
from .registry import ALGORITHMS, Algorithm, run_search

__all__ = ["ALGORITHMS", "Algorithm", "run_search", "Budget", "Progress", "SearchResult", "AutoOptions",
           "MCMCOptions", "PaseOptions", "PipelineOptions", "DifferentiableOptions", "LayoutOptions"]
