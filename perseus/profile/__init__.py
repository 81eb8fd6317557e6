"""Measured profiles: (time, energy) per (stage, chunk, kind, clock), P_blocking and provenance
(``model``: the data, its Zeus CSV and versioned JSON), and the statistics that make a noisy
measurement trustworthy (``fit``: robust per-clock statistics, the isotonic time fit, pessimistic
planning times, validated interpolation)."""

from perseus.profile.model import (
    CSV_COLUMNS,
    PROFILE_FORMAT,
    PROFILE_VERSION,
    PROFILE_VERSIONS,
    QUALITY_FIELDS,
    ClockNote,
    InstructionProfile,
    Profile,
    fuse_forward_backward,
    load_csv,
    load_json,
    load_profile,
    profile_from_json_dict,
    required_kinds,
    split_backward,
    split_into_chunks,
    uniform_profile,
)

__all__ = ["CSV_COLUMNS", "PROFILE_FORMAT", "PROFILE_VERSION", "PROFILE_VERSIONS", "QUALITY_FIELDS", "ClockNote", "InstructionProfile",
           "Profile", "fuse_forward_backward", "load_csv", "load_json", "load_profile", "profile_from_json_dict", "required_kinds",
           "split_backward", "split_into_chunks", "uniform_profile"]
