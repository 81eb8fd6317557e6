"""Each iteration's non-compute time in the plan (``perseus.frontier.non_compute``): the frontier
carries it, and a slowdown target and a saving are the job's, the non-compute time included."""

from __future__ import annotations

import pytest

from perseus.errors import FrontierError
from perseus.examples import load_example_profile
from perseus.frontier import Frontier, FrontierPoint, NonCompute, from_measured_iteration
from perseus.planner import PlannerOptions, plan_frontier
from perseus.planner.process import READY, ProcessPlanner
from perseus.planner.stage_plan import decode_stage, stage_plan_of
from perseus.schedules import build_schedule
from perseus.schedules.dag import InstructionDAG
from perseus.timeline.simulator import simulate_plan

SCHEDULE = build_schedule("1f1b", 4, 8)
PROFILE = load_example_profile()
DAG = InstructionDAG.from_schedule(SCHEDULE)
TARGET = 0.02  # at most +2 % slowdown


def job_time(point: FrontierPoint, non_compute_s: float) -> float:
    """The iteration as the job runs it: the plan's instructions, then its non-compute time."""
    return simulate_plan(DAG, PROFILE, point.freqs_mhz).time_s + non_compute_s


@pytest.fixture(scope="module")
def blind() -> Frontier:
    return plan_frontier(SCHEDULE, PROFILE)


def test_a_slowdown_target_is_the_jobs_with_the_non_compute_time_and_ignoring_it_overshoots(blind):
    """The job measured its all-max iteration 5 % longer than the instructions' critical path (the
    artifact's runs: 1.5-6.8 %). Its target is at most +2 % on that iteration. A planner that takes
    the plan's time for the iteration picks a plan that slows the job by more; one that carries
    the non-compute time meets it, and spends more of it than the instructions alone would allow."""
    outside = 0.05 * blind.baseline_time_s
    measured = blind.baseline_time_s + outside
    naive = blind.lookup((1 + TARGET) * measured)
    assert job_time(naive, outside) / measured - 1 > TARGET

    frontier = plan_frontier(SCHEDULE, PROFILE, non_compute=from_measured_iteration(measured, blind.baseline_time_s))
    assert frontier.non_compute.time_s == pytest.approx(outside)
    chosen = frontier.lookup_slowdown(TARGET)
    real = job_time(chosen, outside) / measured - 1
    assert real <= TARGET + 1e-9
    assert frontier.slowdown(chosen) == pytest.approx(real)
    assert chosen.energy_j < blind.lookup_slowdown(TARGET).energy_j  # the instructions alone: a tighter budget


def test_it_moves_no_point_and_no_slowdown_is_still_the_default_point(blind):
    frontier = plan_frontier(SCHEDULE, PROFILE, non_compute=NonCompute(0.1))
    assert [(p.time_s, p.energy_j) for p in frontier.points] == [(p.time_s, p.energy_j) for p in blind.points]
    assert (frontier.baseline_time_s, frontier.baseline_energy_j) == (blind.baseline_time_s, blind.baseline_energy_j)
    assert frontier.lookup_slowdown(0.0) is frontier.default_point()
    assert blind.lookup_slowdown(TARGET) is blind.lookup(blind.baseline_time_s * (1 + TARGET))  # none: as before


def test_the_saving_counts_the_non_compute_energy_at_its_power(blind):
    """Every stage's GPU draws the given power (P_blocking when none is given) for the non-compute
    time, in the plan and in the all-max baseline alike: the same plan saves a smaller share."""
    point = blind.default_point()
    compute_only = 1 - point.energy_j / blind.baseline_energy_j
    savings = {}
    for power in (None, 300.0):
        frontier = plan_frontier(SCHEDULE, PROFILE, non_compute=NonCompute(0.1, power))
        watts = frontier.p_blocking_w if power is None else power
        extra = 0.1 * watts * SCHEDULE.num_stages
        savings[power] = frontier.saving(frontier.default_point())
        assert savings[power] == pytest.approx(1 - (point.energy_j + extra) / (blind.baseline_energy_j + extra))
    assert compute_only > savings[None] > savings[300.0]


def test_each_stage_plan_carries_it_and_chooses_as_the_frontier_does():
    frontier = plan_frontier(SCHEDULE, PROFILE, non_compute=NonCompute(0.06, 70.0, "test"))
    for stage in range(SCHEDULE.num_stages):
        plan = stage_plan_of(frontier, stage)
        assert plan.non_compute == frontier.non_compute
        assert plan.non_compute_energy_j() == pytest.approx(0.06 * 70.0 * SCHEDULE.num_stages)
        for target in (0.0, 0.01, 0.05):
            assert plan.lookup_slowdown(target).row == frontier.points.index(frontier.lookup_slowdown(target))
    assert stage_plan_of(plan_frontier(SCHEDULE, PROFILE), 0).non_compute.time_s == 0.0


def test_the_planner_process_hands_it_to_every_stage():
    """The runtime's path: the non-compute time measured on the warm-up steps goes to the planner
    process, and every stage's bytes carry it."""
    measured = NonCompute(0.03, None, "warm-up")
    planner = ProcessPlanner(SCHEDULE, PROFILE, PlannerOptions(), plan_frontier, non_compute=measured)
    assert planner.wait(120) and planner.status == READY, planner.error
    for stage in range(SCHEDULE.num_stages):
        assert decode_stage(planner.result.bytes_of(stage), SCHEDULE, stage).non_compute == measured


def test_bad_values_are_one_line_naming_the_fix():
    with pytest.raises(FrontierError, match="non-compute time is seconds >= 0"):
        NonCompute(-0.1)
    with pytest.raises(FrontierError, match="non-compute power is watts >= 0"):
        NonCompute(0.1, float("nan"))
    with pytest.raises(FrontierError, match=r"slowdown target is a fraction >= 0 \(0.05 for \+5 %\)"):
        NonCompute(0.1).time_budget_s(1.0, -0.01)
    with pytest.raises(FrontierError, match="measured iteration is seconds > 0"):
        from_measured_iteration(0.0, 1.0)
    assert from_measured_iteration(0.9, 1.0).time_s == 0.0  # a pessimistic profile is not non-compute time
