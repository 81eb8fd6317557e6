"""The frontier file spells an unlocked instruction's clock ``"unlocked"`` in its clock table, reads
it back as ``UNLOCKED_MHZ``, and reads files without one as before."""

from __future__ import annotations

import json

import numpy as np
import pytest

from perseus.errors import FrontierError
from perseus.frontier import Frontier, FrontierPoint, encode_frontier_json, load_frontier, save_frontier
from perseus.profile.unlocked import UNLOCKED_MHZ, clock_name
from perseus.schedules import build_schedule


def frontier(clocks: list[int]) -> Frontier:
    schedule = build_schedule("1f1b", 2, 2)
    n = schedule.num_instructions
    plans = [np.array([clocks[i % len(clocks)] for i in range(n)]), np.full(n, 1200)]
    return Frontier(schedule, 80.0, 1.0, 10.0, [FrontierPoint(1.0 + 0.1 * k, 10.0 - k, p) for k, p in enumerate(plans)])


def test_an_unlocked_clock_is_written_by_name_and_read_back(tmp_path):
    f = frontier([UNLOCKED_MHZ, 1530, UNLOCKED_MHZ, 1980])
    doc = encode_frontier_json(f)
    assert doc["clocks_mhz"] == ["unlocked", 1200, 1530, 1980]
    save_frontier(f, tmp_path / "f.json")
    again = load_frontier(tmp_path / "f.json")
    assert np.array_equal(again.points[0].freqs_mhz, f.points[0].freqs_mhz)
    assert (again.points[0].freqs_mhz == UNLOCKED_MHZ).sum() == (f.points[0].freqs_mhz == UNLOCKED_MHZ).sum() > 0


def test_a_file_without_unlocked_clocks_is_written_and_read_as_before(tmp_path):
    f = frontier([1410, 1530])
    assert encode_frontier_json(f)["clocks_mhz"] == [1200, 1410, 1530]
    save_frontier(f, tmp_path / "f.json")
    assert np.array_equal(load_frontier(tmp_path / "f.json").points[1].freqs_mhz, f.points[1].freqs_mhz)


def test_another_name_in_the_clock_table_is_one_error_line(tmp_path):
    doc = encode_frontier_json(frontier([UNLOCKED_MHZ, 1530]))
    doc["clocks_mhz"][0] = "turbo"
    (tmp_path / "f.json").write_text(json.dumps(doc))
    with pytest.raises(FrontierError, match="malformed|clocks_mhz"):
        load_frontier(tmp_path / "f.json")


def test_clock_names_read_as_people_read_them():
    assert clock_name(UNLOCKED_MHZ) == "unlocked" and clock_name(1410) == "1410 MHz"
