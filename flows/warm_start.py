"""Flow runs of the served deployment that start warm: forked from a fork server that has already imported Prefect
and the pipeline, instead of a fresh interpreter importing them again (docs/SERVING.md, "Warm starts")."""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.popen_forkserver
import os
import signal
import sys
import sysconfig
import time
from collections.abc import Callable
from typing import Any

#: What the fork server imports once: this module (what the server and its runs need of it), the flow, and through
#: it Prefect, its engine, the stages' tasks and the reports. torch is left out: a cached rerun never imports it,
#: and a building run pays for its import once.
PRELOAD = ("flows.warm_start", "prefect.flow_engine", "flows.wiki_pipeline")

#: The project's packages (pyproject.toml's ``[tool.setuptools] packages``): their modules are the project's code
#: even when installed into site-packages.
PROJECT_PACKAGES = ("mygpt", "tasks", "flows")

_CHANGED = "warm start: the project's code changed since the fork server started"
_RUNNER_ENV = "_WIKI_PIPELINE_FORK_SERVER_OF"  # set only while the runner starts a fork server: the runner's pid


def project_sources() -> dict[str, tuple[int, int]]:
    """{path: (mtime in ns, size)} of the project's loaded code, which a spawned run would import afresh."""
    installed = tuple(
        os.path.join(sysconfig.get_paths()[key], "")
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if key in sysconfig.get_paths()
    )
    found: dict[str, tuple[int, int]] = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not path or (path.startswith(installed) and name.partition(".")[0] not in PROJECT_PACKAGES):
            continue
        try:
            st = os.stat(path)
        except OSError:
            found[path] = (-1, -1)  # gone: changed
        else:
            found[path] = (st.st_mtime_ns, st.st_size)
    return found


def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie has ended)."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
        except FileNotFoundError:
            return False
    try:  # pragma: no cover - no /proc
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # pragma: no cover
        return False
    return True  # pragma: no cover


def _server() -> Any:
    """This process's ``multiprocessing.forkserver.ForkServer`` (its pid, socket and pipe are private fields)."""
    return multiprocessing.forkserver._forkserver


# ---- in each run: the process type, its handle in the runner ----------------------------------------------
class _Popen(multiprocessing.popen_forkserver.Popen):
    """The runner's handle on a forked run: the fork server reports how the run ended; if the server dies first,
    the run is followed by its pid instead (its exit code is then unknown: 255)."""

    _server_gone = False

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        if self.returncode is None and not self._server_gone:
            if not multiprocessing.connection.wait([self.sentinel], 0 if flag == os.WNOHANG else None):
                return None
            try:
                self.returncode = multiprocessing.forkserver.read_signed(self.sentinel)
            except (OSError, EOFError):
                self._server_gone = True
                print(
                    f"warm start: the fork server died while run process {self.pid} went on; following that process "
                    "by its pid (its exit code is lost: 255 when it ends)",
                    file=sys.stderr,
                    flush=True,
                )
        if self.returncode is None:
            while _running(self.pid):
                if flag == os.WNOHANG:
                    return None
                time.sleep(0.1)
            self.returncode = 255
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if self._server_gone:
                time.sleep(0.1 if left is None else min(0.1, left))
            else:
                multiprocessing.connection.wait([self.sentinel], left)
        return self.returncode


class WarmProcess(multiprocessing.context.ForkServerProcess):
    """A flow run's process forked from the fork server, which lets go of the server as it starts."""

    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:
        return _Popen(process_obj)

    def run(self) -> None:
        # The server lives while anyone holds its liveness pipe; every child gets a copy (to start processes of
        # its own through the same server, which a run never does). Without this, a run (or a process it leaves
        # behind) would keep the server after the runner is gone, and hold up a restart.
        server = _server()
        if server._forkserver_alive_fd is not None:
            with contextlib.suppress(OSError):
                os.close(server._forkserver_alive_fd)
            server._forkserver_alive_fd = None
        super().run()


class _WarmContext(multiprocessing.context.ForkServerContext):
    Process = WarmProcess


class _ForkserverMultiprocessing:
    """``prefect.flow_engine``'s view of ``multiprocessing`` while one run starts: everything as it is, except
    that any context asked for is the fork server's."""

    def __init__(self, context: multiprocessing.context.BaseContext) -> None:
        self._context = context

    def get_context(self, method: str | None = None) -> multiprocessing.context.BaseContext:
        return self._context

    def __getattr__(self, name: str) -> Any:
        return getattr(multiprocessing, name)


