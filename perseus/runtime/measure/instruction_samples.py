"""Online profiling: per-instruction time and energy at each swept clock, during real training.

Timing uses the GPU layer's instruction timer (CUDA events on a real GPU, host clock on the
simulated one), resolved once per step. Energy comes from the GPU's coarse cumulative counter
(~100 ms on A100/H100), which no single instruction can be read from. While sweeping, the GPU
layer's ``EnergyPoller`` records when the counter advances (background thread, never the training
thread), and at the end of each clock ``attribute_energy`` solves, over all counter intervals of
that clock's iterations,

    ΔE_interval = Σ_kind P_kind × overlap(kind, interval) + P_between × between(interval)
                  + P_blocking × idle(interval)

for the average power of each (chunk, kind); energy per instruction = power × typical duration.
The GPU's work between steps (optimizer, gradient all-reduce: a step's last instruction's end to
the step's end) is a column of its own, so its energy is neither smeared over the instructions nor
billed at P_blocking; ``between_steps`` gives its time and energy per step at each clock. The
stage's kinds share one power unless the intervals identify a split, and no power leaves
[P_blocking, the card's power limit] (``perseus.gpu.meter.power_split``); a power held at a bound
is kept in its point (``ClockPoint.bound_w``) and said in ``notes``.

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
``e_i = (E_step − E_between − P_blocking × idle) × d_i / Σ d`` (E_between at its fitted power where
the regression gave one, else the work between steps shares by time too); the engine warns once
when it is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence, cast

from perseus.gpu.errors import GPUError
from perseus.gpu.meter.counter import CounterWindow
from perseus.gpu.meter.energy import AttributionResult, CounterUpdate, MeasurementError, attribute_energy
from perseus.gpu.meter.timing import TimedInstruction
from perseus.gpu.stream.gpu_time import NON_INSTRUCTION
from perseus.profile.fit import SampleStats, first_is_outlier, robust_stats
from perseus.profile.aggregate import ClockPoint, Measurements
from perseus.schedules import Instruction

if TYPE_CHECKING:
    from perseus.gpu.device import GPUDevice

Key = tuple[int, str]  # (chunk, kind)
Step = tuple[list[TimedInstruction], float, float | None]  # timed, step time, step energy (None: unmeasured)
# Work between steps shorter than this share of a clock's GPU time is left to the idle column (a
# host-timed step's few microseconds after its last instruction): too little to fit a power to.
BETWEEN_MIN_SHARE = 0.01


def _key(t: TimedInstruction) -> Key:
    """The key the runtime times its instructions under (``StepClock``): (chunk, kind); the GPU
    layer's timer keeps any hashable."""
    return cast(Key, t.key)


def instruction_keys(instructions: Sequence[Instruction]) -> list[Key]:
    return sorted({(i.chunk, i.kind) for i in instructions})


def power_limit_of(device: GPUDevice | None) -> float | None:
    """The card's power limit (W), the ceiling of every attributed power; None where it cannot be read."""
    if device is None:
        return None
    try:
        limit = float(device.power_limit_w())
    except (GPUError, OSError, ValueError, NotImplementedError):
        return None
    return limit if limit > 0 and math.isfinite(limit) else None


@dataclass(frozen=True)
class BetweenStepsFit:
    """One clock's GPU work between steps (its last instruction's end to its end), per step.
    ``fitted``: its power is the regression's own column; else the per-step attribution's
    time-proportional share of the step's busy energy."""

    time_s: float
    energy_j: float
    power_w: float
    power_stderr_w: float
    fitted: bool


def with_between(timed: list[TimedInstruction], step_time_s: float,
                 next_start_s: float = math.inf) -> list[TimedInstruction]:
    """A step's timed instructions and its work between steps as one ``NON_INSTRUCTION`` span: the
    GPU timeline marks it; a host-timed step's runs from its last instruction's end to
    ``step_time_s`` after its first one began (the step's begin hook came a little earlier), at
    most to the next step's first instruction (``next_start_s``)."""
    if not timed or any(t.key == NON_INSTRUCTION for t in timed):
        return timed
    end = min(min(t.start_s for t in timed) + step_time_s, next_start_s)
    last = max(t.end_s for t in timed)
    return timed + [TimedInstruction(NON_INSTRUCTION, last, end)] if end > last else timed


