"""Schedule data for torch.distributed.pipelining: each rank's order equals what torch's own
schedule objects execute (built, not run), and the DAG of zero-bubble / V schedules is right."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_orders import torch_compute_order

from perseus.schedules.dag import InstructionDAG
from perseus.errors import ProfileError, ScheduleError
from perseus.profile import InstructionProfile, profile_from_json_dict, uniform_profile
from perseus.schedules import Instruction, build_schedule, torch_rank_order
from perseus.schedules import dependencies

CASES = [(name, pp, chunks, m) for name in ("torch-interleaved", "zb-interleaved") for pp in (2, 3, 4)
         for chunks in (1, 2, 3) for m in (pp, pp + 1, 2 * pp, 3 * pp)
         if not (name == "torch-interleaved" and chunks == 1)]
CASES += [("zbv", pp, 2, m) for pp in (2, 3, 4) for m in (1, 2, pp, 2 * pp - 1, 2 * pp, 3 * pp)]


@pytest.mark.parametrize("name,pp,chunks,microbatches", CASES)
def test_every_rank_order_equals_torchs_own_schedule_object(name, pp, chunks, microbatches):
    for rank in range(pp):
        try:
            want = torch_compute_order(name, pp, microbatches, chunks, rank)
        except (ValueError, AssertionError):
            with pytest.raises(ScheduleError):
                build_schedule(name, pp, microbatches, chunks)
            return
        assert torch_rank_order(name, rank, pp, microbatches, chunks) == want
    schedule = build_schedule(name, pp, microbatches, chunks)
    InstructionDAG.from_schedule(schedule)  # acyclic: the order cannot deadlock
    for rank, order in enumerate(schedule.stages):
        want = torch_compute_order(name, pp, microbatches, chunks, rank)
        assert [(schedule.virtual_stage(rank, i.chunk), i.kind, i.microbatch) for i in order] == want


def test_zbv_places_chunks_in_a_v_and_its_turn_is_a_local_edge():
    schedule = build_schedule("zbv", 2, 4, 2)
    assert [schedule.virtual_stage(0, c) for c in (0, 1)] == [0, 3]
    assert [schedule.virtual_stage(1, c) for c in (0, 1)] == [1, 2]
    assert all(schedule.locate(schedule.virtual_stage(s, c)) == (s, c) for s in (0, 1) for c in (0, 1))
    edges = dependencies(schedule)
    index = {(s, inst): i for s, st in enumerate(schedule.stages) for i, inst in enumerate(st)}
    # torch stage 1 -> 2 (both on rank 1): forward and input gradient stay on rank 1
    assert ((1, index[(1, Instruction("forward", 0, 0))]), (1, index[(1, Instruction("forward", 0, 1))])) in edges
    assert ((1, index[(1, Instruction("backward_input", 0, 1))]), (1, index[(1, Instruction("backward_input", 0, 0))])) in edges
    # torch stage 3 (rank 0, chunk 1) is the last: its I feeds stage 2 on rank 1
    assert ((0, index[(0, Instruction("backward_input", 2, 1))]), (1, index[(1, Instruction("backward_input", 2, 1))])) in edges


def test_weight_gradient_waits_for_its_input_gradient_only():
    schedule = build_schedule("zb-interleaved", 2, 4, 2)
    dag = InstructionDAG.from_schedule(schedule)
    for v, inst in enumerate(dag.instructions):
        if inst.kind == "backward_weight":
            preds = {dag.instructions[u] for u in dag.predecessors[v]}
            assert Instruction("backward_input", inst.microbatch, inst.chunk) in preds
            # nothing on another rank waits for a W: it sends nothing
            assert all(dag.node_stage[w] == dag.node_stage[v] for w in dag.successors[v])


def test_short_labels_and_unsupported_schedules():
    assert Instruction("backward_input", 3, 1).short() == "I3.c1"
    assert Instruction("backward_weight", 2).short() == "W2"
    with pytest.raises(ScheduleError, match="unknown schedule 'looped-bfs'"):
        build_schedule("looped-bfs", 2, 4, 2)
    with pytest.raises(ScheduleError, match="exactly 2 chunks"):
        build_schedule("zbv", 2, 4, 3)


def test_profiles_hold_split_backwards_and_require_them_together():
    ip = InstructionProfile((1410, 1000), (0.01, 0.013), (3.0, 2.6))
    profile = uniform_profile(2, {"forward": ip, "backward_input": ip, "backward_weight": ip}, 80.0, 2)
    profile.check_matches(build_schedule("zbv", 2, 4, 2))
    data = profile.to_json_dict()
    assert profile_from_json_dict(data).entries == profile.entries
    data["measurements"] = [m for m in data["measurements"] if not (m["kind"] == "backward_weight" and m["stage"] == 1)]
    with pytest.raises(ProfileError, match="no backward_weight measurements for stage 1"):
        profile_from_json_dict(data)
