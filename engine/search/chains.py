"""What MCMC's chains share (FlexFlow, Jia et al. SysML'19 §6): a chain (its strategy, its delta
simulator, its costs), the configs it proposes, the Metropolis-Hastings rule, the moves' set-up
and the chains' starting points. The variants run chains on top of it: in one process with
successive halving (:mod:`engine.search.serial_chains`) or in rounds on a backend with a shared
cache (:mod:`engine.search.parallel_chains`); :func:`engine.search.mcmc.mcmc` picks one, and
the final polish (:func:`engine.search.polish.local_polish`) reads the configs proposed here.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from itertools import product as iproduct

from ..cluster import Cluster
from ..costs import CostModel
from ..graph import Op, OpGraph
from ..sim.delta import DeltaSimulator
from ..strategy import Config, Strategy
from ..strategy.config import degree_choices
from ..taskgraph import tasks_within
from .api import MCMCOptions, Price, price
from .baselines import data_parallel, expert
from .moves import Space

__all__ = ["Chain", "candidate_configs", "degree_combos", "CANDIDATE_COMBOS", "random_config", "starting_points",
           "propose_op", "metropolis", "judge", "took", "price_of_sim", "delta_affordable", "move_setup",
           "DELTA_MAX_TASKS", "FINAL_POLISH_SHARE"]

#: share of a time budget MCMC keeps for its final polish (the chains stop at the rest)
FINAL_POLISH_SHARE = 0.15
#: most degree combinations an op's candidate configs use (:func:`degree_combos`): every one of
#: an op of up to 3 split dims on 64 GPUs (84); a 4-dim op's (210 there) about as many
#: candidate configs as the 64 smallest products gave (652 against 628)
CANDIDATE_COMBOS = 96


def _dims(op: Op) -> list:
    """Dims a search splits: all but the replica dim (redundant work never pays in FlexFlow's
    cost model)."""
    return [d for d in op.dims if not d.is_replica]


def candidate_configs(op: Op, n_devices: int, microbatches: int = 1,
                      max_degrees: int = CANDIDATE_COMBOS) -> list[Config]:
    """Every config a search considers for ``op``: degrees that divide their dims (at most
    ``max_degrees`` combinations: :func:`degree_combos`) placed on aligned blocks of
    consecutive devices (as FlexFlow's SOAP space is usually sampled), smallest products first."""
    dims = _dims(op)
    options = []
    for d in dims:
        options.append(degree_choices(d, n_devices, microbatches) or [1])
    out = []
    for ks in degree_combos(options, n_devices, max_degrees):
        parts = math.prod(ks)
        degrees = {d.name: k for d, k in zip(dims, ks) if k > 1}
        for start in range(0, n_devices, parts):
            out.append(Config(degrees, tuple(range(start, start + parts))))
    return out


def degree_combos(options: list[list[int]], n_devices: int, limit: int) -> list[tuple[int, ...]]:
    """The degree combinations (one of ``options[i]`` per dim) whose product divides
    ``n_devices``, in the order (product, degrees); at most ``limit`` of them.

    Past ``limit``, every product keeps an equal share of the places (a product with fewer
    combinations gives its spare places to the others), and within a product the combinations
    that split fewer dims come first, the earlier dims split more (the sample dim: data
    parallelism). Keeping the smallest products alone left a 4-dim op on 64 GPUs no
    combination of product above 16: no search move could put a convolution back on all 64
    GPUs, data parallel (issue 43)."""
    levels: dict[int, list[tuple[int, ...]]] = {}
    for ks in iproduct(*options):
        parts = math.prod(ks)
        if parts <= n_devices and n_devices % parts == 0:
            levels.setdefault(parts, []).append(ks)
    if sum(len(v) for v in levels.values()) > limit:
        quota = dict.fromkeys(levels, 0)
        left = limit
        while left > 0:  # (one place to each product that still has combinations, in turn)
            for parts in sorted(levels):
                if left and quota[parts] < len(levels[parts]):
                    quota[parts] += 1
                    left -= 1
        for parts, combos in levels.items():
            combos.sort(key=lambda ks: (sum(k > 1 for k in ks), [-k for k in ks]))
            del combos[quota[parts]:]
    return sorted((ks for combos in levels.values() for ks in combos), key=lambda ks: (math.prod(ks), ks))


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
