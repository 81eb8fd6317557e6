"""The run's A/B in words: with its interval, and 'not yet measurable' while the interval spans zero."""

from perseus.output.wording import measured_saving_phrase, measured_time_phrase


def test_an_interval_spanning_zero_is_not_yet_measurable():
    assert measured_saving_phrase(0.052, 0.04).startswith("energy change not yet measurable")
    assert measured_time_phrase(-0.095, 0.06).startswith("time change not yet measurable")
    assert "spread unknown" in measured_time_phrase(0.1, None)


def test_a_measurable_effect_keeps_its_sign_in_words_and_its_interval():
    assert measured_saving_phrase(0.168, 0.02) == "saves 16.8% ± 2.0% energy (95 % interval +12.9..+20.7% saved)"
    assert measured_saving_phrase(-0.10, 0.02).startswith("10.0% ± 2.0% more energy")
    assert measured_time_phrase(0.05, 0.01).startswith("5.0% ± 1.0% slower")
