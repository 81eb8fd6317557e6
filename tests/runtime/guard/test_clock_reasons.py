"""The clock-event reasons during probes (``guard/clock_reasons.py``): read from a source that
answers from samples taken off the training thread, tallied per kind of counted step, carried by
the guard's events and the summary. No device is read here: the source is a stand-in."""

from __future__ import annotations

import numpy as np

from perseus.frontier import Frontier, FrontierPoint
from perseus.gpu.device import ClockEventReason
from perseus.planner.stage_plan import decode_stage, encode_stage
from perseus.runtime.clocks.targeting import Targeting
from perseus.runtime.config import PerseusConfig
from perseus.runtime.guard.clock_reasons import ClockReasonSource
from perseus.runtime.guard.closed_loop import ClosedLoop
from perseus.runtime.guard.placement import StepRole
from perseus.runtime.plane.collective import Collective
from perseus.schedules import build_schedule

CAP = ClockEventReason.SW_POWER_CAP
THERMAL = ClockEventReason.HW_THERMAL


class PollerSamples:
    """Answers as ``GPUPort.clock_reasons_since`` would: probes ran power-capped, plan steps did
    not, every other sampled plan step thermally slowed. Counts its calls (they are per counted step)."""

    def __init__(self) -> None:
        self.loop: ClosedLoop | None = None
        self.calls = 0

    def clock_reasons_since(self, t_s: float) -> frozenset[ClockEventReason]:
        assert self.loop is not None
        self.calls += 1
        if self.loop.role is StepRole.PROBE:
            return frozenset({CAP})
        return frozenset({THERMAL}) if self.calls % 4 == 0 else frozenset()


def test_probe_and_plan_steps_reasons_reach_the_event_and_the_summary():
    schedule = build_schedule("1f1b", 1, 2)
    frontier = Frontier(schedule, 80.0, 1.0, 10.0, [FrontierPoint(0.9, 9.0, np.full(4, 1410)),
                                                    FrontierPoint(1.0, 5.0, np.full(4, 600))])
    plan = decode_stage(encode_stage(frontier, 0), schedule, 0)
    targeting = Targeting()
    targeting.deploy(plan)
    source = PollerSamples()
    assert isinstance(source, ClockReasonSource)
    loop = ClosedLoop(PerseusConfig(probe_every_steps=8), Collective(), reasons=source)
    source.loop = loop
    decisions, probes = [], 0
    for step in range(5, 400):
        probes += loop.begin_step(step) is StepRole.PROBE
        if (d := loop.end_step(1.0, 2.0, targeting, plan)) is not None:
            decisions.append(loop.event(d))
    # read for each counted probe and the first counted plan step after it: twice a window
    assert probes == len(loop.probes.time_s) and source.calls in (2 * probes, 2 * probes - 1)
    reasons = loop.summary()["clock_reasons"]
    assert isinstance(reasons, dict)
    assert reasons["probe_steps"] == probes and reasons["probe"] == {"sw_power_cap": 1.0}
    assert reasons["plan_steps"] == source.calls - probes and set(reasons["plan"]) == {"hw_thermal_slowdown"}
    assert 0.0 < reasons["plan"]["hw_thermal_slowdown"] <= 0.5
    assert decisions and all(e["clock_reasons"]["pipeline"] == 0 for e in decisions)


def test_without_a_source_nothing_is_read_or_reported():
    loop = ClosedLoop(PerseusConfig(probe_every_steps=8), Collective())
    assert "clock_reasons" not in loop.summary()
