"""Plan following: planned clock per instruction, first divergence detected once."""

from perseus.runtime.deploy import PlanFollower
from perseus.schedule import build_schedule


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


def test_peek_is_the_next_instructions_clock_and_wraps_to_the_next_step():
    sched, f = follower()
    insts = sched.stages[1]
    f.start_step()
    assert f.peek() == 1000
    for i, inst in enumerate(insts):
        f.next(inst.kind, inst.microbatch, inst.chunk)
        assert f.peek() == (1000 + 10 * (i + 1) if i + 1 < len(insts) else 1000)
