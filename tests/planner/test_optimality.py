"""Planner energy vs the exact MILP optimum at deadlines across the whole time range.

The MILP (milp_oracle.py) is independent of the planner: raw profile, every frequency, binary
choice per instruction, continuous start times. ``GAP_LIMIT`` is the largest relative excess the
planner is allowed over the optimum; the measured gaps are printed (pytest -s) and summarised in
docs/planner.md.

The MILPs are the suite's largest CPU cost (a sixth of it with 5 of these instances), so the suite
checks the 3 × 4 × 40 instances on the seeds that showed the largest gaps: today's planner (2) and
the previous one (6); and the random deadlines on seed 7 (the larger gap of the two, 0.043 %; seed
3's 8 MILPs were the module's most expensive test). ``PERSEUS_OPTIMALITY=full`` runs all ten seeds
and both random-deadline seeds, as docs/planner.md's table does.
"""

import os

import numpy as np
import pytest

from perseus.schedules.dag import InstructionDAG
from perseus.planner import plan_frontier
from perseus.schedules import build_schedule
from milp_oracle import exact_min_energy
from synthetic import synthetic_profile

GAP_LIMIT = 0.001  # 0.1 %: the target; measured worst is printed (pytest -s) and in docs/planner.md
# Zero-bubble DAGs (split I/W, V placement) are not yet within the target: measured gaps up to
# 0.142 % at interior deadlines (docs/torch-pipelining.md); this limit keeps them from growing.
GAP_LIMIT_SPLIT_BACKWARD = 0.002


def deadlines_across(frontier, count: int = 5) -> list[float]:
    """All-max time, slowest frontier time, and evenly spaced ones in between."""
    inner = np.linspace(frontier.fastest.time_s, frontier.slowest.time_s, count)[1:-1]
    return [frontier.baseline_time_s, frontier.slowest.time_s, *inner.tolist()]


def check_against_milp(schedule, profile, count: int = 5, deadlines=None, limit: float = GAP_LIMIT) -> list[float]:
    frontier = plan_frontier(schedule, profile)
    dag = InstructionDAG.from_schedule(schedule)
    gaps = []
    for deadline in deadlines_across(frontier, count) if deadlines is None else deadlines(frontier):
        ours = frontier.lookup(deadline)
        assert ours.time_s <= deadline * (1 + 1e-12)
        exact = exact_min_energy(dag, profile, deadline)
        gap = ours.energy_j / exact - 1
        gaps.append(gap)
        # The oracle is exact up to HiGHS's tolerances (mip_rel_gap 1e-6, feasibility 1e-7 s on
        # start times); beyond them, a plan below it means the oracle or the evaluation is wrong.
        assert gap >= -2e-5, "planner below the exact optimum: oracle or evaluation is wrong"
        assert gap <= limit, f"deadline {deadline:.4f} s: {ours.energy_j:.3f} J vs optimum {exact:.3f} J"
    print(f"{schedule.name} {schedule.num_stages}x{schedule.num_microbatches}: gaps % " + " ".join(f"{100 * g:.3f}" for g in gaps))
    return gaps


FULL = os.environ.get("PERSEUS_OPTIMALITY") == "full"
SEEDS_3X4 = range(10) if FULL else (2, 6)
SEEDS_RANDOM_DEADLINES = (3, 7) if FULL else (7,)


@pytest.mark.parametrize("seed", SEEDS_3X4)
def test_3_stages_4_microbatches_40_frequencies(seed):
    check_against_milp(build_schedule("1f1b", 3, 4), synthetic_profile(3, 40, seed))


@pytest.mark.parametrize("seed", [3, 4])
def test_4_stages_6_microbatches_12_frequencies(seed):
    check_against_milp(build_schedule("1f1b", 4, 6), synthetic_profile(4, 12, seed))


def test_interleaved_2_stages_2_chunks():
    check_against_milp(build_schedule("interleaved", 2, 4, 2), synthetic_profile(2, 16, 7, num_chunks=2))


@pytest.mark.parametrize("name,stages,microbatches,seed", [("zbv", 2, 3, 5), ("zb-interleaved", 2, 2, 6)])
def test_zero_bubble_split_backward(name, stages, microbatches, seed):
    # I and W as separate instructions (W depends only on its own I, sends nothing), ZBV's V
    # placement with the local turn between a rank's two chunks.
    profile = synthetic_profile(stages, 12, seed, num_chunks=2, split_backward=True)
    check_against_milp(build_schedule(name, stages, microbatches, 2), profile, limit=GAP_LIMIT_SPLIT_BACKWARD)


@pytest.mark.parametrize("name,stages,microbatches,chunks,seed", [("dualpipev", 2, 4, 2, 8),
                                                                  ("megatron-combined-1f1b", 2, 4, 2, 9)])
def test_fused_forward_backward_units(name, stages, microbatches, chunks, seed):
    # Fused F+B units (one node for both parts: waits for both inputs, feeds both consumers),
    # DualPipeV's V with its I/W, megatron-core's combined 1F1B with its exchanges.
    profile = synthetic_profile(stages, 12, seed, num_chunks=chunks, fused=True)
    check_against_milp(build_schedule(name, stages, microbatches, chunks), profile, limit=GAP_LIMIT_SPLIT_BACKWARD)


def test_real_a100_profile_slice(a100_slice):
    check_against_milp(build_schedule("1f1b", 3, 4), a100_slice(3))


@pytest.mark.parametrize("seed", SEEDS_RANDOM_DEADLINES)
def test_random_deadlines_between_the_tested_ones(seed):
    # The frontier must be near-optimal at every deadline, not only at evenly spaced ones: a
    # deadline just before a missing Pareto step is where a sparse frontier loses.
    def random_deadlines(frontier):
        return np.random.default_rng(seed).uniform(frontier.fastest.time_s, frontier.slowest.time_s, 8).tolist()

    check_against_milp(build_schedule("1f1b", 3, 4), synthetic_profile(3, 40, seed), deadlines=random_deadlines)
