"""Slow things started ahead of the stage that needs them: the run's local Dask cluster and torch's import.

Within :func:`planned` (a flow run, with the stages it will run in order), the first stage that decides to build
(:func:`building`, called by the stage runner once the store has no version to reuse) starts in the background what
the later stages of the run declare they need (``Stage.ahead``: ``"dask"``, ``"torch"``), for each later stage built
from it. Why then and only then: a stage that builds gives its output a new build id, so every stage built from it
in this run builds too (its version id names that build id); a run whose stages are all reused starts nothing, and
the corpus stage, which builds first, leaves a core idle. Where to start it: ``"dask"``, the run's shared local
cluster (:mod:`tasks.core.dask_shared`; with ``run.dask_address``, nothing: the stage connects); ``"torch"``, an
import of torch and the modules training imports on its first step, in a thread of this process (with ``nproc=1``
training runs here; the stage declares it only then).

A failure in the background is the needing stage's to report, as if it had started the thing itself: the cluster's
start error is raised where the stage asks for the cluster, torch's import error by :func:`ready` before the stage
builds; no other stage sees it. On exit the torch import is waited for (a half-imported torch must not outlive the
run), and the cluster is closed by :func:`dask_shared.shared_clusters` as before.
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


class _Run:
    """One flow run's starts: by need, the future of what was started."""

    def __init__(self, stages: list[Planned], starters: dict[str, Callable[[], concurrent.futures.Future | None]]):
        self.stages, self.starters = stages, starters
        self.lock = threading.Lock()
        self.started: dict[str, concurrent.futures.Future | None] = {}

    def building(self, name: str) -> None:
        later = _built_from(self.stages, name)
        with self.lock:
            for stage in self.stages:
                if stage.name in later:
                    for need in stage.needs:
                        if need not in self.started:
                            self.started[need] = self.starters[need]()

    def ready(self, name: str) -> None:
        needs = next((s.needs for s in self.stages if s.name == name), ())
        with self.lock:
            waits = [self.started.get(need) for need in needs if need in _WAITED]
        for f in waits:
            if f is not None:
                f.result()  # the background start's own error, raised by the stage that needs it

    def close(self) -> None:
        with self.lock:
            started = list(self.started.values())
        for f in started:
            if f is not None:
                concurrent.futures.wait([f])


#: The needs whose background start :func:`ready` waits for before the stage builds (a cluster is waited for where the
#: stage asks for it).
_WAITED = ("torch",)


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
        "torch": lambda: _in_thread(import_torch, "import-torch"),
    }
    state = _Run(stages, starters)
    token = _current.set(state)
    try:
        yield
    finally:
        _current.reset(token)
        state.close()


def building(stage: str) -> None:
    """``stage`` builds (its version is not in the store): start what the stages built from it need. Outside
    :func:`planned`, nothing."""
    state = _current.get()
    if state is not None:
        state.building(stage)


def ready(stage: str) -> None:
    """Before ``stage`` builds: wait for the background starts it needs that it does not wait for itself (torch's
    import), and raise the error one ended with. Outside :func:`planned`, nothing."""
    state = _current.get()
    if state is not None:
        state.ready(stage)
