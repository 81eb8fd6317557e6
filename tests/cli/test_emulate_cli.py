"""perseus emulate: single straggler factor and --sweep, on hand-built frontiers."""

from __future__ import annotations

import perseus.cli.planning
from perseus.cli import main
from perseus.frontier import save_frontier

from cli_helpers import hand_frontier


def test_emulate_from_frontier_file_prints_hand_computed_savings(tmp_path, capsys):
    path = tmp_path / "f.json"
    save_frontier(hand_frontier(), path)
    # see test_emulator: 832 J, 752 J (9.62%), 680 J (18.27%)
    assert main(["emulate", "--frontier", str(path), "--gpus", "16", "--tp", "2", "--straggler-factor", "1.2"]) == 0
    out = capsys.readouterr().out
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert "832 J" in lines["(1) all max frequency"]
    assert "752 J" in lines["(2) Perseus, intrinsic only"] and "9.62%" in lines["(2) Perseus, intrinsic only"]
    assert "680 J" in lines["(3) Perseus, straggler-matched"] and "18.27%" in lines["(3) Perseus, straggler-matched"]
    assert "16 GPUs = 4 pipelines x 2 stages x TP 2" in out
    # --dp 4 is the same job
    assert main(["emulate", "--frontier", str(path), "--dp", "4", "--tp", "2", "--straggler-factor", "1.2"]) == 0
    assert "18.27%" in capsys.readouterr().out


def test_sweep_plans_once_per_microbatch_count_and_caches_on_disk(tmp_path, monkeypatch, small_profile_csv, capsys):
    calls = []

    def plan(schedule, profile, progress=None):
        calls.append(schedule.num_microbatches)
        # more microbatches -> smaller intrinsic saving, like the paper's trend
        return hand_frontier(energies=(100.0 - 120 / schedule.num_microbatches, 80.0, 75.0), microbatches=schedule.num_microbatches)

    monkeypatch.setattr(perseus.cli.planning, "run_planner", plan)
    argv = ["emulate", "--profile", str(small_profile_csv), "--p-blocking", "80", "--stages", "2", "--gpus", "16", "--tp", "2",
            "--sweep", "--microbatches", "12,24", "--straggler-factor", "1.0,1.2", "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert calls == [12, 24]
    assert main(argv) == 0
    assert calls == [12, 24]  # second run reads the cached frontiers
    assert capsys.readouterr().out == first
    intrinsic_table = first.split("(2) Perseus, intrinsic only")[1].split("(3)")[0]
    row12 = next(line.split() for line in intrinsic_table.splitlines() if line.strip().startswith("12"))
    row24 = next(line.split() for line in intrinsic_table.splitlines() if line.strip().startswith("24"))
    assert row12[-2] == "10.00%" and row24[-2] == "5.00%"  # factor 1.0: 1 - E_default / 100


def test_emulate_example_plans_and_reports(capsys):
    assert main(["emulate", "--example", "--microbatches", "4", "--gpus", "1024", "--tp", "8", "--straggler-factor", "1.1"]) == 0
    out = capsys.readouterr().out
    assert "1024 GPUs = 32 pipelines x 4 stages x TP 8" in out and "(3) Perseus, straggler-matched" in out
    # what the control plane costs at this size: 7 tensor-parallel + 3 stage + 31 replica peers
    assert "control plane: 41 peers per rank" in out and "one world gloo group: 1,023" in out


def test_bad_job_or_factor_is_reported_before_planning(monkeypatch, capsys):
    def planner_must_not_run(*args, **kwargs):
        raise AssertionError("planned before validating the arguments")

    monkeypatch.setattr(perseus.cli.planning, "run_planner", planner_must_not_run)
    assert main(["emulate", "--example", "--gpus", "1024", "--tp", "8", "--straggler-factor", "0.9"]) == 2
    assert main(["emulate", "--example", "--gpus", "1000", "--tp", "8", "--straggler-factor", "1.1"]) == 2
    assert main(["emulate", "--example", "--gpus", "1024", "--sweep", "--straggler-factor", "1.0,0.5"]) == 2
    assert capsys.readouterr().err.count("perseus: error:") == 3
