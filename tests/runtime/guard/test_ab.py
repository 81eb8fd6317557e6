"""The same-run A/B figures and the per-step log line's wording."""

import random
from statistics import stdev

import pytest

from perseus.output.wording import saving_phrase, time_phrase
from perseus.runtime.guard.ab import ab_figure, median_ratio, relative_spread, step_figure, step_line


def test_median_ratio_ignores_outliers_and_its_stderr_matches_the_noise():
    rng = random.Random(3)
    plan = [1.05 * rng.gauss(1.0, 0.02) for _ in range(400)] + [5.0] * 10  # a few disturbed steps
    probe = [rng.gauss(1.0, 0.02) for _ in range(100)]
    r = median_ratio(plan, probe)
    assert r.value == pytest.approx(1.05, abs=0.01)
    expected = 0.02 * (1 / 410 + 1 / 100) ** 0.5  # relative sd 2 %, both sides
    assert r.stderr == pytest.approx(expected, rel=0.25)


def test_stderr_tracks_the_real_spread_of_the_ratio():
    """Over many synthetic A/Bs the reported stderr is about the ratio's actual standard deviation."""
    rng = random.Random(11)
    values, errors = [], []
    for _ in range(300):
        r = median_ratio([rng.gauss(1.0, 0.03) for _ in range(40)], [rng.gauss(1.0, 0.03) for _ in range(5)])
        values.append(r.value)
        errors.append(r.stderr)
    actual = stdev(values)
    mean_reported = sum(errors) / len(errors)
    assert 0.6 * actual < mean_reported < 1.6 * actual


def test_spread_needs_two_samples_on_one_side():
    assert relative_spread([1.0], [2.0]) is None
    assert median_ratio([1.0], [2.0]).stderr is None
    one_probe = median_ratio([1.0, 1.1, 0.9, 1.0], [1.0])
    assert one_probe.stderr is not None and one_probe.stderr > 0  # the plan steps' spread stands in


def test_median_ratio_rejects_empty_or_nonpositive_input():
    with pytest.raises(ValueError):
        median_ratio([], [1.0])
    with pytest.raises(ValueError):
        median_ratio([1.0], [0.0])


def test_ab_figure_saving_and_time_change():
    fig = ab_figure([2.05] * 5, [700.0] * 5, [2.0, 2.0], [800.0, 800.0])
    assert fig.saving == pytest.approx(0.125) and fig.time_change == pytest.approx(0.025)
    assert (fig.n_plan, fig.n_probe) == (5, 2)
    worse = step_figure(2.0, 840.0, [2.0], [800.0])
    assert worse.saving == pytest.approx(-0.05)


def test_negative_saving_reads_more_energy():
    assert saving_phrase(0.077) == "saves 7.7% energy"
    assert saving_phrase(-0.039) == "3.9% more energy"
    assert saving_phrase(0.051, 0.008) == "saves 5.1% ± 0.8% energy"
    assert time_phrase(0.012) == "1.2% slower" and time_phrase(-0.004) == "0.4% faster"


def test_step_line_shows_the_runs_ab_with_its_interval_never_one_step_against_one_probe():
    """The issue's case: one step saved 7.7 % against the probes, the run does not: the line shows the run's."""
    probes_t, probes_e = [1.869, 1.871], [780.0, 782.0]
    run = ab_figure([2.05, 2.04, 2.06], [785.0, 786.0, 784.0], probes_t, probes_e)
    line = step_line(60, "deployed", 1.869, 721.0, "plan", run)
    assert line.startswith("perseus step 60 [deployed, plan clocks], time 1869.0 ms, energy 721.00 J")
    assert "this step" not in line and "7.7%" not in line
    assert "run (median of 3 plan steps vs 2 probes): 0.5% ± 0.2% more energy (95 % interval" in line
    assert "9.6% ± 0.1% slower (95 % interval" in line
    noisy = ab_figure([1.0, 1.3, 0.8], [700.0, 900.0, 650.0], [1.0, 1.2], [760.0, 700.0])
    assert "not yet measurable" in step_line(61, "deployed", 1.0, 700.0, "plan", noisy)
    assert step_line(3, "warmup", 1.9, 780.0, "default", None) == \
        "perseus step 3 [warmup, default clocks], time 1900.0 ms, energy 780.00 J"
