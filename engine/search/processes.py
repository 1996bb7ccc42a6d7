"""Where a search's (or a sweep's) tasks run: one process, a local process pool, or Ray.

:class:`Backend` is the one copy of the pool and Ray plumbing that ``soapbox sweep``
(:func:`engine.studies.sweep.run_sweep`) and the parallel MCMC chains
(:mod:`engine.search.parallel_chains`) share. A backend ships one *context* (e.g. the graph, the
cluster and the cost model) to each worker once, then runs ``fn(context, item)`` for each
item; :meth:`Backend.map` returns the results in the items' order whatever order they finish
in, so a caller that merges them in that order gets the same answer on every backend.

Names, as ``soapbox sweep --backend`` spells them: ``serial`` (this process; ``local`` is the
same), ``pool`` (a local process pool, forked where the platform forks) and ``ray`` (Ray's
local mode on this machine, or a cluster given its ``address``: ``ray://host:10001`` or
``auto``).

The context travels pickled with cloudpickle (Ray's own, or the ``cloudpickle`` package):
soapbox's graphs and strategies hold read-only mapping proxies, which the standard pickle
refuses. Items and results go through the standard pickle (pool) or Ray's serialiser: keep
them plain (dicts, tuples, numbers, strategies as :meth:`engine.strategy.Strategy.to_dict`).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
from typing import Any, Callable, Sequence

__all__ = ["die_with_parent", "Backend", "BACKENDS", "check_backend"]

#: backend names, as ``soapbox sweep`` takes them (``local`` is read as ``serial``)
BACKENDS = ("serial", "pool", "ray")


def die_with_parent() -> None:
    """Ask the kernel to kill this process when its parent dies (Linux: PR_SET_PDEATHSIG; a
    fork does not inherit it, so every child asks for itself). Elsewhere nothing happens: the
    caller checks its parent instead."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
        except OSError:
            pass


def check_backend(name: Any) -> str:
    """The backend's canonical name (``local`` -> ``serial``).

    >>> check_backend("local"), check_backend("pool")
    ('serial', 'pool')

    Raises
    ------
    ValueError
        One line naming the bad value and the valid ones.
    """
    text = str(name).strip().lower()
    if text == "local":
        return "serial"
    if text not in BACKENDS:
        shown = repr(str(name)[:40])
        raise ValueError(f"backend {shown}: expected serial (or local: this process), pool (a local process pool) "
                         "or ray (Ray: local mode, or a cluster with an address)")
    return text


def _dumps(obj: Any) -> bytes:
    try:
        from ray import cloudpickle
    except ImportError:
        import cloudpickle  # (a dependency of dask and Ray; the pool needs it only for its context)
    return cloudpickle.dumps(obj)


#: a pool worker's context, set once by its initializer (one pool per worker process)
_CONTEXT: list[Any] = [None]


def _init_worker(blob: bytes) -> None:
    # a forked worker inherits its parent's handlers (the CLI's SIGTERM raises): the parent
    # handles Ctrl-C and stops its workers, which end quietly on SIGTERM
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent()
    _CONTEXT[0] = pickle.loads(blob)


def _pool_call(fn: Callable[[Any, Any], Any], item: Any) -> Any:
    return fn(_CONTEXT[0], item)


class _RayWorker:
    """One Ray actor: a process that keeps its state between the tasks pinned to it."""

    def __init__(self, context: Any) -> None:
        self.context = context

    def call(self, fn: Callable[[Any, Any], Any], item: Any) -> Any:
        return fn(self.context, item)


