"""Per-instruction energy attribution from a coarse (100 ms) counter, timers, P_blocking."""

from __future__ import annotations

import math
import random
import time

import pytest

from perseus.gpu import GPUError, SimulatedGPU, VirtualClock, get_preset
from perseus.gpu.meter.energy import (
    AfterLast,
    CounterUpdate,
    EnergyPoller,
    MeasurementError,
    attribute_energy,
    energy_at,
    measure_blocking_power,
)
from perseus.gpu.meter.timing import (
    CPUInstructionTimer,
    SimulatedKernelTimer,
    TimedInstruction,
    cuda_timing_available,
    make_instruction_timer,
)

A100 = get_preset("A100-SXM")
KINDS = {"forward": 0.6, "backward": 1.0}  # SM activity → different power per kind


class PollingClock(VirtualClock):
    """Virtual time in 1 ms steps, polling the energy counter at every step (like the thread)."""

    poller: EnergyPoller | None = None

    def sleep(self, dt: float) -> None:
        while dt > 1e-12:
            step = min(dt, 0.001)
            self.t += step
            dt -= step
            if self.poller is not None:
                self.poller.poll_once()


def _run_workload(g: SimulatedGPU, sleep, clock, n: int, seed: int, mhz: int):
    """n instructions of two kinds, 5–20 ms each (at max clock), with 0–5 ms gaps."""
    rng = random.Random(seed)
    timer = SimulatedKernelTimer(g, clock)  # the kernels' own times, as the runtime profiles them
    truth: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(n):
        kind = rng.choice(list(KINDS))
        timer.begin((kind, mhz))
        d = g.run_for(rng.uniform(0.005, 0.020), activity=KINDS[kind])
        timer.end()
        truth[kind].append(A100.busy_power_w(mhz, KINDS[kind]) * d)
        sleep(rng.uniform(0.0, 0.005))
    return timer.resolve(), truth


@pytest.mark.parametrize("noise", [0.0, 0.02])
def test_attribution_with_a_100ms_counter_in_virtual_time(sim_dir, noise):
    clock = PollingClock()
    g = SimulatedGPU(0, preset="A100-SXM", energy_update_period_s=0.1, noise=noise, seed=3,
                     reset_state=True, clock=clock.now, sleep=clock.sleep)
    g.set_locked_sm_clock(1200)
    poller = EnergyPoller(g, clock=clock.now)
    clock.poller = poller
    poller.poll_once()
    insts, truth = _run_workload(g, clock.sleep, clock.now, 400, seed=1, mhz=1200)
    clock.sleep(0.25)  # let the counter publish the tail
    res = attribute_energy(poller.updates(), insts)
    assert res.n_intervals >= 50
    bound = 0.03 if noise == 0 else 0.05
    for kind, act in KINDS.items():
        k = res.keys[(kind, 1200)]
        assert k.power_w == pytest.approx(A100.busy_power_w(1200, act), rel=bound)
        true_e = sum(truth[kind]) / len(truth[kind])
        assert k.energy_j == pytest.approx(true_e, rel=bound)
        assert k.count == len(truth[kind]) and k.power_stderr_w < 0.05 * k.power_w
    assert res.idle_power_w == pytest.approx(83.64, rel=0.15)
    # a known P_blocking removes the idle unknown and must give the same answer
    fixed = attribute_energy(poller.updates(), insts, idle_power_w=83.64)
    for kind, act in KINDS.items():
        assert fixed.keys[(kind, 1200)].power_w == pytest.approx(A100.busy_power_w(1200, act), rel=bound)


def test_naive_differencing_would_be_wrong(sim_dir):
    """Why regression is needed: counter differences around one instruction are 0 or a period."""
    clock = VirtualClock()
    g = SimulatedGPU(0, energy_update_period_s=0.1, reset_state=True, clock=clock.now, sleep=clock.sleep)
    zero_or_big = []
    for _ in range(30):
        e0 = g.total_energy_j()
        d = g.run_for(0.01)
        zero_or_big.append((g.total_energy_j() - e0) / (A100.busy_power_w(1410) * d))
    assert all(r == 0 or r > 2 for r in zero_or_big)


def test_attribution_in_real_time_with_the_polling_thread(sim_dir):
    g = SimulatedGPU(0, preset="A100-SXM", energy_update_period_s=0.1, reset_state=True)
    g.set_locked_sm_clock(1005)
    with EnergyPoller(g, interval_s=0.002) as poller:
        time.sleep(0.12)
        insts, truth = _run_workload(g, time.sleep, time.perf_counter, 110, seed=2, mhz=1005)
        time.sleep(0.22)
    res = attribute_energy(poller.updates(), insts)
    for kind, act in KINDS.items():
        assert res.keys[(kind, 1005)].power_w == pytest.approx(A100.busy_power_w(1005, act), rel=0.05)


def test_attribution_reports_bad_input():
    ups = [CounterUpdate(float(t), 100.0 * t) for t in range(4)]
    with pytest.raises(MeasurementError, match="at least 2"):
        attribute_energy(ups[:1], [TimedInstruction("f", 0.1, 0.2)])
    with pytest.raises(MeasurementError, match="overlap"):
        attribute_energy(ups, [TimedInstruction("f", 0.1, 0.6), TimedInstruction("b", 0.5, 0.7)])
    same_mix = [TimedInstruction(k, i + off, i + off + 0.2) for i in range(3)
                for k, off in (("f", 0.1), ("b", 0.3))]
    with pytest.raises(MeasurementError, match="not separable"):
        attribute_energy(ups, same_mix)
    with pytest.raises(MeasurementError, match="outside"):
        attribute_energy(ups, [TimedInstruction("f", 0.1, 0.2), TimedInstruction("late", 10, 11)])


