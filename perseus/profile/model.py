"""Measured per-instruction time and energy at each GPU SM frequency.

A ``Profile`` maps (stage, chunk, kind) to the measured time (s) and energy (J) of one
instruction at each frequency (MHz), plus P_blocking (W), the power a GPU draws while blocked on
pipeline communication. It reads the CSV that the Perseus/Zeus tools write
(``stage,instruction,frequency,time,energy`` and an optional ``chunk`` column) and the project's
own versioned JSON. Validation errors name the file, the row and the problem.

An online profile also says how far each point can be trusted (``Profile.quality``: per key,
lists aligned with ``freqs_mhz``): the raw measured time, samples kept, their spread and standard
error, the isotonic fit and each point's disagreement with it, and whether the clock was
interpolated rather than measured. Its times are the pessimistic fitted times the planner
should use (``perseus.profile.fit``). JSON version 2 carries it; version 1 files (no quality)
still load, and a profile without quality is still written as version 1.

An online profile also keeps, per (stage, clock), what the card reported there
(``Profile.clock_notes``, a ``ClockNote``): the clock-event reasons seen while it ran (NVML's
names, e.g. ``sw_power_cap``), and for clocks above the stage's sustained clock (the clock the
unlocked card ran at under this load: locking higher changes nothing) that the point was not
profiled but recorded equal to the sustained clock's measurement (``equal_to_mhz``), plus each
stage's sustained clock (``Profile.sustained_mhz``). Both are optional: JSON's top-level
``clock_notes`` and ``sustained_mhz``, CSV's ``reasons`` (``;``-separated) and ``equal_to_mhz``
columns; files without them load as before.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from perseus.store.atomic import write_atomic
from perseus.errors import ProfileError
from perseus.schedules import FUSED, KINDS, SPLIT_BACKWARD, InstructionKind, Schedule

PROFILE_FORMAT = "perseus-profile"
PROFILE_VERSION = 2
PROFILE_VERSIONS = (1, 2)  # readable; 2 adds "quality" per measurement
QUALITY_FIELDS = ("raw_time_s", "fitted_time_s", "fit_residual_s", "samples", "spread_s", "se_s", "interpolated")
CSV_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
CSV_NOTE_COLUMNS = ("reasons", "equal_to_mhz")  # optional

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
class InstructionProfile:
    """Time and energy of one (stage, chunk, kind) at each frequency, fastest clock first."""

    freqs_mhz: tuple[int, ...]
    times_s: tuple[float, ...]
    energies_j: tuple[float, ...]

    def __post_init__(self) -> None:
        order = sorted(range(len(self.freqs_mhz)), key=lambda i: -self.freqs_mhz[i])
        object.__setattr__(self, "freqs_mhz", tuple(int(self.freqs_mhz[i]) for i in order))
        object.__setattr__(self, "times_s", tuple(float(self.times_s[i]) for i in order))
        object.__setattr__(self, "energies_j", tuple(float(self.energies_j[i]) for i in order))

    def at(self, freq_mhz: int) -> tuple[float, float]:
        """(time, energy) at a measured frequency."""
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
        _check_positive(p_blocking_w, "P_blocking", self.source)
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

    # ---------------------------------------------------------------- serialization

    def to_json_dict(self) -> dict[str, Any]:
        measurements = []
        for key, p in sorted(self.entries.items()):
            stage, chunk, kind = key
            item: dict[str, Any] = {"stage": stage, "chunk": chunk, "kind": kind, "freq_mhz": list(p.freqs_mhz),
                                    "time_s": list(p.times_s), "energy_j": list(p.energies_j)}
            if key in self.quality:
                item["quality"] = {name: list(values) for name, values in self.quality[key].items()}
            measurements.append(item)
        out: dict[str, Any] = {
            "format": PROFILE_FORMAT,
            "version": PROFILE_VERSION if self.quality else 1,
            "gpu_name": self.gpu_name,
            "p_blocking_w": self.p_blocking_w,
            "config": dict(self.config),
            "measurements": measurements,
        }
        if self.clock_notes:
            out["clock_notes"] = [{"stage": stage, "freq_mhz": f, "reasons": sorted(note.reasons),
                                   "equal_to_mhz": note.equal_to_mhz}
                                  for (stage, f), note in sorted(self.clock_notes.items())]
        if self.sustained_mhz:
            out["sustained_mhz"] = {str(stage): f for stage, f in sorted(self.sustained_mhz.items())}
        return out

    def save_json(self, path: str | Path) -> None:
        """Write atomically, so an interrupted save never leaves a truncated profile."""
        write_atomic(path, json.dumps(self.to_json_dict(), indent=1))

    def to_csv_rows(self) -> list[dict[str, Any]]:
        """One row per (stage, chunk, kind, clock); with clock notes, their two optional columns."""
        rows = []
        for (stage, chunk, kind), p in sorted(self.entries.items()):
            for f, t, e in zip(p.freqs_mhz, p.times_s, p.energies_j):
                row: dict[str, Any] = dict(stage=stage, chunk=chunk, instruction=kind, frequency=f, time=t, energy=e)
                if self.clock_notes:
                    note = self.clock_notes.get((stage, f), ClockNote())
                    row["reasons"] = ";".join(sorted(note.reasons))
                    row["equal_to_mhz"] = "" if note.equal_to_mhz is None else note.equal_to_mhz
                rows.append(row)
        return rows

    def save_csv(self, path: str | Path) -> None:
        """The Zeus-format CSV (plus ``chunk`` and, with clock notes, ``reasons``/``equal_to_mhz``)."""
        import io

        rows = self.to_csv_rows()
        columns = [*CSV_COLUMNS, "chunk", *(CSV_NOTE_COLUMNS if self.clock_notes else ())]
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        write_atomic(path, buffer.getvalue())


def _check_positive(value: float, what: str, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ProfileError(f"{where}: {what} must be a positive finite number, got {value!r}")
    return float(value)


def _parse_number(text: str, what: str, where: str, integer: bool = False) -> float:
    try:
        value = int(text) if integer else float(text)
    except (TypeError, ValueError):
        kind = "an integer" if integer else "a number"
        raise ProfileError(f"{where}: {what} must be {kind}, got {text!r}") from None
    return value


def _assemble(
    rows: Iterable[tuple[int, int, str, int, float, float, str]], source: str
) -> dict[ProfileKey, InstructionProfile]:
    """Group validated rows ``(stage, chunk, kind, freq, time, energy, where)`` into entries."""
    grouped: dict[ProfileKey, dict[int, tuple[float, float]]] = {}
    for stage, chunk, kind, freq, time_s, energy_j, where in rows:
        if stage < 0 or chunk < 0:
            raise ProfileError(f"{where}: stage and chunk must be >= 0")
        if kind not in KINDS:
            raise ProfileError(
                f"{where}: instruction must be 'forward' or 'backward' (or zero-bubble's 'backward_input' / "
                f"'backward_weight', or an overlapped schedule's fused '{FUSED}'), got {kind!r}"
            )
        _check_positive(freq, "frequency", where)
        _check_positive(time_s, "time", where)
        _check_positive(energy_j, "energy", where)
        per_freq = grouped.setdefault((stage, chunk, kind), {})
        if freq in per_freq:
            raise ProfileError(f"{where}: duplicate row for stage {stage} chunk {chunk} {kind} at {freq} MHz")
        per_freq[freq] = (time_s, energy_j)
    if not grouped:
        raise ProfileError(f"{source}: profile has no measurements")
    stages = sorted({s for s, _, _ in grouped})
    chunks = sorted({c for _, c, _ in grouped})
    for stage in range(stages[-1] + 1):
        for chunk in chunks:
            for kind in required_kinds({k for _, _, k in grouped}):
                if (stage, chunk, kind) not in grouped:
                    raise ProfileError(f"{source}: no {kind} measurements for stage {stage} chunk {chunk}")
    return {
        key: InstructionProfile(
            tuple(per_freq), tuple(t for t, _ in per_freq.values()), tuple(e for _, e in per_freq.values())
        )
        for key, per_freq in grouped.items()
    }


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


def load_csv(path: str | Path, p_blocking_w: float | None = None, gpu_name: str = "unknown") -> Profile:
    """Read a Zeus/Perseus stage profile CSV (``stage,instruction,frequency,time,energy[,chunk]``)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read profile ({exc.strerror or exc})") from None
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in CSV_COLUMNS if c not in header]
    if missing:
        raise ProfileError(
            f"{path}: CSV header lacks column(s) {', '.join(missing)}; expected {','.join(CSV_COLUMNS)}"
        )
    has_chunk = "chunk" in header
    has_notes = any(c in header for c in CSV_NOTE_COLUMNS)
    notes: dict[StageClock, ClockNote] = {}

    def rows() -> Iterable[tuple[int, int, str, int, float, float, str]]:
        for line, raw in enumerate(reader, start=2):
            row = {k.strip(): (v or "").strip() for k, v in raw.items() if k is not None}
            where = f"{path}:{line}"
            if has_notes:
                _note_from_csv(row, where, notes)
            yield (
                int(_parse_number(row["stage"], "stage", where, integer=True)),
                int(_parse_number(row["chunk"], "chunk", where, integer=True)) if has_chunk else 0,
                row["instruction"],
                int(_parse_number(row["frequency"], "frequency", where, integer=True)),
                _parse_number(row["time"], "time", where),
                _parse_number(row["energy"], "energy", where),
                where,
            )

    entries = _assemble(rows(), str(path))
    profile = Profile(entries, None, gpu_name, {}, str(path), clock_notes=notes, sustained_mhz=_sustained_of(notes))
    return profile.with_p_blocking(p_blocking_w)


