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


class Action:
    """What the tracker reads of torch's ``_Action``: a str-enum computation type and sub-actions."""

    def __init__(self, stage_index, computation_type, microbatch_index=None, sub_actions=None):
        self.stage_index, self.computation_type = stage_index, computation_type
        self.microbatch_index, self.sub_actions = microbatch_index, sub_actions


class ScheduleDualPipeV(ScheduleZBVZeroBubble):
    """Runs ("FB", forward's stage, its microbatch, backward's stage, its microbatch) as torch 2.13
    runs OVERLAP_F_B: the forward, then the full backward; its action list says which are fused."""

    def __init__(self, stages, actions, n_microbatches=2, rank=0):
        super().__init__(stages, actions, n_microbatches)
        self.pipeline_order_with_comms = {rank: [
            Action(-1, "OVERLAP_F_B", None, (Action(a[1], "F", a[2]), Action(a[3], "B", a[4])))
            if a[0] == "FB" else Action(a[0], a[1], a[2]) for a in actions]}

    def step(self, *args, **kwargs):
        by_index = {s.stage_index: s for s in self._stages}
        for action in self._actions:
            if action[0] == "FB":
                by_index[action[1]].forward_one_chunk(action[2], ())
                by_index[action[3]].backward_one_chunk(action[4])
            else:
                index, what, mb = action
                stage = by_index[index]
                if what == "F":
                    stage.forward_one_chunk(mb, ())
                elif what == "B":
                    stage.backward_one_chunk(mb)


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


def test_dualpipev_fused_units_are_reported_as_one_instruction_with_their_microbatch_pair():
    stages = [Stage(3), Stage(0)]
    actions = [(0, "F", 0), (0, "F", 1), (3, "F", 0), ("FB", 3, 1, 0, 0), ("FB", 0, 2, 3, 0), (3, "B", 1)]
    schedule = ScheduleDualPipeV(stages, actions)
    listener = RecordingListener()
    with install_hooks(schedule, listener):
        schedule.step()
    assert listener.steps == [[Instruction("forward", 0, 0), Instruction("forward", 1, 0), Instruction("forward", 0, 1),
                               Instruction.fused(1, 1, 0, 0), Instruction.fused(2, 0, 0, 1), Instruction("backward", 1, 1)]]
    assert job_from_schedule(schedule).schedule == "dualpipev"


def test_a_fused_forward_not_followed_by_its_backward_is_a_hook_state_error():
    for ran, problem in (([(0, "F", 0), (3, "F", 0), (0, "F", 1), (0, "B", 0)], "inside the fused unit of forward "
                                                                               "microbatch 1"),
                         ([(0, "F", 0), (3, "F", 0), (0, "F", 1)], "step ended inside a fused unit")):
        schedule = ScheduleDualPipeV([Stage(3), Stage(0)], [(0, "F", 0), (3, "F", 0), ("FB", 0, 1, 3, 0)])
        schedule._actions = ran  # what runs differs from its action list
        install_hooks(schedule, RecordingListener())
        with pytest.raises(HookStateError, match=problem):
            schedule.step()


def test_refusals():
    _, stages = zbv_rank0()
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
