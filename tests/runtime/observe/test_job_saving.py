"""The job's saving against default-clock probes and every stage's energy, from the guard's rows:
the accounting (stages sum their ranks, the job its stages, so its saving is the stages' weighted
by their baseline energy), its interval, and where it goes (scalars, Prometheus, summary line)."""

from __future__ import annotations

import math
import urllib.request
from types import SimpleNamespace

import pytest

from perseus.runtime.guard.closed_loop import ENERGY_AT, RETARGETED_AT, STAGE_AT
from perseus.runtime.guard.sequential import RankEnergy, no_energy_row
from perseus.runtime.observe.job_saving import JobSaving
from perseus.runtime.observe.metrics import StepMetrics, job_saving_scalars
from perseus.runtime.observe.report import summary_line
from perseus.runtime.phases import Phase


def row(stage: int, plan_j: float | None, probe_j: float = 0.0, n: int = 4, spread: float | None = 0.01) -> list[float]:
    """One rank's gathered row: nothing but what the job's saving reads (the energy medians, the stage)."""
    r = [0.0] * ENERGY_AT
    r += no_energy_row() if plan_j is None else RankEnergy(plan_j, probe_j, n, 1, spread).row()
    r += [0.0] * (STAGE_AT - RETARGETED_AT) + [float(stage)]
    assert len(r) == STAGE_AT + 1
    return r


# 2 stages x 2 pipelines (rank order: dp 0 stage 0, dp 0 stage 1, dp 1 stage 0, dp 1 stage 1)
WINDOWS = [
    [row(0, 8.0, 10.0), row(1, 12.0, 12.5), row(0, 8.2, 10.1), row(1, 12.1, 12.4)],
    [row(0, 8.4, 10.3), row(1, 12.3, 12.6), row(0, None), row(1, 11.9, 12.5)],  # dp 1 stage 0 unmeasured
    [row(0, 8.1, 10.0), row(1, 12.2, 12.4), row(0, 8.0, 9.9), row(1, 12.0, 12.6)],
]


def test_stages_sum_their_ranks_and_the_job_weights_the_stages_by_their_baseline_energy():
    saving = JobSaving()
    for rows in WINDOWS:
        assert saving.add_window(rows)
    f = saving.figure
    assert f is not None and f.windows == 3 and set(f.stages) == {0, 1}

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    # a rank's numbers are the mean of its windows' medians (over the windows it measured)
    stage0 = mean([8.0, 8.4, 8.1]) + mean([8.2, 8.0])
    base0 = mean([10.0, 10.3, 10.0]) + mean([10.1, 9.9])
    assert f.stages[0].energy_j == pytest.approx(stage0) and f.stages[0].baseline_energy_j == pytest.approx(base0)
    assert f.stages[0].ranks == 2 and f.stages[1].ranks == 2
    assert f.energy_j == pytest.approx(sum(s.energy_j for s in f.stages.values()))
    weighted = sum(s.baseline_energy_j / f.baseline_energy_j * s.saving for s in f.stages.values())
    assert f.saving == pytest.approx(weighted, abs=1e-12)
    # the stage with the least slack saves least: one stage alone would misstate the job
    assert f.stages[0].saving > f.saving > f.stages[1].saving
    assert f.saving_low < f.saving < f.saving_high and f.saving_high - f.saving_low < 0.1


def test_the_interval_narrows_with_windows_and_widens_with_their_scatter():
    steady, scattered = JobSaving(), JobSaving()
    for i in range(12):
        steady.add_window([row(0, 8.0, 10.0), row(1, 12.0, 12.5)])
        plan = 8.0 * (1.1 if i % 2 else 0.9)
        scattered.add_window([row(0, plan, 10.0), row(1, 12.0, 12.5)])
    one = JobSaving()
    one.add_window([row(0, 8.0, 10.0), row(1, 12.0, 12.5)])
    figures = [s.figure for s in (one, steady, scattered)]
    width = [f.saving_high - f.saving_low for f in figures if f is not None]
    assert len(width) == 3
    assert width[1] < width[0] < width[2]
    assert math.isfinite(width[0])


def test_a_window_without_evidence_or_without_stages_changes_nothing():
    saving = JobSaving()
    assert not saving.add_window([row(0, None), row(1, None)])
    assert not saving.add_window([[0.0] * STAGE_AT])  # a row that carries no stage
    assert saving.figure is None
    guard = SimpleNamespace(windows=0, window_rows=[])
    assert not saving.follow(guard)  # no window ended yet
    guard.windows, guard.window_rows = 1, WINDOWS[0]
    assert saving.follow(guard) and saving.figure is not None
    assert not saving.follow(guard), "the same window is taken once"


