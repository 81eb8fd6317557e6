"""perseus plot: frontier figure and pipeline timelines are written as images."""

from __future__ import annotations

import struct

from perseus.cli import main
from perseus.examples import load_example_profile
from perseus.schedules import build_schedule
from perseus.frontier import save_frontier

from cli_helpers import heuristic_frontier


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_plot_frontier_png(tmp_path, small_frontier_file, capsys):
    out = tmp_path / "frontier.png"
    assert main(["plot", str(small_frontier_file), "--out", str(out)]) == 0
    width, height = _png_size(out)
    assert width > 400 and height > 300
    assert "points" in capsys.readouterr().out


def test_plot_timeline_with_explicit_and_recorded_profile(tmp_path, small_frontier_file, small_profile_csv):
    explicit = tmp_path / "t1.png"
    argv = ["plot", str(small_frontier_file), "--timeline", "--point", "fastest", "--profile", str(small_profile_csv)]
    assert main(argv + ["--out", str(explicit)]) == 0
    recorded = tmp_path / "t2.svg"  # profile path from the frontier's metadata; another format
    assert main(["plot", str(small_frontier_file), "--timeline", "--point", "1", "--out", str(recorded)]) == 0
    _png_size(explicit)
    assert recorded.read_text().lstrip().startswith("<?xml")


def test_plot_timeline_of_the_example(tmp_path):
    frontier = heuristic_frontier(build_schedule("1f1b", 4, 8), load_example_profile())
    frontier.metadata["profile"] = "example"
    path = tmp_path / "f.json"
    save_frontier(frontier, path)
    out = tmp_path / "t.png"
    assert main(["plot", str(path), "--timeline", "--point", "slowest", "--out", str(out)]) == 0
    width, _ = _png_size(out)
    assert width > 800
