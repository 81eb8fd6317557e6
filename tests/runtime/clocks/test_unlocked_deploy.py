"""Deploying plans with unlocked instructions and per-kind sustained clocks: an unlocked instruction
runs at default clocks (asked once while consecutive), and no locked clock above the one the card
sustained under the instruction's kind in warm-up is ever asked for."""

from __future__ import annotations

import numpy as np

from perseus.frontier import Frontier, FrontierPoint
from perseus.gpu.meter.clock_samples import KindLoad, SustainedClock
from perseus.planner.stage_plan import stage_plan_of
from perseus.profile.unlocked import UNLOCKED_MHZ
from perseus.runtime.clocks.deploy import Deployment, SwitchTiming, capped
from perseus.schedules import build_schedule

DEFAULT = "default clocks"


def sustained(forward: int | None = 1980, backward: int | None = 1530) -> SustainedClock:
    """Warm-up's clocks on a simulated H200: a memory-bound forward at 1,980, a dense backward at 1,530."""
    def load(mhz: int | None) -> KindLoad:
        return KindLoad(SustainedClock(mhz, frozenset(), 5, 5), (0.01,))

    return SustainedClock(1530, frozenset(), 10, 10, {(0, "forward"): load(forward), (0, "backward"): load(backward)})


class Port:
    """The port's clock calls a deployment makes on the host (no GPU timeline), recorded."""

    timeline = None

    def __init__(self, clocks: SustainedClock) -> None:
        self.current_mhz = self.default_mhz = 1980
        self.sustained = clocks
        self.asked: list[int | str] = []

    def request(self, mhz: int) -> None:
        if mhz != self.current_mhz:
            self.request_now(mhz)

    def request_now(self, mhz: int) -> None:
        self.current_mhz = mhz
        self.asked.append(mhz)

    def request_at(self, mhz: int, at: float) -> None:
        self.request_now(mhz)

    def release(self) -> None:
        self.current_mhz = self.default_mhz
        self.asked.append(DEFAULT)


def deployed(forward: int, backward: int, clocks: SustainedClock, steps: int = 2) -> list[int | str]:
    """What a one-stage 1F1B plan of these clocks per kind asked the port for over ``steps`` steps."""
    schedule = build_schedule("1f1b", 1, 4)
    plan = np.array([forward if i.kind == "forward" else backward for i in schedule.stages[0]])
    frontier = Frontier(schedule, 110.0, 1.0, 10.0, [FrontierPoint(1.0, 10.0, plan)])
    stage = stage_plan_of(frontier, 0)
    port = Port(clocks)
    timing = SwitchTiming(0.0, False, False, False)
    deployment = Deployment(0, timing, 0, port)  # type: ignore[arg-type]  # a port that records the calls
    deployment.follow(stage, stage.fastest)
    for _ in range(steps):
        deployment.follower.start_step()
        for inst in schedule.stages[0]:
            assert deployment.begin_instruction(inst.kind, inst.microbatch, inst.chunk) is not None
        deployment.step_ending()
    return port.asked


def test_no_locked_clock_above_a_kinds_sustained_one_is_asked_for():
    asked = deployed(1980, 1980, sustained())
    # the dense backward planned at 1,980 is asked for at its own 1,530; default clocks between steps
    assert asked == ([1980, 1530] * 4 + [DEFAULT]) * 2
    assert capped([(i, 1980) for i in build_schedule("1f1b", 1, 2).stages[0]], sustained()) == [
        (i, 1980 if i.kind == "forward" else 1530) for i in build_schedule("1f1b", 1, 2).stages[0]]


def test_a_kind_without_its_own_clock_and_unlocked_instructions_keep_their_plan():
    insts = build_schedule("1f1b", 1, 2).stages[0]
    plan = [(i, UNLOCKED_MHZ if i.kind == "forward" else 1830) for i in insts]
    assert capped(plan, sustained(backward=None)) == plan
    assert capped(plan, None) == plan


def test_unlocked_instructions_run_at_default_clocks_asked_once_while_consecutive():
    asked = deployed(UNLOCKED_MHZ, UNLOCKED_MHZ, sustained())
    assert asked == [DEFAULT], "a plan all unlocked releases the card once and locks nothing"
    mixed = deployed(UNLOCKED_MHZ, 1380, sustained())
    assert mixed == [DEFAULT, 1380] * 8 + [DEFAULT], "never a lock at 0 MHz; no release twice in a row"
