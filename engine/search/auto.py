"""``auto``: the fast searches as seeds, then MCMC from the best of them (issue 13).

PaSE's dynamic programming and the differentiable search find good per-op layouts of a model
with few ops in seconds; the pipeline planner finds stage layouts of layered models; MCMC
refines whatever it starts from but rarely leaves the basin it starts in. ``auto`` runs the
seeds that apply to the model (each bounded, each allowed to refuse), prices every seed and
the baselines with the one memory-checked :func:`~engine.search.api.price`, starts MCMC from
the best feasible of them, and returns the best strategy it has seen: never slower than a
feasible baseline or seed it knows of. Its notes say which algorithm contributed what.
Between the seeds and MCMC, the best so far is polished by greedy coordinate descent over
single-op configs (:mod:`engine.search.polish`, the ops with the most parameters for their
compute first): on AlexNet it reaches in about a second what MCMC alone reaches in 150 s
(issue 28).

With ``AutoOptions.backend`` (serial, pool or ray), MCMC's chains run as that backend's tasks
(:mod:`engine.search.parallel_chains`) and, with a number budget, the seeds run at once as its tasks.

Budget: with a time budget, the seeds share at most ``seed_share`` of it, and MCMC gets what
is left. PaSE's set-up and dynamic program cannot be stopped midway (ResNet-101 on 64 K80s:
14 s), so with a time budget each seed runs in a forked child process that is stopped at its
share (where the platform forks; elsewhere in process); with a number budget the seeds run in
process with their own defaults, the polish prices at most that many candidates and MCMC
makes that many proposals, reproducibly.

Allocation (issue 28), the rule: the budget counts from the call (baselines, their pricing and
the forked seeds included). Layered models get the Megatron layouts of
:func:`moe_seed_layouts` priced first (dense ones too), within the seeds' share. Seeds run
in the order pipeline planner, PaSE, differentiable search, each in the slice
:func:`~engine.search.seed_runs.seed_slice` gives it, and none is started with less time than
one pricing took; PaSE and the differentiable search together take at most
:data:`PASE_FAMILY_SHARE` of a time budget (PaSE refuses a slice its own estimate says it
would not finish in). A seed that ends without beating the best priced before it stops its
family (the differentiable search and PaSE solve the same problem): the later ones are
skipped and the polish and MCMC, which start when the seeds end, get their time. The polish
(:mod:`engine.search.auto_polish`) takes a share of what is left (its set-up, twice one pricing,
must fit in it; where no delta simulator is affordable, its global pass alone, when two
pricings fit in what is left), and further slices while each makes the best faster (a faster
time the op visit under way priced and has not taken yet counts), up to a larger share (all
that is left where MCMC's set-up would not fit in the rest), its first round uncut where at its pace
it ends by then (:class:`~engine.search.auto_polish.PolishSlices`). A seed with a time budget answers
within it (the pipeline planner prices no plan past it once one fits). MCMC is not started when
its set-up (pricing its starting points, as long as auto's pricing of them took) and one move
would not fit in what is left; once running it is stopped at the first progress row from
which one more move would end past :data:`HARD_SHARE` times the budget. Whatever happens
(a seed refused or stopped, MCMC failing), the best priced strategy is kept and returned, and
the notes say where it came from and what was the best before the searches.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from dataclasses import replace

from ..cluster import Cluster
from ..costs import CostModel
from ..errors import TooLargeError
from ..graph import OpGraph
from ..layout import Layout
from ..graph.blocks import layer_blocks
from ..moe import expert_counts
from ..strategy import Strategy, strategy_from_dict
from ..layout.build import build_layout, fsdp
from . import seed_runs
from .api import (CONSTRAINTS, AutoOptions, Budget, LayoutOptions, MCMCOptions, Price, Progress, ProgressFn,
                  SearchResult, price, stamp)
from .baselines import data_parallel, expert
from .chains import delta_affordable
from .auto_polish import best_start, ms_text, polish
from .processes import check_backend
from .registry import ALGORITHMS
from .seed_layouts import moe_seed_layouts

__all__ = ["auto", "PASE_MAX_OPS"]

#: PaSE and the differentiable search (which solves PaSE's problem) run as seeds only on
#: models with at most this many ops: their set-up and dynamic program grow with the ops and
#: the configs per op, and cannot be stopped midway (NMT's 2,000+ ops on 64 GPUs ran for
#: minutes); larger models are seeded by the baselines and the pipeline planner.
PASE_MAX_OPS = 600


#: with a time budget B, MCMC is stopped at its first progress row from which one more move
#: (as long as the last) would end past HARD_SHARE x B after auto started (set-up included);
#: what it found by then is kept
HARD_SHARE = 1.0

#: with a time budget, the most of it the PaSE family's seeds (PaSE, then the differentiable
#: search) take together. At 15 s on FlexFlow's six models on p100-4x4, k80-16x4 and
#: dgx-a100-40gb:8 (issue 43) they paid in one case of 18 (RNNLM / p100-4x4: PaSE's 23.7 ms
#: against the expert strategy's 27.3, in 0.6-1.4 s) and took 2.5-4.2 s of each budget, mostly
#: to return a baseline (their own plans are slower there); run without them, auto reached
#: within 1% of the best known in about half the time on nine cases and ended faster on three
PASE_FAMILY_SHARE = 0.1

#: seeds that solve the same problem: when one ends without beating what was priced before
#: it, the later ones of its family are not run (PaSE solves the differentiable search's problem)
SEED_FAMILY = {"pipeline": "pipeline", "differentiable": "pase", "pase": "pase"}

def auto(graph: OpGraph, cluster: Cluster, budget: Budget | None = None, *, seed: int = 0,
         progress: ProgressFn | None = None, initial: Strategy | None = None, cost: CostModel | None = None,
         options: AutoOptions | None = None) -> SearchResult:
    """Seeds (PaSE, differentiable, pipeline planner, where they apply), then MCMC from the
    best feasible seed or baseline; the best strategy seen, with what each algorithm found.
    The stages run in order over one :class:`_Auto` state (see the module's docstring).

    With a constraint (:data:`~engine.search.api.CONSTRAINTS`: exportable, headroom, fixed or
    bounded degrees) the answer must be a framework layout, so auto runs the layout search
    (:mod:`engine.search.layouts`) with them, in the model's precision unless ``fp8`` is true."""
    opts = options or AutoOptions()
    if any(getattr(opts, k) for k in CONSTRAINTS):
        from .layouts import layouts

        lay_opts = LayoutOptions(fp8=bool(opts.fp8), **{k: getattr(opts, k) for k in CONSTRAINTS})
        r = layouts(graph, cluster, budget or Budget(seconds=30.0), seed=seed, progress=progress, cost=cost,
                    options=lay_opts)
        return replace(r, algorithm="auto", notes=["constraints given: the layout search ran (per-op moves would "
                                                   "leave the framework's layout)"] + r.notes)
    a = _Auto(graph, cluster, budget, seed, progress, cost, options)
    a.baselines(initial)
    a.layout_seeds()
    a.searches()
    a.polish()
    a.mcmc(initial)
    return a.result()


class _Auto:
    """One ``auto`` search: what it priced (``found``: source -> (strategy, price)), the best so
    far, how long pricing took, the notes and the progress trace; the stages below fill them."""

    def __init__(self, graph: OpGraph, cluster: Cluster, budget: Budget | None, seed: int,
                 progress: ProgressFn | None, cost: CostModel | None, options: AutoOptions | None) -> None:
        self.t0 = time.perf_counter()
        opts = options or AutoOptions()
        if opts.backend is not None:
            opts = replace(opts, backend=check_backend(opts.backend))  # (an unknown name: one line, before any work)
        self.graph, self.cluster, self.seed, self.progress, self.opts = graph, cluster, seed, progress, opts
        self.budget = budget = budget or Budget(seconds=30.0)
        self.cost_model = cost or CostModel()
        self.cancelled = False
        self.notes: list[str] = []
        self.found: dict[str, tuple[Strategy, Price]] = {}
        self.trace: list[Progress] = []
        self.best_cost = math.inf
        self.best_so_far: Strategy | None = None
        self.proposals = 0  # made by the stages that finished
        self.stage = "baselines"
        # past this MCMC is stopped at its next progress row, as a consumer stops it
        self.deadline = None if budget.seconds is None else self.t0 + HARD_SHARE * budget.seconds
        self.overran = False
        self.last_row: float | None = None  # when MCMC's last progress row came
        # the longest one pricing took so far (s): the first pricing of the call is left out once
        # another was timed (it carries a fresh process's imports and compiled-code loads: 1.2 of the
        # 1.6 s data parallel's first pricing took on AlexNet / p100-4x4, 0.05 s warm; 4.9 s under load)
        self.slowest_price = 0.0
        self.took_s: list[float] = []
        self.price_s: dict[int, float] = {}  # id(strategy) -> the seconds pricing it took
        self.layered = len(layer_blocks(graph)) >= 2
        self.seed_end = self.t0 + opts.seed_share * budget.seconds if budget.seconds is not None else None
        self.found_before_searches: dict[str, tuple[bool, float]] = {}  # the bar the searches are measured by

    # ------------------------------------------------------------------ shared

    def report(self, row: Progress) -> bool:
        """Forward a stage's progress with auto's elapsed time and best so far (the
        strategy too: a consumer that keeps the best row's strategy keeps the best one). A
        seed's own rows carry its model's cost (PaSE's and the differentiable search's
        analytic cost, not a simulation), so while a seed runs the rows carry the best priced
        so far; MCMC's rows are simulated and memory-checked, and pass when better."""
        now = time.perf_counter()
        if self.stage == "mcmc" and self.deadline is not None:
            # stopped when the next move, taking as long as the last one, would end past the
            # deadline (MCMC keeps and returns its best when stopped)
            move_s = 0.0 if self.last_row is None else now - self.last_row
            self.last_row = now
            if now + move_s > self.deadline:
                self.overran = True
                return False
        if self.stage == "mcmc" and row.best_cost_s <= self.best_cost:
            out = replace(row, elapsed_s=time.perf_counter() - self.t0, iteration=self.proposals + row.iteration)
        else:
            # (a seed's current cost is its own model's, not a simulated time: not plotted)
            current = row.current_cost_s if self.stage == "mcmc" else self.best_cost
            out = replace(row, elapsed_s=time.perf_counter() - self.t0, iteration=self.proposals + row.iteration,
                          current_cost_s=current, best_cost_s=self.best_cost, best=self.best_so_far)
        self.trace.append(out)
        if self.progress is not None and self.progress(out) is False:
            self.cancelled = True
            return False
        return True

    def timed_price(self, strategy: Strategy) -> Price:
        t = time.perf_counter()
        try:
            return price(self.graph, strategy, self.cluster, self.cost_model)
        finally:
            self.price_s[id(strategy)] = time.perf_counter() - t
            self.took_s.append(self.price_s[id(strategy)])
            self.slowest_price = max(self.took_s[1:] or self.took_s)

    def consider(self, name: str, strategy: Strategy, p: Price) -> None:
        self.found[name] = (strategy, p)
        if p.cost_s < self.best_cost:
            self.best_cost, self.best_so_far = p.cost_s, strategy

    def _tick(self) -> bool:
        return self.report(Progress(0, 0.0, self.best_cost, self.best_cost, 0.0))

    # ------------------------------------------------------------------ the stages

    def baselines(self, initial: Strategy | None) -> None:
        """The baselines and the user's starting point, priced alike (a layered model also
        fully sharded with recomputation: it usually fits where data parallel does not)."""
        graph, cluster, notes = self.graph, self.cluster, self.notes
        for name, make in (("data-parallel", data_parallel), ("expert", expert)):
            try:
                s = make(graph, cluster)
                p = self.timed_price(s)
            except TooLargeError as e:
                notes.append(f"baseline {name} {e}: no speedup over it is reported")
                continue
            except ValueError as e:
                notes.append(f"baseline {name} cannot run here: {e}")
                continue
            self.consider(name, s, p)
        if self.layered:
            try:
                s = fsdp(graph, cluster, Layout(zero_stage=3, micro_batch=1, recompute="full"))
                p = self.timed_price(s)
            except ValueError as e:
                notes.append(f"baseline fsdp cannot run here: {e}")
            else:
                self.consider("fsdp", s, p)
                notes.append(f"fsdp (ZeRO-3, full recomputation, micro-batch 1): {ms_text(p)}")
        if initial is not None:
            try:
                self.consider("initial", initial, self.timed_price(initial))
            except TooLargeError as e:
                notes.append(f"the starting strategy was {e}")

    def layout_seeds(self) -> None:
        """Megatron layouts of a layered model (the published recipes' shapes: a
        mixture-of-experts model's with fp8 where its GPUs have it), priced like the baselines
        before the searches, within the seeds' share of a time budget."""
        graph, cluster, opts = self.graph, self.cluster, self.opts
        moe = bool(expert_counts(graph))
        if not (opts.seeds and self.layered):
            return
        fp8 = opts.fp8 if opts.fp8 is not None else moe and all(
            "fp8" in cluster.device_type(d).peak_flops_per_s for d in range(cluster.num_devices))
        self.stage = "megatron"
        for first, *fallbacks in moe_seed_layouts(graph, cluster, fp8=fp8, dense=not moe):
            for lay in (first, *fallbacks):  # (a deeper pipeline when the first does not fit)
                # (a seed is not started without the time the slowest pricing took)
                if self.cancelled or (self.seed_end is not None and
                                      self.seed_end - time.perf_counter() < self.slowest_price):
                    break
                try:
                    s = build_layout(graph, cluster, lay)
                    p = self.timed_price(s)
                except (ValueError, TooLargeError) as e:
                    self.notes.append(f"{_seed_name(lay)}: cannot run here: {str(e)[:200]}")
                    continue
                self.consider(_seed_name(lay), s, p)
                self._tick()
                if p.feasible:
                    break
        picked = [n for n in self.found if n.startswith("megatron ")]
        self.notes.append(f"{'mixture-of-experts' if moe else 'dense'} seeds: {len(picked)} Megatron layouts priced "
                          "(ZeRO-1, micro-batch 1" + (", fp8 GEMMs as the published MoE recipes; "
                                                      "to keep the model's precision, search with fp8 off: "
                                                      "--option fp8=false, or leave the page's \"allow fp8\" "
                                                      "unticked)" if fp8 else ")"))

    def searches(self) -> None:
        """The seed searches that apply (the pipeline planner, PaSE, the differentiable search),
        each in its slice of the seeds' share (:func:`~engine.search.seed_runs.seed_slice`; PaSE's
        family within :data:`PASE_FAMILY_SHARE`); a seed that beats nothing priced before it stops
        its family."""
        graph, opts, notes = self.graph, self.opts, self.notes
        # what was priced before them, the bar they are measured against
        self.found_before_searches = {n: (not p.feasible, p.time_s) for n, (_, p) in self.found.items()}
        seeds: list[str] = []
        if opts.seeds:
            small = len(graph.ops) <= PASE_MAX_OPS
            # (PaSE before the differentiable search, which solves its problem: PaSE's time is known
            # before it starts, its own estimate, and it refuses a slice that would not hold it)
            for name in ("pipeline", "pase", "differentiable"):
                if name in ("pase", "differentiable") and not small:
                    notes.append(f"{name}: not run as a seed ({len(graph.ops)} ops, more than {PASE_MAX_OPS})")
                elif name == "pipeline" and not self.layered:
                    notes.append("pipeline: not run as a seed (the model has no repeated layers to stage)")
                else:
                    seeds.append(name)
        # with a proposal budget and a backend, the seeds run at once as its tasks (each with its own
        # defaults, as in process: the same answers, considered in the same order)
        ran = seed_runs.seeds_on_backend(seeds, graph, self.cluster, self.seed, self.cost_model, opts) \
            if opts.backend is not None and self.budget.seconds is None and seeds and not self.cancelled else {}
        unpaid: set[str] = set()  # the seed families whose last seed beat nothing priced before it
        family_end: float | None = None  # (with a time budget: when the PaSE family's share ends)
        for i, name in enumerate(seeds):
            if self.cancelled:
                break
            if SEED_FAMILY[name] in unpaid:
                notes.append(f"{name}: not run as a seed (the {SEED_FAMILY[name]} seed before it beat nothing "
                             "priced before it; MCMC gets its time)")
                continue
            share = None
            if self.seed_end is not None:
                share = seed_runs.seed_slice(name, self.seed_end - time.perf_counter(), seeds[i + 1:])
                if SEED_FAMILY[name] == "pase":  # (the family's seeds together: PASE_FAMILY_SHARE of the budget)
                    if family_end is None:
                        family_end = time.perf_counter() + PASE_FAMILY_SHARE * self.budget.seconds
                    share = min(share, family_end - time.perf_counter())
                # (a seed prices what it finds as auto does: not started with less than it needs, in pricings)
                k = seed_runs.SEED_PRICINGS.get(name, 1)
                if share < max(1.0, k * self.slowest_price):
                    notes.append(f"{name}: not run as a seed ({share:.1f} s left for it in the seeds' share of "
                                 f"the budget; pricing one strategy took up to {self.slowest_price:.1f} s"
                                 + (f", and it needs {k} times that)" if k > 1 else ")"))
                    continue
            before = self.best_cost
            if self._seed(name, share, ran) and not self.best_cost < before:
                unpaid.add(SEED_FAMILY[name])

    def _seed(self, name: str, share: float | None, ran: dict[str, tuple]) -> bool:
        """Run seed ``name`` (in a child process stopped at ``share`` seconds, from the backend's
        answers in ``ran``, or in process) and consider its answer; False when it gave none."""
        graph, cluster, notes = self.graph, self.cluster, self.notes
        sb = Budget(seconds=share) if share is not None else None
        t = time.perf_counter()
        self.stage = name
        try:
            if share is not None and "fork" in multiprocessing.get_all_start_methods():
                out = seed_runs.bounded(ALGORITHMS[name], graph, cluster, sb, self.seed, self.cost_model, share,
                                        self._tick)
                if isinstance(out, str):  # (``report`` set ``cancelled`` when the consumer stopped it)
                    notes.append(f"{name}: " + ("cancelled" if self.cancelled else out))
                    return False
                best_s, time_s, feasible, iterations = out
            elif name in ran:
                status, value, ran_s = ran[name]
                t = time.perf_counter() - ran_s  # (its note gives the time it ran on the backend)
                if status != "ok":
                    raise ValueError(value)
                data, time_s, feasible, iterations = value
                best_s = strategy_from_dict(data)
            else:
                r = ALGORITHMS[name].run(graph, cluster, sb, seed=self.seed, progress=self.report,
                                         cost=self.cost_model)
                best_s, time_s, feasible, iterations = r.best, r.best_time_s, math.isfinite(r.best_cost_s), r.iterations
                self.cancelled = self.cancelled or r.cancelled
        except (ValueError, MemoryError) as e:
            notes.append(f"{name}: refused as a seed: {e}")
            return False
        p = Price(time_s, feasible)
        self.consider(name, best_s, p)
        self.proposals += iterations
        notes.append(f"{name}: {ms_text(p)} in {time.perf_counter() - t:.1f} s")
        return True

    def polish(self) -> None:
        """The polish stage (:func:`engine.search.auto_polish.polish`)."""
        polish(self)

    def mcmc(self, initial: Strategy | None) -> None:
        """MCMC from the best feasible seed or baseline (it also starts from data parallel and
        expert), when what is left of a time budget covers its set-up and one move: it builds
        and prices its starting points before its first move, and a move prices about as long
        as its start (the pricing times measured above, the slowest for one not priced here;
        none for one priced here that MCMC prices whole, which price()'s memo answers)."""
        graph, cluster, budget, opts = self.graph, self.cluster, self.budget, self.opts
        start_name, start = best_start(self.found)
        mcmc_budget = budget
        if budget.seconds is not None:
            mcmc_budget = Budget(iterations=budget.iterations,
                                 seconds=max(0.5, budget.seconds - (time.perf_counter() - self.t0)))
        seeded = start if start_name not in ("data-parallel", "expert") else initial  # (MCMC starts from those)
        starts = [self.found[n][0] for n in ("data-parallel", "expert") if n in self.found] + \
            [seeded] * (seeded is not None)
        setup_s = self.mcmc_setup_s(starts)
        left = None if budget.seconds is None else budget.seconds - (time.perf_counter() - self.t0)
        if not self.cancelled and opts.refine and left is not None and left < setup_s:
            self.notes.append(f"mcmc: not run ({left:.1f} s left of the budget; its set-up and a move take about "
                              f"{setup_s:.1f} s)")
        if self.cancelled or not opts.refine or (left is not None and left < setup_s):
            return
        t = time.perf_counter()
        self.stage = "mcmc"
        try:
            r = ALGORITHMS["mcmc"].run(graph, cluster, mcmc_budget, seed=self.seed, progress=self.report,
                                       initial=seeded, cost=self.cost_model,
                                       options=MCMCOptions(chains=opts.chains, backend=opts.backend,
                                                           workers=opts.workers, address=opts.address))
        except (TooLargeError, ValueError, MemoryError) as e:  # (what was priced before it is kept)
            self.notes.append(f"mcmc: stopped without an answer: {str(e)[:200]}")
            return
        p = Price(r.best_time_s if r.best_time_s is not None else r.best_cost_s, math.isfinite(r.best_cost_s))
        self.consider("mcmc", r.best, p)
        self.proposals += r.iterations
        self.cancelled = self.cancelled or (r.cancelled and not self.overran)
        self.notes.append(f"mcmc from {start_name if seeded is start else 'the baselines'}: {ms_text(p)}, "
                          f"{r.iterations} proposals in {time.perf_counter() - t:.1f} s")

    def mcmc_setup_s(self, starts: list[Strategy]) -> float:
        """About how long MCMC takes from ``starts`` to its first move: each start priced, but
        none priced here that it prices whole (price()'s memo answers), and one move as long
        as the slowest start's pricing."""
        graph, cluster, took = self.graph, self.cluster, self.price_s
        spent = [0.0 if id(x) in took and not delta_affordable(graph, x, cluster)
                 else took.get(id(x), self.slowest_price) for x in starts]
        return sum(spent) + max((took.get(id(x), self.slowest_price) for x in starts), default=0.0)

    def result(self) -> SearchResult:
        """The best strategy priced, never slower than a feasible baseline or seed; notes on
        what each algorithm found."""
        found, notes = self.found, self.notes
        best_name, best = best_start(found)
        bp = found[best_name][1]
        contributions = {name: (p.time_s if p.feasible else None) for name, (_, p) in found.items()}
        if self.overran:
            notes.append(f"mcmc: stopped before {HARD_SHARE:g} times the budget")
        before = self.found_before_searches
        first = min(before, key=before.__getitem__, default=best_name)
        notes.append(f"best: {best_name}, {ms_text(bp)}" + ("" if bp.feasible else " (nothing found fits in memory)")
                     + (f"; the best priced before the searches: {first}, {ms_text(found[first][1])}"
                        if first != best_name else ""))
        found_by = {"algorithm": "auto", "source": best_name, "seed": self.seed, "budget": str(self.budget),
                    "contributions": contributions}
        baselines = {n: found[n][1].cost_s for n in ("data-parallel", "expert") if n in found}
        for n, c in baselines.items():
            if not math.isfinite(c):
                notes.append(f"baseline {n} does not fit in memory: no speedup over it is reported")
        return SearchResult(best=stamp(best, self.graph, self.cluster, found_by, bp), best_cost_s=bp.cost_s,
                            baselines=baselines, iterations=self.proposals, elapsed_s=time.perf_counter() - self.t0,
                            trace=self.trace, cancelled=self.cancelled, algorithm="auto", best_time_s=bp.time_s,
                            notes=notes)


def _seed_name(lay: Layout) -> str:
    """``megatron tp 2 x pp 8 x cp 1 x dp the rest, ep 64, micro-batch 1, vpp 4``."""
    return (f"megatron {lay.describe()}" + (f", vpp {lay.vpp}" if lay.vpp > 1 else "")
            + (f", recompute {lay.recompute}" if lay.recompute != "none" else "") + (", fp8" if lay.fp8 else ""))
