"""A stage's slice of a frontier: same choices as the whole frontier, only that stage's clocks."""

from __future__ import annotations

import pickle
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from perseus.errors import FrontierError
from perseus.frontier import Frontier, FrontierPoint
from perseus.runtime.plane.collective import Collective, encode_frontier
from perseus.planner.stage_plan import decode_stage, distribute, encode_stage, point_of, slices_of, stage_plan_of
from perseus.schedules import build_schedule

sys.path.insert(0, str(Path(__file__).parents[2]))
import random_frontiers


def random_frontier(stages=4, microbatches=8, chunks=2, num_points=40, num_paced=9) -> Frontier:
    """Interleaved, with paced points cheap enough that ``paced_lookup`` picks them."""
    return random_frontiers.random_frontier(("interleaved", stages, microbatches, chunks), num_points, num_paced,
                                            paced_energy_j=560.0, baseline=(1.5, 700.0), solve_time_s=3.0)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_stage_plan_chooses_what_the_frontier_chooses_and_follows_the_same_clocks(stage):
    front = random_frontier()
    plan = stage_plan_of(front, stage)
    assert plan.instructions == list(front.schedule.stages[stage])
    assert len(plan.points) == len(front.points) and len(plan.paced_points) == len(front.paced_points)
    assert plan.paced_points, "the test frontier must exercise paced points"
    paced_wins = 0
    for t in np.linspace(0.9, 2.2, 157):
        for ours, theirs in ((plan.lookup(t), front.lookup(t)), (plan.paced_lookup(t), front.paced_lookup(t))):
            assert point_of(front, ours) is theirs
            assert plan.stage_plan(ours, stage) == front.stage_plan(theirs, stage)
        paced_wins += point_of(front, plan.paced_lookup(t)) in front.paced_points
    assert paced_wins > 0
    assert point_of(front, plan.default_point()) is front.default_point()
    assert (plan.baseline_time_s, plan.baseline_energy_j) == (front.baseline_time_s, front.baseline_energy_j)


def test_the_wire_form_holds_only_the_stage_clocks():
    front = random_frontier(stages=4, microbatches=16, chunks=2, num_points=60, num_paced=20)
    n_stage = len(front.schedule.stages[1])
    data = encode_stage(front, 1)
    doc = pickle.loads(data)
    # exactly this stage's instructions for every point and paced point, one byte each
    assert len(zlib.decompress(doc["index"])) == 80 * n_stage == 80 * front.schedule.num_instructions // 4
    plan = decode_stage(data, front.schedule, 1)
    assert plan.index.shape == (80, n_stage) and plan.index.dtype == np.uint8
    whole = len(pickle.dumps(encode_frontier(front)))
    assert len(data) < whole / 3  # a quarter of the clocks plus the points' times and energies
    assert plan.nbytes() < sum(p.freqs_mhz.nbytes for p in front.points + front.paced_points) / 4


def test_a_slice_for_another_job_or_stage_is_one_line_error():
    front = random_frontier()
    data = encode_stage(front, 1)
    with pytest.raises(FrontierError, match="received the plan of stage 1 .* this rank runs stage 2"):
        decode_stage(data, front.schedule, 2)
    with pytest.raises(FrontierError, match="this rank runs stage 1 of \\(.interleaved., 4, 12, 2\\)"):
        decode_stage(data, build_schedule("interleaved", 4, 12, 2), 1)
    with pytest.raises(FrontierError, match="malformed stage plan"):
        decode_stage(data[:-20], front.schedule, 1)
    with pytest.raises(FrontierError, match="not in this 4-stage frontier"):
        encode_stage(front, 4)
    with pytest.raises(FrontierError, match="holds the plan of stage 1, not of stage 0"):
        plan = decode_stage(data, front.schedule, 1)
        plan.stage_plan(plan.default_point(), 0)


def test_distribute_without_torch_distributed_keeps_the_own_slice():
    front = random_frontier()
    delivered = distribute(Collective(), slices_of(front), front.schedule, 0)
    assert delivered.received_bytes == 0 and delivered.plan.stage == 0
    assert point_of(front, delivered.plan.default_point()) is front.default_point()


def test_clocks_outside_the_mhz_range_still_round_trip():
    schedule = build_schedule("1f1b", 2, 2)
    n = schedule.num_instructions
    front = Frontier(schedule, 50.0, 1.0, 10.0, [FrontierPoint(1.0, 9.0, np.array([2_000_000, 1_500_000] * (n // 2)))])
    plan = stage_plan_of(front, 1)
    assert plan.stage_plan(plan.default_point(), 1) == front.stage_plan(front.default_point(), 1)


def _profile_for(front: Frontier):
    """A profile with every clock the frontier uses: time falls with the clock, per kind and stage."""
    from perseus.profile import InstructionProfile, Profile

    clocks = sorted({int(f) for p in front.points + front.paced_points for f in p.freqs_mhz}, reverse=True)
    entries = {}
    for s in range(front.schedule.num_stages):
        for c in range(front.schedule.num_chunks):
            for k, base in (("forward", 0.010), ("backward", 0.020)):
                times = tuple(base * (1 + s / 10) * 1410 / f for f in clocks)
                entries[(s, c, k)] = InstructionProfile(tuple(clocks), times, tuple(300 * t for t in times))
    return Profile(entries, 83.64, "H100 SXM")


def test_with_the_profile_each_stage_receives_its_planned_timeline():
    from perseus.schedules.dag import InstructionDAG
    from perseus.timeline.simulator import simulate_plan

    front = random_frontier(num_points=12, num_paced=3)
    profile = _profile_for(front)
    dag = InstructionDAG.from_schedule(front.schedule)
    for stage in (0, 3):
        if stage == 0:
            plan = distribute(Collective(), slices_of(front, profile), front.schedule, stage).plan
        else:
            plan = stage_plan_of(front, stage, profile)
        cut = slice(dag.stage_offsets[stage], dag.stage_offsets[stage + 1])
        for point in plan.points + plan.paced_points:
            begin, end = plan.timeline(point)
            sim = simulate_plan(dag, profile, point_of(front, point).freqs_mhz)
            assert np.allclose(begin, sim.start_s[cut], rtol=1e-6) and np.allclose(end, sim.finish_s[cut], rtol=1e-6)
    # 8 bytes per instruction and point more, only when asked for
    bare, timed = stage_plan_of(front, 1), stage_plan_of(front, 1, profile)
    assert bare.timeline(bare.default_point()) is None
    assert timed.nbytes() - bare.nbytes() == 8 * 15 * len(front.schedule.stages[1])
