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


def test_plan_dualpipev_and_combined_1f1b_on_the_example_with_fused_units(tmp_path, capsys):
    for name, extra in (("dualpipev", ["--split-backward", "0.5"]), ("megatron-combined-1f1b", [])):
        out = tmp_path / f"{name}.json"
        assert main(["plan", "--example", "--schedule", name, "--chunks", "2", "--microbatches", "8", *extra,
                     "--out", str(out), "--no-progress"]) == 0
        frontier = load_frontier(out)  # the file carries every fused unit's pair, checked against the order
        assert frontier.schedule.name == name
        fused = [inst for stage in frontier.schedule.stages for inst in stage if inst.kind == "forward_backward"]
        assert fused and all(inst.backward_microbatch is not None for inst in fused)
        assert frontier.default_point().energy_j < frontier.baseline_energy_j
        assert main(["plot", str(out), "--timeline", "--out", str(tmp_path / f"{name}.png")]) == 0
    assert "dualpipev" in capsys.readouterr().out


def test_a_profile_without_fused_units_needs_fused_sum(tmp_path, capsys):
    profile = tmp_path / "p.json"
    load_example_profile().with_p_blocking(80.0).save_json(profile)
    args = ["plan", "--profile", str(profile), "--stages", "4", "--microbatches", "8", "--schedule",
            "megatron-combined-1f1b", "--chunks", "1", "--out", str(tmp_path / "f.json"), "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "fused forward+backward units" in err and "--fused-sum" in err
    assert main([*args, "--fused-sum"]) == 0
    assert load_frontier(tmp_path / "f.json").metadata["fused_sum"] is True


def test_fused_units_derived_as_forward_plus_their_backward():
    from perseus.profile import fuse_forward_backward
    from perseus.schedules import build_schedule

    profile = split_backward(split_into_chunks(load_example_profile(), 2), 0.5)
    profile = profile.with_p_blocking(80.0)
    fused = fuse_forward_backward(profile, build_schedule("dualpipev", 4, 8, 2))
    for chunk in (0, 1):  # DualPipeV pairs a chunk's forward with the other chunk's backward
        f, b, fb = profile.get(3, "forward", chunk), profile.get(3, "backward", 1 - chunk), fused.get(3, "forward_backward", chunk)
        assert fb.times_s[4] == pytest.approx(f.times_s[4] + b.times_s[4])
        assert fb.energies_j[4] == pytest.approx(f.energies_j[4] + b.energies_j[4])
    assert fuse_forward_backward(fused, build_schedule("dualpipev", 4, 8, 2)) is fused  # measured units are kept


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
    assert set(TORCH_SCHEDULES) == {"1f1b", "gpipe", "torch-interleaved", "zb-interleaved", "zbv", "dualpipev"}
    with pytest.raises(PerseusError, match="the megatron demo runs 1F1B"):
        run_demo("megatron", 2, 4, None, __import__("pathlib").Path("/nonexistent"), "zbv")
    with pytest.raises(PerseusError, match="the torch demo has none"):
        run_demo("torch", 2, 4, None, __import__("pathlib").Path("/nonexistent"), None, moe=True)
    assert parser.parse_args(["demo", "--moe"]).moe
