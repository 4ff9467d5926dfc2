"""Slow things started ahead of the stage that needs them: the run's local Dask cluster and torch's import.

Within :func:`planned` (a flow run, with the stages it will run in order), a stage that decides to build
(:func:`building`, called by the stage runner once the store has no version to reuse) has what it and the later
stages built from it declare they need (``Stage.ahead``: ``"dask"``, ``"torch"``) started in the background. Why a
stage that builds: it gives its output a new build id, so every stage built from it in this run builds too (its
version id names that build id); a run whose stages are all reused starts nothing, nor does ``only=`` (no plan).

When: ``"dask"`` (the run's shared local cluster, :mod:`tasks.core.dask_shared`; with ``run.dask_address``, nothing:
the stage connects) at once: the corpus stage, which builds first, leaves a core idle. ``"torch"`` (an import of torch
and the modules training imports on its first step, in a thread of this process; the model stage declares it when it
trains here, ``nproc=1``) once the last stage to build that needs Dask has built (:func:`built`): the run's cluster is
closed then and its worker processes waited for before the import begins. Why not at once: torch's modules in this
process while the workers encode the shards would raise the peak memory of the whole run by their size.

A failure in the background is the needing stage's to report: the cluster's start error is raised where the stage
asks for the cluster (as its own start's would be), torch's import error by :func:`ready` before the stage builds, or
by the stage's own import (which waits for the one under way); no other stage sees it. On exit an import under way is
waited for (a half-imported torch must not outlive the run); the cluster is closed as before.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import importlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tasks.core import dask_shared, dask_work

#: What the model stage's first step imports in this process: torch, and what AdamW's ``add_param_group`` imports.
TORCH_MODULES = ("torch", "torch._dynamo", "torch.optim")


@dataclass(frozen=True)
class Planned:
    """A stage the run will run: its name, its inputs (stage names) and what it needs started ahead."""

    name: str
    inputs: tuple[str, ...]
    needs: tuple[str, ...]


def plan(stages: Iterable[tuple[Any, Any]]) -> list[Planned]:
    """The run's plan from ``(stage, resolved settings)`` pairs in the order the run runs them: each ``Stage``'s
    ``ahead(settings)`` (none when it declares nothing)."""
    return [Planned(st.name, tuple(st.inputs), tuple(st.ahead(s)) if st.ahead else ()) for st, s in stages]


def import_torch() -> None:
    for name in TORCH_MODULES:
        importlib.import_module(name)


def _torch_after(stops: list[concurrent.futures.Future]) -> Callable[[], None]:
    """Torch's import, once the clusters being closed (``stops``) are closed: their workers' memory is given back."""

    def run() -> None:
        concurrent.futures.wait(stops)
        import_torch()

    return run


class _Run:
    """One flow run's starts: by need, the future of what was started."""

    def __init__(self, stages: list[Planned], starters: dict[str, Callable[[], concurrent.futures.Future | None]]):
        self.stages, self.starters = stages, starters
        self.needs = {stage.name: stage.needs for stage in stages}
        self.lock = threading.Lock()
        self.started: dict[str, concurrent.futures.Future | None] = {}
        self.to_build: set[str] = set()  # the stages this run will build and has not finished building
        self.ended: set[str] = set()

    def building(self, name: str) -> None:
        with self.lock:
            self.to_build |= ({name} | _built_from(self.stages, name)) - self.ended
            self._start()

    def built(self, name: str) -> None:
        with self.lock:
            self.to_build.discard(name)
            self.ended.add(name)
            self._start()

    def _start(self) -> None:
        """Start each need of a stage still to build, but torch only once no stage still to build needs Dask."""
        wanted = [need for stage in self.stages if stage.name in self.to_build for need in stage.needs]
        dask_left = "dask" in wanted
        for need in dict.fromkeys(wanted):
            if need not in self.started and not (need == "torch" and dask_left):
                self.started[need] = self.starters[need]()

    def ready(self, name: str) -> None:
        with self.lock:
            torch = self.started.get("torch") if "torch" in self.needs.get(name, ()) else None
        if torch is not None and torch.done() and torch.exception() is not None:
            raise torch.exception()  # type: ignore[misc]  # the background import's own error, the stage's to report

    def close(self) -> None:
        with self.lock:
            started = list(self.started.values())
        for f in started:
            if f is not None:
                concurrent.futures.wait([f])


def _built_from(stages: list[Planned], name: str) -> set[str]:
    """The stages of the plan built, directly or not, from ``name`` (``name`` excluded)."""
    down: set[str] = set()
    for stage in stages:  # in run order: a stage's inputs come before it
        if name in stage.inputs or down & set(stage.inputs):
            down.add(stage.name)
    return down


def _in_thread(fn: Callable[[], None], name: str) -> concurrent.futures.Future:
    """``fn()`` in a daemon thread of its own; its outcome as a future (never raised in the thread)."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # the needing stage raises it (ready)
            future.set_exception(e)
        else:
            future.set_result(None)

    future.set_running_or_notify_cancel()
    threading.Thread(target=run, name=name, daemon=True).start()
    return future


_current: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("ahead", default=None)


@contextlib.contextmanager
def planned(stages: list[Planned], run: Any) -> Iterator[None]:
    """Within: :func:`building` starts the later stages' needs; ``run`` (``RunOptions``) says where Dask runs and
    with how many local workers. On exit, a torch import under way is waited for."""
    starters: dict[str, Callable[[], concurrent.futures.Future | None]] = {
        "dask": lambda: None if run.dask_address else dask_shared.start_ahead(dask_work.local_workers(run)),
        "torch": lambda: _in_thread(_torch_after(dask_shared.release_now()), "import-torch"),
    }
    state = _Run(stages, starters)
    token = _current.set(state)
    try:
        yield
    finally:
        _current.reset(token)
        state.close()


def building(stage: str) -> None:
    """``stage`` builds (its version is not in the store): start what it and the stages built from it need. Outside
    :func:`planned`, nothing."""
    state = _current.get()
    if state is not None:
        state.building(stage)


def built(stage: str) -> None:
    """``stage``'s build has returned (its publication follows): start what waited for it. Outside :func:`planned`,
    nothing."""
    state = _current.get()
    if state is not None:
        state.built(stage)


def ready(stage: str) -> None:
    """Before ``stage`` builds: raise the error torch's import ended with if the stage needs it (an import under way
    is not waited for here: the stage's own import waits for it). Outside :func:`planned`, nothing."""
    state = _current.get()
    if state is not None:
        state.ready(stage)
