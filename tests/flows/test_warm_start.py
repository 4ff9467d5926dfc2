"""Warm flow runs (``flows.warm_start``): the served deployment's runs fork from a process that imported Prefect
and the pipeline once, instead of spawning a fresh interpreter. Through a real Prefect server on loopback and
real processes:

- the fast path is the plain one's equal: a run started warm sees the same environment, settings, working
  directory and import path as one started the stock way (spawned), including a variable the runner dropped and
  one it added after its fork server started, and one it dropped after the fork server restarted;
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
        for run in ("spawned SpawnProcess 0", "warm ForkServerProcess 0", "edited ForkServerProcess 0"):
            assert run + "\n" in out, out
        assert "during SpawnProcess 0\n" in out and "held ForkServerProcess 0\n" in out, out
        assert out.count("the project's code changed since the fork server started") == 2, out
        forkserver = psutil.Process(int(out.split("forkserver pid ")[1].split()[0]))
        runs = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in RUNS}

        # where each came from: a spawned run is the script's child, a warm one the preloaded fork server's
        parents = {}
        for name, run in runs.items():
            parents[name], cmdline = run.pop("parent_pid"), run.pop("parent_cmdline")
            if name in ("spawned", "during"):
                assert parents[name] == probe.pid and "tests.support.warm_probe" in cmdline, (name, cmdline)
            else:
                assert "multiprocessing.forkserver" in cmdline and "flows.wiki_pipeline" in cmdline, (name, cmdline)
        assert parents["warm"] != parents["edited"] == parents["held"] == forkserver.pid, "restarted after the edit"

        # what each saw: the same, but for the code on disk when it started
        marks = {name: run.pop("mark") for name, run in runs.items()}
        assert marks == {
            "spawned": "first",
            "warm": "first",
            "edited": "second: edited",  # the fork server restarted
            "held": "second: edited",
            "during": "third: edited while a run goes",  # spawned: the fork server had a run going
        }
        late = {name: run["env"].pop("WARM_PROBE_LATE") for name, run in runs.items()}
        assert late == {
            "spawned": None,
            "warm": None,
            "edited": "set when the fork server restarted",
            "held": None,  # forked from the restarted fork server, which has it: dropped
            "during": None,
        }
        assert all(run == runs["spawned"] for run in runs.values()), runs
        env = runs["warm"]["env"]
        assert env["WARM_PROBE_DROPPED"] is None, "a variable the runner dropped after the fork server started"
        assert env["WARM_PROBE_ADDED"] == "set after the fork server started"
        assert env["WARM_PROBE_GIVEN"] == "given by the runner"
        assert env["PREFECT__DEPLOYMENT_NAME"] == "warm-probe/probe"
        assert runs["warm"]["api_url"] == prefect_server.api_url and runs["warm"]["has_flow_run_id"]

        family = psutil.Process(probe.pid).children(recursive=True)  # the fork server, multiprocessing's tracker
        assert forkserver in family and all(alive(p) for p in family), family
        probe.kill()  # the runner dies at an odd moment: SIGKILL, no clean-up of its own
        probe.wait(30)
        wait_for(lambda: not any(alive(p) for p in family), "the runner's processes to exit after it", timeout=30)
    finally:
        probe.kill()
        probe.wait(30)


RUNS = ("spawned", "warm", "edited", "held", "during")
