"""megatron-core's microbatch group size is part of a job's identity wherever a schedule is rebuilt.

A non-default ``microbatch_group_size_per_vp_stage`` changes the interleaved order, so the job,
the schedule, the runtime's cache key, the frontier file and ``perseus plan`` all carry it: a plan
made for one group size is never deployed under another. The default (the stage count) is
recorded as nothing, so every cache key and frontier file written before keeps its meaning.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from perseus.store.cache import RunCache
from perseus.cli import main
from perseus.errors import ConfigError, FrontierError, ScheduleError
from perseus.frontier import Frontier, FrontierPoint, load_frontier
from perseus.frontier.codec import encode_frontier_json, frontier_from_json_dict, save_frontier
from perseus.frontier.v1 import encode_v1
from perseus.runtime.config import PerseusConfig
from perseus.runtime.job import PipelineJob
from perseus.runtime.supply.sources import _root_sources, cache_key
from perseus.schedules import build_schedule

GROUPED = ("interleaved", 4, 12, 2)  # group 6 is not the default 4


def frontier_for(schedule) -> Frontier:
    n = schedule.num_instructions
    return Frontier(schedule, 50.0, 1.0, 10.0, [FrontierPoint(1.0, 10.0, np.full(n, 1410)),
                                                 FrontierPoint(1.2, 9.0, np.arange(n) % 3 * 100 + 1000)])


def test_the_group_size_is_part_of_the_schedule_and_the_default_is_recorded_as_none():
    default = build_schedule(*GROUPED)
    assert default.group_size is None and build_schedule(*GROUPED, group_size=4) == default
    grouped = build_schedule(*GROUPED, group_size=6)
    assert grouped.group_size == 6 and grouped != default and grouped.stages != default.stages
    assert "microbatch group size 6" in grouped.describe() and "group" not in default.describe()


@pytest.mark.parametrize("name, chunks", [("1f1b", 1), ("gpipe", 1), ("torch-interleaved", 2)])
def test_a_group_size_for_another_schedule_is_a_schedule_error(name, chunks):
    with pytest.raises(ScheduleError, match="interleaved schedule only"):
        build_schedule(name, 4, 12, chunks, group_size=6)


def test_the_job_builds_its_schedule_with_its_group_size():
    job = PipelineJob(num_stages=4, num_microbatches=12, stage=1, schedule="interleaved", num_chunks=2, group_size=6)
    assert job.build_schedule() == build_schedule(*GROUPED, group_size=6)
    assert job != PipelineJob(num_stages=4, num_microbatches=12, stage=1, schedule="interleaved", num_chunks=2)


def test_the_cache_key_names_a_non_default_group_size_only():
    job = PipelineJob(num_stages=4, num_microbatches=12, stage=0, schedule="interleaved", num_chunks=2)
    config = PerseusConfig()
    default = cache_key(job, build_schedule(*GROUPED), "GPU", "1", config)
    assert "group_size" not in default  # keys of default jobs are what they were before the field existed
    assert cache_key(job, build_schedule(*GROUPED, group_size=4), "GPU", "1", config) == default
    grouped = cache_key(job, build_schedule(*GROUPED, group_size=6), "GPU", "1", config)
    assert grouped == {**default, "group_size": 6}


def test_frontier_files_round_trip_the_group_size_and_old_files_mean_the_default(tmp_path):
    grouped = frontier_for(build_schedule(*GROUPED, group_size=6))
    save_frontier(grouped, tmp_path / "g.json")
    assert json.loads((tmp_path / "g.json").read_text())["group_size"] == 6
    assert load_frontier(tmp_path / "g.json").schedule == grouped.schedule
    assert frontier_from_json_dict(encode_v1(grouped)).schedule == grouped.schedule  # version 1 too

    default = encode_frontier_json(frontier_for(build_schedule(*GROUPED)))
    assert "group_size" not in default  # as every file written before the field existed
    assert frontier_from_json_dict(default).schedule.group_size is None

    # a grouped plan with its group size stripped is refused, not applied to the default order
    stripped = encode_frontier_json(grouped)
    del stripped["group_size"]
    with pytest.raises(FrontierError, match="do not follow the interleaved order"):
        frontier_from_json_dict(stripped)


def test_a_provided_frontier_for_another_group_size_is_refused_in_one_line(tmp_path):
    save_frontier(frontier_for(build_schedule(*GROUPED, group_size=6)), tmp_path / "f.json")
    config = PerseusConfig(frontier_path=str(tmp_path / "f.json"), cache_dir=None)
    with pytest.raises(ConfigError) as err:
        _root_sources(config, build_schedule(*GROUPED), None)
    message = str(err.value)
    assert "\n" not in message and "microbatch group size 6" in message and "plan for this job" in message
    source, frontier, profile = _root_sources(config, build_schedule(*GROUPED, group_size=6), None)
    assert frontier is not None and frontier.schedule.group_size == 6 and profile is None
    assert source["origin"].startswith("frontier ")


def test_a_cached_frontier_for_another_group_size_is_planned_again(tmp_path):
    cache = RunCache(tmp_path, {"schedule": "interleaved"})
    cache.save_frontier(frontier_for(build_schedule(*GROUPED, group_size=6)))
    assert cache.load_frontier(build_schedule(*GROUPED)) is None
    assert cache.load_frontier(build_schedule(*GROUPED, group_size=6)) is not None


def test_perseus_plan_takes_a_group_size(tmp_path, capsys):
    out = tmp_path / "f.json"
    argv = ["plan", "--example", "--schedule", "interleaved", "--chunks", "2", "--microbatches", "12",
            "--group-size", "6", "--max-points", "3", "--out", str(out)]
    assert main(argv) == 0
    assert load_frontier(out).schedule == build_schedule(*GROUPED, group_size=6)
    capsys.readouterr()
    assert main(["plan", "--example", "--microbatches", "12", "--group-size", "6", "--out", str(tmp_path / "x.json")]) != 0
    err = capsys.readouterr().err.strip()
    assert "interleaved schedule only" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_the_emulators_cache_entry_differs_for_another_group_size(tmp_path):
    from perseus.timeline.emulator import frontier_cache_path
    from perseus.examples import load_example_profile
    from perseus.profile import split_into_chunks

    profile = split_into_chunks(load_example_profile(), 2)
    default = frontier_cache_path(tmp_path, build_schedule(*GROUPED), profile)
    assert frontier_cache_path(tmp_path, build_schedule(*GROUPED, group_size=4), profile) == default
    assert frontier_cache_path(tmp_path, build_schedule(*GROUPED, group_size=6), profile) != default
