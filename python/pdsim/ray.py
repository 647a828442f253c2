"""Sweeps on Ray: :class:`RayExecutor`, a ``concurrent.futures.Executor``
whose tasks are Ray tasks.

Ray is an optional dependency (``pip install '.[ray]'``)::

    import ray, pdsim
    from pdsim.ray import RayExecutor

    ray.init()                      # a local instance; or ray.init(address="auto") on a cluster
    df = pdsim.sweep("scenarios/sweeps/glm-decode-bandwidth.toml", executor=RayExecutor())

On a cluster every worker needs the pdsim package (the same version as
the driver), installed on its nodes or through a runtime environment, and
the trace files of a trace workload at the paths the driver names. Each
point is one Ray task of one CPU (``num_cpus``, and any other option of
``ray.remote``, can be given to :class:`RayExecutor`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

__all__ = ["RayExecutor"]


class RayExecutor(Executor):
    """Runs each submitted call as a Ray task and hands back a
    ``concurrent.futures.Future`` of its result.

    ``options`` go to ``ray.remote`` (``num_cpus=1`` unless given). Ray
    must be initialised (``ray.init``) before the first call, or Ray starts
    a local instance itself.
    """

    def __init__(self, **options: Any) -> None:
        import ray

        self._ray = ray
        self._options = {"num_cpus": 1, **options}
        self._remote: dict[Callable[..., Any], Any] = {}
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:  # type: ignore[override]
        """Runs ``fn(*args, **kwargs)`` as a Ray task."""
        if self._shutdown:
            raise RuntimeError("cannot submit to a RayExecutor that was shut down")
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._ray.remote(**self._options)(fn)
            self._remote[fn] = remote
        return remote.remote(*args, **kwargs).future()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuses further tasks (Ray itself stays up: ``ray.shutdown``)."""
        self._shutdown = True
