"""Aggregation rule: TP max time / summed energy, DP average, P_blocking × tp."""

import pytest

from perseus.errors import ProfileError
from perseus.profile.aggregate import RankMeasurements, aggregate_profile


def rank(stage, tp, dp, fwd, bwd, pb=80.0):
    return RankMeasurements(stage, tp, dp, {(0, "forward"): fwd, (0, "backward"): bwd}, pb, "SimGPU")


def test_tp_max_sum_then_dp_mean():
    ranks = [
        # stage 0, replica 0: two TP ranks
        rank(0, 0, 0, {1000: (1.0, 10.0), 900: (1.2, 9.0)}, {1000: (2.0, 20.0), 900: (2.4, 18.0)}),
        rank(0, 1, 0, {1000: (1.1, 11.0), 900: (1.1, 9.5)}, {1000: (2.0, 21.0), 900: (2.5, 18.0)}),
        # stage 0, replica 1
        rank(0, 0, 1, {1000: (1.3, 12.0), 900: (1.4, 10.0)}, {1000: (2.2, 20.0), 900: (2.6, 19.0)}),
        rank(0, 1, 1, {1000: (1.3, 12.0), 900: (1.4, 10.0)}, {1000: (2.2, 20.0), 900: (2.6, 19.0)}),
        # stage 1 (one replica measured only 1000 on backward's other clock: 900 dropped)
        rank(1, 0, 0, {1000: (1.0, 5.0), 900: (1.1, 4.0)}, {1000: (2.0, 6.0)}),
        rank(1, 1, 0, {1000: (1.0, 5.0), 900: (1.1, 4.0)}, {1000: (2.0, 6.0), 900: (2.1, 5.0)}),
    ]
    prof = aggregate_profile(ranks, num_stages=2, tp_size=2, config={"k": 1})
    f = prof.get(0, "forward")
    assert f.freqs_mhz == (1000, 900)
    # replica 0: max(1.0,1.1)=1.1, 10+11=21 ; replica 1: 1.3, 24 -> mean 1.2, 22.5
    assert f.at(1000) == pytest.approx((1.2, 22.5))
    assert f.at(900) == pytest.approx(((1.2 + 1.4) / 2, (18.5 + 20.0) / 2))
    assert prof.get(1, "backward").freqs_mhz == (1000,)
    assert prof.p_blocking_w == pytest.approx(160.0)
    assert prof.config == {"k": 1}


def test_override_p_blocking_scaled_by_tp():
    prof = aggregate_profile([rank(0, 0, 0, {1: (1, 1)}, {1: (1, 1)}, pb=None)], 1, tp_size=4, p_blocking_override_w=70)
    assert prof.p_blocking_w == pytest.approx(280)


def test_missing_stage_is_profile_error():
    with pytest.raises(ProfileError, match=r"stage\(s\) \[1\]"):
        aggregate_profile([rank(0, 0, 0, {1: (1, 1)}, {1: (1, 1)})], num_stages=2)


def test_a_key_the_regression_gave_no_energy_takes_the_step_boundary_attribution():
    """A non-negative regression clips a key it cannot separate at 0 energy; the profile then keeps
    the step-boundary attribution for it, so it saves one its own loader accepts (it refused the 0)."""
    from perseus.profile import profile_from_json_dict
    from perseus.profile.aggregate import ClockPoint

    forward = {1000: ClockPoint(1.0, 0.0, 4, 0.01, 0.005, 3.0), 900: ClockPoint(1.2, 9.0, 4, 0.01, 0.005, 8.5)}
    backward = {1000: ClockPoint(2.0, 20.0, 4, 0.01, 0.005, 19.0), 900: ClockPoint(2.4, 18.0, 4, 0.01, 0.005, 17.0)}
    prof = aggregate_profile([rank(0, 0, 0, forward, backward)], num_stages=1)
    assert prof.get(0, "forward").at(1000)[1] == pytest.approx(3.0)  # the step attribution
    assert prof.get(0, "forward").at(900)[1] == pytest.approx(9.0)  # the regression's, where it has one
    assert profile_from_json_dict(prof.to_json_dict()).get(0, "forward").at(1000)[1] == pytest.approx(3.0)


