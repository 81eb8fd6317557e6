"""One online profiling run: the clock sweep walked step by step, with its energy poller.

The engine owns the phase; this owns what profiling needs between its first and last step (the
sweep, the recorder, the counter poller, the lowest energies so far), so the engine holds one
object for all of it and the run can be read afterwards (visited clocks, early stop).

At the end of each clock the ranks agree, in this order: whether the clock's noise is larger than
the effect being measured (then it is measured ``iters_per_freq`` more iterations, at most
``remeasure_max`` times per sweep), whether energy stopped falling (the coarse pass's early stop),
and, once refining, which clocks the interpolation model could not predict
(``ClockSweep.add_refinements``). With a cache, every finished clock is gathered to rank 0 and
written to ``partial_profile.json``, so a run that ends while profiling is resumed (``resume``).

The sweep starts at the clock the ranks' unlocked GPUs sustained in warm-up (``sustained.py``);
each rank records the clocks above its own sustained clock as equal to it, with warm-up's
clock-event reasons, and the reasons its poller saw at each clock it measured (``ClockWatch``).

Each clock change of the sweep is also a probe of the switch latency: ``GPUPort.apply`` waits at
the step boundary until the device reports the new clock and keeps the time it took
(``SwitchSample``); ``switch_latency`` makes the job's latency of them for the profile, which the
planner and the GPU timeline's request lead then use (a card that takes 10 ms ran half a plan's
instructions at the previous one's clock with the latency left at 0).

Each profiled step's work between steps (optimizer, gradient all-reduce) is kept per clock as a
bucket of its own (``between_steps.py``), and the first clock's steps measure P_blocking in the
pipeline's own waits (``wait_power.py``), where the gloo receive at the start (an idle GPU) stays
as the fallback; ``with_run_notes`` puts both in rank 0's profile.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from statistics import median
from time import monotonic
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol

from perseus.errors import PerseusError
from perseus.gpu.meter.clock_samples import UNKNOWN, SustainedClock, reason_names
from perseus.gpu.meter.energy import attribution_window_s
from perseus.profile.fit import interpolation_ok, loo_errors
from perseus.profile.aggregate import ClockPoint, RankMeasurements, as_point, noisy_points
from perseus.profile.model import Profile, SwitchLatency
from perseus.runtime.measure.clock_sweep import ClockSweep, energy_stopped_falling, select_frequencies
from perseus.runtime.plane.collective import Collective, CollectiveError
from perseus.runtime.config import PerseusConfig
from perseus.runtime.job import PipelineJob
from perseus.runtime.port.gpu_port import GPUPort
from perseus.runtime.measure import between_steps, wait_power
from perseus.runtime.measure.between_steps import BetweenSteps
from perseus.runtime.measure.instruction_samples import Key, SweepRecorder, power_limit_of
from perseus.runtime.measure.wait_power import WaitPower
from perseus.runtime.measure.sustained import agree_start, equal_above, kind_warmups

if TYPE_CHECKING:
    from perseus.gpu.device import ClockEventReason
    from perseus.gpu.meter.energy import EnergyPoller
    from perseus.runtime.port.clock_trace import SwitchSample
    from perseus.runtime.port.gpu_timeline import StepNumbers


class ClockWatch(Protocol):
    """Where the reasons a GPU reported come from (``GPUPort``: its poller's busy samples)."""

    def clock_reasons_since(self, t_s: float) -> frozenset[ClockEventReason]: ...

log = logging.getLogger("perseus.runtime")

NOISE_VS_EFFECT = 0.5  # re-measure when a key's standard error exceeds this share of the clock's effect
MIN_SWITCHES = 3  # clock changes seen to land before a rank's switch latency counts


class ProfilingRun:
    """The clocks to profile (chosen when built: a bad range fails before anything is measured)."""

    def __init__(self, gpu: GPUPort, collective: Collective, config: PerseusConfig, keys: list[Key],
                 job: PipelineJob | None = None, save_partial: Callable[[dict[str, Any] | None], Any] | None = None,
                 sustained: SustainedClock = UNKNOWN, clocks: ClockWatch | None = None) -> None:
        """Collective (the ranks agree where the sweep starts): ``sustained`` is this rank's clock
        under load from warm-up, ``clocks`` where the reasons seen at each clock come from."""
        c = config
        freqs = select_frequencies(gpu.supported_mhz, c.freq_min_mhz, c.freq_max_mhz, c.freq_step_mhz, c.freq_every_k)
        self.sweep_start = agree_start(collective, sustained, freqs)
        self.sweep = ClockSweep(freqs, c.iters_per_freq, c.early_stop_patience, c.coarse_step_mhz, c.refine_max_clocks,
                                start_mhz=self.sweep_start.start_mhz, anchors=self.sweep_start.anchors)
        self.sustained = sustained
        self.reasons: dict[int, tuple[str, ...]] = {}  # clock -> reason names seen while measured there
        self._clocks = clocks
        self._clock_since = monotonic()
        # no attributed power above the card's limit (a stand-in port without a device: none known)
        self.recorder = SweepRecorder(keys, power_limit_of(getattr(gpu, "device", None)))
        self.p_blocking_w = 0.0
        # where P_blocking came from (``wait_power``: WAITS, GLOO, CONFIGURED); the first clock's
        # waits while they may still replace the gloo measurement (None: configured, resumed, decided)
        self.p_blocking_source = wait_power.CONFIGURED if c.p_blocking_w is not None else wait_power.GLOO
        self.waits: WaitPower | None = WaitPower() if c.p_blocking_w is None else None
        self.between = BetweenSteps()  # the work between steps, per clock
        self.resumed_clocks: list[int] = []
        self._gpu = gpu
        self._collective = collective
        self._job = job
        self._poll_s = c.energy_poll_s
        self._intervals = c.attribution_intervals
        self._iters_max = 3 * c.iters_per_freq
        self._remeasure_max = c.remeasure_max
        self._keep_partial = bool(c.cache_dir) and job is not None
        self._save_partial = save_partial
        self._poller: EnergyPoller | None = None
        self._lowest: dict[Any, float] = {}
        self._started_s = monotonic()  # the sweep's clock changes are the port's samples from here on

    @property
    def trusted(self) -> bool:
        """False once this rank's clock control failed: nothing it measures is kept."""
        return self._gpu.clock_failure is None

    # ------------------------------------------------------------------ resume

    def resume(self, partial: Mapping[str, Any] | None) -> bool:
        """Collective: continue an interrupted sweep when every rank finds its own measurements in
        ``partial`` (rank 0's ``partial_profile.json``, broadcast); True when resumed. The
        measured clocks are kept and skipped; P_blocking is taken from there too."""
        mine = _own_share(partial, self._job, self._collective.size) if partial else None
        if not self._collective.all_true(mine is not None) or mine is None or partial is None:
            return False
        for item in mine["measurements"]:
            key = (int(item["chunk"]), str(item["kind"]))
            if key in self.recorder.measurements:
                self.recorder.measurements[key] = {int(f): ClockPoint(*v) for f, v in item["points"].items()}
        for key, per_freq in self.recorder.measurements.items():
            if per_freq:
                self._lowest[key] = min(as_point(p).decision_energy_j for p in per_freq.values())
        self.reasons.update({int(f): tuple(names) for f, names in (mine.get("reasons") or {}).items()})
        self.sweep.restore(partial["sweep"])
        self.resumed_clocks = list(self.sweep.visited)
        self.p_blocking_w = float(mine["p_blocking_w"])
        self.p_blocking_source, self.waits = str(mine.get("p_blocking_source") or wait_power.GLOO), None
        self.between.restore(mine.get(between_steps.EXTRA_KEY))
        return True

    def share(self) -> dict[str, Any]:
        """This rank's measurements as JSON data (the partial file holds one per rank)."""
        job = self._job
        assert job is not None
        return {"stage": job.stage, "tp_rank": job.tp_rank, "dp_rank": job.dp_rank, "p_blocking_w": self.p_blocking_w,
                "trusted": self.trusted, "reasons": {str(f): list(names) for f, names in self.reasons.items()},
                "p_blocking_source": self.p_blocking_source, between_steps.EXTRA_KEY: self.between.share(),
                "measurements": [{"chunk": chunk, "kind": kind,
                                  "points": {str(f): list(as_point(p)) for f, p in per_freq.items()}}
                                 for (chunk, kind), per_freq in sorted(self.recorder.measurements.items())]}

    # ------------------------------------------------------------------ the walk

    def start(self, p_blocking_w: float) -> None:
        """Counter poller on, first clock set (waiting until it is in effect)."""
        self.p_blocking_w = p_blocking_w
        if self.sweep.done:
            return
        self._started_s = monotonic()
        self._poller = self._gpu.energy_poller(self._poll_s)
        self._gpu.apply(self.sweep.current_mhz)
        self._clock_since = monotonic()

    def take(self, numbers: StepNumbers) -> bool:
        """``step`` with a step as the step clock measured it (its work between steps too)."""
        return self.step(list(numbers.instructions), numbers.time_s, numbers.energy_j,
                         between=(numbers.non_instruction_s, numbers.non_instruction_energy_j))

    def step(self, timed: list[Any], step_time_s: float, energy_j: float | None,
             between: tuple[float, float | None] = (0.0, None)) -> bool:
        """One profiled iteration (collectives at the end of each clock); True once the sweep is
        over, with the clocks back at default and the poller stopped. ``energy_j`` None: unmeasured
        (its times still count; its energy is left out of the per-step attribution). ``between``:
        its work between steps (seconds, joules or None)."""
        sweep, recorder, is_root = self.sweep, self.recorder, self._collective.is_root
        freq = sweep.current_mhz
        recorder.add_step(timed, step_time_s, energy_j, self.p_blocking_w, first=sweep.first_iteration)
        self.between.add(*between)
        if self.waits is not None:
            self.waits.add_step(timed)
        if not sweep.count_iteration():
            return False
        if self._lengthen():
            return False
        if sweep.remeasured < self._remeasure_max:
            noisy = self._noisy(freq)
            if not self._collective.all_true(not noisy):
                sweep.extend(sweep.iters_per_freq)
                if is_root:
                    log.info("perseus: noise at %d MHz is larger than the clock's effect%s; measuring it %d more "
                             "iterations (%d of at most %d re-measurements)", freq, f" ({noisy})" if noisy else "",
                             sweep.iters_per_freq, sweep.remeasured, self._remeasure_max)
                return False
        updates = self._poller.updates() if self._poller is not None else None
        self._wait_power(updates or [])
        energies = recorder.finish_frequency(freq, updates, self.p_blocking_w)
        self.between.finish(freq)
        if self._clocks is not None:
            self.reasons[freq] = tuple(reason_names(self._clocks.clock_reasons_since(self._clock_since)))
        stopped = self._collective.all_true(energy_stopped_falling(self._lowest, energies))
        for key, e in energies.items():
            self._lowest[key] = min(e, self._lowest.get(key, e))
        was_refining = sweep.refining
        nxt = sweep.next_frequency(stopped)
        if sweep.refining:
            self._refine()
            nxt = None if sweep.done else sweep.current_mhz
        self._write_partial()
        if is_root:
            log.info("perseus: profiled %d MHz (%d clocks measured, %d of %d candidates)%s", freq, len(sweep.visited),
                     len(set(sweep.visited)), len(sweep.frequencies),
                     "; energy stopped falling for every kind, the coarse pass ends here"
                     if sweep.stopped_early and not was_refining else "")
        if nxt is not None:
            self._gpu.apply(nxt)
            self._clock_since = monotonic()
            return False
        self._gpu.reset()
        self.stop()
        if recorder.fallback_reasons and is_root:
            log.warning(
                "perseus: energy attribution fell back to per-step counter readings for %d clock(s) (%s); "
                "run more iters_per_freq for counter-interval regression",
                len(recorder.fallback_reasons), recorder.fallback_reasons[0],
            )
        return True

    def _wait_power(self, updates: list[Any]) -> None:
        """At the end of the first clock measured: P_blocking from the pipeline's waits where they
        were long enough (``wait_power.py``), else the gloo measurement stays; decided once."""
        waits, self.waits = self.waits, None
        found = waits.power_w(updates) if waits is not None else None
        if found is None:
            return
        gloo, (self.p_blocking_w, seconds) = self.p_blocking_w, found
        self.p_blocking_source = wait_power.WAITS
        log.info("perseus: rank %d: P_blocking %.1f W in this stage's pipeline waits (%.2f s of them at %d MHz; the "
                 "separate measurement on the idle GPU read %.1f W)", self._collective.rank, self.p_blocking_w,
                 seconds, self.sweep.current_mhz, gloo)

    def _lengthen(self) -> bool:
        """Collective: measure this clock longer while its iterations span fewer energy-counter
        intervals than ``attribution_intervals`` (the counter period as the port's poller measured
        it), up to 3 x ``iters_per_freq``; True when lengthened."""
        sweep = self.sweep
        source = self._gpu.energy_source()
        period = source.counter_period_s() if self._intervals else None
        if period is not None and period <= 1.5 * source.interval_s:
            period = None  # it changes at every poll: a fine-grained counter, every window is enough
        window = attribution_window_s(period, self._intervals) if period else 0.0
        spent = self.recorder.window_s()
        short = sweep.iters_target < self._iters_max and spent < window
        if not self._collective.all_true(not short):  # every rank the same: one more round each
            sweep.lengthen(sweep.iters_per_freq)
            return True
        return False

    def _noisy(self, freq: int) -> str:
        """A key whose time's standard error at ``freq`` exceeds half its change from the clock
        measured before ('' when none, or nothing to compare with)."""
        previous = self.sweep.visited[-1] if self.sweep.visited else None
        if previous is None:
            return ""
        stats, measured = self.recorder.time_stats(), self.recorder.measurements
        for key in sorted(k for k in stats if k in measured):  # instructions, not the non-instruction bucket
            st, before = stats[key], measured[key].get(previous)
            if before is None or st.se <= 0:
                continue
            effect = abs(st.median - as_point(before).time_s)
            if st.se > NOISE_VS_EFFECT * effect:
                return f"{key[1]} chunk {key[0]}: ±{st.se * 1e3:.2f} ms vs {effect * 1e3:.2f} ms"
        return ""

    def _refine(self) -> None:
        """Collective: the clocks the model failed to predict on any rank are split (bounded)."""
        sweep = self.sweep
        if len(sweep.refined) >= sweep.refine_max:
            return
        failing: set[int] = set()
        own = self.sweep_start.own_mhz
        for key, measured in self.recorder.measurements.items():
            # above the clock sustained under this kind the card ran at that one: nothing to interpolate there
            mine = self.sweep_start.own_for(key)
            per_freq = {f: p for f, p in measured.items() if mine is None or f <= mine}
            freqs = sorted(per_freq, reverse=True)
            pts = [as_point(per_freq[f]) for f in freqs]
            for f, te, ee in loo_errors(freqs, [p.time_s for p in pts], [p.decision_energy_j for p in pts]):
                p = as_point(per_freq[f])
                if not interpolation_ok(te, ee, p.se_s / max(p.time_s, 1e-30)):
                    failing.add(f)
        wanted = {f for f in sweep.refinement_candidates(sorted(failing)) if own is None or f < own}
        votes = self._collective.vote_any([1.0 if f in wanted else 0.0 for f in sweep.frequencies])
        agreed = [f for f, wanted_somewhere in zip(sweep.frequencies, votes) if wanted_somewhere]
        added = sweep.add_refinements(agreed)
        if added and self._collective.is_root:
            log.info("perseus: interpolation is not accurate near %s MHz; measuring %s MHz too",
                     ", ".join(map(str, sorted(failing, reverse=True))) or "another rank's clocks",
                     ", ".join(map(str, added)))

    def _write_partial(self) -> None:
        """Collective when a cache is configured: rank 0 keeps every rank's measurements so far."""
        if not self._keep_partial:
            return
        shares = self._collective.gather_to_root(self.share())
        if shares is None or self._save_partial is None:
            return
        if all(share["trusted"] for share in shares):
            self._save_partial({"sweep": self.sweep.state(), "world": self._collective.size, "ranks": shares})
        else:  # a rank's clocks were refused: what it measured ran at default clocks
            self._save_partial(None)

    def stop(self) -> None:
        """Stop the counter poller; idempotent (close calls it too)."""
        if self._poller is not None:
            self._poller.stop()
            self._poller = None

    def measurements(self, job: PipelineJob, gpu_name: str) -> RankMeasurements:
        """This rank's share of the profile, for the gather to rank 0: the clocks above its
        sustained one equal to it, with the reasons warm-up saw (the unlocked card under load)."""
        own, grid = self.sweep_start.own_mhz, self.sweep.frequencies
        reasons = dict(self.reasons)
        if own is not None:
            reasons.update({f: tuple(reason_names(self.sustained.reasons)) for f in grid if f > own})
        extra = {between_steps.EXTRA_KEY: self.between.share(), "p_blocking_source": self.p_blocking_source}
        measured = equal_above(self.recorder.measurements, own, grid, self.sweep_start.own_by_key)
        return RankMeasurements(job.stage, job.tp_rank, job.dp_rank, measured, self.p_blocking_w, gpu_name, extra,
                                sustained_mhz=own, reasons=reasons,
                                kinds=kind_warmups(self.sweep_start, self.sustained, measured))

    def iterations(self) -> int:
        """Iterations this run spent profiling (a resumed run does not count the earlier one's)."""
        return self.sweep.iterations

    def switch_latency(self) -> SwitchLatency | None:
        """Collective: the job's switch latency from every rank's sweep (``job_switch_latency``)."""
        mine = switch_latency_of(s for s in self._gpu.switch_samples if s.requested_s >= self._started_s)
        return job_switch_latency(self._collective, mine)

    def why_no_latency(self) -> str:
        """Why this rank measured no switch latency (for the one line that says so)."""
        if self._gpu.reports_clock is False:
            return "the GPU does not report its applied clock"
        return f"fewer than {MIN_SWITCHES} clock changes were seen to land in this run's sweep"


def with_run_notes(profile: Profile, ranks: Iterable[Any] | None) -> Profile:
    """Rank 0's ``profile`` with what the ranks measured beside their instructions
    (``RankMeasurements.extra``): each stage's work between steps and where P_blocking came from
    (the hierarchical control plane's combined entries carry neither: the profile then has none)."""
    ranks = [r for r in ranks or () if getattr(r, "extra", None)]
    if not ranks:
        return profile
    notes = dict(profile.notes)
    sources = [str(r.extra["p_blocking_source"]) for r in ranks if "p_blocking_source" in r.extra]
    if sources:
        notes["p_blocking_source"] = wait_power.source_note(sources)
    return replace(profile, between_steps=between_steps.combine(ranks), notes=notes)


def switch_latency_of(samples: Iterable[SwitchSample]) -> SwitchLatency | None:
    """The median request-to-applied time of ``samples`` (each read off the poll interval that saw
    the change, ``SwitchSample.latency_s``); None with fewer than ``MIN_SWITCHES``. The median of
    the sweep's changes, down and up, to several clocks: a change the busy host saw late does not
    set it."""
    latencies = [s.latency_s for s in samples]
    if len(latencies) < MIN_SWITCHES:
        return None
    return SwitchLatency(median(latencies), len(latencies))


def job_switch_latency(collective: Collective, mine: SwitchLatency | None) -> SwitchLatency | None:
    """Collective: the job's latency, every rank's measured one gathered: the largest (one plan and
    one lead serve every stage, and a switch must land in time on the slowest card), with the
    switches of all ranks counted; None where no rank measured one."""
    rows = collective.all_gather_floats([mine.seconds, float(mine.samples)] if mine is not None else [0.0, 0.0])
    measured = [(seconds, int(samples)) for seconds, samples in rows if samples >= 1]
    if not measured:
        return None
    return SwitchLatency(max(seconds for seconds, _ in measured), sum(samples for _, samples in measured))


def _own_share(partial: Mapping[str, Any], job: PipelineJob | None, world: int) -> dict[str, Any] | None:
    """This rank's entry of a partial profile written by a job of the same shape, else None."""
    if job is None or partial.get("world") != world or "sweep" not in partial:
        return None
    for share in partial.get("ranks") or []:
        if (share.get("stage"), share.get("tp_rank"), share.get("dp_rank")) == (job.stage, job.tp_rank, job.dp_rank):
            return share
    return None


def partial_saver(cache: Any) -> Callable[[dict[str, Any] | None], None] | None:
    """Rank 0's writer of ``partial_profile.json`` (None without a cache; ``save(None)`` removes
    it): a failed write costs only the resume, and is said once."""
    if cache is None:
        return None
    warned: list[bool] = []

    def save(state: dict[str, Any] | None) -> None:
        try:
            if state is None:
                cache.clear_partial()
            else:
                cache.save_partial(state)
        except OSError as exc:
            if not warned:
                warned.append(True)
                log.warning("perseus: could not save the partial profile to the cache (%s); a run that ends while "
                            "profiling will profile from the start", exc.strerror or exc)

    return save


def describe_noise(profile: Any) -> str | None:
    """One line when the profile has points whose noise is larger than the effect measured."""
    noisy = noisy_points(profile)
    if not noisy:
        return None
    return (f"perseus: noise is larger than the clock's effect at {len(noisy)} profiled point(s) (e.g. {noisy[0]}); "
            "the plan uses pessimistic times there (fitted time + noise_k standard errors), so it saves a little less")


def measure_p_blocking(gpu: GPUPort, collective: Collective, seconds: float) -> float:
    """P_blocking of this rank's GPU: blocked in a gloo recv while a partner rank sleeps (ranks in
    pairs, ``Collective.blocking_channel``); the mean idle power if the measurement fails here, a
    ``CollectiveError`` if the peer died or hung."""
    channel = collective.blocking_channel()
    try:
        return gpu.measure_p_blocking(seconds, channel)
    except CollectiveError:  # the control plane's own line already says which measurement
        raise
    except RuntimeError as exc:  # gloo: the peer died or hung in the pair's send/recv
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        peer = channel.peer if channel is not None else "its peer"
        raise CollectiveError(f"the P_blocking measurement with {peer} failed: {first}") from None
    except PerseusError as exc:
        log.warning("perseus: P_blocking measurement failed (%s); using mean instantaneous idle power", exc)
        return gpu.sample_idle_power(seconds)
