"""Who may change an NVML GPU's clocks, against the fake pynvml: the effective capability decides,
not the uid (root in a user namespace has none); MIG measures but changes no clock; a lock someone
else holds is seen (best effort) and left alone. Each refusal is one typed line before anything
touched the clocks, never a controller that did not start."""

from __future__ import annotations

import pytest

import perseus.gpu.nvml.device as nvml_mod
from perseus.gpu.clock_service import NoClockAccess, open_clock_service
from perseus.gpu.nvml.device import NVMLGPU, has_cap_sys_admin, in_user_namespace

DOCKER_DEFAULT_CAPS = "0000000000000000a80425fb"  # docker's default set: no CAP_SYS_ADMIN (bit 21)
PRIVILEGED_CAPS = "000001ffffffffff"


def status(cap_eff: str) -> str:
    return f"Name:\tpython\nUid:\t0\t0\t0\t0\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff}\n"


@pytest.fixture
def root_without_cap(fake_nvml, monkeypatch, tmp_path):
    """uid 0 in a user namespace: CapEff lacks CAP_SYS_ADMIN, and NVML refuses clock changes."""
    monkeypatch.setattr(nvml_mod.os, "geteuid", lambda: 0)
    monkeypatch.setattr(nvml_mod, "proc_status", lambda: status(DOCKER_DEFAULT_CAPS))
    monkeypatch.setenv("PERSEUS_CLAIM_DIR", str(tmp_path / "claims"))
    monkeypatch.delenv("PERSEUS_CLOCKD_SOCKET", raising=False)
    monkeypatch.delenv("PERSEUS_ZEUSD_SOCKET", raising=False)
    fake_nvml.allow_set = False
    return fake_nvml


HOST_UID_MAP = "         0          0 4294967295\n"


@pytest.fixture(autouse=True)
def host_user_namespace(monkeypatch):
    """The host's user namespace unless a test says otherwise (this machine's own map must not decide)."""
    monkeypatch.setattr(nvml_mod, "proc_uid_map", lambda: HOST_UID_MAP)


def test_root_in_a_user_namespace_holds_no_capability_the_driver_honours(monkeypatch):
    monkeypatch.setattr(nvml_mod.os, "geteuid", lambda: 0)
    monkeypatch.setattr(nvml_mod, "proc_status", lambda: status(PRIVILEGED_CAPS))
    assert has_cap_sys_admin() is True
    monkeypatch.setattr(nvml_mod, "proc_uid_map", lambda: "         0     100000      65536\n")
    assert in_user_namespace() is True and has_cap_sys_admin() is False
    monkeypatch.setattr(nvml_mod, "proc_uid_map", lambda: "         0       1000          1\n         1     100000  65536\n")
    assert has_cap_sys_admin() is False
    monkeypatch.setattr(nvml_mod, "proc_uid_map", lambda: "")  # unreadable: no evidence of a namespace
    assert in_user_namespace() is False and has_cap_sys_admin() is True


def test_the_capability_decides_not_the_uid(monkeypatch):
    monkeypatch.setattr(nvml_mod.os, "geteuid", lambda: 0)
    monkeypatch.setattr(nvml_mod, "proc_status", lambda: status(DOCKER_DEFAULT_CAPS))
    assert has_cap_sys_admin() is False
    monkeypatch.setattr(nvml_mod, "proc_status", lambda: status(PRIVILEGED_CAPS))
    assert has_cap_sys_admin() is True
    monkeypatch.setattr(nvml_mod.os, "geteuid", lambda: 1000)  # setcap'd interpreter of a plain user
    assert has_cap_sys_admin() is True
    monkeypatch.setattr(nvml_mod, "proc_status", lambda: "")  # unreadable: no claim to privilege
    assert has_cap_sys_admin() is False


def test_root_without_cap_sys_admin_is_probed_and_told_the_fixes(root_without_cap):
    gpu = NVMLGPU(0)
    try:
        assert gpu.can_set_clocks() is False
        assert root_without_cap.calls_named("nvmlDeviceSetGpuLockedClocks"), "root went through the probe"
        problem = gpu.control_problem()
        assert problem is not None and "\n" not in problem
        for fix in ("root but lacks CAP_SYS_ADMIN", "docker run --cap-add SYS_ADMIN",
                    "securityContext.capabilities.add: [SYS_ADMIN]", "clockd", "zeusd"):
            assert fix in problem, (fix, problem)
    finally:
        gpu.close()


def test_root_without_cap_sys_admin_gets_one_typed_line_and_no_controller(root_without_cap):
    with pytest.raises(NoClockAccess) as info:
        open_clock_service("nvml", 0, {}, control=True)
    message = str(info.value)
    assert message.startswith("perseus: GPU 0") and "lacks CAP_SYS_ADMIN" in message and "\n" not in message
    assert "did not start" not in message
    assert root_without_cap.devices[0].locked is None
    assert root_without_cap.init_count == 0, "the device was closed"
    service = open_clock_service("nvml", 0, {}, control=False)  # measure-only opens and measures
    try:
        assert not service.controller.enabled and service.device.total_energy_j() >= 0
    finally:
        service.controller.close()
        service.device.close()


def test_a_mig_gpu_measures_only(fake_nvml, monkeypatch, tmp_path):
    monkeypatch.setenv("PERSEUS_CLAIM_DIR", str(tmp_path / "claims"))
    monkeypatch.delenv("PERSEUS_CLOCKD_SOCKET", raising=False)
    monkeypatch.setattr(nvml_mod, "has_cap_sys_admin", lambda: True)
    fake_nvml.devices[0].mig_enabled = True
    service = open_clock_service("nvml", 0, {}, control=False)
    try:
        assert service.device.power_w() > 0 and service.device.total_energy_j() >= 0
    finally:
        service.controller.close()
        service.device.close()
    with pytest.raises(NoClockAccess, match="MIG mode enabled.*nvidia-smi -i 0 -mig 0"):
        open_clock_service("nvml", 0, {}, control=True)
    assert not fake_nvml.calls_named("nvmlDeviceSetGpuLockedClocks")


def test_a_lock_someone_else_holds_is_seen_and_left_alone(fake_nvml, monkeypatch, tmp_path):
    monkeypatch.setenv("PERSEUS_CLAIM_DIR", str(tmp_path / "claims"))
    monkeypatch.delenv("PERSEUS_CLOCKD_SOCKET", raising=False)
    monkeypatch.setattr(nvml_mod, "has_cap_sys_admin", lambda: True)
    d = fake_nvml.devices[1]
    d.locked, d.sm_clock, d.clock_event_reasons = (1200, 1200), 1200, 0x1 | 0x2  # idle, applications clocks
    gpu = NVMLGPU(1)
    assert gpu.is_clock_locked()
    gpu.close()
    with pytest.raises(NoClockAccess, match="GPU 1 .* already locked at 1200 MHz by someone else"):
        open_clock_service("nvml", 1, {}, control=True)
    assert d.locked == (1200, 1200) and not fake_nvml.calls_named("nvmlDeviceResetGpuLockedClocks")
    d.clock_event_reasons = 0x1  # idle at its idle clock, unlocked: no lock is seen
    gpu = NVMLGPU(1)
    assert not gpu.is_clock_locked()
    gpu.close()
