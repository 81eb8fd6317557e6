"""megatron-core's overlap_p2p_comm is part of a job's identity wherever a schedule is rebuilt.

Megatron-LM runs interleaved pipelines with ``overlap_p2p_comm`` on unless told otherwise; the
order is the same, the waits are not (perseus/schedules/exchanges.py), so a plan for one is not a plan for the
other. The job, the schedule, the runtime's cache key, the frontier file, the emulator's cache and
``perseus plan`` all carry it; off is recorded as nothing, so every key and file written before
keeps its meaning.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from perseus.store.cache import RunCache
from perseus.cli import main
from perseus.errors import ConfigError, FrontierError
from perseus.frontier import Frontier, FrontierPoint, load_frontier
from perseus.frontier.codec import encode_frontier_json, frontier_from_json_dict, save_frontier
from perseus.frontier.v1 import encode_v1
from perseus.runtime.config import PerseusConfig
from perseus.runtime.job import PipelineJob
from perseus.runtime.supply.sources import _root_sources, cache_key
from perseus.schedules import build_schedule

SHAPE = ("interleaved", 4, 8, 2)


def frontier_for(schedule) -> Frontier:
    n = schedule.num_instructions
    return Frontier(schedule, 50.0, 1.0, 10.0, [FrontierPoint(1.0, 10.0, np.full(n, 1410)),
                                                 FrontierPoint(1.2, 9.0, np.arange(n) % 3 * 100 + 1000)])


def test_the_job_builds_its_schedule_with_overlapped_p2p():
    job = PipelineJob(num_stages=4, num_microbatches=8, stage=1, schedule="interleaved", num_chunks=2, overlap_p2p=True)
    assert job.build_schedule() == build_schedule(*SHAPE, overlap_p2p=True) != build_schedule(*SHAPE)


def test_the_cache_key_names_overlapped_p2p_only_when_on():
    job = PipelineJob(num_stages=4, num_microbatches=8, stage=0, schedule="interleaved", num_chunks=2)
    config = PerseusConfig()
    default = cache_key(job, build_schedule(*SHAPE), "GPU", "1", config)
    assert "overlap_p2p" not in default
    assert cache_key(job, build_schedule(*SHAPE, overlap_p2p=True), "GPU", "1", config) == {**default, "overlap_p2p": True}


def test_frontier_files_round_trip_overlapped_p2p_and_old_files_mean_blocking(tmp_path):
    overlapped = frontier_for(build_schedule(*SHAPE, overlap_p2p=True))
    save_frontier(overlapped, tmp_path / "o.json")
    assert json.loads((tmp_path / "o.json").read_text())["overlap_p2p"] is True
    assert load_frontier(tmp_path / "o.json").schedule == overlapped.schedule
    assert frontier_from_json_dict(encode_v1(overlapped)).schedule == overlapped.schedule  # version 1 too
    default = encode_frontier_json(frontier_for(build_schedule(*SHAPE)))
    assert "overlap_p2p" not in default and frontier_from_json_dict(default).schedule.overlap_p2p is False
    garbled = {**encode_frontier_json(overlapped), "overlap_p2p": "yes"}
    with pytest.raises(FrontierError, match="overlap_p2p must be true or false"):
        frontier_from_json_dict(garbled)


def test_a_provided_frontier_for_blocking_exchanges_is_refused_for_an_overlapped_job(tmp_path):
    save_frontier(frontier_for(build_schedule(*SHAPE)), tmp_path / "f.json")
    config = PerseusConfig(frontier_path=str(tmp_path / "f.json"), cache_dir=None)
    with pytest.raises(ConfigError) as err:
        _root_sources(config, build_schedule(*SHAPE, overlap_p2p=True), None)
    assert "\n" not in str(err.value) and "overlapped p2p" in str(err.value)


def test_a_cached_frontier_for_the_other_exchanges_is_planned_again(tmp_path):
    cache = RunCache(tmp_path, {"schedule": "interleaved"})
    cache.save_frontier(frontier_for(build_schedule(*SHAPE, overlap_p2p=True)))
    assert cache.load_frontier(build_schedule(*SHAPE)) is None
    assert cache.load_frontier(build_schedule(*SHAPE, overlap_p2p=True)) is not None


def test_perseus_plan_takes_overlap_p2p_and_plans_on_its_dag(tmp_path, capsys):
    out = tmp_path / "f.json"
    argv = ["plan", "--example", "--schedule", "interleaved", "--chunks", "2", "--microbatches", "8",
            "--overlap-p2p", "--max-points", "3", "--out", str(out)]
    assert main(argv) == 0
    assert load_frontier(out).schedule == build_schedule(*SHAPE, overlap_p2p=True)
    capsys.readouterr()
    assert main(["plan", "--example", "--microbatches", "8", "--overlap-p2p", "--out", str(tmp_path / "x.json")]) != 0
    err = capsys.readouterr().err.strip()
    assert "interleaved schedule only" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_the_emulators_cache_entry_differs_with_overlapped_p2p(tmp_path):
    from perseus.timeline.emulator import frontier_cache_path
    from perseus.examples import load_example_profile
    from perseus.profile import split_into_chunks

    profile = split_into_chunks(load_example_profile(), 2)
    assert frontier_cache_path(tmp_path, build_schedule(*SHAPE, overlap_p2p=True), profile) != \
        frontier_cache_path(tmp_path, build_schedule(*SHAPE), profile)
