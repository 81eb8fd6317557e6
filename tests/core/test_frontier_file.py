"""Frontier file version 2 (compact clocks, schedule stored once) and reading version 1 files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from perseus.errors import FrontierError
from perseus.frontier import Frontier, FrontierPoint, load_frontier
from perseus.frontier.codec import encode_frontier_json, frontier_from_json_dict
from perseus.frontier.v1 import encode_v1
from perseus.schedules import build_schedule
from perseus.frontier import save_frontier

sys.path.insert(0, str(Path(__file__).parents[1]))
import random_frontiers

# A version 1 file as perseus 0.1 wrote it (1F1B, 2 stages x 2 microbatches), trimmed of nothing.
V1_LITERAL = """{"format":"perseus-frontier","version":1,"order":"fastest_first","schedule":"1f1b","stages":2,
"microbatches":2,"chunks":1,"p_blocking_w":80.0,"gpu_name":"A100","baseline":{"time_s":1.0,"energy_j":100.0},
"solve_time_s":0.25,"metadata":{"created_by":"perseus 0.1.0 plan","profile":"example"},
"points":[
 {"time_s":1.0,"energy_j":90.0,"plan":[
  [{"kind":"forward","microbatch":0,"chunk":0,"freq_mhz":1410},{"kind":"forward","microbatch":1,"chunk":0,"freq_mhz":1400},
   {"kind":"backward","microbatch":0,"chunk":0,"freq_mhz":1410},{"kind":"backward","microbatch":1,"chunk":0,"freq_mhz":1300}],
  [{"kind":"forward","microbatch":0,"chunk":0,"freq_mhz":1410},{"kind":"backward","microbatch":0,"chunk":0,"freq_mhz":1410},
   {"kind":"forward","microbatch":1,"chunk":0,"freq_mhz":1410},{"kind":"backward","microbatch":1,"chunk":0,"freq_mhz":1410}]]},
 {"time_s":1.2,"energy_j":80.0,"plan":[
  [{"kind":"forward","microbatch":0,"chunk":0,"freq_mhz":1000},{"kind":"forward","microbatch":1,"chunk":0,"freq_mhz":1000},
   {"kind":"backward","microbatch":0,"chunk":0,"freq_mhz":1000},{"kind":"backward","microbatch":1,"chunk":0,"freq_mhz":1000}],
  [{"kind":"forward","microbatch":0,"chunk":0,"freq_mhz":1200},{"kind":"backward","microbatch":0,"chunk":0,"freq_mhz":1200},
   {"kind":"forward","microbatch":1,"chunk":0,"freq_mhz":1200},{"kind":"backward","microbatch":1,"chunk":0,"freq_mhz":1200}]]}],
"paced_points":[
 {"time_s":1.3,"energy_j":81.0,"plan":[
  [{"kind":"forward","microbatch":0,"chunk":0,"freq_mhz":900},{"kind":"forward","microbatch":1,"chunk":0,"freq_mhz":900},
   {"kind":"backward","microbatch":0,"chunk":0,"freq_mhz":900},{"kind":"backward","microbatch":1,"chunk":0,"freq_mhz":900}],
  [{"kind":"forward","microbatch":0,"chunk":0,"freq_mhz":900},{"kind":"backward","microbatch":0,"chunk":0,"freq_mhz":900},
   {"kind":"forward","microbatch":1,"chunk":0,"freq_mhz":900},{"kind":"backward","microbatch":1,"chunk":0,"freq_mhz":900}]]}]}
