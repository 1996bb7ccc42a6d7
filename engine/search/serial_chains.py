"""MCMC's chains in one process, with multi-start successive halving (FlexFlow, Jia et al.
SysML'19 §6; :func:`engine.search.mcmc.mcmc` without a backend).

Each step proposes a change to one operator's config: a random valid config for a random op,
or (FlexFlow's optional move) the config of a neighbouring op copied onto it; or, a share of
the time, a global move (:mod:`engine.search.moves`). A single-op proposal is simulated by
delta simulation and accepted by the Metropolis-Hastings rule
``min(1, exp(beta * (cost(S) - cost(S*))))`` (§6.2), where the cost is the simulated iteration
time and a strategy over any device's memory is rejected (its memory is checked only when its
time alone would be accepted: :func:`engine.search.chains.judge`). ``beta`` defaults to
``100 / cost(initial)``: a proposal 1% slower than the current strategy is accepted with
probability e^-1.

Many chains start at once (data parallel, FlexFlow's expert strategy, random strategies);
the budget is spent in rungs, and after each rung the worse half of the chains is dropped
(successive halving, Jamieson & Talwalkar 2016), so that sampling many starting points costs
little more than running the promising ones. The search stops when the budget (iterations or
seconds) is spent or the best cost has not improved for half of it, and returns the best
strategy seen, polished by greedy coordinate descent (:func:`engine.search.polish.local_polish`,
the descent ``auto`` runs too) so that no single-op change or global move improves it.

The search is one object, :class:`SerialChains`, whose stages run in order: starting the
chains, the rungs of proposals, the polish, the result.
"""

from __future__ import annotations

import math
import random
import time

from ..cluster import Cluster
from ..costs import CostModel
from ..errors import TooLargeError
from ..graph import OpGraph
from ..sim.delta import DeltaSimulator
from ..strategy import Strategy
from .api import (Budget, MCMCOptions, Price, Progress, ProgressFn, SearchResult, price, price_baselines, stamp,
                  whole_cost)
from .chains import (FINAL_POLISH_SHARE, Chain, delta_affordable, judge, metropolis, move_setup, price_of_sim,
                     propose_op, starting_points, took)
from .polish import local_polish

__all__ = ["serial_chains", "SerialChains"]

#: random starts are made only while setting up has used less than this share of a time
#: budget: on large models a random strategy's task graph is many times data parallel's (NMT on
#: 64 GPUs: ~4 s to build, ~0.5 s a proposal), and such a chain is dropped at the first rung
SETUP_SHARE = 0.1


def serial_chains(graph: OpGraph, cluster: Cluster, budget: Budget | None, *, seed: int = 0,
                  progress: ProgressFn | None = None, initial: Strategy | None = None, cost: CostModel | None = None,
                  options: MCMCOptions | None = None) -> SearchResult:
    """FlexFlow's MCMC in one process (the arguments and result of :func:`engine.search.mcmc.mcmc`)."""
    search = SerialChains(graph, cluster, budget or Budget(), seed, progress, initial, cost,
                          options or MCMCOptions())
    search.start()
    search.run()
    search.polish()
    return search.result()


