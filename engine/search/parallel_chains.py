"""MCMC chains as tasks on a backend (one process, a process pool, Ray), sharing their work.

FlexFlow's MCMC search (Jia et al. SysML'19 §6; :mod:`engine.search.mcmc`) runs its chains
one after another. Here every chain runs as a task on a :class:`~engine.search.processes.Backend`
for a *round* of a fixed number of proposals; between rounds the driver

1. merges the strategies each chain priced into a **shared cache** (key: :func:`strategy_key`,
   a canonical 64-bit hash of the strategy; value: its simulated time in seconds and whether it
   fits in memory), so that no chain simulates again a strategy any chain priced in an earlier
   round (a proposal found in the cache is accepted or rejected on the cached price; an
   accepted one still moves the chain's delta simulator);
2. **broadcasts the best so far**: a chain whose current strategy is more than
   ``adopt_gap`` slower than the best any chain found continues from the best (its own random
   stream, its inverse temperature re-set to ``100 / cost(best)`` unless ``beta`` is given).

Rounds end at fixed proposal counts, never at wall times, and results are merged in the
chains' order (ties: the lower chain), so with an iteration budget the answer (best strategy
and its time) for a seed is the same on every backend and any number of workers; a time
budget decides how many rounds run and may differ. Within a round a chain sees the cache as it
was at the round's start plus what it priced itself: what other chains price in the same round
reaches it only at the next round (this is what keeps the answer independent of the order the
workers finish in).

Every chain stays live (no successive halving): the broadcast moves the weak chains onto the
best region instead, so that every worker keeps working. The search ends with the greedy polish
of :func:`engine.search.polish.local_polish`, in the driver.

Preconditions not checked: the delta simulator's times equal a full simulation's bit for bit
(``tests/sim/test_delta.py`` pins this): a cached price and a re-simulated one are then the same
number, so which process simulated a strategy first does not change the walk.
"""

from __future__ import annotations

import math
import random
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..cluster import Cluster
from ..costs import CostModel
from ..sim.delta import DeltaSimulator
from ..errors import TooLargeError
from ..graph import OpGraph
from ..strategy import Config, Strategy, strategy_from_dict, validate_strategy
from .api import Budget, MCMCOptions, Price, Progress, ProgressFn, SearchResult, price, price_baselines, stamp
from .chains import (FINAL_POLISH_SHARE, Chain, delta_affordable, metropolis, move_setup, price_of_sim, propose_op,
                     starting_points, took)
from .polish import local_polish
from .moves import Space
from .keys import KEY_MASK, op_key, strategy_key
from .processes import Backend, check_backend

__all__ = ["parallel_chains", "PricedCache"]

@dataclass
class PricedCache:
    """The shared cache of priced strategies: key -> ``(time_s, feasible, chain)`` (the
    chain that priced it first), or None for a strategy that cannot be priced (refused by the
    loader's check or too large to simulate)."""

    entries: dict[int, tuple[float, bool, int] | None] = field(default_factory=dict)

    def merge(self, new: dict[int, tuple[float, bool, int] | None]) -> None:
        for k, v in new.items():
            self.entries.setdefault(k, v)  # (the same price whoever priced it: keep the first)

    def __len__(self) -> int:
        return len(self.entries)


# --------------------------------------------------------------------------- the worker side


class _WorkerState:
    """What a worker process keeps between its tasks of one search: the move space, the
    op-key memo and a few delta simulators by chain and strategy key (a chain that comes back
    to this worker, as :meth:`Backend.map`'s ``pin`` makes it, with the same strategy does not
    rebuild its simulator; a chain that took the best so far from another builds its own)."""

    def __init__(self, graph: OpGraph, cluster: Cluster) -> None:
        self.space = Space(graph, cluster)
        self.op_keys: dict[tuple[str, Config], int] = {}
        self.sims: OrderedDict[tuple[int, int], DeltaSimulator] = OrderedDict()  # (chain, key) -> simulator

    def op_key(self, op: str, config: Config) -> int:
        k = self.op_keys.get((op, config))
        if k is None:
            k = self.op_keys[(op, config)] = op_key(op, config)
        return k

    def keep(self, key: tuple[int, int], sim: DeltaSimulator, limit: int = 4) -> None:
        self.sims[key] = sim
        self.sims.move_to_end(key)
        while len(self.sims) > limit:
            self.sims.popitem(last=False)


#: per worker process: search token -> its state (the last two searches' only)
_STATES: OrderedDict[str, _WorkerState] = OrderedDict()


