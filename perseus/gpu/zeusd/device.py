"""``ZeusdGPU``: a GPU whose privileged calls and energy readings go through zeusd.

Why a device and not a third controller: zeusd speaks stateless HTTP and, unlike ``perseus
clockd``, does not reset a GPU when a client goes away. So the clock safety has to stay on our
side, and the frequency-controller process already gives it (reset on close, exception,
SIGTERM, and on the trainer's SIGKILL through pipe EOF). Wrapping the device keeps that whole
path and its tests: the trainer's hooks write to the controller's pipe as always
(``latest_writer``), and the controller process, which opens this device from the spec, makes the
HTTP calls. Unprivileged reads (name, UUID, supported clocks, the simulated GPU's kernels) come
from the wrapped ``base`` device (NVML or the simulated GPU); locking clocks, memory clocks, power
limits, the energy counter and power come from zeusd.

zeusd names GPUs by its own NVML index: the base device's physical ``index``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

from perseus.gpu.device import BusyResult, ClockEventReason, GPUDevice, check_sm_clock
from perseus.gpu.errors import GPUInvalidArgumentError
from perseus.gpu.spec import GPUSpec
from perseus.gpu.zeusd.client import ZeusdClient


class ZeusdGPU(GPUDevice):
    """``base`` for what anyone may read; zeusd at ``socket_path`` for the rest."""

    def __init__(self, base: GPUDevice, socket_path: str, *, client: ZeusdClient | None = None) -> None:
        self.base = base
        self.socket_path = str(socket_path)
        self.client = client if client is not None else ZeusdClient(self.socket_path)
        self.gpu_id = int(base.index)
        self._locked: int | None = None

    # -- identity (the base device) ------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.base.name

    @property
    def uuid(self) -> str:
        return self.base.uuid

    @property
    def architecture(self) -> str:
        return self.base.architecture

    @property
    def index(self) -> int:
        return self.base.index

    @property
    def driver_version(self) -> str:
        return self.base.driver_version

    def current_sm_clock_mhz(self) -> int | None:
        return self.base.current_sm_clock_mhz()

    def clock_event_reasons(self) -> frozenset[ClockEventReason]:
        return self.base.clock_event_reasons()

    @property
    def underlying(self) -> GPUDevice:
        return self.base.underlying

    def supported_sm_clocks_mhz(self) -> list[int]:
        return self.base.supported_sm_clocks_mhz()

    def max_memory_clock_mhz(self) -> int:
        return self.base.max_memory_clock_mhz()

    def default_sm_clock_mhz(self) -> int:
        return self.base.default_sm_clock_mhz()

    def locked_sm_clock_mhz(self) -> int | None:
        # NVML's current-clock read (or the simulated GPU's) sees what zeusd applied; only if the
        # base cannot tell, the last lock this handle asked zeusd for.
        found = self.base.locked_sm_clock_mhz()
        return found if found is not None else self._locked

    # -- privileged calls (zeusd) ----------------------------------------------------------------
    def set_locked_sm_clock(self, mhz: int) -> None:
        value = check_sm_clock(mhz, self.supported_sm_clocks_mhz())
        self.client.set_gpu_locked_clocks(self.gpu_id, value)
        self._locked = value

    def reset_locked_sm_clock(self) -> None:
        self.client.reset_gpu_locked_clocks(self.gpu_id)
        self._locked = None

    def lock_memory_clock(self, mhz: int) -> None:
        self.client.set_mem_locked_clocks(self.gpu_id, int(mhz))

    def reset_memory_clock(self) -> None:
        self.client.reset_mem_locked_clocks(self.gpu_id)

    def set_power_limit_w(self, w: float) -> None:
        lo, hi = self.power_limit_range_w()
        if not lo <= w <= hi:
            raise GPUInvalidArgumentError(f"Power limit {w} W is outside the allowed range {lo}–{hi} W")
        self.client.set_power_limit_mw(self.gpu_id, int(round(w * 1000)))

    def control_problem(self) -> str | None:
        """Why zeusd would refuse this process's clock changes (token, scope, API group), or None."""
        return self.client.control_problem(self.gpu_id)

    def can_set_clocks(self) -> bool:
        return self.control_problem() is None

    # -- energy and power (zeusd's gpu-read routes) ------------------------------------------------
    def total_energy_j(self) -> float:
        return self.client.energy_mj(self.gpu_id) / 1000.0

    def power_w(self) -> float:
        return self.client.power_mw(self.gpu_id) / 1000.0

    def power_limit_w(self) -> float:
        return self.base.power_limit_w()

    def power_limit_range_w(self) -> tuple[float, float]:
        return self.base.power_limit_range_w()

    # -- running work, sharing, lifetime -------------------------------------------------------------
    @contextmanager
    def busy(self, activity: float = 1.0, compute_fraction: float = 0.8) -> Iterator[BusyResult]:
        with self.base.busy(activity, compute_fraction) as result:
            yield result

    def spec(self) -> GPUSpec:
        return dataclasses.replace(self.base.spec(), zeusd_socket=self.socket_path)

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.base.close()
