"""Exact window search: windows are smaller than the DAG, results meet the deadline and cost less."""

import numpy as np

from perseus.schedules.dag import InstructionDAG
from perseus.planner.neighbourhood import WindowSearch, _depth_windows
from perseus.planner.choices import NodeChoices, build_node_choices
from perseus.schedules import build_schedule
from perseus.timeline.simulator import simulate_many
from synthetic import synthetic_profile


def three_stage_search() -> tuple[InstructionDAG, NodeChoices, WindowSearch]:
    """A 3-stage 1F1B DAG with 4 microbatches, its choices and a window search of 8 nodes."""
    dag = InstructionDAG.from_schedule(build_schedule("1f1b", 3, 4))
    profile = synthetic_profile(3, 20, seed=1)
    node_choices = build_node_choices(dag, profile, profile.p_blocking_w)
    return dag, node_choices, WindowSearch(dag, node_choices, max_window=8)


def test_depth_windows_cover_every_depth_within_the_cap():
    widths = [1, 2, 3, 1, 2, 3, 3]
    bands = _depth_windows(widths, 5)
    assert all(sum(widths[a : b + 1]) <= 5 for a, b in bands)
    assert {d for a, b in bands for d in range(a, b + 1)} == set(range(len(widths)))


def test_window_search_improves_the_all_fastest_plan_within_the_deadline():
    dag, node_choices, search = three_stage_search()
    assert all(sum(len(level.nodes) for level in dag.levels.levels[a : b + 1]) < dag.num_nodes for a, b in search.windows)
    fastest = np.zeros(dag.num_nodes, dtype=np.int64)
    t_fast = simulate_many(dag, node_choices.node_times(fastest[None]), node_choices.node_energies(fastest[None]), 80.0).time_s[0]
    deadline = 1.1 * t_fast
    improved, solved = search.improve(fastest, deadline, max_windows=1000)
    assert 0 < solved <= 2 * len(search.windows)
    result = simulate_many(dag, node_choices.node_times(improved[None]), node_choices.node_energies(improved[None]), 80.0)
    assert result.time_s[0] <= deadline
    assert node_choices.node_costs(improved).sum() < node_choices.node_costs(fastest).sum() - 1e-6
    # Searching again never makes the plan worse.
    again, _ = search.improve(improved, deadline, max_windows=1000)
    assert node_choices.node_costs(again).sum() <= node_choices.node_costs(improved).sum() + 1e-12


def test_window_search_solves_no_more_windows_than_its_budget():
    """The budget is counted in MILPs, not seconds: the same budget gives the same plan."""
    dag, node_choices, search = three_stage_search()
    fastest = np.zeros(dag.num_nodes, dtype=np.int64)
    deadline = 1.1 * dag.levels.finish_times(node_choices.fastest_times()[None]).max()
    first, solved = search.improve(fastest, deadline, max_windows=2)
    assert solved == 2
    second, _ = search.improve(fastest, deadline, max_windows=2)
    assert np.array_equal(first, second)
    untouched, none = search.improve(fastest, deadline, max_windows=0)
    assert none == 0 and np.array_equal(untouched, fastest)
