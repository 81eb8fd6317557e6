"""Emulator arithmetic on hand-built frontiers (expected values worked out by hand)."""

import json
import logging

import pytest

from perseus.store.cache import DAG_MODEL_FIELD, FRONTIER_FILE, KEY_FILE
from perseus.timeline.emulator import DataParallelJob, cached_frontier, emulate, frontier_cache_path, sweep
from perseus.errors import ConfigError, FrontierError
from perseus.profile import load_csv
from perseus.schedules import DAG_MODEL_VERSION, build_schedule

from cli_helpers import hand_frontier


def test_job_splits_gpus_into_pipelines():
    job = DataParallelJob.from_gpus(1024, 8, 8)
    assert (job.num_pipelines, job.num_gpus) == (16, 1024)
    with pytest.raises(ConfigError, match="do not split"):
        DataParallelJob.from_gpus(1000, 8, 8)


def test_three_policies_with_a_straggler_by_hand():
    # 2 stages, TP 2, 16 GPUs -> 4 pipelines; baseline 1.0 s / 100 J; P_blocking 10 W; factor 1.2.
    # Iteration lasts 1.2 s. Pipeline energy = E + 2 * 10 * (1.2 - t).
    # (1) 4 * (100 + 4) = 416 per TP rank -> 832 J.
    # (2) straggler and others at the no-slowdown point (1.0 s, 90 J): 4 * 94 = 376 -> 752 J.
    # (3) others at lookup(1.2 s) = (1.1 s, 80 J): 80 + 2 = 82; 94 + 3 * 82 = 340 -> 680 J.
    result = emulate(hand_frontier(), DataParallelJob.from_gpus(16, 2, 2), 1.2)
    assert result.iteration_time_s == pytest.approx(1.2)
    assert result.all_max_j == pytest.approx(832.0)
    assert result.intrinsic_j == pytest.approx(752.0)
    assert result.straggler_matched_j == pytest.approx(680.0)
    assert result.intrinsic_saving == pytest.approx(80 / 832)
    assert result.straggler_matched_saving == pytest.approx(152 / 832)
    assert result.matched_point.time_s == 1.1


def test_no_straggler_gives_the_single_pipeline_intrinsic_saving():
    result = emulate(hand_frontier(), DataParallelJob.from_gpus(64, 4, 2), 1.0)
    assert result.intrinsic_saving == pytest.approx(0.10)  # 1 - 90/100
    assert result.straggler_matched_saving == pytest.approx(0.10)


def test_intrinsic_point_faster_than_baseline_blocks_until_the_straggler():
    # Default point (0.9 s, 95 J): 95 + 2*10*(1.0 - 0.9) = 97 per pipeline at factor 1.0.
    frontier = hand_frontier(times=(0.9, 1.3), energies=(95.0, 70.0))
    result = emulate(frontier, DataParallelJob(3, 2, 1), 1.0)
    assert result.intrinsic_j == pytest.approx(3 * 97.0)
    # factor 1.5: others at (1.3, 70): 70 + 20*0.2 = 74; straggler 95 + 20*0.6 = 107; all-max 3*(100+10)
    result = emulate(frontier, DataParallelJob(3, 2, 1), 1.5)
    assert result.straggler_matched_j == pytest.approx(107 + 2 * 74)
    assert result.all_max_j == pytest.approx(330.0)


def test_bad_factor_and_stage_mismatch_are_user_errors():
    with pytest.raises(ConfigError, match=">= 1.0"):
        emulate(hand_frontier(), DataParallelJob(2, 2, 1), 0.9)
    with pytest.raises(FrontierError, match="stages"):
        emulate(hand_frontier(), DataParallelJob(2, 4, 1), 1.1)


def test_sweep_plans_once_per_microbatch_count():
    calls = []

    def frontier_for(m):
        calls.append(m)
        return hand_frontier(energies=(90.0 if m == 12 else 95.0, 80.0, 75.0))

    rows = sweep(frontier_for, [12, 24], [1.0, 1.2], num_gpus=16, tensor_parallel=2, num_stages=2)
    assert calls == [12, 24]
    assert [r.microbatches for r in rows] == [12, 24]
    assert rows[0].results[0].intrinsic_saving == pytest.approx(0.10)
    assert rows[1].results[0].intrinsic_saving == pytest.approx(0.05)
    assert rows[0].results[1].straggler_matched_saving == pytest.approx(152 / 832)
    by_dp = sweep(frontier_for, [12], [1.2], num_gpus=None, tensor_parallel=2, num_stages=2, num_pipelines=4)
    assert by_dp[0].results[0].all_max_j == pytest.approx(832.0)


def test_cached_frontier_reuses_the_saved_file(tmp_path, small_profile_csv):
    profile = load_csv(small_profile_csv, 80.0)
    schedule = build_schedule("1f1b", 2, 2)
    calls = []

    def plan(s, p):
        calls.append(s.num_microbatches)
        return hand_frontier()

    first = cached_frontier(schedule, profile, plan, tmp_path / "cache")
    second = cached_frontier(schedule, profile, plan, tmp_path / "cache")
    assert calls == [2]
    assert [p.energy_j for p in second.points] == [p.energy_j for p in first.points]
    other = profile.with_p_blocking(90.0)  # a different profile must not hit the same file
    assert frontier_cache_path(tmp_path, schedule, other) != frontier_cache_path(tmp_path, schedule, profile)


def test_cached_frontier_is_the_runtime_cache_and_replans_a_stale_or_corrupt_entry(tmp_path, small_profile_csv, caplog):
    profile = load_csv(small_profile_csv, 80.0)
    schedule = build_schedule("1f1b", 2, 2)
    calls = []

    def plan(s, p):
        calls.append(s.num_microbatches)
        return hand_frontier()

    cache_dir = tmp_path / "cache"
    cached_frontier(schedule, profile, plan, cache_dir)
    path = frontier_cache_path(cache_dir, schedule, profile)
    assert path.name == FRONTIER_FILE and (path.parent / KEY_FILE).is_file()  # the runtime's layout
    data = json.loads(path.read_text())
    assert data["metadata"][DAG_MODEL_FIELD] == DAG_MODEL_VERSION
    data["metadata"][DAG_MODEL_FIELD] = DAG_MODEL_VERSION - 1  # planned under older dependency rules
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        cached_frontier(schedule, profile, plan, cache_dir)
    assert calls == [2, 2] and "older model of the schedule's dependencies" in caplog.text
    path.write_text(path.read_text()[:100])  # truncated: warned about and planned again, not an error
    cached_frontier(schedule, profile, plan, cache_dir)
    assert calls == [2, 2, 2] and "corrupt" in caplog.text
    cached_frontier(schedule, profile, plan, cache_dir)
    assert calls == [2, 2, 2]
