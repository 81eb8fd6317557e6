"""perseus plan --non-compute / --measured-iteration: the frontier file records each iteration's
non-compute time and the summary prints the job's slowdowns and savings with it."""

from __future__ import annotations

import json

import pytest

from perseus.cli import main
from perseus.frontier import load_frontier


def _plan(tmp_path, capsys, *extra):
    out = tmp_path / "f.json"
    assert main(["plan", "--example", "--out", str(out), *extra]) == 0
    return load_frontier(out), json.loads(out.read_text()), capsys.readouterr().out


def test_without_it_the_file_and_the_summary_are_as_before(tmp_path, capsys):
    frontier, data, out = _plan(tmp_path, capsys)
    assert "non_compute" not in data and not frontier.non_compute
    assert "non-compute" not in out


def test_given_per_iteration_it_is_recorded_and_the_job_table_counts_it(tmp_path, capsys):
    frontier, data, out = _plan(tmp_path, capsys, "--non-compute", "0.05", "--non-compute-power", "60")
    assert data["non_compute"] == {"time_s": 0.05, "power_w": 60.0, "source": "--non-compute"}
    assert "non-compute time 0.0500 s per iteration at 60 W per GPU" in out
    job = out.split("non-compute time", 1)[1].splitlines()  # after the instructions' own table
    for label, target in (("no slowdown (default)", 0.0), ("at most +5 %", 0.05)):
        point = frontier.lookup_slowdown(target)
        row = next(line for line in job if line.startswith(f"{label} [{frontier.points.index(point)}]"))
        assert f"{frontier.saving(point):.2%}" in row and f"{point.time_s + 0.05:.4f}" in row
    assert any(line.startswith("all max frequency") and f"{frontier.baseline_time_s + 0.05:.4f}" in line for line in job)


def test_a_measured_iteration_gives_its_excess_over_the_planned_all_max(tmp_path, capsys):
    plain, _, _ = _plan(tmp_path, capsys)
    frontier, data, out = _plan(tmp_path, capsys, "--measured-iteration", f"{plain.baseline_time_s + 0.08:.6f}")
    assert frontier.non_compute.time_s == pytest.approx(0.08, abs=2e-6) and frontier.non_compute.power_w is None
    assert "--measured-iteration" in data["non_compute"]["source"] and "at 80 W per GPU" in out
    _, data, out = _plan(tmp_path, capsys, "--measured-iteration", f"{plain.baseline_time_s * 0.9:.6f}")
    assert "non_compute" not in data and "no non-compute time" in out


def test_a_power_alone_is_a_usage_error(tmp_path, capsys):
    assert main(["plan", "--example", "--out", str(tmp_path / "f.json"), "--non-compute-power", "60"]) == 2
    assert "--non-compute-power needs --non-compute or --measured-iteration" in capsys.readouterr().err
    assert not (tmp_path / "f.json").exists()
