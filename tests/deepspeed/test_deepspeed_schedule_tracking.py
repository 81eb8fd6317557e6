"""The microbatch of each DeepSpeed instruction, derived from TrainSchedule steps (no processes needed).

DeepSpeed's ``TrainSchedule`` is plain Python: iterating it yields the commands each stage
executes. Feeding every ForwardPass/BackwardPass through ``TrackedTrainSchedule`` must give the
core's 1F1B order for every stage, and a command that disagrees with the schedule is refused.
"""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")

from deepspeed.runtime.pipe import schedule as ds_schedule

from perseus.schedules import Instruction, build_schedule
from perseus_deepspeed.hooks import ScheduleMismatch, TrackedTrainSchedule

KINDS = {ds_schedule.ForwardPass: "forward", ds_schedule.BackwardPass: "backward"}


def _derived_order(stages: int, microbatches: int, stage: int) -> list[Instruction]:
    tracked = TrackedTrainSchedule(ds_schedule.TrainSchedule(micro_batches=microbatches, stages=stages, stage_id=stage))
    order = []
    for cmds in tracked:
        for cmd in cmds:
            kind = KINDS.get(type(cmd))
            if kind is not None:
                order.append(Instruction(kind, tracked.microbatch(kind, cmd.buffer_id)))
    return order


@pytest.mark.parametrize("stages,microbatches", [(1, 3), (2, 4), (3, 2), (4, 8), (4, 3), (5, 7)])
def test_every_stage_derives_the_core_1f1b_order(stages, microbatches):
    expected = build_schedule("1f1b", stages, microbatches).stages
    for stage in range(stages):
        assert _derived_order(stages, microbatches, stage) == list(expected[stage]), f"stage {stage}"


def test_buffer_reuse_makes_buffer_id_alone_ambiguous():
    # Why the step is needed: with 4 stages x 8 microbatches, stage 3 reuses buffer 0 for microbatches 0, 2, 4, 6.
    sched = ds_schedule.TrainSchedule(micro_batches=8, stages=4, stage_id=3)
    assert {sched._buffer_idx(m) for m in (0, 2, 4, 6)} == {0}


def test_a_command_that_disagrees_with_its_step_is_refused():
    tracked = TrackedTrainSchedule(ds_schedule.TrainSchedule(micro_batches=4, stages=2, stage_id=0))
    it = iter(tracked)
    cmds = next(it)  # step 0 of stage 0: forward of microbatch 0 in buffer 0
    forward = next(c for c in cmds if isinstance(c, ds_schedule.ForwardPass))
    assert tracked.microbatch("forward", forward.buffer_id) == 0
    with pytest.raises(ScheduleMismatch, match="step 0 .* microbatch 0 \\(forward\\).* backward on buffer 0"):
        tracked.microbatch("backward", forward.buffer_id)
    with pytest.raises(ScheduleMismatch, match="forward on buffer 1"):
        tracked.microbatch("forward", 1)


def test_tracked_schedule_passes_other_attributes_through():
    inner = ds_schedule.TrainSchedule(micro_batches=4, stages=2, stage_id=1)
    tracked = TrackedTrainSchedule(inner)
    assert tracked.num_pipe_buffers() == inner.num_pipe_buffers()
    assert tracked.stage_id == 1 and tracked.micro_batches == 4
    assert len(list(tracked)) == 2 * (4 + 2 - 1)
