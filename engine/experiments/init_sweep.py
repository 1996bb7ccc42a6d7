"""Parallel random initialisation ("init-sweep"), tested at equal compute.

The project's source material proposes: sample many random initialisations of a network in
parallel, keep those with low loss and large gradients, narrow the sampling around them, then
train the few best, and claims this converges faster than one initialisation. This module runs
that idea on a small problem and compares three arms that each spend the same total compute:

(a) ``sweep``: the idea, as successive halving (Jamieson & Talwalkar 2016, "Non-stochastic best
    arm identification and hyperparameter optimization", Algorithm 1; Li et al. 2018,
    Hyperband, §3) with these explicit rules (:func:`halving_schedule`, :func:`select`):

    1. *sample*: ``inits`` networks from PyTorch's default ``nn.Linear`` init are scored by one
       forward and backward pass each (no update): loss and gradient norm.
    2. *narrow*: keep ``k = ceil(inits / eta)`` by rank-sum (rank of loss, lowest first, plus
       rank of gradient norm, largest first; ties to the lower loss, then the lower index);
       draw ``inits - k`` new candidates by *perturbing the survivors' weights* (round-robin over
       the survivors in rank order) with Gaussian noise whose std is ``narrow_scale`` times each
       tensor's default-init std (``1/sqrt(3 fan_in)``: the std of U(-1/sqrt(fan_in),
       1/sqrt(fan_in)), PyTorch's ``nn.Linear.reset_parameters``); score them; keep ``k`` of the
       ``inits`` by the same rank-sum.
    3. *rungs*: train the ``m`` alive for ``r`` steps each, keep ``max(keep, ceil(m / eta))`` by
       loss alone (``rung_grad_weight`` = 0 by default: late in training a large gradient is
       not a virtue), multiply ``r`` by ``eta``; until ``keep`` remain.
    4. *final*: the ``keep`` survivors share what is left of the budget.
(b) ``independent``: ``inits`` runs from independent inits, each ``budget / inits`` steps.
(c) ``single``: one run with the whole budget.

Compute is counted in *examples through a forward and backward pass*: a step (scoring or
training) on the full batch of ``n`` examples costs ``n``; every arm spends exactly
``budget_steps * n`` (test-pinned). Loss is the full-batch cross-entropy (nats) that each step's
forward computes, so "reached the target" needs no extra evaluation. Members of a phase run in
lockstep on a process pool: a hit at a member's ``t``-th step of a phase with ``m`` members
costs the compute before the phase plus ``m * t * n`` (``compute_to_target_examples``) and
``steps before the phase + t`` sequential steps (``steps_to_target``: wall time on ideal
parallel hardware). ``final_loss`` is the best end member's loss after its last update (one
uncounted forward). The loss curve (``curve_points``): the lowest loss any member has reached
against the compute spent, counted the same way (it reaches the target at
``compute_to_target_examples``). Members run here, on a process pool or on Ray (``backend="ray"``:
local, or a cluster's address; :class:`engine.search.processes.Backend`, as ``soapbox sweep``): the same
rows for a seed on each.

Problem: a 2-D spiral of ``classes`` arms (Karpathy's CS231n "spiral" dataset), an MLP with
ReLU, full-batch Adam (Kingma & Ba 2015, Algorithm 1) written out so that its state travels
between processes as NumPy arrays. The dataset is fixed (``data_seed``); a seed changes every
initialisation and perturbation. torch is imported only inside the workers' functions, with one
thread each, so a seed reproduces every number on any number of workers.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["InitSweepConfig", "Phase", "halving_schedule", "split_budget", "select", "spiral", "run_experiment",
           "summarise", "config_dict", "run_member", "premise", "ARMS"]

ARMS = ("sweep", "independent", "single")


@dataclass(frozen=True)
class InitSweepConfig:
    """The experiment. Steps are full-batch forward+backward passes (each ``examples`` examples)."""

    inits: int = 16                 # N: initialisations sampled (arm a) and independent runs (arm b)
    budget_steps: int = 2000        # steps per arm (compute = budget_steps * examples)
    target_loss: float = 0.02       # cross-entropy, nats (a single run reaches it in ~300 steps)
    eta: int = 2                    # halving factor: keep ceil(m / eta) at each selection
    keep: int = 2                   # "the few best" trained at the end
    rung_steps: int = 0             # first rung's steps per member; 0: the rungs take ~1/4 of the budget
    narrow: bool = True             # step 2 (perturb the survivors' weights) on or off
    narrow_scale: float = 0.5       # perturbation std, as a fraction of each tensor's default-init std
    rung_grad_weight: float = 0.0   # weight of the gradient-norm rank at training rungs (1.0 at scoring)
    hidden: tuple[int, ...] = (32, 32)
    classes: int = 3
    points_per_class: int = 100
    noise: float = 0.2              # spiral's angular noise, radians
    lr: float = 0.01                # Adam step size
    data_seed: int = 0

    def __post_init__(self) -> None:
        checks = [("inits", self.inits >= 1, "at least 1"), ("budget_steps", self.budget_steps >= 1, "at least 1"),
                  ("target_loss", self.target_loss > 0 and math.isfinite(self.target_loss), "a number above 0"),
                  ("eta", self.eta >= 2, "at least 2"), ("keep", self.keep >= 1, "at least 1"),
                  ("rung_steps", self.rung_steps >= 0, "0 or more"),
                  ("narrow_scale", self.narrow_scale >= 0 and math.isfinite(self.narrow_scale), "0 or more"),
                  ("hidden", len(self.hidden) >= 1 and all(h >= 1 for h in self.hidden), "widths of at least 1"),
                  ("classes", self.classes >= 2, "at least 2"), ("points_per_class", self.points_per_class >= 1,
                                                                 "at least 1"),
                  ("lr", self.lr > 0 and math.isfinite(self.lr), "a number above 0")]
        for name, ok, want in checks:
            if not ok:
                raise ValueError(f"init-sweep: {name} must be {want}, got {getattr(self, name)!r}")

    @property
    def examples(self) -> int:
        """Examples in the full batch (one step's compute)."""
        return self.classes * self.points_per_class


@dataclass(frozen=True)
class Phase:
    """One phase of arm (a): ``members`` networks each take ``steps`` steps; ``survivors`` go on."""

    name: str        # "sample", "narrow", "rung", "final"
    members: int
    steps: int       # per member (1 for a scoring phase: forward + backward, no update)
    survivors: int

    @property
    def cost_steps(self) -> int:
        return self.members * self.steps


def halving_schedule(inits: int, budget_steps: int, eta: int = 2, keep: int = 2, rung_steps: int = 0,
                     narrow: bool = True) -> list[Phase]:
    """Arm (a)'s phases; their ``cost_steps`` add up to ``budget_steps`` exactly.

    The final phase's ``steps`` is per member: the remainder ``R`` of the budget over ``keep``
    members is split ``R // keep`` each, and the ``R % keep`` steps left over go one each to the
    best members (:func:`split_budget`), so ``sum(cost_steps) + R % keep == budget_steps``.

    >>> [(p.name, p.members, p.steps, p.survivors) for p in halving_schedule(8, 100, rung_steps=2)]
    [('sample', 8, 1, 4), ('narrow', 4, 1, 4), ('rung', 4, 2, 2), ('final', 2, 40, 2)]

    Raises ``ValueError`` when the budget cannot pay for the scoring and rungs and leave each
    survivor at least one step.
    """
    keep = min(keep, inits)
    k = max(keep, math.ceil(inits / eta))
    phases = [Phase("sample", inits, 1, k)]
    if narrow and inits > k:
        phases.append(Phase("narrow", inits - k, 1, k))
    rungs, m = 0, k
    while m > keep:
        m = max(keep, math.ceil(m / eta))
        rungs += 1
    if rung_steps <= 0 and rungs:
        rung_steps = max(1, budget_steps // (4 * rungs * k))
    m, r = k, rung_steps
    while m > keep:
        nxt = max(keep, math.ceil(m / eta))
        phases.append(Phase("rung", m, r, nxt))
        m, r = nxt, r * eta
    left = budget_steps - sum(p.cost_steps for p in phases)
    if left < m:
        need = budget_steps - left + m
        raise ValueError(f"init-sweep: a budget of {budget_steps:,} steps cannot pay for {inits} inits' scoring and "
                         f"halving (needs at least {need:,}); give more budget steps or fewer inits")
    phases.append(Phase("final", m, left // m, m))
    return phases


def split_budget(total_steps: int, runs: int) -> list[int]:
    """Steps per run when ``runs`` share ``total_steps``: equal, the first ``total % runs`` one more.

    >>> split_budget(10, 4)
    [3, 3, 2, 2]
    """
    if runs < 1 or total_steps < runs:
        raise ValueError(f"init-sweep: {total_steps:,} steps cannot give each of {runs:,} runs one step")
    q, r = divmod(total_steps, runs)
    return [q + (i < r) for i in range(runs)]


def select(losses: Sequence[float], grad_norms: Sequence[float], k: int, grad_weight: float = 1.0) -> list[int]:
    """Indices of the ``k`` best members, best first.

    Score = rank of loss (0 = lowest) + ``grad_weight`` x rank of gradient norm (0 = largest);
    lower is better; ties go to the lower loss, then the lower index. A NaN loss ranks last.

    >>> select([0.5, 0.4, 0.9, 0.4], [2.0, 0.1, 0.5, 1.0], 2)
    [3, 0]
    >>> select([0.5, 0.4, 0.9, 0.4], [2.0, 0.1, 0.5, 1.0], 2, grad_weight=0.0)
    [1, 3]
    """
    n = len(losses)
    loss = np.nan_to_num(np.asarray(losses, dtype=float), nan=np.inf)
    grad = np.nan_to_num(np.asarray(grad_norms, dtype=float), nan=-np.inf)
    rank_loss = np.empty(n)
    rank_loss[np.lexsort((np.arange(n), loss))] = np.arange(n)
    rank_grad = np.empty(n)
    rank_grad[np.lexsort((np.arange(n), -grad))] = np.arange(n)
    score = rank_loss + grad_weight * rank_grad
    return [int(i) for i in np.lexsort((np.arange(n), loss, score))[:k]]


@lru_cache(maxsize=8)
def spiral(classes: int, points_per_class: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The 2-D spiral (CS231n, "Putting it together: minimal neural network case study"):
    ``x`` [n, 2] float32 and labels ``y`` [n] int64, class-major order."""
    rng = np.random.default_rng(seed)
    r = np.linspace(0.0, 1.0, points_per_class)
    xs, ys = [], []
    for c in range(classes):
        t = np.linspace(c * 4.0, (c + 1) * 4.0, points_per_class) + rng.normal(0.0, noise, points_per_class)
        xs.append(np.stack([r * np.sin(t), r * np.cos(t)], axis=1))
        ys.append(np.full(points_per_class, c))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.int64)


# --------------------------------------------------------------------------- worker side (torch)

def _widths(cfg: InitSweepConfig) -> list[int]:
    return [2, *cfg.hidden, cfg.classes]


def _init_params(cfg: InitSweepConfig, seed: int) -> list[np.ndarray]:
    """PyTorch's default ``nn.Linear`` init (weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)))."""
    import torch

    torch.manual_seed(seed)
    w = _widths(cfg)
    return [t.detach().numpy().copy() for a, b in zip(w, w[1:])
            for t in (lambda lin: (lin.weight, lin.bias))(torch.nn.Linear(a, b))]


def _perturb(params: list[np.ndarray], scale: float, seed: int) -> list[np.ndarray]:
    """``params`` plus N(0, (scale * std_init)^2) per element, std_init = 1/sqrt(3 fan_in)."""
    rng = np.random.default_rng(seed)
    out = []
    for i, p in enumerate(params):
        fan_in = params[i - (i % 2)].shape[1]  # (weight, bias) pairs: the pair's weight gives fan_in
        out.append((p + rng.normal(0.0, scale / math.sqrt(3 * fan_in), p.shape)).astype(np.float32))
    return out


def run_member(task: dict[str, Any]) -> dict[str, Any]:
    """Train (or score) one network: a process-pool task, deterministic in its inputs.

    ``task``: ``cfg``, ``params`` (or ``init_seed``, optionally ``perturb``: (seed, scale)),
    ``adam`` state or None, ``steps`` (0: score only: one forward and backward, no update).
    Returns ``params``, ``adam``, ``losses`` [steps] (nats, each step's forward; one entry when
    scoring), ``grad_norm`` (L2, last step), ``final_loss`` (after the last update).
    """
    import torch

    torch.set_num_threads(1)
    cfg: InitSweepConfig = task["cfg"]
    params = task.get("params")
    if params is None:
        params = _init_params(cfg, task["init_seed"])
        if task.get("perturb"):
            params = _perturb(params, task["perturb"][1], task["perturb"][0])
    x_np, y_np = spiral(cfg.classes, cfg.points_per_class, cfg.noise, cfg.data_seed)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
    ps = [torch.tensor(p, requires_grad=True) for p in params]
    m = [torch.from_numpy(a.copy()) for a in task["adam"][0]] if task.get("adam") else [torch.zeros_like(p) for p in ps]
    v = [torch.from_numpy(a.copy()) for a in task["adam"][1]] if task.get("adam") else [torch.zeros_like(p) for p in ps]
    t = task["adam"][2] if task.get("adam") else 0
    b1, b2, eps = 0.9, 0.999, 1e-8

    def forward() -> Any:
        h = x
        for i in range(0, len(ps), 2):
            h = h @ ps[i].T + ps[i + 1]
            if i + 2 < len(ps):
                h = torch.relu(h)
        return torch.nn.functional.cross_entropy(h, y)

    losses, grad_norm = [], 0.0
    for _ in range(max(1, task["steps"])):
        loss = forward()
        grads = torch.autograd.grad(loss, ps)
        losses.append(float(loss.detach()))
        grad_norm = float(torch.sqrt(sum((g * g).sum() for g in grads)))
        if task["steps"] == 0:
            break
        t += 1
        with torch.no_grad():
            for p, g, mi, vi in zip(ps, grads, m, v):  # Adam, Kingma & Ba 2015, Algorithm 1
                mi.mul_(b1).add_(g, alpha=1 - b1)
                vi.mul_(b2).addcmul_(g, g, value=1 - b2)
                p.sub_(cfg.lr * (mi / (1 - b1 ** t)) / ((vi / (1 - b2 ** t)).sqrt() + eps))
    with torch.no_grad():
        final = float(forward()) if task["steps"] else losses[-1]
    adam = ([a.numpy() for a in m], [a.numpy() for a in v], t)
    return {"params": [p.detach().numpy().copy() for p in ps], "adam": adam,
            "losses": np.asarray(losses), "grad_norm": grad_norm, "final_loss": final}


# --------------------------------------------------------------------------- the arms (parent side)

Mapper = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def _seed(seed: int, *path: int) -> int:
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, *path]).generate_state(1)[0])


class _Tally:
    """Compute and sequential steps spent by one arm, and the first hit of the target."""

    def __init__(self, cfg: InitSweepConfig):
        self.cfg, self.compute_steps, self.depth, self.hit = cfg, 0, 0, None
        # after each lockstep step: compute spent (steps x members) and the lowest loss so far (nats)
        self.curve_steps: list[np.ndarray] = []
        self.curve_loss: list[np.ndarray] = []

    def phase(self, results: list[dict[str, Any]], steps: Sequence[int]) -> None:
        """Members ran in lockstep, member i for ``steps[i]`` steps."""
        loss = np.full((len(results), max(steps)), np.inf)  # [member, step]; NaN or past a member's end: inf
        for i, (r, s) in enumerate(zip(results, steps)):
            loss[i, :s] = np.nan_to_num(r["losses"][:s], nan=np.inf)
        step_best = loss.min(0)  # [step]: the lowest loss of the step's forward passes
        spent = self.compute_steps + np.minimum(np.arange(1, len(step_best) + 1)[None, :],
                                                np.asarray(steps)[:, None]).sum(0)  # [step]
        reached = step_best <= self.cfg.target_loss
        if self.hit is None and reached.any():
            t = int(np.argmax(reached))
            self.hit = (int(spent[t]) * self.cfg.examples, self.depth + t + 1)
        before = self.curve_loss[-1][-1] if self.curve_loss else np.inf
        self.curve_loss.append(np.minimum.accumulate(np.minimum(step_best, before)))
        self.curve_steps.append(spent)
        self.compute_steps += sum(steps)
        self.depth += max(steps)

    def curve(self, points: int) -> dict[str, list]:
        """The lowest loss reached (nats; None before the first step) at ``points`` evenly spaced
        amounts of compute, the budget's 1/points to all of it (examples)."""
        steps, loss = np.concatenate(self.curve_steps), np.concatenate(self.curve_loss)
        grid = np.arange(1, points + 1) * (self.cfg.budget_steps / points)  # [point], steps
        at = np.searchsorted(steps, grid + 1e-9, side="right") - 1
        return {"compute_examples": [float(g * self.cfg.examples) for g in grid],
                "best_loss": [float(loss[i]) if i >= 0 and np.isfinite(loss[i]) else None for i in at]}


def _arm_sweep(cfg: InitSweepConfig, seed: int, run: Mapper) -> tuple[_Tally, float]:
    phases = halving_schedule(cfg.inits, cfg.budget_steps, cfg.eta, cfg.keep, cfg.rung_steps, cfg.narrow)
    tally = _Tally(cfg)
    tasks = [{"cfg": cfg, "init_seed": _seed(seed, 1, i), "steps": 0} for i in range(cfg.inits)]
    pop = run(tasks)
    tally.phase(pop, [1] * len(pop))
    alive = [pop[i] for i in select([r["losses"][0] for r in pop], [r["grad_norm"] for r in pop], phases[0].survivors)]
    for ph in phases[1:]:
        if ph.name == "narrow":
            tasks = [{"cfg": cfg, "params": _perturb(alive[j % len(alive)]["params"], cfg.narrow_scale,
                                                     _seed(seed, 2, j)), "steps": 0} for j in range(ph.members)]
            new = run(tasks)
            tally.phase(new, [1] * len(new))
            pop = alive + new
            alive = [pop[i] for i in select([r["losses"][0] for r in pop], [r["grad_norm"] for r in pop],
                                            ph.survivors)]
        else:
            steps = [ph.steps] * ph.members
            if ph.name == "final":
                steps = split_budget(cfg.budget_steps - tally.compute_steps, ph.members)
            out = run([{"cfg": cfg, "params": a["params"], "adam": a["adam"] if a["adam"][2] else None, "steps": s}
                       for a, s in zip(alive, steps)])
            tally.phase(out, steps)
            order = select([r["final_loss"] for r in out], [r["grad_norm"] for r in out], ph.survivors,
                           cfg.rung_grad_weight)
            alive = [out[i] for i in order]
    return tally, min(r["final_loss"] for r in alive)


def _arm_runs(cfg: InitSweepConfig, seed: int, runs: int, run: Mapper) -> tuple[_Tally, float]:
    steps = split_budget(cfg.budget_steps, runs)
    tally = _Tally(cfg)
    out = run([{"cfg": cfg, "init_seed": _seed(seed, 3 if runs > 1 else 4, i), "steps": s}
               for i, s in enumerate(steps)])
    tally.phase(out, steps)
    return tally, min(r["final_loss"] for r in out)


def _member(_context: Any, task: dict[str, Any]) -> dict[str, Any]:
    return run_member(task)


def _mapper(workers: int, backend: str = "pool", address: str | None = None) -> tuple[Mapper, Callable[[], None]]:
    """Run tasks in order on one process, a process pool or Ray (:class:`engine.search.processes.Backend`,
    the sweep's and the searches' plumbing)."""
    from contextlib import ExitStack

    from ..search.processes import Backend

    stack = ExitStack()
    # fork is cheap and safe while this process has not started torch's thread pools; else spawn
    b = stack.enter_context(Backend(backend, workers=workers, address=address, fork="torch" not in sys.modules))
    return (lambda tasks: b.map(_member, tasks)), stack.close


def run_experiment(cfg: InitSweepConfig, seeds: Sequence[int], workers: int = 1,
                   arms: Sequence[str] = ARMS, backend: str = "pool", address: str | None = None,
                   curve_points: int = 0) -> list[dict[str, Any]]:
    """One row per (seed, arm): ``compute_to_target_examples`` and ``steps_to_target`` (None
    when the target was not reached), ``final_loss`` (nats), ``compute_examples`` (spent),
    ``wall_s``; with ``curve_points``, ``curve`` (:meth:`_Tally.curve`: the lowest loss reached
    against compute). The same seeds give the same rows (``wall_s`` aside) on any number of
    workers and on either ``backend`` ("pool": this process or a process pool; "ray": Ray,
    local or at ``address``)."""
    if backend not in ("pool", "ray"):
        raise ValueError(f"init-sweep: backend must be pool or ray, got {str(backend)[:40]!r}")
    if not 0 <= curve_points <= 100_000:
        raise ValueError(f"init-sweep: curve_points must be 0 to 100,000, got {curve_points!r}")
    if not seeds:
        raise ValueError("init-sweep: give at least one seed")
    if workers < 1:
        raise ValueError(f"init-sweep: workers must be at least 1, got {workers}")
    bad = [a for a in arms if a not in ARMS]
    if bad:
        raise ValueError(f"init-sweep: unknown arm {bad[0]!r}; arms are {', '.join(ARMS)}")
    halving_schedule(cfg.inits, cfg.budget_steps, cfg.eta, cfg.keep, cfg.rung_steps, cfg.narrow)  # (a clear error)
    split_budget(cfg.budget_steps, cfg.inits)
    run, close = _mapper(workers, backend, address)
    rows = []
    try:
        for seed in seeds:
            for arm in arms:
                t0 = time.perf_counter()
                tally, final = (_arm_sweep(cfg, seed, run) if arm == "sweep" else
                                _arm_runs(cfg, seed, cfg.inits if arm == "independent" else 1, run))
                rows.append({"seed": seed, "arm": arm, "compute_examples": tally.compute_steps * cfg.examples,
                             "compute_to_target_examples": tally.hit[0] if tally.hit else None,
                             "steps_to_target": tally.hit[1] if tally.hit else None,
                             "sequential_steps": tally.depth, "final_loss": final,
                             "wall_s": time.perf_counter() - t0})
                if curve_points:
                    rows[-1]["curve"] = tally.curve(curve_points)
    finally:
        close()
    return rows


def premise(cfg: InitSweepConfig, seed: int, workers: int = 1) -> dict[str, Any]:
    """Does what the sweep scores at init predict training? The sweep's own ``inits`` first
    inits for ``seed``, each scored and then trained alone for the whole budget: Spearman's rank
    correlation (Spearman 1904) of the steps to the target (a run that never reaches it counts
    ``budget_steps + 1``) with the init loss (``rho_loss``) and with minus the gradient norm
    (``rho_minus_grad``). Both near +1: the rule picks fast learners; near 0: it picks at random.
    """
    seeds = [_seed(seed, 1, i) for i in range(cfg.inits)]
    run, close = _mapper(workers)
    try:
        scored = run([{"cfg": cfg, "init_seed": s, "steps": 0} for s in seeds])
        trained = run([{"cfg": cfg, "init_seed": s, "steps": cfg.budget_steps} for s in seeds])
    finally:
        close()
    steps = []
    for r in trained:
        hit = np.nonzero(r["losses"] <= cfg.target_loss)[0]
        steps.append(int(hit[0]) + 1 if len(hit) else cfg.budget_steps + 1)
    loss, grad = [float(r["losses"][0]) for r in scored], [r["grad_norm"] for r in scored]
    return {"steps_to_target": steps, "init_loss": loss, "init_grad_norm": grad,
            "rho_loss": _spearman(loss, steps), "rho_minus_grad": _spearman([-g for g in grad], steps)}


def _spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho: Pearson's correlation of the ranks (tied values share their mean rank);
    NaN when either side is constant.

    >>> _spearman([1, 2, 3], [10, 30, 20]), _spearman([1, 2, 3], [5, 5, 1])
    (0.5, -0.8660254037844387)
    """
    def ranks(x: Sequence[float]) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        r = np.empty(len(x))
        r[np.argsort(x, kind="stable")] = np.arange(len(x))
        for v in np.unique(x):
            r[x == v] = r[x == v].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm: seeds, how many reached the target, and median / min / max of compute and steps
    to target (over the seeds that reached it) and of the final loss."""
    out = []
    for arm in [a for a in ARMS if any(r["arm"] == a for r in rows)]:
        mine = [r for r in rows if r["arm"] == arm]
        hit = [r for r in mine if r["compute_to_target_examples"] is not None]
        row: dict[str, Any] = {"arm": arm, "seeds": len(mine), "reached": len(hit)}
        for key, vals in (("compute_to_target_examples", [r["compute_to_target_examples"] for r in hit]),
                          ("steps_to_target", [r["steps_to_target"] for r in hit]),
                          ("final_loss", [r["final_loss"] for r in mine])):
            row[key] = ({"median": statistics.median(vals), "min": min(vals), "max": max(vals)} if vals else None)
        out.append(row)
    return out


def config_dict(cfg: InitSweepConfig) -> dict[str, Any]:
    """The config as JSON-ready values."""
    d = asdict(cfg)
    d["hidden"] = list(cfg.hidden)
    d["examples_per_step"] = cfg.examples
    return d
