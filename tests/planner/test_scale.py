"""Planner at scale: size-aware settings, chunked batches, the price sweep above ``lp_max_nodes``.

No wall-clock assertions (the machine is shared): speed and memory are in
benchmarks/bench_planner_scale.py. These tests check what makes the speed safe.
"""

import numpy as np
import pytest

from perseus.schedules.dag import InstructionDAG
from perseus.errors import PerseusError
from perseus.examples.synthetic import h100_like_profile
from perseus.planner import PlannerOptions, plan_frontier
from perseus.planner.choices import build_node_choices
from perseus.planner.deadlines import evaluate, repair
from perseus.planner.prices import price_anchors, price_grid, tangent_choices
from perseus.planner.repair import FIT_TOLERANCE, LevelChooser
from perseus.schedules import build_schedule
from perseus.timeline.simulator import max_frequency_plan, simulate_plan


def test_scale_aware_settings_follow_the_pipeline_size_only():
    options = PlannerOptions()
    # Up to 1,536 instructions (A100 8 × 96) nothing changes: num_deadlines and the LP.
    assert [options.deadlines_for(n) for n in (48, 192, 1536)] == [1024, 1024, 1024]
    assert options.deadlines_for(4096) == 384
    assert options.deadlines_for(16384) == options.min_deadlines == 160
    assert options.lp_runs_on(16384) and not options.lp_runs_on(16385)
    # HiGHS up to 2,048 instructions (A100 8 × 96 unchanged), the network simplex above.
    assert not options.flow_runs_on(2048) and options.flow_runs_on(2049) and options.flow_runs_on(16384)
    assert not options.flow_runs_on(16385)  # above lp_max_nodes: the price sweep
    assert [options.anchors_for(n) for n in (192, 1536, 4096, 8192, 16384, 65536)] == [48, 48, 48, 48, 48, 12]
    assert options.batch_rows(16384) == 64 and options.batch_rows(10**9) == 1
    assert PlannerOptions(num_deadlines=100).deadlines_for(16384) == 100  # never more than asked
    assert PlannerOptions(deadline_cells=10**9).deadlines_for(16384) == 1024


@pytest.mark.parametrize("name", ["lp_max_nodes", "flow_min_nodes", "anchor_cells", "min_anchors", "deadline_cells", "min_deadlines", "batch_cells"])
def test_scale_settings_are_validated(name):
    bad = {"lp_max_nodes": -1, "flow_min_nodes": -1, "min_anchors": 1}.get(name, 0)
    with pytest.raises(PerseusError, match=name):
        PlannerOptions(**{name: bad})


@pytest.fixture(scope="module")
def mid():
    """16 stages would be slow to test; 8 stages × 4 chunks × 16 microbatches interleaved (1,024)."""
    schedule = build_schedule("interleaved", 8, 16, 4)
    profile = h100_like_profile(8, 4, seed=1)
    dag = InstructionDAG.from_schedule(schedule)
    return schedule, profile, dag, build_node_choices(dag, profile, profile.p_blocking_w)


def test_chunked_repair_and_simulation_equal_one_batch(mid):
    _, profile, dag, node_choices = mid
    chooser = LevelChooser(dag.levels, node_choices)
    deadlines, targets = price_anchors(dag, node_choices, 12, [])
    whole = repair(chooser, targets, deadlines, rows=len(targets))
    for rows in (1, 5):
        assert np.array_equal(repair(chooser, targets, deadlines, rows=rows), whole)
    one = evaluate(dag, node_choices, whole, profile.p_blocking_w)
    chunked = evaluate(dag, node_choices, whole, profile.p_blocking_w, rows=4)
    assert np.array_equal(one.times_s, chunked.times_s) and np.array_equal(one.energies_j, chunked.energies_j)


