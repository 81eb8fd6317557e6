"""NVML backend against a fake pynvml: device mapping, MIG, errors, energy, clock calls."""

from __future__ import annotations

import sys
import time

import pytest
from fake_pynvml import make_fake_pynvml

import perseus.gpu.nvml.device as nvml_mod
from perseus.errors import PerseusError
from perseus.gpu import (
    GPUError,
    GPUInvalidArgumentError,
    GPULibraryMissingError,
    GPUNotFoundError,
    GPUNotSupportedError,
    GPUPermissionError,
    open_gpu,
    open_spec,
)
from perseus.gpu.nvml.cuda_visible import default_cuda_index, parse_cuda_visible_devices, resolve_physical_index
from perseus.gpu.nvml.device import NVMLGPU, translate_nvml_error

UUIDS = ["GPU-aaaa1111-0000", "GPU-bbbb2222-0000", "GPU-bbbc3333-0000"]


# -- CUDA_VISIBLE_DEVICES parsing (pure) -------------------------------------------------------
def test_parse_cuda_visible_devices_follows_cuda_rules():
    assert parse_cuda_visible_devices(None) is None
    assert parse_cuda_visible_devices("") == []
    assert parse_cuda_visible_devices("2, 0") == ["2", "0"]
    assert parse_cuda_visible_devices("GPU-abc,1") == ["GPU-abc", "1"]
    assert parse_cuda_visible_devices("0,1,x,2") == ["0", "1"]  # stops at the first bad token
    assert parse_cuda_visible_devices("-1,0") == []


def test_resolve_physical_index_by_index_uuid_and_prefix():
    assert resolve_physical_index(1, None, UUIDS) == 1
    assert resolve_physical_index(0, ["2", "0"], UUIDS) == 2
    assert resolve_physical_index(1, ["2", "0"], UUIDS) == 0
    assert resolve_physical_index(0, ["GPU-bbbc3333-0000"], UUIDS) == 2
    assert resolve_physical_index(0, ["gpu-aaaa"], UUIDS) == 0  # case-insensitive prefix
    with pytest.raises(GPUNotFoundError, match="ambiguous"):
        resolve_physical_index(0, ["GPU-bbb"], UUIDS)
    with pytest.raises(GPUNotFoundError, match="matches no GPU"):
        resolve_physical_index(0, ["GPU-ffff"], UUIDS)
    with pytest.raises(GPUNotFoundError, match="not visible"):
        resolve_physical_index(1, ["2"], UUIDS)
    with pytest.raises(GPUNotFoundError, match="does not exist"):
        resolve_physical_index(0, ["7"], UUIDS)
    with pytest.raises(GPUNotSupportedError, match="MIG"):
        resolve_physical_index(0, ["MIG-1234"], UUIDS)


