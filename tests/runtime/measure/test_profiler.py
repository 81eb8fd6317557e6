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
    timed, _ = synthetic_step(0.0)
    t_end = timed[-1].end_s  # the step ends with its last instruction: no work between steps
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


def _backward_only_counter(timed):
    """Counter updates whose energy rises only while backwards run: forwards fit to zero power."""
    updates, e = [], 0.0
    for i in timed:
        e += (POWER[(0, "backward")] if i.key == (0, "backward") else 0.0) * i.duration_s
        updates.append(CounterUpdate(i.end_s, e))
    return updates


def test_a_kind_the_regression_gives_no_power_takes_its_per_step_energy():
    # Counter readings that make the fit give forwards no power (a busy machine's noisy intervals),
    # with no P_blocking to hold it at: the profile would hold a zero energy, which no profile file
    # accepts; per-step attribution gives it the step's busy energy shared by time instead.
    rec = SweepRecorder(sorted(POWER))
    timed, _ = synthetic_step(0.0)
    t_end = timed[-1].end_s
    rec.add_step(timed, t_end, true_energy(timed, t_end), 0.0)
    rec.finish_frequency(1410, _backward_only_counter(timed), 0.0)
    for key in POWER:
        t, energy = rec.measurements[key][1410][:2]
        assert energy > 0 and t > 0, (key, t, energy)
    assert any("no positive energy" in r for r in rec.fallback_reasons), rec.fallback_reasons


def test_a_power_below_p_blocking_is_held_there_and_said():
    # The same counter with P_blocking known: a GPU running work draws at least that, so the
    # forward's power is held at it, its point says so and one note names it.
    rec = SweepRecorder(sorted(POWER))
    timed, _ = synthetic_step(0.0)
    t_end = timed[-1].end_s
    rec.add_step(timed, t_end, true_energy(timed, t_end), P_BLOCK)
    rec.finish_frequency(1410, _backward_only_counter(timed), P_BLOCK)
    fwd = rec.measurements[(0, "forward")][1410]
    assert fwd.energy_j / fwd.time_s == pytest.approx(P_BLOCK)
    assert fwd.bound_w == pytest.approx(P_BLOCK) and rec.measurements[(0, "backward")][1410].bound_w == 0.0
    [note] = rec.notes
    assert note.startswith("1410 MHz: forward chunk 0 fitted ") and note.endswith(" W, held at P_blocking (80 W)")
    assert not rec.fallback_reasons


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


@pytest.mark.parametrize("marked", [False, True], ids=["host-timed", "gpu-timeline"])
def test_work_between_steps_has_its_own_power_not_the_instructions(marked):
    # After each step's last instruction 40 ms of optimizer at 450 W: its own column, so neither
    # the instructions nor P_blocking take its energy. The GPU timeline marks it; a host-timed
    # step's is from its last instruction to the step's end.
    from perseus.gpu.stream.gpu_time import NON_INSTRUCTION

    power = {**POWER, NON_INSTRUCTION: 450.0}
    rec = SweepRecorder(sorted(POWER), power_limit_w=700.0)
    everything, t = [], 0.0
    for _ in range(8):
        first = t
        timed = []
        for kind in ["forward"] * 2 + ["forward", "backward"] * 4 + ["backward"] * 2:
            d = 0.004 if kind == "forward" else 0.008
            timed.append(TimedInstruction((0, kind), t, t + d))
            t += d
        tail = TimedInstruction(NON_INSTRUCTION, t, t + 0.040)
        t += 0.040
        everything += timed + [tail]
        rec.add_step(timed + [tail] if marked else timed, t - first, None, P_BLOCK)

    def energy(at):
        return P_BLOCK * at + sum((power[i.key] - P_BLOCK) * max(0.0, min(at, i.end_s) - i.start_s) for i in everything)

    updates = [CounterUpdate(k * 0.0231, energy(k * 0.0231)) for k in range(int(t / 0.0231) + 1)]
    rec.finish_frequency(1410, updates, P_BLOCK)
    for key, watts in POWER.items():
        point = rec.measurements[key][1410]
        assert point.energy_j / point.time_s == pytest.approx(watts, rel=0.01), key
    between = rec.between_steps[1410]
    assert between.fitted and between.time_s == pytest.approx(0.040)
    assert between.power_w == pytest.approx(450.0, rel=0.01) and between.energy_j == pytest.approx(18.0, rel=0.01)


def test_the_power_limit_ceiling_is_the_cards_and_unknown_where_it_cannot_be_read():
    from perseus.gpu.errors import GPUNotSupportedError
    from perseus.runtime.measure.instruction_samples import power_limit_of

    class Card:
        def __init__(self, reading):
            self.reading = reading

        def power_limit_w(self):
            if isinstance(self.reading, Exception):
                raise self.reading
            return self.reading

    assert power_limit_of(Card(700.0)) == 700.0
    assert power_limit_of(Card(GPUNotSupportedError("no power limit on this card"))) is None
    assert power_limit_of(Card(0.0)) is None and power_limit_of(None) is None
