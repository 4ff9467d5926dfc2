"""Warm flow runs (``flows.warm_start``): the served deployment's runs fork from a process that imported Prefect
and the pipeline once, instead of spawning a fresh interpreter. Through a real Prefect server on loopback and
real processes:

- the fast path is the plain one's equal: a run started warm sees the same environment, settings, working
  directory and import path as one started the stock way (spawned), including a variable the runner dropped and
  one it added after its fork server started;
- when the runner is SIGKILLed its fork server goes too: nothing is left running.

`wiki-pipeline serve`'s own runs (forked from its fork server, cancelled cleanly) are tested with the demo's
runner in tests/flows/test_control_room.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import psutil

from tests.support import REPO
from tests.support.runner import alive
from tests.support.wait import wait_for


def test_a_warm_run_sees_what_a_spawned_run_sees_and_its_fork_server_dies_with_the_runner(prefect_server, tmp_path):
    probe = subprocess.Popen(
        [sys.executable, "-m", "tests.support.warm_probe", str(tmp_path)],
        cwd=REPO,
        env={**prefect_server.env, "DO_NOT_TRACK": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert probe.stdout is not None
        lines = []
        for line in probe.stdout:  # until the runs are done and it names its fork server (or exits)
            lines.append(line)
            if line.startswith("forkserver pid"):
                break
        out = "".join(lines)
        assert "spawned SpawnProcess 0" in out and "warm ForkServerProcess 0" in out, out
        forkserver = psutil.Process(int(out.split("forkserver pid ")[1].split()[0]))
        spawned = json.loads((tmp_path / "spawned.json").read_text())
        warm = json.loads((tmp_path / "warm.json").read_text())

        # where each came from: the spawned run is the script's child, the warm one the preloaded fork server's
        assert warm.pop("parent_pid") == forkserver.pid != spawned.pop("parent_pid") == probe.pid
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

        assert forkserver.is_running()
        probe.kill()  # the runner dies at an odd moment: SIGKILL, no clean-up of its own
        probe.wait(30)
        wait_for(lambda: not alive(forkserver), "the fork server to exit after its runner", timeout=30, every=0.2)
    finally:
        probe.kill()
        probe.wait(30)
