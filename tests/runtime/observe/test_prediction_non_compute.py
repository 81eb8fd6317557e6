"""The prediction check counts the plan's non-compute time (``perseus.frontier.non_compute``): the
predicted slowdown and energy ratio are the job's iteration's, as the measured ones are, so a plan
the profile predicts well reads as such and one it mispredicts still warns."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.frontier import Frontier, FrontierPoint, NonCompute
from perseus.planner.stage_plan import stage_plan_of
from perseus.runtime.guard.ab import ABFigure
from perseus.runtime.observe.prediction import predict
from perseus.schedules import build_schedule

SCHEDULE = build_schedule("1f1b", 2, 2)
OUTSIDE = NonCompute(0.5, None, "test")  # 0.5 s per iteration outside the instructions, at P_blocking


def plan_of(non_compute: NonCompute):
    """Baseline 1.0 s / 100 J of instructions; a plan 10 % slower on them at 80 J; P_blocking 80 W."""
    clocks = np.full(SCHEDULE.num_instructions, 1410)
    frontier = Frontier(SCHEDULE, 80.0, 1.0, 100.0, [FrontierPoint(1.0, 100.0, clocks), FrontierPoint(1.1, 80.0, clocks - 300)],
                        non_compute=non_compute)
    plan = stage_plan_of(frontier, 0)
    return plan, plan.points[1]


def figure(time_change: float, energy_ratio: float) -> ABFigure:
    return ABFigure(1.0 - energy_ratio, 0.01, time_change, 0.005, 40, 10)


def test_a_well_predicted_plan_reads_as_such_with_its_non_compute_time():
    """The A/B measures the instructions' span 10 % longer and the whole step's energy, non-compute
    energy included: (80 + 0.5 × 80 × 2) / (100 + 80) J."""
    plan, point = plan_of(OUTSIDE)
    check = predict(plan, point, None, figure(0.10, 160.0 / 180.0), None, whole_job=True)
    assert check.predicted_slowdown == pytest.approx(1.6 / 1.5)  # the job's iteration, not the instructions'
    assert check.measured_slowdown == pytest.approx(1.6 / 1.5)
    assert check.predicted_energy_ratio == pytest.approx(160.0 / 180.0)
    assert check.beyond() == []
    blind, point = plan_of(NonCompute())  # without it: the energy ratio is off by 9 points, a false warning
    assert predict(blind, point, None, figure(0.10, 160.0 / 180.0), None, whole_job=True).beyond()


def test_a_mispredicted_plan_still_warns():
    plan, point = plan_of(OUTSIDE)
    check = predict(plan, point, None, figure(0.20, 160.0 / 180.0), None, whole_job=True)  # span +20 %, not +10 %
    assert check.time_error == pytest.approx(0.10 * 1.0 / 1.5)  # the job sees the span's error diluted
    assert check.beyond() and "time" in check.beyond()[0]
