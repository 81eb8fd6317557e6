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
