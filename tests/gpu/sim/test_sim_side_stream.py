"""The simulated GPU's side streams: kernels beside the main stream's, and events that go on the
calling thread's current stream unless one is named, as ``torch.cuda.Event.record()`` does; so a
recorder that records on "whatever is current" shows here what it does on a real GPU."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from perseus.gpu.errors import GPUInvalidArgumentError
from perseus.gpu.sim import SimulatedGPU

WORK_S = 0.04


@pytest.fixture
def gpu(sim_dir: Path):
    g = SimulatedGPU(0, preset="H200", state_dir=sim_dir, reset_state=True, stream_depth=4)
    yield g
    g.close()


def test_a_side_streams_kernels_run_beside_the_main_streams(gpu: SimulatedGPU) -> None:
    main, side = gpu.stream, gpu.stream.side()
    main.launch(WORK_S, tag="compute")
    side.launch(WORK_S, tag="comm")
    main.synchronize()
    side.synchronize()
    (compute,), (comm,) = main.kernels(), side.kernels()
    assert comm.start_s < compute.end_s and compute.start_s < comm.end_s  # overlapped, not one after the other
    assert comm.end_s - comm.start_s == pytest.approx(WORK_S, abs=1e-6)  # its max-clock time, whatever the clock


def test_an_event_goes_on_the_current_stream_unless_one_is_named(gpu: SimulatedGPU) -> None:
    main, side = gpu.stream, gpu.stream.side()
    main.launch(WORK_S, tag="compute")
    with main.using(side) as current:
        assert current is side and main.current_stream() is side
        on_current = main.record()  # the idle side stream is there already
        on_main = main.record(main)
        elsewhere: list[object] = []
        other = threading.Thread(target=lambda: elsewhere.append(main.current_stream()))
        other.start()
        other.join()
    assert main.current_stream() is main and elsewhere == [main]  # per thread, and only inside the block
    assert on_current.query() and not on_main.query()
    on_main.synchronize()
    assert on_main.gpu_time_s == pytest.approx(main.kernels()[-1].end_s)


def test_a_stream_of_another_gpu_cannot_be_made_current(gpu: SimulatedGPU, sim_dir: Path) -> None:
    other = SimulatedGPU(1, preset="H200", state_dir=sim_dir, reset_state=True, stream_depth=2)
    try:
        with pytest.raises(GPUInvalidArgumentError, match="another simulated GPU"):
            with gpu.stream.using(other.stream):
                pass
    finally:
        other.close()


def test_side_streams_close_with_the_gpu(sim_dir: Path) -> None:
    g = SimulatedGPU(0, preset="H200", state_dir=sim_dir, reset_state=True, stream_depth=2)
    side = g.stream.side()
    side.launch(0.01)
    g.close()
    assert not side._thread.is_alive() and len(side.kernels()) == 1
