"""Per-step metrics from a real single-process runtime: sinks get the runtime's own numbers, and
``prometheus_port=0`` serves them during the run (scraped like Prometheus would)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
import urllib.error
import urllib.request

import numpy as np
import pytest

from perseus.frontier import Frontier, FrontierPoint
from perseus.gpu.sim.device import SimulatedGPU
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.runtime.observe.metrics import PHASE_CODES, SCALARS, StepMetrics
from perseus.runtime.phases import Phase
from perseus.schedules import build_schedule
from perseus.frontier import save_frontier

sys.path.insert(0, str(Path(__file__).parents[1]))
import local_steps

JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0)
PLAN = [1410, 900, 1200, 900]  # forward 0, backward 0, forward 1, backward 1


def setup(tmp_path, **kw):
    device = SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    schedule = build_schedule("1f1b", 1, 2)
    save_frontier(Frontier(schedule, 80.0, 1.0, 2.0, [FrontierPoint(1.0, 1.5, np.array(PLAN))]), tmp_path / "f.json")
    cfg = PerseusConfig.from_dict({
        "gpu": "sim", "device_index": 0, "cache_dir": None, "sim_gpu": {"state_dir": str(tmp_path / "sim")},
        "warmup_steps": 2, "frontier_path": str(tmp_path / "f.json"), "straggler_period_steps": 2, **kw})
    return device, cfg


def step(rt, device, t=0.002):
    """One iteration of plain CPU work: the runtime makes each instruction a simulated kernel."""
    local_steps.train(rt, 1, t)


class Recorder:
    def __init__(self) -> None:
        self.rows: list[tuple[int, StepMetrics]] = []
        self.closed = False

    def write(self, step: int, metrics: StepMetrics) -> None:
        self.rows.append((step, metrics))

    def close(self) -> None:
        self.closed = True


class Broken:
    def write(self, step: int, metrics: StepMetrics) -> None:
        raise OSError("disk full")

    def close(self) -> None:
        pass


def test_sinks_get_the_runtimes_own_numbers_each_step(tmp_path, caplog):
    device, cfg = setup(tmp_path, probe_every_steps=0)  # every deployed step runs the plan (no guard probe)
    recorder = Recorder()
    with caplog.at_level(logging.WARNING, logger="perseus"):
        with PerseusRuntime(JOB, cfg) as rt:
            rt.add_metrics_sink(recorder)
            rt.add_metrics_sink(Broken())
            for _ in range(6):
                step(rt, device)
            records = list(rt.reporter.records)
            baseline = rt.reporter.baseline_energy_j
            job_numbers = dict(rt.job_numbers)
            assert len(rt.observe.sinks) == 1, "the failing sink is dropped, the others keep going"
    assert recorder.closed
    assert caplog.text.count("metrics sink Broken failed") == 1
    assert [s for s, _ in recorder.rows] == [r.step for r in records] == list(range(6))
    saved = 0.0
    for (_, m), r in zip(recorder.rows, records):
        assert m is r, "one record per step: the reporter keeps what the sinks got"
        assert isinstance(m.phase, Phase)
        assert m.power_w == pytest.approx(r.energy_j / r.time_s)
        if r.phase is not Phase.WARMUP:
            saved += baseline - r.energy_j
            assert m.saving_ratio == pytest.approx(1 - r.energy_j / baseline)
        assert m.saving_j_total == pytest.approx(saved)
        assert m.energy_j_total == pytest.approx(sum(x.energy_j for x in records[: r.step + 1]))
        assert sum(m.instructions.values()) == 4
        scalars = m.scalars()
        assert scalars["perseus/energy_j"] == r.energy_j and scalars["perseus/phase"] == PHASE_CODES.index(r.phase.value)
        assert {k.removeprefix("perseus/") for k in scalars} - set(SCALARS) == {
            f"instructions_at_{mhz}mhz" for mhz in m.instructions}
    phases = [m.phase.value for _, m in recorder.rows]
    assert phases == ["warmup", "warmup", "deployed", "deployed", "deployed", "deployed"]
    warm, deployed = recorder.rows[0][1], recorder.rows[-1][1]
    assert warm.instructions == {1410: 4} and warm.point_slowdown is None and warm.saving_ratio is None
    assert deployed.instructions == {1410: 1, 900: 2, 1200: 1}  # the plan's clocks
    assert deployed.instructions_total == {1410: 2 * 4 + 4 * 1, 900: 8, 1200: 4}
    assert (deployed.point_slowdown, deployed.point_energy_j, deployed.straggler_ratio) == (1.0, 1.5, 1.0)
    # whole-job energy only at the steps of a periodic job check (every 2 deployed steps)
    checks = {s: m.job_energy_j for s, m in recorder.rows if m.job_energy_j is not None}
    assert sorted(checks) == [3, 5] and "perseus/job_energy_j" in recorder.rows[5][1].scalars()
    assert checks[5] == pytest.approx(job_numbers["energy_per_iteration_j"])
    assert checks[5] == pytest.approx((records[4].energy_j + records[5].energy_j) / 2)


pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_prometheus_port_zero_serves_the_run_while_it_trains(tmp_path):
    device, cfg = setup(tmp_path, prometheus_port=0, probe_every_steps=0)  # every deployed step runs the plan
    seen = []
    with PerseusRuntime(JOB, cfg) as rt:
        url = rt.summary()["prometheus"]["url"]
        assert url == f"http://127.0.0.1:{rt.prometheus.port}/metrics" and rt.prometheus.port > 0
        for _ in range(5):
            step(rt, device)
            seen.append(scrape(url))
        records = list(rt.reporter.records)
        baseline = rt.reporter.baseline_energy_j
    phase = [next(dict(labels)["phase"] for (name, labels), v in s.items() if name == "perseus_phase" and v == 1)
             for s in seen]
    assert phase == ["warmup", "warmup", "deployed", "deployed", "deployed"]
    energy = [s[("perseus_energy_joules_total", (("gpu", "0"),))] for s in seen]
    assert all(b > a for a, b in zip(energy, energy[1:])), energy
    assert energy == pytest.approx([sum(r.energy_j for r in records[: i + 1]) for i in range(5)])
    last = seen[-1]
    assert last[("perseus_instructions_total", (("clock_mhz", "900"),))] == 6
    assert last[("perseus_instructions_total", (("clock_mhz", "1410"),))] == 2 * 4 + 3
    assert last[("perseus_deployed_point_slowdown", ())] == 1.0
    assert last[("perseus_deployed_point_energy_joules", ())] == 1.5
    assert last[("perseus_energy_saving_ratio", ())] == pytest.approx(1 - records[-1].energy_j / baseline)
    assert last[("perseus_energy_saved_joules", ())] == pytest.approx(sum(baseline - r.energy_j for r in records[2:]))
    assert last[("perseus_job_energy_per_iteration_joules", ())] == pytest.approx(
        (records[2].energy_j + records[3].energy_j) / 2)  # the check after deployed steps 2 and 3
    with pytest.raises(urllib.error.URLError):  # closing the runtime stops the exporter
        scrape(url)


def test_prometheus_port_is_offset_by_the_local_rank_and_a_busy_port_is_an_error(tmp_path, monkeypatch):
    import socket

    from perseus.errors import ConfigError, PerseusError

    with pytest.raises(ConfigError, match="prometheus_port"):
        PerseusConfig.from_dict({"prometheus_port": -1})
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        port = busy.getsockname()[1]
        monkeypatch.setenv("LOCAL_RANK", "1")  # torchrun's second process on this node: port N + 1
        device, cfg = setup(tmp_path, prometheus_port=port - 1, mode="measure-only")
        with pytest.raises(PerseusError, match=f"cannot listen on 127.0.0.1:{port}"):
            PerseusRuntime(JOB, cfg)
        device.close()
    finally:
        busy.close()


def test_the_metrics_file_keeps_its_step_lines_with_one_record_type(tmp_path):
    """The one record type writes the metrics file's step lines as they always were: the same keys
    in the same order, the phase as its name; event lines stay between them, after their step."""
    device, cfg = setup(tmp_path, metrics_file=str(tmp_path / "m.jsonl"))
    with PerseusRuntime(JOB, cfg) as rt:
        for _ in range(4):
            step(rt, device)
        records = list(rt.reporter.records)
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "event" not in line]
    common = ["run_id", "step", "phase", "time_s", "energy_j", "freq_mhz", "target_time_s", "slowdown"]
    baseline = ["baseline_time_s", "baseline_energy_j", "saving"]
    # every step its work between steps (none here: this simulated GPU runs no step tail)
    between = ["between_steps_s", "between_steps_energy_j"]
    # deployed steps also say whose clocks they ran (the closed loop's probes run default clocks); plan
    # steps the frontier's prediction (the measured ratios once probes measured: none yet here)
    predicted = ["predicted_slowdown", "predicted_energy_ratio"]
    deployed = [common + ["clocks", "counted"] + between + (predicted if line["clocks"] == "plan" else []) + baseline
                for line in steps[2:]]
    assert [list(line) for line in steps] == [common + between + baseline] * 2 + deployed
    assert steps[2]["clocks"] == "plan"
    assert [line["phase"] for line in steps] == ["warmup", "warmup", "deployed", "deployed"]
    assert [r.file_row() for r in records] == [{k: line[k] for k in line if k not in baseline and k != "run_id"}
                                               for line in steps]
    assert steps[2]["target_time_s"] == 1.0 and steps[2]["slowdown"] == 1.0 and steps[0]["target_time_s"] is None
    # the phase change to deployed (at the end of step 1) follows step 1's line
    order = [line.get("event", line.get("step")) for line in lines]
    assert order.index("phase") > order.index(1) and order.index(2) > order.index("phase")
