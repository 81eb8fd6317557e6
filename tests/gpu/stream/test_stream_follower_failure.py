"""A CUDA error from a followed event (the simulated GPU's ``event_error_at`` fault: ``query`` and
``synchronize`` raise, as with a graph captured in the global capture mode while the follower
polls): the follower keeps the error and drops what it cannot observe, its thread lives on, and the
step fence neither raises nor waits; a fence waits about a step, not a fixed 5 s.

Each failed with the follower that let the event's exception end its thread and the fence that
synchronized the step's end event on the training thread."""

from __future__ import annotations

import sys
import threading
import time
import types
from pathlib import Path

import pytest

from perseus.gpu.sim import SimulatedGPU
from perseus.gpu.sim.faults import SimFaults
from perseus.gpu.sim.stream import EVENT_FAULT
from perseus.gpu.stream.follow import CudaEventRecorder, FollowMechanism, StreamFollower
from perseus.gpu.stream.gpu_time import GPUStepTimer, SimTimeline
from perseus.runtime.port.gpu_timeline import GPUTimeline

WORK_S = 0.004
LONG_S = 1.6  # a step's GPU work, far longer than the steps before it


def faulty_gpu(sim_dir: Path, at: int, count: int = 1) -> SimulatedGPU:
    return SimulatedGPU(0, preset="H200", state_dir=sim_dir, reset_state=True, stream_depth=6,
                        faults=SimFaults(event_error_at=at, event_error_count=count))


@pytest.mark.parametrize("mechanism", list(FollowMechanism))
def test_an_event_that_raises_fails_the_follower_and_nothing_after_it_runs(sim_dir: Path, mechanism) -> None:
    gpu = faulty_gpu(sim_dir, at=2)
    stream = gpu.stream
    ran: list[int] = []
    follower = StreamFollower(mechanism)
    try:
        for i in range(4):  # the second event raises; the GPU still reaches every one
            stream.launch(WORK_S, tag=i)
            follower.follow(stream.record(), lambda seen, i=i: ran.append(i))
        stream.synchronize()
        deadline = time.monotonic() + 5.0
        while not follower.failed and time.monotonic() < deadline:
            time.sleep(0.001)
        assert isinstance(follower.error, RuntimeError) and str(follower.error) == EVENT_FAULT
        assert follower._thread.is_alive()  # it says so through ``error``; it does not die
        assert not follower.drain(0.05) and follower.pending() == 0  # the rest was dropped, never run late
        follower.follow(stream.record(), lambda seen: ran.append(99))  # handed after the failure: dropped
        time.sleep(0.02)
        assert ran == [0] and follower.pending() == 0 and follower.followed == 1
    finally:
        t = time.monotonic()
        follower.close()
        assert time.monotonic() - t < 1.0
        gpu.close()


def test_an_action_that_raises_fails_the_follower_too(sim_dir: Path) -> None:
    gpu = SimulatedGPU(0, preset="H200", state_dir=sim_dir, reset_state=True, stream_depth=6)
    follower = StreamFollower()
    ran: list[int] = []
    try:
        follower.follow(gpu.stream.record(), lambda seen: 1 / 0)
        follower.follow(gpu.stream.record(), lambda seen: ran.append(1))
        assert not follower.drain(2.0)
        assert isinstance(follower.error, ZeroDivisionError) and ran == []
    finally:
        follower.close()
        gpu.close()


@pytest.mark.parametrize("failing", ["begin", "end"])
def test_the_fence_neither_raises_nor_waits_once_the_follower_failed(sim_dir: Path, failing: str) -> None:
    """The step's begin event (its anchor: the old fence waited 5 s for it) or its end event (the
    old fence's ``synchronize`` raised on the training thread) raises."""
    gpu = faulty_gpu(sim_dir, at=1 if failing == "begin" else 4)  # events: begin, inst begin, inst end, end
    stream = gpu.stream
    follower = StreamFollower()
    timer = GPUStepTimer(stream, follower, SimTimeline())
    try:
        timer.step_begin()
        timer.begin("forward")
        stream.launch(WORK_S)
        timer.end()
        timer.step_end()
        t = time.monotonic()
        assert timer.fence() == []
        assert time.monotonic() - t < 1.0
        assert follower.failed and timer.waiting() == 1  # unsettled, and no later fence waits for it
        t = time.monotonic()
        timer.step_begin()
        timer.step_end()
        assert timer.fence() == [] and time.monotonic() - t < 0.05
    finally:
        follower.close()
        gpu.close()


