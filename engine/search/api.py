"""The search protocol: what every search takes, reports and returns, and how every strategy a
search returns or compares with is priced.

Every search is a function

    search(graph, cluster, budget, *, seed=0, progress=None, initial=None, cost=None,
           options=None) -> SearchResult

``options`` is the algorithm's own typed dataclass (:class:`MCMCOptions`, :class:`PaseOptions`,
:class:`DifferentiableOptions`, :class:`PipelineOptions`); an unknown option is an error, never
silently dropped. Its result's cost and its baselines' costs come from one function,
:func:`price`: the simulated iteration time when every device fits in memory, ``inf``
otherwise, so ``speedup_vs_data_parallel`` means the same for every algorithm (None when
either side does not fit).

This module imports no algorithm: the CLI and the app read the registry
(:data:`engine.search.ALGORITHMS`) and build options without loading the searches.
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..cluster import Cluster
from ..costs import CostModel
from ..errors import Cancelled, TooLargeError
from ..graph import OpGraph
from ..strategy import Strategy, validate_strategy

__all__ = ["Budget", "Progress", "SearchResult", "Price", "price", "whole_cost", "price_baselines", "SEARCH_MAX_TASKS",
           "stamp", "MCMCOptions", "AutoOptions", "PaseOptions", "DifferentiableOptions", "PipelineOptions",
           "LayoutOptions", "CONSTRAINTS", "parse_options", "ProgressFn"]


@dataclass(frozen=True)
class Budget:
    """An iteration count, a number of seconds, or both (whichever runs out first); neither
    is unlimited (the search decides when it is done)."""

    iterations: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> "Budget":
        """``"5000"`` (proposals), ``"30s"``, ``"2m"`` or ``"1h"``: at most 10**9 proposals or
        7 days (604,800 s).

        >>> Budget.parse("30s"), Budget.parse("5000")
        (Budget(iterations=None, seconds=30.0), Budget(iterations=5000, seconds=None))
        """
        max_iterations, max_seconds = 10**9, 7 * 86400
        shown = repr(str(text)[:40] + ("..." if len(str(text)) > 40 else ""))
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text)) if len(str(text)) <= 1000 else None
        if not m:
            raise ValueError(f"budget {shown} is not a number of proposals (5000) or a time (30s, 2m, 1h): "
                             f"at most {max_iterations:,} proposals or 7 days")
        value, unit = float(m.group(1)), m.group(2)
        if value <= 0:
            raise ValueError(f"budget {shown} must be positive")
        if unit:
            seconds = value * {"s": 1, "m": 60, "h": 3600}[unit]
            if seconds > max_seconds:
                raise ValueError(f"budget {shown} is more than 7 days ({max_seconds:,} s), the longest a search runs")
            return cls(seconds=seconds)
        if value > max_iterations:  # (before int(): 400 nines are inf as a float)
            raise ValueError(f"budget {shown} is more than {max_iterations:,} proposals, the most a search runs")
        if value != int(value):
            raise ValueError(f"budget {shown}: a number of proposals must be a whole number")
        return cls(iterations=int(value))

    def __str__(self) -> str:
        parts = []
        if self.iterations is not None:
            parts.append(f"{self.iterations} proposals")
        if self.seconds is not None:
            parts.append(f"{self.seconds:g} s")
        return " or ".join(parts) or "unlimited"


@dataclass(frozen=True)
class Progress:
    """One row of a search's progress stream (times in seconds)."""

    iteration: int
    elapsed_s: float
    current_cost_s: float
    best_cost_s: float
    acceptance_rate: float
    chains: int = 1
    #: the best strategy so far, where the search has one at this row (a reference, not a
    #: copy: a consumer that keeps it, such as the app's worker, serialises it at once)
    best: Strategy | None = field(default=None, repr=False, compare=False)


#: called with every progress row; returning ``False`` cancels the search
ProgressFn = Callable[[Progress], "bool | None"]


@dataclass(frozen=True)
class Price:
    """What a strategy costs: its simulated iteration time and whether it fits."""

    time_s: float  # simulated iteration time, fitting or not
    feasible: bool  # every device fits in memory

    @property
    def cost_s(self) -> float:
        """The quantity searches minimise and compare: ``time_s`` when it fits, else inf."""
        return self.time_s if self.feasible else math.inf


