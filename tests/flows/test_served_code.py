"""A served deployment's runs start as Prefect's runner starts them (a spawned interpreter each), so a run runs the
code on disk when it starts: an edit between two runs is picked up without restarting the runner. Through a real
Prefect server, a real runner process (the one `wiki-pipeline serve` starts: ``Runner.add_flow``, a module
entrypoint) and the real `prefect deployment run --watch`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.processes import stop_processes
from tests.support.wait import wait_for

SERVED = """
import asyncio, sys
from pathlib import Path
from prefect import flow
from prefect.runner import Runner
from prefect.types.entrypoint import EntrypointType

@flow
def probe(out: str) -> None:
    import probe_mark  # the code on disk when the run starts
    Path(out).write_text(probe_mark.MARK)

if __name__ == "__main__":
    runner = Runner(name="probe", query_seconds=0.5)
    runner.add_flow(probe, name="probe", entrypoint_type=EntrypointType.MODULE_PATH)
    print("is being served", flush=True)
    asyncio.run(runner.start())
"""


def test_a_served_run_completes_and_the_next_run_runs_edited_code(prefect_server, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "probe_served.py").write_text(textwrap.dedent(SERVED))
    mark = code / "probe_mark.py"
    mark.write_text('MARK = "first"\n')
    env = {**prefect_server.env, "DO_NOT_TRACK": "1", "PYTHONPATH": str(code)}
    log_path = tmp_path / "runner.log"
    with open(log_path, "w") as log:
        runner = subprocess.Popen(
            [sys.executable, "-m", "probe_served"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=code
        )
    try:
        wait_for(lambda: "is being served" in log_path.read_text(), "the runner", timeout=120, every=0.3)
        prefect = str(Path(sys.executable).with_name("prefect"))
        seen = []
        for edit in ('MARK = "first"\n', 'MARK = "second: edited while the runner runs"\n'):
            mark.write_text(edit)
            out = tmp_path / f"out-{len(seen)}"
            done = subprocess.run(
                [prefect, "deployment", "run", "probe/probe", "--param", f"out={out}", "--watch"],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + log_path.read_text()[-3000:]
            seen.append(out.read_text())
        assert seen == ["first", "second: edited while the runner runs"]
    finally:
        stop_processes(runner)
