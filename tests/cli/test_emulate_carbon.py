"""perseus emulate --carbon-trace / --power-cap-w: the JSON object, the table, the one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from perseus.cli import main

# Hourly 2022 grid intensity beside the checkout (EIA-930, public domain; avg_CI from HewlettPackard/dc-rl, MIT).
SHARED = Path(os.environ.get("PERSEUS_CARBON_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data" / "carbon"))
KEYS = {"carbon_saving", "no_slowdown_carbon_saving", "uniform_carbon_saving", "hindsight_carbon_saving",
        "time_change", "forecast_mae"}


def _trace(path: Path, days: int = 12) -> Path:
    hours = np.arange(24 * days)
    ci = 250 + 120 * np.sin(2 * np.pi * hours / 24)
    lines = ["timestamp,avg_CI"] + [f"2022-03-{1 + h // 24:02d}T{h % 24:02d}:00:00Z,{c:.3f}" for h, c in zip(hours, ci)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_carbon_json_has_every_saving_and_holds_the_budget(tmp_path, small_frontier_file, capsys):
    trace = _trace(tmp_path / "ci.csv")
    assert main(["emulate", "--frontier", str(small_frontier_file), "--carbon-trace", str(trace),
                 "--time-budget", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert KEYS <= set(out) and out["hours"] == 24 * 12 and out["time_budget"] == 0.05
    assert out["time_change"] <= 0.05 + 0.001
    assert out["hindsight_carbon_saving"] >= out["carbon_saving"] - 1e-9
    assert out["carbon_saving"] >= out["no_slowdown_carbon_saving"]


def test_carbon_table_power_cap_and_figure(tmp_path, small_frontier_file, capsys):
    trace = _trace(tmp_path / "ci.csv")
    figure = tmp_path / "week.png"
    assert main(["emulate", "--frontier", str(small_frontier_file), "--carbon-trace", str(trace), "--gpus", "16",
                 "--power-cap-w", "1e9", "--figure", str(figure)]) == 0
    out = capsys.readouterr().out
    assert "carbon-aware (hindsight)" in out and "throughput loss 0.00 %" in out
    assert figure.stat().st_size > 0


def test_power_cap_under_the_least_power_says_so(small_frontier_file, capsys):
    assert main(["emulate", "--frontier", str(small_frontier_file), "--power-cap-w", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["power_cap"]["unreachable_windows"] == 1


def test_bad_carbon_input_is_one_line(tmp_path, small_frontier_file, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,solar\n2022-01-01T00:00Z,3\n")
    assert main(["emulate", "--frontier", str(small_frontier_file), "--carbon-trace", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no value column" in err and len(err.splitlines()) == 1
    assert main(["emulate", "--frontier", str(small_frontier_file), "--carbon-trace", str(_trace(bad)),
                 "--straggler-factor", "1.1"]) == 2


@pytest.mark.skipif(not (SHARED / "ERCO.csv").exists(), reason="shared carbon traces absent")
def test_a_year_of_ercot_on_the_example_frontier(capsys):
    assert main(["emulate", "--example", "--microbatches", "8", "--carbon-trace", str(SHARED / "ERCO.csv"),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hours"] == 8760 and out["forecast_mae"] < out["persistence_mae"]
    assert out["time_change"] <= 0.025 + 0.001
    assert out["uniform_carbon_saving"] <= out["hindsight_carbon_saving"]
