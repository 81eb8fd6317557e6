"""torch.distributed.pipelining's own per-rank compute orders, from its schedule objects, unrun.

A schedule class builds ``pipeline_order`` (and the lowered ``pipeline_order_with_comms`` that
``step()`` executes) in its constructor from nothing but the stages' indices and the group's size
and rank, so stand-in stages give every rank's order without a process group.
"""

from __future__ import annotations

import torch
from torch.distributed.pipelining import schedules as S

CLASSES = {
    "torch-interleaved": S.ScheduleInterleaved1F1B,
    "zb-interleaved": S.ScheduleInterleavedZeroBubble,
    "zbv": S.ScheduleZBVZeroBubble,
    "dualpipev": S.ScheduleDualPipeV,
}
COMPUTE = {S._ComputationType.FORWARD: "forward", S._ComputationType.FULL_BACKWARD: "backward",
           S._ComputationType.BACKWARD_INPUT: "backward_input", S._ComputationType.BACKWARD_WEIGHT: "backward_weight"}


class StandInStage:
    """What a schedule constructor reads of a ``_PipelineStageBase``."""

    def __init__(self, index: int, num_stages: int, group_size: int, rank: int) -> None:
        self.stage_index, self.num_stages, self.group_size, self.group_rank = index, num_stages, group_size, rank
        self.submod = torch.nn.Linear(1, 1)
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.stage_index_to_group_rank: dict[int, int] = {}


def torch_stage_indices(name: str, pp: int, chunks: int, rank: int) -> list[int]:
    return [rank, 2 * pp - 1 - rank] if name in ("zbv", "dualpipev") else [c * pp + rank for c in range(chunks)]


def torch_schedule(name: str, pp: int, microbatches: int, chunks: int, rank: int) -> S._PipelineSchedule:
    """torch's schedule object of ``rank``, built on stand-in stages (not run)."""
    stages = [StandInStage(i, pp * chunks, pp, rank) for i in torch_stage_indices(name, pp, chunks, rank)]
    return CLASSES[name](stages, microbatches, loss_fn=lambda out, target: out.sum())


def torch_compute_order(name: str, pp: int, microbatches: int, chunks: int, rank: int) -> list[tuple]:
    """(torch stage index, kind, microbatch) of every compute action ``step()`` runs on ``rank``;
    an ``OVERLAP_F_B`` action is ``(forward's stage, "forward_backward", its microbatch, backward's
    stage, its microbatch)`` after checking it is a forward then a full backward, as torch runs it."""
    schedule = torch_schedule(name, pp, microbatches, chunks, rank)
    out: list[tuple] = []
    for a in schedule.pipeline_order_with_comms[rank]:
        if a.computation_type == S._ComputationType.OVERLAP_F_B:
            f, b = a.sub_actions
            assert (f.computation_type, b.computation_type) == (S.FORWARD, S.FULL_BACKWARD), a
            out.append((f.stage_index, "forward_backward", f.microbatch_index, b.stage_index, b.microbatch_index))
        elif a.computation_type in COMPUTE:
            out.append((a.stage_index, COMPUTE[a.computation_type], a.microbatch_index))
    return out
