"""perseus/versions.py is the one table of supported framework versions: the adapters' start-up
check reads it (one warning line for what is not supported), the adapters' compat modules derive
their version strings from it, ``perseus doctor`` compares the installed versions with it, and
setup.py's extras, constraints.txt and scripts/megatron_py312.sh agree with it."""

from __future__ import annotations

import ast
import re
import sys
import types
import warnings
from pathlib import Path

import pytest

from perseus import versions

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("package, version", [
    ("torch", "2.13.0"), ("torch", "2.13.0+cpu"), ("torch", "2.13.1+cu130"),
    ("megatron-core", "0.16.1"), ("megatron-core", "0.17.0"), ("megatron-core", "0.19.2"),
    ("deepspeed", "0.19.8"),
])
def test_supported_releases_have_no_problem(package, version):
    assert versions.problem(package, version) is None


@pytest.mark.parametrize("package, version, words", [
    ("torch", "2.9.0a0+nv25.09", "outside the supported releases, untested (2.13.x; tested 2.13.0)"),
    ("torch", "2.0.1", "below the supported minimum 2.1"),
    ("megatron-core", "0.20.0rc0", "outside the supported releases, untested (0.16.x–0.19.x; tested 0.16.1, 0.19.2)"),
    ("megatron-core", "0.15.3", "below the supported minimum 0.16"),
    ("deepspeed", "0.20.0", "outside the supported releases, untested (0.19.x; tested 0.19.8)"),
    ("megatron-core", "main", "outside the supported releases"),
])
def test_an_unsupported_release_is_named_with_what_is_supported(package, version, words):
    found = versions.problem(package, version)
    assert found is not None and found.startswith(f"{package} {version} is ") and words in found


def test_one_line_per_adapter_names_every_unsupported_package():
    line = versions.unsupported_line(versions.MEGATRON, installed={"torch": "2.9.0", "megatron-core": "0.20.1"})
    assert line is not None and "\n" not in line and line.startswith("perseus_megatron: ")
    assert "torch 2.9.0" in line and "megatron-core 0.20.1" in line and "docs/install.md" in line
    only_torch = versions.unsupported_line(versions.MEGATRON, ("torch",),
                                           installed={"torch": "2.13.0", "megatron-core": "0.20.1"})
    assert only_torch is None, "the packages asked for, and only those"
    assert versions.unsupported_line(versions.DEEPSPEED, installed={"torch": "2.13.0", "deepspeed": "0.19.8"}) is None
    assert versions.unsupported_line(versions.TORCH, installed={"torch": None}) is None, "not installed: not checked"


