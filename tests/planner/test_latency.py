"""Plans for GPUs whose clock switches take time to land (planner.latency)."""

from __future__ import annotations

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.planner import PlannerOptions, plan_frontier
from perseus.planner.choices import build_node_choices
from perseus.planner.latency import land_switches
from perseus.schedules import build_schedule
from perseus.timeline.simulator import simulate_plan
from perseus.timeline.switch_lag import simulate_with_latency
from perseus.timeline.switch_timing import late_switches

from synthetic import synthetic_profile

FAST = PlannerOptions(num_anchors=8, num_deadlines=64, improve_sweeps=0, search_time_s=0, beam_width=0)


def _late(dag, freqs, profile, latency_s):
    """Late switches of one plan, over its stages, on its simulated timeline."""
    sim = simulate_plan(dag, profile, freqs)
    out = []
    for stage in range(dag.schedule.num_stages):
        cut = slice(dag.stage_offsets[stage], dag.stage_offsets[stage + 1])
        out += late_switches(sim.start_s[cut], sim.finish_s[cut], np.asarray(freqs)[cut], latency_s, sim.time_s)
    return out


def test_every_switch_of_every_point_lands_in_time_and_the_gpu_runs_it_as_planned():
    schedule = build_schedule("1f1b", 3, 4)
    profile = synthetic_profile(3, 12, seed=1)
    latency = float(np.median([e.times_s[0] for e in profile.entries.values()]))  # about half of them are shorter
    dag = InstructionDAG.from_schedule(schedule)
    free = plan_frontier(schedule, profile, FAST)
    held = plan_frontier(schedule, profile, PlannerOptions(**{**FAST.as_dict(), "switch_latency_s": latency}))
    assert sum(len(_late(dag, p.freqs_mhz, profile, latency)) for p in free.points) > 0  # unconstrained plans have late ones
    for point in [*held.points, *held.paced_points]:
        assert _late(dag, point.freqs_mhz, profile, latency) == []
    for point in held.points:
        # the frontier's numbers are its plan simulated on the profile, and what a GPU with that
        # latency does when the runtime times each switch (switch_timing.request_schedule)
        sim = simulate_plan(dag, profile, point.freqs_mhz)
        assert sim.time_s == point.time_s and sim.energy_j == point.energy_j
        lagged = simulate_with_latency(dag, profile, point.freqs_mhz, latency, "timed")
        assert np.isclose(lagged.time_s, point.time_s, rtol=1e-9) and np.isclose(lagged.energy_j, point.energy_j, rtol=1e-9)
    assert held.default_point().time_s <= held.baseline_time_s
    assert held.default_point().energy_j < held.baseline_energy_j


def test_landing_only_raises_clocks_and_latency_zero_changes_nothing():
    schedule = build_schedule("1f1b", 2, 3)
    profile = synthetic_profile(2, 10, seed=2)
    dag = InstructionDAG.from_schedule(schedule)
    choices_table = build_node_choices(dag, profile, profile.require_p_blocking())
    rng = np.random.default_rng(0)
    choices = np.stack([rng.integers(0, choices_table.num_choices[choices_table.node_table]) for _ in range(20)])
    assert land_switches(dag, choices_table, choices, 0.0) is choices
    held = land_switches(dag, choices_table, choices, 10.0)  # longer than an iteration: no room for two switches
    before, after = choices_table.node_freqs(choices), choices_table.node_freqs(held)
    assert np.all(after >= before) and not np.array_equal(after, before)
    fastest = choices_table.node_freqs(np.zeros_like(held))
    for plan, top in zip(after, fastest):
        for stage in range(schedule.num_stages):
            cut = slice(dag.stage_offsets[stage], dag.stage_offsets[stage + 1])
            # one clock per stage, except where an instruction's fastest useful clock is below the others'
            assert len(set(plan[cut].tolist())) == 1 or np.any(plan[cut] == top[cut])


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
    tiny = 1e-9  # every switch has room: only the cost rule acts
    assert np.array_equal(land_switches(dag, table, choices, tiny, 0.0), choices)
    costly = land_switches(dag, table, choices, tiny, 1e12)  # no switch down pays off
    freqs = table.node_freqs(costly)
    assert not np.array_equal(costly, choices) and np.all(freqs >= table.node_freqs(choices))
    for stage in range(schedule.num_stages):
        nodes = np.flatnonzero(dag.node_stage == stage)
        for prev, node in zip(nodes[:-1], nodes[1:]):
            down = freqs[:, node] < freqs[:, prev]
            fastest = table.node_freqs(np.zeros_like(costly))[:, node]
            assert np.all(~down | (freqs[:, node] == fastest))  # only where no faster choice exists


def test_a_switch_no_merge_can_remove_is_accounted_as_the_gpu_runs_it():
    from perseus.planner.latency import late_plans
    from perseus.profile import InstructionProfile, Profile

    # measured at the same clocks, but forwards' useful ones (1410, 1200) and backwards' (1300, 1100)
    # share none (the others are slower and costlier than a faster one): every plan switches at
    # every instruction
    clocks = (1410, 1300, 1200, 1100)
    fwd = InstructionProfile(clocks, (0.010, 0.0105, 0.012, 0.0125), (4.0, 4.2, 3.0, 3.1))
    bwd = InstructionProfile(clocks, (0.021, 0.020, 0.0235, 0.024), (8.0, 7.0, 7.3, 5.5))
    profile = Profile({(s, 0, "forward"): fwd for s in range(2)} | {(s, 0, "backward"): bwd for s in range(2)}, 80.0)
    schedule = build_schedule("1f1b", 2, 2)
    dag = InstructionDAG.from_schedule(schedule)
    latency = 0.015  # longer than a forward: the switches around one cannot both land in time
    frontier = plan_frontier(schedule, profile, PlannerOptions(**{**FAST.as_dict(), "switch_latency_s": latency}))
    table = build_node_choices(dag, profile, profile.require_p_blocking())
    off_model = 0
    for point in frontier.points:
        choices = np.array([[list(table.tables[table.node_table[v]].freqs_mhz).index(f) for v, f in enumerate(point.freqs_mhz)]])
        assert late_plans(dag, table, choices, latency).all()
        lagged = simulate_with_latency(dag, profile, point.freqs_mhz, latency, "timed")
        assert np.isclose(lagged.time_s, point.time_s) and np.isclose(lagged.energy_j, point.energy_j)
        off_model += not np.isclose(simulate_plan(dag, profile, point.freqs_mhz).energy_j, point.energy_j)
    assert off_model  # the planner's own model would have reported other numbers
