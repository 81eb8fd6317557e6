"""Probe placement: one block per window at a seeded uniform offset, never locked onto a loop's period."""

import pytest

from perseus.errors import ConfigError
from perseus.runtime.guard.placement import (
    Backoff,
    ProbePlacement,
    ProbeTimeline,
    StepRole,
    probe_seed,
    uniform_offset,
)

PERIODS = (2, 4, 10, 25, 50, 100)


def roles(timeline: ProbeTimeline, steps: int, length: int) -> list[StepRole]:
    out = []
    for i in range(steps):
        out.append(timeline.role(i))
        if i >= timeline.placement.settle and timeline.closes_window(i):
            timeline.next(length)
    return out


def test_every_rank_derives_the_same_seed_and_offsets_without_a_message():
    a, b = probe_seed(37, "abc123"), probe_seed(37, "abc123")
    assert a == b and a != probe_seed(38, "abc123") and a != probe_seed(37, "abc124")
    assert [uniform_offset(a, i, 7) for i in range(50)] == [uniform_offset(b, i, 7) for i in range(50)]


def test_offsets_cover_every_allowed_position_evenly():
    counts = [0] * 6
    for i in range(6000):
        counts[uniform_offset(probe_seed(1, "x"), i, 6)] += 1
    assert all(850 < c < 1150 for c in counts), counts


def test_each_window_has_one_block_and_a_counted_plan_step_after_it():
    placement = ProbePlacement(seed=5, settle=1, counted=2)
    start = 1
    for index in range(200):
        window = placement.window(index, start, 9)
        assert 9 <= window.length <= 9 + 9 // 8
        rs = [window.role(i) for i in range(window.start, window.end)]
        assert rs.count(StepRole.PROBE) == 2 and rs.count(StepRole.PROBE_SETTLE) == 1
        last_probe = max(i for i, r in enumerate(rs) if r is StepRole.PROBE)
        assert rs[last_probe + 1] is StepRole.PLAN_SETTLE and StepRole.PLAN in rs[last_probe + 2:]
        start = window.end


@pytest.mark.parametrize("settle", [1, 2])
def test_every_counted_step_follows_settle_steps_at_its_own_clocks(settle):
    """Including windows that follow a guard move (their clocks change at their first step)."""
    timeline = ProbeTimeline(ProbePlacement(seed=3, settle=settle), 12)
    rs = [StepRole.PROBE] * settle  # the planning phase ran at default clocks
    moves = set()
    for i in range(600):
        rs.append(timeline.role(i))
        if i >= settle and timeline.closes_window(i):
            if timeline.window.index % 3 == 0:
                moves.add(i + 1)
            timeline.next(12, after_move=timeline.window.index % 3 == 0)
    for i in range(settle, len(rs)):
        step = i - settle
        if rs[i].counted:
            # a move changes the clocks at its step: no counted step within settle steps after it
            assert not any(step - m in range(settle) for m in moves), step
            assert all(r.default_clocks == rs[i].default_clocks for r in rs[i - settle:i]), (i, rs[i - 3:i + 1])


def test_a_window_after_a_move_does_not_count_its_first_steps():
    window = ProbePlacement(seed=9, settle=1).window(4, 100, 8, lead=1)
    assert window.role(100) is StepRole.PLAN_SETTLE and window.block_at >= 1
    assert window.counted_plan_steps == window.length - 1 - 2 - 1
    assert sum(window.role(i) is StepRole.PLAN for i in range(window.start, window.end)) == window.counted_plan_steps


def event_shares(kind_roles: list[StepRole], deploy_step: int, period: int) -> tuple[float, float]:
    """Share of counted probe steps and of counted plan steps on which a periodic host event falls."""
    probe = [i for i, r in enumerate(kind_roles) if r is StepRole.PROBE]
    plan = [i for i, r in enumerate(kind_roles) if r is StepRole.PLAN]

    def hit(steps: list[int]) -> float:
        return sum((deploy_step + i) % period == 0 for i in steps) / len(steps)
    return hit(probe), hit(plan)


@pytest.mark.parametrize("period", PERIODS)
@pytest.mark.parametrize("deploy_step", [36, 37])
def test_probes_pay_periodic_host_work_as_often_as_plan_steps(period, deploy_step):
    """Whatever the loop's period and the deploy step's parity, a probe lands on the periodic
    step about as often as a plan step does (so neither side is biased by it)."""
    steps = 40_000
    for length in (8, 50, 200):
        timeline = ProbeTimeline(ProbePlacement(seed=probe_seed(deploy_step, "plan")), length)
        probe, plan = event_shares(roles(timeline, steps, length), deploy_step, period)
        n_probe = steps // length
        sd = (plan * (1 - plan) / n_probe) ** 0.5
        assert abs(probe - plan) < 4 * sd + 1e-9, (length, probe, plan)


def test_the_fixed_phase_schedule_it_replaces_locks_onto_a_period():
    """What the placement fixes: the first design's probes (deployed step 6, then every 50) all fall on
    the same phase of a 50-step loop."""
    rs = [StepRole.PROBE if i >= 5 and (i - 5) % 50 == 1 else StepRole.PLAN for i in range(20_000)]
    for deploy_step in (36, 37):
        probe, plan = event_shares(rs, deploy_step, 50)
        assert probe in (0.0, 1.0) and 0.0 < plan < 0.1


def test_backoff_reaches_one_percent_and_no_further():
    backoff = Backoff()
    length, lengths = backoff.first, []
    for _ in range(12):
        length = backoff.grow(length)
        lengths.append(length)
    assert lengths == sorted(lengths) and lengths[-1] == backoff.longest
    assert ProbePlacement(seed=0).window(0, 0, backoff.longest).default_fraction <= 0.01


@pytest.mark.parametrize("kwargs, words", [
    ({"first": 0}, "first"), ({"first": 50, "longest": 20}, "longest"), ({"growth": 0.5}, "growth")])
def test_bad_backoff_is_one_config_line(kwargs, words):
    with pytest.raises(ConfigError, match=words) as err:
        Backoff(**kwargs)
    assert "\n" not in str(err.value)


def test_a_window_too_short_for_a_counted_plan_step_is_one_config_line():
    with pytest.raises(ConfigError, match="no counted plan step") as err:
        ProbePlacement(seed=0, settle=1).window(0, 0, 3)
    assert "\n" not in str(err.value)
