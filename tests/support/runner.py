"""`wiki-pipeline serve` as its own process for the tests that trigger deployment runs."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from tests.support import REPO
from tests.support.processes import stop_processes


@contextlib.contextmanager
def serving(env: dict, log_path: Path, *serve_args: str, start_timeout: float = 120) -> Iterator[Path]:
    """``wiki-pipeline serve SERVE_ARGS`` with ``env``, its output in ``log_path``, until the block ends."""
    with serving_process(env, log_path, *serve_args, start_timeout=start_timeout) as (_, path):
        yield path


@contextlib.contextmanager
def serving_process(
    env: dict, log_path: Path, *serve_args: str, start_timeout: float = 120
) -> Iterator[tuple[subprocess.Popen, Path]]:
    """:func:`serving`, with the runner's process too."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "serve", *serve_args],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + start_timeout
        while "is being served" not in log_path.read_text():
            assert proc.poll() is None, f"the runner exited:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the runner did not start:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.3)
        yield proc, log_path
    finally:
        stop_processes(proc)


def alive(process: psutil.Process) -> bool:
    """Whether ``process`` still runs (a zombie waiting for its parent to reap it does not)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
