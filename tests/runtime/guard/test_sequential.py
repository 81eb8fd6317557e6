"""The guard's sequential test: rank scores, the CUSUM, its backoff; honest and lying plans under
periodic host events, in process (``perseus.runtime.guard.simulation``)."""

import random
from statistics import mean, pvariance

import pytest

from perseus.errors import ConfigError
from perseus.runtime.guard.placement import Backoff
from perseus.runtime.guard.sequential import (
    Confidence,
    SequentialSettings,
    SequentialTest,
    WindowVerdict,
    next_length,
    null_windows_to_alarm,
    rank_score,
)
from perseus.runtime.guard.simulation import HostEvent, lognormal_noise, simulate

PERIODS = (2, 4, 10, 25, 50, 100)


def test_rank_score_is_standard_when_plan_and_probes_are_exchangeable():
    rng = random.Random(1)
    scores = []
    for _ in range(4000):
        xs = [rng.lognormvariate(0, 0.05) for _ in range(8)]
        rng.shuffle(xs)
        scores.append(rank_score(xs[:7], xs[7:]))
    assert abs(mean(scores)) < 0.05 and 0.9 < pvariance(scores) < 1.1


def test_rank_score_is_positive_for_a_slower_plan_and_bounded_against_outliers():
    assert rank_score([1.1] * 7, [1.0]) > 1.4
    assert rank_score([1.0] * 7, [1.1]) < -1.4
    # one plan step 100x slower moves the score by one rank, no more
    base = rank_score([1.0, 1.01, 0.99, 1.02, 0.98], [1.005])
    one_rank = 1 / (5 * 1 * (5 + 1 + 1) / 12) ** 0.5
    assert rank_score([1.0, 1.01, 0.99, 1.02, 100.0], [1.005]) - base == pytest.approx(one_rank)


def test_the_shift_is_the_target_and_the_tolerance():
    plan = [1.2, 1.21, 1.19, 1.2]
    assert rank_score(plan, [1.0]) > 1 and rank_score(plan, [1.0], shift=1.25) < -1


def test_null_windows_to_alarm_grows_with_the_threshold():
    assert null_windows_to_alarm(0.25, 7) > null_windows_to_alarm(0.25, 6) > 100
    assert SequentialSettings().null_windows == pytest.approx(null_windows_to_alarm(0.25, 5))


def test_a_slow_window_run_alarms_and_estimates_the_excess():
    test = SequentialTest()
    rng = random.Random(2)
    verdict = None
    for _ in range(20):
        plan = [1.1 * rng.lognormvariate(0, 0.01) for _ in range(6)]
        verdict = test.observe(plan, [rng.lognormvariate(0, 0.01)])
        if verdict.confidence is Confidence.ALARM:
            break
    assert verdict is not None and verdict.confidence is Confidence.ALARM
    assert verdict.excess == pytest.approx(0.10, abs=0.02)
    test.restart()
    assert test.statistic == 0.0 and test.upper_bound() is None


def test_an_honest_run_becomes_confident():
    test = SequentialTest()
    rng = random.Random(3)
    verdicts = [test.observe([rng.lognormvariate(0, 0.01) for _ in range(6)], [rng.lognormvariate(0, 0.01)])
                for _ in range(8)]
    assert verdicts[-1].confidence is Confidence.CONFIDENT and verdicts[-1].upper is not None
    assert verdicts[-1].upper < SequentialSettings().detectable


def test_the_straggler_target_is_what_the_plan_is_held_to():
    """A plan 20 % slower than default clocks is within a target 25 % slower than them."""
    test = SequentialTest()
    rng = random.Random(4)
    for _ in range(60):
        v = test.observe([1.2 * rng.lognormvariate(0, 0.01) for _ in range(6)], [rng.lognormvariate(0, 0.01)],
                         target_ratio=1.25)
        assert v.confidence is not Confidence.ALARM


def verdict(confidence: Confidence) -> WindowVerdict:
    return WindowVerdict(0.0, 0.0, confidence, 1.0, None, None)


def test_the_least_confident_pipeline_sets_the_next_window():
    b = Backoff(first=8, growth=2, longest=200)
    assert next_length(20, [verdict(Confidence.CONFIDENT)] * 3, b) == 40
    assert next_length(20, [verdict(Confidence.CONFIDENT), verdict(Confidence.UNSURE)], b) == 20
    assert next_length(20, [verdict(Confidence.CONFIDENT), verdict(Confidence.SUSPECT)], b) == 8
    assert next_length(200, [verdict(Confidence.CONFIDENT)], b) == 200


@pytest.mark.parametrize("kwargs, words", [
    ({"tolerance": 0.6}, "tolerance"), ({"detectable": 0.005}, "detectable"), ({"threshold": 0}, "threshold")])
def test_bad_settings_are_one_config_line(kwargs, words):
    with pytest.raises(ConfigError, match=words) as err:
        SequentialSettings(**kwargs)
    assert "\n" not in str(err.value)


# In process, with periodic host events: the loop's data-loader epoch of 2 or 4 steps, logging
# every 10, evaluation every 25 or 50, a checkpoint every 100 (each 30 % of a step).


@pytest.mark.parametrize("period", PERIODS)
def test_no_false_alarm_on_an_honest_plan_under_periodic_host_work(period):
    events = [HostEvent(period, 0.3)]
    for seed in range(3):
        run = simulate(3000, slowdown=0.0, noise=lognormal_noise(0.02), events=events, seed=seed, stop_at_alarm=False)
        assert run.alarm_steps == [], (period, seed)


@pytest.mark.parametrize("period", PERIODS)
def test_a_lying_plan_is_caught_under_periodic_host_work(period):
    """A profile flat across clocks deploys a plan that is in truth 10 % slower."""
    events = [HostEvent(period, 0.3)]
    for seed in range(3):
        run = simulate(1500, slowdown=0.10, noise=lognormal_noise(0.02), events=events, seed=seed)
        assert run.first_alarm is not None, (period, seed)


def test_a_badly_slow_plan_is_caught_within_60_steps_at_gpu_noise():
    for seed in range(10):
        run = simulate(600, slowdown=0.10, noise=lognormal_noise(0.01), seed=seed)
        assert run.first_alarm is not None and run.first_alarm < 60, seed


def test_once_confident_probes_are_at_most_one_percent_of_steps():
    run = simulate(6000, slowdown=0.0, noise=lognormal_noise(0.01), seed=5, stop_at_alarm=False)
    assert run.alarm_steps == [] and run.tail_probe_share <= 0.01