class SweepRecorder:
    """Collects one clock's timed instructions and step energies; yields per-key means.

    ``power_limit_w``: the card's power limit (``power_limit_of``), no attributed power above it."""

    def __init__(self, keys: list[Key], power_limit_w: float | None = None) -> None:
        self.keys = keys
        self.power_limit_w = power_limit_w
        self.measurements: Measurements = {key: {} for key in keys}
        self.fallback_reasons: list[str] = []
        self.first_dropped: list[int] = []  # clocks whose first iteration was dropped as slow
        self._steps: list[Step] = []
        self._first_steps: set[int] = set()  # indices in _steps that were first after a clock change
        # the regression's standard error of each key's energy per instruction, per clock (J)
        self.energy_se: dict[tuple[Key, int], float] = {}
        self.between_steps: dict[int, BetweenStepsFit] = {}  # clock -> its work between steps, per step
        self.shared: dict[int, bool] = {}  # clock -> whether the stage's kinds got one power there
        self.windows: dict[int, CounterWindow] = {}  # clock -> what the counter's intervals were read to measure
        self.notes: list[str] = []  # powers held at a bound, one line each

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

    def _kept_steps(self) -> tuple[list[Step], bool]:
        """This clock's iterations without a systematically slow first one; True if it was dropped.
        Each with its work between steps (``with_between``)."""
        starts = [min((t.start_s for t in timed), default=math.inf) for timed, _, _ in self._steps]
        steps = [(with_between(timed, step_s, nxt), step_s, e)
                 for (timed, step_s, e), nxt in zip(self._steps, starts[1:] + [math.inf])]
        firsts = [i for i in self._first_steps if i < len(steps)]
        if not firsts or len(steps) < 2:
            return steps, False
        first = firsts[0]
        rest = [s for i, s in enumerate(steps) if i != first]
        slow = 0
        keys = {t.key for t in steps[first][0]} - {NON_INSTRUCTION}
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
        steps = _without_little_between(steps)
        timed = [t for s in steps for t in s[0]]
        result: dict[Key, tuple[float, float]] = {}
        fit: AttributionResult | None = None
        if updates is not None and timed:
            lo = min(t.start_s for t in timed)
            hi = max(t.end_s for t in timed)
            window = [u for u in updates if lo <= u.t_s <= hi]
            inside = [t for t in timed if t.key != NON_INSTRUCTION  # work between steps the counter did not see: left out
                      or (window and t.end_s > window[0].t_s and t.start_s < window[-1].t_s)]
            try:
                fit = attribute_energy(window, inside, idle_power_w=p_blocking_w,
                                       shared=[k for k in self.measurements], power_limit_w=self.power_limit_w)
            except MeasurementError as exc:
                self.fallback_reasons.append(f"{freq_mhz} MHz: {exc}")
        between = fit.keys.get(NON_INSTRUCTION) if fit is not None else None
        per_step, tail = _per_step(steps, p_blocking_w, between.power_w if between is not None else None)
        if fit is not None:
            fitted = {k: v for k, v in fit.keys.items() if k in self.measurements}
            result = {k: (v.mean_duration_s, v.energy_j) for k, v in fitted.items()}
            self.energy_se.update({(k, freq_mhz): v.energy_stderr_j for k, v in fitted.items()})
            self.shared[freq_mhz], self.windows[freq_mhz] = fit.shared, fit.window
            self.notes += [_bound_note(freq_mhz, k, *held, p_blocking_w) for k, held in fit.clamped.items()]
        self._record_between(freq_mhz, steps, tail, fit)
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
        held = fit.clamped if fit is not None else {}
        energies: dict[Key, float] = {}
        for key, (time_s, energy_j) in result.items():
            if key in self.measurements:
                st = stats.get(key)
                step_e = _at_typical(*per_step[key], typical.get(key))[1] if key in per_step else 0.0
                bound = held[key][1] if key in held and key not in unfit else 0.0
                point = ClockPoint(time_s, energy_j, st.n if st else 1, st.spread if st else 0.0, st.se if st else 0.0,
                                   step_e, bound)
                self.measurements[key][freq_mhz] = point
                energies[key] = point.decision_energy_j
        return energies

    def _record_between(self, freq_mhz: int, steps: list[Step], tail: tuple[float, float, int],
                        fit: AttributionResult | None) -> None:
        """``between_steps`` at this clock: the regression's column where it had one, else the
        per-step share of the measured steps (nothing where the steps had no work between them)."""
        spans = [sum(t.duration_s for t in timed if t.key == NON_INSTRUCTION) for timed, _, _ in steps]
        spans = [s for s in spans if s > 0]
        if not spans:
            return
        per_step_s = sum(spans) / len(spans)
        if fit is not None and NON_INSTRUCTION in fit.keys:
            v = fit.keys[NON_INSTRUCTION]
            self.between_steps[freq_mhz] = BetweenStepsFit(per_step_s, v.power_w * per_step_s, v.power_w,
                                                           v.power_stderr_w, True)
            return
        time_s, energy_j, _ = tail
        if time_s > 0 and energy_j > 0:
            power = energy_j / time_s
            self.between_steps[freq_mhz] = BetweenStepsFit(per_step_s, power * per_step_s, power, math.nan, False)


