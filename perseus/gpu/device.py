"""``GPUDevice``: the one interface to a GPU's clocks, energy and power.

Its backends are NVML (``nvml/``), the simulated GPU (``sim/``) and ``ZeusdGPU`` (``zeusd/``), which
wraps either one and sends the privileged calls and energy reads through Zeus's daemon. ``open_gpu``
(``factory``) chooses the backend and ``open_clock_service`` (``clock_service``) the path its clocks
change through. The frequency controller, clockd, the measurement code and the runtime's port read
and change clocks only through this interface, so each runs on machines without a GPU. Only driving
a simulated GPU's work (its kernels, its stream) needs the simulator itself (``GPUDevice.underlying``).
"""

from __future__ import annotations

import math
import operator
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import SupportsIndex

from perseus.gpu.errors import GPUInvalidArgumentError
from perseus.gpu.spec import GPUSpec

ENERGY_UPDATE_PERIOD_S = 0.1  # how often NVML's energy counter advances on the measured cards (A100, H100, H200)


@dataclass
class BusyResult:
    """Filled in when a ``busy()`` block exits: the simulated kernel duration (NaN on real GPUs,
    where the work itself is the GPU's busy time and is timed by the instruction timer)."""

    duration_s: float = math.nan


def check_sm_clock(mhz: object, supported_desc: list[int]) -> int:
    """Validate a requested SM clock against a descending supported list; return it as ``int``.

    Shared by backends so a typo (``1400.5``, ``"1410"``, 5000) fails the same way everywhere.
    """
    try:
        if not isinstance(mhz, SupportsIndex):  # a float, a string: refused like an __index__ that raises
            raise TypeError
        value = operator.index(mhz)
    except TypeError:
        raise GPUInvalidArgumentError(f"SM clock must be an integer number of MHz, got {mhz!r}") from None
    if isinstance(mhz, bool) or not supported_desc[-1] <= value <= supported_desc[0]:
        raise GPUInvalidArgumentError(
            f"SM clock {value} MHz is outside the supported range "
            f"{supported_desc[-1]}–{supported_desc[0]} MHz"
        )
    return value


class ClockEventReason(Enum):
    """Why the SM clock is below the one asked for (NVML's clock-event reasons, the ones Perseus
    acts on): a card at its power limit (``sw_power_cap``) runs slower than any locked clock above
    the one it sustains, so clocks above that one are the same point."""

    IDLE = "gpu_idle"
    APPLICATIONS_CLOCKS = "applications_clocks_setting"
    SW_POWER_CAP = "sw_power_cap"
    HW_SLOWDOWN = "hw_slowdown"
    SW_THERMAL = "sw_thermal_slowdown"
    HW_THERMAL = "hw_thermal_slowdown"
    HW_POWER_BRAKE = "hw_power_brake_slowdown"


