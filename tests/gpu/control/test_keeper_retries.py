"""``ClockKeeper`` through refused clock calls (the simulated GPU's ``SimFaults``).

A refusal shorter than the retry budget (``RETRY_DELAYS_S``) leaves no ``failed`` notice and the
clock applied; one that persists gives exactly one; one no retry mends fails at once. Retries are
scheduled, never slept: the controller process answers its pipe while one is pending.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from perseus.gpu import SimulatedGPU, VirtualClock
from perseus.gpu.control.keeper import RETRY_DELAYS_S, ClockKeeper
from perseus.gpu.control.process import MSG, OP_CLOSE, OP_SET, OP_SYNC, serve
from perseus.gpu.sim.faults import SimFaults


def _keeper(sim_dir, faults: SimFaults) -> tuple[ClockKeeper, SimulatedGPU, VirtualClock, list[dict]]:
    clock = VirtualClock()
    gpu = SimulatedGPU(0, state_dir=sim_dir, reset_state=True, faults=faults, clock=clock.now, sleep=clock.sleep)
    events: list[dict] = []
    return ClockKeeper(gpu, events.append, clock=clock.now, sleep=clock.sleep), gpu, clock, events


def _drive(keeper: ClockKeeper, clock: VirtualClock) -> list[str]:
    """The owner's loop in virtual time: retry each refused call when due; the outcomes."""
    outcomes = []
    while (due := keeper.retry_in()) is not None:
        clock.sleep(max(due, 0.0))
        retried = keeper.maybe_retry()
        if retried is not None:
            outcomes.append(retried[0])
    return outcomes


def test_a_refusal_shorter_than_the_retries_is_no_failure_and_the_latest_clock_lands(sim_dir):
    keeper, gpu, clock, events = _keeper(sim_dir, SimFaults(lock_refused_from_s=1.0, lock_refused_for_s=0.6))
    clock.sleep(1.1)
    assert keeper.apply(1005) == "retrying"
    assert keeper.apply(900) == "retrying", "a newer request replaces the retried one, without a device call"
    assert _drive(keeper, clock)[-1] == "applied"
    assert events == [] and keeper.failed is None
    assert gpu.locked_sm_clock_mhz() == 900 and keeper.current == 900 and keeper.refusals == 0


def test_a_persistent_refusal_is_one_failed_notice_after_the_retries(sim_dir):
    keeper, gpu, clock, events = _keeper(sim_dir, SimFaults(lock_refused_from_s=1.0))  # for good
    clock.sleep(1.1)
    refused_at = clock.now()
    assert keeper.apply(1005) == "retrying"
    outcomes = _drive(keeper, clock)
    failed = [e for e in events if e["event"] == "failed"]
    assert len(failed) == 1 and "refused by an injected fault" in failed[0]["message"]
    assert failed[0]["reset"] is False, "resets are refused too: said so"
    assert "error" in outcomes  # the lock's last retry, then the reset's retries
    assert clock.now() - refused_at >= sum(RETRY_DELAYS_S)
    assert keeper.apply(900) == "skipped" and keeper.retry_in() is None  # default clocks for the rest of the run
    assert not gpu.is_clock_locked()
    assert keeper.apply(1005) == "skipped" and len(events) == 1


def test_a_refusal_no_retry_mends_fails_at_once(sim_dir):
    keeper, gpu, clock, events = _keeper(sim_dir, SimFaults(mig=True))
    assert keeper.apply(1005) == "error"
    assert [e["event"] for e in events] == ["failed"] and "MIG" in events[0]["message"]
    assert keeper.retry_in() is None


def test_a_refused_reset_is_retried_until_it_passes(sim_dir):
    keeper, gpu, clock, events = _keeper(sim_dir, SimFaults(lock_refused_from_s=1.0, lock_refused_for_s=1.0))
    assert keeper.apply(1005) == "applied"
    clock.sleep(1.2)
    assert keeper.reset_now(), "the blocking reset (exit) waits out the refusal"
    assert not gpu.is_clock_locked() and events == []


def test_the_controller_answers_its_pipe_while_a_refused_lock_waits_for_its_retry(sim_dir):
    """``serve`` (the controller process's loop) on a GPU that refuses locks for 1.2 s: a SYNC sent
    right after a refused SET is answered before the retry (its clock is still the old one), the
    retry then lands the clock, and no ``failed`` notice is sent."""
    gpu = SimulatedGPU(0, state_dir=sim_dir, reset_state=True, energy_update_period_s=0.0,
                       faults=SimFaults(lock_refused_from_s=0.3, lock_refused_for_s=1.2))
    created = time.monotonic()
    req_r, req_w = os.pipe()
    status_r, status_w = os.pipe()
    lines: list[dict] = []

    def read_until(pred, timeout_s: float = 30.0) -> dict:  # hang guard
        deadline = time.monotonic() + timeout_s
        buf = b""
        while time.monotonic() < deadline:
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                lines.append(json.loads(line))
                if pred(lines[-1]):
                    return lines[-1]
            buf += os.read(status_r, 65536)
        raise AssertionError(f"no such status line: {lines}")

    answers: dict[str, dict] = {}

    def trainer() -> None:
        read_until(lambda e: e["event"] == "ready")
        time.sleep(max(0.0, created + 0.4 - time.monotonic()))  # inside the refusal
        os.write(req_w, MSG.pack(OP_SET, 1005, 0.0) + MSG.pack(OP_SYNC, 1, 0.0))
        answers["first"] = read_until(lambda e: e["event"] == "sync" and e["seq"] == 1)
        for seq in range(2, 2000):  # the trainer's later flushes, until the retry landed
            os.write(req_w, MSG.pack(OP_SYNC, seq, 0.0))
            answers["last"] = read_until(lambda e, seq=seq: e["event"] == "sync" and e["seq"] == seq)
            if answers["last"]["current"] == 1005:
                break
            time.sleep(0.05)
        os.write(req_w, MSG.pack(OP_CLOSE, 0, 0.0))

    thread = threading.Thread(target=trainer, daemon=True)
    previous = signal.getsignal(signal.SIGTERM)
    thread.start()
    try:
        why = serve(gpu, req_r, status_w, os.getppid(), 0.05)
    finally:
        signal.signal(signal.SIGTERM, previous)
        thread.join(timeout=30.0)
        for fd in (req_r, req_w, status_r, status_w):
            os.close(fd)
    assert why == "close requested"
    assert answers["first"]["current"] is None and answers["first"]["errors"] >= 1, "answered before the retry"
    assert answers["last"]["current"] == 1005 and answers["last"]["history"][-1] == 1005
    assert not [e for e in lines if e["event"] == "failed"]
    assert not gpu.is_clock_locked(), "CLOSE resets"


def test_a_lock_refused_for_good_fails_though_a_reset_follows_every_step(sim_dir):
    """A plan resets the clocks after each step; the resets must not hide that every lock is refused."""
    keeper, gpu, clock, events = _keeper(sim_dir, SimFaults(lock_refused_from_s=1.0))  # locks and resets, for good
    clock.sleep(1.1)
    for _ in range(40):  # steps of 0.3 s: a lock at the step's start, a reset after its last instruction
        keeper.apply(1005)
        clock.sleep(0.15)
        keeper.maybe_retry()
        keeper.apply(None)
        clock.sleep(0.15)
        keeper.maybe_retry()
        if keeper.failed is not None:
            break
    assert keeper.failed is not None and len([e for e in events if e["event"] == "failed"]) == 1
    assert keeper.apply(1005) == "skipped"
