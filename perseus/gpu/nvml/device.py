"""NVML backend of ``GPUDevice`` (nvidia-ml-py, imported lazily as ``pynvml``).

Lazy import keeps ``import perseus.gpu`` working on machines without the package or driver. Every
NVML error is translated to a typed ``GPUError`` at this boundary, so nothing above it needs to
know NVML's error codes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from perseus.gpu.nvml.cuda_visible import (
    default_cuda_index,
    parse_cuda_visible_devices,
    resolve_physical_index,
)
from perseus.gpu.device import ClockEventReason, GPUDevice, check_sm_clock
from perseus.gpu.errors import (
    GPUError,
    GPUInvalidArgumentError,
    GPULibraryMissingError,
    GPUNotFoundError,
    GPUNotSupportedError,
    GPUPermissionError,
    SIM_FIX,
)
from perseus.gpu.spec import GPUSpec

# NVML return codes (stable ABI values from nvml.h).
_ERR_INVALID_ARGUMENT = 2
_ERR_NOT_SUPPORTED = 3
_ERR_NO_PERMISSION = 4
_ERR_NOT_FOUND = 6
_ERR_DRIVER_NOT_LOADED = 9
_ERR_LIBRARY_NOT_FOUND = 12
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
_ERR_GPU_NOT_FOUND = 28

_CLOCK_SM = 1
# nvmlClocksEventReason bits (nvml.h), the ones ClockEventReason names.
_REASON_BITS = {
    0x1: ClockEventReason.IDLE, 0x2: ClockEventReason.APPLICATIONS_CLOCKS, 0x4: ClockEventReason.SW_POWER_CAP,
    0x8: ClockEventReason.HW_SLOWDOWN, 0x20: ClockEventReason.SW_THERMAL, 0x40: ClockEventReason.HW_THERMAL,
    0x80: ClockEventReason.HW_POWER_BRAKE,
}
_MIG_ENABLE = 1
_FI_DEV_POWER_INSTANT = 186

_ARCHITECTURES = {
    2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere",
    8: "ada", 9: "hopper", 10: "blackwell", 11: "dla",
}

T = TypeVar("T")


# The fix for a missing binding: the ``gpu`` extra installs nvidia-ml-py, nothing else.
BINDING_FIX = 'pip install "perseus-energy[gpu]"'


class NVMLBindingMissingError(GPULibraryMissingError):
    """NVML's Python binding (the nvidia-ml-py package, imported as ``pynvml``) is not installed:
    the base install leaves it out, the ``gpu`` extra brings it."""

    def __init__(self, what: str = "nvidia-ml-py (NVML's Python binding, imported as pynvml) is not installed") -> None:
        self.what = what
        GPUError.__init__(self, f"{what}: {BINDING_FIX}, or use the simulated GPU: {SIM_FIX}")


def load_pynvml() -> ModuleType:
    """Import ``pynvml`` on first use (tests inject a fake via ``sys.modules``)."""
    try:
        import pynvml
    except ImportError:
        raise NVMLBindingMissingError() from None
    return pynvml


def translate_nvml_error(exc: Exception, what: str, *, lookup: bool = False) -> GPUError:
    """Map an ``NVMLError`` to the typed error a user can act on.

    ``lookup`` marks device lookups, where NOT_FOUND / INVALID_ARGUMENT mean "no such GPU".
    """
    code = getattr(exc, "value", None)
    if code == _ERR_NO_PERMISSION:
        return GPUPermissionError(what)
    if code in (_ERR_NOT_SUPPORTED, _ERR_FUNCTION_NOT_FOUND):
        return GPUNotSupportedError(f"{what}: not supported by this GPU or driver ({exc})")
    if code in (_ERR_LIBRARY_NOT_FOUND, _ERR_DRIVER_NOT_LOADED):
        return GPULibraryMissingError(f"{what}: NVML is unavailable ({exc})")
    if code in (_ERR_NOT_FOUND, _ERR_GPU_NOT_FOUND, _ERR_GPU_IS_LOST) or (
        lookup and code == _ERR_INVALID_ARGUMENT
    ):
        return GPUNotFoundError(f"{what}: GPU not found ({exc})")
    if code == _ERR_INVALID_ARGUMENT:
        return GPUInvalidArgumentError(f"{what}: invalid argument ({exc})")
    return GPUError(f"{what}: NVML error {code} ({exc})")


_CAP_SYS_ADMIN = 21  # bit of the effective capability set (linux/capability.h)


def proc_status() -> str:
    """``/proc/self/status`` ("" where it cannot be read); tests replace it."""
    try:
        with open("/proc/self/status") as f:
            return f.read()
    except OSError:
        return ""


def proc_uid_map() -> str:
    """``/proc/self/uid_map`` ("" where it cannot be read); tests replace it."""
    try:
        with open("/proc/self/uid_map") as f:
            return f.read()
    except OSError:
        return ""


def in_user_namespace() -> bool:
    """Whether this process runs in a user namespace other than the host's: its uid map is not the
    identity over all 2**32 - 1 uids (enroot/pyxis ``--container-remap-root``, rootless docker, pods
    with user namespaces). An unreadable map is no evidence of one."""
    lines = [line.split() for line in proc_uid_map().splitlines() if line.strip()]
    return bool(lines) and lines != [["0", "0", "4294967295"]]


def has_cap_sys_admin() -> bool:
    """Whether this process holds CAP_SYS_ADMIN where the driver checks it: bit 21 of ``CapEff``,
    in the host's user namespace.

    The capability decides, not the uid. Root in a user namespace holds every capability inside it,
    and the driver checks them against the host's namespace, so NVML refuses its clock changes."""
    for line in proc_status().splitlines():
        if line.startswith("CapEff:"):
            try:
                held = bool(int(line.split()[1], 16) >> _CAP_SYS_ADMIN & 1)
            except (IndexError, ValueError):
                return False
            return held and not in_user_namespace()
    return False


