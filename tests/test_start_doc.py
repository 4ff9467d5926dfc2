"""docs/START.md's commands run as written: each ```bash block after a ``<!-- test: fast -->`` or
``<!-- test: slow -->`` mark, in order, from a checkout of its own (links to this one's code and virtual
environment, ../shared beside it), with its artifacts, Prefect home and ports of its own."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO

START = REPO / "docs" / "START.md"
BLOCK = re.compile(r"<!-- test: (fast|slow) -->\n```bash\n(.*?)```", re.S)
LINKED = (".venv", "scripts", "flows", "tasks", "mygpt", "pyproject.toml", "constraints.txt", "prefect.yaml")


def blocks(kinds: tuple[str, ...]) -> list[str]:
    return [code for kind, code in BLOCK.findall(START.read_text(encoding="utf-8")) if kind in kinds]


@pytest.fixture
def checkout(tmp_path, wikitext2_path):
    """A checkout of its own: this one's code and .venv linked in, ../shared/data beside it."""
    from flows.server import free_port

    root = tmp_path / "checkout"
    root.mkdir()
    for name in LINKED:
        (root / name).symlink_to(REPO / name)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(wikitext2_path.parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "WIKI_PIPELINE_ALLOWED"))}
    env |= {
        "PYTHONPATH": str(REPO),  # this checkout's code, whichever checkout .venv was installed from
        "WIKI_PIPELINE_ARTIFACTS": str(tmp_path / "art"),
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "WIKI_PIPELINE_PREFECT_PORT": str(free_port()),
        "WIKI_PIPELINE_MIRROR_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    yield root, env
    subprocess.run(["scripts/pipeline", "--stop"], cwd=root, env=env, capture_output=True, timeout=120)


def run_blocks(checkout, kinds: tuple[str, ...]) -> None:
    root, env = checkout
    found = blocks(kinds)
    assert found, f"no {kinds} blocks in {START}"
    for code in found:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, (code, done.stdout[-3000:], done.stderr[-3000:])


def test_the_fast_commands_run_as_written(checkout):
    run_blocks(checkout, ("fast",))
    assert (checkout[0] / "mytok" / "tokenizer.json").is_file()


@pytest.mark.slow
def test_every_marked_command_runs_as_written(checkout):
    run_blocks(checkout, ("fast", "slow"))
    assert (Path(checkout[1]["WIKI_PIPELINE_ARTIFACTS"]) / "export").is_dir()


def test_the_readme_names_the_installed_commands_not_bare_ones():
    """A new user has no `prefect`, `wiki-pipeline` or `mygpt` on PATH: the README's commands to type (its code
    blocks, and any `prefect ...` it quotes) name .venv/bin/."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    typed = [line for block in re.findall(r"```bash\n(.*?)```", readme, re.S) for line in block.splitlines()]
    bare = [line for line in typed if re.match(r"\s*(prefect|wiki-pipeline|mygpt) ", line)]
    bare += [s for s in re.findall(r"`([^`\n]+)`", readme) if re.match(r"prefect \w", s)]
    assert not bare, bare
    assert "docs/START.md" in readme
