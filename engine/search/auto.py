"""``auto``: the fast searches as seeds, then MCMC from the best of them (issue 13).

PaSE's dynamic programming and the differentiable search find good per-op layouts of a model
with few ops in seconds; the pipeline planner finds stage layouts of layered models; MCMC
refines whatever it starts from but rarely leaves the basin it starts in. ``auto`` runs the
seeds that apply to the model (each bounded, each allowed to refuse), prices every seed and
the baselines with the one memory-checked :func:`~engine.search.api.price`, starts MCMC from
the best feasible of them, and returns the best strategy it has seen: never slower than a
feasible baseline or seed it knows of. Its notes say which algorithm contributed what.

Budget: with a time budget, the seeds share at most ``seed_share`` of it, and MCMC gets what
is left. PaSE's set-up and dynamic program cannot be stopped midway (ResNet-101 on 64 K80s:
14 s), so with a time budget each seed runs in a forked child process that is stopped at its
share (where the platform forks; elsewhere in process); with a number budget the seeds run in
process with their own defaults and MCMC makes that many proposals, reproducibly.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from dataclasses import replace

from ..cluster import Cluster
from ..costs import CostModel
from ..errors import TooLargeError
from ..graph import OpGraph
from ..strategy import Strategy, strategy_from_dict
from .api import AutoOptions, Budget, MCMCOptions, Price, Progress, ProgressFn, SearchResult, price, stamp
from .processes import die_with_parent

__all__ = ["auto", "PASE_MAX_OPS"]

#: PaSE and the differentiable search (which solves PaSE's problem) run as seeds only on
#: models with at most this many ops: their set-up and dynamic program grow with the ops and
#: the configs per op, and cannot be stopped midway (NMT's 2,000+ ops on 64 GPUs ran for
#: minutes); larger models are seeded by the baselines and the pipeline planner.
PASE_MAX_OPS = 600


def auto(graph: OpGraph, cluster: Cluster, budget: Budget | None = None, *, seed: int = 0,
         progress: ProgressFn | None = None, initial: Strategy | None = None, cost: CostModel | None = None,
         options: AutoOptions | None = None) -> SearchResult:
    """Seeds (PaSE, differentiable, pipeline planner, where they apply), then MCMC from the
    best feasible seed or baseline; the best strategy seen, with what each algorithm found."""
    from . import ALGORITHMS
    from .baselines import data_parallel, expert, fsdp
    from .layouts import layer_blocks

    t0 = time.perf_counter()
    opts = options or AutoOptions()
    budget = budget or Budget(seconds=30.0)
    cost_model = cost or CostModel()
    cancelled = False
    notes: list[str] = []
    found: dict[str, tuple[Strategy, Price]] = {}  # source -> (strategy, price)
    trace: list[Progress] = []
    best_cost = math.inf
    best_so_far: list[Strategy | None] = [None]
    proposals = [0]  # made by the stages that finished
    stage = ["baselines"]

    def report(row: Progress) -> bool:
        """Forward a stage's progress with auto's elapsed time and best so far (the
        strategy too: a consumer that keeps the best row's strategy keeps the best one). A
        seed's own rows carry its model's cost (PaSE's and the differentiable search's
        analytic cost, not a simulation), so while a seed runs the rows carry the best priced
        so far; MCMC's rows are simulated and memory-checked, and pass when better."""
        nonlocal cancelled
        if stage[0] == "mcmc" and row.best_cost_s <= best_cost:
            out = replace(row, elapsed_s=time.perf_counter() - t0, iteration=proposals[0] + row.iteration)
        else:
            # (a seed's current cost is its own model's, not a simulated time: not plotted)
            current = row.current_cost_s if stage[0] == "mcmc" else best_cost
            out = replace(row, elapsed_s=time.perf_counter() - t0, iteration=proposals[0] + row.iteration,
                          current_cost_s=current, best_cost_s=best_cost, best=best_so_far[0])
        trace.append(out)
        if progress is not None and progress(out) is False:
            cancelled = True
            return False
        return True

    def consider(name: str, strategy: Strategy, p: Price) -> None:
        nonlocal best_cost
        found[name] = (strategy, p)
        if p.cost_s < best_cost:
            best_cost, best_so_far[0] = p.cost_s, strategy

    # baselines and the user's starting point, priced alike
    for name, make in (("data-parallel", data_parallel), ("expert", expert)):
        try:
            s = make(graph, cluster)
            p = price(graph, s, cluster, cost_model)
        except TooLargeError as e:
            notes.append(f"baseline {name} {e}: no speedup over it is reported")
            continue
        except ValueError as e:
            notes.append(f"baseline {name} cannot run here: {e}")
            continue
        consider(name, s, p)
    layered = len(layer_blocks(graph)) >= 2
    if layered:
        # a layered model (an LLM) too large for data parallel usually fits fully sharded with
        # recomputation: a starting point MCMC and the user can compare with
        try:
            s = fsdp(graph, cluster, micro_batch=1, recompute="full")
            p = price(graph, s, cluster, cost_model)
        except ValueError as e:
            notes.append(f"baseline fsdp cannot run here: {e}")
        else:
            consider("fsdp", s, p)
            notes.append(f"fsdp (ZeRO-3, full recomputation, micro-batch 1): {_ms(p)}")
    if initial is not None:
        try:
            consider("initial", initial, price(graph, initial, cluster, cost_model))
        except TooLargeError as e:
            notes.append(f"the starting strategy was {e}")

    # seeds
    seeds: list[str] = []
    if opts.seeds:
        small = len(graph.ops) <= PASE_MAX_OPS
        for name in ("pipeline", "differentiable", "pase"):  # the quickest first
            if name in ("pase", "differentiable") and not small:
                notes.append(f"{name}: not run as a seed ({len(graph.ops)} ops, more than {PASE_MAX_OPS})")
            elif name == "pipeline" and not layered:
                notes.append("pipeline: not run as a seed (the model has no repeated layers to stage)")
            else:
                seeds.append(name)
    seed_end = t0 + opts.seed_share * budget.seconds if budget.seconds is not None else None
    for name in seeds:
        if cancelled:
            break
        # the pipeline planner (seconds) gets at most a third of the seeds' time (all of it when
        # it is the only seed, as on models too large for PaSE); the
        # differentiable search all that is left, as it reaches PaSE's answer in a fraction
        # of PaSE's time (both build the same problem; PaSE's DP then runs to its end:
        # NMT on 64 K80s, 13.6 s against 111 s); PaSE what remains after it
        share = None
        if seed_end is not None:
            left = seed_end - time.perf_counter()
            share = left / 3 if name == "pipeline" and len(seeds) > 1 else left
            if share < 1.0:
                notes.append(f"{name}: not run as a seed (no time left in the seeds' share of the budget)")
                continue
        sb = Budget(seconds=share) if share is not None else None
        t = time.perf_counter()
        stage[0] = name
        try:
            if share is not None and "fork" in multiprocessing.get_all_start_methods():
                out = _bounded(ALGORITHMS[name], graph, cluster, sb, seed, cost_model, share,
                               lambda: report(Progress(0, 0.0, best_cost, best_cost, 0.0)))
                if isinstance(out, str):  # (``report`` set ``cancelled`` when the consumer stopped it)
                    notes.append(f"{name}: " + ("cancelled" if cancelled else out))
                    continue
                best_s, time_s, feasible, iterations = out
            else:
                r = ALGORITHMS[name].run(graph, cluster, sb, seed=seed, progress=report, cost=cost_model)
                best_s, time_s, feasible, iterations = r.best, r.best_time_s, math.isfinite(r.best_cost_s), r.iterations
                cancelled = cancelled or r.cancelled
        except (ValueError, MemoryError) as e:
            notes.append(f"{name}: refused as a seed: {e}")
            continue
        p = Price(time_s, feasible)
        consider(name, best_s, p)
        proposals[0] += iterations
        notes.append(f"{name}: {_ms(p)} in {time.perf_counter() - t:.1f} s")

    # MCMC from the best feasible seed or baseline (it also starts from data parallel and expert)
    start_name, start = _best(found)
    mcmc_budget = budget
    if budget.seconds is not None:
        mcmc_budget = Budget(iterations=budget.iterations,
                             seconds=max(0.5, budget.seconds - (time.perf_counter() - t0)))
    if not cancelled and opts.refine:
        seeded = start if start_name not in ("data-parallel", "expert") else initial  # (MCMC starts from those)
        t = time.perf_counter()
        stage[0] = "mcmc"
        r = ALGORITHMS["mcmc"].run(graph, cluster, mcmc_budget, seed=seed, progress=report, initial=seeded,
                                   cost=cost_model, options=MCMCOptions(chains=opts.chains))
        p = Price(r.best_time_s if r.best_time_s is not None else r.best_cost_s, math.isfinite(r.best_cost_s))
        consider("mcmc", r.best, p)
        proposals[0] += r.iterations
        cancelled = cancelled or r.cancelled
        notes.append(f"mcmc from {start_name if seeded is start else 'the baselines'}: {_ms(p)}, "
                     f"{r.iterations} proposals in {time.perf_counter() - t:.1f} s")

    best_name, best = _best(found)
    bp = found[best_name][1]
    contributions = {name: (p.time_s if p.feasible else None) for name, (_, p) in found.items()}
    notes.append(f"best: {best_name}" + ("" if bp.feasible else " (nothing found fits in memory)"))
    found_by = {"algorithm": "auto", "source": best_name, "seed": seed, "budget": str(budget),
                "contributions": contributions}
    baselines = {n: found[n][1].cost_s for n in ("data-parallel", "expert") if n in found}
    for n, c in baselines.items():
        if not math.isfinite(c):
            notes.append(f"baseline {n} does not fit in memory: no speedup over it is reported")
    return SearchResult(best=stamp(best, graph, cluster, found_by, bp), best_cost_s=bp.cost_s, baselines=baselines,
                        iterations=proposals[0], elapsed_s=time.perf_counter() - t0, trace=trace, cancelled=cancelled,
                        algorithm="auto", best_time_s=bp.time_s, notes=notes)


def _child(conn, parent: int, algorithm, graph, cluster, budget, seed, cost) -> None:
    """In a forked child: run one seed and send back (best, time, fits, proposals) or the
    refusal's message. It dies with its parent (Linux: PR_SET_PDEATHSIG, which a fork does
    not inherit): a search process killed outright leaves no seed running."""
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(0)
    try:
        r = algorithm.run(graph, cluster, budget, seed=seed, cost=cost)
        conn.send(("ok", (r.best.to_dict(), r.best_time_s, math.isfinite(r.best_cost_s), r.iterations)))
    except (ValueError, MemoryError) as e:
        conn.send(("refused", str(e)))
    except Exception as e:  # an engine bug in a seed must not take the search down
        conn.send(("refused", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def _bounded(algorithm, graph, cluster, budget, seed, cost, seconds: float, tick):
    """Run a seed in a forked child (it inherits the graph and cluster; only its answer comes
    back) and stop it after ``seconds``; ``tick`` is called every quarter second and stops it
    when it returns False. The answer, or a line saying why there is none."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, os.getpid(), algorithm, graph, cluster, budget, seed, cost),
                       daemon=True)
    proc.start()
    send.close()
    deadline = time.perf_counter() + seconds + 0.5  # (the seed's own budget is ``seconds``)
    try:
        while not recv.poll(0.25):
            if time.perf_counter() > deadline:
                return f"stopped at its share of the budget ({seconds:.1f} s)"
            if tick() is False:
                return "cancelled"
            if not proc.is_alive() and not recv.poll(0):
                return f"its process ended without an answer (exit code {proc.exitcode})"
        status, value = recv.recv()
    except EOFError:  # the child closed the pipe by dying
        proc.join(5)
        return f"its process ended without an answer (exit code {proc.exitcode})"
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        recv.close()
    if status != "ok":
        raise ValueError(value)
    data, time_s, feasible, iterations = value
    return strategy_from_dict(data), time_s, feasible, iterations


def _best(found: dict[str, tuple[Strategy, Price]]) -> tuple[str, Strategy]:
    """The fastest that fits; when none fits, the fastest (the least bad)."""
    name = min(found, key=lambda n: (not found[n][1].feasible, found[n][1].time_s))
    return name, found[name][0]


def _ms(p: Price) -> str:
    return f"{p.time_s * 1e3:.1f} ms" + ("" if p.feasible else " (does not fit)")
