"""A real single-process ``PerseusRuntime`` on a simulated GPU whose energy reads or clock locks fail
mid-run (``SimFaults``): a transient energy outage leaves its steps unmeasured (``energy_j`` null in
the metrics file, never 0 J) and later steps measured again; a dead counter is one line and default
clocks for the rest of the run, measuring time only; a lock refused for good is one line, default
clocks, and the GPU unlocked at exit.

Times are judged as bounds around the fault's window (seconds since the simulated GPU was created),
never as latencies: the checks are on what the runtime decided for the steps it saw."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest

from perseus.frontier import Frontier, FrontierPoint, save_frontier
from perseus.gpu.control.controller import NullController
from perseus.gpu.control.keeper import RETRY_DELAYS_S
from perseus.gpu.meter import read_failures
from perseus.gpu.meter.read_failures import BACKOFF_MAX_S
from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.faults import SimFaults
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.schedules import build_schedule

import local_steps  # the runtime tests' shared helpers (tests/runtime, on the path: its conftest)

JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0)
HANG_STEPS = 20_000  # hang guard (each step is a few ms of sleeps)
HANG_S = 120.0  # hang guard in time, where a test runs until a moment has passed


class Run:
    """The simulated GPU (created now, with ``faults``) and what each step of a run measured."""

    def __init__(self, tmp_path: Path, faults: SimFaults) -> None:
        self.tmp_path = tmp_path
        self.created = time.monotonic()  # at or before the GPU's own creation: ``since`` errs late
        self.device = SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0,
                                   reset_state=True, faults=faults)
        self.steps: list[dict] = []

    def since(self) -> float:
        return time.monotonic() - self.created

    def config(self, depth: int = 0, **kw: object) -> PerseusConfig:
        return PerseusConfig.from_dict({
            "gpu": "sim", "device_index": 0, "cache_dir": None, "warmup_steps": 2, "p_blocking_seconds": 0.05,
            "sim_gpu": {"state_dir": str(self.tmp_path / "sim"), "stream_depth": depth},
            "metrics_file": str(self.tmp_path / "metrics.jsonl"), **kw})

    def step(self, rt: PerseusRuntime) -> dict:
        begin = self.since()
        local_steps.train(rt, 1, 0.002)
        record = {"begin": begin, "end": self.since(), "energy_j": rt.measured.energy_j, "phase": rt.phase.value,
                  "locked": self.device.is_clock_locked(), "events": [what for _, what, _ in rt.observe.events]}
        self.steps.append(record)
        return record

    def rows(self) -> list[dict]:
        lines = (self.tmp_path / "metrics.jsonl").read_text().splitlines()
        return [row for row in map(json.loads, lines) if "event" not in row]


def _frontier(tmp_path: Path) -> str:
    """A one-point plan holding lower clocks (1f1b, one stage, two microbatches)."""
    schedule = build_schedule("1f1b", 1, 2)
    point = FrontierPoint(1.0, 1.0, np.array([1410, 900, 1200, 900]))
    save_frontier(Frontier(schedule, 80.0, 1.0, 2.0, [point]), tmp_path / "f.json")
    return str(tmp_path / "f.json")


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.mark.parametrize("depth", [0, 2], ids=["host-timed", "gpu-timeline"])
def test_an_energy_outage_mid_run_leaves_its_steps_unmeasured_and_later_ones_measured(tmp_path, caplog, depth):
    start, length = 1.5, 0.5
    run = Run(tmp_path, SimFaults(energy_fail_from_s=start, energy_fail_for_s=length))
    recovered = start + length + BACKOFF_MAX_S + 0.3  # the poller's last backoff, and then some
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, run.config(depth, mode="measure-only")) as rt:
            # until three steps began after the recovery, however slow a loaded machine makes them
            while sum(s["begin"] >= recovered for s in run.steps) < 3 and run.since() < HANG_S:
                run.step(rt)
            summary = rt.summary()
    steps = run.steps
    inside = [i for i, s in enumerate(steps) if s["begin"] >= start + 0.05 and s["end"] <= start + length - 0.05]
    after = [i for i, s in enumerate(steps) if s["begin"] >= recovered]
    assert inside and after, "steps ran through the outage and after it"
    assert all(steps[i]["energy_j"] is None for i in inside), "a step the counter did not cover is unmeasured"
    assert all(steps[i]["energy_j"] is not None and steps[i]["energy_j"] > 0 for i in after), "measured again"
    assert not [s for s in steps if s["energy_j"] is not None and s["energy_j"] <= 0], "never 0 J"
    rows = run.rows()
    assert len(rows) == len(steps)
    assert all(rows[i]["energy_j"] is None and rows[i]["saving"] is None for i in inside)  # null in the file
    assert '"energy_j": null' in (tmp_path / "metrics.jsonl").read_text()
    assert all(rows[i]["energy_j"] == pytest.approx(steps[i]["energy_j"]) for i in after)
    steady = summary["phases"]["steady"]
    assert steady["unmeasured_steps"] >= len(inside) and steady["energy_j"] > 0 and steady["median_energy_j"] > 0
    assert summary["baseline"]["energy_j"] > 0
    assert _lines(caplog, "energy unmeasured"), "the step line says so"
    assert not _lines(caplog, "energy counter stopped answering"), "a transient outage is no dead counter"
    assert summary["phase"] == "steady" and rt.gpu.energy_error is None


def test_a_dead_energy_counter_is_one_line_and_default_clocks_measuring_time_only(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(read_failures, "DEAD_AFTER_S", 0.3)  # the bound, shortened: the decision is the same
    run = Run(tmp_path, SimFaults(energy_fail_from_s=3.0))  # for good
    cfg = run.config(frontier_path=_frontier(tmp_path), probe_every_steps=0)
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, cfg) as rt:
            while len(run.steps) < HANG_STEPS:
                record = run.step(rt)
                if "energy_failed" in record["events"]:
                    break
            failed_at = len(run.steps)
            for _ in range(20):  # the run goes on
                run.step(rt)
            controller, clock_failure = rt.gpu.controller, rt.gpu.clock_failure
            summary = rt.summary()
    lines = _lines(caplog, "energy counter stopped answering")
    assert len(lines) == 1, lines
    assert lines[0].startswith("perseus: rank 0: the GPU's energy counter stopped answering (Reading energy")
    assert "); continuing at default clocks, measuring time only; " in lines[0] and "\n" not in lines[0]
    assert isinstance(controller, NullController), "no clock is changed for the rest of the run"
    assert clock_failure is not None and "energy counter" in clock_failure
    later = run.steps[failed_at:]
    assert all(s["energy_j"] is None for s in later), "measuring time only"
    assert not any(s["locked"] for s in later) and not run.device.is_clock_locked()
    assert summary["phase"] in ("fallback", "steady") and summary["steps"] == len(run.steps)
    assert [e for _, e, _ in summary["events"]].count("energy_failed") == 1
    assert not [s for s in run.steps if s["energy_j"] is not None and s["energy_j"] <= 0], "never 0 J"


def test_a_lock_refused_for_good_mid_run_is_one_line_default_clocks_and_unlocked_at_exit(tmp_path, caplog):
    run = Run(tmp_path, SimFaults(lock_refused_from_s=1.0))  # locks and resets, for good
    cfg = run.config(frontier_path=_frontier(tmp_path), probe_every_steps=0)
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, cfg) as rt:
            time.sleep(max(0.0, 1.1 - run.since()))  # the controller started; locks are refused from now on
            while len(run.steps) < HANG_STEPS:
                record = run.step(rt)
                if "clock_failed" in record["events"]:
                    break
            for _ in range(10):  # the run goes on
                run.step(rt)
            summary = rt.summary()
    lines = _lines(caplog, "clock control failed")
    assert len(lines) == 1 and "continuing at default clocks" in lines[0], lines
    assert "refused by an injected fault" in lines[0]
    deployed = next(s for s in run.steps if s["phase"] in ("deployed", "fallback"))
    failed = next(s for s in run.steps if "clock_failed" in s["events"])
    assert failed["end"] - deployed["begin"] >= sum(RETRY_DELAYS_S), "given up only after the retries"
    assert summary["phase"] == "fallback" and summary["steps"] == len(run.steps)
    assert run.device.snapshot().n_lock == 0 and not run.device.is_clock_locked(), "unlocked at exit"
