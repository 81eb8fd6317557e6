"""Attribution that says only what the counter supports: the window each update measured (a
part-time meter), one power for a stage's kinds unless the data identify a split, and no power
outside [P_blocking, the power limit]. Counters here are synthetic: known powers, a known meter."""

from __future__ import annotations

import random

import numpy as np
import pytest

from perseus.gpu.meter.counter import CounterUpdate, counter_grid
from perseus.gpu.meter.energy import attribute_energy
from perseus.gpu.meter.power_split import SplitTest, merge
from perseus.gpu.meter.timing import TimedInstruction

P_BLOCK = 110.0
LIMIT = 700.0
KINDS = ("forward", "backward")


def steps_1f1b(n_steps: int, f_s: float, b_s: float, tail_s: float, *, warm: int = 0, micro: int = 8,
               host_gap_s: float = 0.003) -> list[TimedInstruction]:
    """Steps of one stage's 1F1B order (``warm`` forwards first), work between steps after each."""
    out, t = [], 0.05
    for _ in range(n_steps):
        order = ["forward"] * warm + ["forward", "backward"] * (micro - warm) + ["backward"] * warm
        for kind in order:
            d = f_s if kind == "forward" else b_s
            out.append(TimedInstruction(kind, t, t + d))
            t += d
        if tail_s:
            out.append(TimedInstruction("between", t, t + tail_s))
            t += tail_s
        t += host_gap_s
    return out


def counter(timed: list[TimedInstruction], power: dict[str, float], *, period: float = 0.1, fraction: float = 1.0,
            lag_s: float = 0.0, jitter_s: float = 0.0, noise: float = 0.0, seed: int = 0) -> list[CounterUpdate]:
    """A counter updating every ``period``: each update books ``fraction`` of the period before
    it (from its start) scaled to the whole period, appears up to ``lag_s`` late, is seen within
    ``jitter_s`` (the poller), with relative ``noise``."""
    rng = random.Random(seed)
    starts = np.array([i.start_s for i in timed])
    ends = np.array([i.end_s for i in timed])
    excess = np.array([power[i.key] - P_BLOCK for i in timed])

    def energy(t: float) -> float:
        return P_BLOCK * t + float(np.sum(excess * np.clip(np.minimum(ends, t) - starts, 0.0, None)))

    out, total = [], 0.0
    k = 1
    while (k + 1) * period < timed[-1].end_s:
        b = k * period + 0.0137  # the counter's own phase
        booked = (energy(b + fraction * period) - energy(b)) / fraction
        total += booked * (1 + rng.gauss(0.0, noise))
        seen = b + period + rng.uniform(0.0, lag_s) + rng.uniform(-jitter_s, jitter_s)
        out.append(CounterUpdate(seen, total))
        k += 1
    return out


def energy_of(result, key: str) -> float:
    return result.keys[key].power_w


def test_a_part_time_meter_is_read_as_one_and_its_powers_come_out_right():
    # The simulated H200-hostile's meter: a quarter of each period sampled, up to 10 ms late, 1 %
    # noise; a memory-bound forward, a dense backward, work between steps at its own power.
    power = {"forward": 285.0, "backward": 695.0, "between": 450.0}
    timed = steps_1f1b(12, 0.0106, 0.0247, 0.041)
    updates = counter(timed, power, fraction=0.25, lag_s=0.010, jitter_s=0.0025, noise=0.01, seed=3)
    got = attribute_energy(updates, timed, idle_power_w=P_BLOCK, shared=KINDS, power_limit_w=LIMIT)
    assert not got.window.whole and got.window.fraction == 0.25, got.window
    assert not got.shared
    for key, watts in power.items():
        assert energy_of(got, key) == pytest.approx(watts, rel=0.03), (key, got.keys[key])


def test_an_integrating_counter_is_read_over_whole_periods():
    # (on its fitted grid, which the poller's jitter does not move, or the observed updates)
    power = {"forward": 300.0, "backward": 650.0, "between": 450.0}
    timed = steps_1f1b(12, 0.0106, 0.0247, 0.041, warm=3)
    updates = counter(timed, power, jitter_s=0.0025, noise=0.01, seed=4)
    got = attribute_energy(updates, timed, idle_power_w=P_BLOCK, shared=KINDS, power_limit_w=LIMIT)
    assert got.window.fraction == 1.0 and abs(got.window.offset) <= 0.05, got.window
    assert not got.shared  # the warm-up forwards and cool-down backwards identify the split: kept
    for key, watts in power.items():
        assert energy_of(got, key) == pytest.approx(watts, rel=0.03), (key, got.keys[key])


def test_an_unidentified_split_collapses_to_the_stage_power():
    # Strictly alternating forwards and backwards drawing the same 690 W (a real H200's dense
    # stage): every interval holds them in about the same proportion, so the counter cannot split
    # them. Alone, the fit's split is noise; the rule gives both the one fitted stage power.
    power = {"forward": 690.0, "backward": 690.0, "between": 450.0}
    timed = steps_1f1b(10, 0.0112, 0.0224, 0.035)
    updates = counter(timed, power, jitter_s=0.0025, noise=0.02, seed=11)
    alone = attribute_energy(updates, timed, idle_power_w=P_BLOCK)
    assert abs(energy_of(alone, "forward") - energy_of(alone, "backward")) > 25.0  # the noise a split would keep
    got = attribute_energy(updates, timed, idle_power_w=P_BLOCK, shared=KINDS)
    assert got.shared and got.split is not None and got.split.statistic < got.split.threshold
    assert energy_of(got, "forward") == energy_of(got, "backward") == pytest.approx(690.0, rel=0.02)
    assert got.keys["forward"].power_stderr_w == got.keys["backward"].power_stderr_w > 0