#: the most tasks a search lets one full (not symmetric) simulation of a candidate have
#: (~220 bytes a task: 8 M tasks is ~1.8 GB); FlexFlow's expert strategy for GPT-3 on 64 GPUs
#: would make 23.8 M, on 1,024 GPUs hundreds of millions
SEARCH_MAX_TASKS = 8_000_000


#: the whole-strategy prices :func:`price` remembers (most recent last): canonical strategy key
#: (:func:`engine.search.keys.strategy_key`) and cap -> (weak references to the graph, cluster and
#: cost model it was priced for, the Price or the refusal's message)
_PRICED: "OrderedDict[tuple, tuple]" = OrderedDict()
#: how many :data:`_PRICED` keeps
PRICE_MEMO_SIZE = 256
_PRICED_LOCK = threading.Lock()


def price(graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel | None = None,
          timeline=None, max_tasks: int | None = SEARCH_MAX_TASKS, cancel: Any = None) -> Price:
    """Simulate ``strategy`` (or take ``timeline``, its simulation already made, e.g. by a
    delta simulator) and check every device's memory.

    A strategy priced whole is remembered (the last :data:`PRICE_MEMO_SIZE`, by content, for the
    same graph, cluster and cost model objects), refusals included: ``auto`` prices the
    baselines and then MCMC starts from them, and at LLM scale one pricing takes seconds
    (FlexFlow's expert strategy of GPT-3 175B on 512 GPUs: 7.8 s to be refused).

    ``cancel`` (:func:`engine.errors.check_cancel`: an event or a callable) is asked between the
    build's segments and the event loop's chunks: a search's deadline bounds a pricing that
    would run past it (a plan just under the cap, without symmetry, takes a minute here).

    Raises
    ------
    TooLargeError
        When its simulation would have more than ``max_tasks`` tasks (with the symmetry
        reduction where exact: :func:`engine.sim.report.simulate_strategy`): refused before building.
    Cancelled
        When ``cancel`` was set first (nothing is remembered then).
    """
    from ..sim.memory import fits_in_memory  # (the simulator's modules load only when a search prices)
    from ..sim.report import simulate_strategy
    from .keys import strategy_key

    if timeline is not None:
        return Price(timeline.makespan_s, fits_in_memory(graph, strategy, cluster, timeline))
    key = (strategy_key(strategy), max_tasks)
    with _PRICED_LOCK:
        hit = _PRICED.get(key)
        if hit is not None:
            _PRICED.move_to_end(key)
    if hit is not None and hit[0]() is graph and hit[1]() is cluster and \
            (hit[2] is None if cost is None else hit[2] is not None and hit[2]() is cost):
        if isinstance(hit[3], str):
            raise TooLargeError(hit[3])
        return hit[3]
    try:  # the engine's one entry point (memory answered from the bound first)
        r = simulate_strategy(graph, strategy, cluster, cost, check=False, max_tasks=max_tasks, account_memory=False,
                              cancel=cancel)
        out: Price | str = Price(r.iteration_time_s, r.feasible)
    except TooLargeError as e:
        out = str(e)
    with _PRICED_LOCK:
        _PRICED[key] = (weakref.ref(graph), weakref.ref(cluster), None if cost is None else weakref.ref(cost), out)
        while len(_PRICED) > PRICE_MEMO_SIZE:
            _PRICED.popitem(last=False)
    if isinstance(out, str):
        raise TooLargeError(out)
    return out


def whole_cost(graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel | None, check_memory: bool,
               deadline: float | None = None) -> float | None:
    """:func:`price`'s cost of a strategy a search's global move made (its time alone without
    ``check_memory``): None when the loader's check refuses it, it is too large to simulate (no
    symmetry and more than SEARCH_MAX_TASKS tasks), or its pricing is still running at
    ``deadline`` (a :func:`time.perf_counter` time: abandoned there, within a segment's or a
    loop chunk's work, so a time budget holds)."""
    if validate_strategy(strategy, graph, cluster):
        return None
    stop = None if deadline is None else (lambda: time.perf_counter() >= deadline)
    try:
        p = price(graph, strategy, cluster, cost, cancel=stop)
    except (TooLargeError, Cancelled):
        return None
    return p.cost_s if check_memory else p.time_s


