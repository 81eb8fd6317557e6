"""The clock of the GPU's work between steps, on the stream (``StreamClocks``): default clocks
(``RESET_MHZ``, 0) hung on the step's last instruction lead as the switch up they are, and the
next step's first clock then goes out at its own instruction, not hung on the work before it."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from perseus.gpu.stream.clocks import StreamClocks

RESET = 0


class Recorder:
    def __init__(self) -> None:
        self.events = 0

    def record(self) -> int:
        self.events += 1
        return self.events


class Follower:
    """What ``StreamClocks`` hands the stream follower: (event, after_s) per request, run at once."""

    def __init__(self) -> None:
        self.handed: list[tuple[Any, float]] = []

    def follow(self, event: Any, action: Callable[[float], None], after_s: float = 0.0) -> None:
        self.handed.append((event, after_s))
        action(0.0)


def clocks(lead_s: float = 0.001, fraction: float = 0.3) -> tuple[StreamClocks, Follower, list[int]]:
    follower, sent = Follower(), []
    return (StreamClocks(Recorder(), follower, lambda mhz, at: sent.append(mhz), lead_s=lead_s,
                         lead_fraction=fraction), follower, sent)


def test_default_clocks_after_the_last_instruction_lead_as_a_switch_up() -> None:
    """Default clocks are the highest: landing early only speeds up the end of the last instruction,
    so the request leads by the share of it too (as a switch down it would lead by ``lead_s`` only
    and the work between steps would start at the plan's clock)."""
    c, follower, sent = clocks()
    c.instruction(1200, 0.1, RESET, keep=True)  # the step's last instruction; then the work between steps
    assert sent == [1200, RESET]
    assert follower.handed[-1][1] == pytest.approx(0.1 - 0.001 - 0.3 * 0.1)


def test_after_the_work_between_steps_the_first_clock_goes_out_at_its_own_instruction() -> None:
    """``ahead`` (the step's end) drops the chain: the next step's first instruction hangs its clock
    on its own begin event, none on the previous step's last (that lands before the work between
    steps, which would run at it); and from default clocks down to it is a switch down."""
    c, follower, sent = clocks()
    c.instruction(1200, 0.1, RESET, keep=True)
    c.ahead(RESET)  # asked for already on the last instruction: nothing new
    assert sent == [1200, RESET]
    event = c.instruction(1410, 0.1, 1300, keep=True)
    assert sent == [1200, RESET, 1410, 1300]
    assert follower.handed[-2] == (event, 0.0)  # its own boundary, at once
    assert follower.handed[-1][1] == pytest.approx(0.1 - 0.001)  # 1410 -> 1300: down, lead_s only
