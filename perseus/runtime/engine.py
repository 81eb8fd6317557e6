"""``PerseusRuntime``: the stateful engine adapters drive with step and instruction events.

One object per training process. It keeps the hot path and the phase transitions (``phases.py``);
each phase's work is a room of its own: getting a plan (``supply/``), which point runs
(``clocks/targeting.py``; the grid's carbon and power targets: ``clocks/grid.py``), following it (``clocks/deploy.py``),
checking it (``guard/``), what a rank shows (``observe/``), process exit (``lifecycle.py``).

Cost discipline: the instruction hooks do O(1) work — a clock read, an index compare, at most one
non-blocking request to the frequency controller. On a simulated GPU they also make each
instruction a kernel of it (``port/sim_kernels.py``), so lower clocks cost time in any client. All talk
with other ranks (the control plane, ``plane/``) is in ``on_step_end``, every rank at the
same step, so phase changes and plan switches happen on all ranks together.
"""

from __future__ import annotations

import logging
from time import monotonic
from typing import Any

from perseus.errors import PerseusError
from perseus.runtime.port.clock_trace import ClockTrace
from perseus.runtime.guard.clock_reasons import ClockReasonSource
from perseus.runtime.guard.closed_loop import ClosedLoop
from perseus.runtime.plane.collective import CollectiveError
from perseus.runtime.plane.design import open_control_plane
from perseus.runtime.clocks.grid import GridControl
from perseus.runtime.config import PerseusConfig
from perseus.runtime.clocks.deploy import Deployment, PlanFollower, SwitchTiming
from perseus.runtime.job import FusedBackward, PipelineJob
from perseus.runtime.port.gpu_port import FALLBACK_EVENTS, GPUPort, open_port
from perseus.runtime.port.gpu_timeline import HostSteps, InertSteps, StepClock, StepNumbers
from perseus.runtime.lifecycle import ensure_log_handler, track
from perseus.runtime.observe.metrics import MetricsSink, StepMetrics
from perseus.runtime.observe.observer import Observer, StepEnd
from perseus.runtime.phases import Phase, PhaseMachine, after_warmup
from perseus.runtime.measure.instruction_samples import instruction_keys
from perseus.runtime.observe.report import summary_line
from perseus.runtime.port.sim_kernels import SimulatedKernels, sending_instructions
from perseus.planner.stage_plan import StagePlan, StagePoint
from perseus.runtime.clocks.straggler import StragglerPolicy, natural_time
from perseus.runtime.supply.plan_supply import PlanSupply, ready_line
from perseus.runtime.clocks.targeting import PacedTarget, Targeting, TimeTarget
from perseus.schedules import InstructionKind

log = logging.getLogger("perseus.runtime")

# What the instruction hooks do, as one int the hot path compares against.
_HOT_IDLE, _HOT_PROFILE, _HOT_DEPLOY = 0, 1, 2


