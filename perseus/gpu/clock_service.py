"""``open_clock_service``: a GPU and the one path its clocks change through, chosen in one place.

The paths (``open_gpu`` chooses the device, this module how its clocks change):

- measure-only (``control`` false): the ``NullController``, which never changes a clock;
- clockd (``$PERSEUS_CLOCKD_SOCKET``): the node's ``perseus clockd`` holds the clocks, so this
  process needs no privileges;
- zeusd (``zeusd_socket`` or ``$PERSEUS_ZEUSD_SOCKET``): the device is a ``ZeusdGPU``, and the
  local controller process makes its clock changes through Zeus's zeusd;
- otherwise the local controller process, with this process's own privileges.

The local controller process (zeusd's too) starts once this process has claimed the GPU
(``control/claim.py``: one Perseus process changes a GPU's clocks, and a lock someone else holds is
left alone) and may change its clocks (``can_set_clocks``); clockd claims its GPUs itself.

Both clock services configured at once is an error, in measure-only mode too. A process asked to
change clocks that may not (no privilege, MIG, another process's claim, someone else's lock) gets
``NoClockAccess``, one line naming why and the fix, before anything touched the clocks: its
caller stops or measures only (the runtime's ``without_clock_access``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple

from perseus.errors import ConfigError
from perseus.gpu.device import GPUDevice
from perseus.gpu.errors import SIM_FIX
from perseus.gpu.factory import open_gpu

if TYPE_CHECKING:
    from perseus.gpu.control.controller import ClockController


class NoClockAccess(ConfigError):
    """This process may not change the GPU's clocks (the one line says why and names the fix);
    opened with ``control`` false, the same GPU measures."""


class ClockService(NamedTuple):
    """An open GPU and its started clock controller; the caller closes both."""

    device: GPUDevice
    controller: ClockController


def open_clock_service(backend: str, device_index: int | None, sim_gpu: dict[str, Any], *, control: bool,
                       clock_check_s: float = 0.0, zeusd_socket: str | None = None) -> ClockService:
    """Open the configured GPU (``open_gpu``: ``backend``, ``device_index``, ``sim_gpu``,
    ``zeusd_socket``) with its controller, started: clockd's, the local controller process or,
    unless ``control``, the measure-only one. ``clock_check_s``: how often the controller reads a
    held clock back (re-applying it if something else changed it). Raises ``ConfigError`` (the
    device closed) where the clocks cannot be controlled as configured: ``NoClockAccess`` where
    this process may not change them, before anything touched them."""
    from perseus.gpu.clockd.client import clockd_socket_from_env
    from perseus.gpu.control.claim import claim_clocks
    from perseus.gpu.control.controller import make_controller

    device = open_gpu(backend, device_index, zeusd_socket=zeusd_socket, **sim_gpu)
    clockd_socket = clockd_socket_from_env()
    if device.spec().zeusd_socket and clockd_socket is not None:
        device.close()
        raise ConfigError("perseus: both zeusd (zeusd_socket / PERSEUS_ZEUSD_SOCKET) and perseus clockd "
                          "(PERSEUS_CLOCKD_SOCKET) are configured; choose one clock service")
    if control and clockd_socket is not None:
        return ClockService(device, _clockd_controller(device, clockd_socket, device_index, clock_check_s))
    claim = None
    try:
        if control:
            claim, denied = claim_clocks(device)  # before the probe and the start-up reset touch the clocks
            if denied is None and not device.can_set_clocks():
                denied = _no_access_line(device)
            if denied is not None:
                raise NoClockAccess(denied)
        # the controller process opens its own handle of the same device from the spec
        extra: dict[str, Any] = {"clock_check_s": clock_check_s, "claim": claim} if control else {}
        controller = make_controller(device.spec(), enabled=control, **extra).start()
    except BaseException:
        if claim is not None:
            claim.release()
        device.close()
        raise
    return ClockService(device, controller)


def _no_access_line(device: GPUDevice) -> str:
    problem = device.control_problem()
    if problem:
        return problem if problem.startswith("perseus: ") else f"perseus: {problem}"
    return (f"perseus: this process may not change the clocks of {device.name}; grant CAP_SYS_ADMIN "
            "(or use perseus clockd / zeusd: docs/gpu.md), or measure without changing clocks: "
            "\"mode\": \"measure-only\" in the config (--perseus-mode measure-only for Megatron); "
            f"without a GPU, {SIM_FIX}")


def _clockd_controller(device: GPUDevice, socket_path: str, device_index: int | None,
                       clock_check_s: float) -> ClockController:
    """Claim ``device`` at the node's clock daemon, by UUID (container-safe) and CUDA index; the
    daemon reads a held clock back every ``clock_check_s``, as the local controller would."""
    from perseus.gpu.clockd.client import ClockdController
    from perseus.gpu.nvml.cuda_visible import default_cuda_index

    simulated = device.simulated
    controller = ClockdController(
        socket_path, uuid=device.uuid,
        device_index=device.index if simulated else (default_cuda_index() if device_index is None else device_index),
        cuda_visible_devices=None if simulated else os.environ.get("CUDA_VISIBLE_DEVICES"),
        clock_check_s=clock_check_s,
    )
    try:
        return controller.start()
    except BaseException:
        device.close()
        raise
