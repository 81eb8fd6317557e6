"""What a rank shows of its run: per-step records, the metric sinks, Prometheus, events, the summary.

Why a room of its own: the engine decides, this only reports, and reporting grows (dashboards,
sinks per framework) without touching the hot path or the phase changes. ``Observer`` holds the
``Reporter`` (log line, JSONL metrics file, the records), the sinks (``metrics.py``) and the
Prometheus exporter; the engine hands it values at step end and gets ``StepMetrics`` back.

The observer reads the engine's rooms through one declared view, ``RunView`` (``PerseusRuntime``
satisfies it): ``record`` and ``facts`` take it, not a keyword per collaborator.

A step's record is made in two parts, both at step end: ``record`` right after the step is
measured (its log and file lines precede the phase change it may cause, as they always did), and
``publish`` once the step's phase logic ran, with one ``StepEnd`` value (the clock requested now,
the straggler ratio and job check of this step; the observer adds the running totals): that form
replaces the first in ``Reporter.records`` and goes to every sink. The first part cannot wait for
the second: warm-up's end reads the step's record as a baseline, profiling's end reads it for the
profiling overhead, and the step's file line precedes the phase-change events it causes
(docs/runtime.md, "A step's record").
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from perseus.errors import ConfigError, PerseusError
from perseus.runtime.observe.job_saving import JobSaving, JobSavingFigure, WindowSource
from perseus.runtime.observe.metrics import MetricsBuilder, MetricsSink, PrometheusSink, StepMetrics, close_quietly, write_all
from perseus.runtime.phases import Phase, PhaseMachine
from perseus.runtime.observe.prediction import PredictionCheck, PredictionWatch, predict
from perseus.runtime.observe.report import Reporter, RunFacts, profiling_overhead, summarize

if TYPE_CHECKING:
    from perseus.runtime.clocks.grid import GridControl
    from perseus.runtime.port.gpu_port import GPUPort
    from perseus.runtime.port.gpu_timeline import StepNumbers
    from perseus.runtime.guard.closed_loop import ClosedLoop, Samples
    from perseus.runtime.plane.collective import Collective
    from perseus.runtime.config import PerseusConfig
    from perseus.runtime.guard.ab import ABFigure
    from perseus.runtime.clocks.deploy import Deployment, PlanFollower
    from perseus.runtime.job import PipelineJob
    from perseus.planner.stage_plan import StagePlan, StagePoint
    from perseus.runtime.supply.plan_supply import PlanSupply
    from perseus.runtime.clocks.targeting import Targeting

log = logging.getLogger("perseus.runtime")

J_PER_KWH = 3.6e6


class RunView(Protocol):
    """What the observer reads of a run (``PerseusRuntime`` is one): its rooms as they stand.
    ``step``: the step being recorded at ``record`` (not yet counted), the steps run at ``facts``;
    ``measured``: the numbers of the step that just ended."""

    job: PipelineJob
    step: int
    measured: StepNumbers
    phases: PhaseMachine
    supply: PlanSupply
    targeting: Targeting
    loop: ClosedLoop
    deployment: Deployment
    frontier: StagePlan | None
    gpu: GPUPort
    grid: GridControl
    job_numbers: dict[str, Any]


@dataclass(frozen=True)
class StepEnd:
    """What holds at a step's end, once its phase logic ran: one value the engine reads off its
    rooms, so ``Observer.publish`` takes it instead of a keyword per collaborator.

    ``point``: the point being run, if any, with its ``slowdown``; ``follower``: the plan's, whose
    instructions per clock a deployed step counts; ``job_energy_j``: the job check's answer when it
    came at this step."""

    clock_mhz: int
    default_mhz: int
    follower: PlanFollower | None
    point: StagePoint | None
    slowdown: float
    straggler_ratio: float
    job_energy_j: float | None
    stage_instructions: int


def step_medians(samples: Samples) -> dict[str, Any] | None:
    """Median instruction span (GPU time where the GPU runs behind the host) and energy of the
    guard's counted steps of one kind, with how many; None before one was measured."""
    if not samples.energy_j:
        return None
    return {"time_s": median(samples.time_s), "energy_j": median(samples.energy_j), "steps": len(samples.time_s)}


class GridFields(NamedTuple):
    """A step's fields of ``StepMetrics`` from the grid's target (None: no target, or no intensity)."""

    carbon_intensity: float | None = None
    carbon_g: float | None = None
    carbon_g_total: float | None = None
    job_power_w: float | None = None
    power_cap_w: float | None = None


