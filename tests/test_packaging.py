"""Installing Perseus leaves the user's framework stack alone, and the wheel carries everything it runs.

- setup.py (read as text, never run) puts no upper bound and no exact pin on torch, numpy,
  nvidia-ml-py, megatron-core or deepspeed in ``install_requires`` or a user-facing extra, so pip
  never downgrades or replaces what a CUDA container ships; pins for the tests stay in the ``dev``
  extra and constraints.txt. The base install has no nvidia-* package (NVML's binding is ``gpu``).
- pip, offline, resolves ``.[megatron,deepspeed,...]`` against the installed packages without
  replacing any of them.
- A wheel built from the tree holds every package, the data files the code loads, and the
  ``perseus`` console script, and imports from where it is installed.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The packages a CUDA container or a cluster's environment already holds, and that Perseus must not replace.
FRAMEWORKS = frozenset({"torch", "numpy", "nvidia-ml-py", "megatron-core", "deepspeed"})
# Extras kept for the project's own tests and benchmarks, where pins make runs reproducible.
DEVELOPER_EXTRAS = frozenset({"dev", "bench"})
UPPER_OPERATORS = frozenset({"<", "<=", "==", "===", "~="})


def setup_keywords() -> dict[str, Any]:
    """The literal keyword arguments of the ``setup(...)`` call in setup.py, without running it."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup"]
    assert len(calls) == 1, "setup.py must make one setup(...) call"
    keywords: dict[str, Any] = {}
    for keyword in calls[0].keywords:
        try:
            keywords[str(keyword.arg)] = ast.literal_eval(keyword.value)
        except ValueError:
            continue  # a computed value (the long description, the package list)
    return keywords


def _requirement(text: str) -> Any:
    from packaging.requirements import Requirement

    return Requirement(text)


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def replacing_pins(requirements: list[str]) -> list[str]:
    """The requirements on a framework package that could force pip to downgrade or replace it."""
    bad = []
    for text in requirements:
        requirement = _requirement(text)
        if _canonical(requirement.name) not in FRAMEWORKS:
            continue
        if any(spec.operator in UPPER_OPERATORS for spec in requirement.specifier):
            bad.append(text)
    return bad


def user_requirements(keywords: dict[str, Any]) -> dict[str, list[str]]:
    """``install_requires`` and every extra a user installs, by name."""
    groups = {"install_requires": list(keywords["install_requires"])}
    groups.update({f"[{extra}]": list(reqs) for extra, reqs in keywords["extras_require"].items()
                   if extra not in DEVELOPER_EXTRAS})
    return groups


@pytest.fixture(scope="module")
def keywords() -> dict[str, Any]:
    pytest.importorskip("packaging")
    return setup_keywords()


def test_no_user_requirement_caps_or_pins_a_framework_package(keywords):
    for group, requirements in user_requirements(keywords).items():
        assert replacing_pins(requirements) == [], f"{group} would make pip replace an installed package"


def test_the_check_catches_an_upper_bound_and_an_exact_pin():
    pytest.importorskip("packaging")
    assert replacing_pins(["torch==2.13.0", "megatron-core>=0.16,<0.20", "DeepSpeed~=0.19", "numpy<3",
                           "nvidia_ml_py<=13"]) == ["torch==2.13.0", "megatron-core>=0.16,<0.20", "DeepSpeed~=0.19",
                                                    "numpy<3", "nvidia_ml_py<=13"]
    assert replacing_pins(["torch>=2.1", "deepspeed>=0.19,!=0.19.3", "scipy<2"]) == []


def test_the_base_install_brings_no_framework_and_no_nvidia_package(keywords):
    """``pip install perseus-energy`` installs neither torch nor any nvidia-* package; NVML's Python
    binding (nvidia-ml-py, not the deprecated ``pynvml`` package) is the ``gpu`` extra, and the
    ``dev`` extra keeps it for the NVML paths' tests."""
    names = {_canonical(_requirement(text).name) for text in keywords["install_requires"]}
    assert not names & {"torch", "megatron-core", "deepspeed"}
    assert {name for name in names if name.startswith("nvidia")} == set()
    extras = keywords["extras_require"]
    assert [_canonical(_requirement(text).name) for text in extras["gpu"]] == ["nvidia-ml-py"]
    assert "nvidia-ml-py" in {_canonical(_requirement(text).name) for text in extras["dev"]}
    every = [text for reqs in extras.values() for text in reqs] + keywords["install_requires"]
    assert "pynvml" not in {_canonical(_requirement(text).name) for text in every}


def test_without_the_gpu_extra_the_gpu_layer_names_the_fix_in_one_line(monkeypatch):
    """No pynvml: the NVML backend's error is one line naming ``pip install "perseus-energy[gpu]"``
    (and the simulated GPU), and ``perseus doctor`` reports it as a finding, not a traceback."""
    import sys

    from perseus.gpu.errors import GPULibraryMissingError
    from perseus.gpu.nvml.device import load_pynvml

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml fails, as without the extra
    with pytest.raises(GPULibraryMissingError) as info:
        load_pynvml()
    message = str(info.value)
    assert "\n" not in message and 'pip install "perseus-energy[gpu]"' in message and "PERSEUS_GPU=sim" in message

    from perseus.cli import doctor_checks

    facts = doctor_checks.NodeFacts()
    doctor_checks.check_nvml(facts, quick=True)
    (finding,) = facts.findings
    assert finding.check == "NVML" and finding.status == doctor_checks.FAIL
    assert "nvidia-ml-py" in finding.detail and 'pip install "perseus-energy[gpu]"' in finding.fix