def _without_little_between(steps: list[Step]) -> list[Step]:
    """The steps without their work between steps where it is under ``BETWEEN_MIN_SHARE`` of the
    clock's GPU time (idle, at P_blocking, like the gaps between instructions)."""
    timed = [t for s in steps for t in s[0]]
    between = sum(t.duration_s for t in timed if t.key == NON_INSTRUCTION)
    if between <= 0 or between >= BETWEEN_MIN_SHARE * sum(t.duration_s for t in timed):
        return steps
    return [([t for t in step_timed if t.key != NON_INSTRUCTION], step_s, e) for step_timed, step_s, e in steps]


def _per_step(steps: list[Step], p_blocking_w: float, between_w: float | None
              ) -> tuple[dict[Key, tuple[float, float]], tuple[float, float, int]]:
    """Per-step attribution: each measured step's busy energy (less P_blocking × idle, and the work
    between steps at ``between_w`` where fitted) shared by duration. Returns (key -> mean (time,
    energy)), and the work between steps' (total time, total energy, steps)."""
    sums: dict[Key, list[float]] = {}
    tail = [0.0, 0.0, 0]
    for step_timed, step_time_s, step_energy_j in steps:
        between_s = sum(t.duration_s for t in step_timed if t.key == NON_INSTRUCTION)
        busy = sum(t.duration_s for t in step_timed)
        if busy <= 0 or step_energy_j is None:  # an unmeasured step says nothing of energy, not 0 J
            continue
        busy_energy = max(step_energy_j - p_blocking_w * max(step_time_s - busy, 0.0), 0.0)
        shared_s = busy
        if between_w is not None and between_s > 0:
            busy_energy = max(busy_energy - between_w * between_s, 0.0)
            shared_s = busy - between_s
        for t in step_timed:
            if t.key == NON_INSTRUCTION:
                if between_w is None:
                    tail[1] += busy_energy * t.duration_s / shared_s
                continue
            acc = sums.setdefault(_key(t), [0.0, 0.0, 0])
            acc[0] += t.duration_s
            acc[1] += busy_energy * t.duration_s / shared_s if shared_s > 0 else 0.0
            acc[2] += 1
        if between_s > 0:
            tail[0] += between_s
            tail[1] += between_w * between_s if between_w is not None else 0.0
            tail[2] += 1
    return ({k: (t / n, e / n) for k, (t, e, n) in sums.items() if n},
            (tail[0], tail[1], int(tail[2])))


def _bound_note(freq_mhz: int, key: object, fitted_w: float, bound_w: float, p_blocking_w: float) -> str:
    what = f"{key[1]} chunk {key[0]}" if isinstance(key, tuple) and len(key) == 2 else "the work between steps"
    where = "the power limit" if bound_w > p_blocking_w else "P_blocking"
    return f"{freq_mhz} MHz: {what} fitted {fitted_w:.0f} W, held at {where} ({bound_w:.0f} W)"


def _at_typical(mean_time_s: float, energy_j: float, typical_s: float | None) -> tuple[float, float]:
    """(time, energy) at the typical duration, keeping the measured average power."""
    if typical_s is None or mean_time_s <= 0:
        return mean_time_s, energy_j
    return typical_s, energy_j * typical_s / mean_time_s
