"""The hull LP through its dual circulation (network simplex) agrees with HiGHS on the primal LP."""

import numpy as np
import pytest
from scipy.optimize import linprog

from perseus.schedules.dag import InstructionDAG
from perseus.examples.synthetic import h100_like_profile
from perseus.planner.choices import build_node_choices
from perseus.planner.flow_lp import FlowRelaxation
from perseus.planner.network_simplex import NetworkSimplex
from perseus.planner.relaxation import HullRelaxation
from perseus.schedules import build_schedule
from perseus.timeline.simulator import longest_path_finish
from synthetic import synthetic_profile


def _hull_cost(node_choices, durations):
    """Σ of each node's convex-hull cost at its duration (the LP's primal objective)."""
    total = 0.0
    for k, table in enumerate(node_choices.tables):
        nodes = np.flatnonzero(node_choices.node_table == k)
        total += np.interp(durations[nodes], table.times_s[table.hull], table.costs[table.hull]).sum()
    return total


@pytest.mark.parametrize("kind,stages,microbatches,chunks,seed", [("1f1b", 3, 4, 1, 2), ("1f1b", 4, 8, 1, 5),
                                                                  ("interleaved", 2, 4, 2, 1)])
def test_flow_lp_matches_highs_at_every_deadline(kind, stages, microbatches, chunks, seed):
    dag = InstructionDAG.from_schedule(build_schedule(kind, stages, microbatches, chunks))
    profile = synthetic_profile(stages, 20, seed=seed, num_chunks=chunks)
    node_choices = build_node_choices(dag, profile, profile.p_blocking_w)
    fastest = longest_path_finish(dag, node_choices.fastest_times()).max()
    slowest = longest_path_finish(dag, node_choices.node_times(node_choices.slowest_choice())).max()
    highs, flow = HullRelaxation(dag, node_choices), FlowRelaxation(dag, node_choices)
    grid = np.linspace(fastest * 1.001, slowest, 12)[::-1]
    values, slopes = [], []
    for deadline in grid:
        durations, bound = flow.solve(deadline)
        expected = highs.solve(deadline)[1]
        # The flow's dual value is a lower bound within the integer rounding (ns, µW) of the optimum ...
        assert bound <= expected + 1e-9 * abs(expected)
        assert bound == pytest.approx(expected, rel=1e-6)
        # ... and its potentials are an optimal schedule: feasible, and of the same cost.
        assert longest_path_finish(dag, durations).max() <= deadline * (1 + 1e-12)
        assert _hull_cost(node_choices, durations) == pytest.approx(expected, rel=1e-6)
        edge_flows = flow.edge_flows()
        assert np.all(edge_flows >= 0)
        # Edge flows are in the DAG's edge order: they are conserved at every inner instruction.
        inflow = np.bincount(dag.edge_dst, weights=edge_flows, minlength=dag.num_nodes)
        outflow = np.bincount(dag.edge_src, weights=edge_flows, minlength=dag.num_nodes)
        inner = (np.bincount(dag.edge_dst, minlength=dag.num_nodes) > 0) & (np.bincount(dag.edge_src, minlength=dag.num_nodes) > 0)
        assert np.allclose(inflow[inner], outflow[inner], atol=1e-6)
        values.append(expected)
        slopes.append(flow.deadline_slope())
    # The circulating flow is a slope of the LP value: its tangents stay below the value everywhere.
    values = np.array(values)
    assert min(slopes) < 0
    for deadline, value, slope in zip(grid, values, slopes):
        assert np.all(value + slope * (grid - deadline) <= values + 1e-6 * np.abs(values))


def test_network_simplex_finds_the_min_cost_circulation_of_a_random_network():
    rng = np.random.default_rng(0)
    n = 12
    # A spanning tree out of node 0 (strongly feasible at zero flow), then random extra arcs.
    tree_tail = np.array([rng.integers(0, v) for v in range(1, n)])
    tree_head = np.arange(1, n)
    extra = 40
    tail = np.concatenate([tree_tail, rng.integers(0, n, extra)])
    head = np.concatenate([tree_head, rng.integers(0, n, extra)])
    keep = tail != head
    tail, head = tail[keep], head[keep]
    cap = rng.integers(1, 20, len(tail))
    cost = rng.integers(-10, 30, len(tail))
    parent_arc = np.concatenate([[-1], np.arange(n - 1)])
    simplex = NetworkSimplex(tail, head, cap, cost, 0, parent_arc)
    assert simplex.solve()
    incidence = np.zeros((n, len(tail)))
    incidence[tail, np.arange(len(tail))] += 1
    incidence[head, np.arange(len(tail))] -= 1
    optimum = linprog(cost, A_eq=incidence, b_eq=np.zeros(n), bounds=list(zip(np.zeros(len(tail)), cap)))
    assert optimum.status == 0
    assert float(cost @ simplex.flow) == pytest.approx(optimum.fun)
    assert np.all(incidence @ simplex.flow == 0) and np.all((simplex.flow >= 0) & (simplex.flow <= cap))
    # Re-optimising after one cost change, from the last tree, matches a cold solve too.
    cost2 = cost.copy()
    cost2[-1] -= 25
    simplex.set_cost(len(tail) - 1, int(cost2[-1]))
    assert simplex.solve()
    optimum2 = linprog(cost2, A_eq=incidence, b_eq=np.zeros(n), bounds=list(zip(np.zeros(len(tail)), cap)))
    assert float(cost2 @ simplex.flow) == pytest.approx(optimum2.fun)


@pytest.mark.parametrize("kind,stages,microbatches,chunks,profile", [
    ("1f1b", 4, 8, 1, synthetic_profile(4, 20, seed=3)),
    ("interleaved", 2, 4, 2, synthetic_profile(2, 20, seed=3, num_chunks=2)),
    ("interleaved", 4, 8, 2, h100_like_profile(4, 2, seed=0)),  # hull sizes differ per instruction
])
def test_flow_lp_at_and_near_the_fastest_deadline_matches_highs(kind, stages, microbatches, chunks, profile):
    """At the all-fastest time (the planner's first anchor, solved just inside it) the LP is
    degenerate; the flow stays finite and its bound equals HiGHS's value there, and just above
    it the schedule meets the deadline."""
    dag = InstructionDAG.from_schedule(build_schedule(kind, stages, microbatches, chunks))
    node_choices = build_node_choices(dag, profile, profile.p_blocking_w)
    fastest = longest_path_finish(dag, node_choices.fastest_times()).max()
    flow, highs = FlowRelaxation(dag, node_choices), HullRelaxation(dag, node_choices)
    # Below this (the all-fastest plan in whole ns) the LP is infeasible and solves are clamped.
    fastest_ns = np.ceil(node_choices.fastest_times() * 1e9 - 1e-6)
    assert flow._fast_limit_ns == int(longest_path_finish(dag, fastest_ns).max())
    for deadline in (fastest * 1.002, fastest * 1.0002, fastest * (1 - 1e-9)):
        durations, bound = flow.solve(deadline)
        assert bound == pytest.approx(highs.solve(deadline)[1], rel=1e-6)
        # Durations are whole ns, rounded up: at most 1 ns per instruction over the deadline.
        assert longest_path_finish(dag, durations).max() <= max(deadline, fastest) + 1e-9 * dag.num_nodes
        assert np.isfinite(flow.deadline_slope()) and flow.deadline_slope() < 0
