"""Greedy coordinate descent over single-op configs: the polish ``auto`` runs on its best seed,
and MCMC's final polish (:func:`local_polish`, with every global kind).

For each op in turn, every candidate config of that op (:func:`engine.search.chains.candidate_configs`)
is priced by delta simulation with the other ops held fixed, and the best of them is kept when it
beats the current strategy; rounds over all ops repeat until a whole round improves nothing (a
local optimum under single-op changes: FlexFlow's local-optimality check, Jia et al. SysML'19
§6, run as a search), or the budget ends, and the best strategy so far is returned. The first
rounds try only the candidates that span every device of the op's pipeline stage (every device
without a pipeline; :func:`stage_spans`) (one placement per degree combination:
165 of AlexNet's 1,571 candidates on 16 GPUs, 163 of 6,863 on 64); when such a round improves
nothing, the rounds try every candidate. From PaSE's answer on AlexNet / ``p100-4x4`` that
reaches 12.85 ms in 134 candidates (0.7 s) instead of 1,436 (5 s). Each round begins with a
global pass over the move kinds with few neighbours (:data:`POLISH_KINDS`: a layer across a
pipeline stage boundary, the schedule, ZeRO, the microbatches, recomputation; MCMC's final polish
passes every kind that can move the strategy), each candidate priced whole and the first that
improves taken; a round whose strategy has not moved since the last global pass skips it (on
ResNet-101 / k80-16x4 the repeated pass and the wide round that tried nothing took the polish's
whole slice: from the planner's plan it now reaches 57.10 ms, where MCMC with 150 s reached
57.13; issue 43).

Ops are visited by their parameters for their compute (:func:`visit_order`): lookups first, then
by powers of two of parameters per flop, most parameters first within one, then the rest in graph
order; from the second round on, the ops the round before changed come first, since
each was chosen before the changes after it in that round (on RNNTC / ``p100-4x4``, from FlexFlow's
expert strategy, round 1 changes ``lstm.l0.t8`` at its 169th candidate and ends at 29.78 ms;
taking that change back gives 29.09 ms, at the 705th candidate instead of the 861st in graph
order). Whether an op's weights are worth replicating (data parallelism) or splitting
(model parallelism) turns on its parameter count against its compute; Krizhevsky's "one weird
trick" (arXiv:1404.5997, §2: convolutional layers hold 90-95% of the computation and 5% of the
parameters, fully connected layers the reverse) makes that choice per layer by that ratio.
Visiting the fully connected layers (and the embeddings) first lets a short budget reach that
decision, and the ops around them then follow. On AlexNet / ``p100-4x4`` the descent from
PaSE's answer (14.68 ms) reaches 12.85 ms, what MCMC reaches in 150 s (issue 28); in graph
order, without the wide rounds, it took 2,788.

**Class moves.** Where an op has alike twins (:func:`alike_classes`: the same kind, shapes,
attributes and parameter group, as the time steps of an unrolled RNN), the configs that made it
alone fastest are also tried for its whole class (the members on its pipeline stage)
(:func:`class_tries`: the fastest alone of each batch degree, then the fastest of the rest;
once a round per class), and the best is taken when it beats the op's own pick. One
config for forty time steps is not reachable by single-op moves: each step alone gains little
or loses (a step split apart from its neighbours redistributes its
tensors), all of them together gain much. On RNNLM / ``dgx-a100-40gb:8`` a 15 s ``auto`` went
from 9.06 to 7.24 ms with them (the best known, MCMC at 150 s, was 8.28). The class's best
config need not be among its op's best alone: from 7.24 ms, ``in_feature 8 x sample 8`` makes
one logits op 5% slower and all forty 5.32 ms (priced by hand; issue 43). A round visits every
op that is first of its class or has no twin before the twins (:func:`distinct_first`): an
unrolled RNN's steps otherwise fill the round's first hundred and more visits. The twins
come last first (the steps nearest the output: RNNTC / A100's decisive step, 108th).

**The aligned pass.** Each round begins with every class given together the configs that read
each member's input as its producer splits it (:func:`aligned_candidate`: Megatron-LM's
vocabulary-parallel loss under logits split by the vocabulary), class by class in graph order,
each priced and taken when faster, so one class's move is followed by its consumers' in
the same pass; a class is priced again only when those configs changed. Before it, such a move
came only when the descent visited the class (its 100th-160th candidate on NMT); NMT /
``p100-4x4`` from FlexFlow's expert strategy, 20 s descent: 49.19 ms at 11.6 s before, 40.74 ms
at 4.2 s with the pass (issue 43). It also moves classes where no delta simulator is
affordable, where the op visits never run.

**A class candidate is one edit** of the delta simulator where one is affordable
(:meth:`_Descent.priced`, :meth:`~engine.sim.delta.DeltaSimulator.trial_configs`: the segments
that read any member rebuilt once, the run resumed and stopped at the bound), else priced whole;
a class move taken is committed to the simulator, not a new one built. A candidate costs 2.4x
(RNNLM / ``k80-16x4``) to 24x (ResNet-101 / ``dgx-a100-40gb:8``) less than priced whole, the
same time to 1e-9 (``benchmarks/bench_class_pricing.py``, issue 43).

Deterministic: no random draws, so a number budget gives the same answer every time.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from ..cluster import Cluster
from ..costs import CostModel
from ..sim.delta import DeltaSimulator
from ..graph import OpGraph
from ..strategy import Strategy, validate_strategy
from .api import whole_cost
from .chains import candidate_configs, delta_affordable, price_of_sim
from .moves import Space
from .class_moves import CLASS_TRIES, aligned_candidate, class_tries
from .visits import alike_classes, distinct_first, stage_spans, visit_order

__all__ = ["PolishResult", "coordinate_descent", "local_polish", "visit_order", "POLISH_KINDS",
           "CLASS_TRIES", "class_tries", "alike_classes", "distinct_first",
           "stage_spans", "ZERO_ORDER"]

#: the global move kinds (:mod:`engine.search.moves`) each round tries before the single-op
#: configs: those with a handful of neighbours (a layer across a stage boundary, GPipe or 1F1B,
#: the microbatches halved or doubled, recomputation, the ZeRO stage), each priced whole. From
#: the pipeline planner's plan for ResNet-101 / p100-4x4 (50.40 ms) the split and schedule moves
#: reach 47.29 ms in 33 pricings (3.1 s), where MCMC with 150 s ends at 48.47-50.30 ms. ZeRO
#: before the microbatches and recomputation (which trade time for memory): from FlexFlow's
#: expert strategy for Inception-v3 / p100-4x4, ZeRO-2 takes 35.27 to 30.42 ms (MCMC with 150 s:
#: 34.59 ms), and when the microbatches came first a 15 s auto ran out of polish time before it.
#: The kinds with up to 64 neighbours each (``block``, ``layout``) are left to MCMC.
POLISH_KINDS = ("split", "schedule", "zero", "microbatches", "recompute")

@dataclass
class PolishResult:
    """What :func:`coordinate_descent` found.

    ``strategy``, ``cost_s``: the best strategy and its memory-checked simulated iteration time
    (s; inf when over memory); ``evals``: the candidates priced; ``rounds``: the rounds over all ops
    begun; ``finished``: a whole round improved nothing (a local optimum), False when the budget,
    the deadline or the callback stopped it first; ``improvements``: (evals so far, seconds since
    the start, cost_s) at each improvement; ``round_share``: the share of the current round's ops
    visited so far (0 during its global pass); ``pending_s``: the fastest time the op visit under
    way has priced that beats ``cost_s`` and is not taken yet (its own best pick, or a config for
    its class), inf when none."""

    strategy: Strategy
    cost_s: float
    evals: int = 0
    rounds: int = 0
    finished: bool = False
    improvements: list[tuple[int, float, float]] = field(default_factory=list)
    round_share: float = 0.0
    pending_s: float = math.inf

    @property
    def first_round(self) -> float | None:
        """:attr:`round_share` during the first round, None after it."""
        return self.round_share if self.rounds == 1 else None


def coordinate_descent(graph: OpGraph, cluster: Cluster, strategy: Strategy, cost: CostModel | None = None, *,
                       max_evals: int | None = None, deadline: float | None = None,
                       sim: DeltaSimulator | None = None, tick: Callable[[PolishResult], bool] | None = None,
                       until: Callable[[PolishResult], bool] | None = None,
                       global_moves: bool = True, kinds: tuple[str, ...] | None = POLISH_KINDS,
                       check_memory: bool = True) -> PolishResult:
    """Greedy coordinate descent from ``strategy`` over each op's candidate configs.

    Parameters
    ----------
    max_evals : int, optional
        The most candidates priced (a number budget: the same answer every time).
    deadline : float, optional
        A :func:`time.perf_counter` time after which no candidate is priced.
    sim : DeltaSimulator, optional
        One already holding ``strategy``, reused instead of building one.
    tick : callable, optional
        Called every 10 candidates with the result so far (its best strategy and cost, kept
        current); returning False stops.
    until : callable, optional
        Asked before every candidate with the result so far; returning False stops (a time
        allocation that must end where it says, as auto's
        :class:`~engine.search.auto_polish.PolishSlices`: every 10
        candidates was up to 1.6 s past a slice's end on NMT / ``p100-4x4``).
    global_moves : bool
        Begin each round with the global pass.
    kinds : tuple of str, optional
        The global kinds that pass tries (:data:`POLISH_KINDS`; None: every kind that can move
        the strategy, MCMC's final polish).
    check_memory : bool
        Keep only candidates that fit in memory (False: the simulated time alone, MCMC's
        ``check_memory=False``; ``cost_s`` is then that time).

    Returns
    -------
    PolishResult
        Never worse than ``strategy``: a candidate is kept only when it is strictly faster (and
        fits, with ``check_memory``).

    Notes
    -----
    Single-op candidates are priced by delta simulation where a simulator of the current
    strategy is affordable (:func:`engine.search.chains.delta_affordable`); elsewhere only the
    global pass runs, each candidate priced whole, and ``finished`` is never claimed. A
    candidate's time is compared first and its memory checked only when the time would keep
    it (the same choices as pricing every candidate with its memory check, fewer checks), and
    its simulation stops once it is known to end no faster than the best
    (:meth:`~engine.sim.delta.DeltaSimulator.trial`: the same choices, less of each run).
    """
    d = _Descent(graph, cluster, strategy, cost or CostModel(), sim, max_evals, deadline, tick, until, check_memory)
    space = Space(graph, cluster) if global_moves else None
    wide = True  # the first rounds: only the candidates that span every device
    while True:
        d.out.rounds += 1
        d.improved = False
        d.out.round_share = 0.0
        d.next_round()
        if not d.aligned_pass() or not d.global_pass(space, kinds) or not d.op_pass(wide):
            return d.out
        if not d.improved and wide and d.sim is not None:
            wide = False
        elif not d.improved:
            d.out.finished = not d.partial  # (partial whenever a strategy was left without a delta simulator)
            return d.out


class _Descent:
    """The state of one :func:`coordinate_descent`: the current strategy's simulator and cost,
    the result so far, the ops' visiting order and the budget."""

    def __init__(self, graph: OpGraph, cluster: Cluster, strategy: Strategy, cost: CostModel,
                 sim: DeltaSimulator | None, max_evals: int | None, deadline: float | None,
                 tick: Callable[[PolishResult], bool] | None, until: Callable[[PolishResult], bool] | None,
                 check_memory: bool) -> None:
        self.t0 = time.perf_counter()
        self.graph, self.cluster, self.cost, self.check_memory = graph, cluster, cost, check_memory
        self.max_evals, self.deadline, self.tick, self.until = max_evals, deadline, tick, until
        if sim is None or sim.strategy is not strategy:
            sim = DeltaSimulator(graph, strategy, cluster, cost) if delta_affordable(graph, strategy, cluster) else None
        self.sim = sim
        if sim is not None:
            self.best = sim.timeline.makespan_s if self.fits(sim) else math.inf
        else:
            best = whole_cost(graph, strategy, cluster, cost, check_memory, deadline)
            self.best = math.inf if best is None else best
        self.out = PolishResult(strategy if sim is None else sim.strategy, self.best)
        self.classes = alike_classes(graph)
        self.base = self.order = distinct_first(visit_order(graph), self.classes)
        self.changed: list[str] = []  # the ops a round changed visit first in the next one
        self.partial = sim is None  # single-op moves skipped somewhere: no claim of a local optimum
        self.improved = False
        self.moves = 0  # changes taken so far
        self.global_clean = -1  # self.moves when a global pass last ended (nothing moved since: not repeated)
        #: a class's aligned configs last priced, and self.moves then (:meth:`aligned_pass`)
        self.aligned_seen: dict[tuple[str, ...], tuple[tuple, int]] = {}

    def fits(self, sim: DeltaSimulator) -> bool:
        return not self.check_memory or price_of_sim(sim, self.graph, self.cluster).feasible

    def stop(self) -> bool:
        out = self.out
        if (self.max_evals is not None and out.evals >= self.max_evals) or \
                (self.deadline is not None and time.perf_counter() >= self.deadline):
            return True
        if self.until is not None and self.until(out) is False:
            return True
        return self.tick is not None and out.evals % 10 == 0 and self.tick(out) is False

    def next_round(self) -> None:
        if self.changed:
            first = set(self.changed)
            self.order = self.changed + [name for name in self.base if name not in first]
            self.changed = []

    def aligned_pass(self) -> bool:
        """Each class of alike ops (on its pipeline stage), in graph order, given together the
        configs that read each member's input as its producer splits it
        (:func:`aligned_candidate`), priced (:meth:`priced`) and taken when faster; a class is
        priced again only when those configs changed (a producer moved). False when the budget
        stopped it."""
        seen: set[tuple[str, ...]] = set()
        for name in (op.name for op in self.graph.ops if len(self.classes.get(op.name, ())) > 1):
            members = self.class_of(name)
            if len(members) < 2 or members in seen:
                continue
            seen.add(members)
            cand, key = self.aligned(members)
            if not cand or self.aligned_seen.get(members, (None,))[0] == key:
                continue
            if self.stop():
                return False
            self.aligned_seen[members] = (key, self.moves)
            self.out.evals += 1
            new = self.priced(cand[0], self.best)
            if new is not None:
                self.take(cand[0], new)
                self.changed.append(name)
        return True

    def priced(self, cand: Strategy, below_s: float) -> float | None:
        """``cand``'s cost when it is under ``below_s`` (and fits, with the memory check), else
        None: by the delta simulator where ``cand`` differs from its strategy in op configs
        alone (:meth:`~engine.sim.delta.DeltaSimulator.trial_configs`: the ops' segments
        rebuilt, the run resumed and stopped at the bound; the change reverted), else priced
        whole. On RNNLM / k80-16x4 a class of forty time steps priced whole took 0.47 s."""
        bound = below_s * (1 - 1e-12)
        configs = self.delta_configs(cand)
        if configs == {}:
            return None  # (its strategy: not faster than itself)
        if configs is None:
            new = whole_cost(self.graph, cand, self.cluster, self.cost, self.check_memory, self.deadline)
            return new if new is not None and new < bound else None
        if validate_strategy(cand, self.graph, self.cluster):  # (the strategy-wide checks whole pricing makes)
            return None
        sim = self.sim
        try:
            new = sim.trial_configs(configs, bound)
        except ValueError:  # (a ValidationError: a config its op refuses; nothing changed)
            return None
        ok = new < bound and self.fits(sim)
        sim.revert()
        return new if ok else None

    def delta_configs(self, cand: Strategy) -> dict | None:
        """The op configs that take the delta simulator to ``cand``, or None where there is no
        simulator, ``cand`` differs in more than op configs, or its full task graph would be
        larger than a delta simulator may hold (:func:`delta_affordable`: it is then priced
        whole, symmetry-reduced, and the descent goes on from it without one)."""
        sim = self.sim
        configs = None if sim is None else sim.configs_to(cand)
        if configs and not delta_affordable(self.graph, cand, self.cluster):
            return None
        return configs

    def aligned(self, members: tuple[str, ...]) -> tuple[list[Strategy], tuple | None]:
        """The current strategy with ``members`` aligned to their producers (a list of none or
        one, :func:`aligned_candidate`) and the configs it gives them (None: none)."""
        cand = aligned_candidate(self.graph, members, self.out.strategy)
        return cand, (tuple(cand[0].configs[m] for m in members) if cand else None)

    def global_pass(self, space: Space | None, kinds: tuple[str, ...] | None) -> bool:
        """Per kind, the first neighbour that improves is taken, until none does; False when
        the budget stopped it."""
        out, graph, cluster, cost = self.out, self.graph, self.cluster, self.cost
        if self.global_clean == self.moves:
            return True  # (the strategy has not moved since a pass that ended at a local optimum of these kinds)
        here = space.kinds(out.strategy) if space is not None else []
        for kind in [k for k in (here if kinds is None else kinds) if k in here]:
            moved = True
            while moved:
                moved = False
                for cand in _ordered(space.neighbours(out.strategy, kind), kind):
                    if self.stop():
                        return False
                    out.evals += 1
                    new = whole_cost(graph, cand, cluster, cost, self.check_memory, self.deadline)
                    if new is not None and new < self.best * (1 - 1e-12):
                        self.take(cand, new)
                        moved = True
                        break
        self.global_clean = self.moves
        return True

    def op_pass(self, wide: bool) -> bool:
        """Each op in turn (where delta simulation is affordable): every candidate config priced
        with the others held, the best kept when it beats the current strategy; False when the
        budget stopped it."""
        out, sim, order, n = self.out, self.sim, self.order, self.cluster.num_devices
        spans = stage_spans(self.graph, sim.strategy) if sim is not None and wide else {}
        settled: set[str] = set()  # the ops a class move of this round gave their config
        tried: set[tuple[str, ...]] = set()  # the classes a class move was tried for in this round
        for at, name in enumerate(order if sim is not None else ()):
            out.round_share = at / len(order)
            if name in settled:
                continue
            m = max(1, sim.strategy.pipeline.microbatches)
            current = sim.strategy[name]
            pick, pick_cost, alone = None, self.best, []
            out.pending_s = math.inf
            for config in candidate_configs(self.graph[name], n, m):
                if (wide and len(config.devices) < spans.get(name, n)) or config == current or sim.check(name, config):
                    continue
                if self.stop():
                    _finish(out, sim, name, pick, pick_cost, self.best, self.t0)
                    return False
                out.evals += 1
                # (priced against the best: a candidate no faster is stopped as soon as it is known to be;
                # memory checked only for a time that would be kept)
                new = sim.trial(name, config, self.best * (1 - 1e-12))
                if new < self.best * (1 - 1e-12):
                    alone.append((new, len(alone), config))
                if new < pick_cost * (1 - 1e-12) and self.fits(sim):
                    pick, pick_cost = config, new
                    out.pending_s = new
                sim.revert()
            moved, stopped = self.class_move(name, alone, pick_cost, tried)
            out.pending_s = math.inf
            if stopped:  # (a class moved: its best is kept; else the op's own pick so far)
                _finish(out, sim, name, None if moved else pick, pick_cost, self.best, self.t0)
                return False
            if moved:
                settled.update(moved)
                sim = self.sim
                if sim is None:
                    return True
                continue
            if pick is not None:
                sim.change(name, pick)
                sim.commit()
                self.best, self.improved = pick_cost, True
                self.moves += 1
                self.changed.append(name)
                out.strategy, out.cost_s = sim.strategy, self.best
                out.improvements.append((out.evals, time.perf_counter() - self.t0, self.best))
        return True

    def class_of(self, name: str) -> tuple[str, ...]:
        """``name``'s alike ops on its pipeline stage (:func:`alike_classes`), itself included."""
        s = self.out.strategy
        stage = s.stage_of.get(name)
        return tuple(x for x in self.classes.get(name, (name,)) if s.stage_of.get(x) == stage)

    def class_move(self, name: str, alone: list, pick_cost: float, tried: set) -> tuple[list[str], bool]:
        """Give ``name``'s alike ops (:func:`alike_classes`, on its pipeline stage) one config
        together: the :data:`CLASS_TRIES` configs that made ``name`` alone fastest (``alone``:
        (time, order, config) of those faster than the current strategy), and each member split
        as its input's producer splits it (:func:`aligned_candidate`), each priced for the class
        (:meth:`priced`); the best is taken when it beats ``pick_cost`` (the op's own best pick). Once
        a round per class (``tried``: the classes tried so far). The ops moved (empty when none
        was) and whether the budget stopped it (the best class priced before then is taken)."""
        s = self.out.strategy
        members = self.class_of(name)
        if len(members) < 2 or members in tried:
            return [], False
        tried.add(members)
        best, pick, stopped = pick_cost, None, False
        aligned, key = self.aligned(members)  # (each member as its input's producer splits it)
        if self.aligned_seen.get(members) == (key, self.moves):
            aligned = []  # (priced by this round's aligned pass, nothing moved since)
        for cand in [s.with_configs(members, config) for config in class_tries(alone)] + aligned:
            if self.stop():
                stopped = True
                break
            self.out.evals += 1
            new = self.priced(cand, best)
            if new is not None:
                best, pick = new, cand
                self.out.pending_s = new
        if pick is None:
            return [], stopped
        self.take(pick, best)
        self.changed.append(name)
        return list(members), stopped

    def take(self, strategy: Strategy, cost_s: float) -> None:
        """Move to ``strategy`` (priced at ``cost_s``): the delta simulator's ops changed where
        it differs in op configs alone, else a new delta simulator where one is affordable."""
        graph, cluster, out = self.graph, self.cluster, self.out
        sim = self.sim
        configs = self.delta_configs(strategy)
        if configs:
            sim.change_configs(configs)
            sim.commit()
        else:
            sim = DeltaSimulator(graph, strategy, cluster, self.cost) if delta_affordable(graph, strategy, cluster) \
                else None
        self.sim, self.best, self.improved = sim, cost_s, True
        self.partial = self.partial or sim is None
        out.strategy, out.cost_s = (strategy if sim is None else sim.strategy), cost_s
        out.improvements.append((out.evals, time.perf_counter() - self.t0, cost_s))
        self.moves += 1


#: the order the global pass tries ZeRO stages in: ZeRO-2 first, as fast as ZeRO-1 or faster
#: (a reduce-scatter where ZeRO-1 all-reduces, :mod:`engine.taskgraph.sync`) in less memory.
#: NMT / k80-16x4 from FlexFlow's expert strategy: ZeRO-1 117.76 ms, ZeRO-2 98.85 (none
#: 100.98), each priced whole in ~1.5 s (issue 43)
ZERO_ORDER = (2, 1, 0, 3)


def _ordered(cands, kind: str):
    """The global pass's candidates of ``kind`` in the order they are tried."""
    return sorted(cands, key=lambda c: ZERO_ORDER.index(c.zero_stage)) if kind == "zero" else cands


def _finish(out: PolishResult, sim: DeltaSimulator, name: str, pick, pick_cost: float, best: float,
            t0: float) -> PolishResult:
    """Stopped midway through op ``name``: keep the best candidate of it found so far."""
    if pick is not None and pick_cost < best:
        sim.change(name, pick)
        sim.commit()
        out.strategy, out.cost_s = sim.strategy, pick_cost
        out.improvements.append((out.evals, time.perf_counter() - t0, pick_cost))
    out.finished = False
    return out


def local_polish(graph: OpGraph, cluster: Cluster, strategy: Strategy, cost: CostModel | None = None,
                 check_memory: bool = True, max_evals: int | None = None, deadline: float | None = None,
                 sim: DeltaSimulator | None = None, global_moves: bool = True) -> tuple[Strategy, float, bool]:
    """MCMC's final polish: :func:`coordinate_descent` over every op's
    candidate configs and (with ``global_moves``) every global kind that can move the strategy,
    until a round improves nothing (FlexFlow's local-optimality check, extended to the whole
    space) or the budget ends. ``sim``: a delta simulator already holding ``strategy`` (a
    chain's), reused. Returns (strategy, cost, whether it finished: False when ``max_evals`` or
    the ``deadline`` (a perf_counter time) came first, or single-op moves were skipped)."""
    r = coordinate_descent(graph, cluster, strategy, cost, max_evals=max_evals, deadline=deadline, sim=sim,
                           global_moves=global_moves, kinds=None, check_memory=check_memory)
    return r.strategy, r.cost_s, r.finished
