"""From every rank's measurements to one pipeline ``Profile``.

A pipeline stage is ``tp_size`` GPUs working in lockstep, replicated ``dp_size`` times:

- tensor parallel (within one stage replica): the stage takes as long as its slowest GPU and uses
  the energy of all of them → **max time, summed energy** across the TP ranks;
- data parallel (replicas of the same stage): the same work on other GPUs → **average** time and
  energy across replicas, so the profile describes one typical pipeline.

P_blocking is per GPU; a stage blocks with all its TP GPUs, so the profile's P_blocking is the
mean per-GPU value × ``tp_size`` (consistent with the summed energies). Only clocks measured on
every rank are kept, so the profile is rectangular.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean
from typing import Any, Mapping

from perseus.errors import ProfileError
from perseus.profile import InstructionProfile, Profile

# (chunk, kind) -> freq_mhz -> (mean time s, mean energy J)
Measurements = dict[tuple[int, str], dict[int, tuple[float, float]]]


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
            times = [part[key][f][0] for part in parts]
            energies = [part[key][f][1] for part in parts]
            t = max(times) if time_rule == "max" else fmean(times)
            e = sum(energies) if energy_rule == "sum" else fmean(energies)
            per_freq[f] = (t, e)
        out[key] = per_freq
    return out


def aggregate_profile(
    ranks: list[RankMeasurements],
    num_stages: int,
    tp_size: int = 1,
    config: Mapping[str, Any] | None = None,
    p_blocking_override_w: float | None = None,
) -> Profile:
    """Combine all ranks' sweeps into the pipeline profile (TP: max/sum, DP: mean)."""
    by_replica: dict[tuple[int, int], list[RankMeasurements]] = {}
    for r in ranks:
        by_replica.setdefault((r.stage, r.dp_rank), []).append(r)
    per_stage: dict[int, list[Measurements]] = {}
    for (stage, _), members in sorted(by_replica.items()):
        members.sort(key=lambda r: r.tp_rank)
        per_stage.setdefault(stage, []).append(_combine([m.measurements for m in members], "max", "sum"))
    missing = [s for s in range(num_stages) if s not in per_stage]
    if missing:
        raise ProfileError(f"online profile: no measurements from stage(s) {missing}; did every rank profile?")
    entries: dict[tuple[int, int, str], InstructionProfile] = {}
    for stage, replicas in per_stage.items():
        combined = _combine(replicas, "mean", "mean")
        for (chunk, kind), per_freq in combined.items():
            if not per_freq:
                raise ProfileError(f"online profile: stage {stage} {kind} chunk {chunk} has no clock measured on every rank")
            freqs = sorted(per_freq, reverse=True)
            entries[(stage, chunk, kind)] = InstructionProfile(
                tuple(freqs), tuple(per_freq[f][0] for f in freqs), tuple(per_freq[f][1] for f in freqs)
            )
    if p_blocking_override_w is not None:
        p_blocking: float | None = p_blocking_override_w * tp_size
    else:
        measured = [r.p_blocking_w for r in ranks if r.p_blocking_w is not None]
        p_blocking = fmean(measured) * tp_size if measured else None
    gpu_names = sorted({r.gpu_name for r in ranks})
    return Profile(entries, p_blocking, " / ".join(gpu_names), dict(config or {}), "online profile")
