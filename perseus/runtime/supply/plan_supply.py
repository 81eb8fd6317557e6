"""Getting this rank its plan: the sources at start-up, the profiling run, the background planner.

Why a room of its own: the engine decides the phases; getting a plan needs state between them
(rank 0's profile, its cache entry, the planner and the process it runs in, P_blocking) and
collectives at given steps. ``PlanSupply`` holds that state and does each step's work
(``load``, ``start_profiling``, ``finish_profiling``, ``start_planning``, ``poll``); the
engine only enters the phase each answer calls for. Every method that makes a collective is
called by every rank at the same step.

It also decides which clock-switch latency the planner and the GPU timeline's requests use
(``LatencyInForce``): a configured ``planner_options.switch_latency_s`` (> 0), else the one the
profiling sweep measured (or a cached profile recorded), else 0; each decision is a
``switch_latency`` event (``take_events``) and a line in the summary.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from perseus.frontier import NO_NON_COMPUTE, NonCompute
from perseus.gpu.stream.clocks import DEFAULT_LEAD_S
from perseus.planner.settings import PlannerOptions
from perseus.profile import Profile
from perseus.profile.model import SwitchLatency
from perseus.profile.aggregate import aggregate_profile
from perseus.store.cache import RunCache
from perseus.runtime.plane.collective import Collective
from perseus.runtime.config import Mode, PerseusConfig
from perseus.runtime.job import PipelineJob
from perseus.runtime.port.gpu_port import GPUPort
from perseus.runtime.supply.planning import (BackgroundPlanner, PlanOutcome, finish_at_close, log_planned, share_outcome, start_child,
                                      stop_child)
from perseus.runtime.measure.instruction_samples import Key
from perseus.runtime.measure.profiling_run import (ProfilingRun, describe_noise, measure_p_blocking, partial_saver,
                                                   with_run_notes)
from perseus.runtime.supply.sources import (Sources, cache_key, open_cache, save_quietly, share_sources, stage_gpus,
                                            stage_models)
from perseus.planner.stage_plan import StagePlan
from perseus.schedules import Schedule

if TYPE_CHECKING:
    from perseus.runtime.port.gpu_timeline import StepNumbers

log = logging.getLogger("perseus.runtime")
# Warm-up time outside the instructions, summed, that the energy counter must cover before its power
# replaces P_blocking: a few tail milliseconds per step read between counter updates say little.
NON_COMPUTE_POWER_S = 1.0


@dataclass(frozen=True)
class LatencyInForce:
    """The switch latency the planner and the request lead use (``seconds``) and why: ``source``
    is ``configured`` (``planner_options.switch_latency_s`` > 0), ``measured`` or ``default`` (0:
    none measured, or ``note`` says why the measured one is not used); ``measured`` came from
    ``origin``: this run's profiling sweep or the profile it found."""

    seconds: float
    source: str
    measured: SwitchLatency | None
    origin: str
    note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["measured"] = None if self.measured is None else asdict(self.measured)
        return out

    def line(self) -> str:
        measured = self.measured
        seen = ("none measured" if measured is None else
                f"measured {1e3 * measured.seconds:.2f} ms over {measured.samples} switches ({self.origin})")
        return (f"perseus: clock-switch latency {1e3 * self.seconds:.2f} ms in force ({self.source}; {seen})"
                + (f": {self.note}" if self.note else ""))


def latency_in_force(configured_s: float, measured: SwitchLatency | None, origin: str,
                     unusable: str | None) -> LatencyInForce:
    """Configured (> 0) before measured before 0. ``unusable``: why a measured latency cannot be
    hidden here. One below the requests' own lead (``DEFAULT_LEAD_S``: the follower's poll and the
    controller's delivery, which the measurement includes) is hidden already: 0."""
    if configured_s > 0:
        return LatencyInForce(configured_s, "configured", measured, origin)
    if measured is None:
        return LatencyInForce(configured_s, "default", None, origin, unusable)
    if measured.seconds < DEFAULT_LEAD_S:
        return LatencyInForce(configured_s, "default", measured, origin,
                              f"below the requests' {1e3 * DEFAULT_LEAD_S:g} ms lead, which hides it")
    if unusable is not None:
        return LatencyInForce(configured_s, "default", measured, origin, unusable)
    return LatencyInForce(measured.seconds, "measured", measured, origin)


