"""A fake ``pynvml`` module for testing the NVML backend without a GPU.

Same function names and error model as nvidia-ml-py (``NVMLError`` with a ``.value`` code); the
devices, UUIDs, MIG mode, permissions and energy counters are configurable, and every call is
recorded in ``module.calls`` so tests can assert what the backend did to the "hardware".
Inject with ``monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(...))``.
"""

from __future__ import annotations

import os
import time
import types
from dataclasses import dataclass, field
from typing import Any

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"fake NVML error {self.value}"


class NVMLError_LibraryNotFound(NVMLError):  # mirrors pynvml's name
    def __init__(self, value: int = NVML_ERROR_LIBRARY_NOT_FOUND) -> None:
        super().__init__(value)


@dataclass
class FakeDevice:
    uuid: str
    name: str = "NVIDIA A100-SXM4-40GB"
    arch: int = 7  # ampere
    mig_enabled: bool = False
    mig_supported: bool = True
    energy_supported: bool = True
    instant_power_supported: bool = True
    energy_mj: int = 0
    power_mw: int = 250_000
    instant_power_mw: int = 260_000
    mem_clocks: list[int] = field(default_factory=lambda: [1215])
    sm_clocks: list[int] = field(default_factory=lambda: list(range(1410, 209, -15)))
    sm_clock: int = 1410
    locked: tuple[int, int] | None = None
    mem_locked: tuple[int, int] | None = None
    power_limit_mw: int = 400_000
    limit_range_mw: tuple[int, int] = (100_000, 400_000)
    # Faults of this device alone (the module's ``lock_error``/``lost_marker`` hit every device).
    lock_error: int | None = None
    lost_marker: str | None = None
    # The energy counter advances by ``energy_step_mj`` every ``energy_step_s`` of wall time (None: frozen).
    energy_step_s: float | None = None
    energy_step_mj: int = 25_000
    clock_event_reasons: int = 0x4  # sw_power_cap
    temperature_c: int = 45
    memory_total: int = 40 * 2**30


@dataclass(frozen=True)
class _Handle:
    index: int


class _Value:
    def __init__(self, ui: int) -> None:
        self.uiVal = ui


class _FieldValue:
    def __init__(self, ret: int, ui: int) -> None:
        self.nvmlReturn = ret
        self.value = _Value(ui)


