"""Differentiable search: a softmax relaxation of each op's choice of config (DARTS-style,
Liu, Simonyan, Yang ICLR'19), optimised by gradient descent with temperature annealing.

Each op v holds logits θ_v over its configs (PaSE's config space and cost tables,
:mod:`engine.search.pase`; on a mixed cluster the configs' device sets are part of that space:
:mod:`engine.search.pase_placement`), and p_v = softmax(θ_v / τ). The expected cost is smooth:

    E(θ) = Σ_v p_v · a_v + Σ_(u,v) p_uᵀ B_uv p_v + λ Σ_d relu(M_d(p) − cap_d)² / cap_d²

— compute (on the slowest of each config's devices, so a mixed cluster is priced at its
devices' own speeds: :func:`engine.search.pase.compute_time_s`) and parameter synchronisation
linear in each op's probabilities (a_v), data movement bilinear in neighbouring ops' (B_uv),
and memory as a penalty: M_d(p), the expected bytes each
device holds (weights, gradients and optimizer state of every partition placed on it, plus
the activations it keeps), over its capacity. Gradients are analytic (NumPy): for
p = softmax(z), ∂E/∂z = p ⊙ (g − p·g) with g = ∂E/∂p, and z = θ/τ.

Adam (Kingma & Ba 2015) on θ, warm-started from a strategy (data parallel by default; see
:func:`optimise`), τ annealed geometrically from ``tau0`` to ``tau1`` so the distributions
harden; then the argmax config of every op, and a short greedy polish: single-op changes
that lower the same cost F, until none does (so the result is a local optimum of F).

The result is simulated like every search's; when it is slower than a baseline (data parallel,
FlexFlow's expert strategy) the baseline is returned with a note saying so
(:func:`engine.search.pase.finish`). Progress rows carry F of the current argmax as their
current cost and the best *simulated* cost so far (data parallel's, then the result's) as
their best, so the best curve never rises.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..cluster import Cluster
from ..costs import CostModel
from ..graph import OpGraph
from ..ops import DTYPE_BYTES
from ..strategy import Strategy
from ..sim.memory_static import optimizer_bytes_per_param
from ..errors import TooLargeError
from .api import Budget, DifferentiableOptions, Price, Progress, ProgressFn, SearchResult, price
from .baselines import data_parallel, make_baseline
from .pase import PaseProblem, build_problem, finish

__all__ = ["relaxed_cost", "optimise", "differentiable", "DESCENT_SHARE"]

#: with a time budget, the share of :func:`optimise`'s seconds the gradient descent takes; its
#: greedy polish gets the rest (without one: a quarter of the descent's time, at least 1 s)
DESCENT_SHARE = 0.8


def _memory_terms(problem: PaseProblem) -> tuple[list[np.ndarray], np.ndarray]:
    """[op] -> [config, device] bytes an op's partition keeps on each device (parameters
    with gradients and Adam state, and the activations it saves), and [device] capacity."""
    g, c = problem.graph, problem.cluster
    D = c.num_devices
    pbytes = DTYPE_BYTES[g.precision]
    per_param = 2 * pbytes + optimizer_bytes_per_param(g.precision)  # weights, gradients, Adam
    out = []
    for op, cs in zip(g.ops, problem.configs):
        m = np.zeros((len(cs), D))
        for k, cfg in enumerate(cs):
            ins, _, _ = op.partition_shapes(cfg.degrees)
            keep = op.partition_param_elements(cfg.degrees) * per_param
            keep += sum(math.prod(s) * DTYPE_BYTES[t.dtype] for s, t in zip(ins, op.in_tensors))
            m[k, list(cfg.devices)] = keep
        out.append(m)
    cap = np.array([c.device_type(d).memory_bytes for d in range(D)], dtype=np.float64)
    return out, cap


def relaxed_cost(problem: PaseProblem, probs: list[np.ndarray], mem: list[np.ndarray] | None = None,
                 cap: np.ndarray | None = None, penalty: float = 10.0) -> tuple[float, list[np.ndarray]]:
    """E and ∂E/∂p_v for every op (see the module docstring)."""
    grads = [a.copy() for a in problem.vertex_cost]
    e = sum(float(p @ a) for p, a in zip(probs, problem.vertex_cost))
    for (u, v), B in problem.edges.items():
        Bv = B @ probs[v]
        e += float(probs[u] @ Bv)
        grads[u] += Bv
        grads[v] += probs[u] @ B
    if mem is not None and cap is not None:
        used = sum(p @ m for p, m in zip(probs, mem))  # [device]
        over = np.maximum(used - cap, 0.0) / cap
        e += penalty * float(over @ over)
        dused = 2 * penalty * over / cap  # ∂penalty/∂used
        if np.any(dused):
            for k, m in enumerate(mem):
                grads[k] += m @ dused
    return e, grads


@dataclass
class DiffResult:
    choice: list[int]
    cost_s: float  # F of the choice (after the polish)
    relaxed_cost_s: float  # E at the end of the descent
    trace: list[tuple[float, float]]  # (seconds, F of the argmax) per logged step
    steps: int
    seconds: float


def _polish(problem: PaseProblem, choice: list[int], deadline: float) -> list[int]:
    """Greedy single-op changes that lower F, until none does (or the deadline)."""
    nbrs: dict[int, list[tuple[int, np.ndarray, bool]]] = {v: [] for v in range(len(choice))}
    for (u, v), B in problem.edges.items():
        nbrs[u].append((v, B, True))
        nbrs[v].append((u, B, False))
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for v in range(len(choice)):
            local = problem.vertex_cost[v].copy()
            for w, B, out in nbrs[v]:
                local += B[:, choice[w]] if out else B[choice[w], :]
            k = int(np.argmin(local))
            if local[k] < local[choice[v]] - 1e-15:
                choice[v] = k
                improved = True
    return choice


def optimise(problem: PaseProblem, steps: int = 400, lr: float = 0.1, tau0: float = 1.0, tau1: float = 0.02,
             seed: int = 0, memory: bool = True, seconds: float | None = None,
             progress: Callable[[int, float, float], Any] | None = None, start: list[int] | None = None,
             warm: float = 0.5) -> DiffResult:
    """Gradient descent on the relaxed cost; returns the polished discrete choice.

    ``start`` (a config index per op) warm-starts the logits: its configs get ``warm`` more.
    Measured on Inception-v3 / p100-4x4: from uniform logits the descent settles in a
    mean-field point whose argmax is 60% above the DP optimum of F, from data parallel's
    configs within 0.1% (docs/benchmarks/2026-11-21-issue-6-pase-differentiable-pipeline.md).
    Costs are scaled by a typical op cost so that ``lr`` is unit-free (Adam makes the step
    size per logit anyway).

    ``seconds`` bounds the descent and the polish together: the descent ends at
    :data:`DESCENT_SHARE` of it, its temperature annealed by the larger of the steps' and the
    time's progress (a descent stopped by time ends as cold as one that ran its steps), and
    the polish gets the rest. Without it, the steps end the descent and the polish gets a
    quarter of the descent's time (at least a second)."""
    t0 = time.perf_counter()
    descent_s = None if seconds is None else DESCENT_SHARE * seconds
    rng = np.random.default_rng(seed)
    scale = max(1e-12, float(np.median([a.mean() for a in problem.vertex_cost if a.size]))) or 1.0
    theta = [rng.normal(0.0, 0.01, len(a)) for a in problem.vertex_cost]
    if start is not None:  # a warm start: the starting strategy's configs are favoured
        for t, k in zip(theta, start):
            t[k] += warm
    m1 = [np.zeros_like(t) for t in theta]
    m2 = [np.zeros_like(t) for t in theta]
    mem, cap = _memory_terms(problem) if memory else (None, None)
    b1, b2, eps = 0.9, 0.999, 1e-8
    trace = []
    e = 0.0
    step = 0
    for step in range(1, steps + 1):
        done = (step - 1) / max(1, steps - 1)
        if descent_s is not None:
            done = min(1.0, max(done, (time.perf_counter() - t0) / max(descent_s, 1e-9)))
        tau = tau0 * (tau1 / tau0) ** done
        probs = []
        for t in theta:
            z = t / tau
            z = np.exp(z - z.max())
            probs.append(z / z.sum())
        e, gp = relaxed_cost(problem, probs, mem, cap)
        for k, (p, g) in enumerate(zip(probs, gp)):
            gz = p * (g - p @ g) / scale / tau  # through softmax and the 1/τ
            m1[k] = b1 * m1[k] + (1 - b1) * gz
            m2[k] = b2 * m2[k] + (1 - b2) * gz * gz
            theta[k] -= lr * (m1[k] / (1 - b1 ** step)) / (np.sqrt(m2[k] / (1 - b2 ** step)) + eps)
        if step % 20 == 0 or step == steps:
            f = problem.cost([int(np.argmax(t)) for t in theta])
            trace.append((time.perf_counter() - t0, f))
            if progress is not None:
                progress(step, time.perf_counter() - t0, f)
        if done >= 1.0 and step > 1:
            break
    choice = [int(np.argmax(t)) for t in theta]
    deadline = t0 + seconds if seconds is not None else \
        time.perf_counter() + max(1.0, 0.25 * (time.perf_counter() - t0))
    choice = _polish(problem, choice, deadline)
    # the relaxation can settle where no single-op change helps but a joint one would (a
    # chain whose optimum is every op unsplit on one device): the answer is the best of the
    # polished relaxation, the warm start and that unsplit strategy (config 0 of every op)
    candidates = [choice, [0] * len(problem.configs)] + ([list(start)] if start is not None else [])
    choice = min(candidates, key=problem.cost)
    f = problem.cost(choice)
    trace.append((time.perf_counter() - t0, f))
    return DiffResult(choice, f, e, trace, step, time.perf_counter() - t0)


