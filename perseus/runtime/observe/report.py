"""Per-step numbers, the rank-0 log line, the optional JSONL metrics file and the final summary.

Energies are this rank's GPU energy (measured by NVML or integrated by the simulated GPU);
job-wide totals come from the periodic job check (``job_check.py``) every K steps.
The records are ``StepMetrics`` (``metrics.py``), the runtime's one per-step record.
``summarize`` builds ``PerseusRuntime.summary()`` from values only (a ``RunFacts``), so it is
testable alone.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from statistics import fmean, median
from typing import TYPE_CHECKING, Any, Sequence

from perseus.output.wording import Z95, saving_phrase
from perseus.runtime.guard.ab import ABFigure, energy_text, step_line
from perseus.runtime.observe.metrics import StepMetrics
from perseus.runtime.observe.metrics_file import MetricsFile
from perseus.runtime.observe.prediction import text as prediction_text
from perseus.runtime.phases import Phase

if TYPE_CHECKING:
    from perseus.frontier import Frontier, FrontierPoint
    from perseus.planner.stage_plan import StagePlan, StagePoint
    from perseus.runtime.measure.clock_sweep import ClockSweep
    from perseus.runtime.job import PipelineJob

log = logging.getLogger("perseus.runtime")


@dataclass
class Reporter:
    """Accumulates step records; writes the log line (rank 0) and metrics lines."""

    rank: int = 0
    log_every_steps: int = 1
    metrics_path: str | None = None
    records: list[StepMetrics] = field(default_factory=list)
    baseline_time_s: float | None = None
    baseline_energy_j: float | None = None
    baseline_steps: int = 0
    _metrics: MetricsFile | None = None

    def __post_init__(self) -> None:
        if self.metrics_path and self.rank == 0:
            self._metrics = MetricsFile(self.metrics_path)

    def set_baseline(self, records: list[StepMetrics]) -> None:
        """Median of the warm-up steps after the first (start-up: allocation, compilation, caches);
        the per-step ``saving_ratio`` is against it. The summary's baseline is the default-clock
        probes' where the guard ran them (``summarize``)."""
        records = records[1:] if len(records) > 1 else records
        if records:
            self.baseline_time_s = median(r.time_s for r in records)
            self.baseline_energy_j = median_energy(records)
            self.baseline_steps = len(records)

    def saving(self, energy_j: float | None) -> float | None:
        if not self.baseline_energy_j or energy_j is None:
            return None
        return 1.0 - energy_j / self.baseline_energy_j

    def add(self, record: StepMetrics, extra: dict[str, Any] | None = None, *, this_step: ABFigure | None = None,
            run: ABFigure | None = None) -> None:
        """Keep, log and write one step. A deployed step's figures are the same-run A/B
        (``this_step``: this plan step against the default-clock probes' medians; ``run``: the
        medians of the counted plan steps and probes, with their spread), each labelled as such."""
        self.records.append(record)
        if self.rank == 0 and self.log_every_steps and record.step % self.log_every_steps == 0:
            log.info("%s", self._line(record, run))
        if self._metrics is not None:
            row = record.file_row()
            row["baseline_time_s"] = self.baseline_time_s
            row["baseline_energy_j"] = self.baseline_energy_j
            row["saving"] = self.saving(record.energy_j)
            if this_step is not None:
                row["saving_vs_probes"] = this_step.saving
            if extra:
                row.update(extra)
            self._metrics.write_line(json.dumps(row))

    def _line(self, record: StepMetrics, run: ABFigure | None) -> str:
        if record.clocks is not None:  # deployed: the A/B against this run's default-clock probes
            line = step_line(record.step, record.phase.value, record.time_s, record.energy_j, record.clocks, run)
            return line + (f", slowdown x{record.slowdown:.3f}" if record.slowdown != 1.0 else "")
        parts = [f"perseus step {record.step} [{record.phase.value}]", f"time {record.time_s * 1e3:.1f} ms",
                 energy_text(record.energy_j)]
        if record.freq_mhz is not None:
            parts.append(f"clock {record.freq_mhz} MHz")
        return ", ".join(parts)

    def complete(self, record: StepMetrics) -> None:
        """Replace the last record (the same step) by its step-end form (``observe.Observer``)."""
        if self.records and self.records[-1].step == record.step:
            self.records[-1] = record

    def write_event(self, event: str, **data: Any) -> None:
        """A non-step line in the metrics file (phase change, plan deployed, straggler switch)."""
        if self._metrics is not None:
            self._metrics.write_line(json.dumps({"event": event, **data}, default=str))

    def running_deployed(self) -> tuple[float, float | None] | None:
        """Mean (time, energy) of the steps run with a deployed plan so far (energy: of the measured ones)."""
        deployed = [r for r in self.records if r.phase is Phase.DEPLOYED]
        if not deployed:
            return None
        return fmean(r.time_s for r in deployed), mean_energy(deployed)

    def phase_means(self) -> dict[str, dict[str, float | None]]:
        """Per phase: steps, mean and median time and energy; energies of the measured steps only
        (``unmeasured_steps`` says how many were left out; None when none was measured)."""
        out: dict[str, dict[str, float | None]] = {}
        for phase in sorted({r.phase.value for r in self.records}):
            rows = [r for r in self.records if r.phase.value == phase]
            out[phase] = {
                "steps": len(rows),
                "time_s": fmean(r.time_s for r in rows),
                "energy_j": mean_energy(rows),
                "median_time_s": median(r.time_s for r in rows),
                "median_energy_j": median_energy(rows),
                "unmeasured_steps": sum(r.energy_j is None for r in rows),
            }
        return out

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None


