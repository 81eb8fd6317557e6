"""The unlocked card as a plan option: each kind that has an unlocked point may be planned at
``UNLOCKED_MHZ`` (default clocks) with its measured time and energy, never at a locked clock above
its sustained one, and "fastest" / "no slowdown" mean what the unlocked card does."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from perseus.planner import PlannerOptions, plan_frontier
from perseus.planner.choices import useful_choices
from perseus.planner.handoff import with_handoff
from perseus.planner.stage_plan import frontier_timing, stage_plan_of
from perseus.planner.unlocked import SAME_AS_UNLOCKED, choice_clocks, reference_plan
from perseus.profile import InstructionProfile, Profile
from perseus.profile.unlocked import UNLOCKED_MHZ, Unlocked
from perseus.schedules import build_schedule
from perseus.schedules.dag import InstructionDAG
from perseus.timeline.simulator import simulate_plan

CLOCKS = (1980, 1830, 1680, 1530, 1380, 1230)
P_BLOCKING = 110.0


def dense(unlocked_time_s: float | None = None) -> InstructionProfile:
    """A dense kind held at 1,530 MHz by the power cap: the clocks above are copies of 1,530's."""
    times = [0.030 * 1530 / min(f, 1530) for f in CLOCKS]
    energies = [0.030 * 1530 / min(f, 1530) * (200 + 500 * (min(f, 1530) / 1980) ** 3) for f in CLOCKS]
    entry = InstructionProfile(CLOCKS, tuple(times), tuple(energies))
    if unlocked_time_s is None:
        return entry
    t, e = entry.at(1530)
    return replace(entry, unlocked=Unlocked(unlocked_time_s, e / t * unlocked_time_s, 1530))


def memory_bound(unlocked: bool = True) -> InstructionProfile:
    """A memory-bound kind: sustains 1,980 MHz, its time barely depends on the clock."""
    times = [0.012 * (0.3 * 1980 / f + 0.7) for f in CLOCKS]
    energies = [t * (150 + 200 * (f / 1980) ** 3) for t, f in zip(times, CLOCKS)]
    entry = InstructionProfile(CLOCKS, tuple(times), tuple(energies))
    return replace(entry, unlocked=Unlocked(times[0], energies[0], 1980)) if unlocked else entry


def profile(forward: InstructionProfile, backward: InstructionProfile, stages: int = 2) -> Profile:
    entries = {(s, 0, k): e for s in range(stages) for k, e in (("forward", forward), ("backward", backward))}
    return Profile(entries, P_BLOCKING, "H200 (test)")


def test_the_choices_are_the_unlocked_card_and_the_clocks_that_beat_it_up_to_the_sustained_one():
    entry = dense(unlocked_time_s=0.030)
    freqs = [f for f, _, _ in choice_clocks(entry)]
    assert UNLOCKED_MHZ in freqs
    assert not [f for f in freqs if f > 1530 and f != UNLOCKED_MHZ], "no locked clock above the sustained one"
    assert 1530 not in freqs, "the sustained clock's own point is the unlocked card's: nothing to lock for"
    assert {1380, 1230} <= set(freqs), "slower, cheaper clocks stay choices"
    table = useful_choices(entry, P_BLOCKING)
    assert table.freqs_mhz[0] == UNLOCKED_MHZ, "the fastest choice is the unlocked card"


def test_a_locked_clock_measurably_faster_than_the_unlocked_card_stays_a_choice():
    slow = dense(unlocked_time_s=0.030 * (1 + 5 * SAME_AS_UNLOCKED))  # the unlocked card dithers below 1,530
    table = useful_choices(slow, P_BLOCKING)
    assert table.freqs_mhz[0] == 1530 and UNLOCKED_MHZ not in table.freqs_mhz[:1]


def test_a_profile_without_unlocked_points_plans_as_before():
    entry = dense()
    assert [f for f, _, _ in choice_clocks(entry)] == list(CLOCKS)
    dag = InstructionDAG.from_schedule(build_schedule("1f1b", 2, 4))
    assert (reference_plan(dag, profile(entry, memory_bound(False))) == 1980).all()


