"""Straggler policy on synthetic time series: switch, follow, recover, no flapping on noise."""

import random

import pytest

from perseus.errors import ConfigError
from perseus.runtime.straggler import StragglerPolicy, natural_time, slowdown_against_slowest


def test_noise_below_threshold_never_switches():
    rng = random.Random(0)
    policy = StragglerPolicy(threshold=0.05, recover_threshold=0.02, patience=2)
    ratios = [policy.observe(1.0 + rng.uniform(0, 0.04)) for _ in range(200)]
    assert set(ratios) == {1.0}


def test_single_spike_needs_patience():
    policy = StragglerPolicy(threshold=0.05, recover_threshold=0.02, patience=2)
    assert policy.observe(1.3) == 1.0
    assert policy.observe(1.0) == 1.0
    assert policy.observe(1.3) == 1.0
    assert policy.observe(1.3) == pytest.approx(1.3)


def test_switches_follows_and_recovers():
    policy = StragglerPolicy(threshold=0.05, recover_threshold=0.02, patience=2)
    series = [1.0, 1.0, 1.3, 1.3, 1.3, 1.5, 1.5, 1.0, 1.0, 1.0]
    out = [policy.observe(s) for s in series]
    assert out[:3] == [1.0, 1.0, 1.0]
    assert out[3] == pytest.approx(1.3) and out[4] == pytest.approx(1.3)
    assert out[5] == pytest.approx(1.5)  # follows a worse straggler
    assert out[7] == pytest.approx(1.5)  # one good check is not enough to recover
    assert out[8] == 1.0 and out[9] == 1.0


def test_noise_inside_hysteresis_band_does_not_flap():
    """Once slowed, values between recover and threshold keep the slowdown (no oscillation)."""
    rng = random.Random(1)
    policy = StragglerPolicy(threshold=0.10, recover_threshold=0.02, patience=2)
    policy.observe(1.2)
    policy.observe(1.2)
    assert policy.active
    changes = 0
    last = policy.ratio
    for _ in range(100):
        r = policy.observe(1.2 + rng.uniform(-0.01, 0.01))
        changes += r != last
        last = r
    assert policy.active and changes == 0


def test_natural_time_removes_deliberate_slowdown():
    # pipeline 0 slowed itself 1.3x to match straggler 1: its natural time is still fast
    times = [natural_time(1.3, 1.3), natural_time(1.3, 1.0)]
    assert slowdown_against_slowest(times, 0) == pytest.approx(1.3)
    assert slowdown_against_slowest(times, 1) == 1.0


def test_bad_thresholds():
    with pytest.raises(ConfigError):
        StragglerPolicy(threshold=0.02, recover_threshold=0.05)
    with pytest.raises(ConfigError):
        StragglerPolicy(patience=0)