def _note_from_csv(row: Mapping[str, str], where: str, notes: dict[StageClock, ClockNote]) -> None:
    """A row's optional clock-note columns into ``notes`` (rows of one (stage, clock) must agree)."""
    stage = int(_parse_number(row["stage"], "stage", where, integer=True))
    freq = int(_parse_number(row["frequency"], "frequency", where, integer=True))
    reasons = frozenset(r for r in (row.get("reasons") or "").split(";") if r)
    equal = row.get("equal_to_mhz") or ""
    note = ClockNote(_check_reasons(reasons, where),
                     int(_parse_number(equal, "equal_to_mhz", where, integer=True)) if equal else None)
    if notes.setdefault((stage, freq), note) != note:
        raise ProfileError(f"{where}: reasons/equal_to_mhz differ from another row of stage {stage} at {freq} MHz")


def _check_reasons(reasons: Iterable[Any], where: str) -> frozenset[str]:
    out = frozenset(reasons)
    bad = [r for r in out if not (isinstance(r, str) and r and r.replace("_", "").isalnum())]
    if bad:
        raise ProfileError(f"{where}: clock-event reasons must be NVML reason names like 'sw_power_cap', got {bad[0]!r}")
    return out


def _sustained_of(notes: Mapping[StageClock, ClockNote]) -> dict[int, int]:
    """Each stage's sustained clock where its notes show one (a point recorded equal to it)."""
    return {stage: note.equal_to_mhz for (stage, _), note in sorted(notes.items()) if note.equal_to_mhz is not None}


