"""The runtime's events go on the stream the framework computes on (``ComputeStream``): the one
current at each instruction's begin hook, not whichever is current when a later hook runs; an
instruction that leaves work on the side stream current at its end ends when that work does.

Each of the first two failed with events recorded on the current stream: a framework's hook run
while its idle side stream is current (a communication stream, MoE overlap) ended the
instruction at once and sent a clock before the GPU got there."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from perseus.gpu.meter.energy import CounterUpdate
from perseus.gpu.sim import SimulatedGPU
from perseus.gpu.stream.compute_stream import ComputeStream, JoinedEvent
from perseus.gpu.stream.gpu_time import CudaTimeline, SimTimeline
from perseus.runtime.port.gpu_timeline import GPUTimeline

WORK_S = 0.03


class NoEnergy:
    def since(self, t_s: float) -> list[CounterUpdate]:
        return []

    def covers(self, t0: float, t1: float) -> bool:
        return True


@pytest.fixture
def gpu(sim_dir: Path):
    g = SimulatedGPU(0, preset="H200", state_dir=sim_dir, reset_state=True, stream_depth=6)
    yield g
    g.close()


def timeline(gpu: SimulatedGPU, sent: list[tuple[int, float]], instructions: int) -> GPUTimeline:
    return GPUTimeline(gpu.stream, SimTimeline(), NoEnergy(), lambda mhz, at: sent.append((mhz, time.monotonic())),
                       instructions=instructions)


def test_hooks_run_under_an_idle_side_stream_still_time_the_compute_streams_work(gpu: SimulatedGPU) -> None:
    stream, side = gpu.stream, gpu.stream.side()
    tl = timeline(gpu, [], 3)
    try:
        tl.step_begin()
        for i in range(3):
            tl.begin(("forward", i), True)
            stream.launch(WORK_S, tag=i)
            with stream.using(side):  # the framework's end hook runs inside its side stream's block
                tl.end(True)
        with stream.using(side):
            numbers = tl.step_end()
    finally:
        tl.close()
    assert numbers is not None
    kernels = stream.kernels()
    timed = [i for i in numbers.instructions if i.key != "__non_instruction__"]
    assert [i.key for i in timed] == [("forward", i) for i in range(3)]
    for inst, kernel in zip(timed, kernels):
        assert inst.end_s == pytest.approx(kernel.end_s, abs=1e-6)  # on the side stream: at its record, early
    assert numbers.span_s == pytest.approx(kernels[-1].end_s - kernels[0].start_s, abs=1e-3)
    assert tl.streams.joined == 4  # each end and the step's: the side stream was current there


def test_a_clock_handed_under_an_idle_side_stream_lands_when_the_compute_stream_gets_there(
        gpu: SimulatedGPU) -> None:
    stream, side = gpu.stream, gpu.stream.side()
    sent: list[tuple[int, float]] = []
    tl = timeline(gpu, sent, 1)
    try:
        stream.launch(WORK_S, tag="queued")  # the compute stream still has this to run
        with stream.using(side):
            tl.boundary(1200)
        stream.synchronize()
        assert tl.follower.drain()
    finally:
        tl.close()
    (queued,) = stream.kernels()
    assert [mhz for mhz, _ in sent] == [1200]
    assert sent[0][1] >= queued.end_s  # on the side stream it went out at once, before the queued work


def test_an_instruction_that_leaves_work_on_the_side_stream_ends_when_that_work_does(gpu: SimulatedGPU) -> None:
    stream, side = gpu.stream, gpu.stream.side()
    tl = timeline(gpu, [], 1)
    try:
        tl.step_begin()
        tl.begin("forward", True)
        stream.launch(WORK_S / 3, tag="compute")
        with stream.using(side):  # an overlapped part, still on its stream when the hook runs
            side.launch(WORK_S, tag="overlapped")
            tl.end(True)
        stream.launch(WORK_S / 3, tag="tail")  # the framework joins later; nothing of Perseus waits
        numbers = tl.step_end()
    finally:
        tl.close()
    assert numbers is not None
    (compute, tail), (overlapped,) = stream.kernels(), side.kernels()
    inst = numbers.instructions[0]
    assert inst.start_s <= compute.start_s + 1e-6
    assert inst.end_s == pytest.approx(overlapped.end_s, abs=1e-6) and inst.end_s > compute.end_s
    assert numbers.start_s + numbers.time_s >= overlapped.end_s - 1e-6  # the step settles after all its events
    assert tail.start_s == pytest.approx(compute.end_s, abs=1e-3)  # the main stream did not wait for the side


def test_an_instruction_begun_on_a_side_stream_is_timed_there(gpu: SimulatedGPU) -> None:
    """The current stream at the begin hook is where the framework computes the instruction."""
    stream, side = gpu.stream, gpu.stream.side()
    tl = timeline(gpu, [], 1)
    try:
        stream.launch(WORK_S, tag="other")  # the main stream is busy with something else
        tl.step_begin()
        with stream.using(side):
            tl.begin("forward", True)
            side.launch(WORK_S / 2, tag="forward")
            tl.end(True)
            numbers = tl.step_end()
    finally:
        tl.close()
    assert numbers is not None and tl.streams.joined == 0
    (kernel,) = side.kernels()
    assert numbers.span_s == pytest.approx(kernel.end_s - kernel.start_s, abs=1e-3)


class _TimedEvent:
    """A CUDA timing event stand-in at a fixed GPU time (ms)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def elapsed_time(self, later: _TimedEvent) -> float:
        return later.ms - self.ms


