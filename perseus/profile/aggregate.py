"""From every rank's measurements to one pipeline ``Profile``.

A pipeline stage is ``tp_size`` GPUs working in lockstep, replicated ``dp_size`` times:

- tensor parallel (within one stage replica): the stage takes as long as its slowest GPU and uses
  the energy of all of them → **max time, summed energy** across the TP ranks;
- data parallel (replicas of the same stage): the same work on other GPUs → **average** time and
  energy across replicas, so the profile describes one typical pipeline.

P_blocking is per GPU; a stage blocks with all its TP GPUs, so the profile's P_blocking is the
mean per-GPU value × ``tp_size`` (consistent with the summed energies). Only clocks measured on
every rank are kept, so the profile is rectangular.

Then each (stage, chunk, kind) is made trustworthy (``perseus.profile.fit``): its times are fitted
non-increasing in clock, the planner gets the pessimistic fitted time (fit + ``noise_k``
standard errors below the max clock, plus ``spread_k`` times the per-instance spread a clock
adds over the max clock's), and the clocks of ``grid`` between measured ones are
interpolated where the model predicted the measured neighbours within their noise. Raw times,
samples, spread, fit residuals and which clocks were interpolated are kept in ``Profile.quality``.

Clocks above a stage's sustained clock (the clock its unlocked GPUs ran at under this load, the
highest of its GPUs') were not profiled: each rank sends them as copies of its sustained clock's
point, and here they are left out of the fit and set equal to the sustained clock's final entry
(``Profile.clock_notes`` flags them), so the all-max point is the unlocked card under this load.
The clock-event reasons each rank saw at each clock are kept per (stage, clock), the union over
the stage's GPUs.

The card sustains a clock per kind of work, so each rank also sends, per (chunk, kind), the clock
its card sustained under it in warm-up and the kind's time there (``KindWarmup``). A kind's clock
is the highest of its stage's GPUs' (a GPU without one: the stage's), its clocks above are equal to
its own point, and the entry carries what the unlocked card does under it (``Unlocked``): that
clock, warm-up's time at default clocks (max over tensor-parallel ranks, mean over replicas;
without one, the point's) at the point's power.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from statistics import fmean
from typing import Any, Mapping, NamedTuple, Sequence

from perseus.errors import ProfileError
from perseus.profile import ClockNote, InstructionProfile, Profile
from perseus.profile.unlocked import UNLOCKED_MHZ, Unlocked
from perseus.profile.fit import (fit_weights, interpolation_ok, isotonic_times, loo_errors, model_between,
                                 pessimistic_times)


class ClockPoint(NamedTuple):
    """One key at one clock: typical time and energy, and how well they are known."""

    time_s: float
    energy_j: float
    samples: int = 1
    spread_s: float = 0.0  # robust σ of the instruction times
    se_s: float = 0.0  # standard error of the typical time
    # Energy attributed from step-boundary counter readings (busy energy shared by duration):
    # steadier than the per-kind regression, so the sweep's decisions and the interpolation's
    # validation use it (0: not recorded, use energy_j).
    step_energy_j: float = 0.0
    # The bound the attributed power was held at (W; 0: none): the card's power limit, or P_blocking,
    # where the regression's fit lay outside what a GPU running work can draw.
    bound_w: float = 0.0

    @property
    def decision_energy_j(self) -> float:
        return self.step_energy_j or self.energy_j

    @property
    def planning_energy_j(self) -> float:
        """The regression's energy, or the step-boundary attribution where the regression gave
        none: a non-negative least-squares fit clips a key it cannot tell from the others at 0
        (seen for the unpadded DeepSpeed script's 2 ms instructions beside a busy loop), and a
        profile with a 0 energy is one its own loader refuses."""
        return self.energy_j if self.energy_j > 0 else self.step_energy_j


# (chunk, kind) -> freq_mhz -> ClockPoint (a plain (time, energy) pair reads as one sample)
Measurements = dict[tuple[int, str], dict[int, Any]]


def as_point(value: Any) -> ClockPoint:
    return value if isinstance(value, ClockPoint) else ClockPoint(*value)


@dataclass(frozen=True)
class KindWarmup:
    """One (chunk, kind) on a GPU's unlocked card in warm-up: the clock it sustained under the kind
    (None: unknown) and the kind's time at default clocks (a point without energy; None: untimed)."""

    mhz: int | None
    point: ClockPoint | None = None


@dataclass
class RankMeasurements:
    """What one rank measured during the sweep; small and picklable for the gloo gather."""

    stage: int
    tp_rank: int
    dp_rank: int
    measurements: Measurements
    p_blocking_w: float | None = None
    gpu_name: str = "unknown"
    extra: dict[str, Any] = field(default_factory=dict)
    # The clock this GPU sustained under the load (None: unknown, measured from the top), and the
    # clock-event reason names seen at each clock (those above the sustained one: warm-up's).
    sustained_mhz: int | None = None
    reasons: dict[int, tuple[str, ...]] = field(default_factory=dict)
    kinds: dict[tuple[int, str], KindWarmup] = field(default_factory=dict)  # (chunk, kind) -> warm-up's


def combine_kinds(members: Sequence[Mapping[tuple[int, str], KindWarmup]],
                  time_rule: str) -> dict[tuple[int, str], KindWarmup]:
    """The kinds every member (its ``RankMeasurements.kinds``) measured in warm-up: the highest clock
    (unknown if any member's is) and the time by ``time_rule`` ("max" over tensor-parallel ranks,
    "mean" over replicas)."""
    keys = set(members[0]) if members else set()
    for m in members[1:]:
        keys &= set(m)
    out: dict[tuple[int, str], KindWarmup] = {}
    for key in keys:
        clocks = [m[key].mhz for m in members]
        points = [m[key].point for m in members]
        timed = None
        if all(p is not None for p in points):
            timed = _combine([{key: {UNLOCKED_MHZ: p}} for p in points], time_rule, "sum")[key][UNLOCKED_MHZ]
        known = [f for f in clocks if f is not None]
        out[key] = KindWarmup(max(known) if len(known) == len(clocks) else None, timed)
    return out


def with_unlocked(entry: InstructionProfile, clock: int | None, warmup: KindWarmup | None) -> InstructionProfile:
    """``entry`` with what the unlocked card does under it, where its sustained ``clock`` was
    measured: warm-up's time (else the clock's) at the clock's power."""
    if clock is None or clock not in entry.freqs_mhz:
        return entry
    time_s, energy_j = entry.at(clock)
    warm = warmup.point.time_s if warmup is not None and warmup.point is not None else 0.0
    if warm > 0:
        time_s, energy_j = warm, energy_j / time_s * warm
    return replace(entry, unlocked=Unlocked(time_s, energy_j, clock))


def combine_clocks(members: Sequence[RankMeasurements]) -> tuple[int | None, dict[int, tuple[str, ...]]]:
    """GPUs of one stage: the highest sustained clock (unknown if any GPU's is), reasons united."""
    known = [m.sustained_mhz for m in members]
    sustained = None if not known or any(f is None for f in known) else max(f for f in known if f is not None)
    reasons: dict[int, set[str]] = {}
    for m in members:
        for f, names in m.reasons.items():
            reasons.setdefault(int(f), set()).update(names)
    return sustained, {f: tuple(sorted(names)) for f, names in reasons.items()}


def _combine(parts: list[Measurements], time_rule: str, energy_rule: str) -> Measurements:
    keys = set(parts[0])
    for part in parts[1:]:
        keys &= set(part)
    out: Measurements = {}
    for key in keys:
        freqs = set(parts[0][key])
        for part in parts[1:]:
            freqs &= set(part[key])
        per_freq = {}
        for f in freqs:
            points = [as_point(part[key][f]) for part in parts]
            e = sum(p.energy_j for p in points) if energy_rule == "sum" else fmean(p.energy_j for p in points)
            steps = [p.decision_energy_j for p in points]
            se = sum(steps) if energy_rule == "sum" else fmean(steps)
            bound = max(p.bound_w for p in points)  # held at a bound on any GPU
            if time_rule == "max":
                slowest = max(points, key=lambda p: p.time_s)
                per_freq[f] = slowest._replace(energy_j=e, step_energy_j=se, bound_w=bound)
            else:
                per_freq[f] = ClockPoint(fmean(p.time_s for p in points), e, sum(p.samples for p in points),
                                         fmean(p.spread_s for p in points),
                                         math.sqrt(sum(p.se_s ** 2 for p in points)) / len(points), se, bound)
        out[key] = per_freq
    return out


def energies_where_unknown(freqs: Sequence[int], times: Sequence[float], energies: Sequence[float]) -> list[float]:
    """``energies`` with each 0 (no energy measured: neither the regression nor a step-boundary
    attribution separated the key at that clock, seen once a sweep stopped at 810 MHz) replaced by
    the key's measured power at its nearest clock with one, times its time there: a profile with
    a 0 energy is one its own loader refuses. Raises ``ProfileError`` when no clock has one."""
    known = [i for i, e in enumerate(energies) if e > 0]
    if not known:
        raise ProfileError("no energy could be attributed at any clock (its instructions are too short to tell "
                           "apart from the others); profile again with a larger iters_per_freq")
    out = list(energies)
    for i, e in enumerate(energies):
        if e <= 0:
            j = min(known, key=lambda k: abs(freqs[k] - freqs[i]))
            out[i] = energies[j] / max(times[j], 1e-30) * times[i]
    return out


def trusted_entry(per_freq: Mapping[int, Any], grid: Sequence[int] = (), noise_k: float = 2.0,
                  equal_above: int | None = None,
                  spread_k: float = 0.0) -> tuple[InstructionProfile, dict[str, list[Any]]]:
    """One key's measured clocks → its planning entry (pessimistic fitted times, interpolated
    grid clocks where validated) and its quality lists, fastest clock first. Clocks above
    ``equal_above`` (the sustained clock, when measured) are not fitted: each gets its entry."""
    copies: list[int] = []
    if equal_above is not None and equal_above in per_freq:
        copies = sorted((f for f in per_freq if f > equal_above), reverse=True)
        per_freq = {f: p for f, p in per_freq.items() if f <= equal_above}
    freqs = sorted(per_freq, reverse=True)
    pts = [as_point(per_freq[f]) for f in freqs]
    raw = [p.time_s for p in pts]
    se = [p.se_s for p in pts]
    fitted = isotonic_times(freqs, raw, fit_weights(se, raw))
    energies = energies_where_unknown(freqs, raw, [p.planning_energy_j for p in pts])
    ok = {f: interpolation_ok(te, ee, se[freqs.index(f)] / max(fitted[freqs.index(f)], 1e-30))
          for f, te, ee in loo_errors(freqs, fitted, [p.decision_energy_j for p in pts])}
    rows: dict[int, dict[str, Any]] = {}
    spreads = {f: p.spread_s for f, p in zip(freqs, pts)}  # an interpolated clock: its neighbours' larger
    for i, f in enumerate(freqs):
        rows[f] = {"time": fitted[i], "energy_j": energies[i], "raw_time_s": raw[i], "fitted_time_s": fitted[i],
                   "fit_residual_s": raw[i] - fitted[i], "samples": pts[i].samples, "spread_s": pts[i].spread_s,
                   "se_s": se[i], "interpolated": False, "power_bound_w": pts[i].bound_w or None}
    for i in range(len(freqs) - 1):
        hi, lo = freqs[i], freqs[i + 1]
        inner = [f for f in (hi, lo) if f in ok]
        if not inner or not all(ok[f] for f in inner):
            continue  # the model was not shown to hold here: only measured clocks
        for g in grid:
            if lo < g < hi:
                t, e = model_between(g, hi, fitted[i], energies[i], lo, fitted[i + 1], energies[i + 1])
                rows[g] = {"time": t, "energy_j": e, "raw_time_s": None, "fitted_time_s": t, "fit_residual_s": None,
                           "samples": 0, "spread_s": None, "se_s": max(se[i], se[i + 1]), "interpolated": True,
                           "power_bound_w": None}
                spreads[g] = max(pts[i].spread_s, pts[i + 1].spread_s)
    order = sorted(rows, reverse=True)
    times = pessimistic_times([rows[f]["time"] for f in order], [rows[f]["se_s"] for f in order], noise_k,
                              [spreads[f] for f in order], spread_k)
    # the copies above the sustained clock: its row and final time, exactly
    order, times = copies + order, [times[0]] * len(copies) + times
    rows.update({f: rows[freqs[0]] for f in copies})
    quality = {name: [rows[f][name] for f in order]
               for name in ("raw_time_s", "fitted_time_s", "fit_residual_s", "samples", "spread_s", "se_s", "interpolated",
                            "power_bound_w")}
    entry = InstructionProfile(tuple(order), tuple(times), tuple(rows[f]["energy_j"] for f in order))
    return entry, quality


def aggregate_profile(
    ranks: list[RankMeasurements],
    num_stages: int,
    tp_size: int = 1,
    config: Mapping[str, Any] | None = None,
    p_blocking_override_w: float | None = None,
    grid: Sequence[int] = (),
    noise_k: float = 2.0,
    spread_k: float = 0.0,
) -> Profile:
    """Combine all ranks' sweeps into the pipeline profile (TP: max/sum, DP: mean), fitted and
    interpolated onto ``grid`` (``trusted_entry``)."""
    by_replica: dict[tuple[int, int], list[RankMeasurements]] = {}
    for r in ranks:
        by_replica.setdefault((r.stage, r.dp_rank), []).append(r)
    per_stage: dict[int, list[Measurements]] = {}
    stage_ranks: dict[int, list[RankMeasurements]] = {}
    stage_replicas: dict[int, list[RankMeasurements]] = {}  # each replica's kinds, its TP ranks combined
    for (stage, _), members in sorted(by_replica.items()):
        members.sort(key=lambda r: r.tp_rank)
        per_stage.setdefault(stage, []).append(_combine([m.measurements for m in members], "max", "sum"))
        stage_ranks.setdefault(stage, []).extend(members)
        stage_replicas.setdefault(stage, []).append(replace(members[0], kinds=combine_kinds([m.kinds for m in members],
                                                                                             "max")))
    missing = [s for s in range(num_stages) if s not in per_stage]
    if missing:
        raise ProfileError(f"online profile: no measurements from stage(s) {missing}; did every rank profile?")
    entries: dict[tuple[int, int, str], InstructionProfile] = {}
    quality: dict[tuple[int, int, str], dict[str, list[Any]]] = {}
    notes: dict[tuple[int, int], ClockNote] = {}
    sustained_mhz: dict[int, int] = {}
    for stage, replicas in per_stage.items():
        combined = _combine(replicas, "mean", "mean")
        sustained, reasons = combine_clocks(stage_ranks[stage])
        kinds = combine_kinds([r.kinds for r in stage_replicas[stage]], "mean")
        for (chunk, kind), per_freq in combined.items():
            if not per_freq:
                raise ProfileError(f"online profile: stage {stage} {kind} chunk {chunk} has no clock measured on every rank")
            warm = kinds.get((chunk, kind))
            clock = warm.mhz if warm is not None and warm.mhz is not None else sustained
            try:
                entry, quality[(stage, chunk, kind)] = trusted_entry(per_freq, grid, noise_k, clock, spread_k)
            except ProfileError as exc:
                raise ProfileError(f"online profile: stage {stage} {kind} chunk {chunk}: {exc}") from None
            entries[(stage, chunk, kind)] = with_unlocked(entry, clock if clock in per_freq else None, warm)
        clocks = {f for (s, _, _), e in entries.items() if s == stage for f in e.freqs_mhz}
        if sustained is not None and sustained in clocks:
            sustained_mhz[stage] = sustained
        for f in sorted(clocks):
            equal = sustained if stage in sustained_mhz and sustained is not None and f > sustained else None
            if f in reasons or equal is not None:
                notes[(stage, f)] = ClockNote(frozenset(reasons.get(f, ())), equal)
    if p_blocking_override_w is not None:
        p_blocking: float | None = p_blocking_override_w * tp_size
    else:
        measured = [r.p_blocking_w for r in ranks if r.p_blocking_w is not None]
        p_blocking = fmean(measured) * tp_size if measured else None
    gpu_names = sorted({r.gpu_name for r in ranks})
    return Profile(entries, p_blocking, " / ".join(gpu_names), dict(config or {}), "online profile", quality,
                   notes, sustained_mhz)


def noisy_points(profile: Profile) -> list[str]:
    """Measured clocks (below the fastest) whose standard error is larger than the fitted time
    step from the next faster clock: the noise there is larger than the effect measured."""
    out = []
    for (stage, chunk, kind), q in sorted(profile.quality.items()):
        freqs = profile.entries[(stage, chunk, kind)].freqs_mhz
        prev = None
        for f, t, s, interp in zip(freqs, q["fitted_time_s"], q["se_s"], q["interpolated"]):
            if interp:
                continue
            if prev is not None and s and s > t - prev:
                out.append(f"stage {stage} chunk {chunk} {kind} at {f} MHz")
            prev = t
    return out


# ---------------------------------------------------------------- the same combination, in steps
# The hierarchical control plane (``perseus.runtime.plane.hierarchy``) combines where the data is: a
# replica's tensor-parallel ranks at its first one, then the replicas of a stage by a sum
# reduction over a fixed layout of floats, then one entry per stage on rank 0. ``aggregate_profile``
# of those entries is the profile of every rank's (up to float rounding in the means).

_FIELDS = 8  # present, time, energy, samples, spread, se², decision energy, power bound


def combine_tensor_parallel(members: Sequence[RankMeasurements]) -> RankMeasurements:
    """One replica of a stage from its tensor-parallel ranks: max time, summed energy (as
    ``aggregate_profile``), P_blocking the ranks' mean."""
    members = sorted(members, key=lambda r: r.tp_rank)
    first = members[0]
    measured = [m.p_blocking_w for m in members if m.p_blocking_w is not None]
    names = sorted({m.gpu_name for m in members})
    sustained, reasons = combine_clocks(members)
    return RankMeasurements(first.stage, 0, first.dp_rank, _combine([m.measurements for m in members], "max", "sum"),
                            fmean(measured) if measured else None, " / ".join(names), sustained_mhz=sustained,
                            reasons=reasons, kinds=combine_kinds([m.kinds for m in members], "max"))


def replica_vector(measurements: Measurements, keys: Sequence[tuple[int, str]], grid: Sequence[int]) -> list[float]:
    """A replica's measurements as floats at fixed places (``keys`` × ``grid``), to be summed
    over replicas; a clock it did not measure is absent (``present`` 0)."""
    out = [0.0] * (len(keys) * len(grid) * _FIELDS)
    for i, key in enumerate(keys):
        per_freq = measurements.get(key, {})
        for j, f in enumerate(grid):
            if f not in per_freq:
                continue
            p = as_point(per_freq[f])
            at = (i * len(grid) + j) * _FIELDS
            out[at:at + _FIELDS] = [1.0, p.time_s, p.energy_j, float(p.samples), p.spread_s, p.se_s ** 2,
                                    p.decision_energy_j, p.bound_w]
    return out


def replicas_mean(total: Sequence[float], replicas: int, keys: Sequence[tuple[int, str]],
                  grid: Sequence[int]) -> Measurements:
    """The mean replica from the sum of ``replicas`` replica vectors: only clocks every replica
    measured, means as ``aggregate_profile`` takes them (samples summed, standard errors combined)."""
    out: Measurements = {}
    for i, key in enumerate(keys):
        per_freq: dict[int, Any] = {}
        for j, f in enumerate(grid):
            at = (i * len(grid) + j) * _FIELDS
            present, t, e, samples, spread, se2, step, bound = total[at:at + _FIELDS]
            if round(present) != replicas:
                continue
            per_freq[f] = ClockPoint(t / replicas, e / replicas, int(round(samples)), spread / replicas,
                                     math.sqrt(se2) / replicas, step / replicas,
                                     bound / replicas)  # nonzero: held at a bound on some replica
        out[key] = per_freq
    return out
