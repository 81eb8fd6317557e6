"""Faults a simulated GPU shows on demand, as the real cards and clusters show them.

Why: every defect found on real cards was one the simulator could not show. Each fault here is a
behaviour measured or reported on real systems, so the runtime's answer to it has a test:

- ``event_error_at``: the N-th event recorded on the stream (1-based) raises from ``query`` and
  ``synchronize`` (``event_error_count`` events in a row), as a CUDA error does, e.g. a graph
  capture in the global capture mode while another thread polls events;
- ``energy_fail_from_s`` / ``energy_fail_for_s``: energy-counter reads fail from that time on, for
  that long (``None``: for good), as NVML reads do on a GPU that fell off the bus or a busy driver;
- ``lock_refused_from_s`` / ``lock_refused_for_s``: clock locks (and resets) are refused from that
  time on, for that long (``None``: for good), as when an administrator or another tool takes
  the GPU's clocks;
- ``no_cap_sys_admin``: the process is root but holds no CAP_SYS_ADMIN (a user-namespaced
  container: enroot/pyxis ``--container-remap-root``, rootless docker, pods), so NVML's setters
  answer "no permission";
- ``mig``: MIG mode is on: a clock change would change every instance's clock, so none is allowed;
  measuring works;
- ``foreign_lock_mhz``: when the GPU is created its SM clock is already locked there by someone
  else (another job, an administrator).

Times are seconds on the GPU's clock since its state file was created (``created_s`` in its
parameters), so every process that attaches sees the same fault at the same moment. The faults
live in the shared state file's parameters, like the model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from perseus.gpu.errors import GPUInvalidArgumentError


@dataclass(frozen=True)
class SimFaults:
    """Which faults a simulated GPU shows, and when (see the module docstring)."""

    event_error_at: int | None = None
    event_error_count: int = 1
    energy_fail_from_s: float | None = None
    energy_fail_for_s: float | None = None
    lock_refused_from_s: float | None = None
    lock_refused_for_s: float | None = None
    no_cap_sys_admin: bool = False
    mig: bool = False
    foreign_lock_mhz: int | None = None

    def __post_init__(self) -> None:
        if self.event_error_at is not None and self.event_error_at < 1:
            raise GPUInvalidArgumentError(f"event_error_at counts recorded events from 1, got {self.event_error_at!r}")
        if self.event_error_count < 1:
            raise GPUInvalidArgumentError(f"event_error_count must be >= 1, got {self.event_error_count!r}")
        for name in ("energy_fail_from_s", "energy_fail_for_s", "lock_refused_from_s", "lock_refused_for_s"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise GPUInvalidArgumentError(f"{name} is seconds >= 0 (or None), got {value!r}")
        if self.foreign_lock_mhz is not None and self.foreign_lock_mhz <= 0:
            raise GPUInvalidArgumentError(f"foreign_lock_mhz is a clock in MHz, got {self.foreign_lock_mhz!r}")

    @property
    def any(self) -> bool:
        return self != SimFaults()

    def event_fails(self, number: int) -> bool:
        """Whether the ``number``-th recorded event (1-based) raises."""
        start = self.event_error_at
        return start is not None and start <= number < start + self.event_error_count

    def energy_fails(self, since_created_s: float) -> bool:
        return _in_window(since_created_s, self.energy_fail_from_s, self.energy_fail_for_s)

    def lock_refused(self, since_created_s: float) -> bool:
        return _in_window(since_created_s, self.lock_refused_from_s, self.lock_refused_for_s)

    def to_dict(self) -> dict[str, Any]:
        """The non-default fields (the state file's JSON)."""
        default = SimFaults()
        return {k: v for k, v in asdict(self).items() if v != getattr(default, k)}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SimFaults:
        if not d:
            return cls()
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise GPUInvalidArgumentError(f"unknown simulated-GPU faults {unknown}; known: {sorted(known)}")
        return cls(**d)


def _in_window(t: float, start: float | None, length: float | None) -> bool:
    return start is not None and t >= start and (length is None or t < start + length)


NO_FAULTS = SimFaults()