def profile_from_json_dict(data: Any, source: str = "<json>") -> Profile:
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise ProfileError(f"{source}: not a perseus profile (missing \"format\": \"{PROFILE_FORMAT}\")")
    if data.get("version") not in PROFILE_VERSIONS:
        raise ProfileError(
            f"{source}: profile version {data.get('version')!r} is not supported (expected one of "
            f"{', '.join(map(str, PROFILE_VERSIONS))}); upgrade perseus or profile again"
        )
    measurements = data.get("measurements")
    if not isinstance(measurements, list):
        raise ProfileError(f"{source}: \"measurements\" must be a list")

    def rows() -> Iterable[tuple[int, int, str, int, float, float, str]]:
        for n, item in enumerate(measurements):
            where = f"{source}: measurements[{n}]"
            if not isinstance(item, dict):
                raise ProfileError(f"{where}: must be an object")
            try:
                stage, chunk, kind = int(item["stage"]), int(item.get("chunk", 0)), str(item["kind"])
                freqs, times, energies = item["freq_mhz"], item["time_s"], item["energy_j"]
            except (KeyError, TypeError, ValueError) as exc:
                raise ProfileError(f"{where}: missing or invalid field ({exc})") from None
            if not (isinstance(freqs, list) and isinstance(times, list) and isinstance(energies, list)):
                raise ProfileError(f"{where}: freq_mhz, time_s, energy_j must be lists")
            if not (len(freqs) == len(times) == len(energies)) or not freqs:
                raise ProfileError(f"{where}: freq_mhz, time_s, energy_j must be non-empty and equally long")
            for f, t, e in zip(freqs, times, energies):
                yield stage, chunk, kind, f, t, e, f"{where} at {f} MHz"

    entries = _assemble(rows(), source)
    quality = _quality(measurements, source)
    p_blocking = data.get("p_blocking_w")
    if p_blocking is not None:
        _check_positive(p_blocking, "p_blocking_w", source)
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise ProfileError(f"{source}: \"config\" must be an object")
    notes, sustained = _clock_notes(data, source)
    return Profile(entries, p_blocking, str(data.get("gpu_name", "unknown")), config, source, quality, notes, sustained)


