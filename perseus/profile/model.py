"""Measured per-instruction time and energy at each GPU SM frequency: the profile's data model.

A ``Profile`` maps (stage, chunk, kind) to the measured time (s) and energy (J) of one
instruction at each frequency (MHz), plus P_blocking (W), the power a GPU draws while blocked on
pipeline communication. Its files are read by ``perseus.profile.decode`` and written by
``perseus.profile.encode``; profiles derived from a measured one are ``perseus.profile.transforms``.

An online profile also says how far each point can be trusted (``Profile.quality``: per key,
lists aligned with ``freqs_mhz``, named by ``QUALITY_FIELDS``): the raw measured time, samples
kept, their spread and standard error, the isotonic fit and each point's disagreement with it, and
whether the clock was interpolated rather than measured. Its times are the pessimistic fitted
times the planner should use (``perseus.profile.fit``).

An online profile also keeps, per (stage, clock), what the card reported there
(``Profile.clock_notes``, a ``ClockNote``): the clock-event reasons seen while it ran (NVML's
names, e.g. ``sw_power_cap``), and for clocks above the stage's sustained clock (the clock the
unlocked card ran at under this load: locking higher changes nothing) that the point was not
profiled but recorded equal to the sustained clock's measurement (``equal_to_mhz``), plus each
stage's sustained clock (``Profile.sustained_mhz``). Both are optional. Each instruction kind
may also carry what the unlocked card did under it (``InstructionProfile.unlocked``, an
``Unlocked``: its own sustained clock, its time and energy at default clocks), which a plan
chooses with the clock ``UNLOCKED_MHZ`` (``perseus.profile.unlocked``).

An online profile also says how long a clock change took to land on the card
(``Profile.switch_latency``, a ``SwitchLatency``: the median request-to-applied time over the
sweep's clock changes and how many there were), so a run that reuses the profile hides the same
latency (the planner's ``switch_latency_s``, the runtime's request lead). Optional: a profile
from a backend that does not report its applied clock, or an older one, has none.

An online profile also keeps each stage's work between steps (``Profile.between_steps``: the
optimizer and the gradient all-reduce after a step's last instruction, 30-40 ms at high power on an
H200) as its own time and energy per clock, not billed at P_blocking nor to the instructions; and
notes on how it was measured (``Profile.notes``, e.g. ``p_blocking_source``: the pipeline's own
waits, or a gloo receive on an idle GPU where no wait was long enough). Both optional.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from perseus.errors import ProfileError
from perseus.profile.encode import encode_profile_json, profile_csv_rows, save_profile_csv, save_profile_json
from perseus.schedules import FUSED, KINDS, SPLIT_BACKWARD, InstructionKind, Schedule
from perseus.profile.unlocked import UNLOCKED_MHZ, Unlocked

QUALITY_FIELDS = ("raw_time_s", "fitted_time_s", "fit_residual_s", "samples", "spread_s", "se_s", "interpolated")

ProfileKey = tuple[int, int, str]  # (stage, chunk, kind)
StageClock = tuple[int, int]  # (stage, freq_mhz)


@dataclass(frozen=True)
class ClockNote:
    """What the card reported at one (stage, clock) point. ``reasons``: the clock-event reasons
    seen while it ran there (``perseus.gpu.device.ClockEventReason`` values; strings here, as this
    layer sits below the GPU layer). ``equal_to_mhz``: the point was not profiled, it is recorded
    equal to the measurement at this clock (the stage's sustained clock); None when measured."""

    reasons: frozenset[str] = frozenset()
    equal_to_mhz: int | None = None

    @property
    def measured(self) -> bool:
        return self.equal_to_mhz is None


@dataclass(frozen=True)
class SwitchLatency:
    """How long after a clock request the card ran at the new clock (s), over ``samples`` switches."""

    seconds: float
    samples: int

    def __post_init__(self) -> None:
        seconds, samples = self.seconds, self.samples
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 <= seconds < math.inf:
            raise ProfileError(f"switch latency must be a finite number of seconds >= 0, got {seconds!r}")
        if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
            raise ProfileError(f"switch latency samples must be an integer >= 1, got {samples!r}")
        object.__setattr__(self, "seconds", float(seconds))


@dataclass(frozen=True)
class InstructionProfile:
    """Time and energy of one (stage, chunk, kind) at each frequency, fastest clock first, and
    on the unlocked card (``unlocked``; None: not measured)."""

    freqs_mhz: tuple[int, ...]
    times_s: tuple[float, ...]
    energies_j: tuple[float, ...]
    unlocked: Unlocked | None = None

    def __post_init__(self) -> None:
        order = sorted(range(len(self.freqs_mhz)), key=lambda i: -self.freqs_mhz[i])
        object.__setattr__(self, "freqs_mhz", tuple(int(self.freqs_mhz[i]) for i in order))
        object.__setattr__(self, "times_s", tuple(float(self.times_s[i]) for i in order))
        object.__setattr__(self, "energies_j", tuple(float(self.energies_j[i]) for i in order))

    def at(self, freq_mhz: int) -> tuple[float, float]:
        """(time, energy) at a measured frequency, or on the unlocked card (``UNLOCKED_MHZ``): its
        measurement, else (a profile that never measured it, e.g. a model's) the highest clock's."""
        if freq_mhz == UNLOCKED_MHZ:
            if self.unlocked is not None:
                return self.unlocked.time_s, self.unlocked.energy_j
            return self.times_s[0], self.energies_j[0]
        try:
            i = self.freqs_mhz.index(int(freq_mhz))
        except ValueError:
            raise ProfileError(f"frequency {freq_mhz} MHz was not measured") from None
        return self.times_s[i], self.energies_j[i]


@dataclass(frozen=True)
class Profile:
    """Measured instruction profiles of a pipeline, plus P_blocking and provenance."""

    entries: Mapping[ProfileKey, InstructionProfile]
    p_blocking_w: float | None = None
    gpu_name: str = "unknown"
    config: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<memory>"
    # (stage, chunk, kind) -> QUALITY_FIELDS name -> list aligned with that entry's freqs_mhz
    quality: Mapping[ProfileKey, Mapping[str, list[Any]]] = field(default_factory=dict)
    # (stage, clock) -> what the card reported there; stage -> the clock it sustained under load
    clock_notes: Mapping[StageClock, ClockNote] = field(default_factory=dict)
    sustained_mhz: Mapping[int, int] = field(default_factory=dict)
    switch_latency: SwitchLatency | None = None  # measured while profiling; None: unknown
    # stage -> its work between steps at each profiled clock; how the profile was measured (name -> words)
    between_steps: Mapping[int, InstructionProfile] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)

    @property
    def num_stages(self) -> int:
        return 1 + max(stage for stage, _, _ in self.entries)

    @property
    def num_chunks(self) -> int:
        return 1 + max(chunk for _, chunk, _ in self.entries)

    def get(self, stage: int, kind: str, chunk: int = 0) -> InstructionProfile:
        try:
            return self.entries[(stage, chunk, kind)]
        except KeyError:
            raise ProfileError(
                f"{self.source}: no {kind} measurements for stage {stage}, chunk {chunk}"
            ) from None

    def with_p_blocking(self, p_blocking_w: float | None) -> Profile:
        """Copy with P_blocking replaced (when given); validates the value."""
        if p_blocking_w is None:
            return self
        check_positive(p_blocking_w, "P_blocking", self.source)
        return replace(self, p_blocking_w=float(p_blocking_w))

    def require_p_blocking(self) -> float:
        if self.p_blocking_w is None:
            raise ProfileError(
                f"{self.source}: P_blocking is unknown; pass --p-blocking W "
                "(the power a GPU draws while blocked on P2P, e.g. 83.64 for A100)"
            )
        return self.p_blocking_w

    def check_matches(self, schedule: Schedule) -> None:
        """Raise ``ProfileError`` unless every instruction of the schedule has measurements."""
        if self.num_stages != schedule.num_stages:
            raise ProfileError(
                f"{self.source}: profile has {self.num_stages} stages but the pipeline has "
                f"{schedule.num_stages} (--stages); profile the job you plan for"
            )
        missing = sorted(
            {(s, inst.chunk, inst.kind) for s, stage in enumerate(schedule.stages) for inst in stage}
            - set(self.entries)
        )
        if missing:
            shown = ", ".join(f"stage {s} chunk {c} {k}" for s, c, k in missing[:4])
            more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
            raise ProfileError(f"{self.source}: missing measurements for {shown}{more}")

    # ---------------------------------------------------------------- files (perseus.profile.encode)

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON document (``encode_profile_json``)."""
        return encode_profile_json(self)

    def save_json(self, path: str | Path) -> None:
        """Write the JSON atomically (``save_profile_json``)."""
        save_profile_json(self, path)

    def to_csv_rows(self) -> list[dict[str, Any]]:
        """The CSV rows (``profile_csv_rows``)."""
        return profile_csv_rows(self)

    def save_csv(self, path: str | Path) -> None:
        """Write the Zeus-format CSV atomically (``save_profile_csv``)."""
        save_profile_csv(self, path)


def check_positive(value: float, what: str, where: str) -> float:
    """``value`` as a float; ``ProfileError`` naming ``what`` and ``where`` unless positive and finite."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ProfileError(f"{where}: {what} must be a positive finite number, got {value!r}")
    return float(value)


