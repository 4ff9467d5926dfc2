"""`wiki-pipeline wait` follows a run live: while a stage runs it shows that stage's progress --
for training the step, loss, tokens/s and ETA -- read from the progress artifact the stage posts. A real
`wiki-pipeline run` (the model stage held after its first checkpoint by a test hook) and a real follower process,
both against the session's Prefect server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support import REPO

PROGRESS = re.compile(r"^  model +\d+\.\d% step 10/40 loss \d+\.\d+ .*· [\d.]+k? tokens/s wall-clock · ETA \d+")


def _flow_run_of(root: Path, deadline: float) -> str:
    """The id of the flow run whose artifact root is ``root`` (read back through the API)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            for run in client.read_flow_runs(sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=20):
                if (run.parameters.get("run") or {}).get("artifacts_dir") == str(root):
                    return str(run.id)
            time.sleep(0.5)
    raise AssertionError(f"no flow run for {root} appeared")


def test_wait_shows_the_running_stages_progress_live(prefect_server, upstream, trained, tmp_path):
    from tasks.model import PIPELINE_STALL_ENV

    root = tmp_path / "art"
    subprocess.run(["cp", "-a", str(upstream[0]), str(root)], check=True)  # corpus .. model: Cached
    url = (upstream[0].parent / "wikitext-103-raw-v1.zip").as_uri()
    env = {**prefect_server.env, PIPELINE_STALL_ENV: "1"}
    log = open(tmp_path / "run.log", "w")
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "run",
            "--tiny",
            "--source-url",
            url,
            "--artifacts-dir",
            str(root),
            "--force",
            "model",
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    follower = None
    try:
        deadline = time.monotonic() + 240
        flow_run_id = _flow_run_of(root, deadline)
        follower = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "wait", flow_run_id, "--interval", "0.3", "--timeout", "200"],
            cwd=REPO,
            env=prefect_server.env,
            stdout=subprocess.PIPE,
            text=True,
        )
        lines = []
        for line in follower.stdout:  # wait for the event: the model's progress shown (the run holds at step 10)
            lines.append(line.rstrip("\n"))
            if PROGRESS.match(lines[-1]):
                break
        assert PROGRESS.match(lines[-1]), "\n".join(lines) + "\nrun log:\n" + (tmp_path / "run.log").read_text()[-3000:]
        assert "  shards     Cached" in lines, lines
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        log.close()
        if follower:
            follower.kill()
            follower.wait()


def test_wait_without_a_server_named_says_how_to_name_one(tmp_path):
    """With no PREFECT_API_URL, `wait` refuses in one line instead of asking a temporary server of its own."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "wait", "0f0e0d0c-0b0a-0908-0706-050403020100"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: wait follows a flow run on a Prefect server, and PREFECT_API_URL names none; set it to the server "
        "that runs it (scripts/pipeline prints the line to paste, e.g. export PREFECT_API_URL=http://127.0.0.1:4200/api)"
    ], done.stderr