def _clock_notes(data: Mapping[str, Any], source: str) -> tuple[dict[StageClock, ClockNote], dict[int, int]]:
    """The optional ``clock_notes`` list and ``sustained_mhz`` map (absent in older profiles)."""
    notes: dict[StageClock, ClockNote] = {}
    for n, item in enumerate(data.get("clock_notes") or []):
        where = f"{source}: clock_notes[{n}]"
        try:
            stage, freq = int(item["stage"]), int(item["freq_mhz"])
            equal = item.get("equal_to_mhz")
            reasons = item.get("reasons") or []
            if not isinstance(reasons, list):
                raise ProfileError(f"{where}: reasons must be a list of NVML reason names")
            notes[(stage, freq)] = ClockNote(_check_reasons(reasons, where), None if equal is None else int(equal))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"{where}: missing or invalid field ({exc})") from None
    raw = data.get("sustained_mhz") or {}
    if not isinstance(raw, dict):
        raise ProfileError(f"{source}: \"sustained_mhz\" must map stages to clocks")
    try:
        sustained = {int(stage): int(f) for stage, f in raw.items()}
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"{source}: sustained_mhz: invalid stage or clock ({exc})") from None
    return notes, sustained


def _quality(measurements: list[Any], source: str) -> dict[ProfileKey, dict[str, list[Any]]]:
    """Version 2's per-point quality lists, each as long as its entry's clocks."""
    out: dict[ProfileKey, dict[str, list[Any]]] = {}
    for n, item in enumerate(measurements):
        q = item.get("quality")
        if q is None:
            continue
        where = f"{source}: measurements[{n}].quality"
        if not isinstance(q, dict) or not all(isinstance(v, list) and len(v) == len(item["freq_mhz"]) for v in q.values()):
            raise ProfileError(f"{where}: must map names to lists as long as freq_mhz")
        order = sorted(range(len(item["freq_mhz"])), key=lambda i: -int(item["freq_mhz"][i]))
        key = (int(item["stage"]), int(item.get("chunk", 0)), str(item["kind"]))
        out[key] = {str(name): [values[i] for i in order] for name, values in q.items()}
    return out


def load_json(path: str | Path) -> Profile:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read profile ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    return profile_from_json_dict(data, str(path))


def load_profile(path: str | Path, p_blocking_w: float | None = None) -> Profile:
    """Load a ``.csv`` (Zeus format) or ``.json`` (perseus format) profile, by suffix.

    ``p_blocking_w``, when given, overrides the value stored in the file.
    """
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return load_csv(path, p_blocking_w)
    if path.suffix.lower() == ".json":
        return load_json(path).with_p_blocking(p_blocking_w)
    raise ProfileError(f"{path}: unknown profile type; expected a .csv or .json file")


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


