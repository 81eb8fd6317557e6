"""Per-step numbers, the rank-0 log line, the optional JSONL metrics file and the final summary.

Energies are this rank's GPU energy (measured by NVML or integrated by the simulated GPU);
job-wide totals come from the periodic job check (``job_check.py``) every K steps.
``summarize`` builds ``PerseusRuntime.summary()`` from values only, so it is testable alone.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from statistics import fmean, median
from typing import TYPE_CHECKING, Any

from perseus.runtime.metrics_file import MetricsFile
from perseus.runtime.profiling import profiling_overhead

if TYPE_CHECKING:
    from perseus.frontier import Frontier, FrontierPoint
    from perseus.runtime.stage_plan import StagePlan, StagePoint
    from perseus.runtime.clock_sweep import ClockSweep
    from perseus.runtime.events import PipelineJob

log = logging.getLogger("perseus.runtime")


@dataclass
class StepRecord:
    """One training iteration as the runtime saw it."""

    step: int
    phase: str
    time_s: float
    energy_j: float
    freq_mhz: int | None = None  # profiling clock, when sweeping
    target_time_s: float | None = None  # planned iteration time of the deployed point
    slowdown: float = 1.0  # deliberate slowdown ratio (straggler or external target)


@dataclass
class Reporter:
    """Accumulates step records; writes the log line (rank 0) and metrics lines."""

    rank: int = 0
    log_every_steps: int = 1
    metrics_path: str | None = None
    records: list[StepRecord] = field(default_factory=list)
    baseline_time_s: float | None = None
    baseline_energy_j: float | None = None
    _metrics: MetricsFile | None = None

    def __post_init__(self) -> None:
        if self.metrics_path and self.rank == 0:
            self._metrics = MetricsFile(self.metrics_path)

    def set_baseline(self, records: list[StepRecord]) -> None:
        """Median of the warm-up steps: robust to the slow first iteration."""
        if records:
            self.baseline_time_s = median(r.time_s for r in records)
            self.baseline_energy_j = median(r.energy_j for r in records)

    def saving(self, energy_j: float) -> float | None:
        if not self.baseline_energy_j:
            return None
        return 1.0 - energy_j / self.baseline_energy_j

    def add(self, record: StepRecord, extra: dict[str, Any] | None = None) -> None:
        self.records.append(record)
        running = self.running_deployed()
        if self.rank == 0 and self.log_every_steps and record.step % self.log_every_steps == 0:
            parts = [f"perseus step {record.step} [{record.phase}]", f"time {record.time_s * 1e3:.1f} ms",
                     f"energy {record.energy_j:.2f} J"]
            if record.freq_mhz is not None:
                parts.append(f"clock {record.freq_mhz} MHz")
            if record.slowdown != 1.0:
                parts.append(f"slowdown x{record.slowdown:.3f}")
            if running is not None and self.baseline_energy_j:
                parts.append(f"saving {100 * (1 - running[1] / self.baseline_energy_j):.1f}% vs baseline")
            log.info(", ".join(parts))
        if self._metrics is not None:
            row = asdict(record)
            row["baseline_time_s"] = self.baseline_time_s
            row["baseline_energy_j"] = self.baseline_energy_j
            row["saving"] = self.saving(record.energy_j)
            if extra:
                row.update(extra)
            self._metrics.write_line(json.dumps(row))

    def write_event(self, event: str, **data: Any) -> None:
        """A non-step line in the metrics file (phase change, plan deployed, straggler switch)."""
        if self._metrics is not None:
            self._metrics.write_line(json.dumps({"event": event, **data}, default=str))

    def running_deployed(self) -> tuple[float, float] | None:
        """Mean (time, energy) of the steps run with a deployed plan so far."""
        deployed = [r for r in self.records if r.phase == "deployed"]
        if not deployed:
            return None
        return fmean(r.time_s for r in deployed), fmean(r.energy_j for r in deployed)

    def phase_means(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for phase in sorted({r.phase for r in self.records}):
            rows = [r for r in self.records if r.phase == phase]
            out[phase] = {
                "steps": len(rows),
                "time_s": fmean(r.time_s for r in rows),
                "energy_j": fmean(r.energy_j for r in rows),
                "median_time_s": median(r.time_s for r in rows),
                "median_energy_j": median(r.energy_j for r in rows),
            }
        return out

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None


def summarize(
    reporter: Reporter,
    *,
    rank: int,
    job: PipelineJob,
    mode: str,
    phase: str,
    steps: int,
    phase_history: list[tuple[int, str]],
    p_blocking_w: float | None,
    fallback: str | None,
    slowdown: float,
    clock_mhz: int,
    events: list[tuple[int, str, Any]],
    job_numbers: dict[str, Any],
    sweep: ClockSweep | None,
    profiling_iterations: int | None,
    frontier: Frontier | StagePlan | None,
    point: FrontierPoint | StagePoint | None,
) -> dict[str, Any]:
    """Measured results of this rank (energies are this rank's GPU) plus job-wide numbers when known."""
    means = reporter.phase_means()
    recent = reporter.records[-5:]
    deployed = means.get("deployed")
    out: dict[str, Any] = {
        "enabled": True,
        "rank": rank,
        "stage": job.stage,
        "dp_rank": job.dp_rank,
        "mode": mode,
        "phase": phase,
        "steps": steps,
        "phase_history": list(phase_history),
        "baseline": {"time_s": reporter.baseline_time_s, "energy_j": reporter.baseline_energy_j},
        "current": {
            "time_s": fmean(r.time_s for r in recent) if recent else None,
            "energy_j": fmean(r.energy_j for r in recent) if recent else None,
        },
        "phases": means,
        "saving": reporter.saving(deployed["energy_j"]) if deployed else None,
        "p_blocking_w": p_blocking_w,
        "fallback": fallback,
        "slowdown": slowdown,
        "clock_mhz": clock_mhz,
        "events": list(events),
        "job": dict(job_numbers),
    }
    if sweep is not None:
        out["profiled_clocks_mhz"] = list(sweep.visited)
        out["profiling_iterations"] = profiling_iterations
        out["sweep_stopped_early"] = sweep.stopped_early
        out["profiling_overhead"] = profiling_overhead(reporter.records, reporter.baseline_time_s, reporter.baseline_energy_j)
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


def summary_line(summary: dict[str, Any]) -> str:
    """The one line rank 0 logs at close."""
    s = summary
    saving = f"{100 * s['saving']:.1f}%" if s["saving"] is not None else "n/a"
    return (f"perseus summary: {s['steps']} steps, phase {s['phase']}, baseline {_fmt(s['baseline'])}, "
            f"deployed {_fmt(s['phases'].get('deployed'))}, saving {saving}")


def _fmt(d: dict[str, Any] | None) -> str:
    if not d or d.get("time_s") is None:
        return "n/a"
    return f"{d['time_s'] * 1e3:.1f} ms / {d['energy_j']:.2f} J"
