"""The clock the card sustains under the job's load (issue 33 item 4): sampled on the poller thread
in warm-up, the sweep starts there, clocks above it are recorded equal to it (flagged), the
clock-event reasons seen at each clock are kept in the profile, and old profiles still load."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from perseus.gpu.meter.clock_samples import ClockSample, SustainedClock, sustained_clock
from perseus.gpu.device import ClockEventReason
from perseus.gpu.meter.energy import EnergyPoller
from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.dvfs import H200_DENSE_ACTIVITY, H200_MEMORY_BOUND_ACTIVITY
from perseus.profile import ClockNote, load_csv, load_json, load_profile
from perseus.profile.aggregate import ClockPoint, RankMeasurements, aggregate_profile
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.runtime.measure.clock_sweep import ClockSweep
from perseus.runtime.measure.sustained import agree_start, equal_above
from perseus.runtime.plane.collective import Collective

CAP = ClockEventReason.SW_POWER_CAP
IDLE = ClockEventReason.IDLE


def h200(tmp_path: Path, depth: int = 0) -> SimulatedGPU:
    return SimulatedGPU(0, preset="H200", state_dir=tmp_path / "sim", reset_state=True, stream_depth=depth,
                        energy_update_period_s=0.0)


# ---------------------------------------------------------------- sampling on the poller thread

@pytest.mark.parametrize("depth", [0, 4], ids=["synchronous", "asynchronous"])
@pytest.mark.parametrize("activity, expected, reasons", [
    (H200_DENSE_ACTIVITY, 1530, {CAP}), (H200_MEMORY_BOUND_ACTIVITY, 1980, set())], ids=["dense", "memory-bound"])
def test_the_poller_thread_finds_the_clock_the_unlocked_h200_sustains(tmp_path, depth, activity, expected, reasons):
    """Dense work: 1,530 MHz with sw_power_cap, below the 1,980 MHz top; memory-bound: 1,980,
    no reason. The samples are read on the poller's thread, never the caller's."""
    gpu = h200(tmp_path, depth)
    readers: set[int] = set()
    original = gpu.current_sm_clock_mhz

    def watched() -> int | None:
        readers.add(threading.get_ident())
        return original()

    gpu.current_sm_clock_mhz = watched  # type: ignore[method-assign]  # a spy on the reading thread
    poller = EnergyPoller(gpu, 0.002, clock=time.monotonic, clocks=True, clock_every_s=0.002).start()
    try:
        for _ in range(30):
            if depth:
                gpu.stream.launch(0.004, activity=activity)
            else:
                gpu.run_for(0.004, activity=activity)
        if depth:
            gpu.stream.synchronize()
    finally:
        poller.stop()
    found = sustained_clock(poller.clock_samples())
    assert found.mhz == expected < 1980 or found.mhz == expected == 1980
    assert found.reasons == frozenset(reasons)
    assert readers and threading.get_ident() not in readers, "clock reads only on the poller thread"


def test_idle_samples_do_not_count_and_too_few_busy_ones_say_unknown():
    busy = [ClockSample(i, 1530, frozenset({CAP})) for i in range(3)]
    idle = [ClockSample(10 + i, 1980, frozenset({IDLE})) for i in range(10)]
    assert sustained_clock(busy + idle) == SustainedClock(1530, frozenset({CAP}), 3, 13)
    assert sustained_clock(busy[:2] + idle).mhz is None


# ---------------------------------------------------------------- the sweep starts there

def test_the_sweep_starts_at_the_sustained_clock_and_skips_the_clocks_above():
    supported = list(range(1980, 344, -15))
    start = agree_start(Collective(), SustainedClock(1530, frozenset({CAP}), 50, 60), supported)
    assert (start.start_mhz, start.anchors, start.own_mhz) == (1530, (1530,), 1530)
    sweep = ClockSweep(supported, 1, patience=1, coarse_step_mhz=200, start_mhz=start.start_mhz, anchors=start.anchors)
    assert sweep.current_mhz == 1530 and max(sweep.coarse) == 1530
    assert sweep.skipped == [f for f in supported if f > 1530]
    # unknown on a rank: from the top, as before
    assert agree_start(Collective(), SustainedClock(None, frozenset(), 0, 0), supported).start_mhz == 1980


def test_every_stages_sustained_clock_is_measured_even_past_an_early_stop():
    sweep = ClockSweep([1980, 1780, 1580, 1380, 1180], 1, patience=1, start_mhz=1980, anchors=(1980, 1530))
    assert 1530 in sweep.frequencies and sweep.coarse == [1980, 1780, 1580, 1530, 1380, 1180]
    sweep.next_frequency(True)  # energy stopped falling at 1980: the coarse pass ends, the anchor stays
    assert sweep.stopped_early and sweep.queue == [1530]


def test_clocks_above_the_sustained_one_are_recorded_equal_and_flagged():
    grid = [1980, 1830, 1680, 1530, 1380, 1230]
    point = {f: ClockPoint(0.01 * 1530 / min(f, 1530), 5.0 * 1530 / min(f, 1530), 8, 1e-5, 1e-6) for f in grid}
    measured = {(0, "forward"): {f: point[f] for f in (1980, 1530, 1380, 1230)}}  # 1980 ran throttled anyway
    mine = equal_above(measured, 1530, grid)[(0, "forward")]
    assert set(mine) == set(grid) and all(mine[f] == point[1530] for f in (1980, 1830, 1680))
    rank = RankMeasurements(0, 0, 0, {(0, "forward"): mine, (0, "backward"): mine}, 100.0, "H200",
                            sustained_mhz=1530, reasons={1980: ("sw_power_cap",), 1830: ("sw_power_cap",),
                                                         1680: ("sw_power_cap",), 1530: ("sw_power_cap",),
                                                         1380: ("applications_clocks_setting",)})
    profile = aggregate_profile([rank], 1, grid=grid)
    entry = profile.get(0, "forward")
    top = entry.at(1530)
    assert all(entry.at(f) == top for f in (1980, 1830, 1680)), "the all-max point is the sustained clock's"
    assert profile.sustained_mhz == {0: 1530}
    assert profile.clock_notes[(0, 1980)] == ClockNote(frozenset({"sw_power_cap"}), 1530)
    assert profile.clock_notes[(0, 1530)].measured and profile.clock_notes[(0, 1380)].reasons == {
        "applications_clocks_setting"}


# ---------------------------------------------------------------- the profile keeps them

def test_clock_notes_round_trip_through_json_and_csv_and_old_files_still_load(tmp_path):
    grid = [1980, 1530, 1380]
    mine = {(0, k): {f: ClockPoint(0.01, 5.0) for f in grid} for k in ("forward", "backward")}
    rank = RankMeasurements(0, 0, 0, mine, 100.0, "H200", sustained_mhz=1530,
                            reasons={1980: ("sw_power_cap",), 1530: ("sw_power_cap",), 1380: ()})
    profile = aggregate_profile([rank], 1, grid=grid)
    profile.save_json(tmp_path / "p.json")
    profile.save_csv(tmp_path / "p.csv")
    for again in (load_json(tmp_path / "p.json"), load_csv(tmp_path / "p.csv")):
        assert again.clock_notes == profile.clock_notes and again.sustained_mhz == {0: 1530}
    # a profile written before clock notes existed (no such fields or columns) loads as before
    data = json.loads((tmp_path / "p.json").read_text())
    del data["clock_notes"], data["sustained_mhz"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    (tmp_path / "old.csv").write_text("stage,instruction,frequency,time,energy\n0,forward,1410,0.01,5\n"
                                      "0,backward,1410,0.02,9\n")
    for old in ("old.json", "old.csv"):
        loaded = load_profile(tmp_path / old)
        assert loaded.clock_notes == {} and loaded.sustained_mhz == {} and loaded.get(0, "forward").freqs_mhz


# ---------------------------------------------------------------- end to end

def test_a_dense_stage_on_the_simulated_h200_is_profiled_from_its_sustained_clock(tmp_path):
    """The runtime driven directly: warm-up finds 1,530 MHz (sw_power_cap) on the unlocked card;
    the profile's top measured clock is 1,530, the clocks above are equal to it and flagged, and
    each measured clock keeps the reasons seen there."""
    h200(tmp_path).close()
    cfg = PerseusConfig.from_dict({
        "gpu": "sim", "device_index": 0, "cache_dir": None, "mode": "profile", "warmup_steps": 4,
        "p_blocking_w": 110.0, "iters_per_freq": 1, "remeasure_max": 0, "freq_min_mhz": 1300,
        "coarse_step_mhz": 100, "refine_max_clocks": 0, "log_every_steps": 0,
        "sim_gpu": {"state_dir": str(tmp_path / "sim")}})
    job = PipelineJob(num_stages=1, num_microbatches=4, stage=0)
    with PerseusRuntime(job, cfg) as rt:
        kernels = rt.sim_kernels
        assert kernels is not None
        for _ in range(60):  # hang guard
            if rt.phase.value not in ("warmup", "profiling"):
                break
            rt.on_step_begin()
            for inst in rt.schedule.stages[0]:
                rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                kernels.pad(0.004 if inst.kind == "forward" else 0.008)
                rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
            rt.on_step_end()
        events = {what: data for _, what, data in rt.observe.events}
        profile = rt.supply.profile
        visited = rt.supply.profiling.sweep.visited
    assert events["sustained_clock"]["mhz"] == 1530 and events["sustained_clock"]["reasons"] == ["sw_power_cap"]
    assert profile is not None and max(visited) == 1530 == profile.sustained_mhz[0]
    entry = profile.get(0, "backward")
    above = [f for f in entry.freqs_mhz if f > 1530]
    assert above and entry.freqs_mhz[0] == 1980
    assert all(entry.at(f) == entry.at(1530) for f in above)
    # the copies carry what the unlocked card reported in warm-up; measured clocks what it reported
    # locked there (the simulated H200 fits its power limit at a locked 1,530: no cap, the lock's reason)
    assert all(profile.clock_notes[(0, f)] == ClockNote(frozenset({"sw_power_cap"}), 1530) for f in above)
    assert all(profile.clock_notes[(0, f)] == ClockNote(frozenset({"applications_clocks_setting"}))
               for f in visited)
