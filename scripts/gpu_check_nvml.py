"""Read-only NVML parts of ``gpu_check.py``: identity, versions, clocks, power, read latencies,
the energy counter's period, and a sampler thread for clocks, power and clock-event reasons.

Every call goes through ``perseus.gpu.nvml.readonly.ReadOnlyNVML``, which refuses anything that
would change the GPU. Nothing here prints a UUID or a serial number.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from gpu_check_analysis import counter_updates, reason_shares, summary, update_period

from perseus.gpu.nvml.cuda_visible import parse_cuda_visible_devices, resolve_physical_index
from perseus.gpu.nvml.readonly import ReadOnlyNVML

NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
FI_DEV_POWER_INSTANT = 186

_ARCHITECTURES = {2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere",
                  8: "ada", 9: "hopper", 10: "blackwell"}


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _maybe(nv: ReadOnlyNVML, fn: str, *args: Any) -> Any:
    """``nv.fn(*args)``, or the error's text if the driver lacks it (the report says so)."""
    try:
        return getattr(nv, fn)(*args)
    except AttributeError:
        return f"not in this pynvml ({fn})"
    except nv.NVMLError as exc:
        return f"unavailable ({exc})"


def open_handle(nv: ReadOnlyNVML, cuda_index: int) -> tuple[Any, int]:
    """The NVML handle of the GPU this process's CUDA calls ``cuda_index`` (mapped by UUID through
    CUDA_VISIBLE_DEVICES), and its NVML index."""
    count = int(nv.nvmlDeviceGetCount())
    uuids = [_text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
    index = resolve_physical_index(cuda_index, parse_cuda_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES")),
                                   uuids)
    return nv.nvmlDeviceGetHandleByIndex(index), index


def identity(nv: ReadOnlyNVML, handle: Any, nvml_index: int) -> dict[str, Any]:
    arch = _maybe(nv, "nvmlDeviceGetArchitecture", handle)
    mem = _maybe(nv, "nvmlDeviceGetMemoryInfo", handle)
    return {"name": _text(nv.nvmlDeviceGetName(handle)), "nvml_index": nvml_index,
            "architecture": _ARCHITECTURES.get(arch, str(arch)) if isinstance(arch, int) else arch,
            "memory_gib": round(mem.total / 2**30, 1) if hasattr(mem, "total") else mem}


def versions(nv: ReadOnlyNVML) -> dict[str, Any]:
    cuda = _maybe(nv, "nvmlSystemGetCudaDriverVersion")
    return {"driver": _text(_maybe(nv, "nvmlSystemGetDriverVersion")),
            "nvml": _text(_maybe(nv, "nvmlSystemGetNVMLVersion")),
            "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else cuda}


def clocks(nv: ReadOnlyNVML, handle: Any) -> dict[str, Any]:
    mem = sorted({int(c) for c in nv.nvmlDeviceGetSupportedMemoryClocks(handle)}, reverse=True)
    sm = sorted({int(c) for c in nv.nvmlDeviceGetSupportedGraphicsClocks(handle, mem[0])}, reverse=True)
    return {"memory_mhz": mem, "sm_count": len(sm), "sm_max_mhz": sm[0], "sm_min_mhz": sm[-1],
            "sm_now_mhz": _maybe(nv, "nvmlDeviceGetClockInfo", handle, NVML_CLOCK_SM),
            "memory_now_mhz": _maybe(nv, "nvmlDeviceGetClockInfo", handle, NVML_CLOCK_MEM)}


def power(nv: ReadOnlyNVML, handle: Any) -> dict[str, Any]:
    lo, hi = nv.nvmlDeviceGetPowerManagementLimitConstraints(handle)
    default = _maybe(nv, "nvmlDeviceGetPowerManagementDefaultLimit", handle)
    return {"limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3, "range_w": [lo / 1e3, hi / 1e3],
            "default_limit_w": default / 1e3 if isinstance(default, int) else default,
            "now_w": nv.nvmlDeviceGetPowerUsage(handle) / 1e3}


def clock_event_reasons(nv: ReadOnlyNVML, handle: Any) -> int:
    """The current clock-event (throttle) reason mask, under either of its NVML names."""
    try:
        fn = nv.nvmlDeviceGetCurrentClocksEventReasons
    except AttributeError:
        fn = nv.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(fn(handle))


def _timed(fn: Any, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def read_latency(nv: ReadOnlyNVML, handle: Any, energy_reps: int, power_reps: int) -> dict[str, Any]:
    """Wall time of one energy read, one power read and one instant-power field read (ms: median,
    p99) on this thread; field reads may be as slow as energy reads, so they get as few."""
    out: dict[str, Any] = {
        "energy_ms": summary(_timed(lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle), energy_reps), 1e3),
        "power_ms": summary(_timed(lambda: nv.nvmlDeviceGetPowerUsage(handle), power_reps), 1e3),
    }
    try:
        out["instant_power_ms"] = summary(
            _timed(lambda: nv.nvmlDeviceGetFieldValues(handle, [FI_DEV_POWER_INSTANT]), energy_reps), 1e3)
    except (AttributeError, nv.NVMLError) as exc:
        out["instant_power_ms"] = f"unavailable ({exc})"
    return out


def counter_period(nv: ReadOnlyNVML, handle: Any, updates: int, timeout_s: float) -> dict[str, Any]:
    """Poll the energy counter back to back until it has changed ``updates`` times."""
    polls: list[tuple[float, float, float]] = []
    changes = 0
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline and changes <= updates:
        t = time.perf_counter()
        v = float(nv.nvmlDeviceGetTotalEnergyConsumption(handle))
        changes += bool(polls) and v != polls[-1][2]
        polls.append((t, time.perf_counter(), v))
    return {"period_ms": update_period(counter_updates(polls)), "polls": len(polls)}


class Sampler:
    """A thread that polls the energy counter back to back and, every ``state_every_s``, the SM
    clock, power, temperature and clock-event reasons. Read-only NVML calls only."""

    def __init__(self, nv: ReadOnlyNVML, handle: Any, state_every_s: float = 0.02) -> None:
        self._nv, self._h, self._every = nv, handle, state_every_s
        self.energy: list[tuple[float, float, float]] = []  # (t_before, t_after, joules)
        self.state: list[tuple[float, int, float, int, int]] = []  # (t, sm MHz, W, reasons, °C)
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-check-sampler", daemon=True)

    def _run(self) -> None:
        nv, h = self._nv, self._h
        next_state = 0.0
        try:
            while not self._stop.is_set():
                t = time.perf_counter()
                e = nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3
                t2 = time.perf_counter()
                self.energy.append((t, t2, e))
                if t2 >= next_state:
                    self.state.append((t2, int(nv.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)),
                                       nv.nvmlDeviceGetPowerUsage(h) / 1e3, clock_event_reasons(nv, h),
                                       int(nv.nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU))))
                    next_state = t2 + self._every
                time.sleep(0.0005)
        except Exception as exc:  # noqa: BLE001 - reported with the part's results
            self.error = f"{type(exc).__name__}: {exc}"

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def updates(self) -> list[tuple[float, float]]:
        """(time, joules) at each counter change."""
        return counter_updates(self.energy)

    def sustained(self, t_from: float, t_to: float) -> dict[str, Any]:
        """SM clock, power, temperature and reasons over [t_from, t_to]."""
        rows = [r for r in self.state if t_from <= r[0] <= t_to]
        upd = [u for u in self.updates() if t_from <= u[0] <= t_to]
        out: dict[str, Any] = {
            "samples": len(rows),
            "sm_mhz": summary([r[1] for r in rows]),
            "power_w": summary([r[2] for r in rows]),
            "temperature_c_max": max((r[4] for r in rows), default=None),
            "reasons": reason_shares([r[3] for r in rows]),
            "counter_period_ms": update_period(upd),
        }
        if len(upd) >= 2:
            out["counter_power_w"] = (upd[-1][1] - upd[0][1]) / (upd[-1][0] - upd[0][0])
        if self.error:
            out["sampler_error"] = self.error
        return out
