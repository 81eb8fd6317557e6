"""The runtime's narrow view of the GPU layer: clocks, energy, P_blocking, nothing else.

The engine never talks to NVML or the simulated GPU directly. ``GPUPort`` wraps a
``perseus.gpu`` device and its asynchronous frequency controller so that

- ``request`` (hot path, once per instruction whose clock differs from the last one) only
  hands a number to the controller and returns,
- ``apply`` (step boundary, profiling) waits until the clock is in effect,
- ``reset`` always leaves the GPU at default clocks, whatever happened before.
"""

from __future__ import annotations

import logging
from typing import Any

from perseus.errors import ConfigError

log = logging.getLogger("perseus.runtime")


class GPUPort:
    """Clock control and energy reading for one rank's GPU."""

    def __init__(self, device: Any, controller: Any = None, *, can_control: bool = True) -> None:
        self.device = device
        self.controller = controller
        self.can_control = can_control
        self.supported_mhz: list[int] = list(device.supported_sm_clocks_mhz())
        self.default_mhz: int = int(device.default_sm_clock_mhz())
        self.name: str = str(device.name)
        self.driver_version: str = str(getattr(device, "driver_version", "unknown"))
        self.current_mhz: int = self.default_mhz
        self._closed = False

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(cls, backend: str, device_index: int | None, sim_options: dict[str, Any], *, control: bool) -> GPUPort:
        """Open the configured GPU and, when clocks may change, start its controller."""
        from perseus.gpu.factory import open_gpu

        device = open_gpu(backend, device_index, **sim_options)
        if not control:
            return cls(device, None, can_control=False)
        if not device.can_set_clocks():
            device.close()
            raise ConfigError(
                f"perseus: this process may not change the clocks of {device.name}; grant CAP_SYS_ADMIN "
                "or set mode to 'measure-only'"
            )
        return cls(device, _start_controller(device), can_control=True)

    # ---------------------------------------------------------------- clocks

    def request(self, mhz: int) -> None:
        """Ask for a clock without waiting (instruction hooks)."""
        if mhz != self.current_mhz and self.can_control:
            self.current_mhz = mhz
            if self.controller is not None:
                self.controller.set_frequency(mhz)
            else:
                self.device.set_locked_sm_clock(mhz)

    def apply(self, mhz: int) -> None:
        """Set a clock and wait until it is in effect (step boundaries only)."""
        if not self.can_control:
            return
        self.current_mhz = mhz
        if self.controller is not None:
            self.controller.set_frequency(mhz)
            self.controller.flush()
        else:
            self.device.set_locked_sm_clock(mhz)

    def release(self) -> None:
        """Ask for default clocks without waiting (fallback from an instruction hook)."""
        if not self.can_control:
            return
        self.current_mhz = self.default_mhz
        if self.controller is not None:
            self.controller.reset()
        else:
            self.device.reset_locked_sm_clock()

    def reset(self) -> None:
        """Back to default clocks (unlocked), waiting until done; safe to call repeatedly."""
        if not self.can_control:
            return
        self.current_mhz = self.default_mhz
        if self.controller is not None:
            self.controller.reset()
            self.controller.flush()
        else:
            self.device.reset_locked_sm_clock()

    # ---------------------------------------------------------------- energy

    def energy_j(self) -> float:
        return float(self.device.total_energy_j())

    @property
    def is_simulated(self) -> bool:
        from perseus.gpu.simulated import SimulatedGPU

        return isinstance(self.device, SimulatedGPU)

    def instruction_timer(self) -> Any:
        """CUDA-event timer on a real GPU (kernels are asynchronous), the simulated GPU's own
        kernel timing on a simulated one."""
        from perseus.gpu.timing import SimulatedKernelTimer, make_instruction_timer

        if self.is_simulated:
            return SimulatedKernelTimer(self.device)
        return make_instruction_timer(prefer_cuda=True)

    def energy_poller(self, interval_s: float) -> Any:
        """Background thread recording when the coarse energy counter advances."""
        from perseus.gpu.measurement import EnergyPoller

        return EnergyPoller(self.device, interval_s).start()

    def measure_p_blocking(self, seconds: float, collective: Any = None, peer: int | None = None) -> float:
        """P_blocking as Perseus defines it: this GPU's power while its rank is blocked in a P2P
        receive and the peer rank sleeps (pairs of ranks take turns); alone, plain idle power."""
        from perseus.gpu import measurement

        if collective is not None and collective.distributed and peer is not None:
            import torch.distributed as dist

            global_peer = dist.get_global_rank(collective.group, peer)
            result = measurement.measure_blocking_power_p2p(self.device, global_peer, seconds, group=collective.group)
        else:
            result = measurement.measure_blocking_power(self.device, seconds)
        return float(result.power_w)

    def sample_idle_power(self, seconds: float) -> float:
        return _sample_idle_power(self.device, seconds)

    def close(self) -> None:
        """Reset clocks, stop the controller, release the device. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.reset()
        finally:
            if self.controller is not None:
                self.controller.close()
            self.device.close()


def _start_controller(device: Any) -> Any:
    """Start the GPU layer's controller process for this device (it opens its own handle)."""
    from perseus.gpu.controller import FrequencyController
    from perseus.gpu.spec import GPUSpec

    if hasattr(device, "spec"):
        spec = device.spec()
    else:  # NVML: the controller opens the same CUDA device index
        spec = GPUSpec(kind="nvml", index=getattr(device, "cuda_index", device.index))
    return FrequencyController(spec).start()


def _sample_idle_power(device: Any, seconds: float, period_s: float = 0.01) -> float:
    import time

    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(float(device.power_w()))
        time.sleep(period_s)
    return sum(samples) / len(samples)
