"""The runtime checks its own prediction: a deployed plan's predicted slowdown and energy ratio
(the frontier's, against its all-max baseline) beside the same run's measured ones (plan steps
against default-clock probes), in the metrics file, the summary line and ``perseus report``; a
profile that lies about energy gets one warning that says how to re-profile.

The real runtime in one process on the simulated GPU (drivers of tests/runtime/guard/test_energy_guard.py).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "guard"))

from test_energy_guard import JOB, MAX, setup, train, uniform

from perseus.output.report_page import make_report
from perseus.runtime import PerseusRuntime
from perseus.runtime.observe.metrics import PREDICTION_FIELDS, StepMetrics
from perseus.runtime.observe.prediction import ENERGY_BOUND, PredictionCheck
from perseus.runtime.observe.report import summary_line

WARNING = "the profile mispredicts the deployed plan"


def run(tmp_path, caplog, points, steps, target_s):
    cfg = setup(tmp_path, points)
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, cfg) as rt:
            rt.set_target_time(target_s)
            train(rt, steps)
            summary = rt.summary()
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    return summary, rows


def test_predicted_and_measured_ratios_reach_the_file_the_summary_and_the_report(tmp_path, caplog):
    """1005 MHz: the frontier says x1.32 time and x0.60 energy of its 1.0 s / 10 J baseline."""
    summary, rows = run(tmp_path, caplog, [uniform(MAX, 1.0, 9.0), uniform(1005, 1.32, 6.0)], 2 + 80, 1.6)
    plan = [r for r in rows if r.get("clocks") == "plan" and "measured_slowdown" in r]
    assert plan, "deployed plan steps carry the check once probes measured"
    last = plan[-1]
    assert last["predicted_slowdown"] == pytest.approx(1.32) and last["predicted_energy_ratio"] == pytest.approx(0.6)
    assert 1.0 < last["measured_slowdown"] < 2.0 and 0.3 < last["measured_energy_ratio"] < 1.0
    assert not any("predicted_slowdown" in r for r in rows if r.get("clocks") == "default")  # probes: none
    checks = [r for r in rows if r.get("event") == "prediction"]
    assert checks and set(PREDICTION_FIELDS) | {"time_error", "energy_error"} <= checks[-1]["data"].keys()
    assert summary["prediction"]["predicted_slowdown"] == pytest.approx(1.32)
    line = summary_line(summary)
    assert "prediction vs probes: slowdown x1.320 predicted, x1." in line and "energy x0.600 predicted" in line
    _, written = make_report(tmp_path / "m.jsonl", out=tmp_path / "report.html")
    page = written[0].read_text()
    assert "Predicted vs measured" in page and "x1.320" in page and "x0.600" in page
    measured = f"x{checks[-1]['data']['measured_energy_ratio']:.3f}"
    assert measured in page, measured


def test_a_lying_profile_gets_one_warning_naming_the_numbers_and_how_to_reprofile(tmp_path, caplog):
    """The profile says 405 MHz halves the energy; on this GPU it spends more than default clocks."""
    summary, _ = run(tmp_path, caplog, [uniform(MAX, 1.0, 9.0), uniform(405, 2.99, 5.0)], 2 + 120, 3.6)
    said = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert len(said) == 1, said
    assert "energy x0.500 predicted" in said[0] and "re-profile:" in said[0] and "bound 5" in said[0], said[0]
    assert summary["prediction"]["energy_error"] > ENERGY_BOUND


def test_the_check_fields_leave_other_steps_rows_as_they_were():
    check = PredictionCheck(1.1, 1.2, 0.8, None)
    assert check.time_error == pytest.approx(0.1) and check.energy_error is None
    assert check.beyond() == ["time +10.0 points (bound 3)"]
    row = StepMetrics(step=1, rank=0, phase="warmup", time_s=1.0, energy_j=2.0).file_row()
    assert not set(PREDICTION_FIELDS) & row.keys()
    full = StepMetrics(step=1, rank=0, phase="deployed", time_s=1.0, energy_j=2.0, **check.fields())
    assert full.scalars()["perseus/measured_slowdown"] == pytest.approx(1.2)
    assert "perseus/measured_energy_ratio" not in full.scalars()
    assert full.prometheus()["predicted_energy_ratio"] == pytest.approx(0.8)
