"""Frontier lookup semantics and the frontier.json file."""

import json

import numpy as np
import pytest

from perseus.errors import FrontierError
from perseus.frontier import Frontier, FrontierPoint, load_frontier, thin_points
from perseus.schedule import build_schedule


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
    f.save(path)
    data = json.loads(path.read_text())
    assert data["order"] == "fastest_first"
    assert data["baseline"] == {"time_s": 10.0, "energy_j": 120.0}
    first = data["points"][0]["plan"][0][0]
    assert first == {"kind": "forward", "microbatch": 0, "chunk": 0, "freq_mhz": 1400}
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
    data = f.to_json_dict()
    data["points"][0]["plan"][0][0]["microbatch"] = 7
    path.write_text(json.dumps(data))
    with pytest.raises(FrontierError, match="does not follow the 1f1b order"):
        load_frontier(path)
    path.write_text(json.dumps({"format": "perseus-frontier", "version": 1}))
    with pytest.raises(FrontierError, match="missing field 'schedule'"):
        load_frontier(path)
    path.write_text("[]")
    with pytest.raises(FrontierError, match="not a perseus frontier"):
        load_frontier(path)
