"""Frontier lookup semantics and the frontier.json file."""

import json

import numpy as np
import pytest

from perseus.errors import FrontierError
from perseus.frontier import Frontier, FrontierPoint, encode_frontier_json, load_frontier, save_frontier, thin_points
from perseus.frontier.v1 import encode_v1
from perseus.schedules import build_schedule


def make_frontier(times=(10.0, 11.0, 12.5), energies=(100.0, 90.0, 85.0)):
    schedule = build_schedule("1f1b", 2, 2)
    points = [
        FrontierPoint(t, e, np.full(schedule.num_instructions, 1400 - 100 * i, dtype=np.int64))
        for i, (t, e) in enumerate(zip(times, energies))
    ]
    return Frontier(schedule, 80.0, 10.0, 120.0, list(reversed(points)), gpu_name="A100")


def test_points_are_fastest_first_and_lookup_never_exceeds_the_target():
    f = make_frontier()
    assert [p.time_s for p in f.points] == [10.0, 11.0, 12.5]
    assert f.lookup(11.9).time_s == 11.0
    assert f.lookup(12.5).time_s == 12.5
    assert f.lookup(100).time_s == 12.5
    assert f.lookup(1.0).time_s == 10.0  # nothing fast enough: the fastest
    assert f.default_point().time_s == 10.0


def test_json_round_trip_follows_documented_layout(tmp_path):
    f = make_frontier()
    path = tmp_path / "frontier.json"
    save_frontier(f, path)
    data = json.loads(path.read_text())
    assert data["version"] == 2 and data["order"] == "fastest_first"
    assert data["baseline"] == {"time_s": 10.0, "energy_j": 120.0}
    assert data["instructions"][0][0] == ["forward", 0, 0]
    assert data["clocks_mhz"] == [1200, 1300, 1400]
    assert data["points"]["time_s"] == [10.0, 11.0, 12.5]
    assert data["points"]["clock_index"]["dtype"] == "uint8"
    g = load_frontier(path)
    assert [p.time_s for p in g.points] == [10.0, 11.0, 12.5]
    assert np.array_equal(g.points[2].freqs_mhz, f.points[2].freqs_mhz)
    assert not list(tmp_path.glob("*.tmp"))


def test_thinning_keeps_both_ends():
    f = make_frontier(times=tuple(range(10, 30)), energies=tuple(range(100, 80, -1)))
    kept = thin_points(f.points, 5)
    assert len(kept) <= 5 and kept[0] is f.points[0] and kept[-1] is f.points[-1]


def test_malformed_frontier_files_are_clear_errors(tmp_path):
    path = tmp_path / "f.json"
    f = make_frontier()
    data = encode_frontier_json(f)
    data["instructions"][0][0][1] = 7
    path.write_text(json.dumps(data))
    with pytest.raises(FrontierError, match="stage 0 do not follow the 1f1b order"):
        load_frontier(path)
    path.write_text(json.dumps({"format": "perseus-frontier", "version": 2}))
    with pytest.raises(FrontierError, match="missing field 'schedule'"):
        load_frontier(path)
    path.write_text("[]")
    with pytest.raises(FrontierError, match="not a perseus frontier"):
        load_frontier(path)


def test_paced_lookup_prefers_the_plan_that_waits_less():
    # 2 stages at 80 W blocking: stretched to 13 s, the 10 s plan pays 2·80·3 = 480 J of waiting
    # (580 J in all), the 12.5 s plan 80 J (95 + 80 = 175 J), though at its own pace it needs more
    # energy than the 11 s point (95 J vs 90 J) and so is not on `points`.
    f = make_frontier()
    slow = FrontierPoint(12.5, 95.0, np.full(f.schedule.num_instructions, 900, dtype=np.int64))
    g = Frontier(f.schedule, 80.0, 10.0, 120.0, f.points[:2], paced_points=[slow])
    assert g.lookup(13.0).time_s == 11.0  # own pace: least energy
    assert g.paced_lookup(13.0) is slow  # paced: least energy including the wait
    assert g.paced_energy_j(slow, 13.0) == pytest.approx(175.0)
    assert g.paced_energy_j(g.lookup(13.0), 13.0) == pytest.approx(90.0 + 2 * 80.0 * 2.0)
    assert g.paced_lookup(12.0).time_s == 11.0  # the slow plan does not fit
    assert g.paced_lookup(1.0).time_s == 10.0


def test_paced_points_round_trip_and_are_optional(tmp_path):
    f = make_frontier()
    slow = FrontierPoint(12.5, 95.0, np.full(f.schedule.num_instructions, 900, dtype=np.int64))
    g = Frontier(f.schedule, 80.0, 10.0, 120.0, f.points[:2], paced_points=[slow])
    save_frontier(g, tmp_path / "g.json")
    back = load_frontier(tmp_path / "g.json")
    assert [p.time_s for p in back.paced_points] == [12.5]
    assert back.paced_lookup(13.0).energy_j == 95.0
    data = encode_v1(g)
    del data["paced_points"]  # version 1 files written before paced points existed
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = load_frontier(tmp_path / "old.json")
    assert old.paced_points == [] and old.paced_lookup(13.0).time_s == 11.0
