"""The compiled block descent finds each move's exact minimum, as the numpy descent does."""

import numpy as np
import pytest

from perseus.schedules.dag import InstructionDAG
from perseus.examples.synthetic import h100_like_profile
from perseus.planner import compiled_descent
from perseus.planner.choices import build_node_choices
from perseus.planner.compiled_descent import CompiledDescent
from perseus.planner.potentials import PotentialDescent
from perseus.planner.prices import price_anchors
from perseus.planner.repair import LevelChooser
from perseus.schedules import build_schedule


@pytest.fixture(scope="module")
def pipeline():
    """4 stages × 4 chunks × 4 microbatches interleaved, repaired price-sweep plans at 6 deadlines."""
    dag = InstructionDAG.from_schedule(build_schedule("interleaved", 4, 4, 4))
    profile = h100_like_profile(4, 4, seed=2)
    node_choices = build_node_choices(dag, profile, profile.p_blocking_w)
    chooser = LevelChooser(dag.levels, node_choices)
    deadlines, targets = price_anchors(dag, node_choices, 6, [])
    plans = chooser.fill_slack(chooser.round_with_carry(targets, deadlines), deadlines)
    durations = node_choices.node_times(plans)
    starts = dag.levels.finish_times(durations)[:, : dag.num_nodes] - durations
    return dag, node_choices, starts, deadlines * (1 - 1e-9)


def _plan_cost(descent, node_choices, starts, limits):
    return node_choices.node_costs(descent.plan(starts, limits)).sum(axis=1)


@pytest.mark.parametrize("neighbour_sets", [False, True])
def test_every_move_reaches_the_numpy_moves_least_cost(pipeline, neighbour_sets):
    """Per move and plan: the same improvement (equal plan cost after it) as the numpy descent's
    enumeration of every candidate shift, though on far fewer candidates."""
    dag, node_choices, starts, limits = pipeline
    numpy_descent = PotentialDescent(dag, node_choices, max_block=2, neighbour_sets=neighbour_sets)
    compiled = CompiledDescent(dag, node_choices, max_block=2, neighbour_sets=neighbour_sets)
    scratch = [np.zeros(64) for _ in range(2)] + [np.zeros(64, dtype=np.int64) for _ in range(3)]
    improved = 0
    for m, move in enumerate(compiled.moves):
        expected = starts.copy()
        better = numpy_descent._apply(move, expected, limits)
        got = starts.copy()
        for r in range(len(got)):
            assert compiled_descent._apply_row(
                m, got[r], limits[r], compiled._block_ptr, compiled._block, compiled._aff_ptr, compiled._aff,
                compiled._term_ptr, compiled._term_pos, compiled._term_succ, compiled._term_slope, compiled._table,
                compiled._times, compiled._costs, compiled._counts, *scratch) == better[r]
        np.testing.assert_allclose(_plan_cost(compiled, node_choices, got, limits),
                                   _plan_cost(numpy_descent, node_choices, expected, limits), rtol=0, atol=1e-9)
        improved += int(better.sum())
    assert improved > 50  # the plans leave the moves work to do


def test_compiled_plan_equals_the_numpy_plan(pipeline):
    dag, node_choices, starts, limits = pipeline
    shifted = starts + np.random.default_rng(1).uniform(0, 1e-3, starts.shape)
    assert np.array_equal(CompiledDescent(dag, node_choices).plan(shifted, limits),
                          PotentialDescent(dag, node_choices).plan(shifted, limits))


def test_skipping_unchanged_moves_gives_the_plain_sweeps(pipeline):
    """A move is skipped only while none of the starts it reads has moved: same starts as
    evaluating every move in every sweep."""
    dag, node_choices, starts, limits = pipeline
    compiled = CompiledDescent(dag, node_choices, max_block=2)
    fast = compiled.improve(starts, limits, sweeps=4)
    plain = starts.copy()
    scratch = [np.zeros(64) for _ in range(2)] + [np.zeros(64, dtype=np.int64) for _ in range(3)]
    count = len(compiled.moves)
    for r in range(len(plain)):
        for sweep in range(4):
            changed = False
            for i in range(count):
                m = i if sweep % 2 == 0 else count - 1 - i
                changed |= compiled_descent._apply_row(
                    m, plain[r], limits[r], compiled._block_ptr, compiled._block, compiled._aff_ptr, compiled._aff,
                    compiled._term_ptr, compiled._term_pos, compiled._term_succ, compiled._term_slope, compiled._table,
                    compiled._times, compiled._costs, compiled._counts, *scratch)
            if not changed:
                break
    assert np.array_equal(fast, plain)


def test_descent_lowers_the_cost_and_keeps_every_plan_within_its_deadline(pipeline):
    dag, node_choices, starts, limits = pipeline
    compiled = CompiledDescent(dag, node_choices, max_block=2)
    before = _plan_cost(compiled, node_choices, starts, limits)
    after_starts = compiled.improve(starts, limits, sweeps=4)
    plans = compiled.plan(after_starts, limits)
    assert np.all(node_choices.node_costs(plans).sum(axis=1) <= before + 1e-9)
    assert np.sum(node_choices.node_costs(plans).sum(axis=1) < before - 1e-6) >= len(before) // 2
    finish = dag.levels.finish_times(node_choices.node_times(plans))
    # Windows fit within 1e-12 per node (as in the numpy descent); the limits were shrunk by 1e-9.
    assert np.all(finish.max(axis=1) <= limits / (1 - 1e-9))