class GPUDevice(ABC):
    """One physical GPU: clocks, energy, power limit.

    Units are MHz, joules, watts and seconds everywhere (NVML's mJ/mW are converted in the
    backend) so callers never juggle units.
    """

    # -- identity ---------------------------------------------------------------------------
    @property
    @abstractmethod
    def name(self) -> str:
        """Marketing name, e.g. ``NVIDIA A100-SXM4-40GB``; shown in reports and profiles."""

    @property
    @abstractmethod
    def uuid(self) -> str:
        """Stable identity (``GPU-…``); indices change with CUDA_VISIBLE_DEVICES, UUIDs don't."""

    @property
    @abstractmethod
    def architecture(self) -> str:
        """Architecture name (``ampere``, ``hopper``…); decides energy-counter support."""

    @property
    @abstractmethod
    def index(self) -> int:
        """Physical (NVML / simulated) index of the device."""

    @property
    def driver_version(self) -> str:
        """The driver's version (part of the profile cache key: a driver upgrade can change what
        a clock does); "unknown" where the backend cannot tell."""
        return "unknown"

    @property
    def simulated(self) -> bool:
        """Whether the work runs on the simulated GPU (``perseus.gpu.sim``), also behind a wrapper:
        its index is a state file rather than a CUDA device, and the runtime stretches its kernels."""
        return self.underlying.simulated if self.underlying is not self else False

    @property
    def underlying(self) -> GPUDevice:
        """The device that does the work: this one, or the one a wrapper (zeusd) forwards reads to."""
        return self

    # -- clocks -----------------------------------------------------------------------------
    @abstractmethod
    def supported_sm_clocks_mhz(self) -> list[int]:
        """SM clocks settable at the maximum memory clock, descending: the planner's choices."""

    @abstractmethod
    def max_memory_clock_mhz(self) -> int:
        """Highest memory clock; Perseus keeps memory at max and scales only the SM clock."""

    def default_sm_clock_mhz(self) -> int:
        """The clock the GPU runs at when unlocked (the maximum supported clock)."""
        return self.supported_sm_clocks_mhz()[0]

    @abstractmethod
    def set_locked_sm_clock(self, mhz: int) -> None:
        """Pin the SM clock (min = max = ``mhz``) so per-instruction time/energy is predictable."""

    @abstractmethod
    def reset_locked_sm_clock(self) -> None:
        """Undo ``set_locked_sm_clock``; locked clocks outlive the process, so this must run."""

    @abstractmethod
    def lock_memory_clock(self, mhz: int) -> None:
        """Pin the memory clock (used by gpu_check to measure at a fixed memory clock)."""

    @abstractmethod
    def reset_memory_clock(self) -> None:
        """Undo ``lock_memory_clock``."""

    @abstractmethod
    def locked_sm_clock_mhz(self) -> int | None:
        """The SM clock the device is currently held at, or ``None`` if the backend can't tell."""

    def minor_number(self) -> int | None:
        """Minor number of this GPU's ``/dev/nvidia<N>`` (``perseus clockd --require-open-device``);
        None where there is no such file or the backend cannot tell."""
        return None

    # -- energy and power -------------------------------------------------------------------
    @abstractmethod
    def total_energy_j(self) -> float:
        """Cumulative energy counter (J); differences of two readings give energy used."""

    def energy_counter_reading(self) -> tuple[float, float | None]:
        """(counter, CLOCK_MONOTONIC time of its last update), for the energy poller; the time is
        None where only the reader's own clock says when it changed (real GPUs)."""
        return self.total_energy_j(), None

    @property
    def energy_update_period_s(self) -> float:
        """How often ``total_energy_j`` advances (s), 0 for a continuous counter: the energy poller
        polls at a rate matched to it. NVML's counter on the measured cards (``ENERGY_UPDATE_PERIOD_S``)
        unless the backend says otherwise."""
        return ENERGY_UPDATE_PERIOD_S

    @abstractmethod
    def power_w(self) -> float:
        """Instantaneous board power (W), for blocking-power checks and live reports."""

    def current_sm_clock_mhz(self) -> int | None:
        """The SM clock the card runs at right now (under a power cap, below the locked one);
        ``None`` where the backend cannot tell."""
        return None

    def clock_event_reasons(self) -> frozenset[ClockEventReason]:
        """Why the clock is below the one asked for right now (empty where none or unknown)."""
        return frozenset()

    @abstractmethod
    def power_limit_w(self) -> float:
        """Current enforced power limit (W)."""

    @abstractmethod
    def set_power_limit_w(self, w: float) -> None:
        """Change the power limit (W); needs the same privilege as clock locking."""

    @abstractmethod
    def power_limit_range_w(self) -> tuple[float, float]:
        """(min, max) power limit the device accepts, for input validation."""

    # -- privileges -------------------------------------------------------------------------
    @abstractmethod
    def can_set_clocks(self) -> bool:
        """Whether this process may change clocks, checked without leaving anything changed."""

    def control_problem(self) -> str | None:
        """Why this process may not change clocks, in one line naming the fix, where the backend
        knows better than the generic advice (zeusd: token, scope); None otherwise."""
        return None

    # -- running work and sharing ---------------------------------------------------------------
    @contextmanager
    def busy(self, activity: float = 1.0, compute_fraction: float = 0.8) -> Iterator[BusyResult]:
        """Wrap a block of work on this device, for code that drives a device itself (the GPU
        layer's tests; ``ZeusdGPU`` forwards it to its base). A no-op on a real GPU,
        whose work is its own busy time; the simulated GPU stretches the block to the clock in
        force and accounts its energy. The runtime does not use it: it makes each instruction a
        simulated kernel through the simulator's own ``begin_busy`` / ``end_busy`` or its stream
        (``perseus/runtime/port/sim_kernels.py``)."""
        yield BusyResult()

    @abstractmethod
    def spec(self) -> GPUSpec:
        """How another process (the frequency controller) opens this same device."""

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:  # noqa: B027 - a default: backends without resources to release keep it
        """Release backend resources (NVML handles, mmaps). Does not reset clocks."""

    def __enter__(self) -> GPUDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(index={self.index}, name={self.name!r}, uuid={self.uuid!r})"