def test_the_fastest_point_and_the_baseline_are_the_unlocked_card():
    """Where the unlocked card is as fast as any lock, the fastest plan locks nothing (no switch to
    pay), and "no slowdown" is measured against the unlocked card, whose step is the baseline."""
    sched = build_schedule("1f1b", 2, 4)
    prof = profile(memory_bound(), dense(unlocked_time_s=0.030))
    frontier = plan_frontier(sched, prof, PlannerOptions())
    dag = InstructionDAG.from_schedule(sched)
    unlocked = simulate_plan(dag, prof, reference_plan(dag, prof))
    assert frontier.baseline_time_s == pytest.approx(unlocked.time_s)
    assert frontier.fastest.time_s == pytest.approx(unlocked.time_s)
    critical = [f for f, slack in zip(frontier.fastest.freqs_mhz, _slack(dag, prof, frontier.fastest.freqs_mhz))
                if slack <= 1e-12]
    assert critical and all(f == UNLOCKED_MHZ for f in critical), "the critical path runs unlocked, not locked"
    assert frontier.default_point().time_s <= frontier.baseline_time_s * (1 + 1e-9)
    assert all(f <= 1530 or f == UNLOCKED_MHZ for p in frontier.points
               for f, inst in zip(p.freqs_mhz, [i for s in sched.stages for i in s]) if inst.kind == "backward"), \
        "no plan locks the dense kind above its sustained clock"


def test_a_card_that_boosts_unlocked_makes_the_all_locked_plan_no_baseline():
    """The unlocked card ran the dense kind faster than any lock (its own DVFS boosts between the
    power cap's dips): the baseline is its time, so the no-slowdown point is no slower than it."""
    sched = build_schedule("1f1b", 2, 4)
    prof = profile(memory_bound(), dense(unlocked_time_s=0.027))
    frontier = plan_frontier(sched, prof, PlannerOptions())
    dag = InstructionDAG.from_schedule(sched)
    locked_max = np.array([1980 if i.kind == "forward" else 1530 for s in sched.stages for i in s])
    assert frontier.baseline_time_s < simulate_plan(dag, prof, locked_max).time_s
    assert frontier.default_point().time_s <= frontier.baseline_time_s * (1 + 1e-9)


def test_stage_plans_and_timelines_carry_unlocked_instructions():
    sched = build_schedule("1f1b", 2, 4)
    prof = profile(memory_bound(), dense(unlocked_time_s=0.030))
    frontier = plan_frontier(sched, prof, PlannerOptions())
    timing = frontier_timing(frontier, prof)
    assert timing.shape[0] == len(frontier.points) + len(frontier.paced_points) and np.isfinite(timing).all()
    plan = stage_plan_of(frontier, 1, prof)
    assert (plan.clocks(plan.fastest) == UNLOCKED_MHZ).all() and plan.timeline(plan.fastest) is not None


def test_a_hand_off_lengthens_the_unlocked_point_too():
    entry = dense(unlocked_time_s=0.030)
    prof = with_handoff(profile(memory_bound(), entry), 0.001, {(0, 0, "backward")})
    moved = prof.get(0, "backward")
    assert moved.unlocked is not None and moved.unlocked.time_s == pytest.approx(0.031)
    assert moved.unlocked.energy_j == pytest.approx(entry.unlocked.energy_j + 0.001 * P_BLOCKING)
    assert prof.get(1, "backward").unlocked == entry.unlocked


def _slack(dag: InstructionDAG, prof: Profile, freqs: np.ndarray) -> list[float]:
    """Each instruction's slack in the plan: how much later it could end without a longer iteration."""
    from perseus.timeline.simulator import plan_costs

    durations, _ = plan_costs(dag, prof, freqs)
    finish = dag.levels.finish_times(durations[None, :])[0, : dag.num_nodes]
    latest = np.full(dag.num_nodes, finish.max())
    for v in reversed(dag.topo_order.tolist()):
        for u in dag.predecessors[v]:
            latest[u] = min(latest[u], latest[v] - durations[v])
    return (latest - finish).tolist()