def test_level_choice_equals_a_search_per_choice_table(mid):
    """The vectorised per-level choice equals the previous per-table searchsorted, ties included."""
    _, _, dag, node_choices = mid
    chooser = LevelChooser(dag.levels, node_choices)
    rng = np.random.default_rng(0)
    for i, level in enumerate(dag.levels.levels[:40]):
        tables = node_choices.node_table[level.nodes]
        exact = node_choices.times[tables, rng.integers(0, node_choices.num_choices[tables])]
        budgets = np.concatenate([exact[None], exact[None] * rng.uniform(0.8, 1.3, (6, len(level.nodes)))])
        expected = np.empty(budgets.shape, dtype=np.int64)
        for j, k in enumerate(tables):
            row = node_choices.times[k, : node_choices.num_choices[k]]
            found = np.searchsorted(row, budgets[:, j] * (1 + FIT_TOLERANCE) + 1e-15, side="right") - 1
            expected[:, j] = np.maximum(found, 0)
        assert np.array_equal(chooser._pick(i, budgets), expected)


def test_price_sweep_spans_fastest_to_slowest_and_adds_the_extra_deadline(mid):
    _, _, dag, node_choices = mid
    prices = price_grid(node_choices, 16)
    assert prices[0] > prices[-1] == 0.0 and np.all(np.diff(prices) < 0)
    ends = node_choices.node_times(tangent_choices(node_choices, prices[[0, -1]]))
    assert np.array_equal(ends[0], node_choices.fastest_times())
    assert np.array_equal(ends[1], node_choices.node_times(node_choices.slowest_choice()))
    times, targets = price_anchors(dag, node_choices, 16, [])
    extra = 0.5 * (times[0] + times[1])
    with_extra, extra_targets = price_anchors(dag, node_choices, 16, [extra])
    assert extra in with_extra.tolist() and np.all(np.diff(with_extra) > 0)
    row = extra_targets[with_extra.tolist().index(extra)]
    assert dag.levels.finish_times(row[None]).max() <= extra * (1 + 1e-12)  # interpolation is feasible


@pytest.fixture(scope="module")
def swept(mid):
    schedule, profile, _, _ = mid
    options = PlannerOptions(lp_max_nodes=512, num_anchors=16, num_deadlines=128)
    return plan_frontier(schedule, profile, options)


