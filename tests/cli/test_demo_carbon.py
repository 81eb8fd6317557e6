"""perseus demo --carbon-trace, without the run: its settings and what it prints from rank 0's metrics."""

from __future__ import annotations

import json

import pytest

from perseus.carbon.signals import SignalError
from perseus.runtime.config import PerseusConfig
from perseus_demo.cli import CARBON_SECONDS_PER_HOUR, carbon_lines, carbon_settings


def test_settings_replay_the_trace_and_validate(tmp_path):
    trace = tmp_path / "ci.csv"
    trace.write_text("timestamp,avg_CI\n2022-01-01T00:00Z,200\n2022-01-01T01:00Z,300\n")
    settings = carbon_settings(trace)
    config = PerseusConfig.from_dict({"cache_dir": None, **settings})  # the runtime accepts them
    assert config.carbon_replay_speed == 3600.0 / CARBON_SECONDS_PER_HOUR and config.grid_every_steps == 1
    trace.write_text("timestamp,wind\n2022-01-01T00:00Z,200\n")
    with pytest.raises(SignalError, match="no value column"):
        carbon_settings(trace)


def test_lines_show_each_change_of_intensity_or_point(tmp_path):
    rows = [{"step": 0, "phase": "warmup", "time_s": 1, "energy_j": 1}]
    rows += [{"step": s, "phase": "deployed", "time_s": 1, "energy_j": 1, "slowdown": sd, "carbon_intensity": ci,
              "carbon_g": 0.5} for s, ci, sd in ((5, 200.0, 1.0), (6, 200.0, 1.0), (7, 400.0, 1.0), (8, 400.0, 1.05))]
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = carbon_lines(metrics)
    changes = [line for line in lines if line.startswith("  step")]
    assert [line.split()[1] for line in changes] == ["5", "7", "8"]
    assert "4 steps with an intensity, 2 frontier points run" in lines[-1] and "2 g CO2" in lines[-1]
    assert "no metrics file" in carbon_lines(tmp_path / "absent.jsonl")[0]
