"""scripts/test's pytest command: extra arguments go to pytest, as the README says."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support import REPO


def _pytest_line() -> str:
    """The line of scripts/test that runs pytest (after scripts/bootstrap and scripts/lint, which are not run here)."""
    lines = [line for line in (REPO / "scripts" / "test").read_text().splitlines() if "-m pytest" in line]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("args", [["-n", "0"], ["-p", "no:xdist"]])
def test_the_test_script_runs_one_file_in_one_process_when_asked(args):
    """`scripts/test -n 0 FILE` and pytest's own way to turn a plugin off, `scripts/test -p no:xdist FILE`: the file's
    tests are collected in this one process."""
    done = subprocess.run(
        ["bash", "-c", f"set -- {' '.join(args)} --collect-only tests/test_layers.py; {_pytest_line()}"],
        cwd=REPO,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "test_layers.py" in done.stdout
