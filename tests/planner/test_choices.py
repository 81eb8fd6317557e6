import numpy as np

from perseus.planner.choices import lower_hull, useful_choices
from perseus.profile import InstructionProfile


def test_dominated_options_are_dropped_and_costs_fall_with_time():
    # 1300 MHz is slower than 1400 and costs more effective energy: useless.
    measured = InstructionProfile((1400, 1300, 1200), (1.0, 1.2, 1.5), (100.0, 130.0, 90.0))
    table = useful_choices(measured, p_blocking_w=10.0)
    assert table.freqs_mhz.tolist() == [1400, 1200]
    assert np.allclose(table.costs, [100.0 - 10.0, 90.0 - 15.0])
    assert np.all(np.diff(table.times_s) > 0) and np.all(np.diff(table.costs) < 0)


def test_slower_option_is_useless_when_it_costs_more_than_blocking_would():
    # Slowing by 1 s adds 15 J of compute, more than the 10 J the GPU would draw blocked anyway.
    measured = InstructionProfile((1400, 1000), (1.0, 2.0), (100.0, 115.0))
    assert useful_choices(measured, p_blocking_w=10.0).freqs_mhz.tolist() == [1400]
    # With P_blocking 20 W the same slowdown saves 5 J of effective energy: keep both.
    assert useful_choices(measured, p_blocking_w=20.0).freqs_mhz.tolist() == [1400, 1000]


def test_equal_times_keep_the_cheaper_option():
    measured = InstructionProfile((1400, 1395), (1.0, 1.0), (100.0, 99.0))
    assert useful_choices(measured, 0.0).freqs_mhz.tolist() == [1395]


def test_lower_hull_skips_points_above_the_chords():
    times = np.array([0.0, 1.0, 2.0, 3.0])
    costs = np.array([10.0, 8.0, 3.0, 2.0])  # (1, 8) lies above the chord (0,10)-(2,3)
    assert lower_hull(times, costs).tolist() == [0, 2, 3]
