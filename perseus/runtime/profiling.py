"""One online profiling run: the clock sweep walked step by step, with its energy poller.

The engine owns the phase; this owns what profiling needs between its first and last step (the
sweep, the recorder, the counter poller, the previous clock's energies), so the engine holds one
object for all of it and the run can be read afterwards (visited clocks, early stop).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from perseus.errors import PerseusError
from perseus.runtime.aggregate import RankMeasurements
from perseus.runtime.clock_sweep import ClockSweep, energy_rose, profiling_iterations, select_frequencies
from perseus.runtime.collective import Collective, CollectiveError
from perseus.runtime.config import PerseusConfig
from perseus.runtime.events import PipelineJob
from perseus.runtime.gpu_port import GPUPort
from perseus.runtime.profiler import Key, SweepRecorder

if TYPE_CHECKING:
    from perseus.gpu.measurement import EnergyPoller

log = logging.getLogger("perseus.runtime")


class ProfilingRun:
    """The clocks to profile (chosen when built: a bad range fails before anything is measured)."""

    def __init__(self, gpu: GPUPort, collective: Collective, config: PerseusConfig, keys: list[Key]) -> None:
        c = config
        freqs = select_frequencies(gpu.supported_mhz, c.freq_min_mhz, c.freq_max_mhz, c.freq_step_mhz, c.freq_every_k)
        self.sweep = ClockSweep(freqs, c.iters_per_freq, c.early_stop_patience)
        self.recorder = SweepRecorder(keys)
        self.p_blocking_w = 0.0
        self._gpu = gpu
        self._collective = collective
        self._poll_s = c.energy_poll_s
        self._warmup_steps = c.warmup_steps
        self._poller: EnergyPoller | None = None
        self._prev_energies: dict[Any, float] | None = None

    def start(self, p_blocking_w: float) -> None:
        """Counter poller on, first clock set (waiting until it is in effect)."""
        self.p_blocking_w = p_blocking_w
        freqs, iters = self.sweep.frequencies, self.sweep.iters_per_freq
        if self._collective.is_root:
            log.info("perseus: profiling %d clocks %d..%d MHz, %d iterations each (at most %d iterations incl. "
                     "warm-up); P_blocking %.1f W", len(freqs), freqs[0], freqs[-1], iters,
                     profiling_iterations(self._warmup_steps, iters, len(freqs)), p_blocking_w)
        self._poller = self._gpu.energy_poller(self._poll_s)
        self._gpu.apply(self.sweep.current_mhz)

    def step(self, timed: list[Any], step_time_s: float, energy_j: float) -> bool:
        """One profiled iteration (collective at the end of each clock); True once the sweep is
        over, with the clocks back at default and the poller stopped."""
        sweep, recorder, is_root = self.sweep, self.recorder, self._collective.is_root
        freq = sweep.current_mhz
        recorder.add_step(timed, step_time_s, energy_j, self.p_blocking_w)
        if not sweep.count_iteration():
            return False
        updates = self._poller.updates() if self._poller is not None else None
        energies = recorder.finish_frequency(freq, updates, self.p_blocking_w)
        rising = self._collective.all_true(energy_rose(self._prev_energies, energies))
        self._prev_energies = energies
        nxt = sweep.next_frequency(rising)
        if is_root:
            log.info("perseus: profiled %d MHz (%d/%d clocks)%s", freq, len(sweep.visited), len(sweep.frequencies),
                     "; energy rises at lower clocks, sweep stops early" if sweep.stopped_early else "")
        if nxt is not None:
            self._gpu.apply(nxt)
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

    def stop(self) -> None:
        """Stop the counter poller; idempotent (close calls it too)."""
        if self._poller is not None:
            self._poller.stop()
            self._poller = None

    def measurements(self, job: PipelineJob, gpu_name: str) -> RankMeasurements:
        """This rank's share of the profile, for the gather to rank 0."""
        return RankMeasurements(job.stage, job.tp_rank, job.dp_rank, self.recorder.measurements, self.p_blocking_w, gpu_name)


def measure_p_blocking(gpu: GPUPort, collective: Collective, seconds: float) -> float:
    """P_blocking of this rank's GPU: blocked in a gloo recv while a partner rank sleeps (ranks in
    pairs); the mean idle power if the measurement fails here, a ``CollectiveError`` if the peer
    died or hung."""
    rank = collective.rank
    peer = rank ^ 1 if rank ^ 1 < collective.size else None
    try:
        return gpu.measure_p_blocking(seconds, collective, peer)
    except RuntimeError as exc:  # gloo: the peer died or hung in the pair's send/recv
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CollectiveError(f"the P_blocking measurement with rank {peer} failed: {first}") from None
    except PerseusError as exc:
        log.warning("perseus: P_blocking measurement failed (%s); using mean instantaneous idle power", exc)
        return gpu.sample_idle_power(seconds)