def is_root() -> bool:
    return os.geteuid() == 0


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _PowerIntegrator:
    """Energy counter for pre-Volta GPUs: integrates polled power (trapezoid rule) in a thread."""

    def __init__(self, read_power_w: Callable[[], float], period_s: float) -> None:
        self._read = read_power_w
        self._period = period_s
        self._lock = threading.Lock()
        self._energy = 0.0
        self._t = time.monotonic()
        self._p = read_power_w()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perseus-power-integrator", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        p, t = self._read(), time.monotonic()
        with self._lock:
            self._energy += 0.5 * (p + self._p) * (t - self._t)
            self._p, self._t = p, t

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self._sample()
            except GPUError:
                return

    def energy_j(self) -> float:
        with self._lock:
            return self._energy + self._p * (time.monotonic() - self._t)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


class NVMLGPU(GPUDevice):
    """A real NVIDIA GPU through NVML.

    ``cuda_index`` is the device index *as this process's CUDA sees it* (after
    ``CUDA_VISIBLE_DEVICES``); it is mapped to the physical NVML device by UUID.
    """

    def __init__(self, cuda_index: int | None = None, *, power_poll_s: float = 0.01) -> None:
        self._nvml = load_pynvml()
        self._initialized = False
        self._call(self._nvml.nvmlInit, what="Initializing NVML")
        self._initialized = True
        self._integrator: _PowerIntegrator | None = None
        try:
            self._open(default_cuda_index() if cuda_index is None else cuda_index, power_poll_s)
        except BaseException:
            self.close()
            raise

    # -- setup ------------------------------------------------------------------------------
    def _call(self, fn: Callable[..., T], *args: Any, what: str, lookup: bool = False) -> T:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise translate_nvml_error(exc, what, lookup=lookup) from exc

    def _open(self, cuda_index: int, power_poll_s: float) -> None:
        nv = self._nvml
        count = self._call(nv.nvmlDeviceGetCount, what="Counting GPUs")
        uuids = [
            _text(self._call(nv.nvmlDeviceGetUUID,
                             self._call(nv.nvmlDeviceGetHandleByIndex, i, what=f"Opening GPU {i}", lookup=True),
                             what=f"Reading UUID of GPU {i}"))
            for i in range(count)
        ]
        visible = parse_cuda_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
        self._index = resolve_physical_index(cuda_index, visible, uuids)
        self._cuda_index = cuda_index
        self._uuid = uuids[self._index]
        self._handle = self._call(nv.nvmlDeviceGetHandleByIndex, self._index,
                                  what=f"Opening GPU {self._index}", lookup=True)
        self._name = _text(self._call(nv.nvmlDeviceGetName, self._handle, what="Reading GPU name"))
        self._mig = self._mig_enabled()
        self._probe_error: str | None = None  # why the last privilege probe failed, if not for permission
        self._sm_clocks: list[int] | None = None
        self._mem_clocks: list[int] | None = None
        self._instant_power = self._probe_instant_power()
        try:
            self._call(nv.nvmlDeviceGetTotalEnergyConsumption, self._handle, what="Reading energy")
            self._has_energy_counter = True
        except GPUNotSupportedError:
            self._has_energy_counter = False
            self._integrator = _PowerIntegrator(self.power_w, power_poll_s)

    def _mig_enabled(self) -> bool:
        """MIG mode is on: measuring works (the counters are the whole GPU's), clock control does not."""
        try:
            current, _pending = self._call(self._nvml.nvmlDeviceGetMigMode, self._handle, what="Reading MIG mode")
        except GPUNotSupportedError:
            return False  # pre-Ampere: no MIG
        return bool(current == _MIG_ENABLE)

    def _probe_instant_power(self) -> bool:
        fv = getattr(self._nvml, "nvmlDeviceGetFieldValues", None)
        if fv is None:
            return False
        try:
            values = fv(self._handle, [_FI_DEV_POWER_INSTANT])
        except self._nvml.NVMLError:
            return False
        return int(values[0].nvmlReturn) == 0

    # -- identity ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def uuid(self) -> str:
        return self._uuid

    @property
    def index(self) -> int:
        return self._index

    @property
    def cuda_index(self) -> int:
        """The index this process's CUDA uses for the device."""
        return self._cuda_index

    @property
    def architecture(self) -> str:
        fn = getattr(self._nvml, "nvmlDeviceGetArchitecture", None)
        if fn is None:
            return "unknown"
        try:
            code = self._call(fn, self._handle, what="Reading GPU architecture")
        except GPUNotSupportedError:
            return "unknown"
        return _ARCHITECTURES.get(int(code), "unknown")

    def minor_number(self) -> int | None:
        """Minor number of this GPU's ``/dev/nvidia<N>`` (``perseus clockd --require-open-device``
        checks that a client holds that file open); ``None`` if NVML cannot tell."""
        fn = getattr(self._nvml, "nvmlDeviceGetMinorNumber", None)
        if fn is None:
            return None
        try:
            return int(self._call(fn, self._handle, what="Reading the device minor number"))
        except GPUError:
            return None

    def spec(self) -> GPUSpec:
        """The controller process inherits CUDA_VISIBLE_DEVICES, so the CUDA index maps the same."""
        return GPUSpec(kind="nvml", index=self._cuda_index)

    @property
    def has_energy_counter(self) -> bool:
        """False on pre-Volta GPUs, where energy comes from the power-polling integrator."""
        return self._has_energy_counter

    # -- clocks -----------------------------------------------------------------------------
    def supported_memory_clocks_mhz(self) -> list[int]:
        """Memory clocks the device reports, descending."""
        if self._mem_clocks is None:
            clocks = self._call(self._nvml.nvmlDeviceGetSupportedMemoryClocks, self._handle,
                                what="Reading supported memory clocks")
            self._mem_clocks = sorted({int(c) for c in clocks}, reverse=True)
        return list(self._mem_clocks)

    def max_memory_clock_mhz(self) -> int:
        return self.supported_memory_clocks_mhz()[0]

    def supported_sm_clocks_mhz(self) -> list[int]:
        if self._sm_clocks is None:
            clocks = self._call(self._nvml.nvmlDeviceGetSupportedGraphicsClocks, self._handle,
                                self.max_memory_clock_mhz(), what="Reading supported SM clocks")
            self._sm_clocks = sorted({int(c) for c in clocks}, reverse=True)
            if not self._sm_clocks:
                raise GPUNotSupportedError(f"GPU {self._index} reports no supported SM clocks")
        return list(self._sm_clocks)

    def set_locked_sm_clock(self, mhz: int) -> None:
        mhz = check_sm_clock(mhz, self.supported_sm_clocks_mhz())
        self._call(self._nvml.nvmlDeviceSetGpuLockedClocks, self._handle, mhz, mhz,
                   what=f"Locking the SM clock of GPU {self._index} to {mhz} MHz")

    def reset_locked_sm_clock(self) -> None:
        self._call(self._nvml.nvmlDeviceResetGpuLockedClocks, self._handle,
                   what=f"Resetting the SM clock of GPU {self._index}")

    def lock_memory_clock(self, mhz: int) -> None:
        mem = self.supported_memory_clocks_mhz()
        if int(mhz) not in mem:
            raise GPUInvalidArgumentError(f"Memory clock {mhz} MHz is not supported; choose one of {mem}")
        self._call(self._nvml.nvmlDeviceSetMemoryLockedClocks, self._handle, int(mhz), int(mhz),
                   what=f"Locking the memory clock of GPU {self._index} to {mhz} MHz")

    def reset_memory_clock(self) -> None:
        self._call(self._nvml.nvmlDeviceResetMemoryLockedClocks, self._handle,
                   what=f"Resetting the memory clock of GPU {self._index}")

    def locked_sm_clock_mhz(self) -> int | None:
        """Best effort: NVML has no getter for locked clocks, so this is the current SM clock."""
        try:
            return int(self._call(self._nvml.nvmlDeviceGetClockInfo, self._handle, _CLOCK_SM,
                                  what="Reading the SM clock"))
        except GPUNotSupportedError:
            return None

    def current_sm_clock_mhz(self) -> int | None:
        return self.locked_sm_clock_mhz()

    def clock_event_reasons(self) -> frozenset[ClockEventReason]:
        """nvmlDeviceGetCurrentClocksEventReasons (ThrottleReasons on older bindings), decoded."""
        fn = (getattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
              or getattr(self._nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        if fn is None:
            return frozenset()
        try:
            bits = int(self._call(fn, self._handle, what="Reading the clock-event reasons"))
        except GPUError:
            return frozenset()
        return frozenset(reason for bit, reason in _REASON_BITS.items() if bits & bit)

    @property
    def driver_version(self) -> str:
        """nvmlSystemGetDriverVersion, e.g. "580.159.04"."""
        fn = getattr(self._nvml, "nvmlSystemGetDriverVersion", None)
        if fn is None:
            return "unknown"
        try:
            return _text(self._call(fn, what="Reading the driver version"))
        except GPUError:
            return "unknown"

    # -- energy and power -------------------------------------------------------------------
    def total_energy_j(self) -> float:
        if self._integrator is not None:
            return self._integrator.energy_j()
        mj = self._call(self._nvml.nvmlDeviceGetTotalEnergyConsumption, self._handle, what="Reading energy")
        return float(mj) / 1000.0

    def power_w(self) -> float:
        if self._instant_power:
            values = self._call(self._nvml.nvmlDeviceGetFieldValues, self._handle, [_FI_DEV_POWER_INSTANT],
                                what="Reading instant power")
            if int(values[0].nvmlReturn) == 0:
                return float(values[0].value.uiVal) / 1000.0
        mw = self._call(self._nvml.nvmlDeviceGetPowerUsage, self._handle, what="Reading power")
        return float(mw) / 1000.0

    def power_limit_w(self) -> float:
        return float(self._call(self._nvml.nvmlDeviceGetEnforcedPowerLimit, self._handle,
                                what="Reading the power limit")) / 1000.0

    def power_limit_range_w(self) -> tuple[float, float]:
        lo, hi = self._call(self._nvml.nvmlDeviceGetPowerManagementLimitConstraints, self._handle,
                            what="Reading the power limit range")
        return float(lo) / 1000.0, float(hi) / 1000.0

    def set_power_limit_w(self, w: float) -> None:
        lo, hi = self.power_limit_range_w()
        if not lo <= w <= hi:
            raise GPUInvalidArgumentError(f"Power limit {w} W is outside the allowed range {lo}–{hi} W")
        self._call(self._nvml.nvmlDeviceSetPowerManagementLimit, self._handle, int(round(w * 1000)),
                   what=f"Setting the power limit of GPU {self._index} to {w} W")

    # -- privileges -------------------------------------------------------------------------
    def can_set_clocks(self) -> bool:
        """CAP_SYS_ADMIN → True without touching the GPU; MIG mode → False; otherwise probe a lock +
        reset (root without the capability too: ``has_cap_sys_admin``).

        The probe locks at the default (max) clock, so even a partial failure leaves the GPU at
        its normal speed. Every failure is False, and ``control_problem`` says why.
        """
        self._probe_error = None
        if self._mig:
            return False
        if has_cap_sys_admin():
            return True
        try:
            self.set_locked_sm_clock(self.default_sm_clock_mhz())
            self.reset_locked_sm_clock()
        except GPUPermissionError:
            return False
        except GPUError as exc:
            self._probe_error = str(exc)
            return False
        return True

    def control_problem(self) -> str | None:
        """One line naming the fix for MIG mode, root without CAP_SYS_ADMIN and a probe that failed
        for another reason; None for a plain unprivileged user (the caller's generic advice fits)."""
        gpu = f"GPU {self._index} ({self._name})"
        if self._mig:
            return (f"{gpu} has MIG mode enabled, and a clock change would change every MIG instance's clock; "
                    "measure-only works (its energy is the whole GPU's, every instance's work included), or "
                    f"disable MIG (`sudo nvidia-smi -i {self._index} -mig 0`)")
        if self._probe_error is not None:
            return f"{gpu}: this process may not change clocks: {self._probe_error}"
        if is_root() and not has_cap_sys_admin():
            return (f"{gpu}: this process is root but lacks CAP_SYS_ADMIN (root in a user namespace: enroot/pyxis "
                    "--container-remap-root, rootless docker, a pod), so NVML refuses clock changes; grant it "
                    "(`docker run --cap-add SYS_ADMIN`; Kubernetes securityContext.capabilities.add: [SYS_ADMIN]), "
                    "or let perseus clockd or zeusd change the clocks (docs/gpu.md)")
        return None

    def is_clock_locked(self) -> bool:
        """Best effort, for a lock someone else holds when Perseus starts: NVML has no getter for
        locked clocks, but a lock below the default clock holds the clock down, which NVML reports
        as the ``applications_clocks_setting`` clock-event reason, busy or idle (the lock's floor
        keeps an idle card at the locked clock). A lock at the default clock does not show (and
        slows nothing). The clock alone would not do: an idle, unlocked card runs at its idle clock,
        far below the default."""
        return ClockEventReason.APPLICATIONS_CLOCKS in self.clock_event_reasons()

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        if self._integrator is not None:
            self._integrator.stop()
            self._integrator = None
        if self._initialized:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:  # noqa: BLE001 - shutdown failure is harmless
                print(f"perseus: nvmlShutdown failed: {exc}", file=sys.stderr)
