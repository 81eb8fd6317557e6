"""The targeting room on its own: a stage plan and the targets in force in, the point to run out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from perseus.errors import ConfigError
from perseus.frontier import Frontier, FrontierPoint
from perseus.planner.stage_plan import StagePlan, StagePoint, stage_plan_of
from perseus.runtime.clocks.straggler import StragglerPolicy
from perseus.runtime.clocks.targeting import (NO_SLOWDOWN, Adjustment, NoSlowdown, PacedTarget, SpeedUp, Target, Targeting,
                                       TimeTarget)
from perseus.schedules import build_schedule

SCHEDULE = build_schedule("1f1b", 2, 2)  # 4 instructions per stage


def _point(time_s: float, energy_j: float, mhz: int) -> FrontierPoint:
    return FrontierPoint(time_s, energy_j, np.full(SCHEDULE.num_instructions, mhz))


def small_plan() -> StagePlan:
    """Four frontier points and one paced point that only wins when the iteration is stretched
    (P_blocking 10 W × 2 stages: energy - 20 W × time falls along 1.0, 1.1, 1.25, 1.4 (paced), 1.5 s)."""
    frontier = Frontier(SCHEDULE, 10.0, 1.05, 11.0,
                        [_point(1.0, 10.0, 1410), _point(1.1, 8.0, 1200), _point(1.25, 7.0, 1005),
                         _point(1.5, 6.8, 900)],
                        paced_points=[_point(1.4, 7.5, 960)])
    return stage_plan_of(frontier, 1)


def times(plan: StagePlan, point: StagePoint) -> tuple[float, int]:
    return point.time_s, int(plan.clocks(point)[0])


def test_each_target_picks_its_point():
    plan = small_plan()
    assert times(plan, NoSlowdown().choose(plan)) == (1.0, 1410), "no slowdown: least energy within the baseline"
    assert times(plan, TimeTarget(1.3).choose(plan)) == (1.25, 1005), "least energy within 1.3 s"
    assert times(plan, TimeTarget(0.5).choose(plan)) == (1.0, 1410), "nothing that fast: the fastest"
    # Paced to 1.45 × the default point's 1.0 s: the paced point, which a time target never picks.
    assert times(plan, PacedTarget(1.45).choose(plan)) == (1.4, 960)
    assert times(plan, TimeTarget(1.45).choose(plan)) == (1.25, 1005)


@pytest.mark.parametrize("make, message", [
    (lambda: TimeTarget(0.0), "target time must be a positive number of seconds"),
    (lambda: TimeTarget(float("nan")), "target time must be a positive number of seconds"),
    (lambda: PacedTarget(0.9), "target slowdown must be >= 1.0"),
    (lambda: SpeedUp(1.0), "speed-up margin must be in"),
    (lambda: SpeedUp(-0.1), "speed-up margin must be in"),
])
def test_bad_targets_are_one_line_config_errors(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_external_first_else_straggler_else_default_then_adjustments():
    plan = small_plan()
    t = Targeting(StragglerPolicy(threshold=0.05, recover_threshold=0.02, patience=2))
    assert t.target() is NO_SLOWDOWN and t.choose(plan).time_s == 1.0
    # The straggler policy (patience 2) adopts a 1.45 slowdown on the second check in a row.
    assert not t.observe_slowdown(1.45) and t.target() is NO_SLOWDOWN
    assert t.observe_slowdown(1.45) and t.straggler_ratio == 1.45 and t.due
    assert t.target() == PacedTarget(1.45) and t.choose(plan).time_s == 1.4
    # An external target wins over the straggler's pace; clearing it goes back to the straggler.
    t.set_external(TimeTarget(1.1))
    assert t.choose(plan).time_s == 1.1
    t.set_external(None)
    assert t.choose(plan).time_s == 1.4
    # A guard's adjustment applies after the target: 20 % faster than 1.4 s is within 1.12 s.
    t.set_adjustment("guard", SpeedUp(0.2))
    assert t.choose(plan).time_s == 1.1
    t.set_adjustment("guard", None)
    assert t.choose(plan).time_s == 1.4


def test_speed_up_never_slows_down_and_falls_back_to_the_fastest():
    plan = small_plan()
    fastest, middle = plan.points[0], plan.points[2]
    assert SpeedUp(0.0).adjust(plan, middle) is middle
    assert SpeedUp(0.5).adjust(plan, middle) is fastest  # nothing within 0.625 s: the fastest
    assert SpeedUp(0.3).adjust(plan, fastest) is fastest


def test_a_change_is_due_once_and_retarget_reports_only_a_new_point():
    plan = small_plan()
    t = Targeting()
    point, changed = t.deploy(plan)
    assert point.time_s == 1.0 and not changed and not t.due and t.slowdown == 1.0
    t.set_external(PacedTarget(1.0))  # the same point: due, but nothing to switch
    assert t.due and t.retarget(plan) is None and not t.due and t.point is point
    t.set_external(TimeTarget(1.3))
    new = t.retarget(plan)
    assert new is not None and new is t.point and new.time_s == 1.25
    assert t.slowdown == pytest.approx(1.25)
    point, changed = t.deploy(plan)  # a redeployment that replaces the running point says so
    assert changed is False and point is new
    t.set_external(None)
    assert t.deploy(plan)[1] is True and t.point is not None and t.point.time_s == 1.0


def test_new_targets_and_adjustments_plug_in_as_plain_objects():
    """What a carbon/power target or a time guard is: any object with ``choose`` / ``adjust``."""

    @dataclass(frozen=True)
    class EnergyCap:  # run the fastest point whose planned energy stays under a cap
        joules: float

        def choose(self, plan: StagePlan) -> StagePoint:
            return min((p for p in plan.points if p.energy_j <= self.joules), key=lambda p: p.time_s,
                       default=plan.points[-1])

    @dataclass(frozen=True)
    class DefaultSpeed:  # a guard that gives up: the plan's fastest point
        def adjust(self, plan: StagePlan, point: StagePoint) -> StagePoint:
            return plan.fastest

    plan = small_plan()
    assert isinstance(EnergyCap(7.5), Target) and isinstance(DefaultSpeed(), Adjustment)
    t = Targeting()
    t.set_external(EnergyCap(7.5))
    assert t.choose(plan).time_s == 1.25
    t.set_adjustment("guard", DefaultSpeed())
    assert t.due and t.retarget(plan) is plan.fastest
