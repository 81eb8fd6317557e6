"""Trusting measured clocks: outliers, the first slow iteration, the monotone fit, pessimistic
times, interpolation on the simulated GPU's curve, and profile JSON version 2."""

import json

import pytest

from perseus.gpu.sim.dvfs import get_preset
from perseus.profile import InstructionProfile, Profile, load_json
from perseus.profile.fit import (first_is_outlier, interpolate, interpolation_ok, isotonic_times, loo_errors,
                                 pessimistic_times, robust_stats)
from perseus.profile.aggregate import ClockPoint, RankMeasurements, aggregate_profile, noisy_points


def test_robust_stats_drops_outliers_and_reports_spread():
    st = robust_stats([1.00, 1.01, 0.99, 1.02, 0.98, 1.00, 3.0])
    assert st.dropped == 1 and st.n == 6
    assert st.median == pytest.approx(1.0, abs=0.01)
    assert 0 < st.spread < 0.05 and st.se < st.spread


def test_first_iteration_after_a_clock_change_is_an_outlier_only_when_slow_beyond_noise():
    steady = [0.200, 0.202, 0.198, 0.201, 0.199, 0.200]
    assert first_is_outlier([0.26, 0.27, 0.265], steady)  # the issue's 25-35 % slow first iteration
    assert not first_is_outlier([0.201, 0.199, 0.200], steady)
    assert not first_is_outlier([0.15, 0.15], steady), "a fast first iteration is not the systematic slowness"


