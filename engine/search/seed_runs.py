"""How ``auto`` runs a seed search (:mod:`engine.search.auto`): the share of a time budget
each seed gets (:func:`seed_slice`), bounded in a forked child process stopped at that share
(PaSE's set-up and dynamic program cannot be stopped midway), or every seed at once as a
backend's tasks with a number budget.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time

from ..strategy import strategy_from_dict
from .api import AutoOptions
from .processes import Backend, die_with_parent
from .registry import ALGORITHMS

__all__ = ["bounded", "seeds_on_backend", "seed_task", "seed_slice", "SEED_PRICINGS"]


#: how many of auto's slowest pricings a seed's slice must hold for it to be started (one
#: otherwise): the differentiable search builds PaSE's problem, descends, then prices its plan,
#: so its slice holds its set-up and descent and one pricing. On NMT / k80-16x4 (pricing 2.0 s,
#: a slice of 2.4-2.7 s) it was stopped at its share in every run, and its time lost to the
#: polish (issue 43)
SEED_PRICINGS = {"differentiable": 2}


def seed_slice(name: str, left_s: float, later: list[str]) -> float:
    """The seconds seed ``name`` may run, of ``left_s`` left in the seeds' share of a time
    budget, with the seeds in ``later`` still to run: half when others follow, the last seed
    all that is left. The pipeline planner gets half (it was a third: on ResNet-101 / p100-4x4
    it takes 1.5-2.9 s and finds 50.5 ms against the best baseline's 56.8 ms, and a third of a
    15 s budget's seed share, 2.2 s, stopped it in one run of three). PaSE gets half when the
    differentiable search follows, so that, when it pays nothing, the differentiable search
    (which solves its problem) is skipped and the time goes to the polish and MCMC; auto caps
    the two together at :data:`engine.search.auto.PASE_FAMILY_SHARE` of the budget.

    >>> seed_slice("differentiable", 10.0, ["pase"]), seed_slice("pase", 4.0, [])
    (5.0, 4.0)
    """
    if not later:
        return left_s
    return left_s / 2


def seed_task(ctx: tuple, name: str) -> tuple[str, object]:
    """One seed as a backend's task (:class:`engine.search.processes.Backend`): ("ok", (best as
    a dict, its simulated time in s, fits, proposals), seconds it ran) or ("refused", why,
    seconds it ran)."""
    graph, cluster, seed, cost = ctx
    t = time.perf_counter()
    try:
        r = ALGORITHMS[name].run(graph, cluster, None, seed=seed, cost=cost)
    except (ValueError, MemoryError) as e:
        return "refused", str(e), time.perf_counter() - t
    return "ok", (r.best.to_dict(), r.best_time_s, math.isfinite(r.best_cost_s), r.iterations), \
        time.perf_counter() - t


def seeds_on_backend(seeds: list[str], graph, cluster, seed: int, cost, opts: AutoOptions) -> dict[str, tuple]:
    """Every seed at once on ``opts.backend``: name -> :func:`seed_task`'s answer."""
    with Backend(opts.backend, context=(graph, cluster, seed, cost), workers=opts.workers,
                 address=opts.address) as b:
        return dict(zip(seeds, b.map(seed_task, seeds)))


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


def bounded(algorithm, graph, cluster, budget, seed, cost, seconds: float, tick):
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
