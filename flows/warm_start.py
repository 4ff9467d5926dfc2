"""Flow runs of the served deployment that start warm: each run's process is forked from a process that has
already imported Prefect and the pipeline, instead of being a fresh interpreter that imports them again (about
2.5 s on 2 cores: most of a cached rerun's time on the runner's side).

Prefect's runner starts a served flow's run with ``prefect.flow_engine.run_flow_in_subprocess``, which asks
``multiprocessing`` for a *spawn* process. :func:`install` keeps all of Prefect's code and changes one thing:
the process comes from Python's *forkserver*, whose server imported :data:`PRELOAD` once, when ``serve``
started. Prefect's code still pickles the call, sets the run's environment and settings in the child, joins it
and, on cancellation, kills it by pid. A forkserver child is forked from a single-threaded process that has only
imported modules (no thread, no connection, no event loop). So it starts as clean as a spawned one. Python 3.14
makes forkserver the default start method on Linux.

The child's environment is the runner's, as with spawn: Prefect sends the runner's environment with each run.
A variable the runner dropped after the fork server started (or restarted) is dropped in the child too.

The child's code is what is on disk, as with spawn: a spawned run imports the project's modules afresh, a forked
one has them from the fork server. So before each run the project's source files (every module this process
loaded from outside the standard library and site-packages) are compared with what they were when the fork
server started. When one changed, the fork server is restarted if no run of it is still going, and this run
waits for its imports; while one is going (``serve --limit`` above 1), this run is spawned the stock way.

The hook is the one Prefect names for this: ``prefect.runner._starter_direct`` "uses module-level
``run_flow_in_subprocess`` reference -- patch the module to override". Where the hook or the start method is
missing (another Prefect, another platform), runs start the stock way and ``install`` says why.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import sys
import sysconfig
from collections.abc import Callable
from typing import Any

#: What the fork server imports once: the flow, and through it Prefect, its engine, the stages' tasks and the
#: reports. torch is left out: a cached rerun never imports it, and a building run pays for its import once.
PRELOAD = ("prefect.flow_engine", "flows.wiki_pipeline")

_CHANGED = "warm start: the project's code changed since the fork server started"


def project_sources() -> dict[str, tuple[int, int]]:
    """{path: (mtime in ns, size)} of every module this process loaded from outside the standard library and
    site-packages: the project's code, which a spawned run would import afresh."""
    installed = tuple(
        os.path.join(sysconfig.get_paths()[key], "")
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if key in sysconfig.get_paths()
    )
    found: dict[str, tuple[int, int]] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or path.startswith(installed):
            continue
        try:
            st = os.stat(path)
        except OSError:
            found[path] = (-1, -1)  # gone: changed
        else:
            found[path] = (st.st_mtime_ns, st.st_size)
    return found


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # the fork server reaps its children, so an ended run's pid is gone
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a reused pid of another user's
        return False
    return True


class _ForkserverMultiprocessing:
    """``prefect.flow_engine``'s view of ``multiprocessing`` while one run starts: everything as it is, except
    that any context asked for is the fork server's."""

    def __init__(self, context: multiprocessing.context.BaseContext) -> None:
        self._context = context

    def get_context(self, method: str | None = None) -> multiprocessing.context.BaseContext:
        return self._context

    def __getattr__(self, name: str) -> Any:
        return getattr(multiprocessing, name)


def install(preload: tuple[str, ...] = PRELOAD) -> str:
    """Make this process's Prefect runner start flow runs from a fork server that has imported ``preload``,
    and start that server now (it imports in the background, so the first run starts warm too). Returns a line
    for the runner's log: what it did, or why runs start the stock way (spawn)."""
    try:
        import prefect.flow_engine as engine
        import prefect.runner._starter_direct as starter
    except ImportError as exc:  # pragma: no cover - another Prefect
        return f"flow runs start cold (spawned): Prefect's runner hook is missing ({exc})"
    if "forkserver" not in multiprocessing.get_all_start_methods():  # pragma: no cover - not Linux/macOS
        return "flow runs start cold (spawned): this platform has no forkserver start method"
    if not getattr(starter.run_flow_in_subprocess, "warm", False):
        stock: Callable[..., Any] = starter.run_flow_in_subprocess
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(preload))
        warm = _ForkserverMultiprocessing(context)
        forked_env = set(os.environ)  # what the fork server (and so every child) starts with
        forked_sources = project_sources()  # the code it imports
        forked_pids: list[int] = []  # its runs

        def run_flow_in_forkserver(*args: Any, env: dict[str, str | None] | None = None, **kwargs: Any) -> Any:
            nonlocal forked_sources, forked_env
            if project_sources() != forked_sources:
                forked_pids[:] = [pid for pid in forked_pids if _running(pid)]
                if forked_pids:  # its runs would lose their exit codes: this one starts the stock way
                    print(_CHANGED + "; a run of it is still going, so this run is spawned", flush=True)
                    return stock(*args, env=env, **kwargs)
                print(_CHANGED + ": restarting it (this run waits for its imports)", flush=True)
                multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]
                forked_env, forked_sources = set(os.environ), project_sources()  # what the new one starts with
                multiprocessing.forkserver.ensure_running()
            dropped: dict[str, str | None] = {key: None for key in forked_env - set(os.environ)}
            saved = engine.multiprocessing
            engine.multiprocessing = warm  # type: ignore[assignment]
            try:
                process = stock(*args, env={**dropped, **(env or {})}, **kwargs)
            finally:
                engine.multiprocessing = saved
            forked_pids.append(process.pid)
            return process

        run_flow_in_forkserver.warm = True  # type: ignore[attr-defined]
        starter.run_flow_in_subprocess = run_flow_in_forkserver
    multiprocessing.forkserver.ensure_running()
    return (
        "flow runs start warm: each run's process forks from one that imported Prefect and the flow once "
        f"(forkserver, preloading {', '.join(preload)})"
    )
