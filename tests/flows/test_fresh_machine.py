"""`wiki-pipeline run` with no Prefect server configured: it starts one for the run
(flows/server.py) -- whose first start on a fresh PREFECT_HOME, migrations and all, takes longer than
Prefect gives its own temporary server -- and that server never outlives the run, even a SIGKILLed one."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import psutil
import pytest

from flows.mirror import ZIP_NAME
from tests.support import REPO
from tests.support.mirror_faults import Faults, FaultyMirror


def _env_without_a_server(home) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return {**env, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def _listening_children(proc: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in proc.children(recursive=True):
        try:
            if any(c.status == psutil.CONN_LISTEN for c in child.net_connections(kind="tcp")):
                found.append(child)
        except psutil.Error:
            pass
    return found


def test_a_sigkilled_run_leaves_no_server_behind(prefect_server, tmp_path, wiki_zip):
    home = tmp_path / "home"
    home.mkdir()
    with sqlite3.connect(prefect_server.home / "prefect.db") as src, sqlite3.connect(home / "prefect.db") as dst:
        src.backup(dst)  # an already migrated database: the server starts in seconds
    # the corpus stage's first request never gets its body: the run is still going when it is killed
    with FaultyMirror({"/" + ZIP_NAME: wiki_zip}, faults=Faults(stall=120, stall_times=-1)) as mirror:
        log = tmp_path / "run.log"
        with open(log, "w") as out:
            run = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "flows.cli",
                    "run",
                    "--tiny",
                    "--only",
                    "corpus",
                    "--source-url",
                    mirror.url(),
                    "--artifacts-dir",
                    str(tmp_path / "art"),
                ],
                cwd=REPO,
                env=_env_without_a_server(home),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        servers: list[psutil.Process] = []
        try:
            deadline = time.monotonic() + 240
            while not servers and run.poll() is None and time.monotonic() < deadline:
                servers = _listening_children(psutil.Process(run.pid))  # wait for the event: a server answers
                time.sleep(0.1)
            assert servers, f"no server was started (rc {run.poll()}):\n{log.read_text()[-3000:]}"
            run.send_signal(signal.SIGKILL)  # the run only: its server is in a session of its own
            assert run.wait(60) == -signal.SIGKILL
            _, alive = psutil.wait_procs(servers, timeout=60)
            assert not alive, f"still running after the run was killed: {[p.cmdline() for p in alive]}"
        finally:
            for p in servers:
                if p.is_running():
                    p.kill()


@pytest.mark.slow
def test_run_on_a_fresh_machine(tmp_path):
    """A new user's first run: fresh PREFECT_HOME, no server anywhere."""
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--tiny", "--mirror", "--artifacts-dir", str(tmp_path / "art")],
        cwd=REPO,
        env=_env_without_a_server(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    assert "starting a Prefect server for this run" in done.stderr
    assert (tmp_path / "home" / "prefect.db").is_file() and "samples" in done.stdout