@dataclass(frozen=True)
class RunFacts:
    """What the summary says besides the step records: this rank's state when it is asked."""

    rank: int
    job: PipelineJob
    mode: str
    phase: Phase
    steps: int
    phase_history: list[tuple[int, Phase]]
    p_blocking_w: float | None
    fallback: str | None
    slowdown: float
    clock_mhz: int
    events: list[tuple[int, str, Any]]
    job_numbers: dict[str, Any]
    sweep: ClockSweep | None = None
    profiling_iterations: int | None = None
    frontier: Frontier | StagePlan | None = None
    point: FrontierPoint | StagePoint | None = None
    closed_loop: dict[str, Any] | None = None  # ``ClosedLoop.summary()``: the same-run A/B, probes, guard
    grid: dict[str, Any] | None = None  # ``GridControl.summary()``: carbon/power decisions (None: no grid target)
    switch_latency: dict[str, Any] | None = None  # ``LatencyInForce.as_dict()``: the latency used and why
    prediction: dict[str, Any] | None = None  # ``PredictionCheck.as_dict()``: the last plan step's check
    # the guard's counted default-clock probes and plan steps: median span (GPU time) and energy, steps
    probe_baseline: dict[str, Any] | None = None
    plan_medians: dict[str, Any] | None = None
    job_saving: dict[str, Any] | None = None  # ``JobSavingFigure.as_dict()``: all ranks, all pipelines


def summarize(reporter: Reporter, facts: RunFacts) -> dict[str, Any]:
    """Measured results of this rank (energies are this rank's GPU) plus job-wide numbers when known."""
    means = reporter.phase_means()
    recent = reporter.records[-5:]
    deployed = means.get("deployed")
    f = facts
    out: dict[str, Any] = {
        "enabled": True,
        "rank": f.rank,
        "stage": f.job.stage,
        "dp_rank": f.job.dp_rank,
        "mode": f.mode,
        "phase": f.phase.value,
        "steps": f.steps,
        "phase_history": [(step, phase.value) for step, phase in f.phase_history],
        "baseline": _baseline(reporter, f),
        "current": {
            "time_s": fmean(r.time_s for r in recent) if recent else None,
            "energy_j": mean_energy(recent),
        },
        "phases": means,
        "saving": reporter.saving(deployed["energy_j"]) if deployed else None,
        "saving_interval": None,
        "job_saving": f.job_saving,
        "p_blocking_w": f.p_blocking_w,
        "fallback": f.fallback,
        "slowdown": f.slowdown,
        "clock_mhz": f.clock_mhz,
        "events": list(f.events),
        "job": dict(f.job_numbers),
    }
    sweep, frontier, point = f.sweep, f.frontier, f.point
    if sweep is not None:
        out["profiled_clocks_mhz"] = list(sweep.visited)
        out["profiling_iterations"] = f.profiling_iterations
        out["sweep_stopped_early"] = sweep.stopped_early
        out["profiling_overhead"] = profiling_overhead(reporter.records)
    if f.closed_loop is not None:
        out["closed_loop"] = f.closed_loop
    ab = (f.closed_loop or {}).get("ab")
    if f.probe_baseline is not None and ab is not None:  # this rank's plan steps against its probes
        out["saving"] = ab["saving"]
        stderr = ab["saving_stderr"]
        out["saving_interval"] = None if stderr is None else [ab["saving"] - Z95 * stderr, ab["saving"] + Z95 * stderr]
        out["plan"] = f.plan_medians
    if f.grid is not None:
        out["grid"] = f.grid
    if f.switch_latency is not None:
        out["switch_latency"] = f.switch_latency
    if f.prediction is not None:
        out["prediction"] = f.prediction
    if frontier is not None:
        out["frontier"] = {
            "points": len(frontier.points),
            "baseline_time_s": frontier.baseline_time_s,
            "baseline_energy_j": frontier.baseline_energy_j,
            "default_time_s": frontier.default_point().time_s,
            "default_energy_j": frontier.default_point().energy_j,
        }
    if point is not None:
        out["point"] = {"time_s": point.time_s, "energy_j": point.energy_j}
    return out


