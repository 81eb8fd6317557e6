"""Measured profiles: (time, energy) per (stage, chunk, kind, clock), P_blocking and provenance
(``model``), their files (``decode``: reading and validating Zeus CSV and versioned JSON;
``encode``: writing them), profiles derived from a measured one (``transforms``), and the
statistics that make a noisy measurement trustworthy (``fit``: robust per-clock statistics, the
isotonic time fit, pessimistic planning times, validated interpolation; ``aggregate``: every
rank's measurements into one profile)."""

from perseus.profile.decode import load_csv, load_json, load_profile, profile_from_json_dict
from perseus.profile.encode import (
    CSV_COLUMNS,
    PROFILE_FORMAT,
    PROFILE_VERSION,
    PROFILE_VERSIONS,
    encode_profile_json,
    profile_csv_rows,
    save_profile_csv,
    save_profile_json,
)
from perseus.profile.model import (
    QUALITY_FIELDS,
    ClockNote,
    InstructionProfile,
    Profile,
    required_kinds,
    uniform_profile,
)
from perseus.profile.transforms import fuse_forward_backward, split_backward, split_into_chunks

__all__ = ["CSV_COLUMNS", "PROFILE_FORMAT", "PROFILE_VERSION", "PROFILE_VERSIONS", "QUALITY_FIELDS", "ClockNote", "InstructionProfile",
           "Profile", "encode_profile_json", "fuse_forward_backward", "load_csv", "load_json", "load_profile",
           "profile_csv_rows", "profile_from_json_dict", "required_kinds", "save_profile_csv", "save_profile_json",
           "split_backward", "split_into_chunks", "uniform_profile"]