class Observer:
    """One rank's records, events, sinks and exporter; ``close`` closes them all."""

    def __init__(self, rank: int, config: PerseusConfig, is_root: bool) -> None:
        self.rank = rank
        self.config = config
        self.reporter = Reporter(rank, config.log_every_steps, config.metrics_file if is_root else None)
        self.events: list[tuple[int, str, Any]] = []  # (step, what, data): the run's events, in order
        self.sinks: list[MetricsSink] = []  # written at step end
        self.prometheus: Any = None  # the PrometheusExporter when prometheus_port is set
        self._totals = MetricsBuilder(rank)
        self.carbon_g_total = 0.0  # this GPU's carbon over the steps with an intensity in force
        self.prediction = PredictionWatch()  # the deployed plan's prediction against the probes
        self.job_saving = JobSaving()  # the job's and every stage's saving, from the guard's windows
        self._windows: WindowSource | None = None  # the run's guard, once a step was recorded

    def start_prometheus(self, port: int | None, collective: Collective) -> Any:
        """One exporter per rank on the config's ``prometheus_addr`` when ``port`` is set (N: N + LOCAL_RANK;
        0: any free port), returned. Every rank agrees: if one cannot start, all raise (the caller closes)."""
        if port is None:
            return None
        from perseus.runtime.observe.prometheus import PrometheusExporter

        if port:
            port += int(os.environ.get("LOCAL_RANK", "0") or 0)
        error: PerseusError | None = None
        try:
            self.prometheus = PrometheusExporter(port, self.config.prometheus_addr)
        except PerseusError as exc:
            error = exc
        if not collective.all_true(error is None):
            raise error or ConfigError("perseus: another rank could not start its Prometheus exporter (see its log)")
        self.sinks.append(PrometheusSink(self.prometheus))
        log.info("perseus: rank %d serves Prometheus metrics at %s", self.rank, self.prometheus.url)
        return self.prometheus

    def add_sink(self, sink: MetricsSink) -> None:
        self.sinks.append(sink)

    def event(self, what: str, step: int, data: Any) -> None:
        """One of the run's events (phase change, plan deployed, straggler switch), kept and written
        as a non-step line of the metrics file."""
        self.events.append((step, what, data))
        self.reporter.write_event(what, step=step, data=data)

    # ---------------------------------------------------------------- per step (step end only)

    def record(self, run: RunView) -> StepMetrics:
        """The step ``run`` just measured (a deployed plan step with its point's planned time and
        slowdown, a deployed probe step marked ``clocks="default"``; a profiled one with its sweep's
        clock): kept, logged (with the same-run A/B, ``closed_loop.py``) and written to the metrics
        file now, before the step's phase logic."""
        numbers, phase, targeting, loop = run.measured, run.phases.phase, run.targeting, run.loop
        self._windows = loop
        time_s, energy_j = numbers.time_s, numbers.energy_j
        profiling = run.supply.profiling if phase is Phase.PROFILING else None
        sweep = profiling.sweep if profiling is not None else None
        deployed = phase is Phase.DEPLOYED
        plan_step = deployed and not loop.probing and targeting.point is not None
        point = targeting.point if plan_step else None
        grid = self._grid_fields(targeting, energy_j)
        gpu = numbers if numbers.gpu_time else None  # the GPU ran it behind the host (port/gpu_timeline.py)
        figure = loop.figure() if deployed else None
        check = self._prediction(run, point, figure)
        record = StepMetrics(step=run.step, rank=self.rank, phase=phase, time_s=time_s, energy_j=energy_j,
                             freq_mhz=sweep.current_mhz if sweep is not None else None,
                             target_time_s=point.time_s if point is not None else None,
                             slowdown=targeting.slowdown if plan_step else 1.0,
                             clocks=loop.clocks if deployed else None,
                             counted=loop.role.counted if deployed else None,
                             carbon_intensity=grid.carbon_intensity, carbon_g=grid.carbon_g,
                             carbon_g_total=grid.carbon_g_total, job_power_w=grid.job_power_w,
                             power_cap_w=grid.power_cap_w,
                             gpu_step_s=gpu.time_s if gpu else None, instruction_span_s=gpu.span_s if gpu else None,
                             non_instruction_gpu_s=gpu.non_instruction_s if gpu else None,
                             non_instruction_energy_j=gpu.non_instruction_energy_j if gpu else None,
                             host_time_s=gpu.host_s if gpu else None,
                             between_steps_s=numbers.non_instruction_s,
                             between_steps_energy_j=numbers.non_instruction_energy_j,
                             predicted_slowdown=check.predicted_slowdown if check else None,
                             measured_slowdown=check.measured_slowdown if check else None,
                             predicted_energy_ratio=check.predicted_energy_ratio if check else None,
                             measured_energy_ratio=check.measured_energy_ratio if check else None)
        this_step = loop.step_figure(time_s, energy_j) if plan_step else None
        self.reporter.add(record, this_step=this_step, run=figure)
        if check is not None and self.prediction.observe(check, loop.windows, self._reprofile(run)):
            self.event("prediction", run.step, check.as_dict())  # once per guard window
        return record

    def _prediction(self, run: RunView, point: StagePoint | None, figure: ABFigure | None) -> PredictionCheck | None:
        """A plan step's check of the frontier's prediction (``prediction.py``); None on other steps."""
        if point is None or (plan := run.frontier) is None:
            return None
        last = run.loop.last
        return predict(plan, point, run.loop.reference_point(run.targeting, plan), figure,
                       last.energy if last is not None else None, run.job.world_size == 1)

    @staticmethod
    def _reprofile(run: RunView) -> str:
        """How a user makes the run profile again: its cache entry, where there is one."""
        cache = run.supply.cache
        if cache is not None:
            return f"delete the cache entry {cache.dir} and restart"
        return "restart without frontier_path/profile_path so it profiles again (no cache entry: cache_dir is null or the plan was given)"

    def _grid_fields(self, targeting: Targeting, energy_j: float | None) -> GridFields:
        """The step's carbon (this GPU's energy at the intensity in force; None when unmeasured) and
        the job's planned power against the cap, while a grid target is set (``grid.py``)."""
        grid = targeting.grid
        if grid is None:
            return GridFields()
        if grid.intensity is None:
            return GridFields(job_power_w=grid.job_power_w, power_cap_w=grid.power_cap_w)
        carbon = None if energy_j is None else energy_j * grid.intensity / J_PER_KWH
        self.carbon_g_total += carbon or 0.0
        return GridFields(grid.intensity, carbon, self.carbon_g_total, grid.job_power_w, grid.power_cap_w)

    def publish(self, record: StepMetrics, end: StepEnd) -> StepMetrics:
        """``record`` completed with what holds at step ``end``, kept in place of it and given to
        every sink. Instructions per clock are counted for sinks only: the plan's (``end.follower``)
        on a deployed step, else all at the step's one clock."""
        point = end.point if record.phase is Phase.DEPLOYED else None

        def instructions() -> dict[int, int]:
            if record.phase is Phase.DEPLOYED and end.follower is not None:
                return end.follower.step_clocks(end.default_mhz)
            return {record.freq_mhz if record.freq_mhz is not None else end.default_mhz: end.stage_instructions}

        full = self._totals.complete(
            record, clock_mhz=end.clock_mhz, instructions=instructions() if self.sinks else None,
            baseline_energy_j=self.reporter.baseline_energy_j, straggler_ratio=end.straggler_ratio,
            point_slowdown=end.slowdown if point is not None else None,
            point_energy_j=point.energy_j if point is not None else None, job_energy_j=end.job_energy_j,
            job_saving=self._job_window(record.step + 1),
        )
        self.reporter.complete(full)
        if self.sinks:
            write_all(self.sinks, full.step, full)
        return full

    def _job_window(self, step: int) -> JobSavingFigure | None:
        """The job's saving when a probe window ended at this step (``job_saving.py``), also a
        ``job_saving`` event (the metrics file's line, at the step the guard's event has); else None."""
        if self._windows is None or not self.job_saving.follow(self._windows):
            return None
        figure = self.job_saving.figure
        assert figure is not None  # follow() is True only when it made one
        self.event("job_saving", step, figure.as_dict())
        return figure

    # ---------------------------------------------------------------- results

    def profiling_overhead(self) -> dict[str, Any] | None:
        """What profiling cost against default clocks, like with like (``report.profiling_overhead``)."""
        return profiling_overhead(self.reporter.records)

    def summary(self, facts: RunFacts) -> dict[str, Any]:
        """``summarize`` on this rank's records, plus where its Prometheus exporter serves."""
        out = summarize(self.reporter, facts)
        if self.prometheus is not None:
            out["prometheus"] = {"addr": self.prometheus.addr, "port": self.prometheus.port, "url": self.prometheus.url}
        return out

    def facts(self, run: RunView) -> RunFacts:
        """The summary's facts, read off the run's rooms."""
        c, profiling, loop, latency = self.config, run.supply.profiling, run.loop, run.supply.switch_latency
        return RunFacts(
            rank=self.rank, job=run.job, mode=c.mode.value, phase=run.phases.phase, steps=run.step,
            phase_history=list(run.phases.history),
            p_blocking_w=profiling.p_blocking_w if profiling is not None else run.supply.p_blocking_w,
            fallback=run.deployment.problem, slowdown=run.targeting.slowdown, clock_mhz=run.gpu.current_mhz,
            events=self.events, job_numbers=run.job_numbers, sweep=profiling.sweep if profiling is not None else None,
            profiling_iterations=c.warmup_steps + profiling.iterations() if profiling is not None else None,
            frontier=run.frontier, point=run.targeting.point,
            closed_loop=loop.summary() if loop.steps else None, grid=run.grid.summary(),
            switch_latency=latency.as_dict() if latency is not None else None,
            prediction=self.prediction.last.as_dict() if self.prediction.last is not None else None,
            probe_baseline=step_medians(loop.probes), plan_medians=step_medians(loop.plan),
            job_saving=self.job_saving.figure.as_dict() if self.job_saving.figure is not None else None)

    def close_sinks(self) -> None:
        """Close every sink (the Prometheus exporter with its sink); no more metrics after this."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            close_quietly(sink)

    def close(self) -> None:
        self.close_sinks()
        self.reporter.close()

