"""The follower sees each event when the GPU reaches it, also while an earlier action waits for its
due time (an untimed switch-ahead request); the actions still run in the order handed."""

from __future__ import annotations

import sys
import threading
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
    oversleep = [0.0]  # the longest a poll-period sleep overran while the follower worked
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            time.sleep(follower.poll_s)
            oversleep[0] = max(oversleep[0], time.monotonic() - t0 - follower.poll_s)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
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
        done.set()
        prober.join()
        follower.close()
        gpu.close()
    assert [name for name, _, _ in ran] == ["first", "second"]  # in order: the second after the first's wait
    (_, seen1, acted1), (_, seen2, _) = ran
    delay = seen1 - reached[0]  # the follower's own delay, on the first event
    assert acted1 >= seen1 + WAIT_S - follower.poll_s
    # seen when the GPU got there (its kernel ended 10 ms after the first event), not after the wait
    # (a follower that looks behind a waiting action only once it ran sees it ~WAIT_S - 10 ms late)
    lag2 = seen2 - reached[1]
    assert lag2 < WAIT_S / 4 and seen2 < acted1, (lag2, seen2, acted1)
    # and as punctually as this host lets a poller be: twice the follower's delay on the first event,
    # or 2 ms, or twice the longest oversleep a thread polling as the follower does saw meanwhile
    # (a loaded host's scheduling delay, which delays the follower's polls as much), give or take a
    # poll period and one GIL switch interval (the simulated GPU's thread may hold it when the poll wakes)
    slack = follower.poll_s + sys.getswitchinterval()
    assert lag2 <= max(2 * delay, 0.002, 2 * oversleep[0]) + slack, (lag2, delay, oversleep[0])
