"""P_blocking measured in the stage's own pipeline waits while it profiles (``wait_power.py``), the
gloo receive on an idle GPU kept as the fallback, and the profile's notes saying which; and the
work between steps as a profile bucket of its own (``between_steps.py``).

On the simulator a stage whose peer is late spins (``spin_activity``: NCCL's kernel polling) where
its GPU would otherwise idle. The simulator's stream spins through any host gap, so it cannot show
what the gloo receive reads on a real card; the runtime test stands in that value (the model's idle
P_blocking) for the port's measurement, and checks the profile took the spin's power instead."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from perseus.gpu.meter.energy import CounterUpdate
from perseus.gpu.meter.timing import TimedInstruction
from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.dvfs import get_preset
from perseus.gpu.stream.gpu_time import NON_INSTRUCTION
from perseus.profile import InstructionProfile, Profile, profile_from_json_dict
from perseus.profile.aggregate import RankMeasurements
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.runtime.measure import between_steps, wait_power
from perseus.runtime.measure.profiling_run import with_run_notes
from perseus.runtime.measure.wait_power import WaitPower
from perseus.runtime.phases import Phase
from perseus.runtime.port.gpu_port import GPUPort

SPINNING = replace(get_preset("A100-SXM"), spin_activity=0.05)
JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0)
WORK = {"forward": 0.004, "backward": 0.008}
WAIT_S = 0.025  # the host blocked in a receive after each instruction: its peer stage is late


def test_profiled_p_blocking_is_the_spinning_wait_not_the_idle_gpu(tmp_path: Path, monkeypatch) -> None:
    SimulatedGPU(0, model=SPINNING, state_dir=tmp_path / "sim", reset_state=True, stream_depth=4,
                 energy_update_period_s=0.005).close()
    idle = SPINNING.p_blocking_w  # what a gloo receive reads on a real idle card
    monkeypatch.setattr(GPUPort, "measure_p_blocking", lambda self, seconds, channel=None: idle)
    cfg = PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": None, "mode": "profile",
                                   "warmup_steps": 2, "iters_per_freq": 2, "freq_min_mhz": 1200,
                                   "freq_step_mhz": 210, "remeasure_max": 0, "straggler_period_steps": 0,
                                   "log_every_steps": 0,
                                   "sim_gpu": {"state_dir": str(tmp_path / "sim"), "stream_depth": 4}})
    with PerseusRuntime(JOB, cfg) as rt:
        assert rt.sim_kernels is not None
        for _ in range(40):
            rt.on_step_begin()
            for inst in rt.schedule.stages[0]:
                rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                rt.sim_kernels.pad(WORK[inst.kind])
                rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
                time.sleep(WAIT_S)  # the GPU finishes the kernel, then spins until the next one comes
            rt.on_step_end()
            if rt.step > 2 and rt.phase is not Phase.PROFILING:
                break
        profiling, profile = rt.supply.profiling, rt.supply.profile
        summary_p_blocking = rt.summary()["p_blocking_w"]
    assert profiling is not None and profile is not None and rt.phase is Phase.STEADY
    first = profiling.sweep.visited[0]
    spin = SPINNING.busy_power_w(first, SPINNING.spin_activity)  # 114.5 W at 1410 MHz, against 83.6 W idle
    assert profile.p_blocking_w == pytest.approx(spin, rel=0.02)
    assert abs(profile.p_blocking_w - idle) > 20
    assert profile.notes["p_blocking_source"] == wait_power.WAITS
    assert summary_p_blocking == pytest.approx(profile.p_blocking_w)
    # the round trip keeps the notes
    assert profile_from_json_dict(profile.to_json_dict()).notes == profile.notes


def test_waits_are_the_gaps_between_instructions_and_too_short_ones_keep_the_fallback() -> None:
    waits = WaitPower()
    fwd, bwd = TimedInstruction((0, "forward"), 0.0, 0.01), TimedInstruction((0, "backward"), 0.05, 0.07)
    waits.add_step([bwd, fwd, TimedInstruction(NON_INSTRUCTION, 0.07, 0.2)])  # the work between steps is no wait
    assert waits.waits == [(0.01, 0.05)]
    # counter updates every 10 ms at 100 W, 300 W inside the wait: only the stretches inside count
    energy, updates = 0.0, []
    for i in range(21):
        t = 0.01 * i
        updates.append(CounterUpdate(t, energy))
        energy += 0.01 * (300.0 if 0.01 <= t < 0.05 else 100.0)
    power, seconds = waits.power_w(updates)
    assert power == pytest.approx(300.0) and seconds == pytest.approx(0.04)
    coarse = [u for u in updates if round(u.t_s * 100) % 4 == 0]  # a 40 ms counter: one update in the wait
    assert waits.power_w(coarse) is None


def test_the_profile_gets_each_stages_work_between_steps_and_where_p_blocking_came_from() -> None:
    """Tensor-parallel ranks: the slowest time, summed energy; replicas: the mean; clocks all have."""
    def rank(stage: int, tp: int, dp: int, points: dict[int, list[float]], source: str) -> RankMeasurements:
        return RankMeasurements(stage, tp, dp, {}, 100.0, extra={
            between_steps.EXTRA_KEY: {str(f): v for f, v in points.items()}, "p_blocking_source": source})

    ranks = [rank(0, 0, 0, {1410: [0.03, 9.0], 1200: [0.04, 8.0]}, wait_power.WAITS),
             rank(0, 1, 0, {1410: [0.032, 9.0], 1200: [0.041, 8.0]}, wait_power.WAITS),
             rank(0, 0, 1, {1410: [0.034, 11.0], 1200: [0.043, 10.0], 990: [0.05, 7.0]}, wait_power.WAITS),
             rank(0, 1, 1, {1410: [0.03, 11.0], 1200: [0.04, 10.0]}, wait_power.GLOO)]
    base = Profile({(0, 0, kind): InstructionProfile((1410,), (0.01,), (3.0,)) for kind in ("forward", "backward")},
                   400.0)
    profile = with_run_notes(base, ranks)
    entry = profile.between_steps[0]
    assert entry.freqs_mhz == (1410, 1200)
    assert entry.times_s == pytest.approx(((0.032 + 0.034) / 2, (0.041 + 0.043) / 2))
    assert entry.energies_j == pytest.approx((20.0, 18.0))
    assert profile.notes["p_blocking_source"] == f"3 rank(s): {wait_power.WAITS}; 1 rank(s): {wait_power.GLOO}"
    back = profile_from_json_dict(profile.to_json_dict())
    assert back.between_steps == profile.between_steps and back.notes == profile.notes
    # an older file has neither, and loads
    old = base.to_json_dict()
    assert "between_steps" not in old and "notes" not in old
    assert profile_from_json_dict(old).between_steps == {} and profile_from_json_dict(old).notes == {}


def test_a_steps_work_between_steps_is_its_median_time_at_the_measured_power() -> None:
    bucket = between_steps.BetweenSteps()
    for seconds, joules in ((0.03, 12.0), (0.05, 20.0), (0.04, None)):  # one step unmeasured
        bucket.add(seconds, joules)
    assert bucket.finish(1410) == pytest.approx((0.04, 400.0 * 0.04))
    bucket.add(0.0, 0.0)  # no work between steps (a host-timed step without a tail)
    assert bucket.finish(1200) is None and set(bucket.points) == {1410}
