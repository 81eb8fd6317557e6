"""``perseus export`` says which file holds the fastest plan and which the slowest, as the files are:
lowtime's numbering, freqs_pipeline_00000.py the slowest."""

from __future__ import annotations

import re

from perseus.cli import main
from perseus.frontier import load_frontier
from perseus.output.export import zeus_file_name


def test_the_export_line_names_the_fastest_and_the_slowest_file(tmp_path, small_frontier_file, capsys):
    frontier = load_frontier(small_frontier_file)
    out = tmp_path / "zeus"
    assert main(["export", str(small_frontier_file), "--out", str(out)]) == 0
    n = len(frontier.points)
    assert n > 1
    fastest, slowest = re.search(r"\((\S+) = fastest point, (\S+) = slowest\)", capsys.readouterr().out).groups()
    assert (fastest, slowest) == (zeus_file_name(n - 1), zeus_file_name(0))
    comment = (out / fastest).read_text().splitlines()[-2]
    assert comment.startswith("# perseus frontier point 0 (fastest first)")