def test_a_joined_boundary_is_at_its_later_part_on_the_cuda_timeline() -> None:
    tl = CudaTimeline()
    begin = _TimedEvent(10.0)
    assert tl.seconds_between(begin, JoinedEvent((_TimedEvent(15.0), _TimedEvent(40.0)))) == pytest.approx(0.030)
    assert tl.seconds_between(JoinedEvent((_TimedEvent(12.0), begin)), _TimedEvent(30.0)) == pytest.approx(0.018)


class _Recorder:
    def __init__(self) -> None:
        self.current = "main"
        self.recycled: list[object] = []

    def current_stream(self) -> str:
        return self.current

    def record(self, stream: object = None) -> tuple[str, object]:
        return ("event", stream)

    def recycle(self, event: object) -> None:
        self.recycled.append(event)

    def bind_thread(self) -> None:
        pass


def test_a_joined_event_goes_back_to_the_pool_part_by_part() -> None:
    base = _Recorder()
    streams = ComputeStream(base)
    base.current = "side"
    streams.ends_here()
    joined = streams.record()
    assert isinstance(joined, JoinedEvent) and joined.parts == (("event", "main"), ("event", "side"))
    assert streams.record() == ("event", "main")  # only the event recorded at that hook joins
    streams.recycle(joined)
    assert base.recycled == [("event", "main"), ("event", "side")]


def test_the_cuda_recorder_reads_the_current_stream_without_building_one_each_hook(monkeypatch) -> None:
    """``torch.cuda.current_stream`` builds a Stream per call (3.1 µs on the H200); the recorder reads
    the raw (id, device, type) (0.3 µs) and builds each stream's Stream once, recording on it."""
    import sys
    import types

    from perseus.gpu.stream.follow import CudaEventRecorder

    current = [(0, 2, 1)]
    built: list[tuple[int, int, int]] = []
    recorded_on: list[object] = []

    class Stream:
        def __init__(self, stream_id: int, device_index: int, device_type: int) -> None:
            built.append((stream_id, device_index, device_type))

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self, stream: object = None) -> None:
            recorded_on.append(stream)

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(is_available=lambda: True, current_device=lambda: 2, Stream=Stream, Event=Event)
    torch._C = types.SimpleNamespace(_cuda_getCurrentStream=lambda device: current[0])
    monkeypatch.setitem(sys.modules, "torch", torch)
    recorder = CudaEventRecorder()
    streams = ComputeStream(recorder)
    main = streams.stream
    assert recorder.current_stream() is main and built == [(0, 2, 1)]
    current[0] = (7, 2, 1)  # the framework made its side stream current
    streams.ends_here()
    joined = streams.record()
    assert isinstance(joined, JoinedEvent) and recorded_on[0] is main and recorded_on[1] is recorder.current_stream()
    assert built == [(0, 2, 1), (7, 2, 1)]  # one Stream per stream, however many hooks