class PerseusRuntime:
    """Implements ``InstructionListener``; see docs/runtime.md for phases, protocol and config."""

    def __init__(self, job: PipelineJob, config: PerseusConfig | None = None, *, process_group: Any = None,
                 gpu: GPUPort | None = None) -> None:
        self.job = job
        self.config = c = config if config is not None else PerseusConfig()
        self._closed = self._stopped = False
        self._hot = _HOT_PROFILE  # warm-up times instructions one by one: the clock sustained under each kind
        self.sim_kernels: SimulatedKernels | None = None  # on a simulated GPU: each instruction is a kernel
        self.clock_trace: ClockTrace | None = None  # per-instruction clock events, with trace_clocks only
        self.prometheus: Any = None  # the PrometheusExporter when prometheus_port is set
        self.enabled, self.steps = c.enabled, InertSteps()  # type: bool, StepClock
        if not self.enabled:
            return
        job.check()
        self.schedule = job.build_schedule()
        self.collective = open_control_plane(job, process_group, c.collective_timeout_s, c.control_plane)
        self.rank = self.collective.rank
        self.is_root = self.collective.is_root
        if self.is_root:
            ensure_log_handler()
        self.gpu, c = open_port(c, self.collective, job.rank, gpu)  # measure-only where a rank may not change clocks
        self.config = c
        if (sim := self.gpu.sim_device) is not None:
            sends = sending_instructions(self.schedule, job.stage)  # waited for before a send (asynchronous)
            self.sim_kernels = SimulatedKernels(sim, sends=sends)
        if c.trace_clocks:
            self.clock_trace = self.gpu.trace = ClockTrace(self.gpu.sim_device, self.gpu.controller.pid)
        self.observe = Observer(self.rank, c, self.is_root)  # records, sinks, Prometheus, summary
        self.reporter, self.events = self.observe.reporter, self.observe.events
        self.phases = PhaseMachine()
        self.step = 0
        self._stage_instructions = self.schedule.stages[job.stage]
        switches = SwitchTiming(c.planner_options.switch_latency_s, c.switch_ahead, self.gpu.timed_requests,
                                self.is_root)
        # Steps, instructions and clock requests in the GPU's time where it runs behind the host
        # (port/gpu_timeline.py); host time for the synchronous simulated GPU. Energy: the poller's.
        timeline = self.gpu.open_timeline(switches.latency_s if switches.switch_ahead else 0.0,
                                          len(self.schedule.stages[job.stage]))
        self.steps = StepClock(timeline, HostSteps(self.gpu.energy_source(), monotonic, self.gpu.direct_energy_reader()), self.gpu.instruction_timer())
        self.measured = StepNumbers(0.0, 0.0, 0.0)  # the step that just ended: what the observer records
        # Profile, planner and cache (its key is the model): where the plan comes from (supply.py).
        self.supply = PlanSupply(job, self.schedule, c, self.collective, self.gpu, switches.hides or timeline is not None)
        # This rank's stage of the frontier (never the whole frontier: docs/runtime.md, "What a rank holds").
        self.frontier: StagePlan | None = None
        # Which of its points runs, from the targets in force (targeting.py).
        self.targeting = Targeting(StragglerPolicy(c.straggler_threshold, c.straggler_recover_threshold,
                                                   c.straggler_patience))
        self.deployment = Deployment(job.stage, switches, c.straggler_period_steps, self.gpu)
        self.loop = ClosedLoop(c, self.collective, job,  # probe blocks, the A/B, the no-slowdown guard
                               self.gpu if isinstance(self.gpu, ClockReasonSource) else None, self.schedule)
        self.grid = GridControl(c, self.collective, job)  # carbon and power targets (grid.py)
        self._follower: PlanFollower | None = None  # the hooks' view of the deployment: the point's follower
        self.job_numbers: dict[str, Any] = {}
        self._in_step = False
        track(self)
        try:
            self.grid.open()
            self._load_sources()
            self.cache = self.supply.cache
            self.prometheus = self.observe.start_prometheus(c.prometheus_port, self.collective)
        except PerseusError:
            self.close()
            raise

    def _load_sources(self) -> None:
        """Rank 0 finds a provided or cached frontier/profile; every rank learns the outcome."""
        sources = self.supply.load()
        if sources.plan is not None:
            self._take_plan(sources.plan, sources.received_bytes)
        if sources.origin:
            self._event("source", sources.origin)

    # ================================================================ hooks (hot path)

    def on_step_begin(self) -> None:
        trace = self.clock_trace
        if trace is not None and not self._closed:  # also after stop(): the re-measured baseline
            trace.step_begin("stopped" if self._stopped else self.phases.phase.value)
        if not self.enabled or self._closed or self._stopped:
            return
        if self.phases.phase in (Phase.DEPLOYED, Phase.FALLBACK):
            self._begin_deployed_step()
        if self._follower is not None:
            self._follower.start_step()
        self._in_step = True
        self.steps.step_begin()

    def on_instruction_begin(self, kind: InstructionKind, microbatch: int, chunk: int = 0,
                             backward: FusedBackward = None) -> None:
        trace = self.clock_trace
        t0 = monotonic() if trace is not None else 0.0
        hot = self._hot
        freq = None
        if hot == _HOT_DEPLOY:
            freq = self.deployment.begin_instruction(kind, microbatch, chunk, backward)
            if freq is None:
                self._mismatch()
        self.steps.begin((chunk, kind), hot == _HOT_PROFILE)  # after the clock request: may share its event
        if trace is not None:
            follower = self._follower  # set whenever a clock was requested (freq)
            planned = follower.planned() if freq is not None and follower is not None else None
            trace.begin(kind, microbatch, chunk, planned, t0, monotonic())
        kernels = self.sim_kernels
        if kernels is not None:  # after the clock request and the timer: the kernel runs inside both
            kernels.begin()

    def on_instruction_end(self, kind: InstructionKind, microbatch: int, chunk: int = 0,
                           backward: FusedBackward = None) -> None:
        trace = self.clock_trace
        t0 = monotonic() if trace is not None else 0.0
        kernels = self.sim_kernels
        if kernels is not None:  # the kernel ends (stretched by the clock) before it is timed
            kernels.end(kind, chunk)
        if trace is not None:
            trace.kernel_ended(monotonic())
        hot = self._hot
        if hot == _HOT_DEPLOY and self.deployment.watches_end:
            self.deployment.end_instruction()
        self.steps.end(hot == _HOT_PROFILE)
        if trace is not None:
            trace.end(t0, monotonic())

    def on_step_end(self) -> None:
        if self.clock_trace is not None and not self._closed:
            self.clock_trace.step_end()
        live = self.enabled and not self._closed and not self._stopped and self._in_step
        if live and self._hot == _HOT_DEPLOY:
            self.deployment.step_ending()  # default clocks for the work between steps (deploy.py)
        if self.sim_kernels is not None:  # the simulated GPU's optimizer tail, where its model has one
            self.sim_kernels.step_end(self.steps.host.mark_tail)
        if not live:
            return
        self._in_step = False
        phase = self.phases.phase
        self.measured = numbers = self.steps.step_end(phase in (Phase.PROFILING, Phase.WARMUP))  # GPU time where behind
        step_time, energy, span, between = numbers.time_s, numbers.energy_j, numbers.span_s, numbers.non_instruction_s
        profiling = self.supply.profiling if phase is Phase.PROFILING else None
        probe = phase is Phase.DEPLOYED and self.loop.probing  # this step ran at default clocks
        record = self.observe.record(self)
        self.step += 1
        self._check_notices()
        try:
            if phase is Phase.WARMUP:
                self.supply.warmup_step(numbers)  # the all-max step as the job runs it (hand-off, non-compute time)
                if self.step >= self.config.warmup_steps:
                    self._end_warmup()
            elif phase is Phase.PROFILING:
                if profiling is not None and profiling.take(numbers):
                    self._finish_profiling()
            elif phase is Phase.PLANNING:
                self._poll_plan()
            if self.phases.phase in (Phase.DEPLOYED, Phase.FALLBACK) and phase in (Phase.DEPLOYED, Phase.FALLBACK):
                assert self.frontier is not None  # deployed (or fallen back from it): a plan was taken
                self._after_deployed_step(natural_time(numbers.straggler_s, 1.0 if probe else self.targeting.slowdown),
                                          float("nan") if energy is None else energy)  # unmeasured: NaN (job check)
                running = self.phases.phase is Phase.DEPLOYED  # fallen back or not, a window's end is a collective
                decision = self.loop.end_step(span, energy, self.targeting, self.frontier, step_time, running, between)
                if decision is not None:  # every rank the same, at the same step: an event; a faster point or fallback
                    self._event("guard", self.loop.event(decision))
                    for what, data in self.loop.notes(self.is_root):
                        self._event(what, data)
                    if (problem := self.loop.apply(decision, self.targeting, self.is_root)) is not None:
                        self._fall_back(problem)
        except CollectiveError as exc:
            self._detach(exc)
        self._publish(record)

    # ================================================================ phases

    def _enter(self, phase: Phase) -> None:
        self.phases.enter(phase, self.step)
        self._event("phase", phase.value)
        self._hot = {Phase.PROFILING: _HOT_PROFILE, Phase.DEPLOYED: _HOT_DEPLOY}.get(phase, _HOT_IDLE)

    def _end_warmup(self) -> None:
        self.reporter.set_baseline([r for r in self.reporter.records if r.phase is Phase.WARMUP])
        self._event("sustained_clock", self.gpu.end_warmup_clocks(self.supply.warmup_timed).as_dict())  # sweep starts
        phase, why = after_warmup(self.frontier is not None, self.supply.have_profile, self.config.mode)
        {Phase.DEPLOYED: self._deploy, Phase.PLANNING: self._start_planning,
         Phase.PROFILING: self._start_profiling}.get(phase, lambda: self._steady(why or ""))()

    def _check_notices(self) -> None:
        """What the clock controller (``GPUPort.take_notices``) and the plan's supply reported since the last step."""
        for what, data in self.gpu.take_notices(self.rank) + self.supply.take_events():
            self._event(what, data)
            if what in FALLBACK_EVENTS:  # a deployed plan falls back (every rank follows at the next job check)
                self._fall_back(f"{FALLBACK_EVENTS[what]} on rank {self.rank}")

    def _fall_back(self, problem: str) -> None:
        """Default clocks from the next step on if a plan runs and has not fallen back (the host resets them)."""
        if self.phases.phase is Phase.DEPLOYED and self.deployment.problem is None:
            self._hot = _HOT_IDLE
            self.deployment.fall_back(problem, between_steps=True)
            self._enter_fallback()

    def _detach(self, exc: CollectiveError) -> None:
        """Another rank died or hung in a collective: no further collective, default clocks, still measured."""
        self._hot = _HOT_IDLE
        self.supply.detach()
        self.gpu.reset()
        log.warning("perseus: rank %d: %s. Another rank died or hung: continuing at default clocks without "
                    "Perseus from step %d", self.rank, exc, self.step)
        self._enter(Phase.STEADY)
        self._event("detached", str(exc))

    def _steady(self, why: str) -> None:
        if self.is_root:
            log.info("perseus: %s", why)
        self.gpu.reset()
        self._enter(Phase.STEADY)

    def _start_profiling(self) -> None:
        self.supply.start_profiling(instruction_keys(self._stage_instructions))
        self._enter(Phase.PROFILING)
        self.steps.discard()
        if self.supply.begin_profiling():  # a resumed sweep an earlier run had completed
            self._finish_profiling()

    def _finish_profiling(self) -> None:
        visited = self.supply.finish_profiling(self.gpu.clock_failure is None)
        if visited is None:
            self._steady("clock control failed on a rank while profiling; the profile is discarded, default clocks")
            return
        self._event("profiled", visited)
        self._event("profiling_overhead", self.observe.profiling_overhead())
        if not self.config.mode.plans:
            self._steady(f"profiling done; mode {self.config.mode.value!r} keeps default clocks")
        else:
            self._start_planning()

    def _start_planning(self) -> None:
        self.gpu.reset()
        self._enter(Phase.PLANNING)
        self.supply.start_planning()

    def _poll_plan(self) -> None:
        outcome = self.supply.poll()
        if outcome is None:
            return
        if outcome.plan is None:
            self._steady("no plan")
            return
        self._take_plan(outcome.plan, outcome.received_bytes)
        if self.config.mode.deploys:
            self._deploy()
        else:
            self._steady(ready_line(outcome.plan, self.config.mode))

    def _take_plan(self, plan: StagePlan, received_bytes: int) -> None:
        self.frontier = plan
        self._event("plan_received", {**plan.describe(), "bytes": received_bytes})

    # ---------------------------------------------------------------- deployment

    def _deploy(self) -> None:
        assert self.frontier is not None
        self.deployment.restart()
        self._follow(*self.targeting.deploy(self.frontier))
        self._enter(Phase.DEPLOYED)
        if self.gpu.clock_failure is not None:
            self._fall_back(f"clock control failed on rank {self.rank}")
        if self.is_root:
            log.info("perseus: plan deployed at step %d (%d frontier points)", self.step, len(self.frontier.points))

    def _follow(self, point: StagePoint | None, changed: bool = True) -> None:
        """The hooks follow ``point``'s clocks of this stage from the next instruction (None: no change)."""
        if point is None:
            return
        assert self.frontier is not None
        self.deployment.follow(self.frontier, point)
        self._follower = self.deployment.follower
        if changed:
            slowdown = self.targeting.slowdown
            self._event("point", {"time_s": point.time_s, "energy_j": point.energy_j, "slowdown": slowdown})
            if self.is_root:
                log.info("perseus: switching to the frontier point at %.4f s (slowdown x%.3f)", point.time_s, slowdown)

    def _begin_deployed_step(self) -> None:
        """A new point when the targets changed (targeting.py); this step's clocks: the plan's or a probe's."""
        assert self.frontier is not None  # deployed (or fallen back from it): a plan was taken
        if self.targeting.due and self.phases.phase is Phase.DEPLOYED:
            self._follow(self.targeting.retarget(self.frontier))
            self.loop.retarget()
        was_probing = self.loop.probing
        if self.loop.begin_step(self.step).default_clocks != was_probing and self.deployment.problem is None:
            point = self.loop.point_now(self.targeting, self.frontier)
            self._hot = _HOT_IDLE if point is None else _HOT_DEPLOY
            self._follow(point, changed=False)
            if point is None:  # default clocks; with a GPU timeline the GPU finished the last step: now
                self.gpu.reset() if self.gpu.timeline is not None else self.gpu.release()

    def _mismatch(self) -> None:
        """First divergence from the plan: one warning, default clocks from now on."""
        self._hot = _HOT_IDLE
        self.deployment.diverged()

    def _after_deployed_step(self, natural_s: float, energy: float) -> None:
        if self._hot == _HOT_DEPLOY and self._follower is not None and not self._follower.end_step():
            self._mismatch()
        if self.deployment.problem is not None:
            self._enter_fallback()
        # Every K steps: all-gather per-rank numbers (``job_check``); spread a fallback; straggler policy.
        check = self.deployment.end_step(natural_s, energy, self.collective, self.job, self.step)
        if check is not None:
            self.job_numbers = check.numbers
            if check.diverged:
                self._fall_back("another rank fell back to default clocks (its log says why)")
                self._enter_fallback()
            else:
                self._event("slowdown_seen", check.slowdown)
                if self.targeting.observe_slowdown(check.slowdown):
                    self._event("straggler", self.targeting.straggler_ratio)
        self.grid.end_step(self.targeting, self.frontier)  # every rank: rank 0's grid decision

    def _enter_fallback(self) -> None:
        if self.phases.phase is Phase.DEPLOYED:
            self._enter(Phase.FALLBACK)
            self._event("fallback", self.deployment.problem)

    # ================================================================ public control

    def set_target_time(self, seconds: float) -> None:
        """Run at the least-energy plan finishing within ``seconds`` (planned time), from the next step."""
        self.targeting.set_external(TimeTarget(seconds))

    def set_target_slowdown(self, ratio: float) -> None:
        """Iterations last ``ratio`` × the default plan's time anyway (behind a straggler): least energy at that pace."""
        self.targeting.set_external(PacedTarget(ratio))

    def clear_target(self) -> None:
        """Back to the straggler policy / no-slowdown default at the next step."""
        self.targeting.set_external(None)

    def stop(self) -> None:
        """Default clocks from now on, in effect when this returns (A/B runs; docs/runtime.md). Only ``close`` follows."""
        self._hot, self._stopped = _HOT_IDLE, True
        if self.enabled and not self._closed:
            self.gpu.reset()

    def stage_clocks(self) -> list[int] | None:
        """The current point's clocks (MHz) of this rank's stage, one per instruction; None before deployment."""
        return self._follower.frequencies if self.enabled and self._follower is not None else None

    @property
    def phase(self) -> Phase:
        return self.phases.phase if self.enabled else Phase.STEADY

    def _event(self, what: str, data: Any) -> None:
        self.observe.event(what, self.step, data)

    # ================================================================ observation and shutdown

    def add_metrics_sink(self, sink: MetricsSink) -> None:
        """Give every step's ``StepMetrics`` to ``sink`` (``write`` at step end, ``close`` at close; metrics.py)."""
        if self.enabled and not self._closed:
            self.observe.add_sink(sink)

    def _publish(self, record: StepMetrics) -> None:
        job, t = self.job_numbers, self.targeting
        self.observe.publish(record, StepEnd(
            self.gpu.current_mhz, self.gpu.default_mhz, self._follower, t.point, t.slowdown, t.straggler_ratio,
            job.get("energy_per_iteration_j") if job.get("answered_step") == self.step else None,
            len(self._stage_instructions)))

    def summary(self) -> dict[str, Any]:
        """Measured results of this rank (energies are this rank's GPU) plus job-wide numbers when known."""
        if not self.enabled:
            return {"enabled": False}
        return self.observe.summary(self.observe.facts(self))

    def close(self, *, plan_wait_s: float | None = None) -> None:
        """Reset clocks to default and release the GPU; idempotent, safe in error paths. While planning, rank 0 first
        gives the planner up to ``plan_wait_s`` (default ``close_plan_wait_s``) to cache the frontier (``planning``)."""
        if self._closed:
            return
        self._closed, self._hot = True, _HOT_IDLE
        if not self.enabled:
            return
        kernels, self.sim_kernels = self.sim_kernels, None
        if kernels is not None:
            kernels.close()
        self.supply.close(self.config.close_plan_wait_s if plan_wait_s is None else plan_wait_s)
        self.grid.close()
        self.observe.close_sinks()
        try:
            self.gpu.close()
        finally:
            self.collective.close()  # no collective after this: the control plane's thread and groups go
            self.observe.close()
            if self.is_root and self.phases.history:
                log.info("%s", summary_line(self.summary()))

    def __enter__(self) -> PerseusRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
