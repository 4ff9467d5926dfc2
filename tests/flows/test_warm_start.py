"""Warm flow runs (``flows.warm_start``): the served deployment's runs fork from a process that imported Prefect
and the pipeline once, instead of spawning a fresh interpreter. Through a real Prefect server on loopback and
real processes:

- the fast path is the plain one's equal: a run started warm sees the same environment, settings, working
  directory and import path as one started the stock way (spawned), including a variable the runner dropped and
  one it added after its fork server started, and one it dropped after the fork server restarted;
- what multiprocessing's fork server leaves to its user: a fork server killed under a running run (the run's
  handle follows it to its end; the next run gets a new server), a run that leaves a process behind (the next
  restart does not wait for it), code the fork server cannot import (the run is spawned and says why);
- when the runner is SIGKILLed, even while a run goes, its fork server goes at once and removes its socket; the
  run goes on (as a spawned one would), and nothing is left once it ends.

`wiki-pipeline serve`'s own runs (forked from its fork server, cancelled cleanly) are tested with the demo's
runner in tests/flows/test_control_room.py.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import signal
import subprocess
import sys
import sysconfig
import tomllib
import types
from pathlib import Path

import prefect.flow_engine
import psutil

from flows import warm_start
from flows.warm_start import PROJECT_PACKAGES, project_sources
from tests.support import REPO
from tests.support.runner import alive
from tests.support.wait import wait_for


def test_a_warm_run_sees_what_a_spawned_run_sees_and_its_fork_server_dies_with_the_runner(prefect_server, tmp_path):
    (tmp_path / "code").mkdir()
    probe = subprocess.Popen(
        [sys.executable, "-m", "tests.support.warm_probe", str(tmp_path)],
        cwd=REPO,
        # the probe's module on the fork server's import path too (Python 3.11's fork server ignores the runner's
        # sys.path: it imports its preload from the path of a fresh `python -c`), so that it really preloads it
        env={**prefect_server.env, "DO_NOT_TRACK": "1", "PYTHONPATH": str(tmp_path / "code")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    left: list[int] = []  # processes the runs leave: killed whatever happens
    try:
        assert probe.stdout is not None
        lines = []
        for line in probe.stdout:  # until the runs are done and it names its fork server (or exits)
            lines.append(line)
            if line.startswith("forkserver pid"):
                break
        out = "".join(lines)
        for said in (
            "spawned SpawnProcess 0",
            "warm WarmProcess 0",
            "edited WarmProcess 0",
            "during SpawnProcess 0",
            "held WarmProcess 0",
            "orphaned goes on True",  # its fork server died under it: its handle still follows it
            "orphaned WarmProcess 255",  # ended, its exit code lost with the server
            "revived WarmProcess 0",
            "leaver WarmProcess 0",
            "restarted WarmProcess 0",
            "lingering alive True",  # the restart did not wait for the process the leaver left
            "broken SpawnProcess 0",  # the fork server could not import the code: spawned (its flow Failed, below)
            "mended WarmProcess 0",
        ):
            assert said + "\n" in out, (said, out)
        assert out.count("the project's code changed since the fork server started") == 5, out
        assert "the fork server died while run process" in out, out
        assert out.count("is gone; starting another") == 2, out  # after the SIGKILL, after the broken import
        assert out.count("the fork server could not start this run") == 1, out
        assert 'Finished in state Failed("Flow run encountered an exception: SyntaxError' in out, out  # its own
        lingering = int((tmp_path / "lingering").read_text())
        left.append(lingering)
        os.kill(lingering, signal.SIGKILL)  # seen alive after the restart; it would hold multiprocessing's tracker
        lasting = psutil.Process(int(out.split("lasting pid ")[1].split()[0]))
        left.append(lasting.pid)
        forkserver = psutil.Process(int(out.split("forkserver pid ")[1].split()[0]))
        address = Path(out.split(" address ")[1].split()[0])
        runs = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in RUNS}

        # where each came from: a spawned run is the script's child, a warm one the preloaded fork server's
        parents = {}
        for name, run in runs.items():
            parents[name], cmdline = run.pop("parent_pid"), run.pop("parent_cmdline")
            if name in ("spawned", "during"):
                assert parents[name] == probe.pid and "tests.support.warm_probe" in cmdline, (name, cmdline)
            else:
                assert "multiprocessing.forkserver" in cmdline and "flows.wiki_pipeline" in cmdline, (name, cmdline)
        assert parents["edited"] == parents["held"], "one server"
        assert parents["revived"] == parents["leaver"], "one server"
        assert parents["mended"] == parents["lasting"] == forkserver.pid, "one server, the last"
        servers = [parents[name] for name in ("warm", "edited", "orphaned", "revived", "restarted", "mended")]
        assert len(set(servers)) == len(servers), ("a new fork server after each edit and death", servers)

        # what each saw: the same, but for the code on disk when it started
        marks = {name: run.pop("mark") for name, run in runs.items()}
        assert marks == {
            "spawned": "first",
            "warm": "first",
            "edited": "second: edited",  # the fork server restarted
            "held": "second: edited",
            "during": "third: edited while a run goes",  # spawned: the fork server had a run going
            "orphaned": "third: edited while a run goes",  # restarted once no run went
            "revived": "third: edited while a run goes",
            "leaver": "third: edited while a run goes",
            "restarted": "fourth: edited after a run left a process behind",
            "mended": "fifth: mended",
            "lasting": "fifth: mended",
        }
        late = {name: run["env"].pop("WARM_PROBE_LATE") for name, run in runs.items()}
        assert late == dict.fromkeys(RUNS, None) | {"edited": "set when the fork server restarted"}, late
        assert all(run == runs["spawned"] for run in runs.values()), runs
        env = runs["warm"]["env"]
        assert env["WARM_PROBE_DROPPED"] is None, "a variable the runner dropped after the fork server started"
        assert env["WARM_PROBE_ADDED"] == "set after the fork server started"
        assert env["WARM_PROBE_GIVEN"] == "given by the runner"
        assert env["PREFECT__DEPLOYMENT_NAME"] == "warm-probe/probe"
        assert runs["warm"]["api_url"] == prefect_server.api_url and runs["warm"]["has_flow_run_id"]

        # the runner dies at an odd moment (SIGKILL, no clean-up of its own) while a run goes: its fork server
        # goes at once and removes its socket; the run goes on, and multiprocessing's tracker goes after it
        family = psutil.Process(probe.pid).children(recursive=True)  # the fork server, the tracker, the run
        assert forkserver in family and lasting in family and all(alive(p) for p in family), family
        assert address.is_socket()
        probe.kill()
        probe.wait(30)
        wait_for(lambda: not alive(forkserver), "the fork server to exit after its runner", timeout=30)
        assert alive(lasting), "the run goes on"
        wait_for(lambda: not address.parent.exists(), "the fork server to remove its socket and its dir", timeout=10)
        (tmp_path / "release-lasting").touch()
        wait_for(lambda: not any(alive(p) for p in family), "the runner's processes to exit after it", timeout=30)
    finally:
        probe.kill()
        probe.wait(30)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


RUNS = (
    "spawned",
    "warm",
    "edited",
    "held",
    "during",
    "orphaned",
    "revived",
    "leaver",
    "restarted",
    "mended",
    "lasting",
)


def test_the_project_s_code_is_watched_wherever_it_is_installed(monkeypatch):
    """A non-editable install puts the project's packages into site-packages: their modules are still the project's
    code (an edit there must restart the fork server); other installed packages are not watched."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    for name, path in (("flows.copy_in_site", purelib / "flows/copy_in_site.py"), ("other_pkg", purelib / "o.py")):
        module = types.ModuleType(name)
        module.__file__ = str(path)
        monkeypatch.setitem(sys.modules, name, module)
    found = project_sources()
    assert found[str(purelib / "flows/copy_in_site.py")] == (-1, -1)  # watched (and, not on disk here, changed)
    assert str(purelib / "o.py") not in found
    assert inspect.getfile(warm_start) in found and inspect.getfile(prefect.flow_engine) not in found
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert sorted(PROJECT_PACKAGES) == sorted(packages)
