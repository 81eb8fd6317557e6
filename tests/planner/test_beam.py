"""LP-guided beam search: feasibility, exactness when the beam holds every state, the pieces."""

import itertools

import numpy as np
import pytest

from perseus.schedules.dag import InstructionDAG
from perseus.planner.beam import BeamSearch, _prefix_shortlists, _row_pareto, beam_plans
from perseus.planner.choices import build_node_choices
from perseus.planner.relaxation import HullRelaxation
from perseus.planner.deadlines import evaluate
from perseus.schedules import build_schedule
from perseus.timeline.simulator import longest_path_finish
from synthetic import synthetic_profile


def _setup(stages, microbatches, freqs, seed, schedule="1f1b", chunks=1):
    sched = build_schedule(schedule, stages, microbatches, chunks) if chunks > 1 else build_schedule(schedule, stages, microbatches)
    dag = InstructionDAG.from_schedule(sched)
    profile = synthetic_profile(stages, freqs, seed, num_chunks=chunks)
    node_choices = build_node_choices(dag, profile, profile.p_blocking_w)
    return dag, node_choices, profile.p_blocking_w


def _flows(dag, node_choices, deadlines):
    lp = HullRelaxation(dag, node_choices)
    rows = []
    for deadline in deadlines:
        lp.solve(deadline * (1 - 1e-9))
        rows.append(lp.edge_flows())
    return np.array(rows)


def _deadlines(dag, node_choices, count):
    fastest = longest_path_finish(dag, node_choices.fastest_times()).max()
    slowest = longest_path_finish(dag, node_choices.node_times(node_choices.slowest_choice())).max()
    return np.linspace(fastest, slowest, count)


def _brute_force(dag, node_choices, p_blocking_w, deadlines):
    """Least energy within each deadline over every plan (all choice combinations)."""
    counts = node_choices.num_choices[node_choices.node_table]
    plans = np.array(list(itertools.product(*[range(c) for c in counts])), dtype=np.int64)
    found = evaluate(dag, node_choices, plans, p_blocking_w)
    return np.array([found.energies_j[found.times_s <= d * (1 + 1e-12)].min() for d in deadlines])


@pytest.mark.parametrize("reverse", [False, True])
def test_a_beam_wide_enough_to_hold_every_state_is_exact(reverse):
    dag, node_choices, p_b = _setup(2, 2, 4, seed=1)  # 8 instructions, ≤ 4 choices: 4^8 plans
    deadlines = _deadlines(dag, node_choices, 7)
    exact = _brute_force(dag, node_choices, p_b, deadlines)
    search = BeamSearch(dag, node_choices, reverse=reverse, choices_per_parent=4)
    result = search.run(deadlines, _flows(dag, node_choices, deadlines), 4**8, p_b, dag.schedule.num_stages)
    sim = evaluate(dag, node_choices, result.choices, p_b)
    best = np.array([sim.energies_j[result.row == i].min() for i in range(len(deadlines))])
    np.testing.assert_allclose(best, exact, rtol=1e-12)
    # The beam's own energy bookkeeping is the simulator's.
    np.testing.assert_allclose(result.energy_j, sim.energies_j, rtol=1e-12)


def test_every_plan_meets_the_deadline_it_was_built_for():
    dag, node_choices, p_b = _setup(3, 4, 20, seed=4)
    deadlines = _deadlines(dag, node_choices, 9)
    for reverse in (False, True):
        result = BeamSearch(dag, node_choices, reverse=reverse).run(
            deadlines, _flows(dag, node_choices, deadlines), 64, p_b, dag.schedule.num_stages
        )
        sim = evaluate(dag, node_choices, result.choices, p_b)
        assert set(result.row.tolist()) == set(range(len(deadlines)))  # every deadline got plans
        assert np.all(sim.times_s <= deadlines[result.row] * (1 + 1e-12))