def price_baselines(graph: OpGraph, cluster: Cluster, cost: CostModel | None = None,
                    names: tuple[str, ...] = ("data-parallel", "expert"),
                    known: dict[str, Price] | None = None) -> tuple[dict[str, float], list[str]]:
    """The baselines' costs (:attr:`Price.cost_s`: inf when one does not fit) and notes on
    those that cannot be built for this model and cluster (left out of the costs).
    ``known``: prices a search already has (its starting points)."""
    from .baselines import make_baseline

    costs: dict[str, float] = {}
    notes: list[str] = []
    for name in names:
        if known and name in known:
            p = known[name]
        else:
            try:
                p = price(graph, make_baseline(name, graph, cluster), cluster, cost)
            except TooLargeError as e:
                notes.append(f"baseline {name} {e}: no speedup over it is reported")
                continue
            except ValueError as e:
                notes.append(f"baseline {name} cannot run here: {e}")
                continue
        costs[name] = p.cost_s
        if not p.feasible:
            notes.append(f"baseline {name} does not fit in memory: no speedup over it is reported")
    return costs, notes


def stamp(strategy: Strategy, graph: OpGraph, cluster: Cluster, found_by: dict[str, Any], p: Price) -> Strategy:
    """``strategy`` labelled with the search that found it, its price (with
    ``fits_in_memory: false`` when it does not fit), and the model and cluster it is for."""
    cost = {"iteration_time_s": p.time_s} if p.feasible else {"iteration_time_s": p.time_s, "fits_in_memory": False}
    return replace(strategy, found_by=found_by, cost=cost,
                   model_name=graph.name, model_fingerprint=graph.fingerprint, cluster_name=cluster.name,
                   cluster_devices=cluster.num_devices)


@dataclass
class SearchResult:
    """A search's answer. ``best_cost_s`` is :attr:`Price.cost_s` of ``best`` (inf when even
    the best found does not fit); ``best_time_s`` its simulated time, fitting or not;
    ``baselines`` the baselines' costs priced the same way; ``notes`` what the user should
    know (a baseline that does not fit, an option that did not apply)."""

    best: Strategy
    best_cost_s: float
    baselines: dict[str, float]
    iterations: int
    elapsed_s: float
    trace: list[Progress] = field(default_factory=list)
    cancelled: bool = False
    locally_optimal: bool = False  # the final polish finished: no single-op change improves ``best``
    algorithm: str = "mcmc"
    best_time_s: float | None = None
    notes: list[str] = field(default_factory=list)
    #: the baseline returned as ``best`` because the search's own plan was slower (a note says so)
    baseline_returned: str | None = None

    def __post_init__(self) -> None:
        if self.best_time_s is None:
            self.best_time_s = self.best_cost_s

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.best_cost_s)

    @property
    def speedup_vs_data_parallel(self) -> float | None:
        """Data parallel's cost over the best's, both priced alike; None unless both fit."""
        dp = self.baselines.get("data-parallel")
        if dp is None or not math.isfinite(dp) or not self.feasible or self.best_cost_s <= 0:
            return None
        return dp / self.best_cost_s


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class MCMCOptions:
    chains: int = 4  # starting points: data parallel, expert, then random strategies
    beta: float | None = None  # Metropolis-Hastings inverse temperature (1/s); default 100 / cost(start)
    check_memory: bool = True  # reject strategies over any device's memory
    polish: bool = True  # finish with a greedy pass over every move kind (single-op changes, then global ones)
    # share of the search spent on global moves (settings, a block's degrees, layouts,
    # engine.search.moves): of the proposals with a proposal budget, of the time with a time
    # budget; None: 0.5 on models with numbered layers (LLMs), 0.1 otherwise; 0 turns them off
    global_share: float | None = None
    # Where the chains run (engine.search.parallel_chains): None, this process one chain after another
    # with successive halving (the classic search); serial (or local), pool or ray: every chain
    # as a task per round of ``round_proposals`` proposals, sharing a cache of priced strategies
    # and the best so far between rounds; the same answer on each for an iteration budget
    backend: str | None = None
    workers: int | None = None  # pool processes or Ray's local CPUs; default every core
    address: str | None = None  # a Ray cluster (ray://host:10001 or auto); default Ray's local mode
    round_proposals: int | None = None  # a chain's proposals a round; default about an eighth of its share
    share_cache: bool = True  # look strategies up in the priced-strategy cache before simulating them
    adopt_gap: float = 0.05  # after a round, a chain more than this fraction slower than the best takes the best


