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


def test_request_clocks_raise_early_asks_for_a_faster_next_clock_one_instruction_ahead():
    from perseus.runtime.deploy import request_clocks

    planned = [1410, 900, 900, 1200]
    assert request_clocks(planned, False) == planned
    # up-switches (to 1200, and to the next step's 1410) one instruction early; the switch down stays put
    assert request_clocks(planned, True) == [1410, 900, 1200, 1410]
    assert request_clocks([], True) == []


def test_raise_early_follower_reports_planned_clocks_but_requests_the_raised_ones():
    sched = build_schedule("1f1b", 1, 2)
    plan = list(zip(sched.stages[0], [1410, 900, 900, 1200]))
    f = PlanFollower(plan, 0, raise_early=True)
    f.start_step()
    got = []
    for inst in sched.stages[0]:
        got.append((f.next(inst.kind, inst.microbatch, inst.chunk), f.planned(), f.peek()))
    assert got == [(1410, 1410, 900), (900, 900, 1200), (1200, 900, 1410), (1410, 1200, 1410)]
    assert f.end_step() and f.step_clocks(1410) == {1410: 1, 900: 2, 1200: 1}
