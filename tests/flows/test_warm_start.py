"""Warm flow runs (``flows.warm_start``): the served deployment's runs fork from a process that imported Prefect
and the pipeline once, instead of spawning a fresh interpreter. Through a real Prefect server on loopback and
real processes:

- the fast path is the plain one's equal: a run started warm sees the same environment, settings, working
  directory and import path as one started the stock way (spawned), including a variable the runner dropped and
  one it added after its fork server started;
- `wiki-pipeline serve` starts the fork server, its runs' processes are that server's children, a run cancelled
  through the API (what the UI's Cancel does) ends Cancelled with its process gone, and when the runner is
  SIGKILLed its fork server goes too: nothing is left running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support import REPO
from tests.support.runner import serving_process


def test_a_warm_run_sees_what_a_spawned_run_sees(prefect_server, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.warm_probe", str(tmp_path)],
        cwd=REPO,
        env={**prefect_server.env, "DO_NOT_TRACK": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "spawned SpawnProcess 0" in done.stdout and "warm ForkServerProcess 0" in done.stdout, done.stdout
    spawned = json.loads((tmp_path / "spawned.json").read_text())
    warm = json.loads((tmp_path / "warm.json").read_text())

    # where each came from: the spawned run is the script's child, the warm one the preloaded fork server's
    forkserver_pid = int(done.stdout.split("forkserver pid ")[1].split()[0])
    assert warm.pop("parent_pid") == forkserver_pid != spawned.pop("parent_pid")
    warm_parent = warm.pop("parent_cmdline")
    assert "multiprocessing.forkserver" in warm_parent and "flows.wiki_pipeline" in warm_parent, warm_parent
    assert "tests.support.warm_probe" in spawned.pop("parent_cmdline")

    # what each saw: the same
    assert warm == spawned
    env = warm["env"]
    assert env["WARM_PROBE_DROPPED"] is None, "a variable the runner dropped after the fork server started"
    assert env["WARM_PROBE_ADDED"] == "set after the fork server started"
    assert env["WARM_PROBE_GIVEN"] == "given by the runner"
    assert env["PREFECT__DEPLOYMENT_NAME"] == "warm-probe/probe"
    assert warm["api_url"] == prefect_server.api_url and warm["has_flow_run_id"]


def _forkserver_of(runner: psutil.Process) -> psutil.Process:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in runner.children():
            if "multiprocessing.forkserver" in " ".join(child.cmdline()):
                return child
        time.sleep(0.2)
    raise AssertionError(f"the runner {runner.pid} has no fork server: {[c.cmdline() for c in runner.children()]}")


def _flow_run_state(flow_run_id: str) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
    return state.name if state else "?"


def _wait_for(what: str, check, timeout: float = 120, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}" + (f"\nrunner:\n{log.read_text()[-3000:]}" if log else ""))


@pytest.fixture
def mirror():
    from flows.mirror import ZIP_NAME, Mirror, build_wikitext_zip

    try:
        data = build_wikitext_zip()
    except FileNotFoundError as e:
        pytest.skip(f"real test text is absent: {e}")
    with Mirror({"/" + ZIP_NAME: data}) as m:
        yield m


def test_served_runs_fork_from_the_preloaded_server_cancel_cleanly_and_leave_nothing(prefect_server, mirror, tmp_path):
    long_model = {"steps": 100_000, "print_every": 10}  # runs until cancelled
    args = ["--tiny", "--source-url", mirror.url(), "--artifacts-dir", str(tmp_path / "art")]
    args += ["--param", f"model={json.dumps(long_model)}"]
    log = tmp_path / "runner.log"
    with serving_process(prefect_server.env, log, *args) as (proc, log):
        assert "flow runs start warm" in log.read_text(), log.read_text()[-3000:]
        runner = psutil.Process(proc.pid)
        forkserver = _forkserver_of(runner)
        assert "flows.wiki_pipeline" in " ".join(forkserver.cmdline())

        prefect = str(Path(sys.executable).with_name("prefect"))
        started = subprocess.run(
            [prefect, "deployment", "run", "wiki-pipeline/wiki-pipeline"],
            env={**prefect_server.env, "DO_NOT_TRACK": "1"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert started.returncode == 0, started.stdout + started.stderr
        flow_run_id = started.stdout.split("UUID: ")[1].split()[0]
        flow_process = _wait_for("the flow run's process", lambda: forkserver.children(), log=log)[0]
        assert flow_process.ppid() == forkserver.pid
        _wait_for("the model's training loop", lambda: "step 10: loss" in log.read_text(), timeout=240, log=log)
        assert _flow_run_state(flow_run_id) == "Running"

        cancelled = subprocess.run(
            [prefect, "flow-run", "cancel", flow_run_id],
            env={**prefect_server.env, "DO_NOT_TRACK": "1"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        _wait_for("the run to end Cancelled", lambda: _flow_run_state(flow_run_id) == "Cancelled", log=log)
        _wait_for(
            "the flow run's process to end",
            lambda: not flow_process.is_running() or flow_process.status() == psutil.STATUS_ZOMBIE,
            timeout=60,
            log=log,
        )
        assert forkserver.is_running(), "the fork server outlives a cancelled run"

        os.kill(proc.pid, signal.SIGKILL)  # the runner dies at an odd moment
        proc.wait(30)
        _wait_for(
            "the fork server to exit after its runner",
            lambda: not forkserver.is_running() or forkserver.status() == psutil.STATUS_ZOMBIE,
            timeout=30,
        )
