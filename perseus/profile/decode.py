"""Reading a profile: the Zeus/Perseus CSV and the project's versioned JSON, validated.

The CSV is what the Perseus/Zeus tools write (``stage,instruction,frequency,time,energy`` and an
optional ``chunk`` column, plus the optional clock-note columns ``reasons`` and ``equal_to_mhz``);
the JSON is versions 1 and 2 of ``perseus.profile.encode``'s document (version 1 has no quality;
files without clock notes, a switch latency, unlocked points, work between steps or notes load
with none). Every error names the file, the row and the problem.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from dataclasses import replace
from typing import Any, Iterable, Mapping

from perseus.errors import ProfileError
from perseus.profile.encode import CSV_COLUMNS, CSV_NOTE_COLUMNS, PROFILE_FORMAT, PROFILE_VERSIONS
from perseus.profile.model import (ClockNote, InstructionProfile, Profile, ProfileKey, StageClock, SwitchLatency,
                                   check_positive, required_kinds)
from perseus.profile.unlocked import Unlocked
from perseus.schedules import FUSED, KINDS


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
        check_positive(freq, "frequency", where)
        check_positive(time_s, "time", where)
        check_positive(energy_j, "energy", where)
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
    """A profile from its parsed JSON document (version 1 or 2); ``source`` names it in errors."""
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

    entries = _with_unlocked(_assemble(rows(), source), data.get("unlocked"), source)
    quality = _quality(measurements, source)
    p_blocking = data.get("p_blocking_w")
    if p_blocking is not None:
        check_positive(p_blocking, "p_blocking_w", source)
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise ProfileError(f"{source}: \"config\" must be an object")
    notes, sustained = _clock_notes(data, source)
    return Profile(entries, p_blocking, str(data.get("gpu_name", "unknown")), config, source, quality, notes, sustained,
                   _switch_latency(data.get("switch_latency"), source),
                   _between_steps(data.get("between_steps"), source), _notes(data.get("notes"), source))


def _between_steps(raw: Any, source: str) -> dict[int, InstructionProfile]:
    """The optional ``between_steps`` list, one stage's work between steps per item (absent in older profiles)."""
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise ProfileError(f"{source}: \"between_steps\" must be a list")
    out: dict[int, InstructionProfile] = {}
    for n, item in enumerate(raw):
        where = f"{source}: between_steps[{n}]"
        try:
            stage, freqs, times, energies = int(item["stage"]), item["freq_mhz"], item["time_s"], item["energy_j"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"{where}: missing or invalid field ({exc})") from None
        if not (isinstance(freqs, list) and isinstance(times, list) and isinstance(energies, list)) or not freqs \
                or not len(freqs) == len(times) == len(energies):
            raise ProfileError(f"{where}: freq_mhz, time_s, energy_j must be non-empty lists, equally long")
        if stage < 0 or stage in out:
            raise ProfileError(f"{where}: stage must be >= 0 and appear once, got {stage}")
        for f, t, e in zip(freqs, times, energies):
            for value, what in ((f, "frequency"), (t, "time"), (e, "energy")):
                check_positive(value, what, f"{where} at {f} MHz")
        out[stage] = InstructionProfile(tuple(int(f) for f in freqs), tuple(times), tuple(energies))
    return out


def _notes(raw: Any, source: str) -> dict[str, str]:
    """The optional ``notes`` object: how the profile was measured, names to words."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise ProfileError(f"{source}: \"notes\" must map names to text")
    return dict(raw)


def _with_unlocked(entries: dict[ProfileKey, InstructionProfile], raw: Any,
                   source: str) -> dict[ProfileKey, InstructionProfile]:
    """``entries`` with the optional top-level ``unlocked`` points (absent in older profiles)."""
    if raw is None:
        return entries
    if not isinstance(raw, list):
        raise ProfileError(f"{source}: \"unlocked\" must be a list")
    out = dict(entries)
    for n, item in enumerate(raw):
        where = f"{source}: unlocked[{n}]"
        try:
            key = (int(item["stage"]), int(item.get("chunk", 0)), str(item["kind"]))
            sustained = item.get("sustained_mhz")
            point = Unlocked(item["time_s"], item["energy_j"], None if sustained is None else int(sustained))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProfileError(f"{where}: missing or invalid field ({exc})") from None
        except ProfileError as exc:
            raise ProfileError(f"{where}: {exc}") from None
        if key not in out:
            raise ProfileError(f"{where}: stage {key[0]} chunk {key[1]} {key[2]} has no measurements")
        out[key] = replace(out[key], unlocked=point)
    return out


def _switch_latency(raw: Any, source: str) -> SwitchLatency | None:
    """The optional measured ``switch_latency`` (absent in older profiles)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or "seconds" not in raw or "samples" not in raw:
        raise ProfileError(f"{source}: \"switch_latency\" must be an object with seconds and samples")
    try:
        return SwitchLatency(raw["seconds"], raw["samples"])
    except ProfileError as exc:
        raise ProfileError(f"{source}: {exc}") from None


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
    """Read a perseus JSON profile (version 1 or 2)."""
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
