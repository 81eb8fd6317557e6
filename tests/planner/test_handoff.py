"""The planner's hand-off between stages, calibrated on the measured all-max step (``planner.handoff``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from perseus.errors import PerseusError
from perseus.planner import PlannerOptions, plan_frontier
from perseus.planner.handoff import calibrate_handoff, sending_keys, with_handoff
from perseus.profile import InstructionProfile, uniform_profile
from perseus.schedules import build_schedule
from perseus.schedules.dag import InstructionDAG
from perseus.timeline.simulator import max_frequency_plan, simulate_plan

SCHEDULE = build_schedule("1f1b", 4, 8)
FORWARD = InstructionProfile((1410, 1110, 960), (0.010, 0.0122, 0.0138), (3.9, 2.95, 2.9))
BACKWARD = InstructionProfile((1410, 1110, 960), (0.020, 0.0243, 0.0275), (7.8, 5.9, 5.8))


def heavier(entry: InstructionProfile, factor: float) -> InstructionProfile:
    return InstructionProfile(entry.freqs_mhz, tuple(t * factor for t in entry.times_s),
                              tuple(e * factor for e in entry.energies_j))


# the demos' pipeline: the last stage 1.3x heavier, so the others have slack to spend
PROFILE = replace(uniform_profile(4, {"forward": FORWARD, "backward": BACKWARD}, 83.64),
                  entries={(s, 0, k): heavier(e, 1.3 if s == 3 else 1.0)
                           for s in range(4) for k, e in (("forward", FORWARD), ("backward", BACKWARD))})


def all_max(profile) -> float:
    dag = InstructionDAG.from_schedule(SCHEDULE)
    return simulate_plan(dag, profile, max_frequency_plan(dag, profile)).time_s


def test_the_senders_are_the_instructions_another_stage_waits_for() -> None:
    senders = sending_keys(SCHEDULE)
    assert senders == ({(s, 0, "forward") for s in range(3)} | {(s, 0, "backward") for s in range(1, 4)})
    assert sending_keys(build_schedule("1f1b", 1, 4)) == frozenset()


def test_a_hand_off_lengthens_the_senders_only_and_leaves_every_options_cost() -> None:
    shifted = with_handoff(PROFILE, 0.001, sending_keys(SCHEDULE))
    assert shifted.get(3, "forward") == PROFILE.get(3, "forward")  # the last stage's forward feeds itself
    before, after = PROFILE.get(1, "forward"), shifted.get(1, "forward")
    assert np.allclose(np.subtract(after.times_s, before.times_s), 0.001)
    cost = lambda e: np.subtract(e.energies_j, 83.64 * np.asarray(e.times_s))  # noqa: E731 - e − P_b·t
    assert np.allclose(cost(after), cost(before))
    with pytest.raises(PerseusError, match="hand-off time is seconds >= 0"):
        with_handoff(PROFILE, -1e-3, ())


def test_the_calibrated_hand_off_reproduces_the_measured_step() -> None:
    senders = sending_keys(SCHEDULE)
    measured = all_max(with_handoff(PROFILE, 0.0008, senders))
    assert measured > all_max(PROFILE) * 1.01  # the hand-offs the DAG did not see
    h = calibrate_handoff(SCHEDULE, PROFILE, measured)
    assert h == pytest.approx(0.0008, abs=1e-7)
    assert all_max(with_handoff(PROFILE, h, senders)) == pytest.approx(measured, rel=1e-6)


def test_a_step_no_longer_than_the_model_needs_no_hand_off() -> None:
    model = all_max(PROFILE)
    assert calibrate_handoff(SCHEDULE, PROFILE, model) == 0.0
    assert calibrate_handoff(SCHEDULE, PROFILE, model * 0.9) == 0.0  # a pessimistic profile is not a hand-off
    assert calibrate_handoff(SCHEDULE, PROFILE, model * 1.001) == 0.0  # within MIN_EXCESS
    one_stage = uniform_profile(1, {"forward": FORWARD, "backward": BACKWARD}, 83.64)
    assert calibrate_handoff(build_schedule("1f1b", 1, 8), one_stage, 1.0) == 0.0
    with pytest.raises(PerseusError, match="measured step time"):
        calibrate_handoff(SCHEDULE, PROFILE, 0.0)


def test_the_no_slowdown_point_planned_with_the_hand_off_is_no_slower_on_a_pipeline_that_has_it() -> None:
    """The case the hand-off is for: planned on the DAG's free hand-offs, the no-slowdown point
    spends slack that a pipeline with hand-offs does not have and runs slower than all-max there;
    planned with the calibrated hand-off it does not."""
    senders = sending_keys(SCHEDULE)
    truth = with_handoff(PROFILE, 0.0015, senders)  # the pipeline as it runs
    dag = InstructionDAG.from_schedule(SCHEDULE)
    reference = all_max(truth)
    options = PlannerOptions(num_anchors=4, num_deadlines=8)

    def slowdown(profile) -> float:
        frontier = plan_frontier(SCHEDULE, profile, options)
        point = min((p for p in frontier.points if p.time_s <= frontier.baseline_time_s * (1 + 1e-9)),
                    key=lambda p: p.energy_j)
        return simulate_plan(dag, truth, point.freqs_mhz).time_s / reference

    assert slowdown(PROFILE) > 1.005
    h = calibrate_handoff(SCHEDULE, PROFILE, reference)
    assert slowdown(with_handoff(PROFILE, h, senders)) == pytest.approx(1.0, abs=1e-6)


def test_a_stalled_warm_up_step_is_not_believed_to_be_a_hand_off() -> None:
    """A step that stalled on something else would read as a huge hand-off: it is capped at half the
    shortest sender's max-clock time."""
    h = calibrate_handoff(SCHEDULE, PROFILE, all_max(PROFILE) * 3)
    assert h == pytest.approx(0.5 * FORWARD.times_s[0])
