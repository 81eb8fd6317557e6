"""Every user error: exit status 2, one line 'perseus: error: ...' on stderr, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseus.cli import main
from perseus.frontier import save_frontier

from cli_helpers import hand_frontier
from cli_helpers import write_profile_csv


def _good_csv(d: Path) -> Path:
    return write_profile_csv(d / "prof.csv")


def _malformed_csv(d: Path) -> Path:
    path = d / "bad.csv"
    path.write_text("stage,kind,freq\n0,forward,1410\n")
    return path


def _nan_csv(d: Path) -> Path:
    path = _good_csv(d)
    lines = path.read_text().splitlines()
    fields = lines[3].split(",")
    fields[-2] = "nan"  # time
    lines[3] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    return path


def _bad_frontier(d: Path) -> Path:
    path = d / "frontier.json"
    path.write_text(json.dumps({"format": "perseus-frontier", "version": 1, "schedule": "1f1b"}))
    return path


def _not_json(d: Path) -> Path:
    path = d / "frontier.json"
    path.write_text("{not json")
    return path


def _good_frontier(d: Path) -> Path:
    path = d / "good.json"
    save_frontier(hand_frontier(), path)
    return path


def _frontier_from_missing_profile(d: Path) -> Path:
    frontier = hand_frontier()
    frontier.metadata["profile"] = str(d / "moved-away.csv")
    path = d / "orphan.json"
    save_frontier(frontier, path)
    return path


def _truncated_frontier(d: Path) -> Path:
    path = _good_frontier(d)
    path.write_bytes(path.read_bytes()[:-40])
    return path


def _future_frontier(d: Path) -> Path:
    path = _good_frontier(d)
    path.write_text(path.read_text().replace('"version":2', '"version":3'))
    return path


def _nonempty_dir(d: Path) -> Path:
    out = d / "zeus"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    return out


PLAN = ["plan", "--stages", "2", "--microbatches", "4", "--p-blocking", "80"]

CASES = {
    "malformed csv": lambda d: [*PLAN, "--profile", _malformed_csv(d), "--out", d / "out.json"],
    "missing profile": lambda d: [*PLAN, "--profile", d / "nope.csv", "--out", d / "out.json"],
    "unknown profile suffix": lambda d: [*PLAN, "--profile", d / "prof.txt", "--out", d / "out.json"],
    "nan value": lambda d: [*PLAN, "--profile", _nan_csv(d), "--out", d / "out.json"],
    "stage count mismatch": lambda d: [
        "plan", "--profile", _good_csv(d), "--p-blocking", "80", "--stages", "3", "--microbatches", "4", "--out", d / "out.json"
    ],
    "missing p_blocking": lambda d: [
        "plan", "--profile", _good_csv(d), "--stages", "2", "--microbatches", "4", "--out", d / "out.json"
    ],
    "missing --stages": lambda d: ["plan", "--profile", _good_csv(d), "--p-blocking", "80", "--microbatches", "4", "--out", d / "out.json"],
    "impossible interleaved": lambda d: [
        "plan", "--stages", "2", "--microbatches", "3", "--p-blocking", "80", "--schedule", "interleaved", "--chunks", "2",
        "--profile", _good_csv(d), "--out", d / "out.json",
    ],
    "interleaved without chunk profile": lambda d: [
        "plan", "--stages", "2", "--microbatches", "4", "--p-blocking", "80", "--schedule", "interleaved",
        "--chunks", "2", "--profile", _good_csv(d), "--out", d / "out.json",
    ],
    "negative p_blocking": lambda d: ["plan", "--example", "--p-blocking", "-5", "--out", d / "out.json"],
    "max points below 2": lambda d: ["plan", "--example", "--max-points", "1", "--out", d / "out.json"],
    "output directory missing": lambda d: ["plan", "--example", "--out", d / "no" / "out.json"],
    "unknown option": lambda d: ["plan", "--example", "--bogus", "--out", d / "out.json"],
    "missing --out": lambda d: ["plan", "--example"],
    "no command": lambda d: [],
    "bad frontier json": lambda d: ["show", _bad_frontier(d)],
    "frontier not json": lambda d: ["show", _not_json(d)],
    "truncated frontier": lambda d: ["show", _truncated_frontier(d)],
    "frontier of unknown version": lambda d: ["show", _future_frontier(d)],
    "plot truncated frontier": lambda d: ["plot", _truncated_frontier(d), "--out", d / "out.png"],
    "export frontier of unknown version": lambda d: ["export", _future_frontier(d), "--out", d / "zeus"],
    "plot bad frontier": lambda d: ["plot", _bad_frontier(d), "--out", d / "out.png"],
    "plot unknown image type": lambda d: ["plot", _good_frontier(d), "--out", d / "out.txt"],
    "plot point out of range": lambda d: ["plot", _good_frontier(d), "--timeline", "--point", "7", "--out", d / "t.png"],
    "plot timeline without profile": lambda d: ["plot", _good_frontier(d), "--timeline", "--out", d / "t.png"],
    "plot timeline recorded profile gone": lambda d: [
        "plot", _frontier_from_missing_profile(d), "--timeline", "--out", d / "t.png"
    ],
    "plot timeline profile mismatch": lambda d: [
        "plot", _good_frontier(d), "--timeline", "--profile", write_profile_csv(d / "p3.csv", 3), "--out", d / "t.png"
    ],
    "export bad frontier": lambda d: ["export", _bad_frontier(d), "--out", d / "zeus"],
    "export into non-empty dir": lambda d: ["export", _good_frontier(d), "--out", _nonempty_dir(d)],
    "emulate bad frontier": lambda d: ["emulate", "--frontier", _bad_frontier(d), "--gpus", "16", "--straggler-factor", "1.1"],
    "emulate gpus not divisible": lambda d: ["emulate", "--example", "--gpus", "1000", "--tp", "8", "--straggler-factor", "1.2"],
    "emulate factor below 1": lambda d: ["emulate", "--example", "--gpus", "1024", "--tp", "8", "--straggler-factor", "0.8"],
    "emulate sweep with frontier": lambda d: ["emulate", "--frontier", _good_frontier(d), "--gpus", "16", "--sweep"],
    "emulate frontier with p_blocking": lambda d: [
        "emulate", "--frontier", _good_frontier(d), "--gpus", "16", "--p-blocking", "70", "--straggler-factor", "1.1"
    ],
    "emulate infinite factor": lambda d: ["emulate", "--example", "--gpus", "32", "--straggler-factor", "inf"],
    "emulate without size": lambda d: ["emulate", "--example", "--straggler-factor", "1.2"],
}


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_user_error_is_one_line_exit_2_and_writes_nothing(case, tmp_path, capsys):
    argv = [str(a) for a in CASES[case](tmp_path)]
    before = _tree(tmp_path)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("perseus: error: ")
    assert "Traceback" not in err
    assert _tree(tmp_path) == before  # no output, no leftover temporary file


def test_error_messages_name_the_problem(tmp_path, capsys):
    main([str(a) for a in CASES["missing p_blocking"](tmp_path)])
    assert "--p-blocking" in capsys.readouterr().err
    main([str(a) for a in CASES["stage count mismatch"](tmp_path)])
    assert "2 stages" in capsys.readouterr().err
    main([str(a) for a in CASES["nan value"](tmp_path)])
    assert "prof.csv:4" in capsys.readouterr().err
    main([str(a) for a in CASES["impossible interleaved"](tmp_path)])
    assert "interleaved schedule" in capsys.readouterr().err
    main([str(a) for a in CASES["truncated frontier"](tmp_path)])
    assert "good.json: invalid JSON" in (err := capsys.readouterr().err) and "truncated" in err
    main([str(a) for a in CASES["frontier of unknown version"](tmp_path)])
    assert "has version 3; this perseus reads versions 1, 2" in capsys.readouterr().err
