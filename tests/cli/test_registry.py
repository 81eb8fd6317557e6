"""The command table drives the parser: every command module is in it under its own name, and the
package runs as ``python -m perseus.cli`` (what the benchmarks and the clockd service start)."""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import perseus.cli
from perseus import __version__
from perseus.cli import BUILTIN_COMMANDS, build_parser
from perseus.cli.registry import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


def test_every_command_module_is_in_the_table_under_its_own_name():
    modules = {info.name: importlib.import_module(f"perseus.cli.{info.name}")
               for info in pkgutil.iter_modules(perseus.cli.__path__) if info.name != "__main__"}
    declaring = {name: module.COMMAND for name, module in modules.items() if hasattr(module, "COMMAND")}
    assert {command.name for command in declaring.values()} == set(declaring)
    assert sorted(declaring.values(), key=lambda c: c.name) == sorted(COMMANDS, key=lambda c: c.name)


def test_each_table_entry_becomes_a_subcommand_that_runs_its_handler():
    sub = next(a for a in build_parser(plugins=False)._actions if a.dest == "command")
    assert tuple(sub.choices) == BUILTIN_COMMANDS == tuple(c.name for c in COMMANDS)
    for command in COMMANDS:
        parser = sub.choices[command.name]
        assert parser.get_default("handler") is command.run
        assert parser.description == command.description and parser.epilog == command.epilog


def test_python_dash_m_runs_the_command():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    result = subprocess.run([sys.executable, "-m", "perseus.cli", "--version"], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == f"perseus {__version__}"
