"""Real test text that is absent: under CI (``CI=true``) the tests that need it fail; elsewhere they are skipped
with a reason that says where to put it. Run as a real pytest in a subprocess, with the folder pointed elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import REPO

NEEDS_TEXT = """
from tests.support.tiny import tiny_zip_url


def test_needs_shakespeare(shakespeare_text):
    assert shakespeare_text


def test_needs_the_zip(tmp_path):
    assert tiny_zip_url(tmp_path)
"""


def _pytest(tmp_path, ci: str | None) -> subprocess.CompletedProcess:
    test_file = REPO / "tests" / f"test_needs_text_{os.getpid()}_{ci}.py"  # inside tests/: its conftest applies
    test_file.write_text(NEEDS_TEXT, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["WIKI_PIPELINE_SHARED_DATA"] = str(tmp_path / "no-shared-data")
    if ci is not None:
        env["CI"] = ci
    try:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-rsf", "-q", str(test_file)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        test_file.unlink()


def test_absent_real_text_fails_under_ci(tmp_path):
    done = _pytest(tmp_path, "true")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed, 1 error" in done.stdout, done.stdout[-3000:]  # the fixture's failure is an error at setup
    assert f"real test text is absent under CI (CI=true): {tmp_path / 'no-shared-data'}" in done.stdout


def test_absent_real_text_is_a_skip_that_says_where_to_put_it_elsewhere(tmp_path):
    done = _pytest(tmp_path, None)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 skipped" in done.stdout, done.stdout[-3000:]
    assert f"put tinyshakespeare.txt and wikitext2-valid.txt in {tmp_path / 'no-shared-data'}" in done.stdout


def test_ci_runs_with_ci_set():
    """CI's entry point exports CI=true itself, whatever the CI service sets."""
    lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "export CI=true" in lines
    assert lines.index("export CI=true") < lines.index("scripts/test")