def test_the_developer_pins_stay_where_the_tests_use_them(keywords):
    """The versions the suite runs are pinned for CI, not for users."""
    dev = {_canonical(_requirement(text).name): text for text in keywords["extras_require"]["dev"]}
    assert replacing_pins([dev["megatron-core"], dev["deepspeed"]]), "dev keeps the tested release lines"
    constraints = (ROOT / "constraints.txt").read_text().split()
    assert "torch==2.13.0" in constraints


def _copy_source(dest: Path) -> Path:
    """The files a build reads (setup.py, the README, MANIFEST.in, the packages), without build leftovers."""
    dest.mkdir()
    for name in ("setup.py", "README.md", "MANIFEST.in"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)
    for package in top_level_packages():
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def top_level_packages() -> list[str]:
    return sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file())


def _pip(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_pip_resolves_the_extras_offline_without_replacing_an_installed_package(keywords, tmp_path):
    """With the framework stack installed, ``pip install '.[megatron,deepspeed,...]'`` (no index, dry
    run) would install Perseus alone: every requirement is met by what is there."""
    extras = sorted(extra for extra in keywords["extras_require"] if extra not in DEVELOPER_EXTRAS)
    wanted = [_requirement(text) for text in keywords["install_requires"]]
    wanted += [_requirement(text) for extra in extras for text in keywords["extras_require"][extra]]
    missing = []
    for requirement in wanted:
        try:
            importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(requirement.name)
    if missing:
        pytest.skip(f"needs {', '.join(sorted(set(missing)))} installed to resolve offline")
    source = _copy_source(tmp_path / "src")
    report = tmp_path / "report.json"
    done = _pip("install", "--dry-run", "--no-index", "--no-build-isolation", "--report", str(report),
                f"{source}[{','.join(extras)}]", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    installs = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert installs == ["perseus-energy"], f"pip would also install or replace {installs}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the tree (``pip wheel``: offline, with the installed setuptools)."""
    work = tmp_path_factory.mktemp("wheel")
    source = _copy_source(work / "src")
    done = _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(work / "out"), str(source),
                cwd=work)
    assert done.returncode == 0, done.stderr[-2000:]
    (built,) = (work / "out").glob("perseus_energy-*.whl")
    return built


def test_the_wheel_holds_every_package_its_data_and_the_console_script(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for package in top_level_packages():
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                expected.add(path.relative_to(ROOT).as_posix())
    assert expected - names == set(), "the wheel misses files the packages hold (package_data in setup.py)"
    assert {"perseus/examples/synthetic_a100_4stage.csv", "perseus/output/templates/report.html.j2"} <= names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "perseus = perseus.cli:main" in text and "demo = perseus_demo.cli:add_demo_command" in text
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    requires = [line.removeprefix("Requires-Dist: ").split(";")[0].strip()
                for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist: ") and "extra == \"dev\"" not in line
                and "extra == \"bench\"" not in line]
    assert requires and replacing_pins(requires) == []
    description = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Description-Content-Type: text/markdown" in description
    assert "\n# perseus\n" in description, "the README is the long description, wherever the build runs from"


def test_the_source_distribution_carries_what_users_read_and_copy(tmp_path):
    """MANIFEST.in: the README, the changelog, the constraints, the patches, deploy/ and the docs."""
    source = _copy_source(tmp_path / "src")
    for name in ("CHANGELOG.md", "constraints.txt"):
        shutil.copy2(ROOT / name, source / name)
    for folder in ("patches", "deploy", "docs"):
        shutil.copytree(ROOT / folder, source / folder)
    done = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "out")], cwd=source,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    (sdist,) = (tmp_path / "out").glob("perseus_energy-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    expected = {"README.md", "CHANGELOG.md", "constraints.txt", "perseus/examples/synthetic_a100_4stage.csv",
                "docs/clock-access.md"}
    expected |= {p.relative_to(ROOT).as_posix() for folder in ("patches", "deploy") for p in (ROOT / folder).rglob("*")
                 if p.is_file()}
    assert expected - names == set()


def test_the_installed_wheel_imports_and_finds_its_data(wheel, tmp_path):
    site = tmp_path / "site"
    done = _pip("install", "--no-deps", "--no-index", "--target", str(site), str(wheel), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    script = tmp_path / "check.py"
    script.write_text(
        "import perseus, perseus_megatron, perseus_deepspeed, perseus_torch, perseus_demo\n"
        "from perseus.examples import example_profile_path\n"
        "from perseus.output.report_page import TEMPLATES\n"
        f"assert perseus.__file__.startswith({str(site)!r}), perseus.__file__\n"
        "assert example_profile_path().is_file() and (TEMPLATES / 'report.html.j2').is_file()\n"
        "from perseus.cli import main\n"
        "raise SystemExit(main(['--version']))\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("perseus ")
    assert (site / "bin" / "perseus").is_file(), "the console script"
