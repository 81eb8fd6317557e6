"""What the runtime reads from a device and a controller is declared on ``GPUDevice`` and
``ClockController``, with a default on every implementation, so ``perseus/runtime/port/gpu_port.py``
reads members instead of probing with ``getattr`` or a class's module name."""

from __future__ import annotations

from typing import Any, cast

import pytest

from perseus.gpu import SimulatedGPU
from perseus.gpu.clockd.client import ClockdController
from perseus.gpu.control.controller import ClockController, FrequencyController, NullController
from perseus.gpu.device import ENERGY_UPDATE_PERIOD_S, GPUDevice
from perseus.gpu.nvml.device import NVMLGPU
from perseus.gpu.zeusd.client import ZeusdClient
from perseus.gpu.zeusd.device import ZeusdGPU
from perseus.runtime.port.gpu_port import GPUPort

DEVICE_MEMBERS = ("driver_version", "simulated", "underlying", "control_problem", "minor_number",
                  "energy_counter_reading", "energy_update_period_s")
CONTROLLER_MEMBERS = tuple(sorted({*ClockController.__annotations__,
                                   *(n for n in vars(ClockController) if not n.startswith("_"))}))


@pytest.fixture
def sim(sim_dir):
    g = SimulatedGPU(0, preset="A100-SXM", reset_state=True)
    yield g
    g.close()


def _wrapped(base: GPUDevice) -> ZeusdGPU:
    return ZeusdGPU(base, "/nonexistent/zeusd.sock", client=cast(ZeusdClient, object()))  # identity only: no calls


def test_the_device_members_are_declared_with_defaults():
    for name in DEVICE_MEMBERS:
        assert hasattr(GPUDevice, name), name
    for cls in (NVMLGPU, SimulatedGPU, ZeusdGPU):
        assert all(hasattr(cls, name) for name in DEVICE_MEMBERS), cls


def test_the_simulated_gpu_says_so_also_behind_zeusd(sim):
    assert sim.simulated and sim.underlying is sim and sim.control_problem() is None and sim.minor_number() is None
    wrapped = _wrapped(sim)
    assert wrapped.simulated and wrapped.underlying is sim and wrapped.driver_version == sim.driver_version
    value, stamp = sim.energy_counter_reading()
    assert value == pytest.approx(sim.total_energy_j()) and stamp is not None


def test_each_backend_says_how_often_its_energy_counter_advances(sim_dir, fake_nvml):
    fast = SimulatedGPU(1, preset="A100-SXM", energy_update_period_s=0.005, reset_state=True)
    gpu = NVMLGPU(0)
    try:
        assert fast.energy_update_period_s == 0.005  # the simulated GPU's own, as configured
        assert gpu.energy_update_period_s == ENERGY_UPDATE_PERIOD_S == 0.1  # NVML's on the measured cards
        assert _wrapped(fast).energy_update_period_s == ENERGY_UPDATE_PERIOD_S  # zeusd's reads are NVML's counter
    finally:
        gpu.close()
        fast.close()


def test_an_nvml_gpu_is_not_simulated(fake_nvml):
    gpu = NVMLGPU(0)
    try:
        assert not gpu.simulated and gpu.underlying is gpu and isinstance(gpu.driver_version, str)
        assert gpu.control_problem() is None and _wrapped(gpu).simulated is False
        assert gpu.energy_counter_reading()[1] is None  # only the reader's clock says when it changed
    finally:
        gpu.close()


@pytest.mark.parametrize("make", [NullController, lambda: ClockdController("/nonexistent.sock"),
                                  lambda: FrequencyController(_spec())], ids=["null", "clockd", "process"])
def test_every_controller_has_the_declared_members(make, sim_dir):
    controller: Any = make()
    for name in CONTROLLER_MEMBERS:
        assert hasattr(controller, name), name
    assert isinstance(controller.timed_requests, bool) and controller.notices() == []
    assert controller.pid is None  # not started (or no child of ours)


def _spec():
    g = SimulatedGPU(0, preset="A100-SXM", reset_state=True)
    try:
        return g.spec()
    finally:
        g.close()


def test_the_port_reads_the_declared_members(sim):
    class Timed(NullController):
        timed_requests = False

    port = GPUPort(_wrapped(sim), Timed())
    assert port.is_simulated and port.sim_device is sim and port.timed_requests is False
    assert port.driver_version == sim.driver_version and port.notices() == []
