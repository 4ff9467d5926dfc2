"""The layer rule of docs/ARCHITECTURE.md, checked on the source: who may import whom, no import cycles, no
``sys.path`` edits in the product, and ``import mygpt`` stays free of torch and Prefect."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

PRODUCT = ("mygpt", "tasks", "flows")
#: package -> the first-party packages it may import (itself included)
ALLOWED = {
    "mygpt": {"mygpt"},
    "tasks": {"mygpt", "tasks"},
    "flows": {"mygpt", "tasks", "flows"},
    "bench": {"mygpt", "tasks", "flows", "bench"},
    "tests": {"mygpt", "tasks", "flows", "tests"},
}
#: third-party packages a layer must not import
FORBIDDEN_THIRD_PARTY = {"mygpt": {"prefect", "prefect_dask"}}


def _modules() -> dict[str, Path]:
    found = {}
    for package in ALLOWED:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """Every module ``name`` imports (at module level or inside a function), resolved to absolute names."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, node.lineno))
            # `from package import module` imports the submodule
            out += [(f"{target}.{alias.name}", node.lineno) for alias in node.names if f"{target}.{alias.name}" in MODULES]
    return out


def _first_party(target: str) -> str | None:
    """The module of ours that ``target`` names (itself, or the longest known prefix)."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in MODULES:
            return ".".join(parts[:n])
    return None


def test_every_layer_imports_only_what_it_may():
    wrong = []
    for name, path in MODULES.items():
        layer = name.split(".")[0]
        for target, line in _imports(name, path):
            top = target.split(".")[0]
            if top in ALLOWED and top not in ALLOWED[layer]:
                wrong.append(f"{path.relative_to(REPO)}:{line} ({layer}) imports {target}")
            if top in FORBIDDEN_THIRD_PARTY.get(layer, ()):
                wrong.append(f"{path.relative_to(REPO)}:{line} ({layer}) imports {target}")
    assert not wrong, "layer rule broken:\n" + "\n".join(wrong)


def test_no_import_cycles_in_the_product():
    graph = {name: set() for name in MODULES if name.split(".")[0] in PRODUCT}
    for name in graph:
        for target, _ in _imports(name, MODULES[name]):
            mod = _first_party(target)
            if mod in graph and mod != name and not (name.startswith(mod + ".") and MODULES[mod].name == "__init__.py"):
                graph[name].add(mod)
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _is_sys_path(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def test_no_sys_path_edits_outside_tests():
    edits = []
    for name, path in MODULES.items():
        if name.startswith("tests"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            called_on_sys_path = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and _is_sys_path(node.func.value)
            assigned = isinstance(node, (ast.Assign, ast.AugAssign)) and any(
                _is_sys_path(t) for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
            if called_on_sys_path or assigned:
                edits.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not edits, "sys.path is edited in: " + ", ".join(edits)


@pytest.mark.parametrize("statement", ["import mygpt", "import mygpt.bpe, mygpt.bpe_encode, mygpt.bpe_train, "
                                                       "mygpt.bpe_reference, mygpt.tokenizer, mygpt.errors"])
def test_importing_the_library_loads_no_torch_and_no_prefect(statement):
    code = f"{statement}\nimport sys\nprint(sorted(m for m in ('torch', 'prefect') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_rule_checker_sees_a_violation(tmp_path):
    """The checker itself works: a tasks module importing flows is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom flows.settings import Pipeline\n\ndef f():\n    from . import stage\n")
    got = _imports("tasks.bad", bad)
    assert ("flows.settings", 2) in got and ("tasks.core.stage", 5) in got