# ---- in the fork server ------------------------------------------------------------------------------------
def _remove_socket_if_runner_died(runner: int) -> None:
    """At the fork server's exit: remove its socket and temp dir when its runner was killed and could not."""
    deadline = time.monotonic() + 0.5
    while os.getppid() == runner:
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    address = _server()._forkserver_address
    if isinstance(address, str) and address.startswith(os.sep):
        with contextlib.suppress(OSError):
            os.unlink(address)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(address))  # only when nothing else is in it


_runner = os.environ.pop(_RUNNER_ENV, None)  # set: this is the fork server a runner just started (preloading this)
if _runner and _runner.isdigit():
    atexit.register(_remove_socket_if_runner_died, int(_runner))


# ---- in the runner -----------------------------------------------------------------------------------------
class _WarmStarts:
    """Prefect's ``run_flow_in_subprocess`` with the run forked from this runner's fork server (see the module's
    text); also what the fork server started with, to tell when it must restart."""

    warm = True  # marks the installed hook

    def __init__(self, stock: Callable[..., Any], preload: tuple[str, ...]) -> None:
        self.stock = stock
        context = _WarmContext()
        context.set_forkserver_preload(list(preload))
        self.multiprocessing = _ForkserverMultiprocessing(context)
        self.pids: list[int] = []  # the current server's runs
        self.server_pid: int | None = None
        self.start_server()

    def start_server(self) -> None:
        server = _server()
        os.environ[_RUNNER_ENV] = str(os.getpid())
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            os.environ.pop(_RUNNER_ENV, None)
        self.server_pid, self.address = server._forkserver_pid, server._forkserver_address
        self.env, self.sources = set(os.environ), project_sources()  # what it starts with, and its code
        self.pids = []

    def stop_server(self) -> None:
        """Stop the fork server without waiting on anything that may hold its pipe (none of its runs goes on)."""
        server = _server()
        if server._forkserver_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server._forkserver_pid, signal.SIGKILL)
            with contextlib.suppress(FileNotFoundError):
                server._stop()  # reaps it, removes its socket
        if isinstance(self.address, str) and self.address.startswith(os.sep):  # one that died and was replaced
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address)

    def __call__(self, *args: Any, env: dict[str, str | None] | None = None, **kwargs: Any) -> Any:
        if self.server_pid is None or not _running(self.server_pid):
            print(f"warm start: the fork server (pid {self.server_pid}) is gone; starting another", flush=True)
            self.stop_server()
            self.start_server()
        elif project_sources() != self.sources:
            self.pids = [pid for pid in self.pids if _running(pid)]
            if self.pids:  # its runs would lose their exit codes: this one starts the stock way
                print(_CHANGED + "; a run of it is still going, so this run is spawned", flush=True)
                return self.stock(*args, env=env, **kwargs)
            print(_CHANGED + ": restarting it (this run waits for its imports)", flush=True)
            self.stop_server()
            self.start_server()
        import prefect.flow_engine as engine

        dropped: dict[str, str | None] = {key: None for key in self.env - set(os.environ)}
        saved, process, failure = engine.multiprocessing, None, None
        engine.multiprocessing = self.multiprocessing  # type: ignore[assignment]
        try:
            process = self.stock(*args, env={**dropped, **(env or {})}, **kwargs)
        except (EOFError, OSError) as exc:  # the server died before it forked the run (or could not start)
            failure = exc
        finally:
            engine.multiprocessing = saved
        if process is None:
            print(
                f"warm start: the fork server could not start this run ({type(failure).__name__}: {failure}; "
                "the runner's log has the server's own error), so this run is spawned",
                flush=True,
            )
            return self.stock(*args, env=env, **kwargs)
        self.pids.append(process.pid)
        return process


def install(preload: tuple[str, ...] = PRELOAD) -> str:
    """Make this process's runner start flow runs from a fork server that imported ``preload`` (started now, in the
    background); return a line for the runner's log: what it did, or why runs start the stock way."""
    try:
        import prefect.flow_engine  # noqa: F401 - what the hook's function comes from
        import prefect.runner._starter_direct as starter
    except ImportError as exc:  # pragma: no cover - another Prefect
        return f"flow runs start cold (spawned): Prefect's runner hook is missing ({exc})"
    if "forkserver" not in multiprocessing.get_all_start_methods():  # pragma: no cover - not Linux/macOS
        return "flow runs start cold (spawned): this platform has no forkserver start method"
    if not getattr(starter.run_flow_in_subprocess, "warm", False):
        starter.run_flow_in_subprocess = _WarmStarts(starter.run_flow_in_subprocess, preload)
    return (
        "flow runs start warm: each run's process forks from one that imported Prefect and the flow once "
        f"(forkserver, preloading {', '.join(preload)})"
    )
