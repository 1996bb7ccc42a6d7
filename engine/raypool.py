"""Ray, started or connected for the length of a job: the one place soapbox calls ``ray.init``.

``soapbox sweep --backend ray`` (:func:`engine.sweep.run_sweep`, whose inline start/connect
code this is, factored out) and ``soapbox init-sweep --backend ray``
(:func:`engine.init_sweep.run_experiment`) run on a Ray cluster given its address, or on a
local one started here (Ray's "local" single-machine cluster: one raylet, ``workers`` CPUs).
A Ray already initialised by the caller is used as it is and left running.

Ray is an optional dependency (``pip install soapbox[ray]``); without it the job fails with one
line saying so.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

__all__ = ["ray_session", "ray_map"]


@contextmanager
def ray_session(address: str | None = None, workers: int | None = None) -> Iterator[Any]:
    """The ``ray`` module, initialised: connected to ``address`` (``"auto"``, ``"ray://host:10001"``,
    ...) or, without one, a local Ray of ``workers`` CPUs (None: all). Shuts down only a Ray it
    started.

    Raises ``ValueError`` ("--backend ray needs Ray") when Ray is not installed.
    """
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs Ray: pip install ray") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, num_cpus=None if address else workers, include_dashboard=False,
                 log_to_driver=False, ignore_reinit_error=True)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def ray_map(ray: Any, fn: Callable[[Any], Any]) -> Callable[[Sequence[Any]], list[Any]]:
    """A function that runs ``fn`` on each task as a Ray task and returns the results in the
    tasks' order (``fn`` must be importable by the workers: a module-level function)."""
    remote = ray.remote(fn)
    return lambda tasks: ray.get([remote.remote(t) for t in tasks])
