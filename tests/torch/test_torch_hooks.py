"""perseus_torch hooks with stand-in schedules and stages (no process group): what is reported,
what is not, the stage/chunk mapping, refusals, and a clean uninstall."""

from __future__ import annotations

import pytest

import perseus.runtime
from perseus.runtime import RecordingListener
from perseus.schedules import Instruction
from perseus_torch import (
    HookStateError,
    HooksAlreadyInstalled,
    UnsupportedTorchSchedule,
    chunk_map,
    install_hooks,
    job_from_schedule,
    schedule_name,
)


class Stage:
    def __init__(self, index, num_stages=4, group_size=2, group_rank=0):
        self.stage_index, self.num_stages, self.group_size, self.group_rank = index, num_stages, group_size, group_rank

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):
        return ("F", self.stage_index, fwd_chunk_id)

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        return ("B", self.stage_index, bwd_chunk_id)

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
        return ("W", self.stage_index, bwd_chunk_id)


class ScheduleZBVZeroBubble:
    """Runs a fixed action list on its stages, like torch's runtime does."""

    def __init__(self, stages, actions, n_microbatches=2):
        self._stages, self._actions, self._n_microbatches, self._has_backward = stages, actions, n_microbatches, True

    def step(self, *args, **kwargs):
        by_index = {s.stage_index: s for s in self._stages}
        for index, what, mb in self._actions:
            stage = by_index[index]
            if what == "F":
                stage.forward_one_chunk(mb, ())
            elif what == "I":
                stage.backward_one_chunk(mb, full_backward=False)
            elif what == "B":
                stage.backward_one_chunk(mb)
            else:
                stage.backward_weight_one_chunk(mb)

    def eval(self, *args, **kwargs):
        saved, self._has_backward = self._has_backward, False
        try:
            return self.step(*args, **kwargs)
        finally:
            self._has_backward = saved


class ScheduleDualPipeV(ScheduleZBVZeroBubble):
    pass


class Custom(ScheduleZBVZeroBubble):
    __name__ = "Custom"


def zbv_rank0():
    stages = [Stage(3), Stage(0)]  # torch stages 0 and 2S-1 = 3 on rank 0, in any order
    actions = [(0, "F", 0), (3, "F", 0), (3, "I", 0), (3, "W", 0), (0, "I", 0), (0, "B", 1)]
    return ScheduleZBVZeroBubble(stages, actions), stages


def test_every_compute_call_is_reported_with_its_chunk_and_microbatch():
    schedule, stages = zbv_rank0()
    listener = RecordingListener()
    with install_hooks(schedule, listener):
        schedule.step()
        schedule.eval()  # not reported
        stages[0].forward_one_chunk(5, ())  # outside step(): not reported
    assert listener.steps == [[Instruction("forward", 0, 0), Instruction("forward", 0, 1),
                               Instruction("backward_input", 0, 1), Instruction("backward_weight", 0, 1),
                               Instruction("backward_input", 0, 0), Instruction("backward", 1, 0)]]
    assert all("forward_one_chunk" not in s.__dict__ for s in stages) and "step" not in schedule.__dict__
    schedule.step()
    assert len(listener.steps) == 1  # uninstalled


def test_a_step_without_backward_is_not_reported_and_a_failed_step_does_not_end():
    schedule, _ = zbv_rank0()
    listener = RecordingListener()
    install_hooks(schedule, listener)
    schedule._has_backward = False
    schedule.step()
    assert listener.steps == []
    schedule._has_backward = True
    schedule._actions = [(0, "F", 0), (7, "F", 0)]
    with pytest.raises(KeyError):
        schedule.step()
    assert listener.steps == [[Instruction("forward", 0, 0)]]


def test_chunk_mapping_and_job_for_a_v_placement():
    schedule, stages = zbv_rank0()
    assert chunk_map(stages) == {0: 0, 3: 1}
    job = job_from_schedule(schedule)
    assert (job.schedule, job.num_stages, job.stage, job.num_chunks, job.num_microbatches) == ("zbv", 2, 0, 2, 2)
    assert job.model_config["torch_stages"] == [0, 3]


def test_refusals():
    _, stages = zbv_rank0()
    with pytest.raises(UnsupportedTorchSchedule, match="DualPipeV overlaps a forward with a backward"):
        install_hooks(ScheduleDualPipeV(stages, []), RecordingListener())
    with pytest.raises(UnsupportedTorchSchedule, match="not a supported pipelining schedule"):
        schedule_name(object())
    schedule, stages = zbv_rank0()
    install_hooks(schedule, RecordingListener())
    with pytest.raises(perseus.runtime.HooksAlreadyInstalled):  # the one class every adapter raises
        install_hooks(schedule, RecordingListener())
    assert HooksAlreadyInstalled is perseus.runtime.HooksAlreadyInstalled
    with pytest.raises(UnsupportedTorchSchedule, match="not the ones the schedule runs"):
        install_hooks(zbv_rank0()[0], RecordingListener(), stages=[Stage(0)])


def test_overlapping_compute_is_refused():
    schedule, stages = zbv_rank0()
    original = Stage.forward_one_chunk

    def overlapping(self, mb, args, kwargs=None, save_forward_output=True):
        self.backward_one_chunk(mb)  # a backward inside a forward: DualPipeV-style overlap
        return original(self, mb, args)

    stages[1].__class__ = type("Overlapping", (Stage,), {"forward_one_chunk": overlapping})
    install_hooks(schedule, RecordingListener())
    with pytest.raises(perseus.runtime.HookStateError, match="overlaps compute"):  # the runtime's one class
        schedule.step()
    assert HookStateError is perseus.runtime.HookStateError
