"""The clock the unlocked card sustains per instruction kind: warm-up's clock samples attributed to
the instruction spans that hold them, agreed across ranks (the sweep starts at the highest kind's,
every kind's is an anchor), each kind's clocks above its own recorded equal to it, and carried into
the profile as the kind's unlocked point (old profiles still load)."""

from __future__ import annotations

import json

import pytest

from perseus.gpu.device import ClockEventReason
from perseus.gpu.meter.clock_samples import ClockSample, KindLoad, SustainedClock, kind_loads, sustained_clock
from perseus.gpu.meter.timing import TimedInstruction
from perseus.profile import load_json, load_profile
from perseus.profile.aggregate import ClockPoint, KindWarmup, RankMeasurements, aggregate_profile
from perseus.runtime.measure.clock_sweep import ClockSweep
from perseus.runtime.measure.sustained import agree_start, equal_above, kind_warmups
from perseus.runtime.plane.collective import Collective

CAP = ClockEventReason.SW_POWER_CAP
IDLE = ClockEventReason.IDLE
FWD, BWD = (0, "forward"), (0, "backward")
GRID = [1980, 1830, 1680, 1530, 1380, 1230]


def warmup() -> tuple[list[ClockSample], list[TimedInstruction]]:
    """Two 1F1B-like warm-up steps: memory-bound forwards at 1,980 MHz, dense backwards at 1,530
    under the cap, idle gaps between them (sampled every 2 ms)."""
    spans, samples, t = [], [], 0.0
    for _ in range(2):
        for key, length, mhz, reasons in ((FWD, 0.012, 1980, frozenset()), (BWD, 0.030, 1530, frozenset({CAP}))) * 4:
            spans.append(TimedInstruction(key, t, t + length))
            samples += [ClockSample(t + 0.001 + 0.002 * i, mhz, reasons) for i in range(int(length / 0.002))]
            t += length
            samples.append(ClockSample(t + 0.0005, 1980, frozenset({IDLE})))  # between instructions
            t += 0.001
    return samples, spans


def test_samples_are_attributed_to_the_kind_whose_instructions_hold_them():
    samples, spans = warmup()
    card = sustained_clock(samples)
    assert card.mhz == 1530, "the card's median is the dense kind's: the memory-bound kind's is lost"
    loads = kind_loads(samples, [*spans, TimedInstruction("__instructions__", 0.0, 1.0)])  # a step's span: no kind
    assert set(loads) == {FWD, BWD}
    assert loads[FWD].clock.mhz == 1980 and loads[FWD].clock.reasons == frozenset()
    assert loads[BWD].clock.mhz == 1530 and loads[BWD].clock.reasons == {CAP}
    assert loads[FWD].durations_s == pytest.approx([0.012] * 8) and len(loads[BWD].durations_s) == 8
    few = kind_loads(samples[:2], spans[:1])
    assert few[FWD].clock.mhz is None, "too few samples inside a kind's instructions: unknown"


def loaded(card: int | None = 1530, forward: int | None = 1980, backward: int | None = 1530) -> SustainedClock:
    def load(mhz: int | None) -> KindLoad:
        return KindLoad(SustainedClock(mhz, frozenset(), 10, 10), (0.012, 0.012, 0.013))

    return SustainedClock(card, frozenset({CAP}), 30, 30, {FWD: load(forward), BWD: load(backward)})


def test_the_sweep_starts_at_the_highest_kinds_clock_and_every_kinds_is_an_anchor():
    start = agree_start(Collective(), loaded(), GRID)
    assert start.start_mhz == 1980, "the card's median (1,530) would skip the memory-bound kind's clocks"
    assert start.anchors == (1980, 1530) and start.own_mhz == 1980
    assert start.own_for(FWD) == 1980 and start.own_for(BWD) == 1530 and start.own_for((0, "other")) == 1980
    sweep = ClockSweep(GRID, 1, start_mhz=start.start_mhz, anchors=start.anchors)
    assert sweep.skipped == [] and 1530 in sweep.coarse
    unknown = agree_start(Collective(), loaded(forward=None), GRID)
    assert unknown.own_for(FWD) == 1530, "a kind warm-up could not attribute takes the card's clock"
    assert agree_start(Collective(), loaded(card=None, forward=None, backward=None), GRID).start_mhz == 1980