def _baseline(reporter: Reporter, f: RunFacts) -> dict[str, Any]:
    """What this rank's saving is against: the default-clock probes' medians where the guard ran
    them (after warm-up, in GPU time where the GPU runs behind the host), else the warm-up steps'."""
    if f.probe_baseline is not None and (f.closed_loop or {}).get("ab") is not None:
        return {**f.probe_baseline, "basis": "default-clock probes"}
    return {"time_s": reporter.baseline_time_s, "energy_j": reporter.baseline_energy_j,
            "steps": reporter.baseline_steps, "basis": "warm-up"}


def summary_line(summary: dict[str, Any]) -> str:
    """The one line rank 0 logs at close."""
    s = summary
    baseline = s["baseline"]
    probes = baseline.get("basis") == "default-clock probes"
    saving = f"{100 * s['saving']:.1f}%" if s["saving"] is not None else "n/a"
    if s.get("saving_interval"):
        low, high = s["saving_interval"]
        saving += f" (95 % interval {100 * low:+.1f}..{100 * high:+.1f}%)"
    against = f" ({baseline['steps']} default-clock probe steps)" if probes else ""
    deployed = f"plan steps {_fmt(s.get('plan'))}" if probes else f"deployed {_fmt(s['phases'].get('deployed'))}"
    return (f"perseus summary: {s['steps']} steps, phase {s['phase']}, baseline {_fmt(baseline)}{against}, "
            f"{deployed}, saving {saving}{_job(s.get('job_saving'))}{_guard(s.get('closed_loop'))}"
            + (f"; prediction vs probes: {prediction_text(s['prediction'])}" if s.get("prediction") else ""))


def _job(job: dict[str, Any] | None) -> str:
    """The job's saving against its probes (all ranks, all pipelines) and every stage's energy."""
    if not job:
        return ""
    stages = ", ".join(f"stage {s} {v['energy_j']:.2f} J ({saving_phrase(v['saving'])})"
                       for s, v in job["stages"].items())
    return (f"; job (all GPUs) {job['energy_j']:.2f} J/iteration against {job['baseline_energy_j']:.2f} J at default "
            f"clocks: {saving_phrase(job['saving'])} (95 % interval {100 * job['saving_low']:+.1f}.."
            f"{100 * job['saving_high']:+.1f}% saved, {job['windows']} probe windows); {stages}")