@pytest.mark.parametrize("after_last", list(AfterLast))
def test_the_counter_read_between_and_before_its_updates_is_the_same_either_way(after_last):
    updates = [CounterUpdate(1.0, 10.0), CounterUpdate(1.1, 60.0), CounterUpdate(1.2, 80.0)]
    assert energy_at(updates, 1.05, after_last) == pytest.approx(35.0)
    assert energy_at(updates, 1.1, after_last) == 60.0
    assert energy_at(updates, 0.5, after_last) == energy_at(updates, 1.0, after_last) == 10.0
    assert energy_at(updates[:1], 3.0, after_last) == 10.0
    assert math.isnan(energy_at([], 1.0, after_last))


def test_after_the_last_update_the_counter_holds_or_goes_on_at_the_last_power():
    updates = [CounterUpdate(1.0, 10.0), CounterUpdate(1.1, 60.0), CounterUpdate(1.2, 80.0)]
    assert energy_at(updates, 1.25, AfterLast.HOLD) == 80.0
    assert energy_at(updates, 1.25, AfterLast.EXTEND) == pytest.approx(90.0)  # 200 W, the last interval's


def test_blocking_power_single_device(sim_dir):
    vc = VirtualClock()
    g = SimulatedGPU(0, energy_update_period_s=0.1, reset_state=True, clock=vc.now, sleep=vc.sleep)
    r = measure_blocking_power(g, 1.0, clock=vc.now, sleep=vc.sleep)
    assert r.power_w == pytest.approx(83.64, rel=0.01) and r.window_s >= 1.0 and r.n_updates >= 10
    assert r.instant_power_w == pytest.approx(83.64)
    real = SimulatedGPU(1, preset="A40", energy_update_period_s=0.1, reset_state=True)
    r = measure_blocking_power(real, 0.4)
    assert r.power_w == pytest.approx(70.38, rel=0.03)


def test_blocking_power_times_out_on_a_frozen_counter():
    class Frozen:
        name = "frozen"

        def total_energy_j(self) -> float:
            return 1.0

        def energy_counter_reading(self) -> tuple[float, float | None]:
            return self.total_energy_j(), None

        def power_w(self) -> float:
            return 0.0

    vc = VirtualClock()
    with pytest.raises(MeasurementError, match="did not advance"):
        measure_blocking_power(Frozen(),  # type: ignore[arg-type]  # a stub GPU
                               0.5, clock=vc.now, sleep=vc.sleep, timeout_s=1.0)


def test_cpu_timer_and_timer_choice():
    vc = VirtualClock()
    t = CPUInstructionTimer(vc.now)
    t.begin("f")
    vc.sleep(0.01)
    t.end()
    with pytest.raises(GPUError, match="without a matching begin"):
        t.end()
    t.begin("b")
    with pytest.raises(GPUError, match="still open"):
        t.begin("f")
    vc.sleep(0.02)
    t.end()
    out = t.resolve()
    assert [(i.key, round(i.duration_s, 6)) for i in out] == [("f", 0.01), ("b", 0.02)]
    assert t.resolve() == []
    assert cuda_timing_available() is False  # this machine: CPU torch, no GPU
    assert isinstance(make_instruction_timer(), CPUInstructionTimer)


def test_simulated_kernel_timer_times_the_kernel_not_the_host(sim_dir):
    # Host delays around the kernel (hook cost, a descheduled process) are not the kernel's time;
    # the simulated GPU's own busy section is, as CUDA events would see on a real GPU.
    vc = VirtualClock()
    gpu = SimulatedGPU(0, energy_update_period_s=0.0, reset_state=True, clock=vc.now, sleep=vc.sleep)
    timer = SimulatedKernelTimer(gpu, clock=vc.now)
    gpu.set_locked_sm_clock(900)
    timer.begin("f")
    vc.sleep(0.003)  # host work before the kernel
    gpu.begin_busy()
    kernel_start = vc.now()
    vc.sleep(0.001)  # the CPU work: shorter than the 6 ms max-clock time it stands for
    duration = gpu.end_busy(0.006)
    assert duration == pytest.approx(0.006 * A100.slowdown(900, 0.8))
    assert vc.now() - kernel_start == pytest.approx(duration)  # one wait: start + stretched duration
    vc.sleep(0.004)  # host work after it
    timer.end()
    timer.begin("host-only")  # no busy section: host timestamps
    vc.sleep(0.002)
    timer.end()
    (kernel, host) = timer.resolve()
    assert kernel.start_s == kernel_start and kernel.duration_s == pytest.approx(duration)
    assert host.key == "host-only" and host.duration_s == pytest.approx(0.002)
    gpu.close()


def test_cuda_timer_refuses_without_cuda():
    pytest.importorskip("torch")
    if cuda_timing_available():
        pytest.skip("CUDA is available here")
    from perseus.gpu.meter.timing import CUDAInstructionTimer

    with pytest.raises(GPUError, match="CUDA build"):
        CUDAInstructionTimer()


def test_poller_takes_the_devices_own_update_times():
    # Readings (value, time of the counter's last update): a value that differs only in its last
    # bits at the same update time is no new update; a later update time is, at that time.
    class Device:
        readings = iter([(10.0, 1.0), (10.000000000001, 1.0), (12.5, 1.1), (12.5, 1.1), (15.0, 1.3)])

        def energy_counter_reading(self):
            return next(self.readings)

    poller = EnergyPoller(Device(), clock=iter([5.0, 6.0, 7.0, 8.0, 9.0]).__next__)
    for _ in range(5):
        poller.poll_once()
    assert poller.updates() == [CounterUpdate(1.1, 12.5), CounterUpdate(1.3, 15.0)]
