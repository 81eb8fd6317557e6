"""User-facing error types.

Every error a user can cause (bad profile, bad config, missing privileges, no NVML) is a
``PerseusError`` whose message names the problem and what to do about it. The CLI prints it as
one line and exits with status 2; library callers can catch the specific subclass.
"""

from __future__ import annotations

from typing import TextIO


class PerseusError(Exception):
    """Base class for errors caused by input, configuration or environment.

    ``line``: the one line to print for it when it ends the process, where the raiser knows better
    than its message (a job's start-up error that rank 0 reports once for every rank); None: the
    message, on one line (``perseus.runtime.lifecycle.error_line``)."""

    line: str | None = None


class ProfileError(PerseusError):
    """A profile file or object is malformed or does not match the job."""


class ScheduleError(PerseusError):
    """A pipeline schedule cannot be built for the requested configuration."""


class ConfigError(PerseusError):
    """A Perseus configuration value is invalid."""


class FrontierError(PerseusError):
    """A frontier file is malformed or does not match the job."""


class PlannerError(PerseusError):
    """The planner could not solve a subproblem (a solver failure, not bad input)."""


class ReportError(PerseusError):
    """A run directory has nothing to report, or one of its files cannot be read."""


def write_line(stream: TextIO, line: str) -> None:
    """``line`` and its newline in one write: ``print`` writes them apart, and on a stderr that
    every rank shares (a launcher's pipe) another rank's line can land between the two."""
    stream.write(line + "\n")
    stream.flush()