def test_exhaustive_beam_is_exact_on_interleaved_with_joint_receives():
    dag, node_choices, p_b = _setup(2, 2, 2, seed=3, schedule="interleaved", chunks=2)  # 16 instructions
    deadlines = _deadlines(dag, node_choices, 5)
    exact = _brute_force(dag, node_choices, p_b, deadlines)
    for reverse in (False, True):
        result = BeamSearch(dag, node_choices, reverse=reverse, choices_per_parent=2).run(
            deadlines, _flows(dag, node_choices, deadlines), 2**16, p_b, 2
        )
        best = np.array([result.energy_j[result.row == i].min() for i in range(len(deadlines))])
        np.testing.assert_allclose(best, exact, rtol=1e-12)


def test_narrow_beams_come_close_to_brute_force():
    dag, node_choices, p_b = _setup(2, 3, 3, seed=5)  # 12 instructions, ≤ 3 choices: 531,441 plans
    deadlines = _deadlines(dag, node_choices, 6)
    exact = _brute_force(dag, node_choices, p_b, deadlines)
    plans = beam_plans(dag, node_choices, deadlines, _flows(dag, node_choices, deadlines), p_b, width=8, max_width=64)
    sim = evaluate(dag, node_choices, plans, p_b)
    ours = np.array([sim.energies_j[sim.times_s <= d * (1 + 1e-12)].min() for d in deadlines])
    assert np.all(ours >= exact * (1 - 1e-12))
    assert np.all(ours <= exact * 1.001)


def test_width_doubling_only_helps():
    dag, node_choices, p_b = _setup(3, 4, 30, seed=6)
    deadlines = _deadlines(dag, node_choices, 6)
    flows = _flows(dag, node_choices, deadlines)

    def best(plans):
        sim = evaluate(dag, node_choices, plans, p_b)
        return np.array([sim.energies_j[sim.times_s <= d * (1 + 1e-12)].min() for d in deadlines])

    narrow = best(beam_plans(dag, node_choices, deadlines, flows, p_b, width=16, max_width=16))
    doubled = best(beam_plans(dag, node_choices, deadlines, flows, p_b, width=16, max_width=256))
    assert np.all(doubled <= narrow)
    assert np.any(doubled < narrow)


def test_row_pareto_keeps_plans_better_than_every_shorter_one():
    span = np.array([[1.0, 2.0, 3.0, 2.5, 1.0]])
    energy = np.array([[10.0, 9.0, 9.5, 8.0, np.inf]])
    np.testing.assert_array_equal(_row_pareto(span, energy), [[True, True, False, True, False]])


def test_prefix_shortlists_are_the_cheapest_of_each_prefix():
    offsets = np.array([[5.0, 3.0, 4.0, 1.0]])
    index, value = _prefix_shortlists(offsets, 2)
    assert index[0, 0].tolist() == [-1, -1] and np.all(np.isinf(value[0, 0]))
    assert index[0, 1].tolist() == [0, -1]
    assert index[0, 2].tolist() == [1, 0]
    assert index[0, 4].tolist() == [3, 1]
    assert value[0, 4].tolist() == [1.0, 3.0]


def test_edge_flows_are_conserved_and_price_the_deadline():
    dag, node_choices, _ = _setup(3, 4, 20, seed=2)
    lp = HullRelaxation(dag, node_choices)
    deadline = _deadlines(dag, node_choices, 5)[1]
    lp.solve(deadline)
    flows = lp.edge_flows()
    inflow = np.bincount(dag.edge_dst, weights=flows, minlength=dag.num_nodes)
    outflow = np.bincount(dag.edge_src, weights=flows, minlength=dag.num_nodes)
    inner = [v for v in range(dag.num_nodes) if dag.predecessors[v] and dag.successors[v]]
    np.testing.assert_allclose(inflow[inner], outflow[inner], atol=1e-7)
    # What reaches the sinks is the LP's marginal cost of the deadline.
    sinks = [v for v in range(dag.num_nodes) if not dag.successors[v]]
    assert inflow[sinks].sum() == pytest.approx(-lp.deadline_slope(), rel=1e-6)
    assert inflow[sinks].sum() > 0
