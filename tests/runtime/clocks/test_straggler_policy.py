"""Straggler policy on synthetic time series: switch, follow, recover, no flapping on noise."""

import random

import pytest

from perseus.errors import ConfigError
from perseus.runtime.clocks.straggler import StragglerPolicy, natural_time, slowdown_against_slowest


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
    assert out[5] == pytest.approx(1.3)  # one worse check is not enough to follow
    assert out[6] == pytest.approx(1.5)  # follows a worse straggler after patience checks
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


def test_new_targets_are_the_least_change_the_patience_window_supports():
    policy = StragglerPolicy(threshold=0.05, recover_threshold=0.02, patience=2)
    assert [policy.observe(s) for s in (1.1, 1.4)] == [1.0, pytest.approx(1.1)]  # adopt the smaller
    assert policy.observe(1.5) == pytest.approx(1.1)
    assert policy.observe(1.3) == pytest.approx(1.3)  # up: the smaller of 1.5 and 1.3
    assert policy.observe(1.2) == pytest.approx(1.3)
    assert policy.observe(1.29) == pytest.approx(1.3)  # inside the band: no move, the run restarts
    assert policy.observe(1.1) == pytest.approx(1.3)
    assert policy.observe(1.15) == pytest.approx(1.15)  # down: the larger of 1.1 and 1.15


def test_a_change_of_direction_restarts_the_count():
    policy = StragglerPolicy(threshold=0.05, recover_threshold=0.02, patience=2)
    policy.observe(1.3)
    policy.observe(1.3)
    assert [policy.observe(s) for s in (1.5, 1.1, 1.5, 1.1)] == [pytest.approx(1.3)] * 4


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


# ---------------------------------------------------------------- a recorded noise trace

def test_false_switches_on_the_recorded_noise_trace():
    """``tests/data/straggler_noise.json``: 398 iterations of 2 DP pipelines x 2 stages on this
    shared machine (load average 28 when recorded) and no straggler, so every switch is false.
    With the default settings and a check every 10 steps the policy switches at most 3 times in
    2 x 39 decisions (one noisy episode adopted and dropped, one adopted at the trace's end),
    and never undoes a switch at the next check; without hysteresis it switches 11 times."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from noise_trace import load_trace, replay

    trace = load_trace()
    default = replay(trace, period=10, threshold=0.05, recover=0.02, patience=2)
    assert default.checks == 39
    assert sum(default.switches.values()) <= 3
    for dp, seen in default.slowdowns.items():
        policy = StragglerPolicy(0.05, 0.02, 2)
        ratios = [policy.observe(s) for s in seen]
        changes = [i for i in range(1, len(ratios)) if ratios[i] != ratios[i - 1]]
        assert not any(b - a == 1 for a, b in zip(changes, changes[1:])), (dp, ratios)  # no flapping
    no_hysteresis = replay(trace, period=10, threshold=0.05, recover=0.049, patience=1)
    assert sum(no_hysteresis.switches.values()) >= 3 * sum(default.switches.values())
    longer = replay(trace, period=20, threshold=0.05, recover=0.02, patience=2)
    assert sum(longer.switches.values()) == 0
