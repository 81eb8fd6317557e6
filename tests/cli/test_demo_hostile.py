"""perseus demo --hostile-gpu, without the run: the demo gets asynchronous "H200-hostile" GPUs and
prints the A/B by the simulator's exact energy beside the measured one."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any

import pytest

from perseus.cli import main
from perseus_demo.cli import ASYNC_STREAM_DEPTH
from perseus_demo.common import DemoSettings, true_energy_line


def _steps(phase: str, first: int, energy: float, exact: float) -> list[dict[str, Any]]:
    return [{"step": first + i, "phase": phase, "time_s": 1.0, "energy_j": energy, "true_energy_j": exact}
            for i in range(3)]


@pytest.fixture
def fake_demo(monkeypatch):
    """A framework demo whose launch records its config and returns a fixed A/B."""
    seen: list[DemoSettings] = []

    @dataclass
    class DemoConfig(DemoSettings):
        pass

    def launch(cfg: DemoSettings, out_dir) -> list[dict[str, Any]]:
        seen.append(cfg)
        return [{"rank": 0, "steps": _steps("deployed", 0, 80.0, 90.0) + _steps("baseline again", 3, 100.0, 100.0)}]

    module = types.ModuleType("fake_hostile_demo")
    module.DemoConfig, module.launch = DemoConfig, launch  # type: ignore[attr-defined]  # the stand-in module the demo imports
    monkeypatch.setitem(sys.modules, "fake_hostile_demo", module)
    import perseus_demo.cli

    monkeypatch.setitem(perseus_demo.cli.FRAMEWORKS, "megatron", "fake_hostile_demo")
    return seen


def test_the_flag_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # as one line: argparse wraps the help
    assert "--hostile-gpu" in out and "implies --async-gpu" in out


def test_hostile_gpus_are_asynchronous_h200_hostile_on_the_real_counter_period(fake_demo, tmp_path, capsys):
    assert main(["demo", "--hostile-gpu", "--out", str(tmp_path)]) == 0
    (cfg,) = fake_demo
    # the preset alone: its own 100 ms counter period, not the demo's fast 5 ms one
    assert cfg.sim_gpu == {"preset": "H200-hostile", "stream_depth": ASYNC_STREAM_DEPTH}
    out = capsys.readouterr().out
    assert "asynchronous simulated H200-hostile GPUs" in out
    assert "deployed plan vs baseline again (default clocks): 20.0% less energy, iteration time +0.0%" in out
    assert "10.0% less energy by the simulator's exact integral (no meter error)" in out


def test_without_the_flag_nothing_changes(fake_demo, tmp_path, capsys):
    assert main(["demo", "--async-gpu", "--out", str(tmp_path)]) == 0
    assert fake_demo[0].sim_gpu["preset"] == "A100-SXM" and "exact integral" not in capsys.readouterr().out


def test_the_flag_is_for_the_demo_loop_not_megatron_lm(tmp_path, capsys):
    assert main(["demo", "--hostile-gpu", "--megatron-lm", str(tmp_path)]) == 2
    assert "--hostile-gpu runs with the tiny demo loop" in capsys.readouterr().err


def test_the_exact_line_needs_both_phases():
    assert true_energy_line([{"steps": _steps("deployed", 0, 1.0, 1.0)}]) is None
