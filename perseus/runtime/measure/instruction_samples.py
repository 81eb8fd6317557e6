"""Online profiling: per-instruction time and energy at each swept clock, during real training.

Timing uses the GPU layer's instruction timer (CUDA events on a real GPU, host clock on the
simulated one), resolved once per step. Energy comes from the GPU's coarse cumulative counter
(~100 ms on A100/H100), which no single instruction can be read from. While sweeping, the GPU
layer's ``EnergyPoller`` records when the counter advances (background thread, never the training
thread), and at the end of each clock ``attribute_energy`` solves, over all counter intervals of
that clock's iterations,

    ΔE_interval = Σ_kind P_kind × overlap(kind, interval) + P_blocking × idle(interval)

for the average power of each (chunk, kind); energy per instruction = power × typical duration.

The typical duration is the *median* over the clock's instructions of that key, not the mean:
one instruction stretched by something outside the GPU (the process descheduled on a busy node,
a garbage-collection pause, the first call after a collective) must not make a clock look slow
and expensive, which would steer the plan off the critical path's real costs.

Samples: every instruction of a key at a clock is one sample of its time. The first iteration
after a clock change is often slow on a busy node (the clock change, caches, the collective at the
clock boundary); it is measured, and dropped when its times are beyond the other iterations' noise
(``profile_fit.first_is_outlier``, judged over all keys at once: the slowness is systematic).
Outlier instructions are then dropped by a median/MAD rule, and each key's point records its sample
count, spread and standard error (``aggregate.ClockPoint``), so the profile says how well it is
known.

Fallback when the regression cannot be solved (too few counter updates in a short window, kinds
not separable): per-step attribution from step-boundary counter readings,
``e_i = (E_step − P_blocking × idle) × d_i / Σ d``; the engine warns once when it is used.
"""

from __future__ import annotations

import math
from typing import Sequence, cast

from perseus.gpu.meter.energy import CounterUpdate, MeasurementError, attribute_energy
from perseus.gpu.meter.timing import TimedInstruction
from perseus.profile.fit import SampleStats, first_is_outlier, robust_stats
from perseus.profile.aggregate import ClockPoint, Measurements
from perseus.schedules import Instruction

Key = tuple[int, str]  # (chunk, kind)


def _key(t: TimedInstruction) -> Key:
    """The key the runtime times its instructions under (``StepClock``): (chunk, kind); the GPU
    layer's timer keeps any hashable."""
    return cast(Key, t.key)


def instruction_keys(instructions: Sequence[Instruction]) -> list[Key]:
    return sorted({(i.chunk, i.kind) for i in instructions})