def test_a_fence_waits_about_a_step_not_for_a_step_far_longer_than_the_last_ones(sim_dir: Path) -> None:
    """A healthy follower, a step hundreds of times the last ones: the fence gives up after about two
    of them (the old one waited for the step's end); the step settles later, at a later read."""
    gpu = SimulatedGPU(0, preset="H200", state_dir=sim_dir, reset_state=True, stream_depth=6)
    stream = gpu.stream
    follower = StreamFollower()
    timer = GPUStepTimer(stream, follower, SimTimeline())

    def step(work_s: float) -> list:
        timer.step_begin()
        timer.begin("forward")
        stream.launch(work_s)
        timer.end()
        timer.step_end()
        return timer.fence()

    try:
        for _ in range(3):
            assert len(step(WORK_S)) == 1
        assert timer.fence_bound_s() < 0.5  # FENCE_FACTOR x steps of a few ms (more on a busy host) + floor
        t = time.monotonic()
        assert step(LONG_S) == []
        waited = time.monotonic() - t
        assert waited < 1.0, waited
        stream.synchronize()
        assert follower.drain()
        (late,) = timer.settled()
        assert late.index == 3 and late.end_s - late.begin_s >= LONG_S
    finally:
        follower.close()
        gpu.close()


class _FakeCudaEvent:
    """A ``torch.cuda.Event`` stand-in; ``calls`` notes each query with its thread."""

    calls: list[tuple[object, int]] | None = None

    def __init__(self, enable_timing: bool = False) -> None:
        pass

    def record(self, stream: object = None) -> None:
        pass

    def query(self) -> bool:
        if self.calls is not None:
            self.calls.append(("query", threading.get_ident()))
        return True

    def synchronize(self) -> None:
        pass


def fake_torch(device: int, calls: list[tuple[object, int]], fail: bool = False) -> types.ModuleType:
    def set_device(index: int) -> None:
        calls.append((index, threading.get_ident()))
        if fail:
            raise RuntimeError("CUDA error: invalid device ordinal")

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(is_available=lambda: True, Event=_FakeCudaEvent,
                                       current_device=lambda: device, set_device=set_device,
                                       current_stream=lambda device=None: "default")
    return torch


def test_the_follower_thread_makes_the_events_device_its_own_before_its_first_query(monkeypatch) -> None:
    """On a real GPU the follower's first CUDA call would create a context on GPU 0 otherwise."""
    calls: list[tuple[object, int]] = []
    monkeypatch.setitem(sys.modules, "torch", fake_torch(3, calls))
    monkeypatch.setattr(_FakeCudaEvent, "calls", calls)

    class NoEnergy:
        def since(self, t_s: float) -> list:
            return []

    timeline = GPUTimeline(CudaEventRecorder(enable_timing=True), SimTimeline(), NoEnergy(), lambda mhz, at: None)
    try:
        ran = threading.Event()
        timeline.follower.follow(_FakeCudaEvent(), lambda seen: ran.set())
        assert ran.wait(2.0)
    finally:
        timeline.close()
    follower_thread = calls[0][1]
    assert calls[0][0] == 3 and follower_thread != threading.get_ident()  # on the follower's thread, first
    assert [what for what, _ in calls] == [3, "query"] and calls[1][1] == follower_thread


def test_a_device_that_cannot_be_bound_fails_the_follower(monkeypatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setitem(sys.modules, "torch", fake_torch(1, calls, fail=True))
    follower = StreamFollower(on_start=CudaEventRecorder().bind_thread)
    try:
        follower.follow(_FakeCudaEvent(), lambda seen: None)
        assert not follower.drain(0.5)
        assert follower.failed and "invalid device ordinal" in str(follower.error)
    finally:
        follower.close()