def test_each_kinds_clocks_above_its_own_are_equal_to_its_own():
    point = {f: ClockPoint(0.01 * 1980 / f, 5.0 * f / 1980) for f in GRID}
    measured = {FWD: dict(point), BWD: dict(point)}
    out = equal_above(measured, 1980, GRID, {FWD: 1980, BWD: 1530})
    assert out[FWD] == point, "the memory-bound kind keeps every measured clock"
    assert all(out[BWD][f] == point[1530] for f in (1980, 1830, 1680)) and out[BWD][1380] == point[1380]


def rank(kinds: dict, sustained: int = 1980) -> RankMeasurements:
    time = {FWD: lambda f: 0.012 * (0.3 * 1980 / f + 0.7), BWD: lambda f: 0.030 * 1530 / min(f, 1530)}
    power = {FWD: lambda f: 150 + 350 * (f / 1980) ** 3, BWD: lambda f: 100 + 600 * (min(f, 1530) / 1980) ** 3}
    measured = {key: {f: ClockPoint(time[key](f), time[key](f) * power[key](f), 8, 1e-5, 1e-6) for f in GRID}
                for key in (FWD, BWD)}
    return RankMeasurements(0, 0, 0, measured, 110.0, "H200", sustained_mhz=sustained, kinds=kinds)


def test_the_profile_carries_each_kinds_unlocked_point():
    warm = {FWD: KindWarmup(1980, ClockPoint(0.0119, 0.0, 8, 1e-5, 1e-6)), BWD: KindWarmup(1530, None)}
    profile = aggregate_profile([rank(warm)], 1, grid=GRID)
    fwd, bwd = profile.get(0, "forward"), profile.get(0, "backward")
    assert fwd.at(1980)[0] < fwd.at(1530)[0], "the memory-bound kind's top clock is measured, not a copy"
    assert fwd.unlocked is not None and (fwd.unlocked.time_s, fwd.unlocked.sustained_mhz) == (0.0119, 1980)
    assert fwd.unlocked.energy_j == pytest.approx(fwd.at(1980)[1] / fwd.at(1980)[0] * 0.0119), "at the clock's power"
    assert bwd.unlocked is not None and bwd.unlocked.sustained_mhz == 1530
    assert (bwd.unlocked.time_s, bwd.unlocked.energy_j) == bwd.at(1530), "untimed in warm-up: its clock's point"
    assert all(bwd.at(f) == bwd.at(1530) for f in (1980, 1830, 1680))
    assert profile.sustained_mhz == {0: 1980}


def test_a_stage_takes_the_highest_kind_clock_of_its_gpus_and_the_slowest_tensor_parallel_time():
    a = rank({FWD: KindWarmup(1980, ClockPoint(0.012, 0.0)), BWD: KindWarmup(1500, ClockPoint(0.031, 0.0))})
    b = rank({FWD: KindWarmup(1965, ClockPoint(0.013, 0.0)), BWD: KindWarmup(1530, ClockPoint(0.030, 0.0))})
    b.tp_rank = 1
    profile = aggregate_profile([a, b], 1, tp_size=2, grid=[*GRID, 1500, 1965])
    assert profile.get(0, "backward").unlocked.sustained_mhz == 1530
    assert profile.get(0, "forward").unlocked.time_s == pytest.approx(0.013)


def test_kind_warmups_are_the_ranks_robust_times_at_default_clocks():
    start = agree_start(Collective(), loaded(), GRID)
    warm = kind_warmups(start, loaded(), [FWD, BWD, (0, "untimed")])
    assert warm[FWD].mhz == 1980 and warm[FWD].point.time_s == pytest.approx(0.012)
    assert warm[(0, "untimed")] == KindWarmup(1980, None)


def test_unlocked_points_round_trip_through_json_and_older_profiles_load_without(tmp_path):
    warm = {FWD: KindWarmup(1980, ClockPoint(0.0119, 0.0)), BWD: KindWarmup(1530, None)}
    profile = aggregate_profile([rank(warm)], 1, grid=GRID)
    profile.save_json(tmp_path / "p.json")
    again = load_json(tmp_path / "p.json")
    assert again.get(0, "forward").unlocked == profile.get(0, "forward").unlocked
    assert again.get(0, "backward").unlocked == profile.get(0, "backward").unlocked
    data = json.loads((tmp_path / "p.json").read_text())
    del data["unlocked"]  # as written before unlocked points existed
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert load_profile(tmp_path / "old.json").get(0, "forward").unlocked is None
    data["unlocked"] = [{"stage": 0, "chunk": 0, "kind": "forward", "time_s": -1, "energy_j": 1}]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(Exception, match=r"unlocked\[0\]: the unlocked time must be a positive"):
        load_json(tmp_path / "bad.json")