class Backend:
    """A context manager that runs ``fn(context, item)`` for items on ``name``'s workers.

    Parameters
    ----------
    name : str
        ``serial`` (or ``local``), ``pool`` or ``ray`` (:func:`check_backend`).
    context : object
        Shipped once to each worker (cloudpickled), passed as ``fn``'s first argument.
    workers : int, optional
        Processes (pool) or CPUs of Ray's local mode; default: every core. ``pool`` with one
        worker runs in this process, as ``serial``.
    address : str, optional
        A Ray cluster to join (``ray``); without it Ray starts in local mode.
    fork : bool
        Pool workers are forked where the platform forks (cheap); False spawns them (a caller
        that has started torch's thread pools, which a fork does not carry safely).

    Examples
    --------
    >>> with Backend("serial", context=10) as b:
    ...     b.map(pow, [1, 2, 3])
    [10, 100, 1000]
    """

    def __init__(self, name: str, context: Any = None, workers: int | None = None, address: str | None = None,
                 fork: bool = True):
        self.name = check_backend(name)
        self.fork = fork and hasattr(os, "fork")
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.address = address
        self.context = context
        self._pool = None
        self._ray = None
        self._ray_started = False
        self._ref = None
        self._remotes: dict[Any, Any] = {}
        self._pinned: list[Any] = []
        self._blob: bytes | None = None
        self._entered = False

    @property
    def parallel(self) -> bool:
        """Whether items run in other processes."""
        return not (self.name == "serial" or (self.name == "pool" and self.workers == 1))

    def _executor(self, workers: int):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        if self._blob is None:
            self._blob = _dumps(self.context)
        ctx = multiprocessing.get_context("fork" if self.fork else "spawn")
        return ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                   initargs=(self._blob,))

    def _pinned_workers(self) -> list[Any]:
        """One process per worker (a pool executor of one, or a Ray actor), made when first
        needed: items pinned to a worker find the state its earlier items left there."""
        if not self._pinned:
            if self._ray is not None:
                actor = self._ray.remote(_RayWorker)
                self._pinned = [actor.remote(self._ref) for _ in range(self.workers)]
            else:
                self._pinned = [self._executor(1) for _ in range(self.workers)]
        return self._pinned

    def __enter__(self) -> "Backend":
        if self.name == "ray":
            try:
                import ray
            except ImportError:
                raise ValueError("--backend ray needs Ray: pip install ray") from None
            self._ray = ray
            self._ray_started = not ray.is_initialized()
            if self._ray_started:
                ray.init(address=self.address, num_cpus=None if self.address else self.workers,
                         include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
            self._ref = ray.put(self.context)
        self._entered = True
        return self

    def __exit__(self, *exc: Any) -> None:
        failed = exc[0] is not None  # (Ctrl-C, SIGTERM, an error: do not wait for the running tasks)
        for ex in ([self._pool] if self._pool is not None else []) + (self._pinned if self._ray is None else []):
            if failed:  # the executor's processes (a private attribute of concurrent.futures), stopped now
                for proc in list((getattr(ex, "_processes", None) or {}).values()):
                    proc.terminate()
            ex.shutdown(wait=not failed, cancel_futures=True)
        self._pool, self._pinned, self._entered = None, [], False
        if self._ray is not None and self._ray_started:
            self._ray.shutdown()
        self._ray = None

    def map(self, fn: Callable[[Any, Any], Any], items: Sequence[Any],
            done: Callable[[int, Any], None] | None = None, pin: Sequence[int] | None = None) -> list[Any]:
        """``[fn(context, item) for item in items]``, run on the workers; ``done(k, result)``
        is called as each item finishes (in the order they finish). ``fn`` must be a
        module-level function (it is pickled by name). ``pin``: a number per item; items with
        the same number run in the same worker process (number modulo the workers), one after
        another, so that what an item leaves in its process (a chain's delta simulator) is there
        for the next item with that number; without it, items go to whichever worker is free."""
        if not self._entered:
            raise RuntimeError("Backend.map outside its with-block")
        out: list[Any] = [None] * len(items)

        def tick(k: int, result: Any) -> None:
            out[k] = result
            if done is not None:
                done(k, result)

        if not self.parallel:
            for k, item in enumerate(items):
                tick(k, fn(self.context, item))
        elif self._ray is None:
            from concurrent.futures import as_completed

            if pin is not None:
                workers = self._pinned_workers()
                futs = {workers[pin[k] % self.workers].submit(_pool_call, fn, item): k for k, item in enumerate(items)}
            else:
                if self._pool is None:
                    self._pool = self._executor(self.workers)
                futs = {self._pool.submit(_pool_call, fn, item): k for k, item in enumerate(items)}
            for f in as_completed(futs):
                tick(futs[f], f.result())
        else:
            if pin is not None:
                actors = self._pinned_workers()
                refs = {actors[pin[k] % self.workers].call.remote(fn, item): k for k, item in enumerate(items)}
            else:
                remote = self._remotes.get(fn)
                if remote is None:
                    remote = self._remotes[fn] = self._ray.remote(fn)
                refs = {remote.remote(self._ref, item): k for k, item in enumerate(items)}
            pending = list(refs)
            while pending:
                ready, pending = self._ray.wait(pending, num_returns=1)
                for r in ready:
                    tick(refs[r], self._ray.get(r))
        return out
