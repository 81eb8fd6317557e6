"""A training loop's own period in plan-step times (``guard/periodicity.py``): found at the right
period for host work every 2..8 steps, never on noise alone, said once, and told apart from the
judged instruction span. Times are synthetic (seeded), no wall clock."""

from __future__ import annotations

import logging
import random

import pytest

from perseus.runtime.config import PerseusConfig
from perseus.runtime.guard.closed_loop import ClosedLoop
from perseus.runtime.guard.periodicity import PeriodWatch, chi2_critical, find_period, kruskal_h
from perseus.runtime.plane.collective import Collective

STEP_S = 0.1
NOISE = 0.05  # lognormal sigma of a step's time, as on the loaded CPU the unpadded workload runs on


def steps(period: int, effect: float, n: int, seed: int, *, in_span: bool = False):
    """(index, step time, instruction span) of ``n`` plan steps; host work of ``effect`` × the step
    every ``period`` steps (0: none), in the span too when ``in_span``."""
    rng = random.Random(seed)
    for i in range(n):
        extra = STEP_S * effect if period and i % period == 1 else 0.0
        span = STEP_S * rng.lognormvariate(0.0, NOISE)
        yield i, span + extra, span + (extra if in_span else 0.0)


def first_found(period: int, effect: float, n: int, seed: int, longest: int = 8, **kw):
    watch = PeriodWatch(longest)
    for i, t, s in steps(period, effect, n, seed, **kw):
        watch.add(i, t, s)
        if i % 8 == 7 and (found := watch.check()) is not None:
            return found
    return None


@pytest.mark.parametrize("period", [2, 3, 4, 5, 8])
def test_host_work_every_few_steps_is_found_at_its_own_period(period):
    for seed in range(5):
        found = first_found(period, 0.1, 400, seed)
        assert found is not None and found.steps == period and found.phase == 1
        assert 0.05 < found.excess < 0.2  # the +10 % phase, against the others
        assert abs(found.judged_excess) < 0.05  # host work: not in the judged span
        assert "not in the judged instruction span" in found.describe()


def test_work_inside_the_instructions_is_said_to_be_judged():
    found = first_found(4, 0.3, 400, 0, in_span=True)
    assert found is not None and found.steps == 4 and found.judged_excess > 0.2
    assert "the judged instruction span +" in found.describe()


def test_noise_alone_is_never_a_period():
    assert all(first_found(0, 0.0, 1000, seed) is None for seed in range(20))


def test_a_period_longer_than_the_probe_window_is_not_looked_for():
    assert first_found(11, 0.3, 600, 0, longest=8) is None  # 11: no divisor among the candidates
    found = first_found(11, 0.3, 600, 0, longest=12)
    assert found is not None and found.steps == 11


def test_kruskal_h_and_its_critical_value():
    assert kruskal_h([[1.0, 2.0], [3.0, 4.0]]) == pytest.approx(12 / 20 * (9 / 2 + 49 / 2) - 15)
    assert chi2_critical(1, 0.05) == pytest.approx(3.841, rel=0.02)
    assert chi2_critical(7, 1e-4) == pytest.approx(29.88, rel=0.02)
    assert find_period([0, 1], [1.0, 1.0], [1.0, 1.0], 8) is None  # too few steps for any period


def test_the_closed_loop_says_the_period_once_in_the_log_and_as_an_event(caplog):
    """Deployed steps through ``ClosedLoop.end_step`` with a slow data-loader step every 4: one
    ``loop_period`` note (period 4), one log line, and the summary keeps it; probe steps are not
    fed to it (they run other clocks)."""
    import numpy as np

    from perseus.frontier import Frontier, FrontierPoint
    from perseus.planner.stage_plan import decode_stage, encode_stage
    from perseus.runtime.clocks.targeting import Targeting
    from perseus.schedules import build_schedule

    schedule = build_schedule("1f1b", 1, 2)
    frontier = Frontier(schedule, 80.0, 1.0, 10.0, [FrontierPoint(0.9, 9.0, np.full(4, 1410)),
                                                    FrontierPoint(1.0, 5.0, np.full(4, 600))])
    plan = decode_stage(encode_stage(frontier, 0), schedule, 0)
    targeting = Targeting()
    targeting.deploy(plan)
    loop = ClosedLoop(PerseusConfig(probe_every_steps=8), Collective())
    rng = random.Random(3)
    notes = []
    with caplog.at_level(logging.INFO, logger="perseus"):
        for step in range(10, 600):
            loop.begin_step(step)
            span = STEP_S * rng.lognormvariate(0.0, NOISE)
            energy = 2.0 if loop.probing else 1.6  # an honest plan: it saves energy (the energy guard keeps it)
            loop.end_step(span, energy, targeting, plan, span + (0.3 * STEP_S if step % 4 == 2 else 0.0))
            notes += loop.notes(speak=True)
    assert [what for what, _ in notes] == ["loop_period"]
    assert notes[0][1]["period_steps"] == 4
    assert caplog.text.count("plan-step times repeat every 4 steps") == 1
    summary = loop.summary()["loop_period"]
    assert isinstance(summary, dict) and summary["period_steps"] == 4
