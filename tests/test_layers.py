"""What import-linter (pyproject.toml) cannot say: no ``sys.path`` edits outside ``tests/``, and ``import mygpt``
loads neither torch nor Prefect."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.support import REPO

PRODUCT = ("mygpt", "tasks", "flows")


def _is_sys_path(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def test_no_sys_path_edits_outside_tests():
    edits = []
    for path in sorted(p for package in (*PRODUCT, "bench") for p in (REPO / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            called_on_sys_path = (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_sys_path(node.func.value)
            )
            assigned = isinstance(node, (ast.Assign, ast.AugAssign)) and any(
                _is_sys_path(t) for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            )
            if called_on_sys_path or assigned:
                edits.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not edits, "sys.path is edited in: " + ", ".join(edits)


@pytest.mark.parametrize(
    "statement",
    [
        "import mygpt",
        "import mygpt.tokenizers.bpe, mygpt.tokenizers.bpe_chunks, mygpt.tokenizers.bpe_word_encoder",
        "import mygpt.tokenizers.bpe_train",
        "import mygpt.tokenizers.bpe_reference, mygpt.tokenizers.files, mygpt.errors",
        "import mygpt.gpt_config, mygpt.limits, mygpt.metrics, mygpt.training.launcher",
        "import mygpt.export.publish; mygpt.GPTConfig",
    ],
)
def test_importing_the_library_loads_no_torch_and_no_prefect(statement):
    code = f"{statement}\nimport sys\nprint(sorted(m for m in ('torch', 'prefect') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_file_directly_in_tasks_is_a_stage_or_the_registry():
    """docs/ARCHITECTURE.md's rule: a module directly in ``tasks/`` is a registered stage (or the registry);
    anything a stage stands on lives in a room (a folder) of ``tasks/``."""
    from tasks.registry import NAMES

    allowed = {"__init__", "registry", *NAMES}
    loose = sorted(p.name for p in (REPO / "tasks").glob("*.py") if p.stem not in allowed)
    assert not loose, f"move {loose} into a room of tasks/ (core/, store/, corpora/, sources/)"
