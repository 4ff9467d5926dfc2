"""A real Prefect server on 127.0.0.1 as a child process: its own PREFECT_HOME, a free port, SQLite, analytics off.

Used by the tests, the benchmarks and ``wiki-pipeline run`` when no ``PREFECT_API_URL`` is configured
(:func:`server_for_this_run`). The child never outlives the process that started it: on Linux it asks the
kernel for SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``), so even a SIGKILLed run leaves no
server behind; elsewhere :meth:`PrefectServer.stop` (on every normal exit) is what stops it.

Its first start on a fresh ``PREFECT_HOME`` creates the SQLite database and runs every migration: 33-35 s on
2 cores (longer under load), past the 20 s Prefect gives its own temporary server; :data:`START_TIMEOUT` allows
for that.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from mygpt._orphan_guard import die_with_parent

START_TIMEOUT = 240.0  # seconds: a first start's migrations, on a busy machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrefectServer:
    def __init__(self, home: Path, ui: bool = False) -> None:
        """``ui``: also serve the Prefect UI (off by default: the API is all the product and its tests need; a
        test that looks at the UI the way a user does turns it on)."""
        self.home = Path(home)
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.env = {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_API_URL": self.api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "true" if ui else "false",
            "PREFECT_LOGGING_LEVEL": "INFO",
        }
        self.proc: subprocess.Popen | None = None
        self.log_path = self.home / "server.log"

    def start(self, timeout: float = START_TIMEOUT) -> PrefectServer:
        self.home.mkdir(parents=True, exist_ok=True)
        prefect = Path(sys.executable).with_name("prefect")
        with open(self.log_path, "w") as log:  # the child writes to its own copy of the descriptor
            self.proc = subprocess.Popen(
                [str(prefect), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, os.getpid(), sig=signal.SIGTERM),
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited early:\n{self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.api_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"prefect server did not answer within {timeout}s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def drain_prefect_queues(timeout: float = 15) -> None:
    """Send what Prefect's background log and event senders still hold while the server answers (else they
    retry a stopped server for a minute at interpreter exit)."""
    from prefect._internal.concurrency.services import QueueService

    QueueService.drain_all(timeout=timeout)


@contextlib.contextmanager
def running_server(server: PrefectServer) -> Iterator[PrefectServer]:
    """``server`` started, this process's Prefect settings (API URL and home) pointed at it while inside; on the
    way out Prefect's queues are drained while it still answers, then it stops. The one start/drain/stop of
    the CLI, the tests' session server, the team-server test and the reliability harness."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    try:
        server.start()
        with temporary_settings(updates={PREFECT_API_URL: server.api_url, PREFECT_HOME: str(server.home)}):
            try:
                yield server
            finally:
                drain_prefect_queues()
    finally:
        server.stop()


@contextlib.contextmanager
def server_for_this_run(home: Path, say=print) -> Iterator[PrefectServer]:
    """A Prefect server for one run (``wiki-pipeline run`` without ``PREFECT_API_URL``): started on a free
    loopback port with its database in ``home``, this process's Prefect settings pointed at it, stopped after."""
    server = PrefectServer(home)
    say(
        f"no PREFECT_API_URL: starting a Prefect server for this run on 127.0.0.1:{server.port} (database in "
        f"{server.home}; a first start takes about a minute); it stops when the run ends"
    )
    with running_server(server):
        yield server