class PlanSupply:
    """Where this rank's ``StagePlan`` comes from; ``close`` leaves no planner process behind."""

    def __init__(self, job: PipelineJob, schedule: Schedule, config: PerseusConfig, collective: Collective,
                 gpu: GPUPort, timelines: bool) -> None:
        self.job = job
        self.schedule = schedule
        self.config = config
        self.collective = collective
        self.gpu = gpu
        self.timelines = timelines  # plans carry their planned timelines (a switch latency is hidden)
        self.profiling: ProfilingRun | None = None
        self.p_blocking_w: float | None = None
        self.profile: Profile | None = None  # rank 0's
        self.have_profile = False  # every rank's
        self._planner: BackgroundPlanner | None = None  # rank 0 only
        self._child: Any = None  # rank 0: the planner process, started while profiling
        self.stage_models: Mapping[str, str] | None = None  # every rank's stage fingerprint (rank 0's), for the key
        self.stage_gpus: Mapping[str, Any] | None = None  # every rank's GPU settings (rank 0's), for the key
        self.cache: RunCache | None = None  # rank 0's, from ``load``
        # The warm-up steps' instruction spans at default clocks: the all-max step as this job runs
        # it, hand-offs between stages included (rank 0's: stage 0 begins first and ends last).
        self.warmup_spans: list[float] = []
        # and each one's time outside that span, with its energy where measured (``warmup_step``)
        self.warmup_outside: list[tuple[float, float | None]] = []
        self.warmup_timed: list[Any] = []  # and their timed instructions: the clock under each kind
        self.switch_latency: LatencyInForce | None = None  # None: nothing measured or found yet
        self._events: list[tuple[str, Any]] = []  # (what, data) for the run's events (``take_events``)

    def cache_key(self) -> dict[str, Any]:
        return cache_key(self.job, self.schedule, self.gpu.name, self.gpu.driver_version, self.config, self.stage_models,
                         self.stage_gpus)

    def load(self) -> Sources:
        """Collective: a provided or cached frontier (this rank's stage of it) or profile. Every
        rank's stage parameters reach rank 0's cache key first: a model changed on any stage misses."""
        self.stage_models = stage_models(self.collective, self.job)
        self.stage_gpus = stage_gpus(self.collective, self.job, self.gpu)
        self.cache = open_cache(self.config, self.cache_key()) if self.collective.is_root else None
        sources = share_sources(self.collective, self.config, self.schedule, self.job.stage, self.cache,
                                timing=self.timelines)
        self.profile = sources.profile
        self.have_profile = sources.have_profile
        if sources.have_profile:
            self._take_latency(sources.switch_latency, "profile",
                               "the profile has none (profiled by an earlier version, or on a GPU that does not "
                               "report its applied clock)")
        return sources

    # ---------------------------------------------------------------- profiling

    def start_profiling(self, keys: list[Key]) -> ProfilingRun:
        """The sweep's clocks and P_blocking (configured, else measured: collective); the caller
        enters the phase, then ``begin_profiling``."""
        c, root = self.config, self.collective.is_root
        run = self.profiling = ProfilingRun(self.gpu, self.collective, c, keys, self.job, partial_saver(self.cache),
                                            sustained=self.gpu.sustained, clocks=self.gpu)
        resumed = False
        if c.cache_dir:  # a run that ended while profiling left its clocks: resume the sweep (collective)
            resumed = run.resume(self.collective.broadcast_object(self.cache.load_partial() if self.cache else None))
        if c.p_blocking_w is not None:
            self.p_blocking_w = c.p_blocking_w
        else:
            self.p_blocking_w = run.p_blocking_w if resumed else \
                measure_p_blocking(self.gpu, self.collective, c.p_blocking_seconds)
        if resumed and root:
            log.info("perseus: resuming the profiling sweep: %d clock(s) kept from an earlier run (%s MHz)",
                     len(run.resumed_clocks), ", ".join(map(str, run.resumed_clocks)))
        if root:
            freqs, sweep = run.sweep.frequencies, run.sweep
            above = (f"; the {len(sweep.skipped)} clock(s) above are recorded equal to each stage's sustained clock "
                     f"(the unlocked card under this load: {', '.join(map(str, sweep.anchors))} MHz)"
                     if sweep.skipped else "")
            log.info("perseus: profiling up to %d clocks %d..%d MHz (coarse pass %s MHz apart, stops where energy "
                     "stops falling), %d iterations each; P_blocking %.1f W%s", len(sweep.coarse), sweep.start_mhz,
                     freqs[-1], c.coarse_step_mhz or "any", c.iters_per_freq, self.p_blocking_w, above)
        return run

    def begin_profiling(self) -> bool:
        """First clock set; rank 0 starts the planner process now, so its start-up overlaps profiling.
        True when there is nothing left to measure (a resumed sweep that an earlier run completed)."""
        assert self.profiling is not None and self.p_blocking_w is not None
        self.profiling.start(self.p_blocking_w)
        if self.collective.is_root and self.config.mode.plans:
            try:  # a failure here shows again when planning starts
                self._child = start_child(self.config.planner_nice)
            except Exception:  # noqa: BLE001 - the same failure is raised again when planning starts
                self._child = None
        return self.profiling.sweep.done

    def finish_profiling(self, usable: bool) -> list[int] | None:
        """Collective: the sweep is over; ``usable`` is False where clock control failed on this
        rank. None (the profile discarded) if it failed on any rank; else rank 0 aggregates the
        ranks' measurements into the profile and caches it, and every rank gets the profiled clocks."""
        run = self.profiling
        assert run is not None
        if not self.collective.all_true(usable):
            self.have_profile = False
            if self.cache is not None:  # a refused clock: nothing measured is kept, nor resumed
                self.cache.clear_partial()
            return None
        latency = run.switch_latency()
        gathered = self.collective.gather_measurements(run.measurements(self.job, self.gpu.name), run.sweep.frequencies)
        if self.collective.is_root:
            assert gathered is not None
            fields = {"cache_key_fields": self.cache_key(),
                      "profiled_clocks_mhz": sorted(run.sweep.visited, reverse=True)}
            profile = aggregate_profile(gathered, self.schedule.num_stages, self.job.tp_size, fields,
                                        grid=run.sweep.frequencies, noise_k=self.config.noise_k,
                                        spread_k=self.config.spread_k)
            self.profile = with_run_notes(replace(profile, switch_latency=latency), gathered)  # between steps, P_blocking
            noise = describe_noise(self.profile)
            if noise:
                log.info("%s", noise)
            if self.cache is not None:
                save_quietly("profile", self.cache.save_profile, self.profile)
                self.cache.clear_partial()
        self.have_profile = True
        self._take_latency(latency, "profiling", None if latency is not None else run.why_no_latency())
        return list(run.sweep.visited)

    # ---------------------------------------------------------------- the switch latency

    def _take_latency(self, measured: SwitchLatency | None, origin: str, why_none: str | None) -> None:
        """Every rank: the latency in force from now on (``latency_in_force``); a measured one also
        becomes the GPU timeline's request lead (``GPUPort.use_switch_latency``). Rank 0 says which."""
        c = self.config
        unusable = (why_none if measured is None else
                    "switch_ahead is off" if not c.switch_ahead else
                    None if self.gpu.timeline is not None else
                    "this GPU's requests are timed on the host (no GPU timeline), which hides a configured latency "
                    "only: set planner_options.switch_latency_s")
        chosen = latency_in_force(c.planner_options.switch_latency_s, measured, origin, unusable)
        self.switch_latency = chosen
        if chosen.source == "measured":
            self.gpu.use_switch_latency(chosen.seconds)
        self._events.append(("switch_latency", chosen.as_dict()))
        if not self.collective.is_root or (measured is not None and measured.seconds < DEFAULT_LEAD_S):
            return  # an instant switch: the event and the summary say so, no line
        # a latency that is there and not hidden, or one that cannot be measured here: said loudly, once
        loud = chosen.source == "default" and (measured is not None or self.gpu.reports_clock is False)
        (log.warning if loud else log.info)("%s", chosen.line())

    def take_events(self) -> list[tuple[str, Any]]:
        """The events since the last call (the engine's step end)."""
        events, self._events = self._events, []
        return events

    def planner_options(self) -> PlannerOptions:
        """The configured planner options, with the measured switch latency where it is in force."""
        options, latency = self.config.planner_options, self.switch_latency
        if latency is None or latency.source != "measured":
            return options
        return replace(options, switch_latency_s=latency.seconds)

    # ---------------------------------------------------------------- planning

    def start_planning(self) -> None:
        """Rank 0 plans in the background (in the process started while profiling, if any)."""
        if not self.collective.is_root:
            return
        log.info("perseus: planning in the background; training continues at default clocks")
        assert self.profile is not None
        child, self._child = self._child, None
        c = self.config
        self._planner = BackgroundPlanner(self.schedule, self.profile, self.planner_options(), child,
                                          nice=c.planner_nice, cache=self.cache, timelines=self.timelines,
                                          measured_s=self.measured_step_s(), non_compute=self.measured_non_compute())

    def measured_step_s(self) -> float | None:
        """The shortest warm-up span, for the planner's hand-off (``planner.handoff``); None
        without one. The shortest, not the median: noise only lengthens a step (start-up, a host
        stall, a garbage collection), and a hand-off read too long would make every plan spend
        slack the job does not have (the planner also caps it)."""
        spans = [s for s in self.warmup_spans if s > 0]
        return min(spans) if spans else None

    def warmup_step(self, numbers: StepNumbers) -> None:
        """A warm-up step at default clocks: its instructions' span (the hand-off's) and the time
        outside it (the non-compute time's), with that time's energy where the counter covered it."""
        self.warmup_spans.append(numbers.span_s)
        self.warmup_timed.extend(numbers.instructions)  # ``GPUPort.end_warmup_clocks``
        outside = numbers.time_s - numbers.span_s
        if math.isfinite(outside):
            energy = numbers.non_instruction_energy_j if numbers.gpu_time and numbers.non_instruction_s > 0 else None
            self.warmup_outside.append((max(outside, 0.0), energy))

    def measured_non_compute(self) -> NonCompute:
        """Each iteration's time outside the instructions, from the warm-up steps (``warmup_non_compute``)."""
        found = warmup_non_compute(self.warmup_outside)
        if found:
            log.info("perseus: %.2f ms per iteration outside the instructions (the shortest warm-up step), at %s; "
                     "the frontier's slowdowns and savings count it", 1e3 * found.time_s,
                     "P_blocking" if found.power_w is None else f"{found.power_w:.0f} W measured")
        return found

    def poll(self) -> PlanOutcome | None:
        """Collective, every step of planning: None while rank 0 still plans, else this rank's
        stage plan or why there is none (then the planner, which holds every stage, is dropped)."""
        if self.collective.is_root and self._planner is not None and self.config.plan_wait_s > 0:
            self._planner.wait(self.config.plan_wait_s)
        outcome = share_outcome(self.collective, self._planner, self.schedule, self.job.stage)
        if outcome is None:
            return None
        self._planner = None
        if outcome.plan is None:
            log.warning("perseus: planning failed (%s); keeping default clocks", outcome.error)
        elif self.collective.is_root:
            assert outcome.planned is not None
            log_planned(outcome.planned, self.cache is not None)
        return outcome

    # ---------------------------------------------------------------- stopping

    def detach(self) -> None:
        """No more collectives (another rank died or hung): rank 0's planner result is never shared."""
        self._planner = None
        if self.profiling is not None:
            self.profiling.stop()

    def close(self, plan_wait_s: float = 0.0) -> None:
        """Stop profiling and planning; a planner still at work first gets up to ``plan_wait_s`` to
        write the frontier to the cache (``planning.finish_at_close``), then is stopped."""
        if self.profiling is not None:
            self.profiling.stop()
        planner, self._planner = self._planner, None
        if planner is not None:  # training ended before planning did: keep the frontier, within a bound
            finish_at_close(planner, plan_wait_s, self.cache is not None)
        child, self._child = self._child, None
        if child is not None:
            stop_child(child)


