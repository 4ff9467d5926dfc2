"""A real Prefect server on 127.0.0.1 as a child process (its own PREFECT_HOME, a free port, SQLite, analytics off)
that never outlives its parent; for the tests, the benchmarks and ``wiki-pipeline run`` (docs/SERVING.md)."""

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

from mygpt.training.orphan_guard import die_with_parent

START_TIMEOUT = 240.0  # seconds: a first start's migrations, on a busy machine
SERVER_AUTH_ENV = "PREFECT_SERVER_API_AUTH_STRING"  # Prefect's basic auth: ``user:password`` the server demands
CLIENT_AUTH_ENV = "PREFECT_API_AUTH_STRING"  # ... and what its clients (CLI, runner, worker, flow runs) send
#: The server streams each run's log lines to its watchers (off in Prefect by default): `prefect deployment run
#: --watch` then shows them beside the run's state changes, a stage's progress lines among them.
LOG_STREAMING = {
    "PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED": "true",
    "PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED": "true",
}

# Crashed runs (a SIGKILLed run, a lost machine): the flow runs we start send Prefect's flow-run heartbeat every
# HEARTBEAT_SECONDS and carry HEARTBEAT_TAG; the server's automation CRASH_AUTOMATION (Prefect's documented
# "zombie flow runs" automation, made by ensure_crash_automation) marks such a run Crashed once CRASHED_AFTER
# seconds pass with no heartbeat and no state change. The tag keeps it to runs that beat this often (Prefect's
# default is every 180 s).
HEARTBEAT_SECONDS = 30  # Prefect's minimum
CRASHED_AFTER = 90  # seconds without a heartbeat: two missed beats and some slack on a busy machine
HEARTBEAT_TAG = "wiki-pipeline-heartbeat"
CRASH_AUTOMATION = "wiki-pipeline: mark runs without a heartbeat Crashed"


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
            **LOG_STREAMING,
        }
        if self.env.get(SERVER_AUTH_ENV):  # a server with basic auth: our clients of it send the same string
            self.env[CLIENT_AUTH_ENV] = self.env[SERVER_AUTH_ENV]
        self.proc: subprocess.Popen | None = None
        self.log_path = self.home / "server.log"
        self._log_from = 0  # where this server's part of server.log begins

    @property
    def auth_string(self) -> str | None:
        """The basic-auth ``user:password`` this server demands (from ``PREFECT_SERVER_API_AUTH_STRING``), or None."""
        return self.env.get(SERVER_AUTH_ENV) or None

    def log_tail(self, n: int = 3000) -> str:
        """The end of what this server wrote to ``server.log`` (others on the same home append there too)."""
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            f.seek(self._log_from)
            return f.read()[-n:]

    def start(self, timeout: float = START_TIMEOUT) -> PrefectServer:
        self.home.mkdir(parents=True, exist_ok=True)
        prefect = Path(sys.executable).with_name("prefect")
        # appended, never truncated: another server on the same PREFECT_HOME may be writing its log there
        with open(self.log_path, "a", encoding="utf-8") as log:  # the child writes to its own copy of the descriptor
            log.write(
                f"---- prefect server on 127.0.0.1:{self.port}, started "
                f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} ----\n"
            )
            log.flush()
            self._log_from = log.tell()
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
                raise RuntimeError(f"prefect server exited early:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.api_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"prefect server did not answer within {timeout}s:\n{self.log_tail()}")

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
    """``server`` started and this process's Prefect settings pointed at it while inside; on the way out Prefect's
    queues are drained while it still answers, then it stops."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, PREFECT_HOME, temporary_settings

    updates: dict = {PREFECT_API_URL: server.api_url, PREFECT_HOME: str(server.home)}
    if server.auth_string:
        updates[PREFECT_API_AUTH_STRING] = server.auth_string
    try:
        server.start()
        with temporary_settings(updates=updates):
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


def ensure_crash_automation() -> None:
    """Make :data:`CRASH_AUTOMATION` (Prefect's "zombie flow runs" automation, kept to runs tagged
    :data:`HEARTBEAT_TAG`) on the server this process reports to, unless it is there."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    with get_client(sync_client=True) as client:
        if client.read_automations_by_name(CRASH_AUTOMATION):
            return
        client.create_automation(
            AutomationCore(
                name=CRASH_AUTOMATION,
                description=(
                    f"A flow run tagged {HEARTBEAT_TAG} sends a heartbeat every {HEARTBEAT_SECONDS} s; "
                    f"{CRASHED_AFTER} s without one (a killed process, a lost machine) marks it Crashed."
                ),
                trigger=EventTrigger(
                    match={"prefect.resource.id": "prefect.flow-run.*"},
                    match_related={
                        "prefect.resource.role": "tag",
                        "prefect.resource.id": f"prefect.tag.{HEARTBEAT_TAG}",
                    },
                    after={"prefect.flow-run.heartbeat"},
                    expect={"prefect.flow-run.*"},
                    for_each={"prefect.resource.id"},
                    posture=Posture.Proactive,
                    threshold=1,
                    within=CRASHED_AFTER,
                ),
                actions=[
                    ChangeFlowRunState(
                        state=StateType.CRASHED,
                        message=f"no heartbeat for {CRASHED_AFTER} s: the process running it was killed or lost",
                    )
                ],
            )
        )


def crash_orphaned_task_runs() -> int:
    """Set Crashed the task runs still Running or Pending in a flow run tagged :data:`HEARTBEAT_TAG` that ended
    Crashed (the automation crashes the flow run only; its task runs died with it). How many were set."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        orphans = client.read_task_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[HEARTBEAT_TAG]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.CRASHED])),
            ),
            task_run_filter=TaskRunFilter(
                state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING]))
            ),
        )
        for task_run in orphans:
            client.set_task_run_state(
                task_run.id, Crashed(message="its flow run crashed (no heartbeat): the process was killed or lost")
            )
    return len(orphans)


@contextlib.contextmanager
def watched_runs() -> Iterator[None]:
    """Flow runs started inside beat and carry :data:`HEARTBEAT_TAG`, so a run whose process dies is marked Crashed;
    task runs that crashed runs left Running are set Crashed here."""
    from prefect import tags
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    ensure_crash_automation()
    crash_orphaned_task_runs()
    with tags(HEARTBEAT_TAG), temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: HEARTBEAT_SECONDS}):
        yield
