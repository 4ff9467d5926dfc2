"""What ``wiki-pipeline run`` prints when a run stops on an error the user can fix: the ``error:`` line alone
(no Prefect traceback of it, its message once), exit 2; the real CLI against a real local Prefect server."""

from __future__ import annotations

import os
import subprocess

from tests.support import REPO
from tests.support.small_disk import small_disk
from tests.support.tiny import tiny_run_command, tiny_zip_url


def run_cli(prefect_server, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(argv),
        cwd=REPO,
        env={**os.environ, **prefect_server.env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_user_error_inside_the_run_is_the_error_line_alone(prefect_server, tmp_path):
    missing = tmp_path / "nothere.zip"
    done = run_cli(prefect_server, *tiny_run_command(missing.as_uri(), tmp_path / "art"))
    message = f"there is no file {missing}; check the path"
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout, done.stderr[-3000:]
    assert done.stderr.count(message) == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == f"error: source_url {missing.as_uri()!r}: {message}"


def test_a_full_disk_is_one_error_line_naming_the_stage_and_the_path(prefect_server, tmp_path):
    with small_disk(tmp_path / "disk") as disk:
        done = run_cli(prefect_server, *tiny_run_command(tiny_zip_url(tmp_path), disk))
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Errno 28" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: corpus: no space left on the device writing {disk}"), last
    assert "(a filesystem of 1.0 MB, " in last and "wiki-pipeline gc --yes" in last, last


def test_an_error_that_is_not_the_users_keeps_its_traceback():
    """The filter drops only a UserError's records: another exception's record passes, traceback and all."""
    import logging

    from flows.console_errors import UserErrorRecords
    from mygpt.errors import UserError

    records = UserErrorRecords()

    def record(name: str, message: str, exc: BaseException | None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc is not None else None
        return logging.LogRecord(name, logging.ERROR, __file__, 1, message, None, info)

    assert records.filter(record("prefect.task_runs", "Error encountered", RuntimeError("disk on fire")))
    assert not records.filter(record("prefect.task_runs", "Error encountered", UserError("give a path")))
    assert not records.filter(record("prefect.flow_runs", "Finished in state Failed('UserError: give a path')", None))
    assert records.filter(record("prefect.flow_runs", "Finished in state Failed('RuntimeError: disk on fire')", None))
    assert records.filter(record("wiki_pipeline.corpus", "the user's own words: give a path", None))
