"""The follower sees each event when the GPU reaches it, also while an earlier action waits for its
due time (an untimed switch-ahead request); the actions still run in the order handed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from perseus.gpu.sim import SimulatedGPU
from perseus.gpu.stream.follow import FollowMechanism, StreamFollower

WAIT_S = 0.08  # the first action's due time after its event: far longer than the second kernel


@pytest.mark.parametrize("mechanism", list(FollowMechanism))
def test_an_event_reached_while_an_earlier_action_waits_is_seen_then(sim_dir: Path, mechanism: FollowMechanism) -> None:
    gpu = SimulatedGPU(0, preset="H200", state_dir=sim_dir, reset_state=True, stream_depth=6)
    stream = gpu.stream
    ran: list[tuple[str, float, float]] = []
    follower = StreamFollower(mechanism)
    try:
        stream.launch(0.005, tag=0)
        first = stream.record()
        stream.launch(0.01, tag=1)
        second = stream.record()
        follower.follow(first, lambda seen: ran.append(("first", seen, time.monotonic())), after_s=WAIT_S)
        follower.follow(second, lambda seen: ran.append(("second", seen, time.monotonic())))
        assert follower.drain()
        reached = first.gpu_time_s, second.gpu_time_s
    finally:
        follower.close()
        gpu.close()
    assert [name for name, _, _ in ran] == ["first", "second"]  # in order: the second after the first's wait
    (_, seen1, acted1), (_, seen2, _) = ran
    delay = seen1 - reached[0]  # the follower's own delay, on the first event
    assert acted1 >= seen1 + WAIT_S - follower.poll_s
    # seen when the GPU got there (its kernel ended 10 ms after the first event), not after the wait
    assert seen2 - reached[1] <= max(2 * delay, 0.002) < WAIT_S / 4, (seen2 - reached[1], delay)
    assert seen2 < acted1