def split_into_chunks(profile: Profile, num_chunks: int) -> Profile:
    """Each stage's layers divided evenly over ``num_chunks`` chunks: every chunk-0 measurement's
    time and energy divided by ``num_chunks`` (an assumption, for comparing schedules on one
    profile; measured chunk profiles are better)."""
    if num_chunks < 1:
        raise ProfileError(f"number of chunks must be positive, got {num_chunks}")
    entries = {
        (stage, chunk, kind): InstructionProfile(p.freqs_mhz, tuple(t / num_chunks for t in p.times_s),
                                                 tuple(e / num_chunks for e in p.energies_j))
        for (stage, c0, kind), p in profile.entries.items() if c0 == 0
        for chunk in range(num_chunks)
    }
    return replace(profile, entries=entries, source=f"{profile.source} (split into {num_chunks} chunks)", quality={})


def split_backward(profile: Profile, input_share: float = 0.5) -> Profile:
    """Zero-bubble's I and W derived from each full backward B: I gets ``input_share`` of B's time
    and energy at every clock, W the rest (an assumption: the split is not measured). Profiles
    that already have I/W are returned unchanged."""
    if not 0.0 < input_share < 1.0:
        raise ProfileError(f"the input-gradient share of a backward must be between 0 and 1, got {input_share}")
    if any(kind in SPLIT_BACKWARD for _, _, kind in profile.entries):
        return profile
    entries = dict(profile.entries)
    for (stage, chunk, kind), p in profile.entries.items():
        if kind == "backward":
            for split, share in (("backward_input", input_share), ("backward_weight", 1.0 - input_share)):
                entries[(stage, chunk, split)] = InstructionProfile(
                    p.freqs_mhz, tuple(t * share for t in p.times_s), tuple(e * share for e in p.energies_j))
    return replace(profile, entries=entries, source=f"{profile.source} (I/W = {input_share:g}/{1 - input_share:g} of B)",
                   quality={})


def fuse_forward_backward(profile: Profile, schedule: Schedule) -> Profile:
    """The fused forward+backward units of ``schedule`` derived from ``profile``'s parts: at every
    clock, a unit keyed (stage, forward's chunk) costs its forward plus the mean, over the units of
    that key in the schedule, of their backward (time and energy).

    Why a sum: torch 2.13's ``ScheduleDualPipeV`` runs an ``OVERLAP_F_B`` action's forward and
    backward one after the other, so the unit is their sum as executed. megatron-core's combined
    1F1B on GPUs hides the expert all-to-all of one part behind the other's compute, so there the
    sum is an upper bound: measure the units (online profiling does) for a real job. Profiles
    that measure fused units already, and schedules without them, are returned unchanged.
    """
    if any(kind == FUSED for _, _, kind in profile.entries):
        return profile
    partners: dict[tuple[int, int], list[int]] = {}
    for stage, order in enumerate(schedule.stages):
        for inst in order:
            if inst.kind == FUSED:
                partners.setdefault((stage, inst.chunk), []).append(inst.backward_chunk or 0)
    if not partners:
        return profile
    entries = dict(profile.entries)
    for (stage, chunk), backward_chunks in sorted(partners.items()):
        forward = profile.get(stage, "forward", chunk)
        backwards = [profile.get(stage, "backward", c) for c in backward_chunks]
        if any(b.freqs_mhz != forward.freqs_mhz for b in backwards):
            raise ProfileError(f"{profile.source}: stage {stage} forward and backward were measured at different "
                               "clocks; cannot derive its fused forward+backward units from them")
        n = len(backwards)
        entries[(stage, chunk, FUSED)] = InstructionProfile(
            forward.freqs_mhz,
            tuple(t + sum(b.times_s[i] for b in backwards) / n for i, t in enumerate(forward.times_s)),
            tuple(e + sum(b.energies_j[i] for b in backwards) / n for i, e in enumerate(forward.energies_j)))
    return replace(profile, entries=entries, source=f"{profile.source} (fused F+B = F + B)", quality={})
