"""The energy poller through failing counter reads (the simulated GPU's ``SimFaults``), in virtual time.

A transient failure is retried with backoff and polling resumes; the steps whose span the counter
did not cover are unmeasured (None), never 0 J; reads failing for ``DEAD_AFTER_S`` make the counter
dead (``error``, set once), as does an error no retry mends (a lost GPU) (``read_failures.py``).
"""

from __future__ import annotations

import pytest

from perseus.gpu import SimulatedGPU, VirtualClock
from perseus.gpu.errors import GPUNotFoundError
from perseus.gpu.meter import read_failures
from perseus.gpu.meter.energy import EnergyPoller
from perseus.gpu.meter.read_failures import BACKOFF_MAX_S, DEAD_AFTER_S
from perseus.gpu.sim.faults import SimFaults
from perseus.runtime.port.gpu_timeline import HostSteps

PERIOD_S = 0.1  # the counter's update period, as NVML's on A100/H100/H200
POLL_S = 0.005


def _poller(sim_dir, faults: SimFaults) -> tuple[EnergyPoller, VirtualClock, float]:
    clock = VirtualClock()
    created = clock.now()
    gpu = SimulatedGPU(0, state_dir=sim_dir, reset_state=True, faults=faults, clock=clock.now, sleep=clock.sleep,
                       energy_update_period_s=PERIOD_S)
    return EnergyPoller(gpu, POLL_S, clock.now), clock, created


def _run_until(poller: EnergyPoller, clock: VirtualClock, t: float) -> list[float | None]:
    """The poller's thread in virtual time: ``tick``, wait as it says; the waits it asked for."""
    waits: list[float | None] = []
    while clock.now() < t:
        wait = poller.tick()
        waits.append(wait)
        if wait is None:
            break
        clock.sleep(wait)
    return waits


def test_a_transient_failure_is_retried_with_backoff_and_polling_resumes(sim_dir):
    poller, clock, t0 = _poller(sim_dir, SimFaults(energy_fail_from_s=1.0, energy_fail_for_s=0.5))
    waits = _run_until(poller, clock, t0 + 3.0)
    assert poller.error is None and poller.read_failures.count > 0
    assert None not in waits
    failing = [w for w in waits if w is not None and w > POLL_S]
    assert failing and failing == sorted(failing) and max(failing) <= BACKOFF_MAX_S  # doubling, capped
    after = [u for u in poller.updates() if u.t_s > t0 + 1.5]
    assert len(after) >= 10, "updates come again once reads answer"
    # the outage's span is not covered; before it and a while after it, the counter measures
    assert not poller.covers(t0 + 1.2, t0 + 1.3)
    assert not poller.covers(t0 + 0.9, t0 + 1.1)  # overlapping its start
    assert poller.covers(t0 + 0.5, t0 + 0.8)
    assert poller.covers(t0 + 2.5, t0 + 2.9)


def test_a_step_in_the_outage_is_unmeasured_not_zero_joules_and_later_steps_are_measured(sim_dir):
    poller, clock, t0 = _poller(sim_dir, SimFaults(energy_fail_from_s=1.0, energy_fail_for_s=0.5))
    steps = HostSteps(poller, clock.now)
    numbers = []
    spans = []
    for begin, end in ((0.4, 0.7), (0.9, 1.2), (1.25, 1.45), (2.6, 2.9)):  # the outage: 1.0 to 1.5
        _run_until(poller, clock, t0 + begin)
        steps.step_begin()
        started = clock.now()
        _run_until(poller, clock, t0 + end)
        spans.append(clock.now() - started)
        numbers.append(steps.step_end())
    before, straddling, inside, after = numbers
    assert before.energy_j is not None and before.energy_j > 0
    assert inside.energy_j is None and straddling.energy_j is None  # never 0 J, never the counter's old value
    assert inside.time_s == pytest.approx(spans[2])  # its time is still measured
    assert after.energy_j is not None and after.energy_j > 0


def test_an_outage_still_open_leaves_the_steps_since_unmeasured(sim_dir):
    poller, clock, t0 = _poller(sim_dir, SimFaults(energy_fail_from_s=1.0, energy_fail_for_s=5.0))
    _run_until(poller, clock, t0 + 2.0)  # reads are failing now: no update closes the gap yet
    assert poller.covers(t0 + 0.5, t0 + 0.9)
    assert not poller.covers(t0 + 1.5, t0 + 1.9)


def test_reads_failing_past_the_bound_make_the_counter_dead_once(sim_dir):
    poller, clock, t0 = _poller(sim_dir, SimFaults(energy_fail_from_s=1.0))  # for good
    waits = _run_until(poller, clock, t0 + 1.0 + 2 * DEAD_AFTER_S)
    assert waits[-1] is None, "the thread stops"
    assert t0 + 1.0 + DEAD_AFTER_S <= clock.now() < t0 + 1.0 + DEAD_AFTER_S + BACKOFF_MAX_S + 0.1
    error = poller.error
    assert error is not None and "Reading energy of simulated GPU 0 failed" in error
    assert poller.tick() is None and poller.error is error  # set once, not replaced
    assert not poller.covers(t0 + 5.0, t0 + 5.1)


def test_a_failure_shorter_than_the_bound_is_not_dead(sim_dir, monkeypatch):
    monkeypatch.setattr(read_failures, "DEAD_AFTER_S", 3.0)
    poller, clock, t0 = _poller(sim_dir, SimFaults(energy_fail_from_s=1.0, energy_fail_for_s=2.5))
    assert None not in _run_until(poller, clock, t0 + 6.0)
    assert poller.error is None and poller.covers(t0 + 5.0, t0 + 5.5)


def test_a_lost_gpu_makes_the_counter_dead_at_once(sim_dir):
    poller, clock, _ = _poller(sim_dir, SimFaults())
    assert poller.tick() is not None

    def lost() -> tuple[float, float | None]:
        raise GPUNotFoundError("Reading energy: GPU not found (GPU is lost)")

    poller.device.energy_counter_reading = lost  # type: ignore[method-assign]  # a lost GPU, on this handle only
    assert poller.tick() is None and poller.error == "Reading energy: GPU not found (GPU is lost)"


def test_the_thread_backs_off_and_stops_once_dead(sim_dir, monkeypatch):
    """The real thread: reads failing for good from the start stop it after the (shortened) bound."""
    monkeypatch.setattr(read_failures, "DEAD_AFTER_S", 0.2)
    gpu = SimulatedGPU(0, state_dir=sim_dir, reset_state=True, faults=SimFaults(energy_fail_from_s=0.0),
                       energy_update_period_s=PERIOD_S)
    poller = EnergyPoller(gpu, POLL_S).start()
    assert poller._thread is not None
    poller._thread.join(timeout=30.0)  # hang guard
    assert not poller._thread.is_alive() and poller.error is not None
    assert 3 <= poller.read_failures.count < 0.2 / POLL_S, "backed off, not a read every poll interval"
    poller.stop()
