"""The GPU layer's modules import one way: no cycle, checked statically and in fresh interpreters.

Statically, every ``perseus.gpu`` import counts (function-local and ``TYPE_CHECKING`` ones too), so
a lazy import that closes a cycle fails here before it bites at run time. Package ``__init__``
files only gather names and are left out of the graph.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "perseus" / "gpu"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_module_name(p) for p in GPU.rglob("*.py"))
PACKAGES = {_module_name(p) for p in GPU.rglob("__init__.py")}


def _edges(module: str) -> set[str]:
    """The non-package ``perseus.gpu`` modules that ``module`` imports (``from pkg import mod`` too)."""
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {m for m in found if m in MODULES and m not in PACKAGES and m != module}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_gpu_modules_form_no_import_cycle():
    graph = {m: _edges(m) for m in MODULES if m not in PACKAGES}
    assert _cycle(graph) is None, " → ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_only_the_factory_and_the_simulator_import_the_simulator():
    outside = [m for m in MODULES if not m.startswith("perseus.gpu.sim") and m not in ("perseus.gpu", "perseus.gpu.factory")]
    assert [m for m in outside if any(e.startswith("perseus.gpu.sim") for e in _edges(m))] == []


@pytest.mark.parametrize("module", MODULES)
def test_each_gpu_module_imports_alone_in_a_fresh_interpreter(module):
    done = subprocess.run([sys.executable, "-W", "error", "-c", f"import {module}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
