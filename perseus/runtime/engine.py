"""``PerseusRuntime``: the stateful engine adapters drive with step and instruction events.

One object per training process. It keeps the hot path and the phase transitions (``phases.py``):
warm-up at default clocks (baseline), online profiling (``profiling.py``: the clock sweep of
``clock_sweep.py`` measured by ``profiler.py``), planning on rank 0 in a niced child process while
training continues (``planning.py``), then deployment of the frontier's default point
(``deploy.py``), with straggler matching (``job_check.py``, ``straggler.py``) and external targets
on top. Where the plan comes from (``sources.py``), the summary (``report.py``) and closing at
process exit (``lifecycle.py``) are small pieces of their own that return values.

Cost discipline: the instruction hooks do O(1) work — a clock read, an index compare, at most one
non-blocking request to the frequency controller. On a simulated GPU they also make each
instruction a kernel of it (``sim_kernels.py``), so lower clocks cost time in any client. Everything that talks to other ranks
(``collective.py``, a dedicated gloo group) runs in ``on_step_end`` on every rank at the same
step, so phase changes and plan switches happen on all ranks together.
"""

from __future__ import annotations

import logging
from time import monotonic, perf_counter
from typing import Any

from perseus.errors import ConfigError, PerseusError
from perseus.profile import Profile
from perseus.runtime.aggregate import aggregate_profile
from perseus.runtime.clock_trace import ClockTrace
from perseus.runtime.collective import Collective, CollectiveError
from perseus.runtime.config import PerseusConfig
from perseus.runtime.deploy import PlanFollower, TimedSwitches
from perseus.runtime.events import PipelineJob
from perseus.runtime.gpu_port import GPUPort
from perseus.runtime.job_check import check_job
from perseus.runtime.lifecycle import ensure_log_handler, install_exit_hooks, track
from perseus.runtime.metrics import MetricsBuilder, MetricsSink, PrometheusSink, close_quietly, write_all
from perseus.runtime.phases import Phase, PhaseMachine
from perseus.runtime.planning import BackgroundPlanner, share_outcome, start_child, stop_child
from perseus.runtime.profiler import instruction_keys
from perseus.runtime.profiling import ProfilingRun, describe_noise, partial_saver, profiling_overhead
from perseus.runtime.report import Reporter, StepRecord, summarize, summary_line
from perseus.runtime.sim_kernels import SimulatedKernels
from perseus.runtime.sources import cache_key, open_cache, share_sources
from perseus.runtime.stage_plan import StagePlan, StagePoint
from perseus.runtime.straggler import StragglerPolicy, natural_time
from perseus.schedule import InstructionKind
from perseus.switch_timing import request_schedule

log = logging.getLogger("perseus.runtime")

# What the instruction hooks do, as one int the hot path compares against.
_HOT_IDLE, _HOT_PROFILE, _HOT_DEPLOY = 0, 1, 2