@dataclass(frozen=True)
class AutoOptions:
    seeds: bool = True  # run the fast searches that apply (PaSE, differentiable, pipeline) first
    refine: bool = True  # then the polish (coordinate descent) and MCMC from the best feasible seed or baseline
    seed_share: float = 0.5  # of a time budget, the most the seeds use together
    chains: int = 4  # MCMC's starting points
    # the mixture-of-experts Megatron seeds' GEMMs in fp8 (Transformer Engine); None: where every
    # GPU has fp8 tensor cores, as the published MoE recipes train (DeepSeek-V3 §3.3)
    fp8: bool | None = None
    backend: str | None = None  # MCMC's chains (and, with a proposal budget, the seeds) on serial, pool or ray
    workers: int | None = None  # pool processes or Ray's local CPUs; default every core
    address: str | None = None  # a Ray cluster; default Ray's local mode
    # constraints (engine.search.layouts): any of them set, auto searches framework layouts only
    exportable: str = ""  # megatron, deepspeed or torchtitan
    headroom: float = 0.0  # fraction of each GPU's memory left free
    tp: int = 0
    pp: int = 0
    ep: int = 0
    max_tp: int = 0
    max_pp: int = 0


@dataclass(frozen=True)
class LayoutOptions:
    """Constraints of the layout search (:mod:`engine.search.layouts`); 0 or "": none."""

    exportable: str = ""  # megatron, deepspeed or torchtitan: only layouts that exporter takes
    fp8: bool = False  # also fp8 GEMMs where every GPU has them (default: the model's own precision)
    headroom: float = 0.0  # fraction of each GPU's memory the plan must leave free
    tp: int = 0  # a fixed tensor-parallel degree
    pp: int = 0  # a fixed number of pipeline stages
    ep: int = 0  # a fixed expert-parallel degree
    max_tp: int = 0
    max_pp: int = 0


#: the AutoOptions fields that constrain a search to framework layouts (auto then runs the
#: layout search: per-op moves would leave the framework's shape)
CONSTRAINTS = ("exportable", "headroom", "tp", "pp", "ep", "max_tp", "max_pp")


@dataclass(frozen=True)
class PaseOptions:
    min_part: int = 1  # smallest partition of any dim (elements)
    max_table_bytes: int = 2 * 1024**3  # largest DP table an instance may need before it is refused
    max_seconds: float = 600.0  # refuse before starting when the estimate is longer (or than a time budget)


@dataclass(frozen=True)
class DifferentiableOptions:
    steps: int = 400  # gradient steps when the budget is not a time (a number budget overrides)


@dataclass(frozen=True)
class PipelineOptions:
    hardware_aware: bool = True  # plan stages on each mesh's own device type and links
    simulate_top: int = 4  # how many of the analytic model's best plans are simulated


def parse_options(cls: type, pairs: list[str] | None) -> Any:
    """``cls`` from ``["name=value", ...]`` (values converted to the field's type).

    >>> parse_options(PipelineOptions, ["simulate_top=8"])
    PipelineOptions(hardware_aware=True, simulate_top=8)
    """
    known = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for pair in pairs or []:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ValueError(f"option {pair[:60]!r}: expected NAME=VALUE with NAME one of {', '.join(known)}")
        kind = str(known[name].type)
        text = text.strip()
        shown = f"option {name}={text[:40]!r}"
        if text.lower() in ("none", "null") and "None" in kind:
            values[name] = None
        elif kind.startswith("bool"):
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"{shown}: expected true or false ({kind})")
            values[name] = text.lower() in ("true", "1", "yes")
        elif kind.startswith("int"):
            if not re.fullmatch(r"[+-]?[0-9]{1,18}", text):
                raise ValueError(f"{shown}: expected a whole number ({kind})")
            values[name] = int(text)
        elif kind.startswith("float"):
            if not re.fullmatch(r"[+-]?([0-9]{1,30}\.?[0-9]{0,30}|\.[0-9]{1,30})([eE][+-]?[0-9]{1,3})?", text) \
                    or not math.isfinite(float(text)):
                raise ValueError(f"{shown}: not a finite number (write one such as 0.5 or 1e-3; {kind})")
            values[name] = float(text)
        else:
            values[name] = text
    return cls(**values)