def required_kinds(present: set[str]) -> tuple[str, ...]:
    """Kinds every (stage, chunk) of a profile must have: forward and backward, or forward and
    zero-bubble's I and W when the profile has split backwards (plus any full backward it has).
    A profile of an overlapped schedule (it has fused units) needs only forward everywhere: which
    of B, I, W and fused units a (stage, chunk) runs differs along DualPipeV's V and megatron's
    warm-up (a stage whose microbatches all run in warm-up has no fused unit), so
    ``check_matches`` asks for exactly the ones a schedule runs."""
    if FUSED in present:
        return ("forward",)
    if present & set(SPLIT_BACKWARD):
        return tuple(k for k in KINDS if k in present or k == "forward" or k in SPLIT_BACKWARD)
    return ("forward", "backward")


def uniform_profile(
    schedule_stages: int,
    by_kind: Mapping[InstructionKind, InstructionProfile],
    p_blocking_w: float,
    num_chunks: int = 1,
) -> Profile:
    """Same measurements on every stage and chunk: handy for examples and tests."""
    entries: dict[ProfileKey, InstructionProfile] = {
        (s, c, k): by_kind[k] for s in range(schedule_stages) for c in range(num_chunks) for k in KINDS if k in by_kind
    }
    return Profile(entries, p_blocking_w, "synthetic")
