"""One local Dask cluster for a flow run's stages: inside :func:`shared_clusters`, the local cluster a stage asks for
stays up for the next stage that asks for as many workers. Why: each local cluster costs its worker processes' start
(spawn, imports) and stop, and the tokenizer and shards stages run one after the other on the same workers. A run
may start it ahead of the first stage that asks (:func:`start_ahead`, from :mod:`tasks.core.ahead`); that stage then
gets it, or the error its start ended with. Outside the context each stage starts and closes its own.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import Any


class _Shared:
    """The clusters of one flow run, by worker count, each as a future (started in a thread of its own, closed in
    the background)."""

    def __init__(self, start: Callable[[int], Any], stop: Callable[[Any], None]) -> None:
        self.start, self.stop = start, stop
        self.lock = threading.Lock()
        self.clusters: dict[int, concurrent.futures.Future] = {}
        self.ahead: set[int] = set()  # worker counts started ahead that no stage has asked for yet
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dask-cluster")

    def future(self, n: int, ahead: bool = False) -> concurrent.futures.Future:
        """The cluster of ``n`` workers: the one started, unless it failed or stopped; else a new one. The first
        stage to ask for one started ``ahead`` gets it as it is, a failed start too (its error is that stage's)."""
        with self.lock:
            f = self.clusters.get(n)
            if ahead and f is not None:
                return f
            if not ahead and n in self.ahead:
                self.ahead.discard(n)
                if f is not None:
                    return f
            if f is None or (f.done() and (f.exception() is not None or not _running(f.result()))):
                if f is not None:
                    self._stop(f)
                f = self.clusters[n] = self.pool.submit(self.start, n)
                if ahead:
                    self.ahead.add(n)
            return f

    def release(self) -> list[concurrent.futures.Future]:
        """Close every cluster, in the background (a stage after this one need not wait for their stop); the
        futures of their stops."""
        with self.lock:
            started, self.clusters = list(self.clusters.values()), {}
            self.ahead.clear()
        return [self.pool.submit(self._stop, f) for f in started]

    def _stop(self, f: concurrent.futures.Future) -> None:
        if f.exception() is None:
            with contextlib.suppress(Exception):
                self.stop(f.result())


def _running(cluster: Any) -> bool:
    return getattr(getattr(cluster, "status", None), "name", "") == "running"


#: The run's clusters where this context is inside :func:`shared_clusters` (a context variable: two flow runs in one
#: process, each in its thread, share nothing).
_current: contextvars.ContextVar[_Shared | None] = contextvars.ContextVar("dask_shared", default=None)


@contextlib.contextmanager
def shared_clusters(start: Callable[[int], Any], stop: Callable[[Any], None]) -> Iterator[Callable[[], object]]:
    """Within: :func:`local_cluster` hands out one cluster per worker count, started by ``start(n)`` once and
    stopped by ``stop(cluster)``; yields
    ``release``, which closes them in the background (a run calls it after its last stage that uses Dask: their
    worker processes hold memory the later stages need); on exit they are closed, and waited for."""
    shared = _Shared(start, stop)
    token = _current.set(shared)
    try:
        yield shared.release
    finally:
        _current.reset(token)
        shared.release()
        shared.pool.shutdown(wait=True)


def start_ahead(n: int) -> concurrent.futures.Future | None:
    """Start the run's cluster of ``n`` workers now, in the background, for the first stage that asks for it
    (:func:`local_cluster`); None outside :func:`shared_clusters` (nothing to keep it for)."""
    shared = _current.get()
    return None if shared is None else shared.future(n, ahead=True)


def release_now() -> list[concurrent.futures.Future]:
    """Close the run's clusters now, in the background: the futures of their stops (none outside
    :func:`shared_clusters`)."""
    shared = _current.get()
    return [] if shared is None else shared.release()


def sharing() -> bool:
    """Whether this context is inside :func:`shared_clusters`."""
    return _current.get() is not None


@contextlib.contextmanager
def local_cluster(n: int, start: Callable[[int], Any]) -> Iterator[Any]:
    """A local cluster of ``n`` workers: the run's shared one (left up on exit), or outside :func:`shared_clusters`
    one of its own from ``start(n)``, closed on exit."""
    shared = _current.get()
    if shared is None:
        with start(n) as cluster:
            yield cluster
        return
    yield shared.future(n).result()
