"""Where a stage's clock switches land with a switch latency, and when they are asked for (perseus.timeline.switch_timing)."""

from __future__ import annotations

import pytest

from perseus.timeline.switch_timing import TimedRequest, late_switches, plan_switches, request_schedule, spacing_s

# One stage: four 10 ms instructions, a 5 ms wait before the third; the iteration lasts 50 ms.
BEGIN = [0.000, 0.010, 0.025, 0.035]
END = [0.010, 0.020, 0.035, 0.045]
PERIOD = 0.050


def test_no_switch_no_landing():
    assert plan_switches(BEGIN, END, [900] * 4, 0.02, PERIOD) == []
    assert request_schedule(BEGIN, END, [900] * 4, 0.02, PERIOD) == []


def test_a_switch_lands_as_early_as_its_window_and_the_previous_landing_allow():
    switches = plan_switches(BEGIN, END, [1410, 900, 900, 1410], 0.005, PERIOD)
    assert [s.index for s in switches] == [1, 3]  # the last instruction (1410) before the first (1410): no switch
    by_index = {s.index: s for s in switches}
    assert by_index[1].earliest_s == pytest.approx(0.010) and by_index[1].lands_s == pytest.approx(0.010)
    assert by_index[3].lands_s == pytest.approx(0.035) and all(s.in_time for s in switches)


def test_switches_closer_than_the_latency_are_late():
    clocks = [1410, 900, 1200, 1410]
    assert late_switches(BEGIN, END, clocks, 0.005, PERIOD) == []
    # 14 ms (15.9 ms between landings with the margin): onto the second at 10 ms, so onto the third
    # at 25.9 ms at the earliest, after it began at 25 ms; the fourth's then comes at 41.8 ms, after 35 ms
    assert spacing_s(0.014) == pytest.approx(0.0159)
    late = late_switches(BEGIN, END, clocks, 0.014, PERIOD)
    assert [s.index for s in late] == [2, 3]
    assert late[0].lands_s == pytest.approx(0.0259) and late[0].latest_s == pytest.approx(0.025)


def test_the_wait_before_an_instruction_gives_its_switch_room():
    # switch onto the third instruction may land anywhere in the 5 ms wait before it
    clocks = [900, 900, 1410, 1410]
    switches = plan_switches(BEGIN, END, clocks, 0.004, PERIOD)
    third = next(s for s in switches if s.index == 2)
    assert (third.earliest_s, third.latest_s) == (pytest.approx(0.020), pytest.approx(0.025))
    # the step boundary: the previous step's last end (45 ms - 50 ms) to this step's first begin
    first = next(s for s in switches if s.index == 0)
    assert first.earliest_s == pytest.approx(-0.005) and first.latest_s == pytest.approx(0.0)


def test_the_landing_before_the_step_boundary_counts_for_the_next_steps_first_switch():
    # landings at -5 ms (onto the first: the previous step's last instruction ended then) and at
    # 20 ms (onto the third): 25 ms apart one way, 25 ms the other way round the 50 ms iteration,
    # enough for 20 ms (22.5 ms between landings with the margin)
    clocks = [900, 900, 1410, 1410]
    assert late_switches(BEGIN, END, clocks, 0.020, PERIOD) == []
    # two switches per 50 ms iteration cannot be 35 ms apart both ways round
    assert {s.index for s in late_switches(BEGIN, END, clocks, 0.035, PERIOD)} == {0, 2}


def test_requests_are_made_latency_before_the_landing_from_the_latest_hook_before():
    clocks = [1410, 900, 900, 1410]
    requests = request_schedule(BEGIN, END, clocks, 0.005, PERIOD)
    # onto the second (lands 10 ms): asked at 5 ms, 5 ms after the first's begin hook; onto the
    # fourth (lands 35 ms): asked at 30 ms, 5 ms after the third's begin hook
    assert requests == [TimedRequest(0, False, pytest.approx(0.005), 900, 1),
                        TimedRequest(2, False, pytest.approx(0.005), 1410, 3)]


def test_a_request_before_the_step_begins_is_made_in_the_step_before():
    clocks = [900, 1410, 1410, 1410]  # onto the first in the wait before it, onto the second at 10 ms
    requests = {r.index: r for r in request_schedule(BEGIN, END, clocks, 0.013, PERIOD)}
    # onto the second: lands at 10 ms, asked at -3 ms = 47 ms of the step before: 2 ms after its last end hook
    assert requests[1] == TimedRequest(3, True, pytest.approx(0.002), 1410, 1, next_step=True)
    # onto the first: lands at -5 ms (the previous step's last end), asked at -18 ms = 32 ms of the
    # step before: 7 ms after its third instruction began
    assert requests[0] == TimedRequest(2, False, pytest.approx(0.007), 900, 0, next_step=True)


def test_timelines_must_match_the_clocks():
    with pytest.raises(ValueError, match="3 clocks but 4 begins"):
        plan_switches(BEGIN, END, [900, 900, 900], 0.01, PERIOD)
