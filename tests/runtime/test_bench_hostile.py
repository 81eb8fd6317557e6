"""``benchmarks/bench_hostile.py``: each fast fault case drives the real runtime and gives a row of
the bench's JSON with every field, of its type; and the runtime survives each fault as the bench's
acceptance says (training goes on, no lock of Perseus's left, at most one line). Stalls are timing:
here only a hang guard, the bench reports them against its 1 s limit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_hostile as bench  # the benchmarks folder is not a package

HANG_GUARD_S = 10.0
FIELDS = {"fault": str, "training_continued": bool, "max_stall_s": float, "clocks_locked_at_exit": bool,
          "message_lines": int, "steps": int, "baseline": str, "start_s": float, "close_s": float,
          "phase_at_end": str, "runtime_events": list, "messages": list}


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> bench.Case:
    folder = tmp_path_factory.mktemp("hostile")
    found = bench.Case(folder, bench.cache_plan(folder))
    control = bench.control(found)
    check_row(control)
    assert control["training_continued"] and not control["clocks_locked_at_exit"]
    return found


def check_row(row: dict) -> None:
    assert json.loads(json.dumps(row)) == row  # plain JSON values
    for name, kind in FIELDS.items():
        assert isinstance(row[name], kind), (name, row[name])
    assert row["error"] is None or isinstance(row["error"], str)
    assert row["message_lines"] >= 0 and row["max_stall_s"] >= 0.0
    assert all(isinstance(m, str) for m in row["messages"])


def test_the_fast_cases_are_faults_the_bench_names():
    assert set(bench.FAST) < set(bench.FAULTS) == set(bench.CASES)
    assert bench.FAULTS == ("follower_error", "nvml_energy_transient", "nvml_energy_dead", "lock_refused_midrun",
                            "root_without_cap", "mig", "foreign_lock", "second_process")


@pytest.mark.parametrize("fault", bench.FAST)
def test_each_fast_fault_gives_a_full_row_and_the_job_survives_it(case, fault):
    row = bench.CASES[fault](case)
    assert row["fault"] == fault
    if "not_available" in row:  # root_without_cap on a config without ``without_clock_access``
        assert row["training_continued"] is None
        return
    check_row(row)
    if fault not in ("root_without_cap", "mig", "foreign_lock"):
        assert row["fault_began"] is True and row["steps_before_fault"] >= 1
    if fault == "foreign_lock":
        assert isinstance(row["foreign_lock_left_alone"], bool) and isinstance(row["foreign_lock_untouched"], bool)
        assert "Perseus made" in row["clocks_locked_at_exit_counts"]
        assert row["foreign_lock_left_alone"]
    assert row["training_continued"], row["error"]
    assert row["clocks_locked_at_exit"] is False
    assert row["message_lines"] <= 1, row["messages"]
    assert row["max_stall_s"] < HANG_GUARD_S


def test_json_prints_one_object_with_a_row_per_fault_asked(capsys):
    # --faults-only: the measurements (their own test below) would add their keys and run for minutes
    assert bench.main(["--json", "--only", "mig", "--faults-only"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"faults", "control"}
    assert [r["fault"] for r in out["faults"]] == ["mig"] and isinstance(out["faults"][0]["ok"], bool)
    check_row(out["faults"][0])
    check_row(out["control"])


def test_the_measurements_are_flat_keys_and_a_failing_one_is_reported_not_raised(monkeypatch):
    def broken() -> dict:
        raise RuntimeError("no simulated GPU\nsecond line")

    monkeypatch.setattr(bench, "MEASURES", {"ok": lambda: {"attr_error_forward": 0.01, "power_over_limit": 0},
                                            "broken": broken})
    out = bench.measure(("ok", "broken"))
    assert out == {"attr_error_forward": 0.01, "power_over_limit": 0, "broken_error": "RuntimeError: no simulated GPU"}
    text = bench.table({"control": {"fault": "none", "not_available": "x"}, "faults": [], **out})
    assert "attr_error_forward" in text and "broken_error: RuntimeError: no simulated GPU" in text


def test_every_acceptance_key_has_a_measurement_and_a_target():
    keys = {k for k, _, _ in bench.TARGETS}
    assert keys == {"attr_error_forward", "attr_error_backward", "power_over_limit", "latency_calibration_error",
                    "own_clock_share", "fastest_plan_vs_unlocked", "energy_guard_dropped", "energy_guard_steps",
                    "energy_guard_false_drops"}
    assert set(bench.MEASURES) == {"attribution", "switch_latency", "unlocked", "energy_guard"}
    assert bench.meets("own_clock_share", 0.96, 0.95, ">=") and not bench.meets("power_over_limit", 1, 0, "==")
    assert not bench.meets("energy_guard_steps", None, 100, "<=")


def test_the_energy_guard_measurement_drops_the_lying_plans_and_keeps_the_honest(monkeypatch):
    monkeypatch.setattr(bench, "GUARD_SEEDS", 4)
    out = bench.guard_measure()
    assert out["energy_guard_dropped"] is True and out["energy_guard_steps"] <= 100
    assert out["energy_guard_false_drops"] == 0 and out["energy_guard_honest_runs"] == 16
