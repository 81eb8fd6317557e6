"""Per-step metrics: one snapshot built at step end, written to sinks (Prometheus, TensorBoard, wandb, DeepSpeed).

``StepMetrics`` is the runtime's one per-step record. ``PerseusRuntime.on_step_end`` builds it
(through ``observe.Observer``) from the state it already keeps (the step's time and energy, the
baseline, the deployed point, the straggler policy, the last job check) and hands it to every
``MetricsSink`` added with ``PerseusRuntime.add_metrics_sink``. Nothing here
runs on the per-instruction hot path: instruction counts per clock come from the plan being
followed, not from counting instructions as they run.

Names are the same whatever writes them (``SCALARS``, documented with units in
docs/observability.md): ``perseus/energy_j``, ``perseus/power_w``, ``perseus/saving_j_total``, ...
Energies are this rank's GPU; ``perseus/job_energy_j`` (all GPUs of the job) only exists at the
steps where the runtime's periodic job check ran, and the job's saving against the default-clock
probes with every stage's energy (``perseus/job_saving_ratio``, ``perseus/stage0_energy_j``, ...)
at the steps where a probe window ended (``job_saving.py``): so whichever rank writes the
dashboards, they show every stage and the whole job, not that rank's GPU alone.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from perseus.runtime.phases import Phase

if TYPE_CHECKING:
    from perseus.runtime.observe.job_saving import JobSavingFigure

log = logging.getLogger("perseus.runtime")

PREFIX = "perseus/"
# ``perseus/phase`` as a number (scalar writers take numbers): the index in this tuple.
PHASE_CODES: tuple[str, ...] = ("warmup", "profiling", "planning", "deployed", "fallback", "steady")

# name (without PREFIX) -> (unit, meaning); docs/observability.md has the same table.
SCALARS: dict[str, tuple[str, str]] = {
    "energy_j": ("J", "energy of this rank's GPU over the step"),
    "power_w": ("W", "average power of this rank's GPU over the step (energy_j / time_s)"),
    "time_s": ("s", "iteration time: the GPU's (gpu_step_s) where it runs behind the host, else step begin to step end"),
    "phase": ("code", "runtime phase the step ran in: " + ", ".join(f"{i} {p}" for i, p in enumerate(PHASE_CODES))),
    "clock_mhz": ("MHz", "SM clock requested for this GPU at the end of the step"),
    "energy_j_total": ("J", "energy of this rank's GPU summed over all steps so far"),
    "saving_ratio": ("fraction", "1 - energy_j / baseline energy, steps after warm-up only"),
    "saving_j_total": ("J", "sum of (baseline energy - energy_j) over the steps after warm-up (profiling included)"),
    "straggler_ratio": ("ratio", "slowdown the straggler policy follows (1 = none)"),
    "point_slowdown": ("ratio", "deployed frontier point's planned time / no-slowdown point's (deployed steps only)"),
    "point_energy_j": ("J", "deployed frontier point's planned iteration energy, whole pipeline (deployed steps only)"),
    "job_energy_j": ("J", "energy per iteration of all GPUs of the job, from the periodic job check (check steps only)"),
    "carbon_intensity": ("gCO2/kWh", "grid carbon intensity in force (carbon or power target set; docs/carbon.md)"),
    "carbon_g": ("g", "carbon of this rank's GPU energy over the step (energy_j x carbon_intensity)"),
    "carbon_g_total": ("g", "carbon_g summed over the steps with an intensity so far"),
    "job_power_w": ("W", "planned average power of all the job's GPUs at the point run (grid target set)"),
    "power_cap_w": ("W", "job-wide power cap in force"),
    "gpu_step_s": ("s", "the step as the GPU ran it: first instruction begin to the step's end event"),
    "instruction_span_s": ("s", "the GPU span of the step's instructions (first begin to last end)"),
    "non_instruction_gpu_s": ("s", "the step's GPU work after its last instruction (optimizer, gradient all-reduce)"),
    "non_instruction_energy_j": ("J", "energy of that non-instruction work"),
    "host_time_s": ("s", "the step on the host: step begin hook to step end hook"),
    "between_steps_s": ("s", "the step's work between steps after its last instruction (optimizer, all-reduce), "
                             "on the GPU's clock where it runs behind the host, else the host's; judged by the guard"),
    "between_steps_energy_j": ("J", "energy of that work between steps"),
    "predicted_slowdown": ("ratio", "deployed point's planned time / the probes' baseline (all-max) planned time"),
    "measured_slowdown": ("ratio", "median plan step time / median default-clock probe step time, same run"),
    "predicted_energy_ratio": ("ratio", "deployed point's planned job energy / the probes' baseline planned energy"),
    "measured_energy_ratio": ("ratio", "job energy of plan steps / of probes (the guard's energy test), same run"),
    "instructions_at_<MHz>mhz": ("count", "this step's instructions of this rank run (as planned) at that SM clock"),
    # at the steps where a probe window ended (job_saving.py): every rank has them, whichever logs
    "job_saving_ratio": ("fraction", "1 - the job's energy per plan step / per default-clock probe step, all GPUs, "
                                     "over the deployed steps so far"),
    "job_saving_low_ratio": ("fraction", "lower end of job_saving_ratio's 95 % interval"),
    "job_saving_high_ratio": ("fraction", "upper end of job_saving_ratio's 95 % interval"),
    "job_plan_energy_j": ("J", "energy per plan iteration of all GPUs of the job (the probe windows' medians)"),
    "job_baseline_energy_j": ("J", "energy per default-clock probe iteration of all GPUs of the job: the baseline"),
    "stage<S>_energy_j": ("J", "energy per plan iteration of pipeline stage S, all its GPUs (every pipeline)"),
    "stage<S>_baseline_energy_j": ("J", "energy per default-clock probe iteration of stage S, all its GPUs"),
    "stage<S>_saving_ratio": ("fraction", "1 - stage<S>_energy_j / stage<S>_baseline_energy_j"),
}


GRID_FIELDS = ("carbon_intensity", "carbon_g", "carbon_g_total", "job_power_w", "power_cap_w")
# Where the GPU runs behind the host (a GPU timeline: runtime/port/gpu_timeline.py); None otherwise.
GPU_TIME_FIELDS = ("gpu_step_s", "instruction_span_s", "non_instruction_gpu_s", "non_instruction_energy_j",
                   "host_time_s")
# Every step: its work between steps, a bucket of its own (runtime/port/gpu_timeline.py); None: unmeasured.
BETWEEN_STEPS_FIELDS = ("between_steps_s", "between_steps_energy_j")
# Deployed plan steps: the frontier's prediction against the same run's probes (prediction.py).
PREDICTION_FIELDS = ("predicted_slowdown", "measured_slowdown", "predicted_energy_ratio", "measured_energy_ratio")


def instructions_name(mhz: int) -> str:
    return f"{PREFIX}instructions_at_{int(mhz)}mhz"


def job_saving_scalars(figure: JobSavingFigure) -> dict[str, float]:
    """The job's saving and every stage's energy as scalars (names without ``PREFIX``)."""
    out = {"job_saving_ratio": figure.saving, "job_saving_low_ratio": figure.saving_low,
           "job_saving_high_ratio": figure.saving_high, "job_plan_energy_j": figure.energy_j,
           "job_baseline_energy_j": figure.baseline_energy_j}
    for stage, s in sorted(figure.stages.items()):
        out |= {f"stage{stage}_energy_j": s.energy_j, f"stage{stage}_baseline_energy_j": s.baseline_energy_j,
                f"stage{stage}_saving_ratio": s.saving}
    return out


@dataclass(frozen=True)
class StepMetrics:
    """One step of one rank, the runtime's one per-step record: ``Reporter`` keeps them (log line,
    metrics file via ``file_row``), sinks get them. ``None``: not known at this step.

    The engine builds it in two parts (``observe.Observer``): what the step measured, at once (the
    log and file lines come before the phase change they may cause), then what holds at step end
    (clock, straggler ratio, job check, totals), which is what sinks and ``Reporter.records`` see."""

    step: int
    rank: int
    phase: Phase
    time_s: float
    energy_j: float | None  # None: unmeasured (``StepNumbers.energy_j``): null in the file, left out of totals
    clock_mhz: int = 0  # requested at the end of the step
    energy_j_total: float = 0.0
    saving_j_total: float = 0.0
    straggler_ratio: float = 1.0
    instructions: dict[int, int] = field(default_factory=dict)  # this step, per clock (MHz); with sinks only
    instructions_total: dict[int, int] = field(default_factory=dict)  # all steps so far, per clock; with sinks only
    saving_ratio: float | None = None
    point_slowdown: float | None = None
    point_energy_j: float | None = None
    job_energy_j: float | None = None
    freq_mhz: int | None = None  # profiling clock, when sweeping
    target_time_s: float | None = None  # planned iteration time of the deployed point
    slowdown: float = 1.0  # deliberate slowdown ratio (straggler or external target)
    clocks: str | None = None  # deployed steps: "plan", or "default" for a default-clock probe (closed_loop.py)
    counted: bool | None = None  # deployed steps: in the same-run A/B (not a settle step after a clock change)
    # the grid's targets (grid.py): intensity in force, this step's and all steps' carbon, job power and cap
    carbon_intensity: float | None = None
    carbon_g: float | None = None
    carbon_g_total: float | None = None
    job_power_w: float | None = None
    power_cap_w: float | None = None
    # GPU time (GPU_TIME_FIELDS): time_s and energy_j are then the GPU step's, host_time_s the hooks'
    gpu_step_s: float | None = None
    instruction_span_s: float | None = None
    non_instruction_gpu_s: float | None = None
    non_instruction_energy_j: float | None = None
    host_time_s: float | None = None
    # BETWEEN_STEPS_FIELDS: the GPU's work after the last instruction (the step clock's non-instruction bucket)
    between_steps_s: float | None = None
    between_steps_energy_j: float | None = None
    # PREDICTION_FIELDS: the deployed point's predicted ratios to the baseline, and the measured ones
    predicted_slowdown: float | None = None
    measured_slowdown: float | None = None
    predicted_energy_ratio: float | None = None
    measured_energy_ratio: float | None = None
    # the job's saving against the probes and every stage's energy, at a step whose probe window ended
    job_saving: JobSavingFigure | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.phase, Phase):  # a phase's name ("deployed") is accepted too
            object.__setattr__(self, "phase", Phase(self.phase))

    @property
    def power_w(self) -> float | None:
        if self.energy_j is None:
            return None
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0

    def file_row(self) -> dict[str, Any]:
        """The step's line of the JSONL metrics file (and the demo's ``step_records``), before the
        reporter adds the baseline: the phase as its name; deployed steps say whose clocks they ran
        (``"clocks"``: ``"plan"``, or ``"default"`` for a probe), so the A/B comes from one run's file."""
        row = {"step": self.step, "phase": self.phase.value, "time_s": self.time_s, "energy_j": self.energy_j,
               "freq_mhz": self.freq_mhz, "target_time_s": self.target_time_s, "slowdown": self.slowdown}
        if self.clocks is not None:
            row["clocks"] = self.clocks
            row["counted"] = bool(self.counted)
        for name in GRID_FIELDS + GPU_TIME_FIELDS + BETWEEN_STEPS_FIELDS + PREDICTION_FIELDS:
            if getattr(self, name) is not None:
                row[name] = getattr(self, name)
        return row

    def scalars(self) -> dict[str, float]:
        """``{"perseus/energy_j": 12.3, ...}``: what scalar writers (TensorBoard, wandb, DeepSpeed) get."""
        out: dict[str, float] = {}
        if self.energy_j is not None:  # an unmeasured step has no energy_j or power_w (a gap in the chart)
            out.update(energy_j=self.energy_j, power_w=self.energy_j / self.time_s if self.time_s > 0 else 0.0)
        out |= {
            "time_s": self.time_s,
            "phase": float(PHASE_CODES.index(self.phase.value)) if self.phase.value in PHASE_CODES else -1.0,
            "clock_mhz": float(self.clock_mhz), "energy_j_total": self.energy_j_total,
            "saving_j_total": self.saving_j_total, "straggler_ratio": self.straggler_ratio,
        }
        for name in ("saving_ratio", "point_slowdown", "point_energy_j", "job_energy_j", *GRID_FIELDS,
                     *GPU_TIME_FIELDS, *BETWEEN_STEPS_FIELDS, *PREDICTION_FIELDS):
            value = getattr(self, name)
            if value is not None:
                out[name] = float(value)
        if self.job_saving is not None:
            out |= job_saving_scalars(self.job_saving)
        scalars = {PREFIX + k: float(v) for k, v in out.items()}
        for mhz, count in sorted(self.instructions.items()):
            scalars[instructions_name(mhz)] = float(count)
        return scalars

    def prometheus(self) -> dict[str, Any]:
        """The snapshot ``PrometheusExporter.update`` takes (see perseus/runtime/observe/prometheus.py)."""
        return {
            "phase": self.phase.value, "clock_mhz": self.clock_mhz,
            "energy_total_j": {str(self.rank): self.energy_j_total},
            "instructions_total": dict(self.instructions_total), "point_slowdown": self.point_slowdown,
            "point_energy_j": self.point_energy_j, "straggler_ratio": self.straggler_ratio,
            "energy_saving": self.saving_ratio, "energy_saved_total_j": self.saving_j_total,
            "job_energy_per_iteration_j": self.job_energy_j,
            "carbon_intensity": self.carbon_intensity, "carbon_total_g": self.carbon_g_total,
            "job_power_w": self.job_power_w, "power_cap_w": self.power_cap_w,
            **{name: getattr(self, name) for name in BETWEEN_STEPS_FIELDS + PREDICTION_FIELDS},
            **(job_saving_snapshot(self.job_saving) if self.job_saving is not None else {}),
        }


