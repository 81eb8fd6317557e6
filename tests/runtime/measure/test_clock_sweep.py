"""Frequency selection, the sweep walk, early stop and the stated profiling cost."""

import pytest

from perseus.errors import ConfigError
from perseus.runtime.measure.clock_sweep import ClockSweep, energy_rose, profiling_iterations, select_frequencies

SUPPORTED = list(range(1410, 200, -15))  # A100-like: 1410, 1395, ..., 210


def test_select_range_step_and_every_k():
    freqs = select_frequencies(SUPPORTED, 1000, 1200, step_mhz=100)
    assert freqs[0] == 1200 and all(a - b >= 100 for a, b in zip(freqs, freqs[1:])) and min(freqs) >= 1000
    assert select_frequencies([1000, 900, 800, 700, 600], every_k=2) == [1000, 800, 600]
    assert select_frequencies([800, 1000, 900]) == [1000, 900, 800]


def test_select_empty_range_is_config_error():
    with pytest.raises(ConfigError, match="no supported SM clock"):
        select_frequencies(SUPPORTED, 1500, 1600)
    with pytest.raises(ConfigError, match="no supported"):
        select_frequencies([])


def walk(sweep: ClockSweep, rising_after: int | None = None) -> int:
    """Run a sweep to the end; returns iterations spent. Energy rises from clock #rising_after on."""
    iters = 0
    clock = 0
    while not sweep.done:
        iters += 1
        if sweep.count_iteration():
            rising = rising_after is not None and clock >= rising_after
            sweep.next_frequency(rising)
            clock += 1
    return iters


def test_cost_without_early_stop_matches_formula():
    sweep = ClockSweep([1400, 1300, 1200, 1100, 1000], iters_per_freq=3, patience=2)
    warmup = 2
    assert warmup + walk(sweep) == profiling_iterations(warmup, 3, 5) == 17
    assert sweep.visited == [1400, 1300, 1200, 1100, 1000] and not sweep.stopped_early


def test_early_stop_after_patience_rising_clocks():
    sweep = ClockSweep([1400, 1300, 1200, 1100, 1000, 900], iters_per_freq=2, patience=2)
    iters = walk(sweep, rising_after=2)  # clocks #2 and #3 both rose -> stop after #3
    assert sweep.stopped_early and sweep.visited == [1400, 1300, 1200, 1100]
    assert iters == 2 * 4


def test_patience_zero_disables_early_stop():
    sweep = ClockSweep([3, 2, 1], iters_per_freq=1, patience=0)
    assert walk(sweep, rising_after=0) == 3 and not sweep.stopped_early


def test_energy_rose_needs_every_kind():
    assert energy_rose({"f": 1.0, "b": 2.0}, {"f": 1.1, "b": 2.1})
    assert not energy_rose({"f": 1.0, "b": 2.0}, {"f": 1.1, "b": 1.9})
    assert not energy_rose(None, {"f": 1.0})
