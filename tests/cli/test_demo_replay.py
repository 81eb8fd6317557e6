"""perseus demo --gpu-replay DIR: the demo's simulated GPUs replay one workload's measured A100 runs.

Most tests stand a recording module in for the framework demo; one runs the megatron demo end to
end at a small size. Those that read the runs skip where the public artifact's data are absent.
"""

from __future__ import annotations

import json
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from perseus.cli import main
from perseus.measured.replay import load_replay
from perseus_demo.common import DemoSettings
from perseus_demo.replay import FREQ_STEP_MHZ, TIME_SCALE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measured"))
from artifact import unpack, workload_dir


@pytest.fixture(scope="module")
def gpt3_dir(tmp_path_factory):
    return workload_dir(unpack(tmp_path_factory), "gpt3-xl")


@pytest.fixture
def fake_demo(monkeypatch):
    """A framework demo whose launch records its config and returns a fixed A/B."""
    seen: list[DemoSettings] = []

    @dataclass
    class DemoConfig(DemoSettings):
        pass

    def launch(cfg: DemoSettings, out_dir) -> list[dict[str, Any]]:
        seen.append(cfg)
        steps = [{"step": i, "phase": "deployed" if i < 3 else "baseline again", "time_s": 1.0,
                  "energy_j": 90.0 if i < 3 else 100.0} for i in range(6)]
        return [{"rank": 0, "steps": steps}]

    module = types.ModuleType("fake_replay_demo")
    module.DemoConfig, module.launch = DemoConfig, launch  # type: ignore[attr-defined]  # the stand-in module the demo imports
    monkeypatch.setitem(sys.modules, "fake_replay_demo", module)
    import perseus_demo.cli

    monkeypatch.setitem(perseus_demo.cli.FRAMEWORKS, "megatron", "fake_replay_demo")
    return seen


def test_the_flag_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--gpu-replay DIR" in out and f"instruction times x{TIME_SCALE:g}" in out


def test_a_malformed_directory_is_one_line(fake_demo, tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    assert main(["demo", "--gpu-replay", str(runs), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{runs}: not a workload directory name" in err and not fake_demo


@pytest.mark.parametrize("flags, problem", [
    (["--hostile-gpu"], "leave out --hostile-gpu"),
    (["--moe"], "leave out --moe"),
    (["--megatron-lm", "somewhere"], "--gpu-replay runs with the tiny demo loop; leave out --megatron-lm"),
])
def test_what_the_replay_cannot_run_with_is_refused(fake_demo, tmp_path, capsys, flags, problem):
    assert main(["demo", "--gpu-replay", str(tmp_path), *flags, "--out", str(tmp_path / "out")]) == 2
    assert problem in capsys.readouterr().err and not fake_demo


def test_the_replay_reaches_every_gpu_through_sim_gpu_and_the_report_states_the_scale(fake_demo, gpt3_dir, tmp_path,
                                                                                       capsys):
    assert main(["demo", "--gpu-replay", str(gpt3_dir), "--out", str(tmp_path)]) == 0
    (cfg,) = fake_demo
    assert cfg.sim_gpu == {"energy_update_period_s": 0.005, "replay": {"dir": str(gpt3_dir), "time_scale": TIME_SCALE},
                           "stream_depth": 0}
    assert cfg.nominal_s(0) == {"forward": 0.0, "backward": 0.0}  # the replay decides each instruction's time
    assert (cfg.perseus["freq_min_mhz"], cfg.perseus["freq_step_mhz"]) == (1035, FREQ_STEP_MHZ)
    out = capsys.readouterr().out
    assert "simulated A100 replaying gpt3-xl GPUs" in out and f"GPU i replays stage i of {gpt3_dir.name}" in out
    assert "instruction times x0.1 (stage 0 at 1410 MHz: forward 10.4 ms" in out
    assert "8 microbatches instead of 128" in out and "P_blocking (103.1 W) as fitted, not scaled" in out
    assert "10.0% less energy" in out and "planner's prediction: no frontier was planned" in out


def test_the_demo_must_run_the_replayed_stage_count(fake_demo, gpt3_dir, tmp_path, capsys):
    assert main(["demo", "--gpu-replay", str(gpt3_dir), "--stages", "2", "--out", str(tmp_path)]) == 2
    assert "the runs measured 4 stages; run the demo with --stages 4 (GPU i replays stage i)" in capsys.readouterr().err


@pytest.mark.distributed
def test_the_megatron_demo_replays_gpt3_xl_end_to_end(gpt3_dir, tmp_path, capsys):
    """4 stages x 4 microbatches (about a minute on 2 cores): the plan is deployed, the report shows the
    measured A/B and the planner's prediction, and every GPU ran its stage's measured times."""
    pytest.importorskip("megatron.core")
    assert main(["demo", "--framework", "megatron", "--gpu-replay", str(gpt3_dir), "--microbatches", "4",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"deployed plan vs baseline again \(default clocks\): -?\d+\.\d% less energy", out), out
    assert re.search(r"planner's prediction for this configuration .*: -?\d+\.\d% less energy", out), out
    source = load_replay(gpt3_dir, TIME_SCALE)
    for rank in range(4):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        took: dict[str, list[float]] = {"forward": [], "backward": []}
        for step in result["steps"]:
            if step["phase"] == "baseline again":  # default clocks: the max
                for (kind, _, _, clock), (begin, end) in zip(step["instructions"], step["instruction_times"]):
                    assert clock == 1410
                    took[kind].append(end - begin)
        for kind, times in took.items():  # the host's begin-to-end: the kernel plus the hooks' own time
            ratio = sorted(times)[len(times) // 2] / source.time_s(rank, kind, 1410)
            assert 0.99 < ratio < 1.3, (rank, kind, ratio)
