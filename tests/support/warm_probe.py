"""A flow that writes down what its process sees, and a script that starts it the way Prefect's runner starts a
served flow's run: the stock way (a spawned process) and warm (``flows.warm_start``: forked from the preloaded
fork server), for tests/flows/test_warm_start.py.

    python -m tests.support.warm_probe OUT_DIR

In order, each run writing OUT_DIR/<name>.json and the script printing ``<name> <process type> <exit code>``:

1. ``spawned`` and ``warm``: the same flow both ways. Between ``install`` and the runs this process drops one
   variable from its environment and adds another, as a runner's environment may change after its fork server
   started; both runs must see the environment as it is now.
2. ``edited``: warm again after the project's code changed (``OUT_DIR/code/probe_mark.py``, a module of this
   project that the fork server preloads): the fork server restarts and the run sees the new code. A variable
   set just before (so the restarted fork server has it) is dropped after: the later runs must not see it.
3. ``held`` (warm, kept going until OUT_DIR/release exists) and, while it goes, ``during``: after another edit,
   a run that must be spawned (the fork server cannot restart under a running child) and see the newest code.

Then it prints the fork server's pid and waits to be killed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from prefect import flow

ENV_KEYS = (
    "WARM_PROBE_ADDED",
    "WARM_PROBE_DROPPED",
    "WARM_PROBE_LATE",
    "WARM_PROBE_GIVEN",
    "PREFECT_API_URL",
    "PREFECT__DEPLOYMENT_NAME",
)


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


@flow(name="warm-probe")
def probe(out: str, hold: str | None = None) -> None:
    import probe_mark  # type: ignore[import-not-found]  # OUT_DIR/code, on the path of this script's processes
    from prefect.runtime import flow_run
    from prefect.settings import get_current_settings

    record = {
        "env": {key: os.environ.get(key) for key in ENV_KEYS},
        "api_url": get_current_settings().api.url,
        "cwd": os.getcwd(),
        "sys_path": sys.path,
        "has_flow_run_id": bool(flow_run.id),
        "mark": probe_mark.MARK,
        # where the process came from (left out of the comparison)
        "parent_cmdline": _cmdline(os.getppid()),
        "parent_pid": os.getppid(),
    }
    Path(out).write_text(json.dumps(record))
    deadline = time.monotonic() + 120
    while hold and not Path(hold).exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def _mark(code: Path, value: str) -> None:
    (code / "probe_mark.py").write_text(f"MARK = {value!r}\n")


def main(out_dir: str) -> int:
    import multiprocessing.forkserver

    import prefect.runner._starter_direct as starter

    from flows.warm_start import PRELOAD, install

    out, code = Path(out_dir), Path(out_dir) / "code"
    code.mkdir()
    _mark(code, "first")
    sys.path.insert(0, str(code))
    import probe_mark  # noqa: F401  # loaded here as the runner loads the project

    stock = starter.run_flow_in_subprocess
    os.environ["WARM_PROBE_DROPPED"] = "set before the fork server started"
    print(install((*PRELOAD, "probe_mark")), flush=True)
    del os.environ["WARM_PROBE_DROPPED"]
    os.environ["WARM_PROBE_ADDED"] = "set after the fork server started"
    given = {"WARM_PROBE_GIVEN": "given by the runner", "PREFECT__DEPLOYMENT_NAME": "warm-probe/probe"}

    def start(name: str, how, **params):
        process = how(probe, parameters={"out": str(out / f"{name}.json"), **params}, env=given)
        return process

    def finish(name: str, process) -> bool:
        process.join(120)
        print(name, type(process).__name__, process.exitcode, flush=True)
        return process.exitcode == 0

    for name, how in (("spawned", stock), ("warm", starter.run_flow_in_subprocess)):
        if not finish(name, start(name, how)):
            return 1
    _mark(code, "second: edited")
    os.environ["WARM_PROBE_LATE"] = "set when the fork server restarted"  # the restarted one starts with it
    if not finish("edited", start("edited", starter.run_flow_in_subprocess)):
        return 1
    del os.environ["WARM_PROBE_LATE"]  # and the runs after must not see it
    held = start("held", starter.run_flow_in_subprocess, hold=str(out / "release"))
    while not (out / "held.json").exists():
        time.sleep(0.1)
    _mark(code, "third: edited while a run goes")
    during = start("during", starter.run_flow_in_subprocess)
    ok = finish("during", during)
    (out / "release").touch()
    if not (finish("held", held) and ok):
        return 1
    print("forkserver pid", multiprocessing.forkserver._forkserver._forkserver_pid, flush=True)
    time.sleep(600)  # as a runner does, until it is killed
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
