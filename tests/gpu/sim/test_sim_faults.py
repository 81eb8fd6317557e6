"""The simulated GPU shows each fault on demand, in every process that opens it, at the same time."""

from __future__ import annotations

import pytest

from perseus.gpu import GPUError, GPUPermissionError, SimulatedGPU, VirtualClock
from perseus.gpu.errors import GPUInvalidArgumentError, GPUNotSupportedError
from perseus.gpu.sim.faults import SimFaults
from perseus.gpu.sim.stream import EVENT_FAULT


def _gpu(sim_dir, faults: SimFaults, clock: VirtualClock | None = None, **kw) -> SimulatedGPU:
    clock = clock or VirtualClock()
    return SimulatedGPU(0, state_dir=sim_dir, reset_state=True, faults=faults, clock=clock.now, sleep=clock.sleep,
                        energy_update_period_s=0.0, **kw)


def test_energy_reads_fail_for_a_while_then_recover(sim_dir):
    clock = VirtualClock()
    gpu = _gpu(sim_dir, SimFaults(energy_fail_from_s=1.0, energy_fail_for_s=0.5), clock)
    gpu.total_energy_j()
    clock.sleep(1.2)
    with pytest.raises(GPUError, match="Reading energy of simulated GPU 0 failed"):
        gpu.total_energy_j()
    with pytest.raises(GPUError):
        gpu.energy_counter_reading()
    clock.sleep(0.5)
    assert gpu.total_energy_j() > 0


def test_energy_reads_fail_for_good_in_a_second_process_s_handle_too(sim_dir):
    clock = VirtualClock()
    gpu = _gpu(sim_dir, SimFaults(energy_fail_from_s=0.0), clock)
    other = SimulatedGPU(0, state_dir=sim_dir, clock=clock.now, sleep=clock.sleep)  # attaches: same faults
    clock.sleep(100.0)
    for handle in (gpu, other):
        with pytest.raises(GPUError):
            handle.total_energy_j()


def test_clock_locks_refused_mid_run(sim_dir):
    clock = VirtualClock()
    gpu = _gpu(sim_dir, SimFaults(lock_refused_from_s=2.0, lock_refused_for_s=1.0), clock)
    gpu.set_locked_sm_clock(1005)
    clock.sleep(2.5)
    with pytest.raises(GPUPermissionError, match="refused by an injected fault"):
        gpu.set_locked_sm_clock(1200)
    with pytest.raises(GPUPermissionError):
        gpu.reset_locked_sm_clock()
    clock.sleep(1.0)
    gpu.reset_locked_sm_clock()
    assert not gpu.is_clock_locked()


def test_root_without_cap_sys_admin_may_measure_but_not_change_clocks(sim_dir):
    gpu = _gpu(sim_dir, SimFaults(no_cap_sys_admin=True))
    assert not gpu.can_set_clocks()
    assert "CAP_SYS_ADMIN" in (gpu.control_problem() or "")
    with pytest.raises(GPUPermissionError):
        gpu.set_locked_sm_clock(1005)
    gpu.total_energy_j()


def test_a_mig_gpu_refuses_clock_control_and_says_why(sim_dir):
    gpu = _gpu(sim_dir, SimFaults(mig=True))
    assert not gpu.can_set_clocks()
    assert "MIG" in (gpu.control_problem() or "")
    with pytest.raises(GPUNotSupportedError, match="MIG mode is enabled"):
        gpu.set_locked_sm_clock(1005)
    assert gpu.power_w() > 0


def test_a_lock_held_by_someone_else_is_in_force_from_the_start(sim_dir):
    gpu = _gpu(sim_dir, SimFaults(foreign_lock_mhz=1005))
    assert gpu.is_clock_locked() and gpu.locked_sm_clock_mhz() == 1005


def test_the_n_th_recorded_event_raises_as_a_cuda_error_does(sim_dir):
    gpu = _gpu(sim_dir, SimFaults(event_error_at=3, event_error_count=2), stream_depth=4)
    events = [gpu.stream.record() for _ in range(5)]
    assert [type(e).__name__ for e in events].count("FailingEvent") == 2
    for number, event in enumerate(events, start=1):
        if number in (3, 4):
            with pytest.raises(RuntimeError, match="CUDA error"):
                event.query()
            with pytest.raises(RuntimeError, match=EVENT_FAULT.split(":")[0]):
                event.synchronize()
        else:
            event.synchronize()
            assert event.query()
    gpu.stream.recycle(events[2])  # a failing event never comes back from the pool
    assert gpu.stream.record().query()


def test_faults_are_checked_and_round_trip():
    with pytest.raises(GPUInvalidArgumentError):
        SimFaults(event_error_at=0)
    with pytest.raises(GPUInvalidArgumentError, match="unknown simulated-GPU faults"):
        SimFaults.from_dict({"energy_fail": 1})
    faults = SimFaults(energy_fail_from_s=1.5, mig=True)
    assert SimFaults.from_dict(faults.to_dict()) == faults and faults.any and not SimFaults().any
