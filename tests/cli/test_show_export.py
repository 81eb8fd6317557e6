"""perseus show (table, thinning) and perseus export --format zeus."""

from __future__ import annotations

import ast
import csv
import json

from perseus.cli import main
from perseus.output.export import zeus_file_name
from perseus.frontier import load_frontier
from perseus.frontier.v1 import encode_v1
from perseus.frontier import save_frontier

from cli_helpers import hand_frontier


def _table_rows(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("point")) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("*"))
    return lines[start:end]


def test_show_prints_slowdown_and_saving_against_baseline(tmp_path, capsys):
    path = tmp_path / "f.json"
    save_frontier(hand_frontier(baseline=(1.0, 120.0)), path)
    assert main(["show", str(path)]) == 0
    rows = _table_rows(capsys.readouterr().out)
    assert len(rows) == 3
    # point 1: 1.1 s, 80 J -> +10% time, 1 - 80/120 = 33.33% saved; point 0 is the default (*)
    assert rows[0].split()[0] == "0*"
    assert rows[1].split() == ["1", "1.1000", "+10.00%", "80.00", "33.33%"]
    assert rows[2].split() == ["2", "1.2500", "+25.00%", "75.00", "37.50%"]


def test_show_thins_to_about_twenty_rows_unless_all(tmp_path, capsys):
    n = 60
    times = [1.0 + 0.01 * i for i in range(n)]
    energies = [100.0 - 0.5 * i for i in range(n)]
    path = tmp_path / "f.json"
    save_frontier(hand_frontier(times=times, energies=energies), path)
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    rows = _table_rows(out)
    assert 15 <= len(rows) <= 20
    indices = [int(r.split()[0].rstrip("*")) for r in rows]
    assert indices[0] == 0 and indices[-1] == n - 1 and indices == sorted(indices)
    assert f"of {n} points; --all" in out
    assert main(["show", str(path), "--all"]) == 0
    assert len(_table_rows(capsys.readouterr().out)) == n


def test_export_zeus_writes_one_python_literal_per_point(tmp_path, small_frontier_file, capsys):
    frontier = load_frontier(small_frontier_file)
    out = tmp_path / "zeus"
    assert main(["export", str(small_frontier_file), "--format", "zeus", "--out", str(out)]) == 0
    n = len(frontier.points)
    assert sorted(p.name for p in out.glob("freqs_pipeline_*.py")) == [zeus_file_name(i) for i in range(n)]
    for index, point in enumerate(frontier.points):
        # lowtime numbering: file 00000 holds the slowest plan
        schedule = ast.literal_eval((out / zeus_file_name(n - 1 - index)).read_text())
        assert len(schedule) == frontier.schedule.num_stages
        for stage, stage_freqs in enumerate(schedule):
            expected = [(inst.kind, freq) for inst, freq in frontier.stage_plan(point, stage)]
            assert stage_freqs == expected
    with (out / "frontier_points.csv").open() as f:
        manifest = list(csv.DictReader(f))
    assert [int(r["perseus_index"]) for r in manifest] == list(range(n))
    assert float(manifest[0]["time_s"]) == frontier.fastest.time_s
    assert "wrote" in capsys.readouterr().out


def test_export_into_existing_empty_directory(tmp_path, small_frontier_file):
    out = tmp_path / "empty"
    out.mkdir()
    assert main(["export", str(small_frontier_file), "--out", str(out)]) == 0
    assert (out / zeus_file_name(0)).is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # temp dir renamed away


def test_show_plot_and_export_read_version_1_files_like_version_2(tmp_path, small_frontier, capsys):
    v1, v2 = tmp_path / "v1.json", tmp_path / "v2.json"
    v1.write_text(json.dumps(encode_v1(small_frontier)))
    save_frontier(small_frontier, v2)
    outputs = {}
    for name, path in (("v1", v1), ("v2", v2)):
        assert main(["show", str(path), "--all"]) == 0
        assert main(["export", str(path), "--out", str(tmp_path / f"zeus-{name}")]) == 0
        assert main(["plot", str(path), "--out", str(tmp_path / f"{name}.png")]) == 0
        table = capsys.readouterr().out.split("wrote")[0]
        files = {p.name: p.read_text() for p in sorted((tmp_path / f"zeus-{name}").iterdir())}
        outputs[name] = (table.replace(str(path), "F"), files)
    assert outputs["v1"] == outputs["v2"]
    assert (tmp_path / "v1.png").stat().st_size > 0