"""


def random_frontier(schedule_args=("interleaved", 4, 8, 2), num_points=40, num_paced=7, clocks=None, seed=0) -> Frontier:
    """With a solve time and metadata, which the file keeps."""
    return random_frontiers.random_frontier(schedule_args, num_points, num_paced, clocks=clocks, seed=seed, solve_time_s=12.5,
                                            metadata={"created_by": "test", "profile": "p.csv", "cache_key": "abc"})


def assert_same(a: Frontier, b: Frontier) -> None:
    assert b.schedule == a.schedule
    assert (b.p_blocking_w, b.baseline_time_s, b.baseline_energy_j) == (a.p_blocking_w, a.baseline_time_s, a.baseline_energy_j)
    assert (b.gpu_name, b.solve_time_s, b.metadata) == (a.gpu_name, a.solve_time_s, a.metadata)
    for mine, theirs in ((a.points, b.points), (a.paced_points, b.paced_points)):
        assert [(p.time_s, p.energy_j) for p in theirs] == [(p.time_s, p.energy_j) for p in mine]  # exactly
        assert len(theirs) == len(mine)
        for p, q in zip(mine, theirs):
            assert q.freqs_mhz.dtype == np.int64 and np.array_equal(q.freqs_mhz, p.freqs_mhz)


@pytest.mark.parametrize("clocks", [None, np.arange(200, 2200, 2)], ids=["uint8", "uint16"])
def test_round_trip_keeps_every_point_exactly(tmp_path, clocks):
    f = random_frontier(clocks=clocks)
    save_frontier(f, tmp_path / "f.json")
    data = json.loads((tmp_path / "f.json").read_text())
    assert data["version"] == 2
    assert data["points"]["clock_index"]["dtype"] == ("uint8" if clocks is None else "uint16")
    assert_same(f, load_frontier(tmp_path / "f.json"))


def test_schedule_is_stored_once_and_clocks_once_per_distinct_value():
    f = random_frontier()
    data = encode_frontier_json(f)
    assert data["instructions"] == [[[i.kind, i.microbatch, i.chunk] for i in stage] for stage in f.schedule.stages]
    used = np.unique(np.concatenate([p.freqs_mhz for p in f.points + f.paced_points]))
    assert data["clocks_mhz"] == used.tolist()
    assert "plan" not in json.dumps(data["points"])


def test_version_2_is_much_smaller_than_version_1():
    f = random_frontier(("1f1b", 8, 64), num_points=30, num_paced=5)
    v1 = len(json.dumps(encode_v1(f), separators=(",", ":")))
    v2 = len(json.dumps(encode_frontier_json(f), separators=(",", ":")))
    assert v2 * 10 < v1


def test_max_points_thins_both_lists():
    f = random_frontier(num_points=40, num_paced=30)
    back = frontier_from_json_dict(json.loads(json.dumps(encode_frontier_json(f, max_points=5))))
    assert len(back.points) <= 5 and len(back.paced_points) <= 5
    assert back.points[0].time_s == f.points[0].time_s and back.points[-1].time_s == f.points[-1].time_s


def test_a_version_1_file_written_by_the_old_writer_loads_to_the_same_frontier(tmp_path):
    f = random_frontier()
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(encode_v1(f), separators=(",", ":")))
    assert_same(f, load_frontier(path))


def test_a_version_1_literal_loads(tmp_path):
    path = tmp_path / "v1.json"
    path.write_text(V1_LITERAL)
    f = load_frontier(path)
    assert f.schedule == build_schedule("1f1b", 2, 2) and f.gpu_name == "A100" and f.solve_time_s == 0.25
    assert [(p.time_s, p.energy_j) for p in f.points] == [(1.0, 90.0), (1.2, 80.0)]
    assert f.points[0].freqs_mhz.tolist() == [1410, 1400, 1410, 1300, 1410, 1410, 1410, 1410]
    assert f.stage_plan(f.points[1], 1)[0][1] == 1200
    assert [p.time_s for p in f.paced_points] == [1.3] and f.paced_points[0].freqs_mhz.tolist() == [900] * 8
    assert f.metadata == {"created_by": "perseus 0.1.0 plan", "profile": "example"}
    save_frontier(f, tmp_path / "v2.json")  # and it converts to version 2 losslessly
    assert json.loads((tmp_path / "v2.json").read_text())["version"] == 2
    assert_same(f, load_frontier(tmp_path / "v2.json"))


def _corrupt(tmp_path, edit) -> str:
    data = encode_frontier_json(random_frontier(num_points=3, num_paced=1))
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FrontierError) as info:
        load_frontier(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


def test_malformed_version_2_files_name_the_problem(tmp_path):
    def drop_a_point(d):
        d["points"]["time_s"].pop()
        d["points"]["energy_j"].pop()

    def short_table(d):
        d["clocks_mhz"] = d["clocks_mhz"][:2]

    def unsorted_table(d):
        d["clocks_mhz"].reverse()

    def bad_base64(d):
        d["points"]["clock_index"]["data"] = d["points"]["clock_index"]["data"][:-7] + "!!"

    def unknown_dtype(d):
        d["paced_points"]["clock_index"]["dtype"] = "float16"

    def other_order(d):
        d["instructions"][1].reverse()

    assert "holds 384 clocks, expected 2 points x 128 instructions" in _corrupt(tmp_path, drop_a_point)
    assert "refers past the 2 entries" in _corrupt(tmp_path, short_table)
    assert "strictly increasing" in _corrupt(tmp_path, unsorted_table)
    assert "clock_index data is corrupt" in _corrupt(tmp_path, bad_base64)
    assert "dtype 'float16'" in _corrupt(tmp_path, unknown_dtype)
    assert "stage 1 do not follow the interleaved order" in _corrupt(tmp_path, other_order)
    assert "missing field 'clocks_mhz'" in _corrupt(tmp_path, lambda d: d.pop("clocks_mhz"))


@pytest.mark.parametrize("version", [3, 0, "2", None, True])
def test_unknown_version_is_named(tmp_path, version):
    def set_version(d):
        if version is None:
            del d["version"]
        else:
            d["version"] = version

    message = _corrupt(tmp_path, set_version)
    assert "reads versions 1, 2" in message
    assert (f"has version {version!r}" if version is not None else 'has no "version"') in message


def test_truncated_file_says_so(tmp_path):
    path = tmp_path / "f.json"
    save_frontier(random_frontier(), path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(FrontierError, match="truncated"):
        load_frontier(path)


def test_float_clocks_are_written_as_whole_mhz():
    f = random_frontier(num_points=2, num_paced=0)
    as_float = Frontier(f.schedule, 80.0, 1.0, 10.0, [FrontierPoint(p.time_s, p.energy_j, p.freqs_mhz.astype(float)) for p in f.points])
    back = frontier_from_json_dict(encode_frontier_json(as_float))
    assert all(np.array_equal(p.freqs_mhz, q.freqs_mhz) for p, q in zip(f.points, back.points))
    half = Frontier(f.schedule, 80.0, 1.0, 10.0, [FrontierPoint(1.0, 1.0, np.full(f.schedule.num_instructions, 1000.5))])
    with pytest.raises(FrontierError, match="whole MHz"):
        encode_frontier_json(half)


@pytest.mark.parametrize("write", [encode_frontier_json, encode_v1], ids=["v2", "v1"])
def test_the_non_compute_time_round_trips_and_a_file_without_it_has_none(tmp_path, write):
    """Files before it existed have no ``non_compute``: they read as none; a frontier with it (its
    power given or P_blocking's) keeps it, and one without writes no such field."""
    from dataclasses import replace

    from perseus.frontier import NonCompute

    plain = random_frontier()
    data = write(plain)
    assert "non_compute" not in data
    assert frontier_from_json_dict(json.loads(json.dumps(data))).non_compute == NonCompute()
    for kept in (NonCompute(0.125, None, "warm-up"), NonCompute(0.25, 61.5, "--non-compute")):
        path = tmp_path / "f.json"
        path.write_text(json.dumps(write(replace(plain, non_compute=kept))))
        back = load_frontier(path)
        assert back.non_compute == kept
        assert back.slowdown(back.points[-1]) == pytest.approx(
            (back.points[-1].time_s + kept.time_s) / (back.baseline_time_s + kept.time_s) - 1)
        assert_same(plain, back)


def test_a_malformed_non_compute_time_names_the_file_and_the_field(tmp_path):
    def negative(d):
        d["non_compute"] = {"time_s": -1.0, "power_w": None, "source": ""}

    assert "non-compute time is seconds >= 0" in _corrupt(tmp_path, negative)
    assert "\"non_compute\" must be an object" in _corrupt(tmp_path, lambda d: d.update(non_compute=0.1))