def make_fake_pynvml(
    devices: list[FakeDevice] | None = None,
    *,
    init_error: int | None = None,
    allow_set: bool = True,
    lock_error: int | None = None,
    lost_marker: str | None = None,
) -> types.ModuleType:
    """Build a fresh fake module. ``init_error`` makes ``nvmlInit`` fail with that code;
    ``allow_set=False`` makes every setter fail with NO_PERMISSION. Faults mid-run:
    ``lock_error`` makes locking any clock below the highest fail with that code (the privilege
    probe, which locks the highest, still works); GPU_IS_LOST then also creates the file
    ``lost_marker``, after which every device call in every process using it fails the same way.
    A ``FakeDevice``'s own ``lock_error``/``lost_marker`` do the same for that device alone."""
    m = types.ModuleType("pynvml")
    m.devices = devices if devices is not None else [FakeDevice("GPU-aaaa0000-0000-0000-0000-000000000000")]
    m.calls: list[tuple[str, tuple[Any, ...]]] = []
    m.allow_set = allow_set
    m.lock_error = lock_error
    m.lost_marker = lost_marker
    m.init_count = 0
    m.NVMLError = NVMLError
    m.NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    m.NVML_CLOCK_SM = 1
    m.NVML_CLOCK_MEM = 2
    m.NVML_FI_DEV_POWER_INSTANT = 186
    m.NVML_DEVICE_MIG_ENABLE = 1
    for name, value in globals().items():
        if name.startswith("NVML_ERROR_"):
            setattr(m, name, value)

    def api(fn: Any) -> Any:
        def wrapper(*args: Any) -> Any:
            m.calls.append((fn.__name__, args))
            return fn(*args)

        wrapper.__name__ = fn.__name__
        setattr(m, fn.__name__, wrapper)
        return wrapper

    def dev(h: _Handle) -> FakeDevice:
        if m.lost_marker is not None and os.path.exists(m.lost_marker):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if not isinstance(h, _Handle) or not 0 <= h.index < len(m.devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        d = m.devices[h.index]
        if d.lost_marker is not None and os.path.exists(d.lost_marker):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return d

    def setter() -> None:
        if not m.allow_set:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)

    @api
    def nvmlInit() -> None:
        if init_error == NVML_ERROR_LIBRARY_NOT_FOUND:
            raise NVMLError_LibraryNotFound()
        if init_error is not None:
            raise NVMLError(init_error)
        m.init_count += 1

    @api
    def nvmlShutdown() -> None:
        m.init_count -= 1

    @api
    def nvmlDeviceGetCount() -> int:
        return len(m.devices)

    @api
    def nvmlDeviceGetHandleByIndex(i: int) -> _Handle:
        if not 0 <= i < len(m.devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(i)

    @api
    def nvmlDeviceGetUUID(h: _Handle) -> str:
        return dev(h).uuid

    @api
    def nvmlDeviceGetName(h: _Handle) -> bytes:
        return dev(h).name.encode()  # older pynvml returned bytes; the backend must cope

    @api
    def nvmlDeviceGetArchitecture(h: _Handle) -> int:
        return dev(h).arch

    @api
    def nvmlDeviceGetMigMode(h: _Handle) -> list[int]:
        d = dev(h)
        if not d.mig_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [int(d.mig_enabled), int(d.mig_enabled)]

    @api
    def nvmlDeviceGetSupportedMemoryClocks(h: _Handle) -> list[int]:
        return list(dev(h).mem_clocks)

    @api
    def nvmlDeviceGetSupportedGraphicsClocks(h: _Handle, mem: int) -> list[int]:
        d = dev(h)
        if mem not in d.mem_clocks:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return list(d.sm_clocks)

    @api
    def nvmlDeviceSetGpuLockedClocks(h: _Handle, lo: int, hi: int) -> None:
        d = dev(h)
        setter()
        error, marker = (d.lock_error, d.lost_marker) if d.lock_error is not None else (m.lock_error, m.lost_marker)
        if error is not None and hi < max(d.sm_clocks):
            if error == NVML_ERROR_GPU_IS_LOST and marker is not None:
                open(marker, "w").close()
            raise NVMLError(error)
        d.locked = (lo, hi)
        d.sm_clock = hi

    @api
    def nvmlDeviceResetGpuLockedClocks(h: _Handle) -> None:
        d = dev(h)
        setter()
        d.locked = None
        d.sm_clock = max(d.sm_clocks)

    @api
    def nvmlDeviceSetMemoryLockedClocks(h: _Handle, lo: int, hi: int) -> None:
        d = dev(h)
        setter()
        d.mem_locked = (lo, hi)

    @api
    def nvmlDeviceResetMemoryLockedClocks(h: _Handle) -> None:
        d = dev(h)
        setter()
        d.mem_locked = None

    @api
    def nvmlDeviceGetMinorNumber(h: _Handle) -> int:
        dev(h)
        return h.index

    m.driver_version = "580.159.04"

    @api
    def nvmlSystemGetDriverVersion() -> bytes:
        return m.driver_version.encode()

    @api
    def nvmlDeviceGetClockInfo(h: _Handle, kind: int) -> int:
        d = dev(h)
        return d.sm_clock if kind == 1 else max(d.mem_clocks)

    @api
    def nvmlDeviceGetTotalEnergyConsumption(h: _Handle) -> int:
        d = dev(h)
        if not d.energy_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if d.energy_step_s is not None:
            return d.energy_mj + int(time.monotonic() / d.energy_step_s) * d.energy_step_mj
        return d.energy_mj

    @api
    def nvmlDeviceGetPowerUsage(h: _Handle) -> int:
        return dev(h).power_mw

    @api
    def nvmlDeviceGetFieldValues(h: _Handle, ids: list[int]) -> list[_FieldValue]:
        d = dev(h)
        return [_FieldValue(0, d.instant_power_mw) if (i == 186 and d.instant_power_supported)
                else _FieldValue(NVML_ERROR_NOT_SUPPORTED, 0) for i in ids]

    @api
    def nvmlDeviceGetEnforcedPowerLimit(h: _Handle) -> int:
        return dev(h).power_limit_mw

    @api
    def nvmlDeviceGetPowerManagementLimitConstraints(h: _Handle) -> list[int]:
        return list(dev(h).limit_range_mw)

    @api
    def nvmlDeviceSetPowerManagementLimit(h: _Handle, mw: int) -> None:
        d = dev(h)
        setter()
        d.power_limit_mw = mw

    @api
    def nvmlSystemGetNVMLVersion() -> str:
        return "13.580.00.01"

    @api
    def nvmlSystemGetCudaDriverVersion() -> int:
        return 13000

    @api
    def nvmlDeviceGetCurrentClocksEventReasons(h: _Handle) -> int:
        return dev(h).clock_event_reasons

    @api
    def nvmlDeviceGetTemperature(h: _Handle, sensor: int) -> int:
        return dev(h).temperature_c

    @api
    def nvmlDeviceGetPowerManagementDefaultLimit(h: _Handle) -> int:
        return dev(h).limit_range_mw[1]

    @api
    def nvmlDeviceGetMemoryInfo(h: _Handle) -> types.SimpleNamespace:
        d = dev(h)
        return types.SimpleNamespace(total=d.memory_total, free=d.memory_total, used=0)

    def calls_named(name: str) -> list[tuple[Any, ...]]:
        return [args for n, args in m.calls if n == name]

    m.calls_named = calls_named
    return m


# ---------------------------------------------------------------- as ``pynvml`` of other processes

SHIM = '''"""pynvml for a test's processes: the fake, with faults, logging its clock calls."""
import json, os, sys
sys.path.insert(0, {gpu_tests!r})
from fake_pynvml import FakeDevice, make_fake_pynvml

_cfg = json.loads(os.environ["PERSEUS_TEST_FAKE_NVML"])
_devices = [FakeDevice(**d) for d in _cfg["devices"]] if _cfg.get("devices") else None
_m = make_fake_pynvml(_devices, lock_error=_cfg.get("lock_error"), lost_marker=_cfg.get("lost_marker"))
_log = os.path.join(_cfg["log_dir"], f"{{os.getpid()}}.jsonl")

def _logged(name):
    inner = getattr(_m, name)
    def call(*args):
        entry = {{"call": name, "device": args[0].index, "args": list(args[1:])}}
        try:
            inner(*args)
            entry["ok"] = True
        except _m.NVMLError as exc:
            entry["ok"], entry["error"] = False, exc.value
            raise
        finally:
            entry["locked"] = _m.devices[args[0].index].locked
            with open(_log, "a") as f:
                f.write(json.dumps(entry) + "\\n")
    setattr(_m, name, call)

for _name in ("nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks"):
    _logged(_name)
sys.modules[__name__] = _m
'''


def write_shim(shim_dir: str | os.PathLike[str], config: dict[str, Any]) -> dict[str, str]:
    """Write ``pynvml.py`` into ``shim_dir``: in any process with that folder first on its
    ``PYTHONPATH`` and the returned environment, ``import pynvml`` gives this fake, configured by
    ``config`` (``lock_error``, ``lost_marker``, ``devices``: FakeDevice fields per device) and
    appending each clock call (device, ok, error, the device's lock after it) to
    ``<config["log_dir"]>/<pid>.jsonl``. Returns the environment variables to set."""
    import json

    path = os.path.join(os.fspath(shim_dir), "pynvml.py")
    with open(path, "w") as f:
        f.write(SHIM.format(gpu_tests=os.path.dirname(os.path.abspath(__file__))))
    return {"PERSEUS_TEST_FAKE_NVML": json.dumps(config)}


def read_clock_calls(log_dir: str | os.PathLike[str]) -> dict[int, list[dict[str, Any]]]:
    """The clock calls the shim logged, per process id, in order."""
    import json
    from pathlib import Path

    return {int(f.stem): [json.loads(x) for x in f.read_text().splitlines()]
            for f in sorted(Path(log_dir).glob("*.jsonl"))}