class SerialChains:
    """One serial MCMC search: its chains, the best strategy so far, the budget's clock and the
    progress trace. :meth:`start`, :meth:`run`, :meth:`polish` and :meth:`result`, in order."""

    def __init__(self, graph: OpGraph, cluster: Cluster, budget: Budget, seed: int, progress: ProgressFn | None,
                 initial: Strategy | None, cost: CostModel | None, opts: MCMCOptions) -> None:
        self.t0 = time.perf_counter()
        self.graph, self.cluster, self.budget, self.seed, self.progress = graph, cluster, budget, seed, progress
        self.initial, self.opts = initial, opts
        self.rng = random.Random(seed)
        self.cost_model = cost or CostModel()
        self.space, self.share, self.kinds, self.names, self.neighbours = move_setup(graph, cluster, opts)
        self.timed = budget.seconds is not None
        self.live: list[Chain] = []
        self.notes_start: list[str] = []
        self.start_prices: dict[str, Price] = {}
        self.build_s = 0.0  # the longest a starting simulation took to build (the polish builds one too)
        self.trace: list[Progress] = []
        self.it = 0
        self.cancelled = False
        self.polished = False
        # a time budget holds for the whole call: set-up counts, and the final polish gets the
        # last FINAL_POLISH_SHARE of it rather than running past it
        self.search_s = None if budget.seconds is None else \
            budget.seconds * (1.0 - FINAL_POLISH_SHARE if opts.polish else 1.0)
        self.hard_stop = None if budget.seconds is None else self.t0 + budget.seconds  # (a pricing is abandoned there)

    # ------------------------------------------------------------------ the stages

    def start(self) -> None:
        """The starting chains (:func:`engine.search.chains.starting_points`), each with its
        delta simulator where one is affordable; random starts only while set-up is cheap."""
        graph, cluster, budget = self.graph, self.cluster, self.budget
        beta, check_memory = self.opts.beta, self.opts.check_memory
        dp_editable = True  # (random starts need single-op moves: none where data parallel is too large to edit)
        for name, strategy in starting_points(graph, cluster, self.rng, self.opts.chains, self.initial):
            if name.startswith("random-") and (budget.seconds is not None and time.perf_counter() - self.t0 >
                                               SETUP_SHARE * budget.seconds or not dp_editable):
                break
            t_build = time.perf_counter()
            try:
                editable = delta_affordable(graph, strategy, cluster)
                dp_editable = dp_editable and (editable or name != "data-parallel")
                if editable:
                    sim: DeltaSimulator | None = DeltaSimulator(graph, strategy, cluster, self.cost_model)
                    p = price_of_sim(sim, graph, cluster)
                else:
                    sim, p = None, price(graph, strategy, cluster, self.cost_model)
            except TooLargeError as e:
                self.notes_start.append(f"start {name} {e}")
                continue
            if name in ("data-parallel", "expert"):
                self.start_prices[name] = p
            c = p.cost_s if check_memory else p.time_s
            self.build_s = max(self.build_s, time.perf_counter() - t_build)
            b = beta if beta is not None else 100.0 / (c if math.isfinite(c) else p.time_s)
            chain_rng = random.Random(self.rng.random())
            self.live.append(Chain(name, strategy if sim is None else sim.strategy, sim, chain_rng, b, c))
        if not self.live:
            raise TooLargeError("no starting strategy can be simulated: " + "; ".join(self.notes_start))
        best_chain = min(self.live, key=lambda ch: ch.best_cost)
        self.best, self.best_cost = best_chain.best, best_chain.best_cost
        self.total_iters = budget.iterations
        self.rungs = max(1, math.ceil(math.log2(len(self.live)))) if len(self.live) > 1 else 1
        # (proposal, seconds) of the last improvement of the best; the clock starts after the
        # starting chains are built (on large models that takes a good part of a short budget)
        self.improved_at = (0, time.perf_counter() - self.t0)
        self.loop_t0 = time.perf_counter() - self.t0  # (when the proposals start: their mean excludes the set-up)

    def run(self) -> None:
        """Rungs of proposals: every live chain gets an equal share of a rung, then the worse
        half of the chains is dropped (successive halving)."""
        rung = 0
        while self.live and not self.cancelled and not self.out_of_budget():
            rung_iters = None if self.total_iters is None else max(1, self.total_iters // (self.rungs * len(self.live)))
            rung_secs = None if self.budget.seconds is None else self.search_s / self.rungs / len(self.live)
            for chain in list(self.live):
                self._turn(chain, rung_iters, rung_secs)
                if self.cancelled:
                    break
            rung += 1
            if len(self.live) > 1:
                self.live.sort(key=lambda ch: ch.best_cost)
                self.live = self.live[: max(1, len(self.live) // 2)]
            if rung >= self.rungs and self.total_iters is None and self.budget.seconds is None:
                break

    def polish(self) -> None:
        """The final polish (:func:`engine.search.polish.local_polish`): as many evaluations as
        the search had proposals, or what is left of the time budget (when that is more than
        building its simulation takes)."""
        deadline = None if self.budget.seconds is None else self.t0 + self.budget.seconds
        if not self.opts.polish or self.cancelled or (deadline is not None and
                                                       deadline - time.perf_counter() <= 2 * self.build_s):
            return
        holder = next((ch.sim for ch in self.live if ch.sim is not None and ch.sim.strategy is self.best), None)
        self.best, self.best_cost, self.polished = local_polish(
            self.graph, self.cluster, self.best, self.cost_model, self.opts.check_memory,
            max_evals=self.budget.iterations, deadline=deadline, sim=holder, global_moves=self.kinds)

    def result(self) -> SearchResult:
        """The best strategy, priced like every search's answer, with the baselines' prices."""
        graph, cluster, budget = self.graph, self.cluster, self.budget
        elapsed = time.perf_counter() - self.t0
        self.trace.append(Progress(self.it, elapsed, self.best_cost, self.best_cost, self._acceptance(),
                                   len(self.live)))
        if self.progress is not None:
            self.progress(self.trace[-1])
        found_by = {"algorithm": "mcmc", "seed": self.seed, "budget": str(budget),
                    "options": {"chains": self.opts.chains, "beta": self.opts.beta}}
        # the answer priced like every search's: a finite cost under the memory check already is
        final = Price(self.best_cost, True) if self.opts.check_memory and math.isfinite(self.best_cost) else \
            price(graph, self.best, cluster, self.cost_model)
        baselines, notes = price_baselines(graph, cluster, self.cost_model, known=self.start_prices)
        notes = [n for n in self.notes_start if not n.startswith(("start data-parallel", "start expert"))] + notes
        return SearchResult(stamp(self.best, graph, cluster, found_by, final), final.cost_s, baselines, self.it,
                            elapsed, self.trace, self.cancelled, locally_optimal=self.polished, algorithm="mcmc",
                            best_time_s=final.time_s, notes=notes)

    # ------------------------------------------------------------------ a chain's turn

    def out_of_budget(self) -> bool:
        """Whether the budget is spent: the proposals, or the time (stopping too when the best
        has not improved for half the budget, or when the next proposal would likely end past
        it: a proposal takes what the average one took; on DeepSeek-V3 over 1,024 GPUs every
        move is a whole-strategy pricing of seconds)."""
        elapsed = time.perf_counter() - self.t0
        total, it, improved_at = self.total_iters, self.it, self.improved_at
        if total is not None and (it >= total or (it > 0 and it - improved_at[0] >= total / 2)):
            return True
        per = (elapsed - self.loop_t0) / it if it else 0.0
        return self.budget.seconds is not None and (elapsed + per >= self.search_s or
                                                    elapsed - improved_at[1] >= self.budget.seconds / 2)

    def _turn(self, chain: Chain, rung_iters: int | None, rung_secs: float | None) -> None:
        """One chain's share of a rung: proposals until the share, the budget or a cancel."""
        t_start = time.perf_counter()
        k = 0
        while not self.out_of_budget():
            if rung_iters is not None and k >= rung_iters:
                break
            if rung_secs is not None and time.perf_counter() - t_start >= rung_secs:
                break
            self.it += 1
            k += 1
            chain.proposals += 1
            if not chain.delta_ok and not self.kinds:
                break  # (nothing this chain can afford to move)
            self._propose(chain)
            if chain.cost < self.best_cost:
                self.best, self.best_cost = chain.strategy, chain.cost
                self.improved_at = (self.it, time.perf_counter() - self.t0)
            if self.it % 10 == 0:
                row = Progress(self.it, time.perf_counter() - self.t0, chain.cost, self.best_cost, self._acceptance(),
                               len(self.live), best=self.best)
                self.trace.append(row)
                if self.progress is not None and self.progress(row) is False:
                    self.cancelled = True
                    break

    def _propose(self, chain: Chain) -> None:
        """One proposal: a global move priced whole, or a single-op move by delta simulation;
        Metropolis-Hastings takes or leaves it."""
        graph, cluster, check_memory = self.graph, self.cluster, self.opts.check_memory
        t_move = time.perf_counter()
        if self.kinds and (not chain.delta_ok or chain.global_turn(self.share, self.timed)):
            family = "global"
            kind = chain.rng.choice(self.space.kinds(chain.strategy))
            cand = self.space.propose(chain.strategy, kind, chain.rng)
            new = None if cand is None else whole_cost(graph, cand, cluster, self.cost_model, check_memory,
                                                       self.hard_stop)
            if new is not None and metropolis(chain, new):
                chain.jump(cand, delta_affordable(graph, cand, cluster))
                took(chain, new)
        else:
            family = "op"
            sim = chain.simulator(graph, cluster, self.cost_model)
            name, config = propose_op(chain, sim, graph, cluster, self.names, self.neighbours)
            if config != sim.strategy[name] and not sim.check(name, config):
                sim.change(name, config)
                new = judge(chain, sim, graph, cluster, check_memory)
                if new is not None:
                    took(chain, new)
                else:
                    sim.revert()
        chain.seconds[family] += time.perf_counter() - t_move
        chain.counts[family] += 1

    def _acceptance(self) -> float:
        return sum(ch.accepted for ch in self.live) / max(1, sum(ch.proposals for ch in self.live))