def test_the_warning_is_a_user_warning_only_where_something_is_unsupported():
    with pytest.warns(UserWarning, match="perseus_torch: torch 2.5.1 is outside the supported releases"):
        versions.warn_unsupported(versions.TORCH, installed={"torch": "2.5.1"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert versions.warn_unsupported(versions.TORCH, installed={"torch": "2.13.0+cpu"}) is None


def test_the_imported_module_s_version_wins_over_package_metadata(monkeypatch):
    """A Megatron-LM checkout's megatron.core has no package metadata (or another one's)."""
    monkeypatch.setitem(sys.modules, "megatron.core", types.SimpleNamespace(__version__="0.18.2"))
    assert versions.installed_version("megatron-core") == "0.18.2"


def test_the_adapters_compat_strings_come_from_the_table():
    from perseus_deepspeed import compat as deepspeed_compat
    from perseus_megatron import compat as megatron_compat
    from perseus_torch import compat as torch_compat

    assert megatron_compat.SUPPORTED_VERSIONS == versions.supported("megatron-core").lines_text == "0.16.x–0.19.x"
    assert deepspeed_compat.TESTED_VERSIONS == versions.supported("deepspeed").lines_text == "0.19.x"
    assert torch_compat.TESTED_VERSIONS == {"torch": "2.13"}
    assert [megatron_compat.is_supported_version(v) for v in ("0.16.1", "0.19.9", "0.20.0", "0.15.0")] == [
        True, True, False, False]


def _extras() -> dict[str, list[str]]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    (call,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"]
    (extras,) = [k.value for k in call.keywords if k.arg == "extras_require"]
    return ast.literal_eval(extras)


def test_setup_s_lower_bounds_are_the_table_s_minimums():
    """The user extras' lower bounds are where the table's support starts (the lowest across extras
    for torch, which the torch adapter needs newer)."""
    from packaging.requirements import Requirement

    lowest: dict[str, list[str]] = {}
    for extra, requirements in _extras().items():
        if extra in ("dev", "bench"):
            continue
        for text in requirements:
            req = Requirement(text)
            for spec in req.specifier:
                if spec.operator == ">=" and req.name in {row.package for row in versions.SUPPORTED}:
                    lowest.setdefault(req.name, []).append(spec.version)
    for row in versions.SUPPORTED:
        assert row.package in lowest, f"setup.py: no extra installs {row.package}"
        assert min(lowest[row.package], key=lambda v: tuple(map(int, v.split(".")))) == row.minimum, row.package


def test_the_versions_ci_runs_are_the_table_s_tested_releases():
    constraints = (ROOT / "constraints.txt").read_text()
    (torch_pin,) = re.findall(r"^torch==(\S+)$", constraints, re.MULTILINE)
    assert torch_pin in versions.supported("torch").tested
    script = (ROOT / "scripts" / "megatron_py312.sh").read_text()
    (low, high) = re.search(r'"megatron-core>=(\d+\.\d+),<(\d+\.\d+)"', script).groups()
    assert versions.release_line(low) in versions.supported("megatron-core").lines
    assert versions.release_line(high) not in versions.supported("megatron-core").lines
    assert any(versions.release_line(v) == versions.release_line(low) for v in versions.supported("megatron-core").tested)
    assert set(versions.PYTHON_TESTED) == {"3.11", "3.12"}


def _stop(*args, **kwargs):
    raise RuntimeError("stopped after the version check")


def test_perseus_torch_warns_at_start(monkeypatch):
    import perseus_torch.integration as integration

    monkeypatch.setattr(versions, "installed_version", lambda package: "2.9.0")
    monkeypatch.setattr(integration, "job_from_schedule", _stop)
    with pytest.warns(UserWarning, match="perseus_torch: torch 2.9.0 is outside the supported releases"):
        with pytest.raises(RuntimeError, match="stopped after the version check"):
            integration.enable(object(), None, {"process_hooks": False})


def test_perseus_megatron_warns_at_start(monkeypatch):
    import perseus_megatron.integration as integration

    monkeypatch.setattr(versions, "installed_version", lambda package: "2.9.0")
    monkeypatch.setattr(integration, "install_hooks", _stop)
    with pytest.warns(UserWarning, match="perseus_megatron: torch 2.9.0 is outside the supported releases"):
        with pytest.raises(RuntimeError, match="stopped after the version check"):
            integration.enable({"process_hooks": False})


def test_perseus_deepspeed_warns_at_start(monkeypatch):
    import perseus_deepspeed.integration as integration
    from perseus.runtime import PerseusConfig

    monkeypatch.setattr(versions, "installed_version", lambda package: "2.9.0")
    monkeypatch.setattr(integration, "load_pipe_modules", lambda: (None, None))
    monkeypatch.setattr(integration, "check_engine", lambda engine, module: None)
    monkeypatch.setattr(integration, "job_from_engine", _stop)
    with pytest.warns(UserWarning, match="perseus_deepspeed: torch 2.9.0 is outside the supported releases"):
        with pytest.raises(RuntimeError, match="stopped after the version check"):
            integration.attach(object(), PerseusConfig.from_dict({"process_hooks": False}))


def test_doctor_reports_unsupported_versions_as_a_finding(monkeypatch):
    from perseus.cli import doctor_checks

    monkeypatch.setattr(doctor_checks, "_version", lambda name: {"torch": "2.9.0", "deepspeed": "0.19.8"}.get(name))
    facts = doctor_checks.NodeFacts()
    doctor_checks.check_supported_versions(facts)
    (finding,) = facts.findings
    assert finding.check == "supported versions" and finding.status == doctor_checks.WARN
    assert "torch 2.9.0 is outside the supported releases" in finding.detail and "docs/install.md" in finding.fix
    monkeypatch.setattr(doctor_checks, "_version", lambda name: {"torch": "2.13.0", "deepspeed": "0.19.8"}.get(name))
    facts = doctor_checks.NodeFacts()
    doctor_checks.check_supported_versions(facts)
    assert facts.findings[0].status == doctor_checks.OK
