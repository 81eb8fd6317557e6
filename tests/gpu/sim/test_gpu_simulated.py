"""Simulated GPU: DVFS slowdown, energy integration, coarse counter, shared state across processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from perseus.gpu import (
    GPUError,
    GPUInvalidArgumentError,
    GPUPermissionError,
    SimulatedGPU,
    VirtualClock,
    get_preset,
    open_gpu,
    read_sim_state,
)
from perseus.gpu.sim.state import FILE_SIZE

A100 = get_preset("A100-SXM")


def vgpu(index: int = 0, **kw) -> tuple[SimulatedGPU, VirtualClock]:
    vc = VirtualClock()
    kw.setdefault("preset", "A100-SXM")
    kw.setdefault("energy_update_period_s", 0.0)
    g = SimulatedGPU(index, clock=vc.now, sleep=vc.sleep, reset_state=True, **kw)
    return g, vc


def test_open_gpu_sim_and_env_override(sim_dir, monkeypatch):
    g = open_gpu("sim", 1, preset="H100-SXM")
    assert isinstance(g, SimulatedGPU) and g.index == 1 and g.architecture == "hopper"
    assert g.state_path == sim_dir / "gpu1.state" and g.state_path.stat().st_size == FILE_SIZE
    monkeypatch.setenv("PERSEUS_GPU", "sim")
    assert isinstance(open_gpu(), SimulatedGPU)  # auto → env
    monkeypatch.setenv("PERSEUS_GPU", "cuda")
    with pytest.raises(GPUInvalidArgumentError, match="PERSEUS_GPU"):
        open_gpu()
    with pytest.raises(GPUInvalidArgumentError, match="auto, nvml, sim"):
        open_gpu("rocm")


def test_identity_and_clock_list(sim_dir):
    g = SimulatedGPU(0, preset="A40", reset_state=True)
    clocks = g.supported_sm_clocks_mhz()
    assert clocks[0] == 1740 and clocks[-1] == 210 and all(a - b == 15 for a, b in zip(clocks, clocks[1:]))
    assert g.default_sm_clock_mhz() == 1740 and g.max_memory_clock_mhz() == 7251
    assert g.uuid.startswith("GPU-") and g.uuid == SimulatedGPU(0).uuid  # stable across opens
    assert g.power_limit_range_w() == (100.0, 300.0) and g.power_limit_w() == 300.0


def test_busy_slows_down_and_integrates_energy_in_virtual_time(sim_dir):
    g, vc = vgpu()
    g.set_locked_sm_clock(1005)
    e0, t0 = g.true_energy_j(), vc.now()
    d = g.run_for(0.010, activity=1.0, compute_fraction=0.8)
    assert d == pytest.approx(0.010 * (0.8 * 1410 / 1005 + 0.2))
    assert vc.now() - t0 == pytest.approx(d)
    assert g.true_energy_j() - e0 == pytest.approx(A100.busy_power_w(1005) * d)
    e1 = g.true_energy_j()
    vc.sleep(2.0)  # blocked/idle between instructions
    assert g.true_energy_j() - e1 == pytest.approx(2.0 * 83.64)
    assert g.power_w() == pytest.approx(83.64)
    with g.busy(activity=0.5, compute_fraction=1.0) as r:
        assert g.power_w() == pytest.approx(A100.busy_power_w(1005, 0.5))
        vc.sleep(0.004)  # the "CPU work" of the instruction
    assert r.duration_s == pytest.approx(0.004 * 1410 / 1005)


def test_clock_change_during_busy_is_time_weighted(sim_dir):
    g, vc = vgpu()
    e0 = g.true_energy_j()
    g.begin_busy(compute_fraction=1.0)
    vc.sleep(0.010)
    g.set_locked_sm_clock(705)  # e.g. the controller process acting mid-instruction
    vc.sleep(0.010)
    d = g.end_busy()
    assert d == pytest.approx(0.010 * 1.0 + 0.010 * 2.0)
    expected = A100.busy_power_w(1410) * 0.010 + A100.busy_power_w(705) * (0.010 + 0.010)
    assert g.true_energy_j() - e0 == pytest.approx(expected)


def test_end_busy_pads_the_work_to_min_s_and_remembers_the_clock_it_ended_at(sim_dir):
    g, vc = vgpu()
    g.set_locked_sm_clock(705)
    g.begin_busy(compute_fraction=1.0)
    vc.sleep(0.002)  # CPU work shorter than the nominal kernel: padded to it, then stretched
    assert g.end_busy(min_s=0.010) == pytest.approx(0.020)
    assert g.last_busy_clock_mhz() == 705
    g.reset_locked_sm_clock()  # a later request does not change what the last kernel ran at
    assert g.last_busy_clock_mhz() == 705 and g.locked_sm_clock_mhz() == 1410
    g.begin_busy(compute_fraction=1.0)
    vc.sleep(0.004)  # CPU work longer than the nominal kernel: its own time counts
    assert g.end_busy(min_s=0.001) == pytest.approx(0.004)
    assert g.last_busy_clock_mhz() == 1410


def test_switch_latency_delays_the_clock_and_a_newer_request_replaces_a_pending_one(sim_dir):
    g, vc = vgpu(switch_latency_s=0.005)
    assert g.switch_latency_s == 0.005
    e0 = g.true_energy_j()
    g.begin_busy(compute_fraction=1.0)
    g.set_locked_sm_clock(705)  # requested as the instruction starts: lands 5 ms into it
    assert g.locked_sm_clock_mhz() == 1410 and not g.is_clock_locked()
    vc.sleep(0.010)
    assert g.locked_sm_clock_mhz() == 705
    d = g.end_busy(0.010)  # 10 ms at max clock: 5 ms at 1410, the rest at 705 (twice as slow)
    assert d == pytest.approx(0.010 * (0.5 * 1.0 + 0.5 * 2.0))
    expected = A100.busy_power_w(1410) * 0.005 + A100.busy_power_w(705) * (d - 0.005)
    assert g.true_energy_j() - e0 == pytest.approx(expected)
    g.set_locked_sm_clock(1005)
    vc.sleep(0.002)
    g.reset_locked_sm_clock()  # replaces the 1005 request still on its way
    vc.sleep(0.004)
    assert g.locked_sm_clock_mhz() == 705  # 1005 never took effect; the reset has not landed yet
    vc.sleep(0.002)
    assert not g.is_clock_locked() and g.locked_sm_clock_mhz() == 1410
    with pytest.raises(GPUInvalidArgumentError, match="switch_latency_s"):
        SimulatedGPU(1, switch_latency_s=-1.0)


def test_counter_advances_only_at_period_boundaries(sim_dir):
    g, vc = vgpu(energy_update_period_s=0.1)
    reads = []
    for _ in range(1000):  # 1 s, polled every 1 ms
        vc.sleep(0.001)
        reads.append((vc.now(), g.total_energy_j()))
    changes = [(t, e) for (t, e), (_, prev) in zip(reads[1:], reads[:-1]) if e != prev]
    assert 9 <= len(changes) <= 10
    gaps = [b[0] - a[0] for a, b in zip(changes, changes[1:])]
    assert all(abs(gap - 0.1) < 0.0015 for gap in gaps)
    incs = [b[1] - a[1] for a, b in zip(changes, changes[1:])]
    assert incs == pytest.approx([0.1 * 83.64] * len(incs))
    # the readable value lags the truth by less than one period's energy
    assert 0 <= g.true_energy_j() - g.total_energy_j() <= 0.1 * 83.64 + 1e-9


def _counter_trace(sim_dir, seed: int, index: int) -> list[float]:
    g, vc = vgpu(index, energy_update_period_s=0.1, noise=0.05, seed=seed)
    out = []
    for i in range(40):
        g.run_for(0.03, activity=0.5 + 0.5 * (i % 2))
        vc.sleep(0.02)
        out.append(g.total_energy_j())
    return out


def test_noise_is_deterministic_given_the_seed_and_keeps_the_counter_monotone(sim_dir):
    a, b, c = _counter_trace(sim_dir, 7, 0), _counter_trace(sim_dir, 7, 1), _counter_trace(sim_dir, 8, 2)
    assert a == b
    assert a != c
    assert all(y >= x for x, y in zip(a, a[1:]))
    g, vc = vgpu(4, energy_update_period_s=0.1, noise=0.05, seed=1)
    powers = {round(g.power_w(), 6) for _ in range(20)}
    assert len(powers) > 1 and all(abs(p - 83.64) < 0.5 * 83.64 for p in powers)


def test_invalid_use_is_reported(sim_dir):
    g, vc = vgpu()
    with pytest.raises(GPUInvalidArgumentError, match="210–1410"):
        g.set_locked_sm_clock(1500)
    g.set_locked_sm_clock(1001)
    assert g.locked_sm_clock_mhz() == 1005  # snapped to the 15 MHz grid
    with pytest.raises(GPUInvalidArgumentError, match="activity"):
        g.begin_busy(activity=1.5)
    with pytest.raises(GPUError, match="without a matching begin_busy"):
        g.end_busy()
    g.begin_busy()
    with pytest.raises(GPUError, match="already running"):
        g.begin_busy()
    g.end_busy()
    with pytest.raises(GPUInvalidArgumentError, match="100.0–400.0"):
        g.set_power_limit_w(500)
    with pytest.raises(GPUInvalidArgumentError):
        SimulatedGPU(-1)


def test_permissions_can_be_simulated(sim_dir):
    g = SimulatedGPU(0, reset_state=True, allow_clock_setting=False)
    assert g.can_set_clocks() is False
    with pytest.raises(GPUPermissionError, match="setcap"):
        g.set_locked_sm_clock(1200)
    with pytest.raises(GPUPermissionError):
        g.set_power_limit_w(300)
    assert g.total_energy_j() >= 0  # reading is always allowed


def test_power_limit_throttles_busy_power(sim_dir):
    g, vc = vgpu()
    g.set_power_limit_w(250)
    assert g.effective_sm_clock_mhz(activity=1.0) < 1410
    with g.busy():
        assert g.power_w() <= 250
        vc.sleep(0.01)


def test_attach_keeps_state_and_rejects_conflicting_parameters(sim_dir):
    g = SimulatedGPU(0, preset="A40", reset_state=True)
    g.set_locked_sm_clock(1200)
    other = SimulatedGPU(0)  # attach: model and lock come from the file
    assert other.name == g.name and other.locked_sm_clock_mhz() == 1200 and other.is_clock_locked()
    with pytest.raises(GPUError, match="reset_state=True"):
        SimulatedGPU(0, preset="H100-SXM")
    fresh = SimulatedGPU(0, preset="H100-SXM", reset_state=True)
    assert fresh.locked_sm_clock_mhz() == 1980 and not fresh.is_clock_locked()


def test_real_time_slowdown(sim_dir):
    g = SimulatedGPU(0, reset_state=True)
    g.set_locked_sm_clock(705)
    t = time.perf_counter()
    with g.busy(compute_fraction=1.0) as r:
        time.sleep(0.015)
    wall = time.perf_counter() - t
    # half the clock, all compute-bound: twice the block's time, and the caller waits it out
    # (how much longer than that a busy machine makes the wait is not the simulator's business)
    assert r.duration_s >= 2 * 0.015
    assert wall >= r.duration_s


def _run_py(code: str, sim_dir, **kw) -> subprocess.Popen[str]:
    env = {**os.environ, "PERSEUS_SIM_GPU_DIR": str(sim_dir)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, text=True,
                            stdout=subprocess.PIPE, **kw)


def test_another_process_sees_and_changes_the_state(sim_dir):
    g = SimulatedGPU(0, preset="A100-SXM", reset_state=True)
    p = _run_py("""
        from perseus.gpu import SimulatedGPU
        g = SimulatedGPU(0)
        print(g.locked_sm_clock_mhz(), g.is_clock_locked(), flush=True)
        g.set_locked_sm_clock(1200)
    """, sim_dir)
    out, _ = p.communicate(timeout=30)
    assert out.split() == ["1410", "False"]
    assert g.locked_sm_clock_mhz() == 1200 and read_sim_state(0, sim_dir).locked == 1


def test_crashed_process_leaves_its_lock_and_stale_busy_is_cleared(sim_dir):
    SimulatedGPU(0, reset_state=True)
    p = _run_py("""
        import time
        from perseus.gpu import SimulatedGPU
        g = SimulatedGPU(0)
        g.set_locked_sm_clock(900)
        g.begin_busy()
        print("busy", flush=True)
        time.sleep(60)
    """, sim_dir)
    try:
        assert p.stdout.readline().strip() == "busy"
    finally:
        p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    st = read_sim_state(0, sim_dir)
    assert (st.locked, st.locked_mhz, st.busy) == (1, 900, 1)  # like a real GPU: lock persists
    g = SimulatedGPU(0)  # attaching notices the dead owner
    assert g.snapshot().busy == 0 and g.power_w() == pytest.approx(83.64)
    g.begin_busy()
    g.end_busy()


def test_forked_child_does_not_keep_a_dead_parents_lock(sim_dir):
    """flock belongs to the open file description; a forked child (DataLoader worker) must not
    share it, or a trainer SIGKILLed inside an update would leave the GPU locked for readers."""
    import threading

    SimulatedGPU(0, reset_state=True)
    p = _run_py("""
        import os, time
        from perseus.gpu import SimulatedGPU
        g = SimulatedGPU(0)
        child = os.fork()
        if child == 0:
            time.sleep(30)
            os._exit(0)
        print(child, flush=True)
        with g._file.update():
            print("holding the lock", flush=True)
            time.sleep(60)
    """, sim_dir)
    child = int(p.stdout.readline())
    try:
        assert p.stdout.readline().strip() == "holding the lock"
    finally:
        p.send_signal(signal.SIGKILL)
    try:
        p.wait(timeout=10)
        got = []
        t = threading.Thread(target=lambda: got.append(read_sim_state(0, sim_dir)), daemon=True)
        t.start()
        t.join(timeout=3.0)
        assert got, "state file still locked by the dead trainer's forked child"
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_switch_landing_inside_a_kernel_changes_the_rest_of_it_and_the_kernel_record_says_when(sim_dir):
    g, vc = vgpu(switch_latency_s=0.010)
    g.set_locked_sm_clock(705)
    vc.sleep(0.020)  # landed
    g.begin_busy(compute_fraction=1.0)
    start = vc.now()
    g.set_locked_sm_clock(1410)  # lands 10 ms into the kernel, while end_busy waits it out
    d = g.end_busy(min_s=0.010)  # 10 ms of work: 10 ms at 705 do 5 ms of it, the other 5 ms run at 1410
    assert d == pytest.approx(0.015) and vc.now() == pytest.approx(start + 0.015)
    k = g.last_kernel()
    assert (k.start, k.work_s, k.start_mhz, k.end_mhz) == (pytest.approx(start), 0.010, 705, 1410)
    assert k.duration_s == pytest.approx(0.015) and k.clock_applied_at == pytest.approx(start + 0.010)
    assert g.kernel_time_s(0.010, 705, 1.0) == pytest.approx(0.020)  # what the clock alone would have given
    # without a switch on the way the kernel is its work stretched by the one clock
    g.begin_busy(compute_fraction=1.0)
    assert g.end_busy(min_s=0.010) == pytest.approx(0.010) and g.last_kernel().start_mhz == 1410
