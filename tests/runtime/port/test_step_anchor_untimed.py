"""A step's anchor is where the GPU began it with every clock path, also where the controller
takes no timed requests (clockd, zeusd): the follower sees each event when the GPU gets there,
not after an earlier switch-ahead request waited for its due time.

On a real GPU a step's host time is when the follower saw its begin event (``CudaTimeline``);
``SeenTimeline`` anchors the simulated stream's steps the same way. Before the fix, an untimed
request hung ahead on the first instruction's event (due about that instruction's time later) held
the anchor behind it: plan steps were anchored late by ~18 ms here, default-clock steps (nothing
hung ahead) were not, and the guard's A/B between them was biased."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from perseus.gpu.meter.energy import CounterUpdate
from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.stream.follow import BoundaryEvent
from perseus.runtime.port.gpu_timeline import GPUTimeline

WORK_S = 0.02  # each instruction's kernel; the first one's switch-ahead request waits ~18 ms
TAIL_S = 0.01
CLOCKS = (1410, 1200, 1305, 1050)  # every instruction's clock differs from the one before


class SeenTimeline:
    """``CudaTimeline``'s anchor on the simulated stream (the follower's sighting of the step's
    begin event), offsets from the events' GPU timestamps; keeps each anchor's (GPU time, seen)."""

    def __init__(self) -> None:
        self.anchors: list[tuple[float, float]] = []

    def anchor_time(self, anchor: Any, seen_s: float) -> float:
        self.anchors.append((float(anchor.gpu_time_s), seen_s))
        return seen_s

    def seconds_between(self, earlier: Any, later: Any) -> float:
        return float(later.gpu_time_s - earlier.gpu_time_s)


class NoEnergy:
    def since(self, t_s: float) -> list[CounterUpdate]:
        return []

    def covers(self, t0: float, t1: float) -> bool:
        return True


def watch(timeline: GPUTimeline) -> list[tuple[float, float, float]]:
    """Each followed action's (its event's GPU time, when the follower saw it, when it was done)."""
    rows: list[tuple[float, float, float]] = []
    follower = timeline.follower
    follow = follower.follow

    def watched(event: BoundaryEvent, action: Callable[[float], None], after_s: float = 0.0) -> None:
        def act(seen: float) -> None:
            action(seen)
            rows.append((float(event.gpu_time_s), seen, time.monotonic()))  # type: ignore[attr-defined]  # a SimEvent: the GPU time it was reached

        follow(event, act, after_s)

    follower.follow = watched  # type: ignore[method-assign]  # the clocks and the timer call it through the follower
    return rows


def scheduling_delay_s(rows: list[tuple[float, float, float]]) -> float:
    """The follower's worst delay from when it could have seen an event (the GPU there and the
    follower done with the action before) to when it did."""
    return max(seen - max(gpu, before) for (gpu, seen, _), (_, _, before) in zip(rows[1:], rows))


@pytest.fixture
def gpu(tmp_path: Path) -> Iterator[SimulatedGPU]:
    g = SimulatedGPU(0, preset="H200", state_dir=tmp_path / "sim", reset_state=True, stream_depth=6)
    yield g
    g.close()


def test_a_steps_anchor_is_where_the_gpu_began_it_with_an_untimed_controller(gpu: SimulatedGPU) -> None:
    sent: list[tuple[int, float | None]] = []
    stream = gpu.stream
    timeline = SeenTimeline()
    gt = GPUTimeline(stream, timeline, NoEnergy(), lambda mhz, at: sent.append((mhz, at)),
                     instructions=len(CLOCKS), timed=False)
    rows = watch(gt)
    kinds: list[str] = []
    starts: list[float] = []
    try:
        for s, kind in enumerate(("plan", "plan", "default", "plan", "default", "plan", "default")):
            with gt.lock:  # the host sets the step's first clock (``GPUPort.apply``/``reset``): nothing stale left
                gt.invalidate()
            gt.step_begin()
            for i, mhz in enumerate(CLOCKS):
                if kind == "plan":
                    gt.clock(mhz, WORK_S, CLOCKS[(i + 1) % len(CLOCKS)])
                gt.begin(("inst", i), False)
                stream.launch(WORK_S, tag=(s, i))
                gt.end(False)
            if kind == "plan":
                gt.ahead(CLOCKS[0])
            stream.launch(TAIL_S, activity=0.5, tag=(s, "tail"))
            numbers = gt.step_end()
            assert numbers is not None and numbers.gpu_time
            kinds.append(kind)
            starts.append(numbers.start_s)
        stream.synchronize()
    finally:
        gt.close()
    first = {k.tag[0]: k.start_s for k in stream.kernels() if k.tag[1] == 0}  # type: ignore[index]  # kernels are tagged (step, i)
    assert sent and all(at is None for _, at in sent)  # untimed: the follower waited for each due time
    assert len(timeline.anchors) == len(kinds)
    # the follower's own delay, judged on this run: an anchor is late by that at most (a little
    # more for the scan that sees it, never a wait for an earlier request)
    tol = max(2 * scheduling_delay_s(rows), 0.001)
    assert tol < (WORK_S - 0.002) / 2, f"the follower is too late here to judge the anchor ({tol * 1e3:.2f} ms)"
    late = [seen - gpu_s for gpu_s, seen in timeline.anchors]
    off = [start - first[s] for s, start in enumerate(starts)]
    for kind, lag, o in zip(kinds, late, off):
        assert -1e-6 <= lag <= tol, (kind, late, tol)
        assert abs(o) <= tol, (kind, off, tol)  # the step's first instruction where the GPU began it
    plan = [o for k, o in zip(kinds, off) if k == "plan"]
    default = [o for k, o in zip(kinds, off) if k == "default"]
    assert abs(sum(plan) / len(plan) - sum(default) / len(default)) <= tol  # the A/B is unbiased