def test_a_clock_whose_runs_spread_more_is_planned_slower_by_that_spread():
    """The planner's time at a clock includes the per-instance spread it adds over the max clock's
    (``spread_k``, a config setting): the unpadded DeepSpeed script's tiny stage spread 8x at 210 MHz
    and its honest plan, planned on the mean, ran slower than default clocks."""
    from perseus.profile.aggregate import ClockPoint

    def key(spread_low: float) -> dict:
        return {1410: ClockPoint(0.002, 0.5, 4, 0.0002, 0.0001), 810: ClockPoint(0.0035, 0.4, 4, 0.0004, 0.0002),
                210: ClockPoint(0.0135, 0.3, 4, spread_low, 0.0002)}

    noisy = aggregate_profile([rank(0, 0, 0, key(0.0027), key(0.0002))], num_stages=1, noise_k=2.0, spread_k=1.0)
    assert noisy.get(0, "forward").at(210)[0] == pytest.approx(0.0135 + 2 * 0.0002 + 0.0025)
    assert noisy.get(0, "forward").at(810)[0] == pytest.approx(0.0035 + 2 * 0.0002 + 0.0002)
    assert noisy.get(0, "backward").at(210)[0] == pytest.approx(0.0135 + 2 * 0.0002)  # no more spread than at 1410
    assert noisy.get(0, "forward").at(1410)[0] == pytest.approx(0.002)  # the reference: as measured
    plain = aggregate_profile([rank(0, 0, 0, key(0.0027), key(0.0002))], num_stages=1, noise_k=2.0, spread_k=0.0)
    assert plain.get(0, "forward").at(210)[0] == pytest.approx(0.0135 + 2 * 0.0002)


def test_a_clock_with_no_energy_at_all_takes_the_keys_power_at_its_nearest_clock():
    """Neither the regression nor the step-boundary attribution separated the key at one clock
    (a sweep stopped at 810 MHz wrote such a profile in three runs of eight, and its loader then
    refused it): that clock gets the key's power at its nearest measured clock times its time."""
    from perseus.profile import profile_from_json_dict
    from perseus.profile.aggregate import ClockPoint

    forward = {1410: ClockPoint(0.002, 1.0, 4, 0.0001, 0.00005), 810: ClockPoint(0.003, 0.0, 4, 0.0001, 0.00005)}
    backward = {1410: ClockPoint(0.004, 2.0, 4), 810: ClockPoint(0.006, 1.5, 4)}
    prof = aggregate_profile([rank(0, 0, 0, forward, backward)], num_stages=1)
    assert prof.get(0, "forward").at(810)[1] == pytest.approx(1.0 / 0.002 * 0.003)
    assert profile_from_json_dict(prof.to_json_dict()).get(0, "forward").at(810)[1] > 0  # its loader takes it
    nothing = {1410: ClockPoint(0.002, 0.0, 4), 810: ClockPoint(0.003, 0.0, 4)}
    with pytest.raises(ProfileError, match=r"stage 0 forward chunk 0: no energy .* iters_per_freq"):
        aggregate_profile([rank(0, 0, 0, nothing, backward)], num_stages=1)


def test_a_power_held_at_a_bound_is_in_the_profile_quality():
    """A point whose attributed power was held at the card's power limit says so in the profile
    (``power_bound_w``), through a tensor-parallel combination, a data-parallel mean, and its file."""
    from perseus.profile import profile_from_json_dict
    from perseus.profile.aggregate import ClockPoint, replica_vector, replicas_mean

    held = {1000: ClockPoint(0.01, 7.0, 4, 0.0, 0.0, 7.0, 700.0), 900: ClockPoint(0.011, 6.0, 4, 0.0, 0.0, 6.0)}
    free = {1000: ClockPoint(0.005, 2.0, 4), 900: ClockPoint(0.0055, 1.8, 4)}
    prof = aggregate_profile([rank(0, 0, 0, free, held), rank(0, 1, 0, free, free)], num_stages=1, tp_size=2)
    assert prof.quality[(0, 0, "backward")]["power_bound_w"] == [700.0, None]
    assert prof.quality[(0, 0, "forward")]["power_bound_w"] == [None, None]
    assert profile_from_json_dict(prof.to_json_dict()).quality[(0, 0, "backward")]["power_bound_w"] == [700.0, None]
    keys, grid = [(0, "backward")], [1000, 900]
    mean = replicas_mean(replica_vector({(0, "backward"): held}, keys, grid), 1, keys, grid)
    assert mean[(0, "backward")][1000].bound_w == 700.0 and mean[(0, "backward")][900].bound_w == 0.0
