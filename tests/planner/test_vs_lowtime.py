"""Requirement: at the all-max time and at every time on lowtime's frontier, perseus's plan uses
no more energy than lowtime's, both simulated on the measured A100 profile."""

import pytest

from perseus.planner import plan_frontier
from perseus.schedules import build_schedule
from planner_lowtime import best_at, lowtime_available, run_lowtime


@pytest.mark.skipif(not lowtime_available(), reason="lowtime is not installed")
@pytest.mark.parametrize("microbatches", [4, 6])
def test_never_worse_than_lowtime_on_real_a100_slice(a100_slice, microbatches):
    schedule = build_schedule("1f1b", 4, microbatches)
    profile = a100_slice(4)
    lowtime = run_lowtime(schedule, profile)
    ours = plan_frontier(schedule, profile)
    assert lowtime.plans
    for plan in lowtime.plans:
        point = ours.lookup(plan.time_s)
        assert point.time_s <= plan.time_s * (1 + 1e-12)
        assert point.energy_j <= plan.energy_j * (1 + 1e-12), f"at {plan.time_s:.4f} s"
    # No planner slowdown: our fastest is no slower than all-max, lowtime's is (1 ms flooring).
    assert ours.fastest.time_s <= ours.baseline_time_s
    at_base = best_at(lowtime.plans, ours.baseline_time_s)
    if at_base is not None:
        assert ours.default_point().energy_j <= at_base.energy_j