def test_isotonic_fit_never_lets_a_lower_clock_be_faster():
    freqs = [1410, 1320, 1230, 1140]
    raw = [0.265, 0.21, 0.215, 0.202]  # the issue: 1410 MHz slower than 1140 MHz
    fitted = isotonic_times(freqs, raw)
    assert all(a <= b + 1e-12 for a, b in zip(fitted, fitted[1:]))
    assert fitted[0] == fitted[-1], "a fully violated run is pooled into one level"
    assert isotonic_times([3, 2, 1], [1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0], "a monotone profile is kept as measured"
    with pytest.raises(ValueError, match="fastest first"):
        isotonic_times([1, 2], [1.0, 2.0])


def test_pessimistic_times_add_noise_below_the_max_clock_and_stay_monotone():
    times = pessimistic_times([1.0, 1.0, 1.2], [0.05, 0.05, 0.01], k=2)
    assert times == pytest.approx([1.0, 1.1, 1.22])
    assert pessimistic_times([1.0, 1.3, 1.2], [0, 0, 0], k=2) == [1.0, 1.3, 1.3]


def test_pessimistic_times_charge_the_spread_a_clock_adds_over_the_fastest():
    """A low clock whose every run varies more (the simulated GPU stretches host noise by the clock
    ratio) costs a step more than its mean: that extra spread is charged, the fastest clock's own
    spread is not (the all-max reference has it too), and a clock with less spread gets nothing."""
    fitted, se, spread = [1.0, 1.5, 3.0], [0.0, 0.0, 0.0], [0.1, 0.05, 0.8]
    assert pessimistic_times(fitted, se, 2, spread, spread_k=1.0) == pytest.approx([1.0, 1.5, 3.7])
    assert pessimistic_times(fitted, se, 2, spread, spread_k=0.0) == pytest.approx(fitted)
    assert pessimistic_times(fitted, [0.0, 0.1, 0.1], 2, spread, spread_k=0.5) == pytest.approx([1.0, 1.7, 3.55])


def sim_curve(freqs, alpha=0.8):
    m = get_preset("A100-SXM")
    return [m.kernel_time_s(0.01, f, alpha) for f in freqs], [m.kernel_energy_j(0.01, f, 1.0, alpha) for f in freqs]


def test_interpolation_is_validated_on_the_measured_clocks_and_fails_at_the_knee():
    coarse = [1410, 1320, 1230, 1140, 1050, 960]
    t, e = sim_curve(coarse)
    errors = {f: (te, ee) for f, te, ee in loo_errors(coarse, t, e)}
    assert all(interpolation_ok(*errors[f], 0.0) for f in (1320, 1230, 1140)), errors
    assert not interpolation_ok(*errors[1050], 0.0), "the voltage floor's knee is not a smooth power curve"
    grid = list(range(1410, 1229, -15))
    got = interpolate(coarse[:3], t[:3], e[:3], grid)
    want_t, want_e = sim_curve(grid)
    for g, wt, we in zip(grid, want_t, want_e):
        assert got[g][0] == pytest.approx(wt, rel=1e-9), "time a/f + b is exact on the simulated curve"
        assert got[g][1] == pytest.approx(we, rel=0.005)


def test_noisy_profile_is_fitted_pessimistic_and_says_so():
    """The issue's profile: stage 0 forward slower at 1410 than at 1140 MHz, with a wide spread."""
    fwd = {1410: ClockPoint(0.265, 50.0, 6, 0.04, 0.02), 1275: ClockPoint(0.230, 45.0, 6, 0.04, 0.02),
           1140: ClockPoint(0.202, 40.0, 6, 0.04, 0.02)}
    bwd = {1410: ClockPoint(0.5, 100.0, 6, 0.001, 0.0005), 1275: ClockPoint(0.55, 92.0, 6, 0.001, 0.0005),
           1140: ClockPoint(0.61, 88.0, 6, 0.001, 0.0005)}
    prof = aggregate_profile([RankMeasurements(0, 0, 0, {(0, "forward"): fwd, (0, "backward"): bwd}, 80.0)], 1,
                             grid=[1410, 1275, 1140], noise_k=2.0)
    f = prof.get(0, "forward")
    assert f.times_s[0] <= min(f.times_s), "no clock planned faster than all-max"
    assert all(a <= b for a, b in zip(f.times_s, f.times_s[1:]))
    q = prof.quality[(0, 0, "forward")]
    assert q["raw_time_s"] == [0.265, 0.230, 0.202] and q["samples"] == [6, 6, 6]
    assert q["fit_residual_s"][0] > 0.02, "the slow max-clock point disagreed with the fit, and that is recorded"
    assert f.times_s[1] >= q["fitted_time_s"][1] + 2 * 0.02 - 1e-12, "below max: fitted + k·se"
    assert noisy_points(prof), "noise larger than the effect is reported"
    b = prof.get(0, "backward")
    assert b.times_s == pytest.approx((0.5, 0.551, 0.611)), "a clean monotone key keeps its times (+ its tiny margin)"


def test_aggregate_interpolates_only_where_validated():
    coarse = [1410, 1320, 1230, 1140, 1050, 960]
    t, e = sim_curve(coarse)
    per_freq = {f: ClockPoint(ti, ei, 8, 0.0, 0.0) for f, ti, ei in zip(coarse, t, e)}
    grid = list(range(1410, 959, -15))
    prof = aggregate_profile([RankMeasurements(0, 0, 0, {(0, "forward"): per_freq, (0, "backward"): per_freq}, 80.0)],
                             1, grid=grid)
    entry = prof.get(0, "forward")
    q = prof.quality[(0, 0, "forward")]
    interpolated = {f for f, i in zip(entry.freqs_mhz, q["interpolated"]) if i}
    assert {1395, 1290, 1200}.issubset(interpolated)
    assert not interpolated & set(range(961, 1140)), "around the failing knee only measured clocks are kept"
    assert set(coarse) <= set(entry.freqs_mhz)


def test_profile_json_version_2_round_trip_and_version_1_still_loads(tmp_path):
    entry = InstructionProfile((1400, 1000), (1.0, 1.3), (10.0, 8.0))
    quality = {"raw_time_s": [1.0, 1.25], "samples": [4, 4], "interpolated": [False, False]}
    prof = Profile({(0, 0, "forward"): entry, (0, 0, "backward"): entry}, 80.0, "g", {}, "mem",
                   {(0, 0, "forward"): quality})
    path = tmp_path / "p.json"
    prof.save_json(path)
    data = json.loads(path.read_text())
    assert data["version"] == 2
    back = load_json(path)
    assert back.quality[(0, 0, "forward")] == quality and back.get(0, "forward") == entry
    data["version"] = 1
    for item in data["measurements"]:
        item.pop("quality", None)
    path.write_text(json.dumps(data))
    old = load_json(path)
    assert old.get(0, "forward") == entry and old.quality == {}
    plain = Profile({(0, 0, "forward"): entry, (0, 0, "backward"): entry}, 80.0)
    assert plain.to_json_dict()["version"] == 1, "a profile without quality stays readable by older readers"


def test_a_plan_from_the_issues_noisy_profile_is_never_faster_than_all_max():
    """Issue 24: from a profile whose 1140 MHz forward looked faster than 1410 MHz, the frontier
    claimed a plan 8 % faster than all-max. Planned on the fitted profile, none is."""
    from perseus.planner import plan_frontier
    from perseus.profile import Profile as P
    from perseus.schedules import build_schedule

    fwd = {1410: (0.265, 50.0), 1275: (0.230, 46.0), 1140: (0.202, 44.0)}
    bwd = {1410: (0.50, 100.0), 1275: (0.55, 92.0), 1140: (0.61, 88.0)}
    ranks = [RankMeasurements(s, 0, 0, {(0, "forward"): {f: ClockPoint(t, e, 8, 0.03, 0.01) for f, (t, e) in fwd.items()},
                                        (0, "backward"): {f: ClockPoint(t, e, 8, 0.005, 0.002) for f, (t, e) in bwd.items()}},
                              80.0) for s in (0, 1)]
    schedule = build_schedule("1f1b", 2, 4)
    trusted = aggregate_profile(ranks, 2, grid=[1410, 1275, 1140])
    frontier = plan_frontier(schedule, trusted)
    assert min(p.time_s for p in frontier.points) >= frontier.baseline_time_s * (1 - 1e-9)
    raw = P({(s, 0, k): InstructionProfile(tuple(d), tuple(t for t, _ in d.values()), tuple(e for _, e in d.values()))
             for s in (0, 1) for k, d in (("forward", fwd), ("backward", bwd))}, 80.0)
    untrusted = plan_frontier(schedule, raw)
    assert min(p.time_s for p in untrusted.points) < untrusted.baseline_time_s * 0.99, \
        "the raw profile does promise a plan faster than all-max: the test would catch the bug"
