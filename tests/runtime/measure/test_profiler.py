"""Energy attribution during the sweep: counter-interval regression, and its per-step fallback."""

import pytest

from perseus.gpu.meter.energy import CounterUpdate
from perseus.gpu.meter.timing import TimedInstruction
from perseus.runtime.measure.instruction_samples import SweepRecorder

POWER = {(0, "forward"): 200.0, (0, "backward"): 300.0}
P_BLOCK = 80.0


def synthetic_step(t0):
    """forward 4 ms, idle 1 ms, backward 8 ms, idle 2 ms, ... (varied mix)."""
    timed, t = [], t0
    for fwd, bwd, gap in ((0.004, 0.008, 0.001), (0.003, 0.006, 0.002), (0.005, 0.009, 0.0015)):
        timed.append(TimedInstruction((0, "forward"), t, t + fwd))
        t += fwd + gap
        timed.append(TimedInstruction((0, "backward"), t, t + bwd))
        t += bwd + gap
    return timed, t


def true_energy(timed, t):
    e = P_BLOCK * t
    for inst in timed:
        if inst.start_s < t:
            e += (POWER[inst.key] - P_BLOCK) * (min(t, inst.end_s) - inst.start_s)
    return e


def test_regression_recovers_power_per_kind():
    rec = SweepRecorder(sorted(POWER))
    all_timed, t = [], 0.0
    for _ in range(3):
        timed, t_end = synthetic_step(t)
        rec.add_step(timed, t_end - t, 0.0, P_BLOCK)
        all_timed += timed
        t = t_end
    updates = [CounterUpdate(k * 0.0023, true_energy(all_timed, k * 0.0023)) for k in range(int(t / 0.0023))]
    energies = rec.finish_frequency(1410, updates, P_BLOCK)
    assert not rec.fallback_reasons
    fwd_t, fwd_e = rec.measurements[(0, "forward")][1410][:2]
    assert fwd_t == pytest.approx(0.004)
    assert fwd_e == pytest.approx(200.0 * 0.004, rel=0.02)
    assert energies[(0, "backward")] == pytest.approx(300.0 * rec.measurements[(0, "backward")][1410][0], rel=0.02)


def test_falls_back_to_step_attribution_when_counter_too_coarse():
    rec = SweepRecorder(sorted(POWER))
    timed, t_end = synthetic_step(0.0)
    busy = sum(i.duration_s for i in timed)
    step_energy = true_energy(timed, t_end)
    rec.add_step(timed, t_end, step_energy, P_BLOCK)
    energies = rec.finish_frequency(1200, [CounterUpdate(0.0, 0.0)], P_BLOCK)
    assert rec.fallback_reasons and "1200 MHz" in rec.fallback_reasons[0]
    # busy energy is shared by time: both kinds get the mean busy power
    mean_busy_power = (step_energy - P_BLOCK * (t_end - busy)) / busy
    fwd_t, fwd_e = rec.measurements[(0, "forward")][1200][:2]
    assert fwd_e == pytest.approx(mean_busy_power * fwd_t)
    assert set(energies) == set(POWER)


def test_one_stretched_instruction_does_not_make_a_clock_look_slow():
    # Nine 4 ms forwards and one stretched to 160 ms (the process descheduled on a busy node): the
    # recorded time is the typical 4 ms, and the energy is the measured power over that time.
    rec = SweepRecorder([(0, "forward")])
    timed, t = [], 0.0
    for d in [0.004] * 4 + [0.160] + [0.004] * 5:
        timed.append(TimedInstruction((0, "forward"), t, t + d))
        t += d + 0.001
    power = 200.0
    busy = sum(i.duration_s for i in timed)
    rec.add_step(timed, t, power * busy + P_BLOCK * (t - busy), P_BLOCK)
    rec.finish_frequency(1410, None, P_BLOCK)
    fwd_t, fwd_e = rec.measurements[(0, "forward")][1410][:2]
    assert fwd_t == pytest.approx(0.004)
    assert fwd_e == pytest.approx(power * 0.004)


def test_a_kind_the_regression_gives_no_power_takes_its_per_step_energy():
    # Counter readings that make the fit give forwards no power (a busy machine's noisy intervals):
    # the profile would hold a zero energy, which no profile file accepts; per-step attribution
    # gives it the step's busy energy shared by time instead.
    rec = SweepRecorder(sorted(POWER))
    timed, t_end = synthetic_step(0.0)
    step_energy = true_energy(timed, t_end)
    rec.add_step(timed, t_end, step_energy, P_BLOCK)
    fwd = [i for i in timed if i.key == (0, "forward")]
    # counter updates whose energy rises only while backwards run: forwards fit to zero power
    updates, e = [], 0.0
    for i in timed:
        e += (POWER[(0, "backward")] if i.key == (0, "backward") else 0.0) * i.duration_s
        updates.append(CounterUpdate(i.end_s, e))
    rec.finish_frequency(1410, updates, P_BLOCK)
    for key in POWER:
        t, energy = rec.measurements[key][1410][:2]
        assert energy > 0 and t > 0, (key, t, energy)
    assert fwd and any("no positive energy" in r for r in rec.fallback_reasons), rec.fallback_reasons


def _step(t0, fwd, bwd, n=4):
    timed, t = [], t0
    for _ in range(n):
        timed.append(TimedInstruction((0, "forward"), t, t + fwd))
        t += fwd
        timed.append(TimedInstruction((0, "backward"), t, t + bwd))
        t += bwd
    return timed, t


def test_slow_first_iteration_after_a_clock_change_is_dropped_and_samples_recorded():
    """The issue: every clock's first iteration 25-35 % slower. It must not set the clock's time."""
    rec = SweepRecorder(sorted(POWER))
    t = 0.0
    for i, (fwd, bwd) in enumerate(((0.0052, 0.0104), (0.0040, 0.0080), (0.00401, 0.00799))):
        timed, t_end = _step(t, fwd, bwd)
        rec.add_step(timed, t_end - t, 10.0, P_BLOCK, first=i == 0)
        t = t_end
    rec.finish_frequency(1410, None, P_BLOCK)
    point = rec.measurements[(0, "forward")][1410]
    assert point.time_s == pytest.approx(0.004, rel=0.01), "the slow first iteration did not count"
    assert point.samples == 8 and point.spread_s >= 0 and point.se_s >= 0
    assert rec.first_dropped == [1410]


def test_first_iteration_like_the_others_is_kept():
    rec = SweepRecorder(sorted(POWER))
    t = 0.0
    for i in range(3):
        timed, t_end = _step(t, 0.004 + 1e-5 * i, 0.008)
        rec.add_step(timed, t_end - t, 10.0, P_BLOCK, first=i == 0)
        t = t_end
    rec.finish_frequency(1410, None, P_BLOCK)
    assert rec.measurements[(0, "forward")][1410].samples == 12 and rec.first_dropped == []