def _state(ctx: dict[str, Any]) -> _WorkerState:
    st = _STATES.get(ctx["token"])
    if st is None:
        st = _STATES[ctx["token"]] = _WorkerState(ctx["graph"], ctx["cluster"])
        while len(_STATES) > 2:
            _STATES.popitem(last=False)
    return st


def _whole_price(graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel) -> Price | None:
    """A global move's candidate priced (None when the loader refuses it or it is too large)."""
    if validate_strategy(strategy, graph, cluster):
        return None
    try:
        return price(graph, strategy, cluster, cost)
    except TooLargeError:
        return None


def _run_round(ctx: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """One chain's round on a worker: ``item["n"]`` proposals from its state; returns its new
    state, what it priced (for the shared cache) and its cache hits."""
    graph, cluster, cost_model = ctx["graph"], ctx["cluster"], ctx["cost"]
    check_memory, share, kinds, timed = ctx["check_memory"], ctx["share"], ctx["kinds"], ctx["timed"]
    names, neighbours = ctx["names"], ctx["neighbours"]
    st = _state(ctx)
    key = item["key"]
    sim = st.sims.pop((item["index"], key), None) if item["delta_ok"] else None
    strategy = sim.strategy if sim is not None else strategy_from_dict(item["strategy"])
    rng = random.Random()
    rng.setstate(item["rng"])
    chain = Chain(item["name"], strategy, sim, rng, item["beta"], item["cost"])
    chain.best_cost, chain.best, chain.delta_ok = item["best_cost"], None, item["delta_ok"]
    chain.seconds, chain.counts = dict(item["seconds"]), dict(item["counts"])
    chain.proposals, chain.accepted = item["proposals"], item["accepted"]
    shared, index = item["cache"], item["index"]
    new: dict[int, tuple[float, bool, int] | None] = {}
    hits_own = hits_other = priced = 0
    best_key = None

    def cost_of(v: tuple[float, bool, int] | None) -> float | None:
        if v is None:
            return None
        return v[0] if (v[1] or not check_memory) else math.inf

    def lookup(k: int) -> tuple[bool, tuple[float, bool, int] | None]:
        nonlocal hits_own, hits_other
        if not ctx["share_cache"]:
            return False, None
        if k in new:
            hits_own += 1
            return True, new[k]
        if k in shared:
            v = shared[k]
            if v is not None and v[2] != index:
                hits_other += 1
            else:
                hits_own += 1
            return True, v
        return False, None

    for _ in range(item["n"]):
        chain.proposals += 1
        t_move = time.perf_counter()
        if not chain.delta_ok and not kinds:
            break  # (nothing this chain can afford to move)
        if kinds and (not chain.delta_ok or chain.global_turn(share, timed)):
            family = "global"
            kind = chain.rng.choice(st.space.kinds(chain.strategy))
            cand = st.space.propose(chain.strategy, kind, chain.rng)
            if cand is not None:
                k = strategy_key(cand)
                hit, v = lookup(k)
                if not hit:
                    p = _whole_price(graph, cand, cluster, cost_model)
                    priced += 1
                    v = new[k] = None if p is None else (p.time_s, p.feasible, index)
                c = cost_of(v)
                if c is not None and metropolis(chain, c):
                    chain.jump(cand, delta_affordable(graph, cand, cluster))
                    key = k
                    took(chain, c)
                    if chain.best is chain.strategy:
                        best_key = key
        else:
            family = "op"
            sim = chain.simulator(graph, cluster, cost_model)
            name, config = propose_op(chain, sim, graph, cluster, names, neighbours)
            old = sim.strategy[name]
            if config != old and not sim.check(name, config):
                k = (key - st.op_key(name, old) + st.op_key(name, config)) & KEY_MASK
                hit, v = lookup(k)
                if hit:
                    c = cost_of(v)
                    if metropolis(chain, c):
                        sim.change(name, config)  # (a move, not a pricing: the price came from the cache)
                        key = k
                        took(chain, c)
                        if chain.best is chain.strategy:
                            best_key = key
                else:
                    sim.change(name, config)
                    p = price_of_sim(sim, graph, cluster)
                    priced += 1
                    v = new[k] = (p.time_s, p.feasible, index)
                    c = cost_of(v)
                    if metropolis(chain, c):
                        key = k
                        took(chain, c)
                        if chain.best is chain.strategy:
                            best_key = key
                    else:
                        sim.revert()
        chain.seconds[family] += time.perf_counter() - t_move
        chain.counts[family] += 1
    if chain.sim is not None:
        st.keep((index, key), chain.sim, ctx["keep"])
    return {"strategy": chain.strategy.to_dict(), "key": key, "rng": chain.rng.getstate(), "cost": chain.cost,
            "best_cost": chain.best_cost, "best": None if best_key is None else chain.best.to_dict(),
            "best_key": best_key, "proposals": chain.proposals, "accepted": chain.accepted,
            "delta_ok": chain.delta_ok, "seconds": chain.seconds, "counts": chain.counts, "new": new,
            "hits_own": hits_own, "hits_other": hits_other, "priced": priced}


# --------------------------------------------------------------------------- the driver

#: a chain's state that a round's task needs (its best so far stays with the driver)
_SHIPPED = ("name", "index", "strategy", "key", "rng", "beta", "cost", "best_cost", "proposals", "accepted",
            "delta_ok", "seconds", "counts")


def parallel_chains(graph: OpGraph, cluster: Cluster, budget: Budget | None, *, seed: int = 0,
                  progress: ProgressFn | None = None, initial: Strategy | None = None, cost: CostModel | None = None,
                  options: MCMCOptions | None = None) -> SearchResult:
    """MCMC with every chain a task on ``options.backend`` (``serial``/``local``, ``pool`` or
    ``ray``), rounds of ``round_proposals`` proposals a chain, a shared cache of priced
    strategies and the best so far broadcast between rounds (see the module's docstring).

    Parameters are those of :func:`engine.search.mcmc.mcmc`; ``options.backend`` must be set.

    Returns
    -------
    SearchResult
        As :func:`~engine.search.mcmc.mcmc`'s; its notes give the backend, the rounds, the
        proposals priced from the shared cache (from other chains and from the chain's own
        earlier proposals) and the best-so-far adoptions.

    Raises
    ------
    ValueError
        An unknown backend, a bad option (one line each).
    """
    search = _ParallelChains(graph, cluster, budget or Budget(), seed, progress, cost,
                             options or MCMCOptions(backend="serial"))
    search.start(initial)
    with Backend(search.backend, context=search.ctx, workers=search.opts.workers, address=search.opts.address) as pool:
        search.run(pool)
    search.polish()
    return search.result(pool.workers)


class _ParallelChains:
    """The state of one :func:`parallel_chains` search: the chains (as the dictionaries shipped
    to the workers), the shared cache, the best so far, the counts its notes report and the
    trace. :meth:`start`, :meth:`run`, :meth:`polish`, :meth:`result`, in order."""

    def __init__(self, graph: OpGraph, cluster: Cluster, budget: Budget, seed: int, progress: ProgressFn | None,
                 cost: CostModel | None, opts: MCMCOptions) -> None:
        self.t0 = time.perf_counter()
        self.backend = check_backend(opts.backend)
        if opts.workers is not None and not 1 <= opts.workers <= 4096:
            raise ValueError(f"workers must be between 1 and 4,096, got {opts.workers!r}")
        if opts.round_proposals is not None and not 1 <= opts.round_proposals <= 10**9:
            raise ValueError(f"round_proposals must be a positive whole number, got {opts.round_proposals!r}")
        if not 0 <= opts.adopt_gap <= 1e9 or math.isnan(opts.adopt_gap):
            raise ValueError(f"adopt_gap must be a non-negative fraction, got {opts.adopt_gap!r}")
        self.graph, self.cluster, self.budget, self.seed, self.progress, self.opts = \
            graph, cluster, budget, seed, progress, opts
        self.rng = random.Random(seed)
        self.cost_model = cost or CostModel()
        space, share, self.kinds, names, neighbours = move_setup(graph, cluster, opts)
        self.ctx = {"token": uuid.uuid4().hex, "graph": graph, "cluster": cluster, "cost": self.cost_model,
                    "check_memory": opts.check_memory, "share": share, "kinds": self.kinds,
                    "timed": budget.seconds is not None, "names": names, "neighbours": neighbours,
                    "share_cache": opts.share_cache,
                    "keep": max(4, opts.chains)}  # (delta simulators a worker keeps: one a chain)
        self.chains: list[dict[str, Any]] = []
        self.notes_start: list[str] = []
        self.start_prices: dict[str, Price] = {}
        self.cache = PricedCache()
        self.it = self.rounds = self.adopted = self.hits_own = self.hits_other = self.priced = 0
        self.trace: list[Progress] = []
        self.cancelled = False
        self.polished = False
        self.search_s = None if budget.seconds is None else \
            budget.seconds * (1.0 - FINAL_POLISH_SHARE if opts.polish else 1.0)
        self.round_s = 0.0  # the longest round took (s)
        self.most = 0  # the most proposals a chain made in a round

    def start(self, initial: Strategy | None) -> None:
        """The starting points, priced here as the serial search prices them (a full build
        where a delta simulator is affordable): the same draws of the seed's generator in the
        same order; then a first progress row with the best start (an interrupted search has
        a best so far to write)."""
        graph, cluster, opts = self.graph, self.cluster, self.opts
        here = _state(self.ctx)  # (this process's worker state: the serial backend reuses these simulators)
        for name, strategy in starting_points(graph, cluster, self.rng, opts.chains, initial):
            try:
                ok = delta_affordable(graph, strategy, cluster)
                if ok:
                    sim = DeltaSimulator(graph, strategy, cluster, self.cost_model)
                    p, strategy = price_of_sim(sim, graph, cluster), sim.strategy
                else:
                    p = price(graph, strategy, cluster, self.cost_model)
            except TooLargeError as e:
                self.notes_start.append(f"start {name} {e}")
                continue
            if name in ("data-parallel", "expert"):
                self.start_prices[name] = p
            c = p.cost_s if opts.check_memory else p.time_s
            key = strategy_key(strategy)
            if ok:
                here.keep((len(self.chains), key), sim, self.ctx["keep"])
            beta = opts.beta if opts.beta is not None else 100.0 / (c if math.isfinite(c) else p.time_s)
            self.chains.append({"name": name, "index": len(self.chains), "strategy": strategy.to_dict(), "key": key,
                                "rng": random.Random(self.rng.random()).getstate(), "beta": beta, "cost": c,
                                "best_cost": c, "best": strategy.to_dict(), "best_key": key, "proposals": 0,
                                "accepted": 0, "delta_ok": ok, "seconds": {"op": 0.0, "global": 0.0},
                                "counts": {"op": 0, "global": 0}})
        if not self.chains:
            raise TooLargeError("no starting strategy can be simulated: " + "; ".join(self.notes_start))
        self.n = len(self.chains)
        top = min(self.chains, key=lambda ch: (ch["best_cost"], ch["index"]))
        self.best_cost, self.best_dict = top["best_cost"], top["best"]
        self.improved_at = (0, time.perf_counter() - self.t0)
        self._report(Progress(0, time.perf_counter() - self.t0, self.best_cost, self.best_cost, 0.0, self.n,
                              best=strategy_from_dict(self.best_dict)))

    def run(self, pool: Backend) -> None:
        """Rounds until the budget: a proposal budget gives rounds of about an eighth of a
        chain's share; a time budget alone a first round of 8 proposals a chain, then rounds
        sized to take about a twentieth of the time; no budget, eight rounds."""
        total, budget = self.budget.iterations, self.budget
        per_round = self.opts.round_proposals or (max(1, min(64, math.ceil(total / (8 * self.n)))) if total else 8)
        adapt = self.opts.round_proposals is None and total is None and budget.seconds is not None
        while not self.cancelled:
            elapsed = time.perf_counter() - self.t0
            if total is not None and (self.it >= total or (self.it > 0 and self.it - self.improved_at[0] >= total / 2)):
                break
            if budget.seconds is not None and (elapsed + self.round_s >= self.search_s or
                                               elapsed - self.improved_at[1] >= budget.seconds / 2):
                break
            took_s = self._round(pool, per_round)
            self.round_s = max(self.round_s, took_s) if not adapt else took_s
            if adapt:  # (a time budget is allowed to differ run to run)
                per_round = max(1, min(1024, int(per_round * (budget.seconds / 20) / max(took_s, 1e-3))))
            if self.cancelled:
                break
            if total is None and budget.seconds is None and self.rounds >= 8:
                break  # (no budget: eight rounds)

    def _round(self, pool: Backend, per_round: int) -> float:
        """One round: every chain a task of ``per_round`` proposals (the last round what is
        left, in order), merged in the chains' order, then the broadcast. Returns its seconds."""
        n, total, chains = self.n, self.budget.iterations, self.chains
        self.most = max(self.most, per_round)
        counts = [per_round] * n
        if total is not None and total - self.it < per_round * n:  # (the last round: what is left, in order)
            left = total - self.it
            counts = [left // n + (1 if k < left % n else 0) for k in range(n)]
        snapshot = dict(self.cache.entries)
        items = [{**{f: ch[f] for f in _SHIPPED}, "n": counts[k], "cache": snapshot}
                 for k, ch in enumerate(chains) if counts[k]]
        t_round = time.perf_counter()
        results = pool.map(_run_round, items, pin=[item["index"] for item in items])
        took_s = time.perf_counter() - t_round
        self.rounds += 1
        for item, res in zip(items, results):  # merged in the chains' order
            ch = chains[item["index"]]
            self.it += res["proposals"] - ch["proposals"]
            ch.update(strategy=res["strategy"], key=res["key"], rng=res["rng"], cost=res["cost"],
                      best_cost=res["best_cost"], proposals=res["proposals"], accepted=res["accepted"],
                      delta_ok=res["delta_ok"], seconds=res["seconds"], counts=res["counts"])
            if res["best"] is not None:
                ch["best"], ch["best_key"] = res["best"], res["best_key"]
            self.cache.merge(res["new"])
            self.hits_own += res["hits_own"]
            self.hits_other += res["hits_other"]
            self.priced += res["priced"]
        self._broadcast()
        self._report(Progress(self.it, time.perf_counter() - self.t0, min(ch["cost"] for ch in chains),
                              self.best_cost, self._acceptance(), n, best=strategy_from_dict(self.best_dict)))
        return took_s

    def _broadcast(self) -> None:
        """The best so far, and weak chains continuing from it."""
        top = min(self.chains, key=lambda ch: (ch["best_cost"], ch["index"]))
        if top["best_cost"] < self.best_cost:
            self.best_cost, self.best_dict = top["best_cost"], top["best"]
            self.improved_at = (self.it, time.perf_counter() - self.t0)
        if math.isfinite(self.best_cost):  # the broadcast: weak chains continue from the best so far
            for ch in self.chains:
                if ch["cost"] > self.best_cost * (1.0 + self.opts.adopt_gap) and ch is not top:
                    ch.update(strategy=top["best"], key=top["best_key"], cost=self.best_cost,
                              delta_ok=delta_affordable(self.graph, strategy_from_dict(top["best"]), self.cluster))
                    if self.opts.beta is None:
                        ch["beta"] = 100.0 / self.best_cost
                    self.adopted += 1

    def polish(self) -> None:
        """The driver's final polish (:func:`engine.search.polish.local_polish`)."""
        self.best = strategy_from_dict(self.best_dict)
        deadline = None if self.budget.seconds is None else self.t0 + self.budget.seconds
        if self.opts.polish and not self.cancelled and (deadline is None or
                                                         deadline - time.perf_counter() > 2 * self.round_s):
            self.best, self.best_cost, self.polished = local_polish(
                self.graph, self.cluster, self.best, self.cost_model, self.opts.check_memory,
                max_evals=self.budget.iterations, deadline=deadline, global_moves=self.kinds)

    def result(self, workers: int) -> SearchResult:
        """The best strategy priced like every search's answer; notes on the rounds and the cache."""
        graph, cluster, opts, it = self.graph, self.cluster, self.opts, self.it
        elapsed = time.perf_counter() - self.t0
        self.trace.append(Progress(it, elapsed, self.best_cost, self.best_cost, self._acceptance(), self.n))
        if self.progress is not None:
            self.progress(self.trace[-1])
        found_by = {"algorithm": "mcmc", "seed": self.seed, "budget": str(self.budget),
                    "options": {"chains": opts.chains, "beta": opts.beta, "backend": self.backend,
                                "round_proposals": self.most},
                    "rounds": self.rounds, "cache": {"hits_other": self.hits_other, "hits_own": self.hits_own,
                                                     "simulated": self.priced, "entries": len(self.cache),
                                                     "adopted": self.adopted}}
        final = Price(self.best_cost, True) if opts.check_memory and math.isfinite(self.best_cost) else \
            price(graph, self.best, cluster, self.cost_model)
        baselines, notes = price_baselines(graph, cluster, self.cost_model, known=self.start_prices)
        notes = [x for x in self.notes_start if not x.startswith(("start data-parallel", "start expert"))] + notes
        where = self.backend if self.backend != "pool" else f"pool of {workers} processes"
        hits = self.hits_other + self.hits_own
        notes.append(f"parallel chains on {where}: {self.n} chains, {self.rounds} rounds of up to {self.most} "
                     f"proposals a chain; shared cache: {hits} of {it} proposals priced from it ({self.hits_other} "
                     f"priced by another chain, {self.hits_own} by the same chain), {self.priced} simulated, "
                     f"{len(self.cache)} strategies cached; best so far adopted {self.adopted} times")
        return SearchResult(stamp(self.best, graph, cluster, found_by, final), final.cost_s, baselines, it, elapsed,
                            self.trace, self.cancelled, locally_optimal=self.polished, algorithm="mcmc",
                            best_time_s=final.time_s, notes=notes)

    def _report(self, row: Progress) -> None:
        self.trace.append(row)
        if self.progress is not None and self.progress(row) is False:
            self.cancelled = True

    def _acceptance(self) -> float:
        return sum(ch["accepted"] for ch in self.chains) / max(1, sum(ch["proposals"] for ch in self.chains))
