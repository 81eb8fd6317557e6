"""Plan following: planned clock per instruction, first divergence detected once."""

import pytest

from perseus.runtime.clocks.deploy import PlanFollower
from perseus.schedules import build_schedule


def follower(stage=1):
    sched = build_schedule("1f1b", 2, 3)
    plan = [(inst, 1000 + 10 * i) for i, inst in enumerate(sched.stages[stage])]
    return sched, PlanFollower(plan, stage)


def test_follows_plan_in_order():
    sched, f = follower()
    for _ in range(2):
        f.start_step()
        got = [f.next(i.kind, i.microbatch, i.chunk) for i in sched.stages[1]]
        assert got == [1000 + 10 * i for i in range(len(got))]
        assert f.end_step()


def test_mismatch_reports_first_difference_and_stays_broken():
    sched, f = follower()
    f.start_step()
    assert f.next("forward", 0, 0) == 1000
    assert f.next("forward", 1, 0) is None  # 1f1b on the last stage expects backward 0
    assert f.broken and "instruction #1" in f.problem and "backward of microbatch 0" in f.problem
    assert f.next("backward", 0, 0) is None
    assert not f.end_step()


def test_too_few_or_too_many_instructions():
    sched, f = follower()
    f.start_step()
    for i in sched.stages[1][:-1]:
        f.next(i.kind, i.microbatch, i.chunk)
    assert not f.end_step() and "ended after 5 instructions" in f.problem
    sched, f = follower()
    f.start_step()
    for i in sched.stages[1]:
        f.next(i.kind, i.microbatch, i.chunk)
    assert f.next("forward", 3, 0) is None and "no more instructions" in f.problem


def test_a_step_without_instruction_hooks_names_cuda_graphs():
    """A CUDA graph replaying the whole iteration (megatron-core's cuda_graph_impl="full_iteration")
    runs no hook: the deployed plan falls back with one line saying so."""
    _, f = follower()
    f.start_step()
    assert not f.end_step()
    assert "no instruction hook ran" in f.problem and "full_iteration" in f.problem


def test_peek_is_the_next_instructions_clock_and_none_after_the_steps_last():
    """After the last instruction comes the work between steps, at default clocks: nothing to
    request ahead (it asked for the next step's first clock, which then ran that work)."""
    sched, f = follower()
    insts = sched.stages[1]
    f.start_step()
    assert f.peek() == 1000
    for i, inst in enumerate(insts):
        f.next(inst.kind, inst.microbatch, inst.chunk)
        assert f.peek() == (1000 + 10 * (i + 1) if i + 1 < len(insts) else None)


def test_timed_switches_send_each_request_from_its_hook_after_its_delay():
    from perseus.runtime.clocks.deploy import TimedSwitches
    from perseus.timeline.switch_timing import TimedRequest

    requests = [TimedRequest(0, False, 0.005, 900, 1), TimedRequest(2, True, 0.001, 1200, 3),
                TimedRequest(3, False, 0.019, 1410, 0, next_step=True)]
    t = TimedSwitches(requests, 4, planned_gap_s=0.002)
    assert [t.watches(i, False) for i in range(4)] == [True, False, False, True]  # 0: notes the step's start
    assert [t.watches(i, True) for i in range(4)] == [False, False, True, True]  # 3: notes the step's end
    assert t.begin(0, 10.0) == [(900, 10.005)] and t.begin(1, 10.01) == []
    assert t.end(2, 10.05) == [(1200, 10.051)]
    assert t.begin(3, 10.06) == [(1410, 10.079)]  # no gap measured yet: as planned
    t.end(3, 10.08)
    t.end_step()
    # the next step began 5 ms after the last one ended, 3 ms later than planned: requests made for
    # the next step move 3 ms later from then on, the others do not
    t.begin(0, 10.085)
    t.end_step()
    assert t.shift_s == pytest.approx(0.003)
    assert t.begin(3, 11.0) == [(1410, pytest.approx(11.022))]
    assert t.begin(0, 12.0)[0] == (900, 12.005)


class _OverlappedPlane:
    """A control plane whose job check is answered later (the hierarchical one's contract), recording asks."""

    overlapped, is_root = True, False

    def __init__(self) -> None:
        self.asked: list[float] = []

    def start_pipeline_rows(self, dp, natural_s, energy_j, diverged):
        from concurrent.futures import Future

        from perseus.runtime.plane.collective import PipelineRow

        self.asked.append(natural_s)
        future = Future()
        future.set_result([PipelineRow(0, natural_s, energy_j, diverged), PipelineRow(1, 2 * natural_s, energy_j, False)])
        return future


def test_an_overlapped_job_check_is_used_at_the_next_check():
    """Every K steps a check is asked; on an overlapped plane the answer returned is the one asked
    a period earlier, marked with the step it is used at (its job energy is published then)."""
    from perseus.runtime.clocks.deploy import Deployment
    from perseus.runtime.job import PipelineJob

    plane, job = _OverlappedPlane(), PipelineJob(num_stages=2, num_microbatches=4, stage=0, dp_size=2)
    deployment = Deployment(0, switches=None, check_every=3, gpu=None)
    answers = {}
    for step in range(1, 10):
        check = deployment.end_step(0.1 * (1 + (step > 3)), 1.0, plane, job, step)
        if check is not None:
            answers[step] = check
    assert plane.asked == [0.1, 0.2, 0.2]  # asked at steps 3, 6, 9 (median of each window)
    assert sorted(answers) == [6, 9]  # nothing at the first check
    assert answers[6].numbers["step"] == 3 and answers[6].numbers["answered_step"] == 6
    assert answers[6].slowdown == pytest.approx(2.0)  # pipeline 1 is twice as slow as this one
    assert answers[9].numbers["pipeline_natural_time_s"] == {0: 0.2, 1: 0.4}
    deployment.restart()  # a new deployment on every rank at once: the pending answer is dropped
    assert [deployment.end_step(0.1, 1.0, plane, job, step) for step in (10, 11, 12)] == [None, None, None]
    assert len(plane.asked) == 4  # asked again at the restarted deployment's first check, answered at its second
