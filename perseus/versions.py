"""The framework versions Perseus supports: one table, read by the adapters' start-up check,
``perseus doctor`` and the version matrix in docs/install.md (scripts/gen_reference.py writes it;
tests/test_versions.py keeps the page, setup.py's extras and this table in step).

A release *line* is a ``major.minor`` pair. ``lines`` are the lines the adapters' hook points were
checked against; ``tested`` the exact releases the test suite runs (``constraints.txt``,
``scripts/megatron_py312.sh``). A version below ``minimum`` or outside ``lines`` still runs where the
adapter's hook-point check passes; the adapter says so in one line at start.

Importing this module imports nothing else of Perseus, torch or a framework.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Supported:
    """One package an adapter runs on, and which of its versions Perseus supports."""

    package: str  # the distribution's name (pip)
    module: str  # what it is imported as
    adapters: tuple[str, ...]  # the Perseus packages that need it
    minimum: str  # the lower bound setup.py's extras carry; older releases are not supported
    lines: tuple[tuple[int, int], ...]  # the supported (major, minor) release lines
    tested: tuple[str, ...]  # the releases the test suite runs
    note: str = ""  # one sentence for the version matrix

    @property
    def lines_text(self) -> str:
        """``0.16.x–0.19.x`` or ``2.13.x``."""
        first, last = self.lines[0], self.lines[-1]
        return f"{first[0]}.{first[1]}.x" + ("" if first == last else f"–{last[0]}.{last[1]}.x")


MEGATRON, DEEPSPEED, TORCH = "perseus_megatron", "perseus_deepspeed", "perseus_torch"
ADAPTERS = (MEGATRON, DEEPSPEED, TORCH)

SUPPORTED: tuple[Supported, ...] = (
    Supported("torch", "torch", ADAPTERS, "2.1", ((2, 13),), ("2.13.0",),
              "CPU build in the suite (gloo); the schedules perseus_torch follows are torch 2.13's."),
    Supported("megatron-core", "megatron.core", (MEGATRON,), "0.16", ((0, 16), (0, 17), (0, 18), (0, 19)),
              ("0.16.1", "0.19.2"),
              "0.17 and later need Python 3.12; 0.17.1 and 0.18.2 are checked from their source "
              "(hook points, patches), 0.16.1 and 0.19.2 train in the suite."),
    Supported("deepspeed", "deepspeed", (DEEPSPEED,), "0.19", ((0, 19),), ("0.19.8",),
              "PipelineEngine with TrainSchedule; the real deepspeed launcher on CPU in the suite."),
)
# The Python lines the suite runs on: 3.11 (everything) and 3.12 (tests/megatron with megatron-core 0.19).
PYTHON_TESTED: tuple[str, ...] = ("3.11", "3.12")

_BY_PACKAGE = {row.package: row for row in SUPPORTED}
_NUMBERS = re.compile(r"(\d+)\.(\d+)")


def supported(package: str) -> Supported:
    """The row for ``package`` (a KeyError names the packages the table has)."""
    try:
        return _BY_PACKAGE[package]
    except KeyError:
        raise KeyError(f"{package!r} is not in perseus.versions.SUPPORTED ({', '.join(_BY_PACKAGE)})") from None


def release_line(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string (``2.13.0+cu130``, ``0.20.0rc0``), None if it has none."""
    match = _NUMBERS.match(version.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def problem(package: str, version: str) -> str | None:
    """What is not supported about ``package`` at ``version``, as a phrase, or None where it is supported."""
    row = supported(package)
    line = release_line(version)
    if line is not None and line in row.lines:
        return None
    minimum = release_line(row.minimum)
    where = (f"below the supported minimum {row.minimum}" if line is not None and minimum is not None and line < minimum
             else "outside the supported releases, untested")
    return f"{package} {version} is {where} ({row.lines_text}; tested {', '.join(row.tested)})"


def installed_version(package: str) -> str | None:
    """The version of ``package`` this process runs: the imported module's ``__version__`` where it is
    imported (a Megatron-LM checkout's megatron.core has no package metadata), else pip's metadata."""
    module = sys.modules.get(supported(package).module)
    version = getattr(module, "__version__", None)
    if version is not None:
        return str(version)
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def unsupported_line(adapter: str, packages: Iterable[str] | None = None,
                     installed: Mapping[str, str | None] | None = None) -> str | None:
    """One line naming every installed package of ``adapter`` (or only ``packages``) that is not
    supported, or None. ``installed`` gives versions instead of reading them (tests, callers that
    read them already)."""
    rows = [row for row in SUPPORTED if adapter in row.adapters and (packages is None or row.package in packages)]
    problems = []
    for row in rows:
        version = installed[row.package] if installed is not None and row.package in installed \
            else installed_version(row.package)
        found = None if version is None else problem(row.package, version)
        if found:
            problems.append(found)
    if not problems:
        return None
    return (f"{adapter}: {'; '.join(problems)}; Perseus runs on it where its hooks find what they need, "
            "but check the recorded instruction order before relying on it (docs/install.md)")


def warn_unsupported(adapter: str, packages: Iterable[str] | None = None,
                     installed: Mapping[str, str | None] | None = None, *, stacklevel: int = 3) -> str | None:
    """``unsupported_line`` as a ``UserWarning`` (and returned); nothing where everything is supported."""
    line = unsupported_line(adapter, packages, installed)
    if line is not None:
        warnings.warn(line, UserWarning, stacklevel=stacklevel)
    return line
