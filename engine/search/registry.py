"""The registry of searches: each by name with its options type and a line saying what it is,
so the CLI and the app offer them without a hard-coded menu. An algorithm's module is imported
when it first runs (``engine.search.<name>.<name>``), so listing them (or simulating a strategy)
loads none; a search that runs others (``auto``) looks them up here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from .api import (AutoOptions, Budget, DifferentiableOptions, LayoutOptions, MCMCOptions, PaseOptions, PipelineOptions,
                  SearchResult,
                  parse_options)

__all__ = ["ALGORITHMS", "Algorithm", "run_search"]


@dataclass(frozen=True)
class Algorithm:
    """A registered search: ``engine.search.<name>.<name>`` with its options type."""

    name: str
    options: type
    description: str

    def run(self, graph, cluster, budget: Budget | None = None, *, seed: int = 0, progress=None, initial=None,
            cost=None, options: Any = None) -> SearchResult:
        """Run the search (see :mod:`engine.search.api` for the arguments)."""
        if options is not None and not isinstance(options, self.options):
            raise TypeError(f"{self.name} takes {self.options.__name__}, not {type(options).__name__}")
        fn = getattr(importlib.import_module(f"{__package__}.{self.name}"), self.name)
        return fn(graph, cluster, budget, seed=seed, progress=progress, initial=initial, cost=cost, options=options)

    def parse_options(self, pairs: list[str] | None) -> Any:
        """The options from ``["name=value", ...]`` (the CLI's ``--option``)."""
        return parse_options(self.options, pairs)


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("auto", AutoOptions,
              "the fast searches that apply (PaSE, differentiable, pipeline planner) as seeds, then MCMC from the "
              "best of them and the baselines; never slower than a feasible baseline or seed"),
    Algorithm("mcmc", MCMCOptions,
              "FlexFlow's MCMC over the SOAP space with delta simulation and successive halving"),
    Algorithm("pase", PaseOptions,
              "PaSE's dynamic programming: the exact optimum of a per-op + per-edge cost (Elango IPDPS'21)"),
    Algorithm("pipeline", PipelineOptions,
              "Alpa-style pipeline stages by dynamic programming, intra-op layouts inside, stage communication, "
              "microbatches and hardware-aware placement"),
    Algorithm("differentiable", DifferentiableOptions,
              "softmax-relaxed configs (DARTS-style), gradient descent with annealing, then discretised and polished"),
    Algorithm("layouts", LayoutOptions,
              "every framework layout (tp, pp, cp, ep, micro-batch; ZeRO-1, sp, the least recomputation that fits) "
              "under constraints: fixed or bounded degrees, the model's precision, a memory headroom, exportable "
              "to Megatron-LM, DeepSpeed or torchtitan"),
)}


def run_search(algorithm: str, graph, cluster, budget: Budget | None = None, **kwargs: Any) -> SearchResult:
    """``ALGORITHMS[algorithm].run(...)``, with a clear error for an unknown name."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown search algorithm {algorithm!r}; available: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[algorithm].run(graph, cluster, budget, **kwargs)