def warmup_non_compute(outside: Sequence[tuple[float, float | None]]) -> NonCompute:
    """The non-compute time per iteration (``perseus.frontier.non_compute``) from the warm-up
    steps' (time outside the instructions' span, its energy or None): the shortest step's, as the
    hand-off takes the shortest span (noise only lengthens a step, and a non-compute time read too
    long lets a slowdown target spend time the job does not have). Its power is the measured one
    where the counter covered every step's and at least ``NON_COMPUTE_POWER_S`` in all, else
    P_blocking (None)."""
    seconds = min((s for s, _ in outside), default=0.0)
    if seconds <= 0:
        return NO_NON_COMPUTE
    energies = [e for _, e in outside if e is not None]
    covered = sum(s for s, _ in outside)
    power = sum(energies) / covered if len(energies) == len(outside) and covered >= NON_COMPUTE_POWER_S else None
    return NonCompute(seconds, power, "the shortest warm-up step less its instructions' span")


def ready_line(plan: StagePlan, mode: Mode) -> str:
    """Rank 0's line for a plan that is ready in a mode that does not run it."""
    point = plan.default_point()
    return (f"plan ready (default point: {point.time_s:.4f} s, {point.energy_j:.1f} J vs baseline "
            f"{plan.baseline_energy_j:.1f} J); mode {mode.value!r} keeps default clocks")
