"""perseus plan: frontier file, summary, P_blocking sources, progress bar, --example."""

from __future__ import annotations

import json

import numpy as np
import pytest

import perseus.cli.planning
from perseus.cli import main
from perseus.schedules.dag import InstructionDAG
from perseus.examples import EXAMPLE_P_BLOCKING_W, load_example_profile
from perseus.frontier import load_frontier
from perseus.profile import load_csv
from perseus.schedules import build_schedule
from perseus.timeline.simulator import max_frequency_plan, simulate_plan

from cli_helpers import hand_frontier
from cli_helpers import heuristic_frontier


def _fake_planner(frontier_of, calls=None):
    def plan(schedule, profile, progress=None):
        if calls is not None:
            calls.append((schedule, profile))
        if progress is not None:
            progress(0.5)
            progress(1.0)
        return frontier_of(schedule, profile)

    return plan


def test_plan_writes_a_loadable_frontier_with_simulated_baseline(tmp_path, small_profile_csv, capsys):
    out = tmp_path / "f.json"
    argv = ["plan", "--profile", str(small_profile_csv), "--p-blocking", "80", "--stages", "2", "--microbatches", "3", "--out", str(out)]
    assert main(argv) == 0
    frontier = load_frontier(out)
    assert (frontier.schedule.name, frontier.schedule.num_stages, frontier.schedule.num_microbatches) == ("1f1b", 2, 3)
    profile = load_csv(small_profile_csv, 80.0)
    dag = InstructionDAG.from_schedule(frontier.schedule)
    base = simulate_plan(dag, profile, max_frequency_plan(dag, profile))
    assert frontier.baseline_energy_j == pytest.approx(base.energy_j)
    assert frontier.p_blocking_w == 80.0
    data = json.loads(out.read_text())
    assert data["metadata"]["profile"] == str(small_profile_csv)
    summary = capsys.readouterr().out
    assert f"{base.energy_j:.2f}" in summary and "wrote" in summary


def test_summary_reports_savings_of_default_fastest_and_slowest(tmp_path, monkeypatch, small_profile_csv, capsys):
    # baseline (1.0 s, 100 J); points (1.0, 90) (1.1, 80) (1.25, 75): default and fastest save
    # 10%, slowest 25% at +25% time.
    monkeypatch.setattr(perseus.cli.planning, "run_planner", _fake_planner(lambda s, p: hand_frontier()))
    argv = ["plan", "--profile", str(small_profile_csv), "--p-blocking", "80", "--stages", "2", "--microbatches", "2",
            "--out", str(tmp_path / "f.json")]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    default = next(line for line in lines if line.startswith("no slowdown"))
    slowest = next(line for line in lines if line.startswith("slowest"))
    assert "[0]" in default and "10.00%" in default and "+0.00%" in default
    assert "[2]" in slowest and "25.00%" in slowest and "+25.00%" in slowest
    assert any(line.startswith("frontier: 3 points") for line in lines)


def test_p_blocking_from_json_profile_and_override(tmp_path, small_profile_csv):
    as_json = tmp_path / "prof.json"
    load_csv(small_profile_csv, 71.5).save_json(as_json)
    base = ["plan", "--profile", str(as_json), "--stages", "2", "--microbatches", "2"]
    assert main(base + ["--out", str(tmp_path / "a.json")]) == 0
    assert load_frontier(tmp_path / "a.json").p_blocking_w == 71.5
    assert main(base + ["--p-blocking", "90", "--gpu-name", "A40", "--out", str(tmp_path / "b.json")]) == 0
    overridden = load_frontier(tmp_path / "b.json")
    assert (overridden.p_blocking_w, overridden.gpu_name) == (90.0, "A40")


def test_max_points_thins_the_written_file(tmp_path, monkeypatch, small_profile_csv):
    monkeypatch.setattr(perseus.cli.planning, "run_planner", _fake_planner(heuristic_frontier))
    argv = ["plan", "--profile", str(small_profile_csv), "--p-blocking", "80", "--stages", "2", "--microbatches", "4",
            "--max-points", "3", "--out", str(tmp_path / "f.json")]
    assert main(argv) == 0
    full = heuristic_frontier(build_schedule("1f1b", 2, 4), load_csv(small_profile_csv, 80.0))
    written = load_frontier(tmp_path / "f.json")
    assert len(full.points) > 3 and 2 <= len(written.points) <= 3
    assert written.fastest.time_s == pytest.approx(full.fastest.time_s)
    assert written.slowest.time_s == pytest.approx(full.slowest.time_s)


def test_progress_bar_follows_the_planner_callback(tmp_path, monkeypatch, small_profile_csv, capsys):
    monkeypatch.setattr(perseus.cli.planning, "run_planner", _fake_planner(heuristic_frontier))
    argv = ["plan", "--profile", str(small_profile_csv), "--p-blocking", "80", "--stages", "2", "--microbatches", "2"]
    assert main(argv + ["--progress", "--out", str(tmp_path / "a.json")]) == 0
    err = capsys.readouterr().err
    assert "planning 2x2" in err and "50%" in err and "100%" in err
    assert main(argv + ["--no-progress", "--out", str(tmp_path / "b.json")]) == 0
    assert capsys.readouterr().err == ""


def test_example_uses_shipped_profile_stages_and_p_blocking(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(perseus.cli.planning, "run_planner", _fake_planner(heuristic_frontier, calls))
    assert main(["plan", "--example", "--out", str(tmp_path / "f.json")]) == 0
    schedule, profile = calls[0]
    assert (schedule.num_stages, schedule.num_microbatches) == (4, 8)
    assert profile.p_blocking_w == EXAMPLE_P_BLOCKING_W
    assert "shipped example" in capsys.readouterr().out
    assert load_frontier(tmp_path / "f.json").metadata["profile"] == "example"


def test_example_with_the_real_planner(tmp_path):
    assert main(["plan", "--example", "--microbatches", "4", "--out", str(tmp_path / "f.json")]) == 0
    frontier = load_frontier(tmp_path / "f.json")
    profile = load_example_profile()
    dag = InstructionDAG.from_schedule(frontier.schedule)
    for point in (frontier.fastest, frontier.default_point(), frontier.slowest):
        sim = simulate_plan(dag, profile, point.freqs_mhz)  # stored numbers are the plan's simulated ones
        assert sim.time_s == pytest.approx(point.time_s, rel=1e-6)
        assert sim.energy_j == pytest.approx(point.energy_j, rel=1e-6)
    assert frontier.default_point().time_s <= frontier.baseline_time_s * (1 + 1e-9)
    assert np.all(np.diff([p.time_s for p in frontier.points]) >= 0)