def differentiable(graph: OpGraph, cluster: Cluster, budget: Budget | None = None, *, seed: int = 0,
                   progress: ProgressFn | None = None, initial: Strategy | None = None,
                   cost: CostModel | None = None, options: DifferentiableOptions | None = None) -> SearchResult:
    """The search interface (CLI, app): the relaxed descent, discretised and polished, then
    priced like every search's result. A number budget sets the descent's steps
    (``options.steps`` otherwise). A time budget bounds the whole search: the problem's
    set-up and the baselines' pricing come out of it first, the plan's pricing is kept for
    after (as long as the slower baseline's took), and the descent and its polish get the
    rest (:func:`optimise`). NMT / p100-4x4 with 3 s: the set-up took 1.4 s, the descent 3.1
    s and the pricing after it 2.0 s, 7.1 s in all, and in ``auto`` the seed was stopped at its
    share every time (issue 43)."""
    opts = options or DifferentiableOptions()
    t0 = time.perf_counter()
    cost_model = cost or CostModel()
    problem = build_problem(graph, cluster, cost_model, max_table_bytes=None)  # no DP tables are made here
    seconds = budget.seconds if budget is not None else None
    steps = int(budget.iterations) if budget is not None and budget.iterations else opts.steps
    # the best curve is the best *simulated* cost so far (never rising): data parallel, priced
    # before the descent (and reused as the baseline), until the plan is priced at the end;
    # the live rows' current cost is the model's cost F of the current argmax, not a
    # simulated time, so they are streamed but not kept in the result's trace
    known: dict[str, Price] = {}
    took = 0.0  # the slowest baseline's pricing: the plan's pricing at the end takes about as long
    for name in ("data-parallel", "expert"):
        t = time.perf_counter()
        try:
            known[name] = price(graph, make_baseline(name, graph, cluster), cluster, cost_model)
        except (ValueError, TooLargeError):  # (price_baselines says why in the result's notes)
            pass
        took = max(took, time.perf_counter() - t)
    best_s = known["data-parallel"].cost_s if "data-parallel" in known else math.inf
    if seconds is not None:
        seconds = max(0.0, seconds - (time.perf_counter() - t0) - took)

    def report(step: int, elapsed: float, f: float) -> None:
        if progress is not None:
            progress(Progress(step, time.perf_counter() - t0, f, best_s, 1.0, 1))

    start_from = initial if initial is not None else data_parallel(graph, cluster)
    start = [cs.index(start_from[op.name]) if start_from[op.name] in cs else 0
             for op, cs in zip(graph.ops, problem.configs)]
    r = optimise(problem, steps=steps, seed=seed, seconds=seconds, progress=report, start=start)
    result = finish(graph, cluster, problem, r.choice, cost_model,
                    {"algorithm": "differentiable", "seed": seed, "options": {"steps": steps},
                     "relaxed_cost_s": r.relaxed_cost_s, "model_cost_s": r.cost_s}, t0, iterations=r.steps,
                    known=known)
    if progress is not None:
        progress(result.trace[-1])
    return result
