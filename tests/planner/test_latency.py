"""Plans for GPUs whose clock switches take time to land (planner.latency)."""

from __future__ import annotations

import numpy as np

from perseus.dag import InstructionDAG
from perseus.planner import PlannerOptions, plan_frontier
from perseus.planner.choices import build_node_choices
from perseus.planner.latency import hold_through_short_switches
from perseus.schedule import build_schedule
from perseus.simulator import simulate_plan

from synthetic import synthetic_profile

FAST = PlannerOptions(num_anchors=8, num_deadlines=64, improve_sweeps=0, search_time_s=0, beam_width=0)


def _switches_on_short_instructions(frontier, profile, latency_s):
    dag = InstructionDAG.from_schedule(frontier.schedule)
    bad = 0
    for point in [*frontier.points, *frontier.paced_points]:
        for stage in range(frontier.schedule.num_stages):
            nodes = np.flatnonzero(dag.node_stage == stage)
            for prev, node in zip(nodes[:-1], nodes[1:]):
                f_prev, f = point.freqs_mhz[prev], point.freqs_mhz[node]
                inst = dag.instructions[node]
                t = profile.get(stage, inst.kind, inst.chunk).at(int(f))[0]
                bad += int(f != f_prev and t < latency_s)
    return bad


def test_no_clock_change_lands_on_an_instruction_shorter_than_the_latency():
    schedule = build_schedule("1f1b", 3, 4)
    profile = synthetic_profile(3, 12, seed=1)
    latency = float(np.median([e.times_s[0] for e in profile.entries.values()]))  # about half of them are shorter
    free = plan_frontier(schedule, profile, FAST)
    held = plan_frontier(schedule, profile, PlannerOptions(**{**FAST.as_dict(), "switch_latency_s": latency}))
    assert _switches_on_short_instructions(free, profile, latency) > 0  # the unconstrained planner does switch there
    assert _switches_on_short_instructions(held, profile, latency) == 0
    # every point is still its plan simulated on the profile, and the no-slowdown point stays no slower
    dag = InstructionDAG.from_schedule(schedule)
    for point in held.points:
        sim = simulate_plan(dag, profile, point.freqs_mhz)
        assert sim.time_s == point.time_s and sim.energy_j == point.energy_j
    assert held.default_point().time_s <= held.baseline_time_s
    assert held.default_point().energy_j < held.baseline_energy_j


def test_holding_only_raises_clocks_and_latency_zero_changes_nothing():
    schedule = build_schedule("1f1b", 2, 3)
    profile = synthetic_profile(2, 10, seed=2)
    dag = InstructionDAG.from_schedule(schedule)
    choices_table = build_node_choices(dag, profile, profile.require_p_blocking())
    rng = np.random.default_rng(0)
    choices = np.stack([rng.integers(0, choices_table.num_choices[choices_table.node_table]) for _ in range(20)])
    assert hold_through_short_switches(dag, choices_table, choices, 0.0) is choices
    held = hold_through_short_switches(dag, choices_table, choices, 1.0)  # longer than every instruction
    before, after = choices_table.node_freqs(choices), choices_table.node_freqs(held)
    assert np.all(after >= before)
    # a latency longer than everything: no switch inside a stage, except onto an instruction whose
    # fastest useful clock is below the earlier one (its profile has no faster choice to hold)
    fastest = choices_table.node_freqs(np.zeros_like(held))
    for stage in range(schedule.num_stages):
        nodes = np.flatnonzero(dag.node_stage == stage)
        for prev, node in zip(nodes[:-1], nodes[1:]):
            switch = after[:, node] != after[:, prev]
            assert np.all(~switch | (after[:, node] == fastest[:, node]) | (after[:, prev] == fastest[:, prev]))


def test_switch_pays_off_compares_the_saving_with_the_latency_at_the_switch_power():
    from perseus.planner.latency import switch_pays_off

    assert switch_pays_off(2.0, 0.02, 80.0)  # 2 J > 20 ms x 80 W = 1.6 J
    assert not switch_pays_off(1.5, 0.02, 80.0)
    assert switch_pays_off(1e-9, 0.02, 0.0)  # free switches always pay off
    assert list(switch_pays_off(np.array([1.0, 2.0]), 0.02, 80.0)) == [False, True]


def test_switches_down_that_do_not_pay_off_keep_the_faster_clock():
    schedule = build_schedule("1f1b", 2, 3)
    profile = synthetic_profile(2, 10, seed=2)
    dag = InstructionDAG.from_schedule(schedule)
    table = build_node_choices(dag, profile, profile.require_p_blocking())
    rng = np.random.default_rng(1)
    choices = np.stack([rng.integers(0, table.num_choices[table.node_table]) for _ in range(20)])
    tiny = 1e-9  # no instruction is shorter: only the cost rule acts
    assert np.array_equal(hold_through_short_switches(dag, table, choices, tiny, 0.0), choices)
    costly = hold_through_short_switches(dag, table, choices, tiny, 1e12)  # no switch down pays off
    freqs = table.node_freqs(costly)
    assert not np.array_equal(costly, choices) and np.all(freqs >= table.node_freqs(choices))
    for stage in range(schedule.num_stages):
        nodes = np.flatnonzero(dag.node_stage == stage)
        for prev, node in zip(nodes[:-1], nodes[1:]):
            down = freqs[:, node] < freqs[:, prev]
            fastest = table.node_freqs(np.zeros_like(costly))[:, node]
            assert np.all(~down | (freqs[:, node] == fastest))  # only where no faster choice exists