def job_saving_snapshot(figure: JobSavingFigure) -> dict[str, Any]:
    """The Prometheus snapshot keys of the job's saving and every stage's energy (prometheus.py)."""
    finite = {k: v for k, v in (("job_saving_low", figure.saving_low), ("job_saving_high", figure.saving_high))
              if math.isfinite(v)}
    return {"job_saving": figure.saving, **finite, "job_plan_energy_j": figure.energy_j,
            "job_baseline_energy_j": figure.baseline_energy_j,
            "stage_energy_j": {str(s): v.energy_j for s, v in figure.stages.items()},
            "stage_baseline_energy_j": {str(s): v.baseline_energy_j for s, v in figure.stages.items()},
            "stage_saving": {str(s): v.saving for s, v in figure.stages.items()}}


class MetricsBuilder:
    """Keeps the running totals between steps; ``complete`` is called once per step, at step end."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.energy_j_total = 0.0
        self.saving_j_total = 0.0
        self.instructions_total: dict[int, int] = {}

    def complete(self, record: StepMetrics, *, clock_mhz: int, instructions: dict[int, int] | None,
                 baseline_energy_j: float | None, straggler_ratio: float, point_slowdown: float | None = None,
                 point_energy_j: float | None = None, job_energy_j: float | None = None,
                 job_saving: JobSavingFigure | None = None) -> StepMetrics:
        """``record`` with what holds at step end and the running totals (instruction counts only
        when ``instructions`` is given: they are counted for sinks, not kept for every step). An
        unmeasured step adds nothing to the energy totals and has no saving."""
        saving_ratio = None
        if record.energy_j is not None:
            self.energy_j_total += record.energy_j
        if baseline_energy_j and record.energy_j is not None and record.phase is not Phase.WARMUP:
            self.saving_j_total += baseline_energy_j - record.energy_j
            saving_ratio = 1.0 - record.energy_j / baseline_energy_j
        counted: dict[str, Any] = {}
        if instructions is not None:
            for mhz, count in instructions.items():
                self.instructions_total[mhz] = self.instructions_total.get(mhz, 0) + count
            counted = {"instructions": dict(instructions), "instructions_total": dict(self.instructions_total)}
        return replace(
            record, clock_mhz=int(clock_mhz), energy_j_total=self.energy_j_total, saving_j_total=self.saving_j_total,
            straggler_ratio=straggler_ratio, saving_ratio=saving_ratio, point_slowdown=point_slowdown,
            point_energy_j=point_energy_j, job_energy_j=job_energy_j, job_saving=job_saving, **counted,
        )


@runtime_checkable
class MetricsSink(Protocol):
    """Where per-step metrics go. ``write`` runs at step end on the rank that owns the sink;
    ``close`` when the runtime closes. A sink that raises is dropped with one warning."""

    def write(self, step: int, metrics: StepMetrics) -> None: ...

    def close(self) -> None: ...


class PrometheusSink:
    """Feeds a ``PrometheusExporter``; closing the sink stops the exporter and frees its port."""

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter

    def write(self, step: int, metrics: StepMetrics) -> None:
        self.exporter.update(metrics.prometheus())

    def close(self) -> None:
        self.exporter.close()


class ScalarWriterSink:
    """A TensorBoard-style writer: ``writer.add_scalar(name, value, step)`` per metric.

    ``step_of(step)`` maps the runtime's step to the x-axis the framework uses (Megatron's
    iteration); the writer belongs to the caller, so ``close`` only flushes it.
    """

    def __init__(self, writer: Any, step_of: Any = None) -> None:
        self.writer = writer
        self.step_of = step_of

    def write(self, step: int, metrics: StepMetrics) -> None:
        x = self.step_of(step) if self.step_of is not None else step
        for name, value in metrics.scalars().items():
            self.writer.add_scalar(name, value, x)

    def close(self) -> None:
        flush = getattr(self.writer, "flush", None)
        if callable(flush):
            flush()


class WandbSink:
    """A wandb run (or the ``wandb`` module, as Megatron keeps it): ``log({name: value}, step)``."""

    def __init__(self, run: Any, step_of: Any = None) -> None:
        self.run = run
        self.step_of = step_of

    def write(self, step: int, metrics: StepMetrics) -> None:
        self.run.log(metrics.scalars(), self.step_of(step) if self.step_of is not None else step)

    def close(self) -> None:
        pass


class EventListSink:
    """DeepSpeed's monitor interface: ``monitor.write_events([(name, value, step), ...])``."""

    def __init__(self, monitor: Any, step_of: Any = None) -> None:
        self.monitor = monitor
        self.step_of = step_of

    def write(self, step: int, metrics: StepMetrics) -> None:
        x = self.step_of(step) if self.step_of is not None else step
        self.monitor.write_events([(name, value, x) for name, value in metrics.scalars().items()])

    def close(self) -> None:
        pass


def write_all(sinks: list[Any], step: int, metrics: StepMetrics) -> None:
    """Write to every sink; one that raises is dropped (training goes on) with a warning."""
    for sink in list(sinks):
        try:
            sink.write(step, metrics)
        except Exception as exc:  # noqa: BLE001 - a dashboard must never stop training
            sinks.remove(sink)
            log.warning("perseus: metrics sink %s failed (%s: %s); it gets no more metrics",
                        type(sink).__name__, type(exc).__name__, exc)
            close_quietly(sink)


def close_quietly(sink: Any) -> None:
    try:
        sink.close()
    except Exception as exc:  # noqa: BLE001 - a caller's sink may raise anything; closing goes on
        log.warning("perseus: closing metrics sink %s failed (%s)", type(sink).__name__, exc)