class PerseusRuntime:
    """Implements ``InstructionListener``; see docs/runtime.md for phases, protocol and config."""

    def __init__(
        self,
        job: PipelineJob,
        config: PerseusConfig | None = None,
        *,
        process_group: Any = None,
        gpu: GPUPort | None = None,
    ) -> None:
        self.job = job
        self.config = config if config is not None else PerseusConfig()
        self._closed = False
        self._stopped = False
        self._hot = _HOT_IDLE
        # On a simulated GPU every observed instruction is one of its kernels; None on real GPUs.
        self.sim_kernels: SimulatedKernels | None = None
        self._switch_ahead = self.config.switch_ahead
        # Per-instruction clock events (clock_trace.py); None unless trace_clocks: one test per hook.
        self.clock_trace: ClockTrace | None = None
        self.enabled = self.config.enabled
        self._sinks: list[MetricsSink] = []  # per-step metrics (metrics.py), written at step end
        self.prometheus: Any = None  # the PrometheusExporter when prometheus_port is set
        if not self.enabled:
            return
        job.check()
        self.schedule = job.build_schedule()
        self.collective = Collective(process_group, self.config.collective_timeout_s)
        self.rank = self.collective.rank
        self.is_root = self.collective.is_root
        if self.is_root:
            ensure_log_handler()
        install_exit_hooks()  # before the controller starts, so its SIGTERM handler chains to ours
        self.gpu = self._open_gpu(gpu)
        if self.gpu.is_simulated:
            self.sim_kernels = SimulatedKernels(self.gpu.device)
        if self.config.trace_clocks:
            self.clock_trace = ClockTrace(self.gpu.device if self.gpu.is_simulated else None,
                                          getattr(self.gpu.controller, "pid", None))
        self.reporter = Reporter(self.rank, self.config.log_every_steps, self.config.metrics_file if self.is_root else None)
        self.phases = PhaseMachine()
        self.step = 0
        self._stage_instructions = self.schedule.stages[job.stage]
        self._keys = instruction_keys(self._stage_instructions)
        self.timer = self.gpu.instruction_timer()
        self._profiling: ProfilingRun | None = None
        self.p_blocking_w: float | None = None
        # This rank's stage of the frontier (never the whole frontier: docs/runtime.md, "What a rank holds").
        self.frontier: StagePlan | None = None
        self.point: StagePoint | None = None
        self._follower: PlanFollower | None = None
        # The plan's clock switches asked for at planned times (a known switch latency), else None.
        self._timed: TimedSwitches | None = None
        self._timing_note: str | None = None  # why a known latency is not hidden, said once
        self._slowdown = 1.0
        self._policy = StragglerPolicy(
            self.config.straggler_threshold, self.config.straggler_recover_threshold, self.config.straggler_patience
        )
        self._external: tuple[str, float] | None = None
        self._target_dirty = False
        self._window: list[tuple[float, float]] = []  # (natural time, energy) since the last check
        self._deployed_steps = 0
        self._fallback_problem: str | None = None
        self._fallback_warned = False
        self._clock_failure: str | None = None  # the device refused a clock: default clocks for good
        self._planner: BackgroundPlanner | None = None  # rank 0 only
        self._planner_child: Any = None  # rank 0: the planner process, started while profiling
        self._profile: Profile | None = None
        self._have_profile = False
        self.events: list[tuple[int, str, Any]] = []
        self.job_numbers: dict[str, Any] = {}
        self._step_t0 = self._step_e0 = self._last_end = 0.0
        self._in_step = False
        self.cache = open_cache(self.config, self._cache_key()) if self.is_root else None
        track(self)
        self._load_sources()
        self._metrics = MetricsBuilder(self.rank)
        self._start_prometheus()

    # ================================================================ setup

    def _open_gpu(self, gpu: GPUPort | None) -> GPUPort:
        control = self.config.mode != "measure-only"
        error: PerseusError | None = None
        port = gpu
        if port is None:
            try:
                port = GPUPort.open(self.config.gpu, self._device_index(), self.config.sim_gpu, control=control,
                                    clock_check_s=self.config.clock_check_s)
            except PerseusError as exc:
                error = exc
        if not self.collective.all_true(error is None):
            if port is not None:
                port.close()
            raise error or ConfigError("perseus: another rank could not open its GPU or control its clocks (see its log)")
        assert port is not None
        return port

    def _device_index(self) -> int | None:
        """The configured index; simulated GPUs default to the global rank (they are files named by
        index, so every rank would otherwise share GPU 0). NVML's default, the current CUDA
        device, is already right."""
        from perseus.gpu.factory import resolve_kind

        if self.config.device_index is None and resolve_kind(self.config.gpu) == "sim":
            return self.job.rank
        return self.config.device_index

    def _cache_key(self) -> dict[str, Any]:
        return cache_key(self.job, self.schedule, self.gpu.name, self.gpu.driver_version, self.config)

    def _load_sources(self) -> None:
        """Rank 0 finds a provided or cached frontier/profile; every rank learns the outcome."""
        try:
            sources = share_sources(self.collective, self.config, self.schedule, self.job.stage, self.cache,
                                    timing=self._hides_latency())
        except ConfigError:
            self.close()
            raise
        self.frontier = sources.plan
        if sources.plan is not None:
            self._plan_received(sources.plan, sources.received_bytes)
        self._profile = sources.profile
        self._have_profile = sources.have_profile
        if sources.origin:
            self._event("source", sources.origin)

    # ================================================================ hooks (hot path)

    def on_step_begin(self) -> None:
        trace = self.clock_trace
        if trace is not None and not self._closed:  # also after stop(): the re-measured baseline
            trace.step_begin("stopped" if self._stopped else self.phases.phase.value)
        if not self.enabled or self._closed or self._stopped:
            return
        if self._target_dirty and self.phases.phase is Phase.DEPLOYED:
            self._retarget()
        if self._follower is not None:
            self._follower.start_step()
        self._in_step = True
        self._step_e0 = self.gpu.energy_j()
        self._step_t0 = self._last_end = perf_counter()

    def on_instruction_begin(self, kind: InstructionKind, microbatch: int, chunk: int = 0) -> None:
        trace = self.clock_trace
        t0 = monotonic() if trace is not None else 0.0
        hot = self._hot
        freq = None
        if hot == _HOT_DEPLOY:
            freq = self._follower.next(kind, microbatch, chunk)  # type: ignore[union-attr]
            if freq is None:
                self._mismatch()
            elif self._timed is not None:
                # Switches asked for at planned times (docs/runtime.md, "Clock-switch latency").
                index = self._follower.index  # type: ignore[union-attr]
                if self._timed.watches(index, False):
                    for clock, at in self._timed.begin(index, monotonic()):
                        self._request_at(clock, at)
            elif freq != self.gpu.current_mhz:
                self._request(freq)
        elif hot == _HOT_PROFILE:
            self.timer.begin((chunk, kind))
        if trace is not None:
            planned = self._follower.planned() if freq is not None else None  # type: ignore[union-attr]
            trace.begin(kind, microbatch, chunk, planned, t0, monotonic())
        kernels = self.sim_kernels
        if kernels is not None:  # after the clock request and the timer: the kernel runs inside both
            kernels.begin()

    def on_instruction_end(self, kind: InstructionKind, microbatch: int, chunk: int = 0) -> None:
        trace = self.clock_trace
        t0 = monotonic() if trace is not None else 0.0
        kernels = self.sim_kernels
        if kernels is not None:  # the kernel ends (stretched by the clock) before it is timed
            kernels.end()
        if trace is not None:
            trace.kernel_ended(monotonic())
        hot = self._hot
        if hot == _HOT_DEPLOY:
            if self._timed is not None:
                index = self._follower.index  # type: ignore[union-attr]
                if self._timed.watches(index, True):
                    for clock, at in self._timed.end(index, monotonic()):
                        self._request_at(clock, at)
            elif self._switch_ahead:
                # Ask for the next instruction's clock now: the switch latency overlaps the wait
                # for its input instead of delaying it (docs/runtime.md, "Clock-switch latency").
                freq = self._follower.peek()  # type: ignore[union-attr]
                if freq != self.gpu.current_mhz:
                    self._request(freq)
        elif hot == _HOT_PROFILE:
            self.timer.end()
        self._last_end = perf_counter()
        if trace is not None:
            trace.end(t0, monotonic())

    def _request(self, freq: int) -> None:
        """A clock request from a hook (recorded in the clock trace when there is one)."""
        self.gpu.request(freq)
        if self.clock_trace is not None:
            self.clock_trace.requested(freq, monotonic())

    def _request_at(self, freq: int, at: float) -> None:
        """A clock request from a hook, to be made at CLOCK_MONOTONIC ``at`` (recorded in the trace)."""
        self.gpu.request_at(freq, at)
        if self.clock_trace is not None:
            self.clock_trace.requested(freq, at)

    def on_step_end(self) -> None:
        if self.clock_trace is not None and not self._closed:
            self.clock_trace.step_end()
        if not self.enabled or self._closed or self._stopped or not self._in_step:
            return
        self._in_step = False
        t1 = perf_counter()
        energy = self.gpu.energy_j() - self._step_e0
        step_time = t1 - self._step_t0
        span = max(self._last_end - self._step_t0, 1e-9)
        phase = self.phases.phase
        record = StepRecord(self.step, phase.value, step_time, energy)
        if phase is Phase.PROFILING and self._profiling is not None:
            record.freq_mhz = self._profiling.sweep.current_mhz
        if phase is Phase.DEPLOYED and self.point is not None:
            record.target_time_s = self.point.time_s
            record.slowdown = self._slowdown
        self.reporter.add(record)
        self.step += 1
        self._check_notices()
        try:
            if phase is Phase.WARMUP:
                if self.step >= self.config.warmup_steps:
                    self._end_warmup()
            elif phase is Phase.PROFILING:
                self._profiling_step(step_time, energy)
            elif phase is Phase.PLANNING:
                self._poll_plan()
            if self.phases.phase in (Phase.DEPLOYED, Phase.FALLBACK) and phase in (Phase.DEPLOYED, Phase.FALLBACK):
                self._after_deployed_step(natural_time(span, self._slowdown), energy)
        except CollectiveError as exc:
            self._detach(exc)
        if self._sinks:
            self._publish(record, phase)

    # ================================================================ phases

    def _enter(self, phase: Phase) -> None:
        self.phases.enter(phase, self.step)
        self._event("phase", phase.value)
        self._hot = {Phase.PROFILING: _HOT_PROFILE, Phase.DEPLOYED: _HOT_DEPLOY}.get(phase, _HOT_IDLE)

    def _end_warmup(self) -> None:
        self.reporter.set_baseline([r for r in self.reporter.records if r.phase == Phase.WARMUP.value])
        mode = self.config.mode
        if self.frontier is not None:
            if mode == "run":
                self._deploy()
            else:
                self._steady("frontier available; mode %r keeps default clocks" % mode)
        elif self._have_profile and mode in ("run", "plan", "measure-only"):
            self._start_planning()
        elif self._have_profile:
            self._steady("profile already available (cached or provided); nothing to profile")
        elif mode == "measure-only":
            self._steady(
                "measure-only: no clock control, so no frequency sweep; give profile_path or frontier_path "
                "(or a cache from a privileged run) to get a plan. Reporting measured time and energy only"
            )
        else:
            self._start_profiling()

    def _check_notices(self) -> None:
        """What the clock controller reported since the last step: one log line each."""
        for notice in self.gpu.notices():
            if notice.get("event") == "override":
                log.warning(
                    "perseus: rank %d: the SM clock was changed outside Perseus (held %s MHz, read back %s MHz; "
                    "e.g. nvidia-smi -rgc); re-applied it (%s of at most %s times)",
                    self.rank, notice.get("expected"), notice.get("found"), notice.get("count"), notice.get("max"),
                )
                self._event("clock_override", notice)
            elif notice.get("event") == "failed" and self._clock_failure is None:
                self._clock_failure = str(notice.get("message"))
                log.warning("perseus: rank %d: clock control failed (%s); continuing at default clocks for the rest "
                            "of the run", self.rank, self._clock_failure)
                self._event("clock_failed", self._clock_failure)
                self._fall_back_for_clocks()

    def _fall_back_for_clocks(self) -> None:
        """Clocks can no longer be changed on this rank: a deployed plan falls back (every rank
        follows at the next job check); profiling is not trusted (``_finish_profiling``)."""
        if self._profiling is not None:
            self._profiling.trusted = False
        if self.phases.phase is Phase.DEPLOYED and self._fallback_problem is None:
            self._hot = _HOT_IDLE
            self._fallback_problem = f"clock control failed on rank {self.rank}"
            self.gpu.release()

    def _detach(self, exc: CollectiveError) -> None:
        """Another rank died or hung in a collective: make no further collective (each would wait
        for it again) and leave this rank's training at default clocks, still measured."""
        self._hot = _HOT_IDLE
        self._planner = None  # rank 0's thread may finish; nobody will share its result
        if self._profiling is not None:
            self._profiling.stop()
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

    # ---------------------------------------------------------------- profiling

    def _start_profiling(self) -> None:
        c = self.config
        run = self._profiling = ProfilingRun(self.gpu, self.collective, c, self._keys, self.job, partial_saver(self.cache))
        resumed = False
        if c.cache_dir:  # a run that ended while profiling left its clocks: resume the sweep
            partial = self.collective.broadcast_object(self.cache.load_partial() if self.cache is not None else None)
            resumed = run.resume(partial)
        if c.p_blocking_w is not None:
            self.p_blocking_w = c.p_blocking_w
        else:
            self.p_blocking_w = run.p_blocking_w if resumed else self._measure_p_blocking()
        freqs = run.sweep.frequencies
        if self.is_root:
            if resumed:
                log.info("perseus: resuming the profiling sweep: %d clock(s) kept from an earlier run (%s MHz)",
                         len(run.resumed_clocks), ", ".join(map(str, run.resumed_clocks)))
            log.info(
                "perseus: profiling up to %d clocks %d..%d MHz (coarse pass %s MHz apart, stops where energy stops "
                "falling), %d iterations each; P_blocking %.1f W",
                len(run.sweep.coarse), freqs[0], freqs[-1], c.coarse_step_mhz or "any", c.iters_per_freq,
                self.p_blocking_w,
            )
        self._enter(Phase.PROFILING)
        self.timer.resolve()
        run.start(self.p_blocking_w)
        if self.is_root and c.mode != "profile":
            try:  # its start-up overlaps profiling; a failure here shows again when planning starts
                self._planner_child = start_child(c.planner_nice)
            except Exception:  # noqa: BLE001
                self._planner_child = None
        if run.sweep.done:  # the earlier run measured every clock but ended before saving the profile
            self._finish_profiling()

    def _measure_p_blocking(self) -> float:
        """P_blocking of this rank's GPU: blocked in a gloo recv while a partner rank sleeps."""
        seconds = self.config.p_blocking_seconds
        peer = self.rank ^ 1 if self.rank ^ 1 < self.collective.size else None
        try:
            return self.gpu.measure_p_blocking(seconds, self.collective, peer)
        except RuntimeError as exc:  # gloo: the peer died or hung in the pair's send/recv
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise CollectiveError(f"the P_blocking measurement with rank {peer} failed: {first}") from None
        except PerseusError as exc:
            log.warning("perseus: P_blocking measurement failed (%s); using mean instantaneous idle power", exc)
            return self.gpu.sample_idle_power(seconds)

    def _profiling_step(self, step_time: float, energy: float) -> None:
        assert self._profiling is not None
        if self._profiling.step(self.timer.resolve(), step_time, energy):
            self._finish_profiling()

    def _finish_profiling(self) -> None:
        run = self._profiling
        assert run is not None
        if not self.collective.all_true(self._clock_failure is None):
            self._have_profile = False
            if self.cache is not None:
                self.cache.clear_partial()
            self._steady("clock control failed on a rank while profiling; the profile is discarded, default clocks")
            return
        gathered = self.collective.gather_to_root(run.measurements(self.job, self.gpu.name))
        if self.is_root:
            assert gathered is not None
            config = {"cache_key_fields": self._cache_key(), "profiled_clocks_mhz": sorted(run.sweep.visited, reverse=True)}
            self._profile = aggregate_profile(gathered, self.schedule.num_stages, self.job.tp_size, config,
                                              grid=run.sweep.frequencies, noise_k=self.config.noise_k)
            noise = describe_noise(self._profile)
            if noise:
                log.info("%s", noise)
            if self.cache is not None:
                self._save("profile", self.cache.save_profile, self._profile)
                self.cache.clear_partial()
        self._have_profile = True
        self._event("profiled", list(run.sweep.visited))
        self._event("profiling_overhead", profiling_overhead(self.reporter.records, self.reporter.baseline_time_s,
                                                             self.reporter.baseline_energy_j))
        if self.config.mode == "profile":
            self._steady("profiling done; mode 'profile' keeps default clocks")
        else:
            self._start_planning()

    def _save(self, what: str, save: Any, obj: Any) -> None:
        """Cache writes are atomic (the old file or none stays); a full disk costs the cache, not the run."""
        try:
            _log_saved(what, save(obj), None)
        except OSError as exc:
            _log_saved(what, None, exc.strerror or str(exc))

    # ---------------------------------------------------------------- planning

    def _start_planning(self) -> None:
        self.gpu.reset()
        self._enter(Phase.PLANNING)
        if self.is_root:
            log.info("perseus: planning in the background; training continues at default clocks")
            assert self._profile is not None
            child, self._planner_child = self._planner_child, None
            self._planner = BackgroundPlanner(self.schedule, self._profile, self.config.planner_options, child,
                                              nice=self.config.planner_nice, cache=self.cache,
                                              timelines=self._hides_latency())

    def _poll_plan(self) -> None:
        if self.is_root and self._planner is not None and self.config.plan_wait_s > 0:
            self._planner.wait(self.config.plan_wait_s)
        outcome = share_outcome(self.collective, self._planner, self.schedule, self.job.stage)
        if outcome is None:
            return
        self._planner = None  # it holds every stage's bytes: only this stage's plan is kept
        if outcome.plan is None:
            log.warning("perseus: planning failed (%s); keeping default clocks", outcome.error)
            self._steady("no plan")
            return
        self.frontier = outcome.plan
        self._plan_received(outcome.plan, outcome.received_bytes)
        if self.is_root:
            planned = outcome.planned
            assert planned is not None
            log.info("perseus: frontier with %d points planned in %.1f s", planned.num_points, planned.solve_time_s)
            if self.cache is not None:  # the planner process wrote it (planner_process.hand_over)
                _log_saved("frontier", planned.saved_to, planned.save_error)
        if self.config.mode == "run":
            self._deploy()
        else:
            point = self.frontier.default_point()
            self._steady(
                f"plan ready (default point: {point.time_s:.4f} s, {point.energy_j:.1f} J vs baseline "
                f"{self.frontier.baseline_energy_j:.1f} J); mode {self.config.mode!r} keeps default clocks"
            )

    def _plan_received(self, plan: StagePlan, received_bytes: int) -> None:
        self._event("plan_received", {"stage": plan.stage, "instructions": len(plan.instructions),
                                      "points": len(plan.points), "paced_points": len(plan.paced_points),
                                      "bytes": received_bytes})

    # ---------------------------------------------------------------- deployment

    def _deploy(self) -> None:
        assert self.frontier is not None
        self._deployed_steps = 0
        self._window = []
        self._set_point(self._choose_point())
        self._enter(Phase.DEPLOYED)
        if self._clock_failure is not None:
            self._fall_back_for_clocks()
        if self.is_root:
            log.info("perseus: plan deployed at step %d (%d frontier points)", self.step, len(self.frontier.points))

    def _choose_point(self) -> StagePoint:
        """External target first, else the straggler slowdown, else the no-slowdown default."""
        assert self.frontier is not None
        base = self.frontier.default_point().time_s
        if self._external is not None:
            kind, value = self._external
            if kind == "time":
                return self.frontier.lookup(value)
            return self.frontier.paced_lookup(base * value)
        if self._policy.ratio > 1.0:
            # The iteration lasts as long as the straggler's whatever we run: least energy when
            # paced to it, not at our own pace (a slower plan waits less at blocking power).
            return self.frontier.paced_lookup(base * self._policy.ratio)
        return self.frontier.default_point()

    def _set_point(self, point: StagePoint) -> None:
        assert self.frontier is not None
        changed = self.point is not None and point is not self.point
        self.point = point
        self._slowdown = point.time_s / self.frontier.default_point().time_s
        plan = self.frontier.stage_plan(point, self.job.stage)
        self._follower = PlanFollower(plan, self.job.stage)
        self._timed = self._timed_switches(point, [f for _, f in plan])
        if self._timed is not None and plan:
            # The new plan's first clock at once (and no request of the old plan still held): the
            # requests for a step's first instructions are made in the step before.
            self.gpu.request_now(plan[0][1])
        if changed:
            self._event("point", {"time_s": point.time_s, "energy_j": point.energy_j, "slowdown": self._slowdown})

    def _hides_latency(self) -> bool:
        """Whether clock switches are timed for a known switch latency (``planner_options.switch_latency_s``)."""
        return self._switch_ahead and self.config.planner_options.switch_latency_s > 0

    def _timed_switches(self, point: StagePoint, clocks: list[int]) -> TimedSwitches | None:
        """The hooks' timed requests for ``point`` (``perseus.switch_timing``), or None: latency 0,
        ``switch_ahead`` off, a controller that makes every request at once (clockd), or a plan
        without its timeline (a frontier given without a profile); then each clock is asked for
        when the previous instruction ends."""
        if not self._hides_latency() or not clocks:
            return None
        assert self.frontier is not None
        timeline = self.frontier.timeline(point)
        why = None
        if not self.gpu.timed_requests:
            why = "the clock controller (perseus clockd) makes every request at once"
        elif timeline is None:
            why = "the plan came without its planned timeline (a frontier given without a profile)"
        if why is not None:
            if self._timing_note is None and self.is_root:
                log.warning("perseus: switch latency %.1f ms not hidden: %s; each clock is requested when the "
                            "previous instruction ends", 1e3 * self.config.planner_options.switch_latency_s, why)
            self._timing_note = why
            return None
        assert timeline is not None
        begin, end = timeline
        latency = self.config.planner_options.switch_latency_s
        requests = request_schedule(begin, end, clocks, latency, point.time_s)
        return TimedSwitches(requests, len(clocks), float(point.time_s + begin[0] - end[-1]))

    def _retarget(self) -> None:
        self._target_dirty = False
        point = self._choose_point()
        if point is not self.point:
            self._set_point(point)
            if self.is_root:
                log.info("perseus: switching to the frontier point at %.4f s (slowdown x%.3f)", point.time_s, self._slowdown)

    def _mismatch(self) -> None:
        """First divergence from the plan: one warning, default clocks from now on."""
        assert self._follower is not None
        self._hot = _HOT_IDLE
        self.gpu.release()
        self._fallback_problem = self._follower.problem
        if not self._fallback_warned:
            self._fallback_warned = True
            log.warning(
                "perseus: executed instructions no longer match the plan (%s); the schedule or microbatch count "
                "changed. Falling back to default clocks until replanned (restart to re-profile this configuration)",
                self._follower.problem,
            )

    def _after_deployed_step(self, natural_s: float, energy: float) -> None:
        if self._hot == _HOT_DEPLOY and self._follower is not None and not self._follower.end_step():
            self._mismatch()
        if self._timed is not None:
            self._timed.end_step()
        if self._fallback_problem is not None and self.phases.phase is Phase.DEPLOYED:
            self._enter(Phase.FALLBACK)
            self._event("fallback", self._fallback_problem)
        self._window.append((natural_s, energy))
        self._deployed_steps += 1
        period = self.config.straggler_period_steps
        if period and self._deployed_steps % period == 0:
            self._periodic_check()

    def _periodic_check(self) -> None:
        """Every K steps: all-gather per-rank numbers (``job_check.check_job``); straggler policy;
        spread a plan mismatch."""
        check = check_job(self.collective, self.job, self.step, self._window, self._fallback_problem is not None)
        self._window = []
        self.job_numbers = check.numbers
        if check.diverged:
            if self.phases.phase is Phase.DEPLOYED:
                self._hot = _HOT_IDLE
                self.gpu.release()
                self._fallback_problem = "another rank fell back to default clocks (its log says why)"
                self._enter(Phase.FALLBACK)
                self._event("fallback", self._fallback_problem)
            return
        before = self._policy.ratio
        self._event("slowdown_seen", check.slowdown)
        ratio = self._policy.observe(check.slowdown)
        if ratio != before:
            self._event("straggler", ratio)
            self._target_dirty = True

    # ================================================================ public control

    def set_target_time(self, seconds: float) -> None:
        """Run at the least-energy plan finishing within ``seconds`` (planned time), from the next step."""
        if not seconds > 0:
            raise ConfigError(f"target time must be a positive number of seconds, got {seconds!r}")
        self._external = ("time", float(seconds))
        self._target_dirty = True

    def set_target_slowdown(self, ratio: float) -> None:
        """Iterations will last ``ratio`` × the default plan's time anyway (e.g. 1.2 behind a straggler):
        run the plan of least energy when paced to that time."""
        if not ratio >= 1.0:
            raise ConfigError(f"target slowdown must be >= 1.0 (a ratio of iteration times), got {ratio!r}")
        self._external = ("slowdown", float(ratio))
        self._target_dirty = True

    def clear_target(self) -> None:
        """Back to the straggler policy / no-slowdown default at the next step."""
        self._external = None
        self._target_dirty = True

    def stop(self) -> None:
        """Leave the training to itself from now on, at default clocks; waits until they are in effect.

        For A/B comparisons (the demo re-measures default clocks after the plan). Afterwards the
        hooks change no clock and time nothing, steps are neither recorded nor checked (no phase
        change, no straggler check, no collective), and on a simulated GPU each instruction is
        still one of its kernels, now at default clocks. The requests already sent reach the
        controller first, so no planned clock lands after this returns. Only ``close`` follows.
        """
        self._hot = _HOT_IDLE
        self._stopped = True
        if self.enabled and not self._closed:
            self.gpu.reset()

    def stage_clocks(self) -> list[int] | None:
        """The clocks (MHz) this rank follows, one per instruction of its stage, or None before a
        plan is deployed: the current point's clocks from this rank's own stage plan."""
        return self._follower.frequencies if self._follower is not None else None

    @property
    def phase(self) -> Phase:
        return self.phases.phase if self.enabled else Phase.STEADY

    def _event(self, what: str, data: Any) -> None:
        self.events.append((self.step, what, data))
        if self.enabled:
            self.reporter.write_event(what, step=self.step, data=data)

    # ================================================================ per-step metrics (step end only)

    def add_metrics_sink(self, sink: MetricsSink) -> None:
        """Give every step's ``StepMetrics`` to ``sink`` (``write(step, metrics)`` at step end;
        ``close()`` when the runtime closes). See perseus/runtime/metrics.py."""
        if self.enabled and not self._closed:
            self._sinks.append(sink)

    def _start_prometheus(self) -> None:
        """One exporter per rank on 127.0.0.1 when ``prometheus_port`` is set (N: N + LOCAL_RANK)."""
        port = self.config.prometheus_port
        if port is None:
            return
        import os

        from perseus.runtime.prometheus import PrometheusExporter

        if port:
            port += int(os.environ.get("LOCAL_RANK", "0") or 0)
        error: PerseusError | None = None
        try:
            self.prometheus = PrometheusExporter(port, "127.0.0.1")
        except PerseusError as exc:
            error = exc
        if not self.collective.all_true(error is None):
            self.close()
            raise error or ConfigError("perseus: another rank could not start its Prometheus exporter (see its log)")
        self._sinks.append(PrometheusSink(self.prometheus))
        log.info("perseus: rank %d serves Prometheus metrics at %s", self.rank, self.prometheus.url)

    def _publish(self, record: StepRecord, phase: Phase) -> None:
        n = len(self._stage_instructions)
        if phase is Phase.DEPLOYED and self._follower is not None:
            clocks = self._follower.step_clocks(self.gpu.default_mhz)
        else:
            clocks = {record.freq_mhz if record.freq_mhz is not None else self.gpu.default_mhz: n}
        deployed = phase is Phase.DEPLOYED and self.point is not None and self.frontier is not None
        job = self.job_numbers
        metrics = self._metrics.build(
            step=record.step, phase=record.phase, time_s=record.time_s, energy_j=record.energy_j,
            clock_mhz=self.gpu.current_mhz, instructions=clocks, baseline_energy_j=self.reporter.baseline_energy_j,
            straggler_ratio=self._policy.ratio,
            point_slowdown=self._slowdown if deployed else None,
            point_energy_j=self.point.energy_j if deployed and self.point is not None else None,
            job_energy_j=job.get("energy_per_iteration_j") if job.get("step") == self.step else None,
        )
        write_all(self._sinks, record.step, metrics)

    # ================================================================ results and shutdown

    def summary(self) -> dict[str, Any]:
        """Measured results of this rank (energies are this rank's GPU) plus job-wide numbers when known."""
        if not self.enabled:
            return {"enabled": False}
        c = self.config
        sweep = self._profiling.sweep if self._profiling is not None else None
        out = summarize(
            self.reporter,
            rank=self.rank,
            job=self.job,
            mode=c.mode,
            phase=self.phases.phase.value,
            steps=self.step,
            phase_history=[(s, p.value) for s, p in self.phases.history],
            p_blocking_w=self.p_blocking_w,
            fallback=self._fallback_problem,
            slowdown=self._slowdown,
            clock_mhz=self.gpu.current_mhz,
            events=self.events,
            job_numbers=self.job_numbers,
            sweep=sweep,
            profiling_iterations=(c.warmup_steps + self._profiling.iterations() if self._profiling is not None else None),
            frontier=self.frontier,
            point=self.point,
        )
        if self.prometheus is not None:
            out["prometheus"] = {"addr": self.prometheus.addr, "port": self.prometheus.port, "url": self.prometheus.url}
        return out

    def close(self) -> None:
        """Reset clocks to default and release the GPU; idempotent, safe in error paths."""
        if self._closed:
            return
        self._closed = True
        self._hot = _HOT_IDLE
        if not self.enabled:
            return
        kernels, self.sim_kernels = self.sim_kernels, None
        if kernels is not None:
            kernels.close()
        if self._profiling is not None:
            self._profiling.stop()
        planner, self._planner = self._planner, None
        if planner is not None:  # training ended before planning did: no orphan planner process
            planner.close()
        child, self._planner_child = self._planner_child, None
        if child is not None:
            stop_child(child)
        sinks, self._sinks = self._sinks, []
        for sink in sinks:
            close_quietly(sink)
        try:
            self.gpu.close()
        finally:
            self.reporter.close()
            if self.is_root and self.phases.history:
                log.info("%s", summary_line(self.summary()))

    def __enter__(self) -> PerseusRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



def _log_saved(what: str, path: object, error: str | None) -> None:
    """One line for a cache write, by the trainer (profile) or the planner process (frontier)."""
    if error is None:
        log.info("perseus: %s saved to %s", what, path)
    else:
        log.warning("perseus: could not save the %s to the cache (%s); training continues, the next run %s again",
                    what, error, "profiles" if what == "profile" else "plans")
