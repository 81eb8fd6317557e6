"""The replay source: measured instances drawn per (stage, kind, clock), fitted power, one line for a bad directory."""

import numpy as np
import pytest

from perseus.errors import ConfigError, ProfileError
from perseus.measured import build_time_table, fit_power
from perseus.measured.replay import load_replay
from perseus.measured.runs import STALL_RATIO

DRAWS = 400


@pytest.fixture(scope="module")
def gpt3(workload_dirs):
    return load_replay(workload_dirs["gpt3-xl"])


def test_draws_are_measured_times_within_their_spread(gpt3, workloads):
    table = build_time_table(workloads["gpt3-xl"])
    entry = table.entries[(0, "forward", 1410)]
    rng = np.random.default_rng(0)
    draws = np.array([gpt3.draw_s(0, "forward", 1410, rng) for _ in range(DRAWS)])
    assert gpt3.time_s(0, "forward", 1410) == entry.median_s
    # the draws' median and robust spread are the measured ones, every draw a measured instance
    assert abs(np.median(draws) / entry.median_s - 1) <= entry.spread
    spread = 1.4826 * np.median(np.abs(draws - np.median(draws))) / np.median(draws)
    assert spread == pytest.approx(entry.spread, rel=0.3)
    assert draws.max() <= entry.worst_ratio * entry.median_s * (1 + 1e-12) and len(np.unique(draws)) > 20


def test_draws_are_seeded_and_scaled_in_time_not_in_power(workload_dirs, gpt3):
    fast = load_replay(workload_dirs["gpt3-xl"], 0.1)
    a = [fast.draw_s(1, "backward", 1200, np.random.default_rng(7)) for _ in range(3)]
    b = [gpt3.draw_s(1, "backward", 1200, np.random.default_rng(7)) for _ in range(3)]
    assert a == pytest.approx([0.1 * x for x in b])
    assert fast.power_w(1, 1200) == gpt3.power_w(1, 1200) and fast.p_blocking_w == gpt3.p_blocking_w


def test_power_is_the_stage_s_fitted_curve_held_beyond_its_clocks(gpt3, workloads):
    workload = workloads["gpt3-xl"]
    fit = fit_power(workload, build_time_table(workload))
    curve = fit.curves[2]
    assert gpt3.power_w(2, 1200) == pytest.approx(float(curve.power_w(1200)))
    assert gpt3.power_w(2, curve.low_mhz - 100) == pytest.approx(float(curve.power_w(curve.low_mhz)))
    assert gpt3.p_blocking_w == pytest.approx(fit.p_blocking_w)


def test_clocks_are_the_measured_range_on_its_grid_and_the_slowdown_is_relative_to_the_top(gpt3):
    clocks = gpt3.clocks_mhz
    assert (clocks[0], clocks[-1], clocks[1] - clocks[0]) == (1035, 1410, 15)
    assert gpt3.slowdown(3, 1410) == 1.0
    both = [gpt3.table.time_s(3, k, c) for c in (1035, 1410) for k in ("forward", "backward")]
    assert gpt3.slowdown(3, 1035) == pytest.approx(sum(both[:2]) / sum(both[2:])) and gpt3.slowdown(3, 1035) > 1.1


def test_an_unmeasured_clock_takes_the_table_s_median_and_the_nearest_measured_spread(gpt3):
    measured = gpt3.table.clocks(0, "forward")
    clock = next(c for c in gpt3.clocks_mhz if c not in measured)
    assert gpt3.time_s(0, "forward", clock) == gpt3.table.time_s(0, "forward", clock)
    draw = gpt3.draw_s(0, "forward", clock, np.random.default_rng(1))
    assert abs(draw / gpt3.time_s(0, "forward", clock) - 1) < 0.05


def test_stalls_are_drawn_at_their_measured_rate(workload_dirs):
    replay = load_replay(workload_dirs["wide-resnet101_8"])
    key = max(replay.table.entries, key=lambda k: replay.table.entries[k].stalls / replay.table.entries[k].instances)
    entry = replay.table.entries[key]
    rng = np.random.default_rng(3)
    draws = np.array([replay.draw_s(*key, rng) for _ in range(4000)])
    share = float((draws > STALL_RATIO * entry.median_s).mean())
    assert entry.stalls > 0 and share == pytest.approx(entry.stalls / entry.instances, abs=0.02)


def test_a_malformed_directory_is_one_line(tmp_path):
    named = tmp_path / "merak+gpt3-xl+custom:0,8+dp1+pp4+tp1+mbs8+nmb128+PointSolution"
    named.mkdir()
    for where, problem in ((tmp_path / "nowhere", "not a directory"), (tmp_path, "not a workload directory name"),
                           (named, "no N.sched.json files")):
        with pytest.raises(ProfileError) as raised:
            load_replay(where)
        assert "\n" not in str(raised.value) and str(raised.value).startswith(f"{where.resolve()}: ")
        assert problem in str(raised.value)
    with pytest.raises(ConfigError, match="time_scale must be a positive number"):
        load_replay(named, 0.0)
