"""Run cache: reuse when the key matches; warn and rebuild on corrupt or foreign files."""

import json
import logging

import numpy as np

from perseus.frontier import Frontier, FrontierPoint
from perseus.profile import InstructionProfile, uniform_profile
from perseus.store.cache import RunCache, key_hash
from perseus.schedules import build_schedule

KEY = {"model": {"layers": 4}, "schedule": "1f1b", "stages": 2, "microbatches": 4, "chunks": 1,
       "gpu_name": "SimGPU", "driver_version": "sim-1"}


def make_profile():
    ip = InstructionProfile((1000, 900), (0.01, 0.012), (1.0, 0.9))
    return uniform_profile(2, {"forward": ip, "backward": ip}, 50.0)


def make_frontier(schedule):
    n = schedule.num_instructions
    return Frontier(schedule, 50.0, 1.0, 10.0, [FrontierPoint(1.0, 10.0, np.full(n, 1000)),
                                                 FrontierPoint(1.2, 9.0, np.full(n, 900))])


def test_the_runtime_uses_the_librarys_one_cache():
    import perseus.store.cache

    assert perseus.store.cache.RunCache is RunCache


def test_hash_ignores_dict_order():
    assert key_hash({"a": 1, "b": 2}) == key_hash({"b": 2, "a": 1}) != key_hash({"a": 1, "b": 3})


def test_roundtrip_and_reuse(tmp_path):
    sched = build_schedule("1f1b", 2, 4)
    cache = RunCache(tmp_path, KEY)
    assert cache.load_profile() is None and cache.load_frontier(sched) is None
    cache.save_profile(make_profile())
    cache.save_frontier(make_frontier(sched))
    again = RunCache(tmp_path, dict(reversed(list(KEY.items()))))
    assert again.dir == cache.dir
    prof = again.load_profile()
    assert prof is not None and prof.get(1, "backward").at(900) == (0.012, 0.9)
    front = again.load_frontier(sched)
    assert front is not None and len(front.points) == 2
    assert not list(cache.dir.glob("*.tmp")), "atomic writes leave no temporary files"


def test_corrupt_profile_is_reported_and_not_used(tmp_path, caplog):
    cache = RunCache(tmp_path, KEY)
    cache.save_profile(make_profile())
    cache.profile_path.write_text('{"format": "perseus-profile", "version": 1, "measurements": [')
    with caplog.at_level(logging.WARNING, logger="perseus.runtime"):
        assert cache.load_profile() is None
    assert "profile.json" in caplog.text and "corrupt" in caplog.text


def test_foreign_key_file_is_reported(tmp_path, caplog):
    cache = RunCache(tmp_path, KEY)
    cache.save_profile(make_profile())
    (cache.dir / "key.json").write_text(json.dumps({**KEY, "microbatches": 8}))
    with caplog.at_level(logging.WARNING, logger="perseus.runtime"):
        assert cache.load_profile() is None
    assert "key.json" in caplog.text and "microbatches" in caplog.text


def test_file_copied_from_another_key_is_reported(tmp_path, caplog):
    other = RunCache(tmp_path, {**KEY, "microbatches": 8})
    other.save_profile(make_profile())
    cache = RunCache(tmp_path, KEY)
    cache.save_profile(make_profile())
    cache.profile_path.write_text(other.profile_path.read_text())
    with caplog.at_level(logging.WARNING, logger="perseus.runtime"):
        assert cache.load_profile() is None
    assert "written for cache key" in caplog.text


def test_frontier_for_other_schedule_is_rejected(tmp_path, caplog):
    cache = RunCache(tmp_path, KEY)
    cache.save_frontier(make_frontier(build_schedule("gpipe", 2, 4)))
    with caplog.at_level(logging.WARNING, logger="perseus.runtime"):
        assert cache.load_frontier(build_schedule("1f1b", 2, 4)) is None
    assert "different schedule" in caplog.text


def test_frontier_planned_under_older_dependency_rules_is_replanned(tmp_path, caplog):
    sched = build_schedule("1f1b", 2, 4)
    cache = RunCache(tmp_path, KEY)
    cache.save_frontier(make_frontier(sched))
    data = json.loads(cache.frontier_path.read_text())
    data["metadata"]["dag_model"] = 1  # before interleaved joint receives were modelled
    cache.frontier_path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="perseus.runtime"):
        assert cache.load_frontier(sched) is None
    assert "older model of the schedule's dependencies" in caplog.text
    cache.save_frontier(make_frontier(sched))
    assert cache.load_frontier(sched) is not None


def test_a_version_1_frontier_in_the_cache_is_still_used(tmp_path):
    from perseus.frontier.v1 import encode_v1

    sched = build_schedule("1f1b", 2, 4)
    cache = RunCache(tmp_path, KEY)
    cache.save_frontier(make_frontier(sched))  # stamps the key hash and dependency-model version
    v2 = json.loads(cache.frontier_path.read_text())
    assert v2["version"] == 2
    cache.frontier_path.write_text(json.dumps(encode_v1(cache.load_frontier(sched))))  # as an older perseus wrote it
    front = cache.load_frontier(sched)
    assert front is not None and [p.time_s for p in front.points] == [1.0, 1.2]


def test_partial_profile_round_trip_corrupt_and_cleared(tmp_path, caplog):
    cache = RunCache(tmp_path, KEY)
    assert cache.load_partial() is None
    cache.save_partial({"sweep": {"visited": [1410]}, "world": 1, "ranks": []})
    got = cache.load_partial()
    assert got["sweep"] == {"visited": [1410]} and got["cache_key"] == cache.hash
    assert RunCache(tmp_path, {**KEY, "stages": 3}).load_partial() is None, "another job's key"
    cache.partial_path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="perseus"):
        assert cache.load_partial() is None
    assert "partial_profile.json is unreadable" in caplog.text
    cache.clear_partial()
    cache.clear_partial()  # idempotent
    assert not cache.partial_path.exists()
