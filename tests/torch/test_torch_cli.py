"""``perseus plan`` / ``emulate`` / ``plot`` on the torch schedules, and ``perseus demo --framework torch`` options."""

from __future__ import annotations

import argparse

import pytest

from perseus.cli import main
from perseus.errors import PerseusError
from perseus.frontier import load_frontier
from perseus.examples import load_example_profile
from perseus.profile import split_backward, split_into_chunks


def test_plan_zbv_on_the_example_with_derived_split_backward(tmp_path, capsys):
    out = tmp_path / "zbv.json"
    assert main(["plan", "--example", "--schedule", "zbv", "--chunks", "2", "--split-backward", "0.5",
                 "--out", str(out), "--no-progress"]) == 0
    frontier = load_frontier(out)
    assert frontier.schedule.name == "zbv" and frontier.schedule.placement == "v"
    kinds = {inst.kind for stage in frontier.schedule.stages for inst in stage}
    assert kinds == {"forward", "backward_input", "backward_weight"}
    assert frontier.default_point().energy_j < frontier.baseline_energy_j
    assert main(["show", str(out)]) == 0
    assert main(["plot", str(out), "--timeline", "--out", str(tmp_path / "t.png")]) == 0
    assert "zbv" in capsys.readouterr().out


def test_zero_bubble_without_split_measurements_is_a_one_line_error(tmp_path, capsys):
    assert main(["plan", "--example", "--schedule", "zb-interleaved", "--chunks", "2", "--out", str(tmp_path / "f.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--split-backward 0.5" in err


def test_emulate_on_zero_bubble(capsys):
    assert main(["emulate", "--example", "--schedule", "zb-interleaved", "--chunks", "2", "--split-backward", "0.5",
                 "--gpus", "256", "--tp", "8", "--straggler-factor", "1.1", "--no-progress"]) == 0
    assert "straggler-matched" in capsys.readouterr().out


def test_profile_derivations_keep_totals():
    profile = load_example_profile()
    halves = split_into_chunks(profile, 2)
    assert halves.num_chunks == 2
    assert halves.get(1, "forward", 1).times_s[0] * 2 == pytest.approx(profile.get(1, "forward").times_s[0])
    split = split_backward(profile, 0.4)
    b, i, w = (split.get(0, k) for k in ("backward", "backward_input", "backward_weight"))
    assert i.energies_j[3] + w.energies_j[3] == pytest.approx(b.energies_j[3])
    assert i.times_s[0] == pytest.approx(0.4 * b.times_s[0])


def test_demo_command_offers_the_torch_framework_and_its_schedules():
    from perseus_demo.cli import TORCH_SCHEDULES, add_demo_command, run_demo

    parser = argparse.ArgumentParser()
    add_demo_command(parser.add_subparsers())
    args = parser.parse_args(["demo", "--framework", "torch", "--schedule", "zbv", "--stages", "2"])
    assert (args.framework, args.schedule, args.max_steps) == ("torch", "zbv", None)
    assert set(TORCH_SCHEDULES) == {"1f1b", "gpipe", "torch-interleaved", "zb-interleaved", "zbv"}
    with pytest.raises(PerseusError, match="the megatron demo runs 1F1B"):
        run_demo("megatron", 2, 4, None, __import__("pathlib").Path("/nonexistent"), "zbv")
