"""Profiling's cost, like with like: the sweep's own default-clock steps are the reference, not a
warm-up that includes start-up; a figure below zero says why."""

from perseus.runtime.observe.metrics import StepMetrics
from perseus.runtime.observe.report import profiling_overhead
from perseus.runtime.phases import Phase


def step(i: int, phase: Phase, time_s: float, energy_j: float, freq: int | None = None) -> StepMetrics:
    return StepMetrics(step=i, rank=0, phase=phase, time_s=time_s, energy_j=energy_j, freq_mhz=freq)


def test_the_reference_is_the_sweeps_own_top_clock_steps_not_a_warm_up_with_start_up():
    """The issue's case: a 10 s first warm-up step made the overhead read negative."""
    records = [step(0, Phase.WARMUP, 10.0, 900.0), step(1, Phase.WARMUP, 1.0, 100.0),
               step(2, Phase.PROFILING, 1.0, 100.0, 1410), step(3, Phase.PROFILING, 1.0, 100.0, 1410),
               step(4, Phase.PROFILING, 1.5, 80.0, 810), step(5, Phase.PROFILING, 2.0, 70.0, 210)]
    cost = profiling_overhead(records)
    assert cost is not None and cost["iterations"] == 4 and "1410 MHz" in cost["reference"]
    assert abs(cost["extra_time_s"] - 1.5) < 1e-9 and abs(cost["extra_energy_j"] + 50.0) < 1e-9
    assert cost["note"].startswith("energy below zero") and "time below" not in cost["note"]  # said why


def test_time_below_zero_is_said_to_be_noise():
    records = [step(0, Phase.WARMUP, 1.0, 100.0), step(1, Phase.PROFILING, 1.3, 130.0, 1410),
               step(2, Phase.PROFILING, 1.3, 130.0, 1410), step(3, Phase.PROFILING, 1.0, 140.0, 810)]
    cost = profiling_overhead(records)
    assert cost is not None and cost["extra_time_s"] < 0 < cost["extra_energy_j"]
    assert cost["note"].startswith("time below zero") and "noise" in cost["note"]


def test_without_top_clock_steps_the_warm_up_leaves_its_start_up_step_out():
    records = [step(0, Phase.WARMUP, 10.0, 900.0), step(1, Phase.WARMUP, 1.0, 100.0), step(2, Phase.WARMUP, 1.0, 100.0),
               step(3, Phase.PROFILING, 1.2, 110.0)]
    cost = profiling_overhead(records)
    assert cost is not None and "start-up left out" in cost["reference"]
    assert abs(cost["extra_time_ratio"] - 0.2) < 1e-9 and "note" not in cost


def test_nothing_before_profiling():
    assert profiling_overhead([step(0, Phase.WARMUP, 1.0, 100.0)]) is None


def test_steps_too_short_for_the_energy_counter_still_give_the_time_and_say_why():
    """The DeepSpeed example script's small model: 20-30 ms steps, under the counter's 100 ms
    update period, read 0 J; the figure was null with no word."""
    records = [step(0, Phase.WARMUP, 1.0, 0.0), step(1, Phase.PROFILING, 0.02, 0.0, 1410),
               step(2, Phase.PROFILING, 0.02, 0.0, 1410), step(3, Phase.PROFILING, 0.03, 2.6, 810)]
    cost = profiling_overhead(records)
    assert cost is not None and abs(cost["extra_time_ratio"] - 7 / 6 + 1) < 1e-9
    assert cost["extra_energy_ratio"] is None and cost["note"].startswith("energy not measured")
