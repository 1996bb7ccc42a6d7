"""MCMC strategy search (FlexFlow, Jia et al. SysML'19 §6), with multi-start successive halving.

Each step proposes a change to one operator's config: a random valid config for a random op,
or (FlexFlow's optional move) the config of a neighbouring op copied onto it. The proposal is
simulated by delta simulation and accepted by the Metropolis-Hastings rule
``min(1, exp(beta * (cost(S) - cost(S*))))`` (§6.2), where the cost is the simulated
iteration time and a strategy over any device's memory is rejected (its memory is checked
only when its time alone would be accepted: :func:`judge`). ``beta`` defaults to
``100 / cost(initial)``: a proposal 1% slower than the current strategy is accepted with
probability e^-1.

Many chains start at once (data parallel, FlexFlow's expert strategy, random strategies);
the budget is spent in rungs, and after each rung the worse half of the chains is dropped
(successive halving, Jamieson & Talwalkar 2016), so that sampling many starting points costs
little more than running the promising ones. The search stops when the budget (iterations or
seconds) is spent or the best cost has not improved for half of it, and returns the best
strategy seen, polished by greedy coordinate descent (:mod:`engine.search.polish`, the descent
``auto`` runs too) so that no single-op change or global move improves it.

Progress is one stream of :class:`Progress` rows that the CLI renders as a progress bar and
the app as a live trace; the callback may return ``False`` to cancel, and the best strategy
so far is returned.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace
from itertools import product as iproduct

from ..cluster import Cluster
from ..costs import CostModel
from ..sim.delta import DeltaSimulator
from ..graph import Op, OpGraph
from ..errors import TooLargeError
from ..strategy import Config, Strategy
from ..strategy.config import degree_choices
from ..taskgraph import tasks_within
from .api import (Budget, MCMCOptions, Price, Progress, ProgressFn, SearchResult, price, price_baselines, stamp,
    whole_cost)
from .baselines import data_parallel, expert
from .moves import Space
from .polish import coordinate_descent

__all__ = ["mcmc", "candidate_configs", "random_config", "local_polish", "Chain", "starting_points", "propose_op",
           "metropolis", "judge", "took", "price_of_sim", "delta_affordable"]


#: share of a time budget kept for the final polish (the chains stop at the rest)
POLISH_SHARE = 0.15


# --------------------------------------------------------------------------- configs


def _dims(op: Op) -> list:
    """Dims a search splits: all but the replica dim (redundant work never pays in FlexFlow's
    cost model)."""
    return [d for d in op.dims if not d.is_replica]


def candidate_configs(op: Op, n_devices: int, microbatches: int = 1, max_degrees: int = 64) -> list[Config]:
    """Every config a search considers for ``op``: degrees that divide their dims (at most
    ``max_degrees`` combinations, smallest products first) placed on aligned blocks of
    consecutive devices (as FlexFlow's SOAP space is usually sampled)."""
    dims = _dims(op)
    options = []
    for d in dims:
        options.append(degree_choices(d, n_devices, microbatches) or [1])
    combos = []
    for ks in iproduct(*options):
        parts = math.prod(ks)
        if parts <= n_devices and n_devices % parts == 0:
            combos.append(ks)
    combos.sort(key=lambda ks: (math.prod(ks), ks))
    out = []
    for ks in combos[:max_degrees]:
        parts = math.prod(ks)
        degrees = {d.name: k for d, k in zip(dims, ks) if k > 1}
        for start in range(0, n_devices, parts):
            out.append(Config(degrees, tuple(range(start, start + parts))))
    return out


def random_config(op: Op, n_devices: int, rng: random.Random, microbatches: int = 1) -> Config:
    """A random valid config: random degrees (product dividing the device count), placed on a
    random aligned block of consecutive devices, or on random devices one time in five."""
    dims = _dims(op)
    degrees: dict[str, int] = {}
    budget = n_devices
    for d in rng.sample(dims, len(dims)):
        ks = degree_choices(d, budget, microbatches)
        k = rng.choice(ks) if ks else 1
        if k > 1:
            degrees[d.name] = k
            budget //= k
    parts = math.prod(degrees.values())
    if rng.random() < 0.2:
        devices = tuple(rng.sample(range(n_devices), parts))
    else:
        start = rng.randrange(0, n_devices, parts) if n_devices % parts == 0 else 0
        devices = tuple(range(start, start + parts))
    return Config(degrees, devices)


# --------------------------------------------------------------------------- chains


class Chain:
    """One Markov chain: its strategy, the delta simulator its single-op moves edit (built
    when first needed after a global move replaced the strategy), and its costs."""

    def __init__(self, name: str, strategy: Strategy, sim: DeltaSimulator | None, rng: random.Random, beta: float,
                 cost: float) -> None:
        self.name, self.sim, self.rng, self.beta = name, sim, rng, beta
        self._strategy = strategy
        self.cost = cost
        self.best_cost = cost
        self.best = strategy
        self.proposals = 0
        self.accepted = 0
        self.delta_ok = sim is not None  # single-op moves (a delta simulator) are affordable
        self.seconds = {"op": 0.0, "global": 0.0}  # time spent on each family of moves
        self.counts = {"op": 0, "global": 0}

    @property
    def strategy(self) -> Strategy:
        return self.sim.strategy if self.sim is not None else self._strategy

    def simulator(self, graph: OpGraph, cluster: Cluster, cost: CostModel) -> DeltaSimulator:
        if self.sim is None:
            self.sim = DeltaSimulator(graph, self._strategy, cluster, cost)
        return self.sim

    def jump(self, strategy: Strategy, delta_ok: bool) -> None:
        """Take an accepted global move (its simulator is built when a single-op move needs it,
        if ``delta_ok``: its full task graph is small enough, :func:`delta_affordable`)."""
        self.sim, self._strategy, self.delta_ok = None, strategy, delta_ok

    def global_turn(self, share: float, timed: bool) -> bool:
        """Whether the next proposal is a global move: a ``share`` of the proposals, or with a
        time budget a ``share`` of the time (global moves rebuild the whole task graph, single-op
        moves only a segment, so their cost per proposal differs by 10-100x)."""
        if share <= 0:
            return False
        p = share
        if timed and self.counts["op"] and self.counts["global"]:
            t_op = self.seconds["op"] / self.counts["op"]
            t_glob = self.seconds["global"] / self.counts["global"]
            p = share * t_op / (share * t_op + (1 - share) * t_glob)
        return self.rng.random() < p


def price_of_sim(sim: DeltaSimulator, graph: OpGraph, cluster: Cluster) -> Price:
    return price(graph, sim.strategy, cluster, timeline=sim.timeline)


def _cost(sim: DeltaSimulator, graph: OpGraph, cluster: Cluster, check_memory: bool) -> float:
    """:attr:`Price.cost_s` (inf when a device runs out of memory), or the simulated time
    alone without ``check_memory``."""
    return price_of_sim(sim, graph, cluster).cost_s if check_memory else sim.timeline.makespan_s


def judge(chain: Chain, sim: DeltaSimulator, graph: OpGraph, cluster: Cluster, check_memory: bool) -> float | None:
    """:func:`metropolis` on ``sim``'s changed strategy: its cost when the chain takes it, else
    None. Time first, memory only for a move the time would take: most proposals are rejected
    on time and skip the check (~1 ms of ~7 on Inception-v3 / 16 GPUs). A move over memory is
    rejected as before; its random draw is now taken whenever its time is worse."""
    time_s = sim.timeline.makespan_s
    if not metropolis(chain, time_s) or _cost(sim, graph, cluster, check_memory) == math.inf:
        return None
    return time_s


#: the largest full task graph (estimated) a chain edits by delta simulation: a proposal costs
#: time in proportion (GPT-3 under data parallelism on 1,024 GPUs, 3.7 M tasks: ~10 s a
#: proposal and 5.7 GB); beyond it only global moves run, priced with the symmetric build
DELTA_MAX_TASKS = 1_000_000


def delta_affordable(graph: OpGraph, strategy: Strategy, cluster: Cluster | None = None) -> bool:
    """Whether a delta simulator (a full build: edits break symmetry) of ``strategy`` stays
    within DELTA_MAX_TASKS."""
    return tasks_within(graph, strategy, DELTA_MAX_TASKS, cluster) <= DELTA_MAX_TASKS


def metropolis(chain: Chain, new: float) -> bool:
    """The Metropolis-Hastings rule (FlexFlow §6.2): always take a better (or equal) strategy,
    a worse one with probability exp(-beta * (new - cost)); never one over memory (inf)."""
    delta = chain.cost - new  # > 0 when better
    return new < math.inf and (delta >= 0 or chain.rng.random() < math.exp(chain.beta * delta))


def took(chain: Chain, new: float) -> None:
    chain.cost = new
    chain.accepted += 1
    if new < chain.best_cost:
        chain.best_cost, chain.best = new, chain.strategy


def propose_op(chain: Chain, sim: DeltaSimulator, graph: OpGraph, cluster: Cluster, names: list[str],
             neighbours: dict[str, list[str]]) -> tuple[str, Config]:
    rng = chain.rng
    name = rng.choice(names)
    op = graph[name]
    if rng.random() < 0.2 and neighbours[name]:
        # FlexFlow's optional move: copy a neighbouring op's config when it fits this op
        other = sim.strategy[rng.choice(neighbours[name])]
        if not sim.check(name, other):
            return name, other
    return name, random_config(op, cluster.num_devices, rng, max(1, sim.strategy.pipeline.microbatches))


def move_setup(graph: OpGraph, cluster: Cluster, opts: MCMCOptions
               ) -> tuple[Space, float, bool, list[str], dict[str, list[str]]]:
    """What proposing moves needs: the global moves' space, the share of global moves, whether
    the model has any, the op names and each op's neighbours in the graph."""
    space = Space(graph, cluster)
    share = opts.global_share if opts.global_share is not None else (0.5 if space.layers else 0.1)
    if not 0 <= share <= 1:
        raise ValueError(f"global_share must be between 0 and 1, got {share!r}")
    kinds = bool(share) and bool(space.kinds(data_parallel(graph, cluster)))
    names = [op.name for op in graph.ops]
    neighbours: dict[str, list[str]] = {n: [] for n in names}
    for (p, _, c, _) in graph.edges:
        neighbours[graph.ops[p].name].append(graph.ops[c].name)
        neighbours[graph.ops[c].name].append(graph.ops[p].name)
    return space, share, kinds, names, neighbours


def starting_points(graph: OpGraph, cluster: Cluster, rng: random.Random, chains: int, initial: Strategy | None
            ) -> list[tuple[str, Strategy]]:
    """The chains' starting points, named: ``initial`` (when given), data parallel, FlexFlow's
    expert strategy, then random strategies (one draw of ``rng`` each) up to ``chains``."""
    starts: list[tuple[str, Strategy]] = [("data-parallel", data_parallel(graph, cluster)),
                                         ("expert", expert(graph, cluster))]
    plain = starts[0][1]  # data parallel: one stage, one microbatch (random starts keep its settings)
    if initial is not None:
        starts.insert(0, ("initial", initial))
    names = [op.name for op in graph.ops]
    for k in range(max(0, chains - len(starts))):
        r = random.Random(rng.random())
        configs = {n: random_config(graph[n], cluster.num_devices, r, 1) for n in names}
        starts.append((f"random-{k}", replace(plain, configs=configs, found_by={}, cost={})))
    return starts


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
        Chains, inverse temperature, memory check, final polish.

    Returns
    -------
    SearchResult
        The best strategy (never slower than the best baseline), its cost, the baselines'
        costs, the progress trace.
    """
    opts = options or MCMCOptions()
    if opts.backend is not None:  # chains as tasks on a backend, sharing priced strategies (rounds)
        from .parallel import parallel_mcmc

        return parallel_mcmc(graph, cluster, budget, seed=seed, progress=progress, initial=initial, cost=cost,
                             options=opts)
    t0 = time.perf_counter()
    budget = budget or Budget()
    chains, beta, check_memory, polish = opts.chains, opts.beta, opts.check_memory, opts.polish
    rng = random.Random(seed)
    cost_model = cost or CostModel()
    space, share, kinds, names, neighbours = move_setup(graph, cluster, opts)
    timed = budget.seconds is not None
    starts = starting_points(graph, cluster, rng, chains, initial)
    # Random starts are made only while setting up has used less than a tenth of a time
    # budget: on large models a random strategy's task graph is many times data parallel's
    # (NMT on 64 GPUs: ~4 s to build, ~0.5 s a proposal), and such a chain is dropped at
    # the first rung anyway.
    setup_share = 0.1

    live: list[Chain] = []
    notes_start: list[str] = []
    start_prices: dict[str, Price] = {}
    build_s = 0.0  # the longest a starting simulation took to build (the polish builds one too)
    dp_editable = True  # (random starts need single-op moves: none where data parallel is too large to edit)
    for name, strategy in starts:
        if name.startswith("random-") and (budget.seconds is not None and time.perf_counter() - t0 >
                                           setup_share * budget.seconds or not dp_editable):
            break
        t_build = time.perf_counter()
        try:
            editable = delta_affordable(graph, strategy, cluster)
            dp_editable = dp_editable and (editable or name != "data-parallel")
            if editable:
                sim: DeltaSimulator | None = DeltaSimulator(graph, strategy, cluster, cost_model)
                p = price_of_sim(sim, graph, cluster)
            else:
                sim, p = None, price(graph, strategy, cluster, cost_model)
        except TooLargeError as e:
            notes_start.append(f"start {name} {e}")
            continue
        if name in ("data-parallel", "expert"):
            start_prices[name] = p
        c = p.cost_s if check_memory else p.time_s
        build_s = max(build_s, time.perf_counter() - t_build)
        b = beta if beta is not None else 100.0 / (c if math.isfinite(c) else p.time_s)
        live.append(Chain(name, strategy if sim is None else sim.strategy, sim, random.Random(rng.random()), b, c))
    if not live:
        raise TooLargeError("no starting strategy can be simulated: " + "; ".join(notes_start))
    best_chain = min(live, key=lambda ch: ch.best_cost)
    best, best_cost = best_chain.best, best_chain.best_cost
    trace: list[Progress] = []
    total_iters = budget.iterations
    rungs = max(1, math.ceil(math.log2(len(live)))) if len(live) > 1 else 1
    it = 0
    # (proposal, seconds) of the last improvement of the best; the clock starts after the
    # starting chains are built (on large models that takes a good part of a short budget)
    improved_at = (0, time.perf_counter() - t0)
    cancelled = False

    def out_of_budget() -> bool:
        elapsed = time.perf_counter() - t0
        if total_iters is not None and (it >= total_iters or (it > 0 and it - improved_at[0] >= total_iters / 2)):
            return True
        # stop as well when the best has not improved for half of the budget, or when the next
        # proposal would likely end past it (a proposal takes what the average one took: on
        # DeepSeek-V3 over 1,024 GPUs every move is a whole-strategy pricing of seconds)
        per = (elapsed - loop_t0) / it if it else 0.0
        return budget.seconds is not None and (elapsed + per >= search_s or
                                               elapsed - improved_at[1] >= budget.seconds / 2)

    # a time budget holds for the whole call: set-up (above) counts, and the final polish gets
    # the last POLISH_SHARE of it rather than running past it
    search_s = None if budget.seconds is None else budget.seconds * (1.0 - POLISH_SHARE if polish else 1.0)
    hard_stop = None if budget.seconds is None else t0 + budget.seconds  # (a move's pricing is abandoned there)
    loop_t0 = time.perf_counter() - t0  # (when the proposals start: their mean time excludes the set-up)
    rung = 0
    while live and not cancelled and not out_of_budget():
        # a rung: every live chain gets an equal share of the rung's proposals
        rung_iters = None if total_iters is None else max(1, total_iters // (rungs * len(live)))
        rung_secs = None if budget.seconds is None else search_s / rungs / len(live)
        for chain in list(live):
            t_start = time.perf_counter()
            k = 0
            while not out_of_budget():
                if rung_iters is not None and k >= rung_iters:
                    break
                if rung_secs is not None and time.perf_counter() - t_start >= rung_secs:
                    break
                it += 1
                k += 1
                chain.proposals += 1
                t_move = time.perf_counter()
                if not chain.delta_ok and not kinds:
                    break  # (nothing this chain can afford to move)
                if kinds and (not chain.delta_ok or chain.global_turn(share, timed)):
                    family = "global"
                    kind = chain.rng.choice(space.kinds(chain.strategy))
                    cand = space.propose(chain.strategy, kind, chain.rng)
                    new = None if cand is None else whole_cost(graph, cand, cluster, cost_model, check_memory,
                                                               hard_stop)
                    if new is not None and metropolis(chain, new):
                        chain.jump(cand, delta_affordable(graph, cand, cluster))
                        took(chain, new)
                else:
                    family = "op"
                    sim = chain.simulator(graph, cluster, cost_model)
                    name, config = propose_op(chain, sim, graph, cluster, names, neighbours)
                    if config != sim.strategy[name] and not sim.check(name, config):
                        sim.change(name, config)
                        new = judge(chain, sim, graph, cluster, check_memory)
                        if new is not None:
                            took(chain, new)
                        else:
                            sim.revert()
                chain.seconds[family] += time.perf_counter() - t_move
                chain.counts[family] += 1
                if chain.cost < best_cost:
                    best, best_cost = chain.strategy, chain.cost
                    improved_at = (it, time.perf_counter() - t0)
                if it % 10 == 0:
                    row = Progress(it, time.perf_counter() - t0, chain.cost, best_cost,
                                   sum(ch.accepted for ch in live) / max(1, sum(ch.proposals for ch in live)),
                                   len(live), best=best)
                    trace.append(row)
                    if progress is not None and progress(row) is False:
                        cancelled = True
                        break
            if cancelled:
                break
        rung += 1
        if len(live) > 1:
            live.sort(key=lambda ch: ch.best_cost)
            live = live[: max(1, len(live) // 2)]
        if rung >= rungs and total_iters is None and budget.seconds is None:
            break
    polished = False
    deadline = None if budget.seconds is None else t0 + budget.seconds
    if polish and not cancelled and (deadline is None or deadline - time.perf_counter() > 2 * build_s):
        # the polish gets as many evaluations as the search had proposals, or what is left of
        # the time budget (when that is more than building its simulation takes)
        holder = next((ch.sim for ch in live if ch.sim is not None and ch.sim.strategy is best), None)
        best, best_cost, polished = local_polish(graph, cluster, best, cost_model, check_memory,
                                                 max_evals=budget.iterations, deadline=deadline, sim=holder,
                                                 global_moves=kinds)
    elapsed = time.perf_counter() - t0
    trace.append(Progress(it, elapsed, best_cost, best_cost,
                          sum(ch.accepted for ch in live) / max(1, sum(ch.proposals for ch in live)), len(live)))
    if progress is not None:
        progress(trace[-1])
    found_by = {"algorithm": "mcmc", "seed": seed, "budget": str(budget), "options": {"chains": chains,
                                                                                       "beta": beta}}
    # the answer priced like every search's: a finite cost under the memory check already is
    final = Price(best_cost, True) if check_memory and math.isfinite(best_cost) else \
        price(graph, best, cluster, cost_model)
    baselines, notes = price_baselines(graph, cluster, cost_model, known=start_prices)
    notes = [n for n in notes_start if not n.startswith(("start data-parallel", "start expert"))] + notes
    return SearchResult(stamp(best, graph, cluster, found_by, final), final.cost_s, baselines, it, elapsed, trace,
                        cancelled, locally_optimal=polished, algorithm="mcmc", best_time_s=final.time_s, notes=notes)


def local_polish(graph: OpGraph, cluster: Cluster, strategy: Strategy, cost: CostModel | None = None,
                 check_memory: bool = True, max_evals: int | None = None, deadline: float | None = None,
                 sim: DeltaSimulator | None = None, global_moves: bool = True) -> tuple[Strategy, float, bool]:
    """MCMC's final polish: :func:`engine.search.polish.coordinate_descent` over every op's
    candidate configs and (with ``global_moves``) every global kind that can move the strategy,
    until a round improves nothing (FlexFlow's local-optimality check, extended to the whole
    space) or the budget ends. ``sim``: a delta simulator already holding ``strategy`` (a
    chain's), reused. Returns (strategy, cost, whether it finished: False when ``max_evals`` or
    the ``deadline`` (a perf_counter time) came first, or single-op moves were skipped)."""
    r = coordinate_descent(graph, cluster, strategy, cost, max_evals=max_evals, deadline=deadline, sim=sim,
                           global_moves=global_moves, kinds=None, check_memory=check_memory)
    return r.strategy, r.cost_s, r.finished
