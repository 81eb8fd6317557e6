"""The hooks record one event per boundary, shared by the clock request and the step timer, and
none where nothing hangs on it: an event is the hooks' largest cost on a real card (~5 µs recycled,
the H200 measured 34 µs of hook time per instruction against a 20 µs budget).

The simulated stream charges each record to the recording thread (``SimStream.event_cost_s``);
with every record charged the same, the training thread's charge counts its events. Before: a
step's begin had an event of its own beside its first instruction's, and every deployed
instruction recorded one, also where its clock and the next one's did not change (9 events for
the plan step below, 5 now)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus.gpu.meter.energy import CounterUpdate
from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.stream.gpu_time import SimTimeline
from perseus.runtime.port.gpu_timeline import GPUTimeline

A, B = 1410, 1200
PLAN = (A, A, B, B, B, A)  # the clock changes after the 2nd and the 5th instruction only
WORK_S = 0.004
EVENT_S = 5e-6  # every record charged alike (the H200's recycled event)


class NoEnergy:
    def since(self, t_s: float) -> list[CounterUpdate]:
        return []

    def covers(self, t0: float, t1: float) -> bool:
        return True


@pytest.fixture
def gpu(tmp_path: Path) -> Iterator[SimulatedGPU]:
    g = SimulatedGPU(0, preset="H200", state_dir=tmp_path / "sim", reset_state=True, stream_depth=6)
    g.stream.event_new_s = g.stream.event_record_s = EVENT_S
    yield g
    g.close()


def test_one_event_per_boundary_and_none_where_the_clock_does_not_change(gpu: SimulatedGPU) -> None:
    stream = gpu.stream
    me = threading.get_ident()
    sent: list[int] = []
    gt = GPUTimeline(stream, SimTimeline(), NoEnergy(), lambda mhz, at: sent.append(mhz), instructions=len(PLAN))
    events: list[int] = []
    spans: list[tuple[float, float]] = []
    try:
        for s, kind in enumerate(("plan", "plan", "reset", "default", "profiling")):
            if kind == "reset":  # the host sets the clock itself (``GPUPort.apply``): the stream's requests start afresh
                with gt.lock:
                    gt.invalidate()
                kind = "plan"
            before = stream.event_cost_s[me]
            gt.step_begin()
            for i, mhz in enumerate(PLAN):
                if kind == "plan":
                    gt.clock(mhz, WORK_S, PLAN[(i + 1) % len(PLAN)])
                gt.begin(("inst", i), kind == "profiling")
                stream.launch(WORK_S, tag=(s, i))
                gt.end(kind == "profiling")
            if kind == "plan":
                gt.ahead(PLAN[0])  # handed with the last instruction already: nothing more
            numbers = gt.step_end()
            events.append(round((stream.event_cost_s[me] - before) / EVENT_S))
            assert numbers is not None
            spans.append((numbers.start_s, numbers.span_s))
        stream.synchronize()
    finally:
        gt.close()
    # plan: the first instruction's begin (the step's begin too, and the timer's), the two
    # instructions a switch hangs on, the last instruction's end, the step's end; default clocks:
    # first begin, last end, step end; profiling: each begin and end and the step's end
    assert events == [5, 5, 5, 3, 13]
    # no request where the clock does not change; the host's own clock change is followed by the
    # plan's first clock again (the stream's requests after it are new)
    assert sent == [A, B, A, B, A, A, B, A]
    kernels = stream.kernels()
    for s, (start, span) in enumerate(spans):
        mine = [k for k in kernels if k.tag[0] == s]  # type: ignore[index]  # the test's (step, i) tags
        # the step's anchor is its first instruction's begin event: its kernel starts once launched, just after
        assert 0 <= mine[0].start_s - start <= 0.005
        assert span == pytest.approx(mine[-1].end_s - start, abs=1e-6)
