"""scripts/pipeline while it follows a run: stopped (Ctrl-C, a closed terminal), what it leaves behind; a run that
ends while the server cannot tell its stages, the run's exit status and where to look. Run in a copy of the
script beside stand-ins for what it calls (bootstrap, ``wiki-pipeline``, ``prefect``, a server that answers only
``/health``), so no Prefect server or runner is started: only the script's own handling is under test."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support import REPO

SECRET_URL = "https://alice:S3CRET@mirror.example.org/w.zip?token=T0KEN-abc"
UUID = "0b4a7a3e-0000-4000-8000-000000000001"

WIKI_PIPELINE = f"""#!/bin/sh
case "$1" in
  params) echo '{{"corpus": {{"source_url": "{SECRET_URL}"}}}}' ;;
  serve) echo "your flow 'wiki-pipeline' is being served"; sleep 300 ;;
esac
"""
# `prefect deployment run NAME --params JSON --watch`: what Prefect prints of a created run (its parameters too),
# then the watch: until the script is stopped, or ending with FAKE_WATCH_EXIT
PREFECT = f"""#!/bin/sh
echo "Created flow run 'calm-fox'."
echo "└── UUID: {UUID}"
echo "└── Parameters: $5"
[ -n "${{FAKE_WATCH_EXIT:-}}" ] && {{ echo "Flow run finished (fake)."; exit "$FAKE_WATCH_EXIT"; }}
sleep 300
"""


def _task_run(name: str, minute: int, state: str, state_name: str, message: str) -> dict:
    return {
        "id": f"01a234d3-6186-7a67-8c44-4a6665c3ea{minute:02d}",
        "name": name,
        "flow_run_id": UUID,
        "task_key": f"{name}-53eff2e8",
        "dynamic_key": "0",
        "expected_start_time": f"2026-12-02T03:{minute:02d}:00Z",
        "state": {
            "type": state,
            "name": state_name,
            "message": message,
            "timestamp": f"2026-12-02T03:{minute:02d}:01Z",
        },
    }


#: What a real server held for a run whose process was SIGKILLed in the model stage (a Crashed flow run): the
#: stage it died in stays Running.
CRASHED_IN_MODEL = [
    _task_run("corpus", 30, "COMPLETED", "Cached", "reused corpus/4edfe463fdda · 1.1 MB"),
    _task_run("model", 31, "RUNNING", "Running", ""),
]


class _Health(http.server.BaseHTTPRequestHandler):
    """``/health`` answers; the task runs the script reads are :data:`CRASHED_IN_MODEL` when the server's
    ``task_runs`` is set, else a 503, as a server going down."""

    task_runs: list | None = None

    def do_GET(self):
        if self.path.endswith("/health"):
            self.send_response(200)
        elif "/csrf-token" in self.path and self.task_runs is not None:  # what a server without CSRF says
            self.send_response(422)
        elif self.path.endswith("/task_runs/filter") and self.task_runs is not None:
            body = json.dumps(self.task_runs).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        else:
            self.send_response(503)
        self.end_headers()
        self.wfile.write(b'{"detail": "CSRF protection is disabled."}' if "/csrf-token" in self.path else b"true")

    do_POST = do_GET

    def log_message(self, *args):
        pass


def _fake_repo(root: Path) -> Path:
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "pipeline", root / "scripts" / "pipeline")
    bins = root / ".venv" / "bin"
    bins.mkdir(parents=True)
    for path, text in (
        (root / "scripts" / "bootstrap", "#!/bin/sh\nexit 0\n"),
        (bins / "wiki-pipeline", WIKI_PIPELINE),
        (bins / "prefect", PREFECT),
        (bins / "python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'),
    ):
        path.write_text(text, encoding="utf-8")
        path.chmod(0o755)
    return root


def _script(tmp_path: Path, task_runs: list | None = None, **env_more: str):
    """(the script's process, its PREFECT_HOME, the fake server), in a fake repo under ``tmp_path``."""
    repo = _fake_repo(tmp_path / "repo")
    home = tmp_path / "prefect-home"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Health,), {"task_runs": task_runs}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PREFECT", "WIKI_PIPELINE_"))},
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{server.server_address[1]}/api",
        "PREFECT_CLIENT_MAX_RETRIES": "0",
        **env_more,
    }
    proc = subprocess.Popen(
        [str(repo / "scripts" / "pipeline")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal's foreground job is
        # the signals at their defaults, as a terminal starts it: a signal this process ignores (one an earlier test
        # or library set) would be ignored by the script too, and a shell cannot trap one ignored on entry
        preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)],
    )
    return proc, home, server


def _stop(proc, home: Path, server) -> None:
    runner = (home / "runner.pid").read_text().split()[0] if (home / "runner.pid").exists() else None
    for pgid in (proc.pid, int(runner) if runner else None):
        if pgid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    server.shutdown()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGTERM])
def test_a_script_stopped_while_it_watches_leaves_no_copy_of_the_parameters(tmp_path, sig):
    """The reviewer's: the watched run's output (Prefect prints the parameters, a source_url's credentials in
    them) went to $PREFECT_HOME/run.out, removed only when the watch ended by itself; stopped (Ctrl-C: SIGINT to
    the terminal's process group; a closed terminal: SIGHUP), the script left the file there, credentials and
    all, readable by anyone (mode 644)."""
    proc, home, server = _script(tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (home / "run.out").exists() or UUID not in (home / "run.out").read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode(errors="replace")
            time.sleep(0.1)
        os.killpg(proc.pid, sig)
        proc.wait(timeout=120)  # a deadline for a loaded machine, not a speed
    finally:
        _stop(proc, home, server)
    assert proc.returncode != 0
    left = [p.name for p in home.iterdir() if "S3CRET" in p.read_text(errors="replace")]
    assert left == [], f"{left} in $PREFECT_HOME hold the source_url's password"


@pytest.mark.parametrize("watch_exit", [0, 1])
def test_a_run_whose_stages_cannot_be_read_still_ends_with_its_status_and_where_to_look(tmp_path, watch_exit):
    """The reviewer's: after the watch, the stage lines are read from the server; a server that stopped
    answering then (a 503 here) ended the script at that read (set -e): a traceback, exit 1 for a Completed run,
    and no UI, runner log or artifacts lines. The watch's own status should stand, the stages said unreadable."""
    proc, home, server = _script(tmp_path, FAKE_WATCH_EXIT=str(watch_exit))
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        _stop(proc, home, server)
    shown = out.decode(errors="replace")
    assert proc.returncode == watch_exit, shown
    assert "Prefect UI:" in shown and "runner log:" in shown, shown
    # the parameters Prefect prints of the created run: the source_url's credentials out (the reviewer's too)
    assert "https://***@mirror.example.org/w.zip?token=***" in shown and "S3CRET" not in shown, shown
    assert not (home / "run.out").exists()


def test_a_crashed_run_names_the_stage_it_died_in():
    """The reviewer's: a flow run SIGKILLed in the model stage ends Crashed, and its model task run stays Running
    on the server (nothing finishes it); the stage lines listed final states only, so they named the stages that
    were reused and said nothing of the one the run died in."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        proc, home, server = _script(Path(tmp), CRASHED_IN_MODEL, FAKE_WATCH_EXIT="1")
        try:
            out, _ = proc.communicate(timeout=120)
        finally:
            _stop(proc, home, server)
    shown = out.decode(errors="replace")
    assert proc.returncode == 1, shown
    assert "  corpus     reused corpus/4edfe463fdda · 1.1 MB" in shown, shown
    assert re.search(r"^  model +Running: did not finish", shown, re.M), shown
