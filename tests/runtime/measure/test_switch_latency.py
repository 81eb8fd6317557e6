"""The clock-switch latency measured from the profiling sweep's clock changes (``GPUPort.apply``
watching each land, ``profiling_run.switch_latency_of``), recorded in the profile and chosen over
the default, never over a configured one (``plan_supply.latency_in_force``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from perseus.gpu.sim.device import SimulatedGPU
from perseus.profile.model import SwitchLatency
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.runtime.measure.profiling_run import job_switch_latency, switch_latency_of
from perseus.runtime.phases import Phase
from perseus.runtime.port.clock_trace import ClockTrace, SwitchSample, switches_from_dict
from perseus.runtime.port.gpu_port import GPUPort
from perseus.runtime.supply.plan_supply import latency_in_force

CLOCKS = (1530, 1200, 1800, 1410, 1980, 1305)  # down and up, to several clocks


def _port(tmp_path: Path, latency_s: float) -> GPUPort:
    return GPUPort.open("sim", 0, {"state_dir": str(tmp_path / "sim"), "reset_state": True, "preset": "H200",
                                   "switch_latency_s": latency_s}, control=True)


@pytest.mark.parametrize("latency_s", [0.008, 0.015])
def test_apply_measures_the_simulated_latency_within_30_percent(tmp_path: Path, latency_s: float) -> None:
    port = _port(tmp_path, latency_s)
    port.trace = ClockTrace()
    try:
        for mhz in CLOCKS:
            port.apply(mhz)
    finally:
        port.close()
    measured = switch_latency_of(port.switch_samples)
    assert measured is not None and measured.samples == len(CLOCKS)
    assert abs(measured.seconds - latency_s) <= 0.3 * latency_s, measured
    assert [(s.from_mhz, s.to_mhz) for s in port.switch_samples][:2] == [(1980, 1530), (1530, 1200)]
    assert port.reports_clock is True
    # the clock trace keeps them too: the latency on any backend that reports its clock
    saved = switches_from_dict(port.trace.to_dict())
    assert saved == list(port.switch_samples)


def test_an_instant_switch_measures_below_the_requests_lead(tmp_path: Path) -> None:
    """No latency: the clock is in effect at the first read, and the midpoint says well under 1 ms,
    so a zero-latency GPU keeps its plans and requests as they were (``latency_in_force``)."""
    port = _port(tmp_path, 0.0)
    try:
        for mhz in CLOCKS:
            port.apply(mhz)
    finally:
        port.close()
    measured = switch_latency_of(port.switch_samples)
    assert measured is not None and measured.seconds < 0.001
    assert latency_in_force(0.0, measured, "profiling", None).source == "default"


def test_no_sample_where_the_clock_does_not_change_or_the_device_cannot_tell(tmp_path: Path) -> None:
    port = _port(tmp_path, 0.005)
    try:
        port.apply(1530)
        port.apply(1530)  # already there: not a switch
        assert len(port.switch_samples) == 1
        device: Any = port.device
        device.locked_sm_clock_mhz = lambda: None  # a backend that cannot tell its clock
        port.apply(1200, settle_timeout_s=0.01)
        assert len(port.switch_samples) == 1 and port.reports_clock is False
    finally:
        port.close()


def test_a_sample_is_the_midpoint_of_the_poll_interval_that_saw_the_change() -> None:
    sample = SwitchSample(1980, 1530, requested_s=10.0, before_s=10.008, seen_s=10.009)
    assert sample.latency_s == pytest.approx(0.0085)
    assert SwitchSample(1980, 1530, 10.0, 10.0, 10.0002).latency_s == pytest.approx(0.0001)
    assert switch_latency_of([sample, sample]) is None  # too few changes to say


class _Ranks:
    """Two ranks' answers to the all-gather, as the control plane returns them."""

    def __init__(self, other: list[float]) -> None:
        self.other = other

    def all_gather_floats(self, values: list[float]) -> list[list[float]]:
        return [list(values), self.other]


def test_the_jobs_latency_is_the_slowest_cards_with_every_ranks_switches() -> None:
    mine = SwitchLatency(0.008, 5)
    ranks: Any = _Ranks([0.012, 4.0])  # a stand-in for the control plane's all-gather
    assert job_switch_latency(ranks, mine) == SwitchLatency(0.012, 9)
    none_there: Any = _Ranks([0.0, 0.0])  # the other rank measured none
    assert job_switch_latency(none_there, mine) == mine
    assert job_switch_latency(none_there, None) is None


