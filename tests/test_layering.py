"""The layers point one way: checked on the source, so a new import that breaks them fails here.

- the data core and the planner never import torch, the runtime, the GPU layer or an adapter
  (planning runs anywhere: a laptop, CI, a login node);
- nothing in the library (``perseus``, the adapters) imports the demo package;
- the adapters reach the runtime only through ``perseus.runtime``'s public names.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA_CORE = ["perseus/schedule.py", "perseus/exchanges.py", "perseus/dag.py", "perseus/profile.py", "perseus/profile_fit.py", "perseus/simulator.py",
             "perseus/switch_timing.py", "perseus/switch_lag.py",
             "perseus/frontier.py", "perseus/frontier_file.py", "perseus/frontier_v1.py", "perseus/errors.py",
             "perseus/atomic.py", "perseus/cache.py", "perseus/planner", "perseus/emulator.py", "perseus/tables.py",
             "perseus/export.py", "perseus/plot.py", "perseus/examples"]
CORE_FORBIDDEN = ("torch", "perseus.runtime", "perseus.gpu", "perseus_megatron", "perseus_deepspeed", "perseus_torch", "perseus_demo",
                  "megatron", "deepspeed")
LIBRARY = ["perseus", "perseus_megatron", "perseus_deepspeed", "perseus_torch"]
ADAPTERS = ["perseus_megatron", "perseus_deepspeed", "perseus_torch"]


def _files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for rel in paths:
        path = ROOT / rel
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return out


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import in the file, including function-local ones."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
    return found


def _is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _violations(paths: list[str], forbidden: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line} imports {module}"
            for path in _files(paths) for line, module, _ in _imports(path)
            if any(_is_under(module, f) for f in forbidden)]


def test_data_core_and_planner_import_no_torch_runtime_gpu_or_adapter():
    assert _violations(DATA_CORE, CORE_FORBIDDEN) == []


def test_library_never_imports_the_demo_package():
    assert _violations(LIBRARY, ("perseus_demo",)) == []


def test_adapters_use_only_the_runtimes_public_names():
    import perseus.runtime

    public = set(perseus.runtime.__all__)
    problems = []
    for path in _files(ADAPTERS):
        for line, module, names in _imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if _is_under(module, "perseus.gpu"):
                problems.append(f"{where} imports the GPU layer ({module}); the runtime owns the GPU")
            elif _is_under(module, "perseus.runtime") and module != "perseus.runtime":
                problems.append(f"{where} imports {module}; use 'from perseus.runtime import ...'")
            elif module == "perseus.runtime":
                problems.extend(f"{where} imports perseus.runtime.{n}, which is not in perseus.runtime.__all__"
                                for n in names if n not in public)
    assert problems == []


@pytest.mark.parametrize("source, expected", [
    ("import torch.distributed as dist\n", ["x.py:1 imports torch.distributed"]),
    ("def f():\n    from perseus.runtime.engine import PerseusRuntime\n", ["x.py:2 imports perseus.runtime.engine"]),
    ("import torchvision\nfrom perseus.schedule import Schedule\n", []),
])
def test_the_checker_sees_local_imports_and_only_whole_package_names(tmp_path, monkeypatch, source, expected):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "x.py").write_text(source)
    assert _violations(["x.py"], CORE_FORBIDDEN) == expected
