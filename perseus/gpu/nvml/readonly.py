"""A read-only view of ``pynvml`` for machines whose GPU is not ours to change.

On a shared or lent GPU, clocks, memory clocks, power limits, persistence and compute mode must
stay as the owner left them. Code that only observes the GPU gets this guard instead of the
module: it passes through constants, error classes and the ``nvml*Get*`` queries, and refuses
every other NVML function (``nvmlDeviceSet*``, ``nvmlDeviceReset*``, ``nvmlDeviceClear*`` and
anything not known to be a query) before it reaches the driver.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

from perseus.gpu.errors import GPUError

# Functions that only read: queries, plus the library's own lifetime and error text.
_READ_ONLY = re.compile(
    r"^nvml(Init(WithFlags|_v2)?|Shutdown|ErrorString"
    r"|(System|Device|Unit|Vgpu\w*|GpuInstance|ComputeInstance|Event\w*)Get\w*"
    r"|DeviceOnSameBoard|DeviceValidateInforom)$"
)


_MISSING = object()


class ReadOnlyViolation(GPUError):
    """Code running in read-only mode tried to change the GPU."""


def is_read_only_call(name: str) -> bool:
    """Whether ``name`` is an NVML function the guard lets through."""
    return bool(_READ_ONLY.match(name))


class ReadOnlyNVML:
    """Wraps a ``pynvml`` module; ``guard.nvmlDeviceGetPowerUsage(h)`` works,
    ``guard.nvmlDeviceSetGpuLockedClocks(...)`` raises ``ReadOnlyViolation`` without calling NVML.

    ``refused`` lists the names that were refused, so a caller can report them.
    """

    def __init__(self, module: ModuleType) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "refused", [])

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name, _MISSING)
        # lower-case ``nvml*`` names that are not functions are constants (bit masks): harmless
        if not name.startswith("nvml") or is_read_only_call(name) or not (value is _MISSING or callable(value)):
            if value is _MISSING:
                raise AttributeError(f"pynvml has no attribute {name!r}")
            return value
        self.refused.append(name)
        raise ReadOnlyViolation(
            f"{name} refused: this run is read-only and must not change the GPU (clocks, memory "
            "clocks, power limits, persistence, compute mode); pass --allow-clock-changes only on "
            "a GPU that is yours"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("the read-only NVML view cannot be modified")