def test_price_sweep_frontier_is_pareto_simulated_and_never_slower_than_all_max(mid, swept):
    schedule, profile, dag, _ = mid
    frontier = swept
    assert frontier.metadata["planner"] == "prices+repair"
    times = np.array([p.time_s for p in frontier.points])
    energies = np.array([p.energy_j for p in frontier.points])
    assert len(times) > 20 and np.all(np.diff(times) > 0) and np.all(np.diff(energies) < 0)
    for point in frontier.points[:: max(1, len(frontier.points) // 25)] + [frontier.points[-1]]:
        timeline = simulate_plan(dag, profile, point.freqs_mhz)
        assert (point.time_s, point.energy_j) == (timeline.time_s, timeline.energy_j)
    base = simulate_plan(dag, profile, max_frequency_plan(dag, profile))
    assert frontier.fastest.time_s <= base.time_s
    assert frontier.default_point().energy_j < 0.97 * base.energy_j


def test_frontier_metadata_records_the_scale_settings(swept):
    meta = swept.metadata
    for name in ("lp_max_nodes", "anchor_cells", "min_anchors", "deadline_cells", "min_deadlines", "batch_cells"):
        assert meta[name] == getattr(PlannerOptions(lp_max_nodes=512), name)
    assert meta["lp_max_nodes"] == 512


def test_network_simplex_lp_plans_the_frontier_of_the_highs_lp(mid):
    """Forcing the LP's dual circulation (network simplex) on 1,024 instructions: a valid frontier,
    and the same LP guidance gives the same energy at the all-max time as HiGHS's (±0.1 %)."""
    schedule, profile, dag, _ = mid
    settings = dict(num_anchors=16, num_deadlines=128, improve_sweeps=0, search_time_s=0.0)
    flow = plan_frontier(schedule, profile, PlannerOptions(flow_min_nodes=0, **settings))
    highs = plan_frontier(schedule, profile, PlannerOptions(flow_min_nodes=dag.num_nodes, **settings))
    assert flow.metadata["planner"] == "flow-lp+repair" and highs.metadata["planner"] == "hull-lp+repair"
    times = np.array([p.time_s for p in flow.points])
    energies = np.array([p.energy_j for p in flow.points])
    assert len(times) > 20 and np.all(np.diff(times) > 0) and np.all(np.diff(energies) < 0)
    for point in flow.points[:: max(1, len(flow.points) // 10)]:
        timeline = simulate_plan(dag, profile, point.freqs_mhz)
        assert (point.time_s, point.energy_j) == (timeline.time_s, timeline.energy_j)
    assert flow.fastest.time_s <= flow.baseline_time_s
    assert flow.default_point().energy_j == pytest.approx(highs.default_point().energy_j, rel=1e-3)


def test_repairing_while_the_flow_lp_solves_gives_the_sequential_rows(mid):
    """The worker-thread LP with interval-by-interval repair equals solving all, then repairing all."""
    from perseus.planner.deadlines import _interpolate, _solve_anchors, _solve_anchors_repairing
    from perseus.planner.flow_lp import FlowRelaxation

    _, _, dag, node_choices = mid
    chooser = LevelChooser(dag.levels, node_choices)
    fastest = dag.levels.finish_times(node_choices.fastest_times()[None]).max()
    slowest = dag.levels.finish_times(node_choices.node_times(node_choices.slowest_choice())[None]).max()
    anchors = np.linspace(fastest, slowest, 7)
    order = range(len(anchors) - 1, -1, -1)
    deadlines, (targets, costs, slopes, plans, extra) = _solve_anchors_repairing(
        FlowRelaxation(dag, node_choices), anchors, order, 40, chooser, 9, lambda _: None)
    assert extra.shape == (0, dag.num_nodes)  # no per-anchor work asked for
    expected_targets, expected_costs, expected_slopes = _solve_anchors(FlowRelaxation(dag, node_choices), anchors, order,
                                                                       lambda _: None)
    expected_deadlines, all_targets = _interpolate(anchors, expected_targets, 40)
    assert np.array_equal(deadlines, expected_deadlines) and np.array_equal(targets, expected_targets)
    assert np.array_equal(costs, expected_costs) and np.array_equal(slopes, expected_slopes)
    assert np.array_equal(plans, repair(chooser, all_targets, expected_deadlines, 9))


def test_flow_path_descends_each_anchor_beside_the_sweep_and_repeats_exactly(mid):
    """Each anchor's plans are descended as soon as the worker thread solved it; the work is
    bounded by sweeps, not by a clock, so the same inputs give the same frontier."""
    schedule, profile, _, _ = mid
    settings = dict(flow_min_nodes=0, num_anchors=12, num_deadlines=96)
    plain = plan_frontier(schedule, profile, PlannerOptions(improve_sweeps=0, **settings))
    first = plan_frontier(schedule, profile, PlannerOptions(**settings))
    second = plan_frontier(schedule, profile, PlannerOptions(**settings))
    assert [(p.time_s, p.energy_j) for p in first.points] == [(p.time_s, p.energy_j) for p in second.points]
    assert first.default_point().energy_j < plain.default_point().energy_j
    times = np.array([p.time_s for p in first.points])
    least = np.minimum.accumulate([p.energy_j for p in first.points])
    at = np.searchsorted(times, [p.time_s * (1 + 1e-12) for p in plain.points], side="right") - 1
    assert np.all(least[at] <= np.array([p.energy_j for p in plain.points]) + 1e-9)  # never worse than without


def test_work_budgets_are_validated():
    with pytest.raises(PerseusError, match="search_windows"):
        PlannerOptions(search_windows=-1)
    assert PlannerOptions(search_windows=0).search_windows == 0