class SweepRecorder:
    """Collects one clock's timed instructions and step energies; yields per-key means."""

    def __init__(self, keys: list[Key]) -> None:
        self.keys = keys
        self.measurements: Measurements = {key: {} for key in keys}
        self.fallback_reasons: list[str] = []
        self.first_dropped: list[int] = []  # clocks whose first iteration was dropped as slow
        # (timed, step time, step energy; None: unmeasured, ``StepNumbers.energy_j``)
        self._steps: list[tuple[list[TimedInstruction], float, float | None]] = []
        self._first_steps: set[int] = set()  # indices in _steps that were first after a clock change
        # the regression's standard error of each key's energy per instruction, per clock (J)
        self.energy_se: dict[tuple[Key, int], float] = {}

    def add_step(self, timed: list[TimedInstruction], step_time_s: float, step_energy_j: float | None,
                 p_blocking_w: float, first: bool = False) -> None:
        """One iteration at the current clock (its instructions and step-boundary energy);
        ``first``: the first iteration after the clock was changed."""
        if first:
            self._first_steps.add(len(self._steps))
        self._steps.append((list(timed), step_time_s, step_energy_j))

    def window_s(self) -> float:
        """Time the current clock's iterations have spanned so far (GPU time where measured so)."""
        return sum(t for _, t, _ in self._steps)

    def _kept_steps(self) -> tuple[list[tuple[list[TimedInstruction], float, float | None]], bool]:
        """This clock's iterations without a systematically slow first one; True if it was dropped."""
        steps = self._steps
        firsts = [i for i in self._first_steps if i < len(steps)]
        if not firsts or len(steps) < 2:
            return steps, False
        first = firsts[0]
        rest = [s for i, s in enumerate(steps) if i != first]
        slow = 0
        keys = {t.key for t in steps[first][0]}
        for key in keys:
            a = [t.duration_s for t in steps[first][0] if t.key == key]
            b = [t.duration_s for s in rest for t in s[0] if t.key == key]
            slow += first_is_outlier(a, b)
        if keys and slow * 2 > len(keys):
            return rest, True
        return steps, False

    def time_stats(self) -> dict[Key, SampleStats]:
        """Robust time statistics of each key at the current clock so far (nothing is closed)."""
        steps, _ = self._kept_steps()
        by_key: dict[Key, list[float]] = {}
        for timed, _, _ in steps:
            for t in timed:
                by_key.setdefault(_key(t), []).append(t.duration_s)
        return {k: robust_stats(v) for k, v in by_key.items() if v}

    def finish_frequency(
        self, freq_mhz: int, updates: Sequence[CounterUpdate] | None, p_blocking_w: float
    ) -> dict[Key, float]:
        """Close one clock: attribute, store each key's point, return its energy per key (the
        step-boundary attribution: what the sweep decides on)."""
        stats = self.time_stats()
        steps, dropped = self._kept_steps()
        if dropped:
            self.first_dropped.append(freq_mhz)
        self._steps, self._first_steps = [], set()
        timed = [t for s in steps for t in s[0]]
        step_sums: dict[Key, list[float]] = {}
        for step_timed, step_time_s, step_energy_j in steps:
            busy = sum(t.duration_s for t in step_timed)
            if busy <= 0 or step_energy_j is None:  # an unmeasured step says nothing of energy, not 0 J
                continue
            busy_energy = max(step_energy_j - p_blocking_w * max(step_time_s - busy, 0.0), 0.0)
            for t in step_timed:
                acc = step_sums.setdefault(_key(t), [0.0, 0.0, 0])
                acc[0] += t.duration_s
                acc[1] += busy_energy * t.duration_s / busy
                acc[2] += 1
        result: dict[Key, tuple[float, float]] = {}
        if updates is not None and timed:
            lo = min(t.start_s for t in timed)
            hi = max(t.end_s for t in timed)
            window = [u for u in updates if lo <= u.t_s <= hi]
            try:
                fit = attribute_energy(window, timed, idle_power_w=p_blocking_w)
                fitted = {cast(Key, k): v for k, v in fit.keys.items()}  # keys of the timed instructions: ``_key``
                result = {k: (v.mean_duration_s, v.energy_j) for k, v in fitted.items()}
                self.energy_se.update({(k, freq_mhz): v.energy_stderr_j for k, v in fitted.items()
                                       if k in self.measurements})
            except MeasurementError as exc:
                self.fallback_reasons.append(f"{freq_mhz} MHz: {exc}")
        per_step = {k: (t / n, e / n) for k, (t, e, n) in step_sums.items() if n}
        if not result:
            result = per_step
        # A regression on few, noisy counter intervals can give a kind no power at all; a profile
        # must have positive energies, so such a kind takes its per-step attribution instead.
        unfit = [k for k, (_, e) in result.items() if not (e > 0 and math.isfinite(e)) and k in per_step]
        if unfit:
            self.fallback_reasons.append(f"{freq_mhz} MHz: no positive energy fitted for {', '.join(map(str, unfit))}")
            result = {**result, **{k: per_step[k] for k in unfit}}
        typical = {k: v.median for k, v in stats.items()}
        result = {k: _at_typical(t, e, typical.get(k)) for k, (t, e) in result.items()}
        energies: dict[Key, float] = {}
        for key, (time_s, energy_j) in result.items():
            if key in self.measurements:
                st = stats.get(key)
                step_e = _at_typical(*per_step[key], typical.get(key))[1] if key in per_step else 0.0
                point = ClockPoint(time_s, energy_j, st.n if st else 1, st.spread if st else 0.0, st.se if st else 0.0,
                                   step_e)
                self.measurements[key][freq_mhz] = point
                energies[key] = point.decision_energy_j
        return energies


def _at_typical(mean_time_s: float, energy_j: float, typical_s: float | None) -> tuple[float, float]:
    """(time, energy) at the typical duration, keeping the measured average power."""
    if typical_s is None or mean_time_s <= 0:
        return mean_time_s, energy_j
    return typical_s, energy_j * typical_s / mean_time_s
