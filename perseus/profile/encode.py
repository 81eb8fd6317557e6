"""Writing a profile: its versioned JSON document and its Zeus-format CSV, saved atomically.

Also the names that identify the file format (``PROFILE_FORMAT``, the versions, the CSV columns),
which ``perseus.profile.decode`` reads back. JSON version 2 adds ``quality`` per measurement; a
profile without quality is still written as version 1 so older readers take it. Clock notes go to
JSON's top-level ``clock_notes`` and ``sustained_mhz``, and to CSV's optional ``reasons``
(``;``-separated) and ``equal_to_mhz`` columns. The measured switch latency goes to JSON's optional
top-level ``switch_latency`` (``{"seconds": s, "samples": n}``) in either version: readers before
it skip unknown top-level fields, so the version stays; the CSV has no place for it. What the
unlocked card did under each kind goes to JSON's optional top-level ``unlocked`` (one object per
(stage, chunk, kind): ``time_s``, ``energy_j``, ``sustained_mhz``) the same way; not to the CSV.
So do each stage's work between steps (optional top-level ``between_steps``: one object per stage,
``freq_mhz``, ``time_s``, ``energy_j`` as a measurement's) and how the profile was measured
(optional top-level ``notes``, names to words).

Why this module never imports the model: ``Profile``'s save methods call it, so it reads a
profile through the structural types below instead.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Mapping, Protocol

from perseus.atomic import write_atomic

PROFILE_FORMAT = "perseus-profile"
PROFILE_VERSION = 2
PROFILE_VERSIONS = (1, 2)  # readable; 2 adds "quality" per measurement
CSV_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
CSV_NOTE_COLUMNS = ("reasons", "equal_to_mhz")  # optional


class UnlockedData(Protocol):
    """What writing reads of an ``Unlocked``."""

    @property
    def time_s(self) -> float: ...
    @property
    def energy_j(self) -> float: ...
    @property
    def sustained_mhz(self) -> int | None: ...


class MeasurementsData(Protocol):
    """What writing reads of an ``InstructionProfile``."""

    @property
    def freqs_mhz(self) -> tuple[int, ...]: ...
    @property
    def times_s(self) -> tuple[float, ...]: ...
    @property
    def energies_j(self) -> tuple[float, ...]: ...
    @property
    def unlocked(self) -> UnlockedData | None: ...


class ClockNoteData(Protocol):
    """What writing reads of a ``ClockNote``."""

    @property
    def reasons(self) -> frozenset[str]: ...
    @property
    def equal_to_mhz(self) -> int | None: ...


class SwitchLatencyData(Protocol):
    """What writing reads of a ``SwitchLatency``."""

    @property
    def seconds(self) -> float: ...
    @property
    def samples(self) -> int: ...


class ProfileData(Protocol):
    """What writing reads of a ``Profile``."""

    @property
    def entries(self) -> Mapping[tuple[int, int, str], MeasurementsData]: ...
    @property
    def p_blocking_w(self) -> float | None: ...
    @property
    def gpu_name(self) -> str: ...
    @property
    def config(self) -> Mapping[str, Any]: ...
    @property
    def quality(self) -> Mapping[tuple[int, int, str], Mapping[str, list[Any]]]: ...
    @property
    def clock_notes(self) -> Mapping[tuple[int, int], ClockNoteData]: ...
    @property
    def sustained_mhz(self) -> Mapping[int, int]: ...
    @property
    def switch_latency(self) -> SwitchLatencyData | None: ...
    @property
    def between_steps(self) -> Mapping[int, MeasurementsData]: ...
    @property
    def notes(self) -> Mapping[str, str]: ...


def encode_profile_json(profile: ProfileData) -> dict[str, Any]:
    """The JSON document of ``profile``: version 2 with quality, version 1 without."""
    measurements = []
    for key, p in sorted(profile.entries.items()):
        stage, chunk, kind = key
        item: dict[str, Any] = {"stage": stage, "chunk": chunk, "kind": kind, "freq_mhz": list(p.freqs_mhz),
                                "time_s": list(p.times_s), "energy_j": list(p.energies_j)}
        if key in profile.quality:
            item["quality"] = {name: list(values) for name, values in profile.quality[key].items()}
        measurements.append(item)
    out: dict[str, Any] = {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION if profile.quality else 1,
        "gpu_name": profile.gpu_name,
        "p_blocking_w": profile.p_blocking_w,
        "config": dict(profile.config),
        "measurements": measurements,
    }
    if profile.clock_notes:
        out["clock_notes"] = [{"stage": stage, "freq_mhz": f, "reasons": sorted(note.reasons),
                               "equal_to_mhz": note.equal_to_mhz}
                              for (stage, f), note in sorted(profile.clock_notes.items())]
    if profile.sustained_mhz:
        out["sustained_mhz"] = {str(stage): f for stage, f in sorted(profile.sustained_mhz.items())}
    unlocked = [{"stage": stage, "chunk": chunk, "kind": kind, "time_s": p.unlocked.time_s,
                 "energy_j": p.unlocked.energy_j, "sustained_mhz": p.unlocked.sustained_mhz}
                for (stage, chunk, kind), p in sorted(profile.entries.items()) if p.unlocked is not None]
    if unlocked:
        out["unlocked"] = unlocked
    if profile.switch_latency is not None:
        out["switch_latency"] = {"seconds": profile.switch_latency.seconds, "samples": profile.switch_latency.samples}
    if profile.between_steps:
        out["between_steps"] = [{"stage": stage, "freq_mhz": list(p.freqs_mhz), "time_s": list(p.times_s),
                                 "energy_j": list(p.energies_j)} for stage, p in sorted(profile.between_steps.items())]
    if profile.notes:
        out["notes"] = dict(profile.notes)
    return out


def save_profile_json(profile: ProfileData, path: str | Path) -> None:
    """Write atomically, so an interrupted save never leaves a truncated profile."""
    write_atomic(path, json.dumps(encode_profile_json(profile), indent=1))


def profile_csv_rows(profile: ProfileData) -> list[dict[str, Any]]:
    """One row per (stage, chunk, kind, clock); with clock notes, their two optional columns."""
    rows = []
    for (stage, chunk, kind), p in sorted(profile.entries.items()):
        for f, t, e in zip(p.freqs_mhz, p.times_s, p.energies_j):
            row: dict[str, Any] = dict(stage=stage, chunk=chunk, instruction=kind, frequency=f, time=t, energy=e)
            if profile.clock_notes:
                note = profile.clock_notes.get((stage, f))
                row["reasons"] = "" if note is None else ";".join(sorted(note.reasons))
                row["equal_to_mhz"] = "" if note is None or note.equal_to_mhz is None else note.equal_to_mhz
            rows.append(row)
    return rows


def save_profile_csv(profile: ProfileData, path: str | Path) -> None:
    """The Zeus-format CSV (plus ``chunk`` and, with clock notes, ``reasons``/``equal_to_mhz``), atomically."""
    columns = [*CSV_COLUMNS, "chunk", *(CSV_NOTE_COLUMNS if profile.clock_notes else ())]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(profile_csv_rows(profile))
    write_atomic(path, buffer.getvalue())
