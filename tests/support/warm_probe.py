"""A flow that writes down what its process sees, and a script that starts it the way Prefect's runner starts a
served flow's run, once the stock way (a spawned process) and once warm (``flows.warm_start``: forked from the
preloaded fork server), for tests/flows/test_warm_start.py.

    python -m tests.support.warm_probe OUT_DIR     writes OUT_DIR/spawned.json and OUT_DIR/warm.json, prints
                                                   the fork server's pid, then waits to be killed

Between ``install`` and the runs this process drops one variable from its environment and adds another, as a
runner's environment may change after its fork server started; both runs must see the environment as it is
now.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from prefect import flow

ENV_KEYS = ("WARM_PROBE_ADDED", "WARM_PROBE_DROPPED", "WARM_PROBE_GIVEN", "PREFECT_API_URL", "PREFECT__DEPLOYMENT_NAME")


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


@flow(name="warm-probe")
def probe(out: str) -> None:
    from prefect.runtime import flow_run
    from prefect.settings import get_current_settings

    record = {
        "env": {key: os.environ.get(key) for key in ENV_KEYS},
        "api_url": get_current_settings().api.url,
        "cwd": os.getcwd(),
        "sys_path_head": sys.path[:3],
        "has_flow_run_id": bool(flow_run.id),
        # where the process came from (left out of the comparison)
        "parent_cmdline": _cmdline(os.getppid()),
        "parent_pid": os.getppid(),
    }
    Path(out).write_text(json.dumps(record))


def main(out_dir: str) -> int:
    import multiprocessing.forkserver

    import prefect.runner._starter_direct as starter

    from flows.warm_start import install

    stock = starter.run_flow_in_subprocess
    os.environ["WARM_PROBE_DROPPED"] = "set before the fork server started"
    print(install(), flush=True)
    del os.environ["WARM_PROBE_DROPPED"]
    os.environ["WARM_PROBE_ADDED"] = "set after the fork server started"
    given = {"WARM_PROBE_GIVEN": "given by the runner", "PREFECT__DEPLOYMENT_NAME": "warm-probe/probe"}
    for name, start in (("spawned", stock), ("warm", starter.run_flow_in_subprocess)):
        out = str(Path(out_dir) / f"{name}.json")
        process = start(probe, parameters={"out": out}, env=given)
        process.join(120)
        print(name, type(process).__name__, process.exitcode, flush=True)
        if process.exitcode != 0:
            return 1
    print("forkserver pid", multiprocessing.forkserver._forkserver._forkserver_pid, flush=True)
    time.sleep(600)  # as a runner does, until it is killed
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
