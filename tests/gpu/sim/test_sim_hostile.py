"""The "H200-hostile" simulated GPU: what real cards do that the plain simulator leaves out.

A part-time, late energy meter (A100/H100 sample power during 25 % of each 100 ms period: SC'24,
arXiv 2312.02741), the measured H200's operating points (dense work held at 1,530 MHz and 693 W by
the power cap, memory-bound work at 1,980 MHz and 505 W), a switch latency that depends on the
target clock (LATEST, arXiv 2502.20075), and on the stream an optimizer tail after each step and a
spinning (NCCL-like) wait where the plain model idles. Every one is off in the plain presets.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from perseus.gpu.device import ClockEventReason
from perseus.gpu.sim import SimulatedGPU, VirtualClock
from perseus.gpu.sim.dvfs import H200_DENSE_ACTIVITY, H200_MEMORY_BOUND_ACTIVITY, PRESETS, get_preset
from perseus.gpu.sim.integrator import StateIntegrator
from perseus.gpu.sim.state import SimState
from perseus.runtime.port.sim_kernels import STEP_TAIL_TAG, SimulatedKernels

HOSTILE = get_preset("H200-hostile")
PERIOD = 0.1
LAG_MAX = HOSTILE.meter_lag_s


def meter(model=HOSTILE) -> StateIntegrator:
    """The hostile meter with its counter boundaries at multiples of 100 ms and no noise."""
    return StateIntegrator(model, energy_update_period_s=PERIOD, counter_phase_s=0.0, noise=0.0, seed=0,
                           switch_latency_s=0.0)


def idle(phys: StateIntegrator) -> SimState:
    return SimState(power_limit_w=phys.model.tdp_w, t_ref=0.0, power_w=phys.model.p_blocking_w)


def run_kernel(phys: StateIntegrator, st: SimState, start: float, end: float, activity: float = 1.0) -> float:
    """A kernel from ``start`` to ``end`` (settling at both ends); its power."""
    phys.settle(st, start)
    st.busy, st.activity, st.compute_fraction = 1, activity, 0.0
    phys.refresh_power(st)
    power = st.power_w
    phys.settle(st, end)
    st.busy = 0
    phys.refresh_power(st)
    return power


def vgpu(sim_dir: Path, preset: str = "H200-hostile", **kw) -> tuple[SimulatedGPU, VirtualClock]:
    vc = VirtualClock()
    kw.setdefault("noise", 0.0)
    return SimulatedGPU(0, preset=preset, state_dir=sim_dir, reset_state=True, clock=vc.now, sleep=vc.sleep,
                        **kw), vc


def test_the_plain_presets_have_none_of_it_and_the_hostile_one_is_the_measured_h200():
    assert not any(m.hostile for name, m in PRESETS.items() if name != "H200-hostile") and HOSTILE.hostile
    assert replace(HOSTILE, **{k: getattr(get_preset("H200"), k) for k in ("name", "meter_sampled_fraction",
                   "meter_lag_s", "meter_noise", "switch_latency_low_s", "switch_latency_high_s", "step_tail_s",
                   "step_tail_activity", "step_tail_compute_fraction", "spin_activity")}) == get_preset("H200")
    # The plain presets' record in the state file is unchanged: no real-card keys.
    assert "spin_activity" not in get_preset("H200").to_dict() and HOSTILE.to_dict()["spin_activity"] == 0.05


# -- the energy meter ------------------------------------------------------------------------

def test_a_kernel_in_the_unsampled_part_of_a_period_is_not_in_the_counter():
    phys = meter()
    st = idle(phys)
    p_idle = phys.model.p_blocking_w
    busy = run_kernel(phys, st, 0.05, 0.09)  # after the sampled first 25 ms of [0, 0.1)
    after_lag = PERIOD + LAG_MAX + 1e-6
    assert phys.counter_reading(st, after_lag)[0] == pytest.approx(p_idle * PERIOD)  # idle, as sampled
    assert phys.true_energy(st, PERIOD) == pytest.approx(p_idle * 0.06 + busy * 0.04)  # the truth has it
    # One inside the sampled part of the next period counts four times over (25 ms stand for 100).
    busy = run_kernel(phys, st, 0.10, 0.12)
    value = phys.counter_reading(st, 2 * PERIOD + LAG_MAX + 1e-6)[0]
    assert value == pytest.approx(p_idle * PERIOD + (busy * 0.02 + p_idle * 0.005) * 4)
    assert phys.true_energy(st, 2 * PERIOD) == pytest.approx(p_idle * 0.14 + busy * 0.06)


def test_each_update_appears_up_to_the_lag_after_its_period_ends():
    phys = meter()
    st = idle(phys)
    seen = []
    for k in (1, 2, 3, 4):
        boundary = k * PERIOD
        assert phys.counter_reading(st, boundary - 1e-6)[0] == pytest.approx((k - 1) * PERIOD * phys.model.p_blocking_w)
        t = next(boundary + i * 1e-4 for i in range(120)
                 if phys.counter_reading(st, boundary + i * 1e-4)[0] > (k - 0.5) * PERIOD * phys.model.p_blocking_w)
        assert 0 < t - boundary <= LAG_MAX + 1e-4
        seen.append(round(t - boundary, 4))
        assert phys.counter_reading(st, t)[1] == pytest.approx(t, abs=1e-4)  # when it was reported
    assert len(set(seen)) > 1  # each period's own lag
    # A state already settled past a boundary still reads the previous update until the lag has passed.
    lag = seen[0]
    phys.settle(st, PERIOD + lag / 2)
    assert st.counter_k == 1
    assert phys.counter_reading(st, PERIOD + lag / 2)[0] == 0.0
    assert phys.counter_reading(st, PERIOD + lag + 1e-4)[0] == pytest.approx(PERIOD * phys.model.p_blocking_w)


def test_the_device_counter_is_not_the_truth_but_true_energy_is(sim_dir):
    gpu, vc = vgpu(sim_dir)
    try:
        t0, e0 = vc.now(), gpu.true_energy_j()
        c0 = gpu.total_energy_j()
        busy_w = gpu.model.busy_power_w(1530, 1.0)
        vc.sleep(0.05)  # seed 0's counter periods begin 84 ms into each 100 ms of this clock: the work is never sampled
        for _ in range(20):  # 25 ms of dense work every 100 ms
            gpu.run_for(0.025, activity=1.0, compute_fraction=0.0)
            vc.sleep(0.075)
        truth = 20 * (0.025 * busy_w + 0.075 * gpu.model.p_blocking_w)
        assert gpu.true_energy_j() - e0 == pytest.approx(truth + (vc.now() - t0 - 2.0) * gpu.model.p_blocking_w)
        counted = gpu.total_energy_j() - c0
        assert counted < 0.6 * truth  # where the load falls in the period decides what is booked
        assert gpu.energy_counter_reading()[1] is None  # a real card's counter says nothing of when it advanced
    finally:
        gpu.close()


def test_the_meter_is_noisy_unless_noise_is_given(sim_dir):
    assert SimulatedGPU(0, preset="H200-hostile", state_dir=sim_dir, reset_state=True).noise == HOSTILE.meter_noise
    assert SimulatedGPU(1, preset="H200-hostile", state_dir=sim_dir, reset_state=True, noise=0.0).noise == 0.0
    assert SimulatedGPU(2, preset="H200", state_dir=sim_dir, reset_state=True).noise == 0.0


# -- instruction kinds: the measured operating points -----------------------------------------

@pytest.mark.parametrize("preset", ["H200", "H200-hostile"])
def test_dense_work_is_held_by_the_power_cap_and_memory_bound_work_runs_at_the_top_clock(sim_dir, preset):
    gpu, _ = vgpu(sim_dir, preset)
    try:
        gpu.begin_busy(H200_DENSE_ACTIVITY, 0.8)  # a GEMM stage: 1,530 MHz (1,410-1,620) at 693 W, sw_power_cap
        assert gpu.current_sm_clock_mhz() == 1530
        assert gpu.power_w() == pytest.approx(693, rel=0.03)
        assert ClockEventReason.SW_POWER_CAP in gpu.clock_event_reasons()
        gpu.end_busy(0.0)
        gpu.begin_busy(H200_MEMORY_BOUND_ACTIVITY, 0.1)  # a memory-bound add: 1,980 MHz, 505 W
        assert gpu.current_sm_clock_mhz() == 1980
        assert gpu.power_w() == pytest.approx(505, rel=0.03)
        assert ClockEventReason.SW_POWER_CAP not in gpu.clock_event_reasons()
        gpu.end_busy(0.0)
    finally:
        gpu.close()


# -- clock switches ---------------------------------------------------------------------------

def test_the_switch_latency_depends_on_the_target_clock(sim_dir):
    gpu, vc = vgpu(sim_dir)
    try:
        latencies = {}
        for target in (345, 1980, 1162):
            gpu.set_locked_sm_clock(target)
            st = gpu.snapshot()
            assert st.pending and st.pending_mhz == gpu.model.nearest_clock(target)
            latencies[target] = st.pending_at - vc.now()
            vc.sleep(0.02)
        assert latencies[345] == pytest.approx(0.005) and latencies[1980] == pytest.approx(0.015)
        assert latencies[1162] == pytest.approx(0.005 + 0.010 * (1155 - 345) / (1980 - 345))  # linear in between
        assert gpu.locked_sm_clock_mhz() == 1155
        gpu.reset_locked_sm_clock()  # back to the default, the top clock
        assert gpu.snapshot().pending_at - vc.now() == pytest.approx(0.015)
    finally:
        gpu.close()
    constant, vc = vgpu(sim_dir, switch_latency_s=0.002)  # a constant latency given: it holds for every target
    constant.set_locked_sm_clock(345)
    assert constant.snapshot().pending_at - vc.now() == pytest.approx(0.002)
    constant.close()
    plain, _ = vgpu(sim_dir, "H200")  # and the plain preset switches at once
    plain.set_locked_sm_clock(345)
    assert not plain.snapshot().pending and plain.locked_sm_clock_mhz() == 345
    plain.close()


# -- on the stream: the step tail and spinning waits --------------------------------------------

def wait_until_spinning(gpu: SimulatedGPU, activity: float, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (gpu.snapshot().busy and gpu.snapshot().activity == activity):
        assert time.monotonic() < deadline, "the stream never started spinning"
        time.sleep(0.001)


def test_the_step_tail_follows_the_last_instruction_at_high_power(sim_dir):
    gpu, vc = vgpu(sim_dir, stream_depth=4)
    try:
        kernels = SimulatedKernels(gpu)
        kernels.begin()
        kernels.pad(0.01)
        kernels.end("forward", 0)
        kernels.step_end()  # the optimizer and the gradient all-reduce
        assert kernels.launched == 2
        gpu.stream.synchronize()
        forward, tail = gpu.stream.kernels()
        assert forward.tag is None and tail.tag == STEP_TAIL_TAG and tail.start_s == pytest.approx(forward.end_s)
        assert tail.run_mhz == 1980 and tail.end_s - tail.start_s == pytest.approx(0.035)  # 30-40 ms
        assert gpu.model.busy_power_w(tail.run_mhz, gpu.model.step_tail_activity) == pytest.approx(505, rel=0.03)
    finally:
        gpu.close()
    plain, _ = vgpu(sim_dir, "H200", stream_depth=4)
    try:
        kernels = SimulatedKernels(plain)
        kernels.step_end()  # no tail on the plain preset
        assert kernels.launched == 0 and plain.stream.kernels() == []
    finally:
        plain.close()


@pytest.mark.parametrize("preset", ["H200", "H200-hostile"])
def test_a_stream_waiting_for_its_host_spins_where_the_plain_one_idles(sim_dir, preset):
    gpu, vc = vgpu(sim_dir, preset, stream_depth=4)
    m = gpu.model
    try:
        stream = gpu.stream
        stream.launch(0.01, activity=H200_MEMORY_BOUND_ACTIVITY, compute_fraction=0.0)
        stream.synchronize()
        if m.spin_activity:
            wait_until_spinning(gpu, m.spin_activity)
        t, e = vc.now(), gpu.true_energy_j()
        vc.sleep(0.05)  # the host is blocked in a receive: the peer stage is late
        stream.launch(0.01, activity=H200_MEMORY_BOUND_ACTIVITY, compute_fraction=0.0)
        stream.synchronize()
        kernel = m.busy_power_w(1980, H200_MEMORY_BOUND_ACTIVITY) * 0.01
        if m.spin_activity:
            assert stream.spins[-1] == pytest.approx((t, t + 0.05))
            spin_w = m.busy_power_w(1980, m.spin_activity)
            assert spin_w > 1.4 * m.p_blocking_w  # NCCL's spin: well above idle, far below a load
            assert gpu.true_energy_j() - e == pytest.approx(spin_w * 0.05 + kernel)
        else:
            assert stream.spins == []
            assert gpu.true_energy_j() - e == pytest.approx(m.p_blocking_w * 0.05 + kernel)
    finally:
        gpu.close()


def test_a_spin_follows_the_clock_in_force(sim_dir):
    gpu, vc = vgpu(sim_dir, stream_depth=4)
    try:
        gpu.set_locked_sm_clock(1005)
        vc.sleep(0.02)  # the switch lands
        gpu.stream.launch(0.001)
        gpu.stream.synchronize()
        wait_until_spinning(gpu, HOSTILE.spin_activity)
        assert gpu.power_w() == pytest.approx(HOSTILE.busy_power_w(1005, HOSTILE.spin_activity))
        assert gpu.power_w() < HOSTILE.busy_power_w(1980, HOSTILE.spin_activity)
    finally:
        gpu.close()
