"""The compiled repair passes (numba, one plan at a time) equal the numpy level passes bit for bit."""

import numpy as np
import pytest

from perseus.schedules.dag import InstructionDAG
from perseus.examples.synthetic import h100_like_profile
from perseus.planner.choices import build_node_choices
from perseus.planner.compiled_repair import CompiledChooser
from perseus.planner.deadlines import _interpolate
from perseus.planner.prices import price_anchors
from perseus.planner.repair import LevelChooser
from perseus.schedules import build_schedule


@pytest.mark.parametrize("kind,stages,microbatches,chunks", [("1f1b", 4, 8, 1), ("interleaved", 4, 8, 4)])
def test_compiled_passes_equal_the_numpy_passes(kind, stages, microbatches, chunks):
    dag = InstructionDAG.from_schedule(build_schedule(kind, stages, microbatches, chunks))
    profile = h100_like_profile(stages, chunks, seed=1)
    node_choices = build_node_choices(dag, profile, profile.p_blocking_w)
    numpy_passes, compiled = LevelChooser(dag.levels, node_choices), CompiledChooser(dag.levels, node_choices)
    anchors, anchor_targets = price_anchors(dag, node_choices, 8, [])
    deadlines, targets = _interpolate(anchors, anchor_targets, 40)
    # Off-hull targets (some infeasible as given) exercise carries, clamps and the fit tolerance.
    targets = targets * np.random.default_rng(0).uniform(0.97, 1.03, targets.shape)
    for name in ("round_with_carry", "round_with_carry_backward"):
        assert np.array_equal(getattr(compiled, name)(targets, deadlines), getattr(numpy_passes, name)(targets, deadlines))
    rounded = numpy_passes.round_with_carry(targets, deadlines)
    assert not np.array_equal(rounded, numpy_passes.fill_slack(rounded, deadlines))  # the fills have work to do
    for name in ("fill_backward", "fill_forward", "fill_slack"):
        assert np.array_equal(getattr(compiled, name)(rounded, deadlines), getattr(numpy_passes, name)(rounded, deadlines))
    fastest = np.zeros((1, dag.num_nodes), dtype=np.int64)
    assert np.array_equal(compiled.fill_slack(fastest, deadlines[:1]), numpy_passes.fill_slack(fastest, deadlines[:1]))
