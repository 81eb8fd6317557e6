"""The generated references cannot drift from the code: scripts/gen_reference.py renders
docs/reference/config.md (every ``PerseusConfig`` field, its Megatron flag and DeepSpeed key, the
environment variables), docs/reference/cli.md (every ``perseus`` command's ``--help``) and the
version matrix of docs/install.md in memory, and each must equal the file as written. A field, a
flag, a command option or a ``PERSEUS_*`` variable missing from the pages fails here."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_reference"] = module
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


@pytest.fixture(scope="module")
def rendered() -> dict[Path, str]:
    return gen.pages(ROOT)


@pytest.mark.parametrize("page", [gen.CONFIG_PAGE, gen.CLI_PAGE, gen.INSTALL_PAGE], ids=str)
def test_the_written_page_is_what_the_generator_renders(rendered, page):
    written = (ROOT / page).read_text()
    assert written == rendered[page], (
        f"{page} is stale: run python scripts/gen_reference.py (a field, flag, command option or version "
        "changed without the page)")


def _config_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.split("## Environment variables", 1)[0].splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) == 6 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    return rows


def test_the_config_reference_names_every_field_its_flag_and_its_deepspeed_key():
    from perseus.runtime.config import PerseusConfig
    from perseus_megatron.args import FLAGS

    rows = _config_rows((ROOT / gen.CONFIG_PAGE).read_text())
    assert list(rows) == list(PerseusConfig.model_fields), "one row per field, in the config's order"
    for flag in FLAGS:
        field, flag_cell, key = rows[flag.field][:3]
        assert all(f"`{option}`" in flag_cell for option in flag.options), flag.field
        assert key == f"`perseus.{flag.field}`"
    assert rows["enabled"][1] == "`--perseus`"
    for name, field in PerseusConfig.model_fields.items():
        assert " ".join((field.description or "").split()) in rows[name][5].replace("\\|", "|"), name


def test_a_missing_field_or_option_makes_the_check_fail(tmp_path, rendered):
    """What the test above catches: a copy of the tree with one config row and one CLI option line
    removed is stale, page by page."""
    for page in (gen.CONFIG_PAGE, gen.CLI_PAGE, gen.INSTALL_PAGE):
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    assert gen.stale(tmp_path) == []
    config = (tmp_path / gen.CONFIG_PAGE).read_text()
    (tmp_path / gen.CONFIG_PAGE).write_text(re.sub(r"\n\| `noise_k` \|[^\n]*", "", config))
    cli = (tmp_path / gen.CLI_PAGE).read_text()
    (tmp_path / gen.CLI_PAGE).write_text(re.sub(r"\n  --max-points N[^\n]*", "", cli, count=1))
    assert gen.stale(tmp_path) == [gen.CONFIG_PAGE, gen.CLI_PAGE]


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options ``--help`` shows (a hidden one, ``help=SUPPRESS``, is for tests and is left out)."""
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
            and a.help is not argparse.SUPPRESS]


def test_the_cli_reference_holds_every_command_and_every_option():
    text = (ROOT / gen.CLI_PAGE).read_text()
    commands = gen._parsers()
    assert {name for name, _, _ in commands} >= {"perseus", "plan", "show", "plot", "export", "emulate", "clockd",
                                                 "report", "doctor", "demo"}
    sections = re.split(r"\n## `", text)
    for name, _, parser in commands:
        title = name if name == "perseus" else f"perseus {name}"
        (section,) = [s for s in sections if s.startswith(f"{title}`\n")]
        for action in _actions(parser):
            names = action.option_strings or [action.metavar or action.dest]
            assert any(str(n) in section for n in names), f"{title}: {names} missing from docs/reference/cli.md"


# os.environ.get("PERSEUS_X"), os.environ["PERSEUS_X"], os.getenv("PERSEUS_X"), ENV_X = "PERSEUS_X"
ENV_READ = re.compile(r"(?:environ\.get\(|environ\[|getenv\(|\bENV_\w*\s*=\s*)[\"'](PERSEUS_[A-Z_]+)[\"']")


def _environment_reads() -> set[str]:
    """Every PERSEUS_* variable the packages read from the environment, directly or by a constant."""
    found = set()
    for package in ("perseus", "perseus_megatron", "perseus_deepspeed", "perseus_torch"):
        for path in (ROOT / package).rglob("*.py"):
            found |= set(ENV_READ.findall(path.read_text()))
    return found


def test_every_environment_variable_perseus_reads_is_in_the_reference():
    reads = _environment_reads()
    assert {"PERSEUS_GPU", "PERSEUS_CACHE_DIR", "PERSEUS_CLOCKD_SOCKET", "PERSEUS_ZEUSD_SOCKET"} <= reads
    assert reads - set(gen.ENVIRONMENT) == set(), "add them to ENVIRONMENT in scripts/gen_reference.py"
    page = (ROOT / gen.CONFIG_PAGE).read_text().split("## Environment variables", 1)[1]
    assert all(f"| `{name}` |" in page for name in gen.ENVIRONMENT)


def test_rendering_leaves_the_environment_as_it_was(monkeypatch):
    monkeypatch.setenv("PERSEUS_CACHE_DIR", "/somewhere")
    monkeypatch.setenv("COLUMNS", "37")
    with gen.fixed_environment():
        import os

        assert "PERSEUS_CACHE_DIR" not in os.environ and os.environ["COLUMNS"] == str(gen.HELP_COLUMNS)
    import os

    assert os.environ["PERSEUS_CACHE_DIR"] == "/somewhere" and os.environ["COLUMNS"] == "37"
