"""The documentation site builds with ``mkdocs build --strict`` (no broken link or anchor, no page
outside the navigation), its navigation holds the user guides apart from the design notes and the
measurement records, and the troubleshooting page names every error class Perseus raises."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("perseus", "perseus_megatron", "perseus_deepspeed", "perseus_torch", "perseus_demo")
USER_GUIDES = ("install.md", "getting-started.md", "clock-access.md", "megatron.md", "deepspeed.md",
               "torch-pipelining.md", "observability.md", "troubleshooting.md")


def test_mkdocs_build_strict_passes(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()
    assert (tmp_path / "site" / "troubleshooting" / "index.html").is_file()


def _nav() -> str:
    return (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]


def _section(nav: str, title: str) -> str:
    return nav.split(f"  - {title}:\n", 1)[1].split("\n  - ", 1)[0]


def test_the_navigation_keeps_guides_references_design_notes_and_records_apart():
    nav = _nav()
    guides = _section(nav, "User guide")
    assert all(f": {page}" in guides for page in USER_GUIDES)
    assert "reference/config.md" in _section(nav, "Reference") and "reference/cli.md" in _section(nav, "Reference")
    design = _section(nav, "Design notes")
    assert all(page in design for page in ("architecture.md", "runtime.md", "planner.md", "gpu.md"))
    records = _section(nav, "Measurement records")
    assert all(f"benchmarks/{p.name}" in records for p in (ROOT / "docs" / "benchmarks").glob("*.md"))


def test_setup_has_a_docs_extra_and_dev_installs_mkdocs_pinned():
    text = (ROOT / "setup.py").read_text()
    assert re.search(r'"docs": \["mkdocs-material>=[\d.]+"\]', text)
    dev = text.split('"dev":', 1)[1]
    assert '"mkdocs-material' in dev, "scripts/test_all.sh builds the site, so .ci/run must install mkdocs"
    assert re.search(r"^mkdocs-material==\S+$", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    assert "mkdocs build --strict" in (ROOT / "scripts" / "test_all.sh").read_text()


def perseus_error_classes() -> dict[str, str]:
    """Every class that derives from ``PerseusError`` in the packages (read from the source, so no
    framework needs importing), by name -> the file that defines it."""
    bases: dict[str, tuple[list[str], str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    names = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                             for b in node.bases]
                    bases.setdefault(node.name, (names, path.relative_to(ROOT).as_posix()))
    errors = {"PerseusError"}
    grew = True
    while grew:
        grew = False
        for name, (parents, _) in bases.items():
            if name not in errors and any(p in errors for p in parents):
                errors.add(name)
                grew = True
    return {name: bases[name][1] for name in sorted(errors)}


def test_troubleshooting_names_every_error_with_its_own_heading():
    classes = perseus_error_classes()
    assert {"PerseusError", "ConfigError", "GPUPermissionError", "NoClockAccess", "MegatronVersionError",
            "NVMLBindingMissingError", "UnsupportedTorchSchedule"} <= set(classes)
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    headings = set(re.findall(r"^### (\w+)$", page, re.MULTILINE))
    missing = {name: where for name, where in classes.items() if name not in headings}
    assert not missing, f"docs/troubleshooting.md has no '### Name' section (what it says, the fix) for {missing}"
    assert headings <= set(classes), f"sections for classes that do not exist: {headings - set(classes)}"


def test_the_error_scan_finds_a_subclass_of_a_subclass(tmp_path):
    """What the test above relies on: a class two levels below PerseusError is found."""
    classes = perseus_error_classes()
    assert classes["ClockdRefusedError"] == "perseus/gpu/clockd/client.py"  # GPUPermissionError < GPUError
    assert classes["NoClockAccess"] == "perseus/gpu/clock_service.py"  # ConfigError < PerseusError
