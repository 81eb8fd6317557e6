"""A plan on GPUs whose clock switches land late (perseus.timeline.switch_lag), against the planner's model."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.schedules.dag import InstructionDAG
from perseus.profile import InstructionProfile, Profile
from perseus.schedules import build_schedule
from perseus.timeline.simulator import simulate_plan
from perseus.timeline.switch_lag import POLICIES, simulate_with_latency
from perseus.timeline.switch_timing import late_switches, request_schedule

CLOCKS = (1410, 1200, 900)
TIMES = {"forward": (0.010, 0.011, 0.014), "backward": (0.020, 0.022, 0.028)}
POWER_W = (400.0, 300.0, 200.0)


def profile(stages: int) -> Profile:
    entries = {}
    for s in range(stages):
        for kind, times in TIMES.items():
            entries[(s, 0, kind)] = InstructionProfile(CLOCKS, times, tuple(t * p for t, p in zip(times, POWER_W)))
    return Profile(entries, 80.0, "hand-made")


def test_latency_zero_is_the_planners_model_under_every_policy():
    schedule = build_schedule("1f1b", 2, 4)
    dag, prof = InstructionDAG.from_schedule(schedule), profile(2)
    rng = np.random.default_rng(0)
    for _ in range(5):
        plan = rng.choice(CLOCKS, size=dag.num_nodes)
        want = simulate_plan(dag, prof, plan)
        for policy in POLICIES:
            got = simulate_with_latency(dag, prof, plan, 0.0, policy)
            assert got.time_s == pytest.approx(want.time_s, abs=1e-12)
            assert got.energy_j == pytest.approx(want.energy_j, abs=1e-9)
            assert np.allclose(got.start_s, want.start_s) and not got.off_plan_s.any()


def test_a_switch_landing_inside_a_kernel_changes_the_rest_of_it():
    # one stage, back to back: forward 0 at 1410, backward 0 at 900, forward 1 at 900, backward 1 at 1410
    schedule = build_schedule("1f1b", 1, 2)
    dag, prof = InstructionDAG.from_schedule(schedule), profile(1)
    plan = np.array([1410, 900, 900, 1410])
    latency = 0.005
    got = simulate_with_latency(dag, prof, plan, latency, "ahead")
    # asked for when the instruction before ends, each switch runs the first 5 ms of its
    # instruction at the previous clock: backward 0 does 5/20 of its work at 1410, the rest at 900
    done = latency / 0.020
    b0_time = latency + (1 - done) * 0.028
    b0_energy = done * 0.020 * 400 + (1 - done) * 0.028 * 200
    assert got.finish_s[1] - got.start_s[1] == pytest.approx(b0_time)
    assert got.off_plan_s[1] == pytest.approx(latency) and got.start_mhz[1] == 1410
    # forward 1 at 900 as planned; backward 1 does 5 ms at 900 (5/28 of its work), then 1410
    up = latency / 0.028
    b1_time = latency + (1 - up) * 0.020
    assert got.finish_s[3] - got.start_s[3] == pytest.approx(b1_time)
    planned = simulate_plan(dag, prof, plan)
    assert got.time_s == pytest.approx(planned.time_s - (0.028 - b0_time) + (b1_time - 0.020))
    b1_energy = up * 0.028 * 200 + (1 - up) * 0.020 * 400
    compute = 0.010 * 400 + b0_energy + 0.014 * 200 + b1_energy
    assert got.energy_j == pytest.approx(compute)  # one stage, never waiting: no blocking energy


def test_timed_requests_run_a_plan_whose_switches_land_in_time_as_planned():
    schedule = build_schedule("1f1b", 2, 4)
    dag, prof = InstructionDAG.from_schedule(schedule), profile(2)
    plan = np.full(dag.num_nodes, 1410)
    stage0 = slice(dag.stage_offsets[0], dag.stage_offsets[1])
    plan[stage0] = [1410, 900, 1200, 900, 1200, 900, 1200, 1410]  # stage 0 has slack; stage 1 sets the pace
    latency = 0.008
    planned = simulate_plan(dag, prof, plan)
    assert not late_switches(planned.start_s[stage0], planned.finish_s[stage0], plan[stage0], latency, planned.time_s)
    timed = simulate_with_latency(dag, prof, plan, latency, "timed")
    assert timed.time_s == pytest.approx(planned.time_s) and timed.energy_j == pytest.approx(planned.energy_j)
    assert not timed.off_plan_s.any()
    # asked for at the previous instruction's end, the same switches land inside instructions:
    # switches down cost energy (the head runs faster than planned), switches up cost time
    ahead = simulate_with_latency(dag, prof, plan, latency, "ahead")
    at_begin = simulate_with_latency(dag, prof, plan, latency, "at_begin")
    assert ahead.off_plan_s.sum() > 0 and ahead.energy_j > planned.energy_j
    assert at_begin.off_plan_s.sum() > ahead.off_plan_s.sum()


def test_unknown_policy_is_a_clear_error():
    schedule = build_schedule("1f1b", 1, 2)
    dag, prof = InstructionDAG.from_schedule(schedule), profile(1)
    with pytest.raises(ValueError, match="unknown request policy 'early'"):
        simulate_with_latency(dag, prof, np.full(4, 1410), 0.01, "early")


def test_requests_for_the_next_step_move_by_the_time_between_steps_the_plan_does_not_know():
    schedule = build_schedule("1f1b", 2, 4)
    dag, prof = InstructionDAG.from_schedule(schedule), profile(2)
    plan = np.full(dag.num_nodes, 1410)
    stage0 = slice(dag.stage_offsets[0], dag.stage_offsets[1])
    # stage 0 goes down to 900 after its first forward (10 ms, shorter than the 12 ms latency): that
    # switch is asked for in the step before, and would land in the wait between steps, too early
    plan[stage0] = [1410, 900, 900, 900, 900, 900, 900, 1410]
    planned = simulate_plan(dag, prof, plan)
    begin, end, latency = planned.start_s[stage0], planned.finish_s[stage0], 0.012
    assert not late_switches(begin, end, plan[stage0], latency, planned.time_s)
    first = request_schedule(begin, end, plan[stage0], latency, planned.time_s)[0]
    assert first.index == 1 and first.next_step
    for between in (0.0, 0.03):
        timed = simulate_with_latency(dag, prof, plan, latency, "timed", between_steps_s=between)
        assert timed.time_s == pytest.approx(planned.time_s) and timed.energy_j == pytest.approx(planned.energy_j)
        assert not timed.off_plan_s.any()