def test_no_power_is_attributed_above_the_power_limit():
    # A counter that books more than the card may draw while backwards run (855 W was accepted
    # on a 700 W card): held at the limit, said, and the other columns refit around it.
    power = {"forward": 400.0, "backward": 855.0, "between": 450.0}
    timed = steps_1f1b(10, 0.0106, 0.0247, 0.041, warm=3)
    updates = counter(timed, power, noise=0.005, seed=5)
    free = attribute_energy(updates, timed, idle_power_w=P_BLOCK, shared=KINDS)
    assert energy_of(free, "backward") > LIMIT
    got = attribute_energy(updates, timed, idle_power_w=P_BLOCK, shared=KINDS, power_limit_w=LIMIT)
    assert energy_of(got, "backward") == pytest.approx(LIMIT)
    assert set(got.clamped) == {"backward"}
    fitted, held = got.clamped["backward"]
    assert fitted == pytest.approx(energy_of(free, "backward")) and held == pytest.approx(LIMIT)
    assert all(P_BLOCK <= k.power_w <= LIMIT for k in got.keys.values())


def test_a_counter_off_any_grid_is_read_on_whole_intervals():
    times = [0.1, 0.2, 0.33, 0.38, 0.55, 0.6]  # not one period, however counted
    assert counter_grid(times) is None
    regular = [0.0137 + 0.1 * k + 0.004 * (k % 3) for k in range(1, 12)]
    seen = regular[:5] + regular[6:]  # one update missed
    seen[7] += 0.035  # and one seen late (a descheduled poller): off the grid, the grid holds
    found = counter_grid(seen)
    assert found is not None and found.period == pytest.approx(0.1, rel=5e-3)
    assert list(found.k) == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    assert found.at[7] - found.at[0] == pytest.approx(0.8, abs=5e-3) and not found.on[7] and found.on.sum() == 9
    # a poller stalled for most of a second (updates seen 30-160 ms late, some not at all): the
    # count of periods after it stays right
    longer = [0.0137 + 0.1 * k + 0.004 * (k % 3) for k in range(1, 31)]
    late = {9: 0.035, 11: 0.045, 13: 0.03}
    stalled = [t + late.get(i, 0.0) for i, t in enumerate(longer) if i not in (10, 12)]
    found = counter_grid(stalled)
    assert found is not None and list(found.k) == [k for k in range(30) if k not in (10, 12)]
    assert [int(k) for k, on in zip(found.k, found.on) if not on] == [9, 11, 13]


def test_merge_sums_the_members_and_maps_every_column():
    a = np.arange(12.0).reshape(3, 4)
    merged, where = merge(a, [1, 3])
    assert merged.shape == (3, 3) and where == [0, 1, 2, 1]
    assert list(merged[:, 1]) == list(a[:, 1] + a[:, 3])
    assert SplitTest(5.0, 3.84).identified and not SplitTest(3.0, 3.84).identified


def h200_recording() -> tuple[list[CounterUpdate], list[TimedInstruction], dict[str, float]]:
    """26 1F1B steps of a GPT-like stage on a real H200 (``scripts/gpu_check.py``'s attribution
    part): the counter as the poller saw it, each instruction's span from CUDA events, the
    optimizer-like work after each step, and each kind's power measured directly in a loop
    (forwards of 10.5 ms, backwards of 25 ms)."""
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).resolve().parents[2] / "data" / "h200_attribution_1f1b.json").read_text())
    updates = [CounterUpdate(t, e) for t, e in data["updates"]]
    timed = [TimedInstruction(k, b, e) for k, b, e in data["spans"]]
    timed += [TimedInstruction("between", last_end, end) for _, last_end, end in data["steps"]]
    return updates, sorted(timed, key=lambda i: i.start_s), data["direct_power_w"]


def test_on_a_real_h200_the_split_the_counter_timing_makes_is_not_taken():
    """Both kinds ran at the power cap (690 / 693 W measured directly). At the observed update
    times the regression splits them 767 / 694 W and passes the test; 10 ms later the split is
    gone. The split is not identified, and the stage power is within 4 % of both."""
    updates, timed, direct = h200_recording()
    at_observed = attribute_energy(updates, timed, shared=KINDS, time_uncertainty=0.0)
    assert at_observed.split is not None and at_observed.split.identified
    assert energy_of(at_observed, "forward") > 1.08 * direct["forward"]
    result = attribute_energy(updates, timed, shared=KINDS)
    assert result.shared
    for kind in KINDS:
        assert energy_of(result, kind) == pytest.approx(direct[kind], rel=0.04)


def test_a_real_split_survives_the_timing_uncertainty():
    """Forward 480 W, backward 690 W, instructions of 40 and 90 ms, on an integrating counter read
    at irregular times (no grid: the times are taken as observed): with the updates 10 ms earlier
    or later the counter still tells them apart."""
    timed = steps_1f1b(12, 0.040, 0.090, 0.030)
    power = {"forward": 480.0, "backward": 690.0, "between": 400.0}
    excess = {k: w - P_BLOCK for k, w in power.items()}
    rng = random.Random(5)
    updates, t = [], 0.06
    while t < timed[-1].end_s:
        e = P_BLOCK * t + sum(excess[i.key] * max(0.0, min(i.end_s, t) - i.start_s) for i in timed)
        updates.append(CounterUpdate(t, e))
        t += rng.uniform(0.05, 0.15)
    result = attribute_energy(updates, timed, idle_power_w=P_BLOCK, shared=KINDS, power_limit_w=LIMIT)
    assert result.window.whole and not result.shared
    assert energy_of(result, "forward") == pytest.approx(480.0, rel=0.03)
    assert energy_of(result, "backward") == pytest.approx(690.0, rel=0.03)
