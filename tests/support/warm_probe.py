"""A flow that writes down what its process sees, started the way Prefect's runner starts a served run: spawned,
and warm (``flows.warm_start``: forked from the preloaded fork server). For tests/flows/test_warm_start.py.

    python -m tests.support.warm_probe OUT_DIR

Each run writes OUT_DIR/<name>.json and the script prints ``<name> <process type> <exit code>``, in order:
``spawned``, ``warm`` (the environment changed after install: both see it as it is now); ``edited`` (preloaded
code changed: the fork server restarts); ``held`` and, meanwhile, ``during`` (spawned: no restart under a running
child); ``orphaned`` (its fork server SIGKILLed; prints ``orphaned goes on <bool>``) and ``revived``; ``leaver``
(leaves a process, pid in OUT_DIR/lingering) and ``restarted`` (prints ``lingering alive <bool>``); ``broken``
(the preloaded module fails to import: spawned, fails with its error) and ``mended``. Then ``lasting`` (held until
OUT_DIR/release-lasting), printing ``lasting pid <pid>`` and ``forkserver pid <pid> address <path>``, and waits to
be killed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
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
def probe(out: str, hold: str | None = None, linger: str | None = None) -> None:
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
    if linger and os.fork() == 0:  # a process this run leaves behind (as a careless flow might)
        try:
            Path(linger).write_text(str(os.getpid()))
            time.sleep(120)
        finally:
            os._exit(0)
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
    code.mkdir(exist_ok=True)  # the test makes it first, to put it on PYTHONPATH
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

    warm = starter.run_flow_in_subprocess
    for name, how in (("spawned", stock), ("warm", warm)):
        if not finish(name, start(name, how)):
            return 1
    _mark(code, "second: edited")
    os.environ["WARM_PROBE_LATE"] = "set when the fork server restarted"  # the restarted one starts with it
    if not finish("edited", start("edited", warm)):
        return 1
    del os.environ["WARM_PROBE_LATE"]  # and the runs after must not see it
    held = start("held", warm, hold=str(out / "release"))
    wait_file(out / "held.json")
    _mark(code, "third: edited while a run goes")
    during = start("during", warm)
    ok = finish("during", during)
    (out / "release").touch()
    if not (finish("held", held) and ok):
        return 1

    orphaned = start("orphaned", warm, hold=str(out / "release-orphaned"))
    wait_file(out / "orphaned.json")
    os.kill(multiprocessing.forkserver._forkserver._forkserver_pid, signal.SIGKILL)
    orphaned.join(1.5)
    print("orphaned goes on", orphaned.exitcode is None and orphaned.is_alive(), flush=True)
    (out / "release-orphaned").touch()
    finish("orphaned", orphaned)  # its exit code went with its server: 255
    if not finish("revived", start("revived", warm)):
        return 1

    if not finish("leaver", start("leaver", warm, linger=str(out / "lingering"))):
        return 1
    wait_file(out / "lingering")
    _mark(code, "fourth: edited after a run left a process behind")
    if not finish("restarted", start("restarted", warm)):
        return 1
    print("lingering alive", psutil.pid_exists(int((out / "lingering").read_text())), flush=True)

    (code / "probe_mark.py").write_text("MARK = (\n")  # a syntax error: the fork server dies importing it
    finish("broken", start("broken", warm))
    _mark(code, "fifth: mended")
    if not finish("mended", start("mended", warm)):
        return 1

    lasting = start("lasting", warm, hold=str(out / "release-lasting"))
    wait_file(out / "lasting.json")
    server = multiprocessing.forkserver._forkserver
    print("lasting pid", lasting.pid, flush=True)
    print("forkserver pid", server._forkserver_pid, "address", server._forkserver_address, flush=True)
    time.sleep(600)  # as a runner does, until it is killed
    return 0


def wait_file(path: Path) -> None:
    deadline = time.monotonic() + 120
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