def test_default_cuda_index(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert default_cuda_index() == 0  # one visible device: it is device 0 whatever the rank
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert default_cuda_index() == 3


# -- backend with the fake ---------------------------------------------------------------------
def test_cuda_visible_devices_index_maps_to_physical_device(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    gpu = NVMLGPU(0)
    assert (gpu.index, gpu.uuid, gpu.name) == (2, fake_nvml.devices[2].uuid, "NVIDIA H100 80GB HBM3")
    assert gpu.architecture == "hopper"
    gpu.set_locked_sm_clock(1005)
    assert fake_nvml.devices[2].locked == (1005, 1005)
    assert fake_nvml.devices[0].locked is None and fake_nvml.devices[1].locked is None
    gpu.close()


def test_cuda_visible_devices_uuid_prefix(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb")
    gpu = NVMLGPU(0)
    assert gpu.index == 1
    gpu.close()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbb")
    with pytest.raises(GPUNotFoundError, match="ambiguous"):
        NVMLGPU(0)
    assert fake_nvml.init_count == 0  # failed opens still shut NVML down


def test_a_mig_instance_is_rejected_and_a_mig_gpu_measures_but_changes_no_clock(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-4f0f5b3c-1111")
    with pytest.raises(GPUNotSupportedError, match="MIG instance"):
        NVMLGPU(0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(nvml_mod, "has_cap_sys_admin", lambda: True)  # MIG refuses even a privileged process
    fake_nvml.devices[1].mig_enabled = True
    gpu = NVMLGPU(1)  # measure-only opens it
    assert gpu.total_energy_j() >= 0 and gpu.power_w() > 0
    assert gpu.can_set_clocks() is False
    problem = gpu.control_problem()
    assert problem is not None and "MIG mode enabled" in problem and "nvidia-smi -i 1 -mig 0" in problem
    assert "measure-only works" in problem and "\n" not in problem
    assert not fake_nvml.calls_named("nvmlDeviceSetGpuLockedClocks")  # nothing was tried on the clocks
    gpu.close()
    fake_nvml.devices[0].mig_supported = False  # pre-Ampere: no MIG query → accepted
    gpu = NVMLGPU(0)
    assert gpu.can_set_clocks() and gpu.control_problem() is None
    gpu.close()


def test_permission_error_names_the_fixes(fake_nvml):
    fake_nvml.allow_set = False
    gpu = NVMLGPU(0)
    with pytest.raises(GPUPermissionError) as info:
        gpu.set_locked_sm_clock(1200)
    msg = str(info.value)
    assert "setcap cap_sys_admin+ep" in msg and "root" in msg and "measure-only" in msg
    assert isinstance(info.value, PerseusError)


def test_can_set_clocks_probes_without_leaving_a_lock(fake_nvml, monkeypatch):
    monkeypatch.setattr(nvml_mod, "has_cap_sys_admin", lambda: False)
    gpu = NVMLGPU(0)
    fake_nvml.allow_set = False
    assert gpu.can_set_clocks() is False
    fake_nvml.allow_set = True
    fake_nvml.calls.clear()
    assert gpu.can_set_clocks() is True
    clock_calls = [n for n, _ in fake_nvml.calls if n.endswith("GpuLockedClocks")]
    assert clock_calls == ["nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks"]
    assert fake_nvml.devices[0].locked is None
    monkeypatch.setattr(nvml_mod, "has_cap_sys_admin", lambda: True)
    fake_nvml.calls.clear()
    assert gpu.can_set_clocks() is True
    assert not fake_nvml.calls_named("nvmlDeviceSetGpuLockedClocks")  # privileged: no probe


@pytest.mark.parametrize("code,exc", [(12, GPULibraryMissingError), (9, GPULibraryMissingError),
                                      (4, GPUPermissionError), (999, GPUError)])
def test_init_errors_are_translated(monkeypatch, code, exc):
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(init_error=code))
    with pytest.raises(exc):
        NVMLGPU(0)


def test_library_missing_message_points_to_sim(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(init_error=12))
    monkeypatch.delenv("PERSEUS_GPU", raising=False)
    with pytest.raises(GPULibraryMissingError) as info:
        open_gpu()
    assert "PERSEUS_GPU=sim" in str(info.value) and "nvidia-ml-py" in str(info.value)


def test_real_pynvml_without_driver_reports_library_missing(monkeypatch):
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("a real NVML is present on this machine")
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    with pytest.raises(GPULibraryMissingError, match="PERSEUS_GPU=sim"):
        open_gpu("nvml")


def test_unknown_index_is_not_found(fake_nvml):
    with pytest.raises(GPUNotFoundError, match="3 GPU"):
        NVMLGPU(5)


def test_translate_table():
    class E(Exception):
        def __init__(self, v):
            self.value = v

    assert isinstance(translate_nvml_error(E(3), "x"), GPUNotSupportedError)
    assert isinstance(translate_nvml_error(E(2), "x", lookup=True), GPUNotFoundError)
    assert isinstance(translate_nvml_error(E(2), "x"), GPUInvalidArgumentError)
    assert isinstance(translate_nvml_error(E(6), "x"), GPUNotFoundError)


def test_energy_power_clocks_and_limits(fake_nvml):
    d = fake_nvml.devices[0]
    d.energy_mj = 123_456
    gpu = NVMLGPU(0)
    assert gpu.total_energy_j() == pytest.approx(123.456)
    d.energy_mj += 1_500
    assert gpu.total_energy_j() == pytest.approx(124.956)
    assert gpu.power_w() == pytest.approx(260.0)  # instant field value preferred
    d.instant_power_supported = False
    assert NVMLGPU(0).power_w() == pytest.approx(250.0)  # averaged fallback
    clocks = gpu.supported_sm_clocks_mhz()
    assert clocks[0] == 1410 and clocks[-1] == 210 and clocks == sorted(clocks, reverse=True)
    assert gpu.default_sm_clock_mhz() == 1410 and gpu.max_memory_clock_mhz() == 1215
    fake_nvml.calls.clear()
    gpu.set_locked_sm_clock(1005)
    assert gpu.locked_sm_clock_mhz() == 1005
    gpu.reset_locked_sm_clock()
    gpu.lock_memory_clock(1215)
    gpu.reset_memory_clock()
    handle = fake_nvml.calls_named("nvmlDeviceSetGpuLockedClocks")[0][0]
    assert fake_nvml.calls_named("nvmlDeviceSetGpuLockedClocks") == [(handle, 1005, 1005)]
    assert fake_nvml.calls_named("nvmlDeviceResetGpuLockedClocks") == [(handle,)]
    assert fake_nvml.calls_named("nvmlDeviceSetMemoryLockedClocks") == [(handle, 1215, 1215)]
    assert d.locked is None and d.mem_locked is None
    with pytest.raises(GPUInvalidArgumentError, match="210–1410"):
        gpu.set_locked_sm_clock(2000)
    with pytest.raises(GPUInvalidArgumentError, match="integer"):
        gpu.set_locked_sm_clock(1200.5)  # type: ignore[arg-type]  # the wrong type is what is tested
    with pytest.raises(GPUInvalidArgumentError):
        gpu.lock_memory_clock(800)
    assert gpu.power_limit_w() == 400.0 and gpu.power_limit_range_w() == (100.0, 400.0)
    gpu.set_power_limit_w(250.5)
    assert d.power_limit_mw == 250_500
    with pytest.raises(GPUInvalidArgumentError, match="100.0–400.0"):
        gpu.set_power_limit_w(50)


def test_power_integrator_fallback_without_energy_counter(fake_nvml):
    d = fake_nvml.devices[0]
    d.energy_supported = False
    d.instant_power_supported = False
    d.power_mw = 200_000
    gpu = NVMLGPU(0, power_poll_s=0.005)
    assert gpu.has_energy_counter is False
    e0, t0 = gpu.total_energy_j(), time.monotonic()
    time.sleep(0.2)
    e1, t1 = gpu.total_energy_j(), time.monotonic()
    assert (e1 - e0) / (t1 - t0) == pytest.approx(200.0, rel=0.02)
    assert len(fake_nvml.calls_named("nvmlDeviceGetPowerUsage")) > 10  # really polled
    gpu.close()


def test_open_gpu_nvml_rejects_sim_settings(fake_nvml):
    with pytest.raises(GPUInvalidArgumentError, match="kind='sim'"):
        open_gpu("nvml", 0, preset="A40")
    gpu = open_gpu("nvml", 0)
    assert isinstance(gpu, NVMLGPU)
    gpu.close()
    assert fake_nvml.init_count == 0


def test_spec_and_busy_on_a_real_gpu_backend(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    gpu = NVMLGPU(1)
    spec = gpu.spec()
    assert (spec.kind, spec.index) == ("nvml", 1)  # CUDA index: the controller inherits the env
    assert open_spec(spec).uuid == fake_nvml.devices[1].uuid
    fake_nvml.calls.clear()
    with gpu.busy() as r:  # real GPUs: the work itself is the busy time; no NVML traffic
        pass
    assert fake_nvml.calls == [] and r.duration_s != r.duration_s  # NaN
