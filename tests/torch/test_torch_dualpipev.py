"""DualPipeV's schedule data: every rank's order equals what torch's own ``ScheduleDualPipeV``
object executes (built on stand-in stages, not run), its fused OVERLAP_F_B units included, and the
DAG of fused units is right."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_orders import torch_compute_order

from perseus.errors import ScheduleError
from perseus.schedules import FUSED, Instruction, build_schedule, dependencies
from perseus.schedules.dag import InstructionDAG

CASES = [(pp, m) for pp in (2, 3, 4) for m in (2 * pp - 1, 2 * pp, 2 * pp + 1, 3 * pp, 4 * pp + 2)]


def _as_torch(schedule, rank: int) -> list[tuple]:
    out: list[tuple] = []
    for inst in schedule.stages[rank]:
        stage = schedule.virtual_stage(rank, inst.chunk)
        if inst.kind == FUSED:
            out.append((stage, FUSED, inst.microbatch, schedule.virtual_stage(rank, inst.backward_chunk),
                        inst.backward_microbatch))
        else:
            out.append((stage, inst.kind, inst.microbatch))
    return out


@pytest.mark.parametrize("pp,microbatches", CASES)
def test_every_rank_order_equals_torchs_dualpipev_object(pp, microbatches):
    try:
        want = [torch_compute_order("dualpipev", pp, microbatches, 2, rank) for rank in range(pp)]
    except ValueError:  # torch refuses fewer microbatches than torch stages; so does Perseus
        with pytest.raises(ScheduleError, match="at least as many microbatches"):
            build_schedule("dualpipev", pp, microbatches, 2)
        return
    schedule = build_schedule("dualpipev", pp, microbatches, 2)
    assert [_as_torch(schedule, rank) for rank in range(pp)] == want
    assert any(inst.kind == FUSED for order in schedule.stages for inst in order)
    dag = InstructionDAG.from_schedule(schedule)  # acyclic: the order cannot deadlock
    # every forward and every input gradient (full backward or I) of every (torch stage, microbatch)
    # runs exactly once, fused or not
    parts = sorted((schedule.virtual_stage(s, p.chunk), p.kind == "forward", p.microbatch)
                   for s, order in enumerate(schedule.stages) for inst in order for p in inst.parts()
                   if p.kind in ("forward", "backward", "backward_input"))
    assert parts == sorted((v, f, m) for v in range(2 * pp) for f in (True, False) for m in range(microbatches))
    assert dag.num_nodes == schedule.num_instructions


def test_fused_unit_waits_for_both_parts_inputs_and_feeds_both_parts_consumers():
    schedule = build_schedule("dualpipev", 2, 4, 2)
    index = {(s, p): i for s, st in enumerate(schedule.stages) for i, inst in enumerate(st) for p in inst.parts()}
    unit = Instruction.fused(3, 0, 1, 1)  # rank 0: F3 on torch stage 0 with B1 on torch stage 3
    at = schedule.stages[0].index(unit)
    edges = set(dependencies(schedule))
    # its forward feeds F3 on torch stage 1 (rank 1, chunk 0); its backward (torch stage 3) feeds
    # the backward of microbatch 1 on torch stage 2 (rank 1, chunk 1)
    assert ((0, at), (1, index[(1, Instruction("forward", 3, 0))])) in edges
    assert ((0, at), (1, index[(1, Instruction("backward", 1, 1))])) in edges
    # it waits for F3 of torch stage 0's input (none: the first stage) and for the gradient of B1
    # on torch stage 3, which is the last stage: its own forward F1.c1 runs earlier on rank 0
    assert at > schedule.stages[0].index(Instruction("forward", 1, 1))
    assert all(a != b for a, b in edges)  # no unit waits for itself


def test_fused_instruction_value():
    unit = Instruction.fused(3, 0, 1, 1)
    assert unit.short() == "F3+B1.c1"
    assert unit.parts() == (Instruction("forward", 3, 0), Instruction("backward", 1, 1))
    assert unit.backward_pair() == (1, 1) and Instruction("forward", 3).backward_pair() is None
    with pytest.raises(ValueError, match="names its backward"):
        Instruction(FUSED, 3, 0)
    with pytest.raises(ValueError, match="names its backward"):
        Instruction("forward", 3, 0, 1, 1)
    with pytest.raises(ScheduleError, match="exactly 2 chunks"):
        build_schedule("dualpipev", 2, 4, 1)
