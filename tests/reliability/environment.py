"""Where the harness runs the pipeline: a Prefect server, a loopback mirror and ``flows.cli`` subprocesses."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from flows.mirror import ZIP_NAME, Mirror, build_wikitext_zip
from tasks.core.faults import FAULT_ENV, FAULT_TRACE_ENV
from tests.reliability.watcher import Watcher
from tests.support import REPO
from tests.support.mirror_faults import Faults, FaultyMirror
from tests.support.tiny import tiny_run_command

RUN_TIMEOUT = 240.0  # one pipeline subprocess


@dataclass
class Env:
    """Where pipeline subprocesses run: the Prefect server's environment and the mirror's URL."""

    proc_env: dict
    mirror: Mirror
    workdir: Path
    zip_bytes: bytes

    @property
    def url(self) -> str:
        return self.mirror.url()


@contextlib.contextmanager
def environment(workdir: Path, api_env: dict | None = None):
    """A mirror (and, unless ``api_env`` is given, a Prefect server) on 127.0.0.1 for the harness."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    data = build_wikitext_zip()
    with contextlib.ExitStack() as stack:
        if api_env is None:
            from flows.server import PrefectServer, running_server

            # in-process flow runs (the bad-input cases) report to this server too
            server = stack.enter_context(running_server(PrefectServer(workdir / "prefect-home")))
            api_env = server.env
        # a 0.1 s pause after the first 100 kB of every response: the first progress point of the download
        # then lands mid-body, so kills there exercise the Range resume (loopback is otherwise one gulp)
        mirror = stack.enter_context(
            FaultyMirror({"/" + ZIP_NAME: data}, faults=Faults(stall=0.1, stall_after=100_000, stall_times=-1))
        )
        env = {**api_env, "OMP_NUM_THREADS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        env.pop(FAULT_ENV, None)
        env.pop(FAULT_TRACE_ENV, None)
        yield Env(env, mirror, workdir, data)


@dataclass
class RunResult:
    rc: int
    log: str
    seconds: float
    violations: list = field(default_factory=list)
    checks: int = 0

    @property
    def killed(self) -> bool:
        return self.rc == -signal.SIGKILL


def run_pipeline(
    env: Env,
    root: Path,
    *,
    fault: str | None = None,
    trace: Path | None = None,
    log_path: Path | None = None,
    watch: bool = True,
    extra: list[str] | None = None,
    timeout: float = RUN_TIMEOUT,
) -> RunResult:
    """``flows.cli run --tiny`` against the mirror, in a session of its own (a kill takes its workers too)."""
    cmd = tiny_run_command(env.url, root, *(extra or []))
    penv = dict(env.proc_env)
    if fault:
        penv[FAULT_ENV] = fault
    if trace:
        penv[FAULT_TRACE_ENV] = str(trace)
    log_path = log_path or Path(tempfile.mktemp(prefix="run-", suffix=".log", dir=env.workdir))
    watcher = Watcher(root) if watch else None
    if watcher:
        watcher.start()
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=penv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # leftover workers of a self-killed run
        if rc is None:
            proc.wait()
    if watcher:
        watcher.stop()
    text = log_path.read_text(errors="replace")
    if rc is None:
        raise RuntimeError(f"pipeline run did not end within {timeout}s:\n{text[-3000:]}")
    return RunResult(
        rc,
        text,
        round(time.monotonic() - t0, 2),
        watcher.violations if watcher else [],
        watcher.checks if watcher else 0,
    )


@contextlib.contextmanager
def env_vars(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def captured_logs():
    handler = _Capture()
    logger = logging.getLogger("wiki_pipeline")
    old = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
