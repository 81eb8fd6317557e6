"""The layers point one way: checked on the source, so a new import that breaks them fails here.

- packages sit in layers (``LAYERS``, lowest first); a module imports only from its own layer or
  lower ones, so planning code never reaches the runtime, the GPU layer or an adapter and runs
  anywhere (a laptop, CI, a login node);
- the data core and the planner never import torch or a framework;
- the library's modules import each other without a cycle (imports inside functions and under
  ``TYPE_CHECKING`` count);
- nothing in the library (``perseus``, the adapters) imports the demo package;
- the adapters reach the runtime only through ``perseus.runtime``'s public names.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ["perseus", "perseus_megatron", "perseus_deepspeed", "perseus_torch"]
ADAPTERS = ["perseus_megatron", "perseus_deepspeed", "perseus_torch"]

# Lowest first. A name is a package or module prefix; the longest matching prefix places a module.
LAYERS: list[tuple[str, ...]] = [
    ("perseus.errors", "perseus.atomic", "perseus.versions"),
    ("perseus.schedules",),
    ("perseus.profile", "perseus.frontier", "perseus.examples"),
    ("perseus.timeline", "perseus.store", "perseus.carbon"),
    ("perseus.planner", "perseus.timeline.emulator", "perseus.measured"),
    ("perseus.output",),
    # the GPU layer's rooms, lowest first: the device contract; instruments and the stream, which
    # need only the contract; the backends; the one device chooser; the controller; clockd; the one
    # clock-path chooser and the package's re-exports on top
    ("perseus.gpu.errors", "perseus.gpu.spec", "perseus.gpu.device"),
    ("perseus.gpu.meter",),
    ("perseus.gpu.stream",),
    ("perseus.gpu.nvml", "perseus.gpu.sim", "perseus.gpu.zeusd"),
    ("perseus.gpu.factory",),
    ("perseus.gpu.control",),
    ("perseus.gpu.clockd",),
    ("perseus.gpu.clock_service", "perseus.gpu"),
    # the runtime's rooms, lowest first; its top (engine, attachment, the package) sits above them all
    ("perseus.runtime.errors", "perseus.runtime.job", "perseus.runtime.config", "perseus.runtime.phases",
     "perseus.runtime.lifecycle"),
    ("perseus.runtime.plane",),
    ("perseus.runtime.port",),
    ("perseus.runtime.measure",),
    ("perseus.runtime.supply",),
    ("perseus.runtime.clocks",),
    ("perseus.runtime.guard",),
    ("perseus.runtime.observe",),
    ("perseus.runtime",),
    ("perseus_megatron", "perseus_deepspeed", "perseus_torch"),
    ("perseus", "perseus.cli", "perseus_demo"),
]
DATA_CORE_LAYERS = 6  # errors .. output: pure computation and files
FRAMEWORKS = ("torch", "megatron", "deepspeed")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files(packages: list[str]) -> list[Path]:
    return [p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py"))]


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


def _layer(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, names in enumerate(LAYERS):
        for name in names:
            if _is_under(module, name) and (best is None or len(name) > best[0]):
                best = (len(name), index)
    return None if best is None else best[1]


def _targets(module: str, names: list[str], known: set[str]) -> list[str]:
    """The library modules an import statement loads: ``from pkg import sub`` is ``pkg.sub``."""
    subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in known]
    if subs and len(subs) == len(names):
        return subs
    while module and module not in known:
        module = module.rpartition(".")[0]
    return ([module] if module else []) + subs


def _graph(packages: list[str]) -> dict[str, list[tuple[int, str]]]:
    files = {_module_name(p): p for p in _files(packages)}
    known = set(files)
    return {name: [(line, t) for line, module, names in _imports(path) for t in _targets(module, names, known) if t != name]
            for name, path in files.items()}


def _layer_violations(packages: list[str]) -> list[str]:
    problems = []
    for name, deps in _graph(packages).items():
        mine = _layer(name)
        for line, target in deps:
            theirs = _layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                problems.append(f"{name}:{line} imports {target} (layer {theirs} above its own {mine})")
    return problems


def _cycles(graph: dict[str, list[tuple[int, str]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(t for _, t in graph.get(root, [])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(t for _, t in graph.get(child, []))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_library_module_has_a_layer():
    assert [m for m in _graph(LIBRARY + ["perseus_demo"]) if _layer(m) is None] == []


def test_imports_point_down_the_layers():
    assert _layer_violations(LIBRARY + ["perseus_demo"]) == []


def test_the_library_import_graph_has_no_cycles():
    assert _cycles(_graph(LIBRARY)) == []


def test_data_core_and_planner_import_no_framework():
    core = [p for p in _files(["perseus"]) if (_layer(_module_name(p)) or 0) < DATA_CORE_LAYERS]
    assert core, "no data-core modules found"
    problems = [f"{p.relative_to(ROOT)}:{line} imports {module}" for p in core for line, module, _ in _imports(p)
                if any(_is_under(module, f) for f in FRAMEWORKS)]
    assert problems == []


def test_library_never_imports_the_demo_package():
    problems = [f"{p.relative_to(ROOT)}:{line} imports {module}" for p in _files(LIBRARY)
                for line, module, _ in _imports(p) if _is_under(module, "perseus_demo")]
    assert problems == []


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
    ("def f():\n    from perseus.runtime.engine import PerseusRuntime\n", [(2, "perseus.runtime.engine")]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from perseus.gpu.device import GPUDevice\n",
     [(3, "perseus.gpu.device")]),
    ("from perseus.errors import ScheduleError\n", []),
])
def test_the_layer_checker_sees_local_and_type_checking_imports(tmp_path, monkeypatch, source, expected):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for module in ("perseus/schedules/x.py", "perseus/runtime/engine.py", "perseus/gpu/device.py", "perseus/errors.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text(source if module.endswith("x.py") else "")
    own = _layer("perseus.schedules.x")
    assert _layer_violations(["perseus"]) == [f"perseus.schedules.x:{line} imports {target} (layer {_layer(target)} above "
                                              f"its own {own})" for line, target in expected]


def test_the_cycle_finder_sees_a_cycle_through_a_function_local_import():
    graph = {"a": [(1, "b")], "b": [(3, "c")], "c": [(9, "a")], "d": [(1, "a")]}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": [(1, "b")], "b": []}) == []


MAX_MODULES_PER_ROOM = 10  # a room that needs more holds a second concept: give it a room of its own
ENGINE_MAX_LINES = 450  # the engine keeps the hooks and the phase transitions; the rest has rooms


def test_the_runtime_s_rooms_stay_small():
    runtime = ROOT / "perseus" / "runtime"
    rooms = {runtime: sorted(runtime.glob("*.py"))}
    rooms.update({d: sorted(d.glob("*.py")) for d in sorted(runtime.iterdir()) if (d / "__init__.py").is_file()})
    crowded = {str(d.relative_to(ROOT)): len(m) for d, m in rooms.items() if len(m) > MAX_MODULES_PER_ROOM}
    assert crowded == {}, f"more than {MAX_MODULES_PER_ROOM} modules in a room: {crowded}"
    lines = len((runtime / "engine.py").read_text().splitlines())
    assert lines <= ENGINE_MAX_LINES, f"perseus/runtime/engine.py has {lines} lines (at most {ENGINE_MAX_LINES})"


GPU_TOP_MAX_MODULES = 6  # the device contract, its spec and errors, the device chooser, the clock-path chooser
MAX_MODULE_LINES = 500


def _rooms(package: Path) -> dict[Path, list[Path]]:
    """The package's own modules, and each sub-package's, by folder."""
    rooms = {package: sorted(package.glob("*.py"))}
    rooms.update({d: sorted(d.glob("*.py")) for d in sorted(package.rglob("*")) if (d / "__init__.py").is_file()})
    return rooms


def test_the_gpu_layer_s_rooms_stay_small():
    gpu = ROOT / "perseus" / "gpu"
    rooms = _rooms(gpu)
    top = len(rooms.pop(gpu))
    assert top <= GPU_TOP_MAX_MODULES, f"perseus/gpu/ has {top} modules directly inside (at most {GPU_TOP_MAX_MODULES})"
    crowded = {str(d.relative_to(ROOT)): len(m) for d, m in rooms.items() if len(m) > MAX_MODULES_PER_ROOM}
    assert crowded == {}, f"more than {MAX_MODULES_PER_ROOM} modules in a room: {crowded}"
    long = {str(p.relative_to(ROOT)): n for p in gpu.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"GPU-layer modules over {MAX_MODULE_LINES} lines: {long}"


PROFILE_MODEL_MAX_LINES = 350  # the data model only: reading, writing and transforms have modules of their own


def test_the_profile_model_holds_the_model_only():
    lines = len((ROOT / "perseus" / "profile" / "model.py").read_text().splitlines())
    assert lines <= PROFILE_MODEL_MAX_LINES, f"perseus/profile/model.py has {lines} lines (at most {PROFILE_MODEL_MAX_LINES})"


def test_the_runtime_leaves_the_choice_of_clock_service_to_the_gpu_layer():
    services = ("perseus.gpu.clockd", "perseus.gpu.zeusd")
    problems = [f"{p.relative_to(ROOT)}:{line} imports {module}" for p in _files(["perseus/runtime"])
                for line, module, names in _imports(p)
                for target in [module] + [f"{module}.{n}" for n in names] if any(_is_under(target, s) for s in services)]
    assert problems == [], "the runtime reaches clockd or zeusd (perseus.gpu.clock_service chooses)"