def test_the_figure_reaches_the_scalars_the_prometheus_snapshot_and_the_summary_line():
    saving = JobSaving()
    for rows in WINDOWS:
        saving.add_window(rows)
    f = saving.figure
    assert f is not None
    m = StepMetrics(step=9, rank=0, phase=Phase.DEPLOYED, time_s=0.1, energy_j=5.0, job_saving=f)
    scalars = m.scalars()
    assert scalars["perseus/job_saving_ratio"] == pytest.approx(f.saving)
    assert scalars["perseus/stage1_energy_j"] == pytest.approx(f.stages[1].energy_j)
    assert {k.removeprefix("perseus/") for k in scalars} >= set(job_saving_scalars(f))
    snapshot = m.prometheus()
    assert snapshot["job_saving"] == f.saving and snapshot["stage_saving"] == {"0": f.stages[0].saving,
                                                                              "1": f.stages[1].saving}
    assert "perseus/job_saving_ratio" not in StepMetrics(step=9, rank=0, phase=Phase.DEPLOYED, time_s=0.1,
                                                         energy_j=5.0).scalars()
    summary = {"steps": 30, "phase": "deployed", "saving": 0.1, "phases": {},
               "baseline": {"time_s": 0.1, "energy_j": 10.0, "steps": 3, "basis": "default-clock probes"},
               "plan": {"time_s": 0.1, "energy_j": 9.0, "steps": 20}, "saving_interval": [0.05, 0.15],
               "job_saving": f.as_dict()}
    line = summary_line(summary)
    assert "baseline 100.0 ms / 10.00 J (3 default-clock probe steps), plan steps 100.0 ms / 9.00 J" in line
    assert "saving 10.0% (95 % interval +5.0..+15.0%)" in line
    assert (f"job (all GPUs) {f.energy_j:.2f} J/iteration against {f.baseline_energy_j:.2f} J at default clocks: "
            f"saves {100 * f.saving:.1f}% energy") in line
    assert f"stage 1 {f.stages[1].energy_j:.2f} J (saves {100 * f.stages[1].saving:.1f}% energy)" in line


def test_the_exporter_serves_the_job_saving_and_every_stage():
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from perseus.runtime.observe.prometheus import PrometheusExporter

    saving = JobSaving()
    for rows in WINDOWS:
        saving.add_window(rows)
    f = saving.figure
    assert f is not None
    exporter = PrometheusExporter(port=0)
    try:
        exporter.update(StepMetrics(step=9, rank=0, phase=Phase.DEPLOYED, time_s=0.1, energy_j=5.0,
                                    job_saving=f).prometheus())
        with urllib.request.urlopen(exporter.url, timeout=10) as resp:
            text = resp.read().decode()
    finally:
        exporter.close()
    seen = {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
    assert seen[("perseus_job_energy_saving_ratio", ())] == pytest.approx(f.saving)
    assert seen[("perseus_job_energy_saving_low_ratio", ())] == pytest.approx(f.saving_low)
    assert seen[("perseus_job_baseline_energy_joules", ())] == pytest.approx(f.baseline_energy_j)
    for stage, s in f.stages.items():
        assert seen[("perseus_stage_energy_joules", (("stage", str(stage)),))] == pytest.approx(s.energy_j)
        assert seen[("perseus_stage_energy_saving_ratio", (("stage", str(stage)),))] == pytest.approx(s.saving)


def test_the_warm_up_baseline_leaves_the_start_up_step_out():
    """Without probes the per-step saving is against warm-up; its first step (allocation, compilation,
    caches) is left out, so a slow start does not inflate the saving."""
    from perseus.runtime.observe.report import Reporter

    reporter = Reporter(log_every_steps=0)
    records = [StepMetrics(step=i, rank=0, phase=Phase.WARMUP, time_s=t, energy_j=e)
               for i, (t, e) in enumerate([(1.0, 100.0), (0.1, 10.0), (0.12, 12.0)])]
    reporter.set_baseline(records)
    assert (reporter.baseline_time_s, reporter.baseline_energy_j, reporter.baseline_steps) == (0.11, 11.0, 2)