def _guard(loop: dict[str, Any] | None) -> str:
    """The guard per pipeline: its statistic, the probes' share and energy, what it did; and the
    job's energy test (the saving it measured against the probes, with its 95 % interval)."""
    if not loop or not loop.get("pipelines"):
        return ""
    energy = loop.get("energy") or {}
    did = "fell back" if loop["guard_fell_back"] else f"{loop['guard_moves']} move(s) faster" if loop["guard_moves"] else "kept"
    if energy.get("dropped"):
        did = "fell back: no energy saving"
    parts = [f"pipeline {dp} CUSUM {p['statistic']:.2f}/{loop['threshold']:g}, probes {100 * p['probe_share']:.1f}% "
             f"of steps ({p['probe_extra_energy_j']:+.1f} J)" for dp, p in loop["pipelines"].items()]
    if "saving" in energy:
        parts.append(f"job {saving_phrase(energy['saving'])} (95 % interval {100 * energy['saving_low']:+.1f}.."
                     f"{100 * energy['saving_high']:+.1f}% saved), energy CUSUM {energy['statistic']:.2f}/{energy['threshold']:g}")
    return f"; guard ({loop['windows']} windows, {did}): " + "; ".join(parts)


def _fmt(d: dict[str, Any] | None) -> str:
    if not d or d.get("time_s") is None:
        return "n/a"
    energy = "energy unmeasured" if d.get("energy_j") is None else f"{d['energy_j']:.2f} J"
    return f"{d['time_s'] * 1e3:.1f} ms / {energy}"


def measured_energies(records: Sequence[StepMetrics]) -> list[float]:
    """The energies of the measured steps: an unmeasured one (None) is left out, never counted as 0 J."""
    return [r.energy_j for r in records if r.energy_j is not None]


def mean_energy(records: Sequence[StepMetrics]) -> float | None:
    energies = measured_energies(records)
    return fmean(energies) if energies else None


def median_energy(records: Sequence[StepMetrics]) -> float | None:
    energies = measured_energies(records)
    return median(energies) if energies else None


def profiling_overhead(records: Sequence[StepMetrics]) -> dict[str, Any] | None:
    """What profiling cost against default clocks (this rank's GPU): the profiling steps' time and
    energy minus a like-with-like reference × as many steps. The reference is the sweep's own
    steps at its top clock (default clocks, timed the same way, after start-up); without those,
    the warm-up median with its first (start-up) step left out. A figure below zero is noise (or a
    reference that ran slower than the sweep), never a gain: ``note`` says so. None before profiling."""
    rows = [r for r in records if r.phase is Phase.PROFILING]
    top = max((r.freq_mhz for r in rows if r.freq_mhz is not None), default=None)
    reference = [r for r in rows if top is not None and r.freq_mhz == top]
    basis = f"the sweep's own steps at its top clock ({top} MHz)"
    if not reference:
        reference = [r for r in records if r.phase is Phase.WARMUP][1:]
        basis = "warm-up steps after the first (start-up left out)"
    base_t = median(r.time_s for r in reference) if reference else 0.0
    base_e = median_energy(reference) or 0.0
    if not rows or base_t <= 0:
        return None
    n = len(rows)
    time_s = sum(r.time_s for r in rows)
    energies = measured_energies(rows)  # the energy of the steps measured, against as many reference steps
    n_e, energy_j = len(energies), sum(energies)
    measured = base_e > 0 and n_e > 0  # steps shorter than the energy counter's update period can read 0 J
    out: dict[str, Any] = {
        "iterations": n, "time_s": time_s, "energy_j": energy_j, "reference": basis,
        "reference_steps": len(reference),
        "extra_time_s": time_s - n * base_t,
        "extra_energy_j": energy_j - n_e * base_e if measured else None,
        "extra_time_ratio": time_s / (n * base_t) - 1.0,
        "extra_energy_ratio": energy_j / (n_e * base_e) - 1.0 if measured else None,
    }
    notes = [] if measured else [f"energy not measured: {basis} read 0 J (steps shorter than the energy counter's "
                                 "update period)" if n_e else "energy not measured: the counter's reads failed"]
    if measured and n_e < n:
        notes.append(f"{n - n_e} of the {n} profiling steps unmeasured (the counter's reads failed): energy over the "
                     f"other {n_e}")
    if measured and out["extra_energy_j"] < 0:  # real: a lower clock draws less power for longer
        notes.append(f"energy below zero: the {n} profiling steps at lower clocks used less energy than {basis}; "
                     "profiling costs time here, not energy")
    if out["extra_time_s"] < 0:  # no sweep step is faster than its top clock: the reference was slow
        notes.append(f"time below zero: the {n} profiling steps ran faster than {basis}; step noise on this "
                     "machine, not a gain")
    if notes:
        out["note"] = "; ".join(notes)
    return out
