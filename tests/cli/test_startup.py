"""The CLI starts fast and quiet: no heavy imports for help or show, no solver banner on stdout.

Checked on what is imported and printed, never on wall-clock time (benchmarks/bench_cli_startup.py
measures that).
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.cli import BUILTIN_COMMANDS, build_parser, main, planning
from perseus.frontier import save_frontier

from cli_helpers import hand_frontier

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("scipy.optimize", "highspy", "matplotlib", "torch", "perseus.planner", "perseus.timeline.emulator")


def _python(code: str, *, extra_path: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    paths = [str(ROOT)] + ([str(extra_path)] if extra_path else []) + [os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def _heavy_after(statement: str, **kwargs) -> tuple[list[str], subprocess.CompletedProcess]:
    code = f"import sys\n{statement}\nprint('HEAVY=' + repr(sorted(m for m in {HEAVY!r} if m in sys.modules)), file=sys.stderr)"
    result = _python(code, **kwargs)
    assert result.returncode == 0, result.stderr
    line = next(ln for ln in result.stderr.splitlines() if ln.startswith("HEAVY="))
    return eval(line[len("HEAVY="):]), result


def test_importing_the_cli_loads_no_solver_plotting_or_torch():
    heavy, _ = _heavy_after("import perseus.cli")
    assert heavy == []


def test_show_loads_no_solver_plotting_or_torch(tmp_path):
    path = tmp_path / "f.json"
    save_frontier(hand_frontier(), path)
    heavy, result = _heavy_after(f"from perseus.cli import main\nassert main(['show', {str(path)!r}]) == 0")
    assert heavy == [] and "no-slowdown point" in result.stdout


def test_help_lists_plugin_commands_and_builtins_skip_the_lookup(tmp_path, monkeypatch, capsys):
    # A plugin installed through the perseus.commands entry point, like perseus_demo's 'demo'.
    (tmp_path / "perseus_test_plugin.py").write_text(
        "def add(sub):\n    sub.add_parser('hello', help='a test plugin command')\n"
    )
    dist = tmp_path / "perseus_test_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: perseus-test-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[perseus.commands]\nhello = perseus_test_plugin:add\n")
    result = _python("from perseus.cli import main\nmain(['--help'])", extra_path=tmp_path)
    assert "hello" in result.stdout and "a test plugin command" in result.stdout
    assert all(command in result.stdout for command in BUILTIN_COMMANDS)

    # A built-in command never scans the installed distributions.
    def no_lookup(**_):
        raise AssertionError("plugin lookup for a built-in command")

    monkeypatch.setattr(importlib.metadata, "entry_points", no_lookup)
    path = tmp_path / "f.json"
    save_frontier(hand_frontier(), path)
    assert main(["show", str(path)]) == 0
    assert "no-slowdown point" in capsys.readouterr().out


def test_builtin_command_list_matches_the_parser():
    sub = next(a for a in build_parser(plugins=False)._actions if a.dest == "command")
    assert tuple(sub.choices) == BUILTIN_COMMANDS


@pytest.mark.parametrize("command", ["plan --example --max-points 10"])
def test_plan_prints_no_solver_banner(tmp_path, command):
    out = tmp_path / "f.json"
    result = _python(f"import sys\nfrom perseus.cli import main\nsys.exit(main({command.split()!r} + ['--out', {str(out)!r}]))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("perseus plan: ")
    for noise in ("HiGHS", "Copyright", "licence", "THIRD_PARTY"):
        assert noise not in result.stdout and noise not in result.stderr
    assert out.exists()


def test_run_planner_forwards_to_the_planner(monkeypatch):
    import perseus.planner

    seen = []
    monkeypatch.setattr(perseus.planner, "plan_frontier", lambda s, p, progress=None: seen.append((s, p, progress)) or "F")
    assert planning.run_planner("s", "p") == "F" and seen == [("s", "p", None)]

