"""Whether a process runs a deployment's flow run: asked of Prefect, which a process that has not imported it is
spared only when no variable Prefect answers from says so."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import REPO

ASK = (
    "import sys; from tasks.sources.allowed import in_deployment_run; "
    "print(in_deployment_run(), 'prefect' in sys.modules)"
)


def _ask(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT__")}
    out = subprocess.run(
        [sys.executable, "-c", ASK], cwd=REPO, env={**clean, "PYTHONPATH": str(REPO), **env},
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return out.stdout.strip()


def test_a_process_without_prefect_is_no_deployment_run_and_prefect_stays_unimported():
    assert _ask() == "False False"


def test_a_deployment_named_in_the_environment_is_still_asked_of_prefect():
    assert _ask(PREFECT__RUNTIME__DEPLOYMENT__ID="0b4a7a3e-0000-4000-8000-000000000001") == "True True"