def test_configured_before_measured_before_zero() -> None:
    measured = SwitchLatency(0.010, 6)
    configured = latency_in_force(0.02, measured, "profiling", None)
    assert (configured.seconds, configured.source) == (0.02, "configured")
    used = latency_in_force(0.0, measured, "profiling", None)
    assert (used.seconds, used.source, used.measured) == (0.010, "measured", measured)
    hidden_nowhere = latency_in_force(0.0, measured, "profile", "switch_ahead is off")
    assert (hidden_nowhere.seconds, hidden_nowhere.source) == (0.0, "default")
    assert hidden_nowhere.note == "switch_ahead is off"
    none = latency_in_force(0.0, None, "profiling", "the GPU does not report its applied clock")
    assert (none.seconds, none.source) == (0.0, "default") and "does not report" in none.line()


WORK = {"forward": 0.006, "backward": 0.012}
JOB = PipelineJob(num_stages=1, num_microbatches=4, stage=0)


def _profile(tmp_path: Path, latency_s: float, **settings: Any) -> PerseusRuntime:
    """A profiling run on the asynchronous simulated H200 (the GPU timeline), three clocks."""
    state = tmp_path / "sim"
    SimulatedGPU(0, preset="H200", state_dir=state, reset_state=True, stream_depth=6,
                 switch_latency_s=latency_s).close()
    cfg = PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                   "warmup_steps": 2, "p_blocking_w": 110.0, "mode": "profile", "log_every_steps": 0,
                                   "freq_min_mhz": 1200, "freq_max_mhz": 1530, "freq_step_mhz": 165,
                                   "iters_per_freq": 2, "remeasure_max": 0,
                                   "sim_gpu": {"state_dir": str(state), "stream_depth": 6}, **settings})
    rt = PerseusRuntime(JOB, cfg)
    kernels = rt.sim_kernels
    assert kernels is not None
    for _ in range(60):
        rt.on_step_begin()
        for inst in rt.schedule.stages[0]:
            rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
            kernels.pad(WORK[inst.kind])
            rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
        kernels.device.stream.launch(0.01, activity=0.5, tag="tail")
        rt.on_step_end()
        if rt.step > 3 and rt.phase is not Phase.PROFILING:
            break
    for _ in range(2):  # the event is said at the next step's end
        rt.on_step_begin()
        rt.on_step_end()
    return rt


@pytest.mark.parametrize("latency_s", [0.008, 0.015])
def test_profiling_records_the_measured_latency_in_the_profile(tmp_path: Path, latency_s: float) -> None:
    with _profile(tmp_path, latency_s) as rt:
        profile, cache = rt.supply.profile, rt.supply.cache
        assert profile is not None and cache is not None
        measured = profile.switch_latency
        assert measured is not None and measured.samples >= 3
        assert abs(measured.seconds - latency_s) <= 0.3 * latency_s, measured
        assert cache.load_profile().switch_latency == measured  # saved with it: the next run hides it too
        chosen = rt.supply.switch_latency
        assert chosen is not None and (chosen.source, chosen.seconds, chosen.origin) == ("measured", measured.seconds,
                                                                                        "profiling")
        assert rt.supply.planner_options().switch_latency_s == measured.seconds  # what the planner gets
        assert rt.gpu.timeline is not None and rt.gpu.timeline.clocks.switch_latency_s == measured.seconds  # the lead
        events = [data for _, what, data in rt.events if what == "switch_latency"]
        assert [e["source"] for e in events] == ["measured"] and events[0]["measured"]["samples"] == measured.samples
        assert rt.summary()["switch_latency"]["seconds"] == measured.seconds


def test_a_configured_latency_wins_over_the_measured_one(tmp_path: Path) -> None:
    with _profile(tmp_path, 0.008, planner_options={"switch_latency_s": 0.02}) as rt:
        chosen = rt.supply.switch_latency
        assert chosen is not None and chosen.measured is not None  # measured and recorded all the same
        assert (chosen.source, chosen.seconds) == ("configured", 0.02)
        assert rt.supply.planner_options().switch_latency_s == 0.02
        assert rt.gpu.switch_latency_s is None  # the timeline keeps the configured lead it opened with
